"""AMQP and STOMP for the group dispatcher: a message's deliveries settled when a worker settles it.

:class:`BrokerDispatchSource` is the runners' :class:`~reassembly.runtime.Source` over
:class:`~reassembly.brokers.receiver.BrokerReceiver` (``defer=True``). The receiver reassembles and
settles everything that is not a whole message exactly as it does alone (duplicates accepted, bad
segments and failed or expired groups rejected to the broker's dead-letter queue); a whole message
is handed to the dispatcher with its deliveries still unsettled, and they are accepted only when
the runner settles it:

* **DONE**: accepted.
* **DEAD**: accepted too, after the runner wrote the message to its dead letter (it settles DEAD
  only once the dead letter returned). Rejecting the deliveries instead would put the message's
  segments in the broker's own dead-letter queue as well: two dead copies of one message, one of
  them in pieces, and a broker redelivery policy could bring the pieces back.
* **unsettled** when the process stops or dies (in flight past the drain deadline, or never handed
  out): the broker redelivers the deliveries when the connection closes, to this consumer or
  another: at least once.

Back-pressure: a paused source does not read from the connection. The broker sends no more than the
consumer's ``prefetch`` unacknowledged messages ahead (STOMP's ``activemq.prefetchSize``; AMQP
credit, which the receiver renews only as it reads), so what waits for a paused consumer sits in
the broker and the socket, not in this process. While paused, settlements wait for the next read
(ACK frames are written by the transport's next fetch); the runner resumes once enough settled.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING

from reassembly.assembler.core import Assembler
from reassembly.brokers.receiver import BrokerReceiver, Delivered, Quarantined, ReceiverStats
from reassembly.dispatcher import Outcome
from reassembly.runtime.base import Offered
from reassembly.runtime.sources import PauseFlag
from segmenter.brokers import Consumer

if TYPE_CHECKING:
    import reassembly.dispatcher
    from reassembly.dispatcher import Dispatcher, Work


class BrokerDispatchSource(PauseFlag):
    """A :class:`~reassembly.runtime.Source` of whole messages from an AMQP or STOMP queue.

    ``consumer``: from :func:`segmenter.brokers.open_consumer` (its ``prefetch`` bounds what the
    broker sends ahead, and must exceed the segments of the messages held at once: every delivery of
    a message stays unacknowledged until the message is settled). Each message is offered with its
    GroupId as key (the broker's own message group, ``JMSXGroupID``) for
    :attr:`~reassembly.dispatcher.Ordering.KEY`. ``on_quarantine`` sees every event whose segments
    the receiver rejects.

    ``assembler``: the assembler the deliveries go through (None: a new one with the default limits and
    ``unit_of_work``). ``unit_of_work``: for the assembler made here, deliver an MQ group whole (True) or message by
    message.
    """

    def __init__(
        self,
        consumer: Consumer,
        assembler: Assembler | None = None,
        *,
        on_quarantine: Callable[[Quarantined], None] | None = None,
        unit_of_work: bool = False,
    ) -> None:
        self._out: list[Delivered] = []
        if assembler is None:  # each message of an MQ group as it completes: the dispatcher orders them
            assembler = Assembler(unit_of_work=unit_of_work)
        self.receiver = BrokerReceiver(consumer, self._out.append, assembler, on_quarantine=on_quarantine, defer=True)

    @property
    def stats(self) -> ReceiverStats:
        return self.receiver.stats

    def fetch(self, timeout: float) -> list[Offered]:
        """What arrived (waiting up to ``timeout`` s), whole messages out; nothing while paused."""
        if self._paused:
            return []
        self.receiver.poll(timeout)
        out = [Offered(m, key=m.group_id) for m in self._out]
        self._out.clear()
        return out

    def settled(self, work: Work, outcome: reassembly.dispatcher.Outcome) -> None:
        """DONE or DEAD (the dead letter written): the message's deliveries are accepted.

        ``work``: the message settled. ``outcome``: how (DONE or DEAD).
        """
        if outcome in (Outcome.DONE, Outcome.DEAD):
            self.receiver.settle_message(work.message)  # type: ignore[arg-type]

    def commit(self, dispatcher: Dispatcher, force: bool = False) -> None:
        """Nothing to commit: a queue's deliveries are settled one by one (:meth:`settled`).

        ``dispatcher``, ``force``: as :class:`~reassembly.runtime.Source` gives them (unused here).
        """

    def held_bytes(self) -> int:
        return self.receiver.assembler.buffered_bytes

    def revoked(self) -> list[Hashable]:
        """A queue has no partitions to lose: a broker moves a dead consumer's groups by redelivery."""
        return []

    def close(self) -> None:
        """Write the settlements made and disconnect; what is unsettled is redelivered."""
        self.receiver.close()


__all__ = ["BrokerDispatchSource"]
