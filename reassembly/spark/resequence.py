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
instance number until ``keep_closed``) and the held rows (map state, by
sequence number). Within a micro-batch a key's rows are offered in event-time
order (ties by sequence number); before them, and when a key's timer fires,
the resequencer is ticked to the batch's watermark: a deadline is handled at
its own time, so the rows of a micro-batch only see the deadlines the
watermark has passed. Processing time is not offered: event time lets an
``availableNow`` run end and a replayed batch decide as the first attempt did.

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

from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

from reassembly.resequencer.core import Resequencer
from reassembly.resequencer.model import (
    EndAuto,
    EndWhen,
    Event,
    Expired,
    Failed,
    GroupClosed,
    Missing,
    Released,
    ResequenceOptions,
    Skipped,
    StartAuto,
    StartWhen,
)

EXTRA_FIELDS = (
    ("instance", "bigint"),
    ("terminal", "string"),
    ("position", "bigint"),
    ("reason", "int"),
    ("reason_name", "string"),
    ("detail", "string"),
    ("cause", "string"),
    ("skip_first", "bigint"),
    ("skip_stop", "bigint"),
    ("n_released", "bigint"),
    ("n_expired", "bigint"),
    ("n_missing", "bigint"),
    ("n_failed", "bigint"),
    ("gaps", "array<array<bigint>>"),
)
_MS, _SEQ, _FLAGS, _SIZE = "__reseq_ms", "__reseq_seq", "__reseq_flags", "__reseq_size"
STARTS, ENDS = 1, 2  # bits of a row's predicate flags, computed in the JVM


class Ref(NamedTuple):
    """What the resequencer holds for a Spark row: its predicate flags and where the row is."""

    flags: int  # STARTS: the start predicate is true, ENDS: the end predicate is true
    row: int  # the row's place in this micro-batch; -1: held in the state store


class Clock:
    """Event time in milliseconds, set by the caller before each step."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def core_options(options: ResequenceOptions) -> ResequenceOptions:
    """Seconds to milliseconds; SQL predicates to readers of the flags computed in the JVM."""

    lim = options.limits
    if lim.max_messages < lim.max_group_messages or lim.max_bytes < lim.max_group_bytes:
        raise ValueError(
            "in Spark every group key has its own resequencer: max_messages/max_bytes (in all) cannot be "
            "enforced across keys (transformWithState reaches only the key it is handling); bound each key "
            "with max_group_messages/max_group_bytes (the state store bounds the keys together)"
        )

    def ms(x: float | None) -> float | None:
        return None if x is None else float(round(x * 1000))

    start, end = options.start, options.end
    if isinstance(start, StartWhen):
        start = StartWhen(lambda seq, ref: bool(ref.flags & STARTS))
    elif isinstance(start, StartAuto):
        start = StartAuto(ms(start.gather) or 0.0)
    if isinstance(end, EndWhen):
        end = EndWhen(lambda seq, ref: bool(ref.flags & ENDS))
    elif isinstance(end, EndAuto):
        end = EndAuto(ms(end.idle) or 0.0)
    timeout, keep = ms(options.missing_timeout), ms(options.keep_closed)
    return replace(options, start=start, end=end, missing_timeout=timeout, keep_closed=keep)


def _sql(p: Any, what: str) -> str:
    if not isinstance(p, str):
        raise ValueError(f"in Spark the {what} predicate is a SQL boolean expression (a str), not {type(p).__name__}")
    return p


def outputs(events: list[Event]) -> Iterator[tuple[Event, tuple[Any, ...]]]:
    """Every event with its extra columns (:data:`EXTRA_FIELDS`): a row per message, and a row per
    ``Skipped`` (terminal ``skipped``) and ``GroupClosed`` (terminal ``group_closed``)."""
    none = (None,) * 8  # cause, skip_first, skip_stop, the four counts, gaps
    for ev in events:
        if isinstance(ev, Failed):
            yield ev, (ev.instance, "failure", None, int(ev.reason), ev.reason.name, str(ev.error), *none)
        elif isinstance(ev, Missing):
            yield ev, (ev.instance, "missing", None, 0, "NONE", None, *none)
        elif isinstance(ev, (Released, Expired)):
            terminal = "out" if isinstance(ev, Released) else "expire"
            yield ev, (ev.instance, terminal, ev.position, 0, "NONE", None, *none)
        elif isinstance(ev, Skipped):
            yield ev, (ev.instance, "skipped", None, 0, "NONE", None, ev.cause.value, ev.first, ev.stop, *none[:5])
        else:
            counts = (ev.released, ev.expired, ev.missing, ev.failed)
            gaps = [list(g) for g in ev.gaps]
            yield ev, (ev.instance, "group_closed", None, 0, "NONE", None, ev.cause.value, None, None, *counts, gaps)


def ref_of(ev: Event) -> Ref | None:
    """Where a message event's row is; None for ``Skipped`` / ``GroupClosed`` (rows of their own)."""
    return None if isinstance(ev, (Skipped, GroupClosed)) else ev.item  # type: ignore[no-any-return]


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
        F.expr(f"unix_millis(`{event_time}`)").alias(_MS),
        F.col(f"`{seq}`").cast("long").alias(_SEQ),
        flags.cast("int").alias(_FLAGS),
        (F.col(f"`{size}`").cast("long") if size else F.lit(0).cast("long")).alias(_SIZE),
    )


def _out_schema(df: Any) -> Any:
    from pyspark.sql.types import StructType, _parse_datatype_string

    schema = StructType(list(df.schema.fields))
    for name, ddl in EXTRA_FIELDS:
        schema = schema.add(name, _parse_datatype_string(ddl))
    return schema


def _key(key: Sequence[Any]) -> Any:
    k = key[0]
    return bytes(k) if isinstance(k, (bytearray, memoryview)) else k


