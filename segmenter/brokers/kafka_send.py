"""What a message handed to the Kafka producer becomes: a handle that fills in as librdkafka
reports each segment's delivery.

Sending and hearing back are apart in librdkafka: ``produce()`` queues a record, and its delivery
callback reports it later, inside the producer's ``poll`` or ``flush``. :class:`KafkaSend` keeps
that account for one message (or MQ group): the segments acknowledged and where, those that
failed, and the error naming them. It is kept apart from the producer that queues the records
(:mod:`segmenter.brokers.kafka`), which it asks only to serve reports and tells when the
message is done.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from ..errors import Reason
from .base import BrokerError

if TYPE_CHECKING:
    from confluent_kafka import KafkaError, Message


class _Owner(Protocol):
    """The producer as a handle sees it: it serves delivery reports and hears when a message is done."""

    def poll(self, timeout: float = 0.0) -> int: ...

    def _finished(self, handle: KafkaSend, quiet: bool = False) -> None: ...


class FailedSegment(NamedTuple):
    """A segment whose delivery failed: its place in the message and librdkafka's error."""

    msg_seq_number: int
    """The MsgSeqNumber of the message the segment belongs to."""
    offset: int
    """Where the segment's data starts in its message's stored bytes (its header's Offset)."""
    code: str
    """librdkafka's error name, such as ``MSG_TIMED_OUT`` or ``TOPIC_AUTHORIZATION_FAILED``."""
    error: str
    """librdkafka's error text, for a person to read."""


class DeliveredSegment(NamedTuple):
    """Where an acknowledged segment was written."""

    msg_seq_number: int
    """The MsgSeqNumber of the message the segment belongs to."""
    offset: int
    """Where the segment's data starts in its message's stored bytes (its header's Offset)."""
    partition: int
    """The Kafka partition the broker wrote the segment to."""
    kafka_offset: int
    """The segment's offset in that partition, as the broker acknowledged it."""


class KafkaSend:
    """One message (or MQ group) handed to the producer: done when every segment's delivery is reported.

    ``segments`` counts the records produced; ``records`` (acknowledged, in delivery order) and
    ``failed`` fill in as librdkafka reports deliveries, which happens inside the producer's calls
    (:meth:`KafkaSegmentProducer.poll`, :meth:`wait`, ``flush``).

    Made by :class:`KafkaSegmentProducer`, not by the caller: ``owner`` (the producer that serves its delivery reports),
    ``topic``, ``key`` (the records' key) and ``group_id`` (the message's GroupId).
    """

    def __init__(self, owner: _Owner, topic: str, key: bytes, group_id: bytes) -> None:
        self._owner = owner
        self.topic = topic
        self.key = key
        self.group_id = group_id
        self.segments = 0
        self.records: list[DeliveredSegment] = []
        self.failed: list[FailedSegment] = []
        self.sealed = False  # every segment produced (no more to come)
        self.reported = False  # its failure was raised once (by wait or flush)

    @property
    def message_id(self) -> str:
        return self.group_id.hex()

    def done(self) -> bool:
        """Every segment produced and its delivery reported (success or failure)."""
        return self.sealed and len(self.records) + len(self.failed) == self.segments

    @property
    def ok(self) -> bool:
        """Done, and every segment acknowledged by the cluster."""
        return self.done() and not self.failed

    @property
    def partitions(self) -> set[int]:
        """The partitions its acknowledged segments were written to: one, unless partitions were added mid-send."""
        return {r.partition for r in self.records}

    def wait(self, timeout: float | None = None) -> None:
        """Serve delivery reports until this message is done; raise :class:`BrokerError` if a segment
        failed, or if it is not done within ``timeout`` seconds (None: librdkafka's own
        ``message.timeout.ms`` bounds it)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.done():
            left = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
            if left <= 0:
                waiting = self.segments - len(self.records) - len(self.failed)
                raise BrokerError(
                    f"message {self.message_id} (key {self.key!r}): {waiting} of {self.segments} segments not"
                    f" acknowledged within {timeout} s",
                    group_id=self.message_id,
                    topic=self.topic,
                )
            self._owner.poll(left)
        if self.failed:
            self.reported = True
            raise self.error()

    def error(self) -> BrokerError:
        """The error naming this message and its failed segments (librdkafka's words)."""
        shown = "; ".join(
            f"MsgSeqNumber {f.msg_seq_number} Offset {f.offset}: {f.error} ({f.code})" for f in self.failed[:5]
        )
        more = f"; and {len(self.failed) - 5} more" if len(self.failed) > 5 else ""
        too_big = any(f.code == "MSG_SIZE_TOO_LARGE" for f in self.failed)
        return BrokerError(
            f"message {self.message_id} (key {self.key!r}) not sent to {self.topic}: {len(self.failed)} of"
            f" {self.segments} segments failed: {shown}{more}",
            reason=Reason.MSG_TOO_BIG_FOR_CHANNEL if too_big else Reason.CONNECTION_BROKEN,
            group_id=self.message_id,
            topic=self.topic,
            failed=[f._asdict() for f in self.failed],
        )

    def _delivered(self, seq: int, offset: int, err: KafkaError | None, msg: Message[Any, Any]) -> None:
        if err is None:
            self.records.append(DeliveredSegment(seq, offset, msg.partition() or 0, msg.offset() or 0))
        else:
            self.failed.append(FailedSegment(seq, offset, err.name(), err.str()))
        if self.done():
            self._owner._finished(self)

    def __repr__(self) -> str:
        state = "ok" if self.ok else "failed" if self.done() else "pending"
        return f"KafkaSend({self.message_id}, {self.topic}, {len(self.records)}/{self.segments} acknowledged, {state})"
