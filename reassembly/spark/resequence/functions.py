"""The resequencer on Spark: ``resequence_stream`` (Structured Streaming) and ``resequence`` (a finished table).

Both run the in-process :class:`~reassembly.resequencer.core.Resequencer`, one per
group key, with the event time (milliseconds) as its clock; durations in
:class:`~reassembly.resequencer.model.ResequenceOptions` are given in seconds
and predicates (``StartWhen`` / ``EndWhen``) as SQL boolean expressions over
the input row. Each output row is an input row plus ``instance``,
``terminal`` (``out``, ``expire``, ``missing``, ``failure``), ``position``
(its place in the group instance's released order; null for missing and
failure), ``reason``/``reason_name``/``detail`` (failures; 0/NONE otherwise).
Every input row comes out exactly once (rows dropped by the watermark aside),
and every ``Skipped`` / ``GroupClosed`` event as a row of its own (terminal
``skipped`` / ``group_closed``; of the input columns only the group column
set) with ``cause``, ``skip_first``/``skip_stop`` and the closed instance's
``n_released``/``n_expired``/``n_missing``/``n_failed``/``gaps``.

Stream: ``transformWithState`` keyed by the group column, RocksDB state
store, **event-time** timers. Per key the state holds the resequencer's
snapshot (one group: its counters, skipped ranges, deadline; a closed group's
instance number until ``keep_closed``, then the highest instance number
forgotten, so the key's instance numbers never repeat: a key that has closed
an instance keeps a few bytes of state for good) and the held rows (map
state, by sequence number). ``release_partial=False`` (all-or-nothing) works
as in-process: the rows are held in state until the whole sequence is there.
Within a micro-batch a key's rows are offered in event-time order (ties by
sequence number); before them, and when a key's timer fires,
the resequencer is ticked to the batch's watermark: a deadline is handled at
its own time, so the rows of a micro-batch only see the deadlines the
watermark has passed. Processing time is not offered: event time lets an
``availableNow`` run end and a replayed batch decide as the first attempt did.
What each call decides is :class:`~reassembly.spark.resequence.core.ResequenceCore`'s (plain
Python); :class:`~reassembly.spark.resequence.processor.ResequenceProcessor` only reads and
writes the state.

Batch: the same per group, as if the rows had streamed in event-time order
with a perfect watermark (each row sees every deadline up to its own time),
then the input ends: what is still held leaves to Expire.

Limits are per key: ``max_group_messages``/``max_group_bytes`` bound each
key's held rows (over them: ``expire`` rows after the skip, as in-process).
The in-all limits cannot be: ``transformWithState`` only reaches the state of
the key it is handling, so no key can evict another's rows, and a per-task
count would make the output depend on partitioning and task scheduling (a
replayed micro-batch could then decide differently). Rather than give
``max_messages``/``max_bytes`` a silently different meaning, options where
they are tighter than the per-group limits are refused (``ValueError``); all
keys together are bounded by the state store (RocksDB spills to disk).
"""

from __future__ import annotations

from typing import Any

from reassembly.resequencer.model import EndWhen, ResequenceOptions, StartWhen
from reassembly.spark.resequence.core import (
    ENDS,
    EXTRA_FIELDS,
    FLAGS_COLUMN,
    MS_COLUMN,
    SEQ_COLUMN,
    SIZE_COLUMN,
    STARTS,
    group_of,
    resequence_table,
)
from reassembly.spark.state_store import require_rocksdb


def _sql(p: Any, what: str) -> str:
    if not isinstance(p, str):
        raise ValueError(f"in Spark the {what} predicate is a SQL boolean expression (a str), not {type(p).__name__}")
    return p


