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

Batch mode (Apache Camel's batch resequencer): with
:class:`~reassembly.resequencer.batch_model.BatchOptions` and ``key=COLUMN`` (integers, string,
binary, timestamp, timestamp_ntz or date; a timestamp is sorted as its microseconds, a date as its
days) the in-process :class:`~reassembly.resequencer.batch.BatchResequencer` runs per group key
instead, its window opened by the key's first row and released sorted by the key column after
``batch_size`` rows or ``batch_timeout`` seconds of event time (an event-time timer). The extra
columns are then ``window``, ``terminal`` (``out``, ``duplicate``, ``invalid``, and
``window_closed`` for a row of its own), ``position``, ``reason``/``reason_name``/``detail``,
``cause`` (``size``, ``timeout``, ``flush``, ``limit``) and ``n_released``/``n_duplicates``.
Per key the state holds the resequencer's snapshot (the window counter, kept for good so a key's
window numbers never repeat) and the held rows (map state by a serial number). Window numbers count
per key (1, 2, ...): in-process, one resequencer numbers the windows of all its groups from one
counter. A key function (``BatchOptions(key=...)``) is refused: compute the key as a column.

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

from reassembly.resequencer.batch_model import BatchOptions
from reassembly.resequencer.model import EndWhen, ResequenceOptions, StartWhen
from reassembly.spark.engine.state_store import require_rocksdb
from reassembly.spark.resequence.batch_core import BATCH_EXTRA_FIELDS, KEY_COLUMN, batch_core_options, batch_table
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


def _out_schema(df: Any, extra: tuple[tuple[str, str], ...] = EXTRA_FIELDS) -> Any:
    from pyspark.sql.types import StructType, _parse_datatype_string

    schema = StructType(list(df.schema.fields))
    for name, ddl in extra:
        schema = schema.add(name, _parse_datatype_string(ddl))
    return schema


# The key column types the batch mode sorts, and how each becomes the helper column (same order).
_KEY_SQL = {
    "bigint": "CAST(`{c}` AS BIGINT)",
    "int": "CAST(`{c}` AS BIGINT)",
    "smallint": "CAST(`{c}` AS BIGINT)",
    "tinyint": "CAST(`{c}` AS BIGINT)",
    "string": "`{c}`",
    "binary": "`{c}`",
    "timestamp": "unix_micros(`{c}`)",
    "timestamp_ntz": "timestampdiff(MICROSECOND, TIMESTAMP_NTZ'1970-01-01 00:00:00', `{c}`)",
    "date": "CAST(unix_date(`{c}`) AS BIGINT)",
}


def _mode(
    options: ResequenceOptions | BatchOptions | None, seq: str | None, key: str | None
) -> tuple[ResequenceOptions | BatchOptions, str]:
    """The options and the column they order by: ``seq`` for the sequence mode, ``key`` for the batch mode."""
    if isinstance(options, BatchOptions):
        if key is None or seq is not None:
            raise ValueError("batch mode (BatchOptions) sorts by key=COLUMN; seq= is the sequence mode's")
        batch_core_options(options)  # refused here, on the driver, if Spark cannot honour them
        return options, key
    if seq is None or key is not None:
        raise ValueError("the sequence mode (ResequenceOptions) orders by seq=COLUMN; key= is for BatchOptions")
    return options or ResequenceOptions(), seq


def _prepare_batch(df: Any, group: str, key: str, event_time: str, size: str | None) -> Any:
    from pyspark.sql import functions as F

    clash = {name for name, _ in BATCH_EXTRA_FIELDS} & set(df.columns)
    if clash:
        raise ValueError(f"input columns {sorted(clash)} are names of output columns: rename them")
    for name in (group, key, event_time):
        if name not in df.columns:
            raise ValueError(f"no column {name!r} in the input")
    kind = df.schema[key].dataType.simpleString()
    if kind not in _KEY_SQL:
        raise ValueError(
            f"the key column {key!r} is {kind}: batch mode sorts integer, string, binary, timestamp and date columns"
        )
    return df.select(
        *(F.col(f"`{c}`") for c in df.columns),
        F.expr(f"unix_millis(`{event_time}`)").alias(MS_COLUMN),
        F.expr(_KEY_SQL[kind].format(c=key.replace("`", "``"))).alias(KEY_COLUMN),
        (F.col(f"`{size}`").cast("long") if size else F.lit(0).cast("long")).alias(SIZE_COLUMN),
    )