def _order(row: Any) -> tuple[int, int, int]:
    seq = row[_SEQ]
    return (row[_MS] or 0, seq is None, seq or 0)


def _processor(options: ResequenceOptions, columns: list[str], value_schema: Any, group_column: str) -> Any:
    from pyspark.sql import Row
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    opts = core_options(options)
    names = [*columns, *(n for n, _ in EXTRA_FIELDS)]

    class Resequence(StatefulProcessor):  # type: ignore[misc]
        def init(self, handle: Any) -> None:
            self.handle = handle
            self.core = handle.getValueState("core", "blob binary")
            self.held = handle.getMapState("held", "seq bigint", value_schema)

        def _load(self, clock: Clock) -> Resequencer:
            if self.core.exists():
                blob = bytes(self.core.get()[0])
                return Resequencer.restore(blob, opts, clock=clock, decode=lambda b: Ref(b[0], -1))
            return Resequencer(opts, clock=clock)

        def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
            group, clock = _key(key), Clock()
            batch = sorted(rows, key=_order)
            r = self._load(clock)
            clock.now = timerValues.getCurrentWatermarkInMs()
            events = r.tick()
            for i, row in enumerate(batch):
                clock.now = row[_MS] or 0
                events += r.offer(group, row[_SEQ], Ref(row[_FLAGS], i), size=row[_SIZE] or 0)
            return self._emit(r, events, batch, key[0])

        def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:
            clock = Clock()
            r = self._load(clock)
            clock.now = max(timerValues.getCurrentWatermarkInMs(), expiredTimerInfo.getExpiryTimeInMs())
            return self._emit(r, r.tick(), [], key[0])

        def _emit(self, r: Resequencer, events: list[Event], batch: list[Any], key_value: Any) -> Iterator[Any]:
            out, left = [], set()
            for ev, extra in outputs(events):
                if isinstance(ev, (Skipped, GroupClosed)):  # only the group column of the input is set
                    values = tuple(key_value if c == group_column else None for c in columns)
                elif ev.item.row >= 0:
                    values = tuple(batch[ev.item.row][c] for c in columns)
                    left.add(ev.item.row)
                else:
                    values = tuple(self.held.getValue((ev.seq,)))
                    self.held.removeKey((ev.seq,))
                out.append(Row(**dict(zip(names, (*values, *extra), strict=True))))
            for i, row in enumerate(batch):
                if i not in left:  # held: kept in the state store until it leaves
                    self.held.updateValue((row[_SEQ],), tuple(row[c] for c in columns))
            if r.open_groups == 0 and r.next_deadline() is None:
                self.core.clear()
            else:
                self.core.update((r.snapshot(encode=lambda ref: bytes([ref.flags])),))
            for t in list(self.handle.listTimers()):
                self.handle.deleteTimer(t)
            deadline = r.next_deadline()
            if deadline is not None:
                self.handle.registerTimer(int(deadline))
            return iter(out)

        def close(self) -> None:
            pass

    return Resequence()


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
    state store provider (:data:`reassembly.spark.stream.reassemble.ROCKSDB`).
    """
    from reassembly.spark.stream.reassemble import ROCKSDB

    if df.sparkSession.conf.get("spark.sql.streaming.stateStore.providerClass", "") != ROCKSDB:
        raise ValueError(f"resequence_stream needs spark.sql.streaming.stateStore.providerClass={ROCKSDB}")
    opts = options or ResequenceOptions()
    delayed = df.withWatermark(event_time, f"{round(watermark * 1000)} milliseconds")
    prepared = _prepare(delayed, group, seq, event_time, opts, size)
    return prepared.groupBy(f"`{group}`").transformWithState(
        statefulProcessor=_processor(opts, list(df.columns), df.schema, group),
        outputStructType=_out_schema(df),
        outputMode="Append",
        timeMode="EventTime",
    )


def resequence_table(
    options: ResequenceOptions, group: Any, rows: list[dict[str, Any]]
) -> list[tuple[int | None, tuple[Any, ...]]]:
    """One group of a finished table, in-process: ``(row index, extras)`` per output row, in event order
    (index None: a ``skipped`` or ``group_closed`` row)."""
    clock = Clock()
    r = Resequencer(core_options(options), clock=clock)
    events: list[Event] = []
    for i in sorted(range(len(rows)), key=lambda i: _order(rows[i])):
        row = rows[i]
        clock.now = row[_MS] or 0
        events += r.tick()
        events += r.offer(group, row[_SEQ], Ref(row[_FLAGS], i), size=row[_SIZE] or 0)
    clock.now = float("inf")
    events += r.tick() + r.close()
    return [(None if (ref := ref_of(ev)) is None else ref.row, extra) for ev, extra in outputs(events)]


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

        helpers = table.select([_MS, _SEQ, _FLAGS, _SIZE]).to_pylist()
        decided = resequence_table(opts, _key(key), helpers)
        out = table.select(columns).take(pa.array([i for i, _ in decided], pa.int64()))  # None: a null row
        at = columns.index(group)
        filled = pc.fill_null(out.column(at), pa.scalar(key[0], out.schema.field(at).type))
        out = out.set_column(at, out.schema.field(at), filled)
        for k, (name, ddl) in enumerate(EXTRA_FIELDS):
            out = out.append_column(name, pa.array([e[k] for _, e in decided], types[ddl]))
        return out

    prepared = _prepare(df, group, seq, event_time, opts, size)
    return prepared.groupBy(f"`{group}`").applyInArrow(per_group, schema)


__all__ = [
    "EXTRA_FIELDS",
    "Ref",
    "core_options",
    "outputs",
    "ref_of",
    "resequence",
    "resequence_stream",
    "resequence_table",
]
