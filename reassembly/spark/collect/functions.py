"""The collector on Spark Structured Streaming: messages keyed by destination, batches out as segments.

``transformWithState`` keyed by destination (RocksDB state store, event time, like
:mod:`reassembly.spark.stream`). Per destination the state holds the open batch (list state: payload and event
time per member) and a small value (first event time, bytes, the batch counter, the timer).
What closes a batch is decided by :class:`~reassembly.spark.collect.core.CollectCore` (plain
Python); :class:`~reassembly.spark.collect.processor.Batcher` only reads and writes the state.
The rules are read from the rules database (:mod:`reassembly.storage.collector`, SQLite path or
PostgreSQL URL) when a task's processor starts, that is once per partition per micro-batch:
a changed rule applies from the next micro-batch on. ``max_wait`` (from the oldest member) and
``idle_timeout`` (from the newest) are one event-time timer at the earlier of the two, moved with
every member added; ``stranded_after`` has no role here, because Spark's checkpointed state
leaves no message behind a crash (the micro-batch is replayed), and ``shutdown`` does not occur
(a stream has no end; an available-now run keeps open batches in the state for the next run).

Output rows are segments: (``target``, ``destination``, ``batch_id``, ``cause``, ``segment``),
each batch one MQ logical group exactly as the collector core emits it
(:func:`reassembly.collector.core.batch_segments`), with the batch id ``<destination>#<n>`` (the
counter is state, so a replayed micro-batch names its batches the same). :func:`start` writes
them with :class:`~reassembly.spark.stream.functions.BatchWriter`-style commits into
``OUTPUT/batch=<N>/target=<t>``, which ``reassemble run 'OUTPUT/batch=*/target=<t>'`` reassembles.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reassembly.spark.engine.state_store import require_rocksdb
from reassembly.spark.writer import parquet_writer
from segmenter.producer import DEFAULT_SEGMENT_SIZE

OUTPUT_DDL = "target string, destination string, batch_id string, cause string, segment binary"


@dataclass(frozen=True)
class SparkCollectOptions:
    """How :func:`collect_stream` batches a stream of messages by destination (the collector's rules,
    read from a database every executor reaches), and how the batches are cut into segments."""

    rules: str
    """The rules database (a SQLite path or a ``postgresql://`` URL) that every executor can read:
    how each destination is batched (:class:`~reassembly.collector.Rule`)."""
    max_segment_size: int = DEFAULT_SEGMENT_SIZE
    """Bytes per segment (header included) of the batches written out as segments."""
    watermark: float = 60.0
    """Seconds event time may run behind the newest seen; older rows are dropped by Spark."""


def collect_stream(df: Any, options: SparkCollectOptions) -> Any:
    """A stream of (destination, payload, event_time) rows in; the stream of batch segments out.

    ``df``: the streaming DataFrame of messages, with columns ``destination``, ``payload`` and
    ``event_time``; ``options``: the rules database, the segment size and the watermark
    (:class:`SparkCollectOptions`)."""
    from pyspark.sql import functions as F

    from reassembly.spark.collect.processor import Batcher

    require_rocksdb(df.sparkSession, "the streaming collector")
    rows = df.select(
        F.coalesce(F.col("destination"), F.lit("")).alias("destination"),
        F.coalesce(F.col("payload"), F.expr("X''")).alias("payload"),
        F.col("event_time").cast("timestamp").alias("event_time"),
    ).withWatermark("event_time", f"{int(options.watermark * 1000)} milliseconds")
    keyed = rows.select("destination", "payload", F.expr("unix_millis(event_time)").alias("event_ms"), "event_time")
    return keyed.groupBy("destination").transformWithState(
        statefulProcessor=Batcher(rules=options.rules, max_segment_size=options.max_segment_size),
        outputStructType=OUTPUT_DDL,
        outputMode="Append",
        timeMode="EventTime",
    )


def message_source(spark: Any, path: str, *, event_time: str | None = None) -> Any:
    """A landing directory of (destination, payload) Parquet files as a stream; event time from the
    named column, or each file's modification time.

    ``spark``: the session. ``path``: the landing directory. ``event_time``: the column of event times (None: each
    file's modification time).
    """
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

    ``out``: the output directory.
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
    """Write ``stream`` (from :func:`collect_stream`) under ``out``; ``trigger`` available-now or an interval.

    ``checkpoint``: the stream's checkpoint location.
    """
    writer = stream.writeStream.foreachBatch(TargetWriter(out)).option("checkpointLocation", checkpoint)
    writer = writer.trigger(availableNow=True) if trigger == "available-now" else writer.trigger(processingTime=trigger)
    return writer.start()


__all__ = ["OUTPUT_DDL", "SparkCollectOptions", "TargetWriter", "collect_stream", "message_source", "start"]