def resequence_stream(
    df: Any,
    *,
    group: str,
    seq: str | None = None,
    event_time: str = "event_time",
    options: ResequenceOptions | BatchOptions | None = None,
    watermark: float = 0.0,
    size: str | None = None,
    key: str | None = None,
) -> Any:
    """Resequence a streaming DataFrame; returns the stream of output rows (see the module docstring).

    ``group``, ``seq``, ``event_time`` (a timestamp) and ``size`` (optional,
    counted toward the byte limits) name columns of ``df``; ``watermark`` is
    how far (seconds) event time may run behind the newest seen (Spark drops
    older rows before they reach the state). ``options``: how to resequence,
    :class:`~reassembly.resequencer.model.ResequenceOptions` (by sequence number, the default) or
    :class:`~reassembly.resequencer.batch_model.BatchOptions` (batch mode: ``key`` names the
    column to sort by instead of ``seq``). The session must use the RocksDB state store provider
    (:data:`reassembly.spark.engine.state_store.ROCKSDB`).
    """
    from reassembly.spark.resequence.processor import BatchResequenceProcessor, ResequenceProcessor

    require_rocksdb(df.sparkSession, "resequence_stream")
    opts, column = _mode(options, seq, key)
    delayed = df.withWatermark(event_time, f"{round(watermark * 1000)} milliseconds")
    processor: Any
    if isinstance(opts, BatchOptions):
        prepared = _prepare_batch(delayed, group, column, event_time, size)
        processor = BatchResequenceProcessor(
            options=opts, columns=list(df.columns), value_schema=df.schema, group_column=group
        )
        schema = _out_schema(df, BATCH_EXTRA_FIELDS)
    else:
        prepared = _prepare(delayed, group, column, event_time, opts, size)
        processor = ResequenceProcessor(
            options=opts, columns=list(df.columns), value_schema=df.schema, group_column=group
        )
        schema = _out_schema(df)
    return prepared.groupBy(f"`{group}`").transformWithState(
        statefulProcessor=processor,
        outputStructType=schema,
        outputMode="Append",
        timeMode="EventTime",
    )


def resequence(
    df: Any,
    *,
    group: str,
    seq: str | None = None,
    event_time: str = "event_time",
    options: ResequenceOptions | BatchOptions | None = None,
    size: str | None = None,
    key: str | None = None,
) -> Any:
    """Resequence a finished table (batch): every group from its first row to the end of its input.

    ``df``: the table; ``group``, ``seq``, ``event_time`` (a timestamp: the resequencer's clock) and
    ``size`` (optional, counted toward the byte limits) name its columns. ``options``: how to
    resequence, :class:`~reassembly.resequencer.model.ResequenceOptions` (by ``seq``, the default) or
    :class:`~reassembly.resequencer.batch_model.BatchOptions` (batch mode: windows sorted by the
    ``key`` column instead)."""
    import pyarrow as pa

    opts, column = _mode(options, seq, key)
    columns = list(df.columns)
    batch = isinstance(opts, BatchOptions)
    extra = BATCH_EXTRA_FIELDS if batch else EXTRA_FIELDS
    schema = _out_schema(df, extra)
    types = {"bigint": pa.int64(), "int": pa.int32(), "string": pa.string()}
    types["array<array<bigint>>"] = pa.list_(pa.list_(pa.int64()))
    helper_names = [MS_COLUMN, KEY_COLUMN, SIZE_COLUMN] if batch else [MS_COLUMN, SEQ_COLUMN, FLAGS_COLUMN, SIZE_COLUMN]

    def per_group(key, table):  # type: ignore[no-untyped-def]  # no hints: Spark picks the table form
        import pyarrow.compute as pc

        helpers = table.select(helper_names).to_pylist()
        if isinstance(opts, BatchOptions):
            decided = batch_table(opts, group_of(key), helpers)
        else:
            decided = resequence_table(opts, group_of(key), helpers)
        out = table.select(columns).take(pa.array([i for i, _ in decided], pa.int64()))  # None: a null row
        at = columns.index(group)
        filled = pc.fill_null(out.column(at), pa.scalar(key[0], out.schema.field(at).type))
        out = out.set_column(at, out.schema.field(at), filled)
        for k, (name, ddl) in enumerate(extra):
            out = out.append_column(name, pa.array([e[k] for _, e in decided], types[ddl]))
        return out

    if isinstance(opts, BatchOptions):
        prepared = _prepare_batch(df, group, column, event_time, size)
    else:
        prepared = _prepare(df, group, column, event_time, opts, size)
    return prepared.groupBy(f"`{group}`").applyInArrow(per_group, schema)


__all__ = ["resequence", "resequence_stream"]
