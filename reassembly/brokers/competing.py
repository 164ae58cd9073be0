"""Competing consumers on a queue without message groups (ActiveMQ over AMQP or STOMP): any consumer
may receive any segment; a shared segment store completes each message wherever its last segment lands.

:class:`CompetingReceiver` is the queue counterpart of
:class:`~reassembly.brokers.share.ShareGroupReceiver`, over the transports of
:mod:`segmenter.brokers` (:func:`~segmenter.brokers.open_consumer`): each fetched batch is
written to the store in one transaction, then every delivery is settled: *accepted* when its
segment is stored or a duplicate, *rejected* (ActiveMQ moves a durable message to its DLQ) when
the store quarantined it, its bytes kept in the store first. The units the batch completed are
delivered to ``on_message``; units whose claimant died are taken over every ``take_over_every``
seconds. Senders send without a group (``Sender.send_bytes(body)``, or a queue whose sender sets
none) so the broker spreads the segments over every consumer; with message groups one consumer
gets a whole message and :class:`~reassembly.brokers.receiver.BrokerReceiver` needs no store.

A consumer killed before it settled has its deliveries redelivered by the broker to the others
(ActiveMQ: at once, on the connection's close): a redelivered segment already stored is a duplicate.
"""

from __future__ import annotations

from reassembly.segstore.core import Write
from reassembly.segstore.member import MemberReceiver, StoreMember
from reassembly.segstore.records import Claim, OnMessage
from reassembly.segstore.store import SegmentStore
from segmenter.brokers import Consumer, body_view


class CompetingReceiver(MemberReceiver):
    """One competing consumer of a queue, feeding a shared segment store.

    ``consumer``: the queue's consumer (from :func:`segmenter.brokers.open_consumer`). ``store``: the segment store the
    deliveries are written to. ``on_message``: called with each message (or Unit-of-Work group) this member delivers; it
    returns once the message is safe. ``take_over_every``: seconds between looks for units whose claimant died.
    """

    def __init__(
        self, consumer: Consumer, store: SegmentStore, on_message: OnMessage, *, take_over_every: float = 1.0
    ) -> None:
        self.consumer = consumer
        self.member = StoreMember(store, on_message, take_over_every=take_over_every)
        self.redelivered = 0

    def receive(self, timeout: float = 1.0) -> tuple[int, list[Claim]]:
        """One fetch written and settled, nothing delivered: (deliveries read, the units the fetch
        completed, claimed by this member). For a caller that delivers the claims itself
        (:class:`~reassembly.brokers.share_dispatch.ShareDispatchSource`).

        ``timeout``: the longest wait for the first delivery, in seconds.
        """
        deliveries = self.consumer.fetch(timeout)
        self.redelivered += sum(1 for d in deliveries if d.redelivered)
        written, claims = self.member.write([body_view(d) for d in deliveries])
        for d, w in zip(deliveries, written, strict=True):
            if w.outcome is Write.QUARANTINED:
                reason = int(w.reason) if w.reason is not None else 0
                d.reject(reason, "quarantined in the segment store")
            else:
                d.accept()
        return len(deliveries), claims

    def close(self) -> None:
        """Write the settlements made and disconnect (unsettled deliveries go back to the queue)."""
        self.consumer.close()