def _prepare(df: Any, group: str, seq: str, event_time: str, options: ResequenceOptions, size: str | None) -> Any:
    from pyspark.sql import functions as F

    clash = {name for name, _ in EXTRA_FIELDS} & set(df.columns)
    if clash:
        raise ValueError(f"input columns {sorted(clash)} are names of output columns: rename them")
    for name in (group, seq, event_time):
        if name not in df.columns:
            raise ValueError(f"no column {name!r} in the input")
    flags = F.lit(0)
    if isinstance(options.start, StartWhen):
        flags = flags + F.when(F.expr(_sql(options.start.predicate, "start")), STARTS).otherwise(0)
    if isinstance(options.end, EndWhen):
        flags = flags + F.when(F.expr(_sql(options.end.predicate, "end")), ENDS).otherwise(0)
    return df.select(
        *(F.col(f"`{c}`") for c in df.columns),
        F.expr(f"unix_millis(`{event_time}`)").alias(MS_COLUMN),
        F.col(f"`{seq}`").cast("long").alias(SEQ_COLUMN),
        flags.cast("int").alias(FLAGS_COLUMN),
        (F.col(f"`{size}`").cast("long") if size else F.lit(0).cast("long")).alias(SIZE_COLUMN),
    )


def _out_schema(df: Any) -> Any:
    from pyspark.sql.types import StructType, _parse_datatype_string

    schema = StructType(list(df.schema.fields))
    for name, ddl in EXTRA_FIELDS:
        schema = schema.add(name, _parse_datatype_string(ddl))
    return schema


def resequence_stream(
    df: Any,
    *,
    group: str,
    seq: str,
    event_time: str = "event_time",
    options: ResequenceOptions | None = None,
    watermark: float = 0.0,
    size: str | None = None,
) -> Any:
    """Resequence a streaming DataFrame; returns the stream of output rows (see the module docstring).

    ``group``, ``seq``, ``event_time`` (a timestamp) and ``size`` (optional,
    counted toward the byte limits) name columns of ``df``; ``watermark`` is
    how far (seconds) event time may run behind the newest seen (Spark drops
    older rows before they reach the state). The session must use the RocksDB
    state store provider (:data:`reassembly.spark.state_store.ROCKSDB`).
    """
    from reassembly.spark.resequence.processor import ResequenceProcessor

    require_rocksdb(df.sparkSession, "resequence_stream")
    opts = options or ResequenceOptions()
    delayed = df.withWatermark(event_time, f"{round(watermark * 1000)} milliseconds")
    prepared = _prepare(delayed, group, seq, event_time, opts, size)
    processor = ResequenceProcessor(options=opts, columns=list(df.columns), value_schema=df.schema, group_column=group)
    return prepared.groupBy(f"`{group}`").transformWithState(
        statefulProcessor=processor,
        outputStructType=_out_schema(df),
        outputMode="Append",
        timeMode="EventTime",
    )


def resequence(
    df: Any,
    *,
    group: str,
    seq: str,
    event_time: str = "event_time",
    options: ResequenceOptions | None = None,
    size: str | None = None,
) -> Any:
    """Resequence a finished table (batch): every group from its first row to the end of its input."""
    import pyarrow as pa

    opts = options or ResequenceOptions()
    columns = list(df.columns)
    schema = _out_schema(df)
    types = {"bigint": pa.int64(), "int": pa.int32(), "string": pa.string()}
    types["array<array<bigint>>"] = pa.list_(pa.list_(pa.int64()))

    def per_group(key, table):  # type: ignore[no-untyped-def]  # no hints: Spark picks the table form
        import pyarrow.compute as pc

        helpers = table.select([MS_COLUMN, SEQ_COLUMN, FLAGS_COLUMN, SIZE_COLUMN]).to_pylist()
        decided = resequence_table(opts, group_of(key), helpers)
        out = table.select(columns).take(pa.array([i for i, _ in decided], pa.int64()))  # None: a null row
        at = columns.index(group)
        filled = pc.fill_null(out.column(at), pa.scalar(key[0], out.schema.field(at).type))
        out = out.set_column(at, out.schema.field(at), filled)
        for k, (name, ddl) in enumerate(EXTRA_FIELDS):
            out = out.append_column(name, pa.array([e[k] for _, e in decided], types[ddl]))
        return out

    prepared = _prepare(df, group, seq, event_time, opts, size)
    return prepared.groupBy(f"`{group}`").applyInArrow(per_group, schema)


__all__ = ["resequence", "resequence_stream"]
