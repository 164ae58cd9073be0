"""The collector on Spark Structured Streaming: messages keyed by destination, batches out as segments.

``transformWithState`` keyed by destination (RocksDB state store, event time, like
:mod:`.stream`). Per destination the state holds the open batch (list state: payload and event
time per member) and a small value (first event time, bytes, the batch counter, the timer).
The rules are read from the rules database (:mod:`reassembly.collector.storage`, SQLite path or
PostgreSQL URL) when a task's processor starts, that is once per partition per micro-batch:
a changed rule applies from the next micro-batch on. ``max_wait`` is an event-time timer on
the first member; ``stranded_after`` has no role here, because Spark's checkpointed state
leaves no message behind a crash (the micro-batch is replayed), and ``shutdown`` does not occur
(a stream has no end; an available-now run keeps open batches in the state for the next run).

Output rows are segments: (``target``, ``destination``, ``batch_id``, ``cause``, ``segment``),
each batch one MQ logical group exactly as the collector core emits it
(:func:`reassembly.collector.core.batch_segments`), with the batch id ``<destination>#<n>`` (the
counter is state, so a replayed micro-batch names its batches the same). :func:`start` writes
them with :class:`.stream.BatchWriter`-style commits into ``OUTPUT/batch=<N>/target=<t>``,
which ``reassemble run 'OUTPUT/batch=*/target=<t>'`` reassembles.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reassembly.collector.core import BatchReady, Cause, Held, Rule, batch_segments
from reassembly.collector.storage import RuleCache, open_storage
from reassembly.spark.stream.reassemble import ROCKSDB
from reassembly.spark.writer import parquet_writer
from segmenter.producer import DEFAULT_SEGMENT_SIZE, Segmenter

OUTPUT_DDL = "target string, destination string, batch_id string, cause string, segment binary"
_HELD = "payload binary, event_ms long"
_INFO = "first_ms long, held_bytes long, batch_no long, deadline_ms long"


@dataclass(frozen=True)
class SparkCollectOptions:
    rules: str  # SQLite path or postgresql:// URL, readable from every executor
    max_segment_size: int = DEFAULT_SEGMENT_SIZE
    watermark: float = 60.0  # seconds event time may run behind the newest seen


def _rule_lookup(url: str) -> RuleCache:
    """Rules read once, now (the processor is made once per task: once per micro-batch per partition)."""
    storage = open_storage(url)
    try:
        rules = storage.read_rules()
    finally:
        storage.close()
    cache = RuleCache(lambda: rules, ttl=float("inf"))
    cache.refresh()
    return cache


def _processor(opts: SparkCollectOptions) -> Any:
    from pyspark.sql import Row
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    segmenter = Segmenter(max_segment_size=opts.max_segment_size)

    class Batcher(StatefulProcessor):  # type: ignore[misc]
        def init(self, handle: Any) -> None:
            self.handle = handle
            self.held = handle.getListState("held", _HELD)
            self.info = handle.getValueState("info", _INFO)
            self.rules = _rule_lookup(opts.rules)

        def _emit(
            self, destination: str, members: list[tuple[bytes, int]], cause: Cause, rule: Rule, n: int
        ) -> Iterator[Any]:
            batch = BatchReady(
                destination,
                f"{destination}#{n}",
                tuple(Held(i, p, t / 1000) for i, (p, t) in enumerate(members)),
                cause,
                rule,
            )
            for s in batch_segments(batch, segmenter):
                yield Row(
                    target=rule.target,
                    destination=destination,
                    batch_id=batch.batch_id,
                    cause=cause.value,
                    segment=s.encode(),
                )

        def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
            destination = key[0]
            rule = self.rules(destination)
            new = sorted(((bytes(r.payload), int(r.event_ms)) for r in rows), key=lambda m: (m[1], m[0]))
            if self.info.exists():
                _, _, batch_no, deadline = self.info.get()
                held = [(bytes(p), int(t)) for p, t in self.held.get()]
            else:
                batch_no, deadline, held = 0, -1, []
            out: list[Any] = []
            members: list[tuple[bytes, int]] = []
            held_bytes = 0
            wait_ms = int(rule.max_wait * 1000)
            for payload, t in held + new:  # the held ones again: a lowered limit splits the open batch
                if members and t >= members[0][1] + wait_ms:  # it came after the open batch's deadline
                    out += self._emit(destination, members, Cause.TIMEOUT, rule, batch_no)
                    batch_no, members, held_bytes = batch_no + 1, [], 0
                elif members and held_bytes + len(payload) > rule.max_bytes:
                    out += self._emit(destination, members, Cause.FULL, rule, batch_no)
                    batch_no, members, held_bytes = batch_no + 1, [], 0
                members.append((payload, t))
                held_bytes += len(payload)
                if len(members) >= rule.max_messages or held_bytes >= rule.max_bytes:
                    out += self._emit(destination, members, Cause.FULL, rule, batch_no)
                    batch_no, members, held_bytes = batch_no + 1, [], 0
            self._keep(members, held_bytes, batch_no, deadline, rule)
            return iter(out)

        def _keep(
            self, members: list[tuple[bytes, int]], held_bytes: int, batch_no: int, deadline: int, rule: Rule
        ) -> None:
            """Store the open batch and move its timer to first member + max_wait."""
            self.held.clear()
            first = min((t for _, t in members), default=-1)
            due = first + int(rule.max_wait * 1000) if members else -1
            if deadline != due and deadline >= 0:
                self.handle.deleteTimer(deadline)
            if members:
                self.held.appendList(members)
                if due != deadline:
                    self.handle.registerTimer(due)
            self.info.update((first, held_bytes, batch_no, due))

        def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:
            destination = key[0]
            if not self.info.exists():
                return iter(())
            _, _, batch_no, deadline = self.info.get()
            members = [(bytes(p), int(t)) for p, t in self.held.get()]
            if not members or expiredTimerInfo.getExpiryTimeInMs() != deadline:
                return iter(())
            out = list(self._emit(destination, members, Cause.TIMEOUT, self.rules(destination), batch_no))
            self.held.clear()
            self.info.update((-1, 0, batch_no + 1, -1))
            return iter(out)

        def close(self) -> None:
            pass

    return Batcher()


def collect_stream(df: Any, options: SparkCollectOptions) -> Any:
    """A stream of (destination, payload, event_time) rows in; the stream of batch segments out."""
    from pyspark.sql import functions as F

    conf = df.sparkSession.conf.get("spark.sql.streaming.stateStore.providerClass", "")
    if conf != ROCKSDB:
        raise ValueError(f"the streaming collector needs spark.sql.streaming.stateStore.providerClass={ROCKSDB}")
    rows = df.select(
        F.coalesce(F.col("destination"), F.lit("")).alias("destination"),
        F.coalesce(F.col("payload"), F.expr("X''")).alias("payload"),
        F.col("event_time").cast("timestamp").alias("event_time"),
    ).withWatermark("event_time", f"{int(options.watermark * 1000)} milliseconds")
    keyed = rows.select("destination", "payload", F.expr("unix_millis(event_time)").alias("event_ms"), "event_time")
    return keyed.groupBy("destination").transformWithState(
        statefulProcessor=_processor(options), outputStructType=OUTPUT_DDL, outputMode="Append", timeMode="EventTime"
    )


def message_source(spark: Any, path: str, *, event_time: str | None = None) -> Any:
    """A landing directory of (destination, payload) Parquet files as a stream; event time from the
    named column, or each file's modification time."""
    from pyspark.sql import functions as F

    schema = "destination string, payload binary" + (f", `{event_time}` timestamp" if event_time else "")
    df = spark.readStream.schema(schema).parquet(path)
    t = F.col(event_time) if event_time else F.col("_metadata.file_modification_time")
    return df.select("destination", "payload", t.alias("event_time"))


