"""The drain's Kafka source: records of a topic in, the offsets of those landed committed.

:class:`KafkaSource` feeds :class:`reassembly.brokers.drain.Drain`, which lands records in durable
files for the Spark job; it shares nothing with the reassembling loop of
:mod:`reassembly.brokers.kafka` but the consumer settings (:mod:`reassembly.brokers.kafka_config`),
and commits by its own rule: an offset once its record is landed, never before. The landing
columns of a Kafka record are written here too, beside the record they are read from.

confluent-kafka (librdkafka) is imported only when a source is created: ``pip install
"segment-reassembly[kafka]"``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from datetime import datetime, timezone
from typing import Any

from reassembly.brokers.kafka_config import TP, _consumer_config
from segmenter.brokers import BrokerError, Delivery
from segmenter.brokers.kafka import confluent

log = logging.getLogger(__name__)


class KafkaRecord:
    """One record as the drain lands it (a :class:`segmenter.brokers.Delivery`): ``accept`` marks
    its offset landed; the source commits it at its next fetch.

    ``source``: the :class:`KafkaSource` that read it, which commits its offset. ``msg``: the
    confluent-kafka message it is read from.
    """

    __slots__ = ("_source", "body", "headers", "key", "offset", "partition", "redelivered", "timestamp", "topic")

    def __init__(self, source: KafkaSource, msg: Any) -> None:
        self._source = source
        value = msg.value()
        self.body: bytes = b"" if value is None else value
        self.redelivered = False  # Kafka has no such flag: a record read again is simply read again
        self.topic: str = msg.topic()
        self.partition: int = msg.partition()
        self.offset: int = msg.offset()
        kind, ms = msg.timestamp()
        self.timestamp: datetime | None = (
            None if kind == source._no_timestamp else datetime.fromtimestamp(ms / 1000, timezone.utc)
        )
        self.key: bytes | None = msg.key()
        self.headers: list[tuple[str, bytes | None]] = list(msg.headers() or ())

    def accept(self) -> None:
        self._source._landed(self)

    def reject(self, reason: int, description: str) -> None:
        """Kafka has no rejection: the drain lands every record, so this only marks it landed.

        ``reason``, ``description``: why, as a :class:`~segmenter.Reason` code and in words (the
        :class:`segmenter.brokers.Delivery` shape; Kafka keeps neither).
        """
        self._source._landed(self)


class KafkaSource:
    """Records of a topic for the drain (the :class:`segmenter.brokers.Consumer` shape).

    Offsets are committed for the records the drain accepted (landed in a durable file), at the
    next :meth:`fetch` and at :meth:`close`. ``before_revoke`` (the drain's ``publish``) is called
    when a rebalance takes partitions away, so what was read of them lands and is committed before
    their next owner starts: without it their records would be landed twice.

    ``config``: librdkafka consumer settings (``bootstrap.servers``, ``group.id``, ...; automatic
    commits are off: ``enable.auto.commit=true`` is refused). ``topic``: the topic read.
    ``prefetch``: the most records one :meth:`fetch` reads.
    """

    def __init__(self, config: Mapping[str, Any], topic: str, *, prefetch: int = 1000) -> None:
        ck = confluent()
        self._ck = ck
        self._no_timestamp = ck.TIMESTAMP_NOT_AVAILABLE
        self.prefetch = prefetch
        self.before_revoke: Callable[[], None] | None = None
        self._pending: dict[TP, int] = {}  # landed, not yet committed: the next offset to read
        self._assigned: set[TP] = set()
        self.consumer = ck.Consumer(_consumer_config(config))
        self.consumer.subscribe([topic], on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost)

    def fetch(self, timeout: float) -> list[Delivery]:
        self.flush()
        out: list[Delivery] = []
        for msg in self.consumer.consume(num_messages=self.prefetch, timeout=timeout):
            err = msg.error()
            if err is None:
                out.append(KafkaRecord(self, msg))
            elif err.code() != self._ck.KafkaError._PARTITION_EOF:
                if err.fatal():
                    raise BrokerError(f"Kafka: {err.str()}", code=err.code())
                log.warning("Kafka: %s", err.str())
        return out

    def _landed(self, r: KafkaRecord) -> None:
        tp = (r.topic, r.partition)
        if tp in self._assigned and r.offset + 1 > self._pending.get(tp, -1):
            self._pending[tp] = r.offset + 1

    def flush(self, partitions: Collection[TP] | None = None) -> None:
        """Commit the offsets after the landed records (synchronously). ``partitions``: only these
        ``(topic, partition)`` (``None``: every one with landed records not yet committed)."""
        ck = self._ck
        todo = {tp: o for tp, o in self._pending.items() if partitions is None or tp in partitions}
        if not todo:
            return
        offsets = [ck.TopicPartition(t, p, o) for (t, p), o in todo.items()]
        try:
            self.consumer.commit(offsets=offsets, asynchronous=False)
        except ck.KafkaException as exc:  # kept: the next flush tries again (re-read records land twice at worst)
            log.warning("Kafka commit failed: %s", exc)
            return
        for tp in todo:
            if self._pending.get(tp) == todo[tp]:
                del self._pending[tp]

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        self._assigned |= {(tp.topic, tp.partition) for tp in partitions}

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        gone = {(tp.topic, tp.partition) for tp in partitions}
        if self.before_revoke is not None:
            self.before_revoke()  # the open file lands now: its records are then committed below
        self.flush(gone)
        self._forget(gone)

    def _on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        self._forget({(tp.topic, tp.partition) for tp in partitions})

    def _forget(self, gone: set[TP]) -> None:
        for tp in gone:
            self._pending.pop(tp, None)
        self._assigned -= gone

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._assigned.clear()
            self.consumer.close()


def landing_fields() -> list[tuple[str, Any]]:
    """The Kafka drain's landing columns after ``segment`` (pyarrow types): the record's coordinates,
    with ``headers`` as Spark's Kafka source gives them (a list of key/value structs: order and
    repeated keys kept)."""
    import pyarrow as pa

    header = pa.struct([("key", pa.string()), ("value", pa.binary())])
    return [
        ("key", pa.binary()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("ms", tz="UTC")),
        ("headers", pa.list_(header)),
        ("landed_at", pa.timestamp("us", tz="UTC")),
    ]


def landing_values(r: KafkaRecord, now: datetime) -> tuple[Any, ...]:
    """One record's values for :func:`landing_fields`, in that order."""
    headers = [{"key": k, "value": v} for k, v in r.headers]
    return (r.key, r.topic, r.partition, r.offset, r.timestamp, headers, now)
