"""Kafka share groups (KIP-932): the members of one group receive the records of a partition between
them, so the segments of a message reach different processes; a shared segment store completes it.

:class:`ShareGroupReceiver` is a thin adapter over ``confluent_kafka.ShareConsumer`` in explicit
acknowledgement mode and a :class:`~reassembly.segstore.member.StoreMember`:

* each polled batch is written to the store in one transaction, and only then is each record
  acknowledged: ACCEPT when its segment is stored or a duplicate, REJECT when the store
  quarantined it (a corrupt segment, a late copy that differs from what was delivered) — its
  bytes are in the store's quarantine by then;
* a record whose ``delivery_count()`` reached the group's delivery limit (``delivery_limit``, the
  group's ``share.delivery.count.limit``, 5 by default in Kafka) is quarantined in the store and then
  REJECTED, before anything else is tried on it: the broker would archive it after this delivery,
  and a record delivered that often is one that keeps killing whoever reads it;
* the units the batch completed are delivered to ``on_message`` (the claimant assembles them from
  the store), and every ``take_over_every`` seconds the member takes over units whose claimant died.

A member killed between its write and its acknowledgement has its records delivered again (to any
member, after the broker's acquisition lock or share session runs out): they are then duplicates.
confluent-kafka is imported when a receiver is created: ``pip install "segment-reassembly[kafka]"``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from reassembly.segstore.core import Write
from reassembly.segstore.member import MemberReceiver, StoreMember
from reassembly.segstore.records import Claim, OnMessage
from reassembly.segstore.store import SegmentStore
from segmenter.brokers import BrokerError
from segmenter.brokers.kafka import confluent
from segmenter.errors import Reason

log = logging.getLogger(__name__)

DEFAULT_DELIVERY_LIMIT = 5
"""Kafka's default ``share.delivery.count.limit`` (a group setting; the client cannot read it)."""


class ShareGroupReceiver(MemberReceiver):
    """One member of a share group feeding a shared segment store.

    ``config`` is the client's (``bootstrap.servers`` and ``group.id`` at least);
    ``share.acknowledgement.mode`` is set to ``explicit`` (a configuration naming another mode is
    refused). :meth:`~reassembly.segstore.MemberReceiver.poll` handles one batch;
    :meth:`~reassembly.segstore.MemberReceiver.run` polls until ``stop()`` is true;
    :meth:`close` leaves the group (unacknowledged records go back to it).

    ``topics``: the topics subscribed. ``store``: the segment store records are written to. ``on_message``: called with
    each message (or Unit-of-Work group) this member delivers; it returns once the message is safe. ``delivery_limit``:
    the group's ``share.delivery.count.limit``. ``take_over_every``: seconds between looks for units whose claimant
    died.
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        topics: Sequence[str],
        store: SegmentStore,
        on_message: OnMessage,
        *,
        delivery_limit: int = DEFAULT_DELIVERY_LIMIT,
        take_over_every: float = 1.0,
    ) -> None:
        conf = dict(config)
        mode = str(conf.setdefault("share.acknowledgement.mode", "explicit"))
        if mode != "explicit":
            raise BrokerError(
                "a share-group receiver acknowledges each record after the store kept it: "
                f"share.acknowledgement.mode must be explicit, not {mode!r}",
                reason=Reason.ARGUMENT_ERROR,
            )
        ck = confluent()
        self._accept, self._reject = ck.AcknowledgeType.ACCEPT, ck.AcknowledgeType.REJECT
        self.consumer: Any = ck.ShareConsumer(conf)
        self.consumer.subscribe(list(topics))
        self.member = StoreMember(store, on_message, take_over_every=take_over_every)
        self.delivery_limit = delivery_limit
        self.errors = 0  # record-level errors reported by the client (logged)

    def receive(self, timeout: float = 1.0) -> tuple[int, list[Claim]]:
        """One batch written and acknowledged, nothing delivered: (records read, the units the
        batch completed, claimed by this member). For a caller that delivers the claims itself
        (:class:`~reassembly.brokers.share_dispatch.ShareDispatchSource`).

        ``timeout``: the longest wait for the first record, in seconds.
        """
        batch = self.consumer.poll(timeout) or []
        records = []
        for m in batch:
            if m.error() is not None:
                self.errors += 1
                log.warning("share consumer: %s", m.error())
                continue
            records.append(m)
        fresh = []
        for m in records:
            count = m.delivery_count() or 1
            body = m.value() or b""
            if count >= self.delivery_limit:
                self.member.quarantine(
                    body,
                    Reason.DELIVERY_LIMIT,
                    f"{m.topic()}[{m.partition()}]@{m.offset()} delivered {count} times (limit {self.delivery_limit})",
                )
                self.consumer.acknowledge(m, self._reject)
            else:
                fresh.append(m)
        written, claims = self.member.write([m.value() or b"" for m in fresh])
        for m, w in zip(fresh, written, strict=True):
            self.consumer.acknowledge(m, self._reject if w.outcome is Write.QUARANTINED else self._accept)
        if records:
            self.consumer.commit_async()
        return len(records), claims

    def close(self) -> None:
        """Send the acknowledgements made and leave the group."""
        try:
            self.consumer.commit_sync()
        except Exception as exc:  # nothing left to commit is not a failure worth raising on close
            log.debug("share consumer: commit on close: %s", exc)
        self.consumer.close()