class TargetWriter:
    """``foreachBatch`` sink: micro-batch N to ``OUTPUT/batch=N/target=<t>/``, committed by ``OUTPUT/_commits/N``.

    A replay of a committed micro-batch is skipped; of an uncommitted one, its leftovers are
    removed and it is written again (same state version, same rows, same batch ids). Read
    ``OUTPUT/batch=*/target=<t>`` for one target's batches.
    """

    def __init__(self, out: Path) -> None:
        self.out = out
        (out / "_commits").mkdir(parents=True, exist_ok=True)

    def __call__(self, df: Any, batch_id: int) -> None:
        marker = self.out / "_commits" / str(batch_id)
        if marker.exists():
            return
        final, tmp = self.out / f"batch={batch_id}", self.out / f"_incoming-{batch_id}"
        for stale in (final, tmp):
            shutil.rmtree(stale, ignore_errors=True)
        parquet_writer(df).partitionBy("target").parquet(str(tmp))
        tmp.rename(final)
        marker.touch()  # after the rename: a marker names a complete micro-batch


def start(stream: Any, out: Path, checkpoint: str, trigger: str = "available-now") -> Any:
    """Write ``stream`` (from :func:`collect_stream`) under ``out``; ``trigger`` available-now or an interval."""
    writer = stream.writeStream.foreachBatch(TargetWriter(out)).option("checkpointLocation", checkpoint)
    writer = writer.trigger(availableNow=True) if trigger == "available-now" else writer.trigger(processingTime=trigger)
    return writer.start()


__all__ = ["OUTPUT_DDL", "SparkCollectOptions", "TargetWriter", "collect_stream", "message_source", "start"]
