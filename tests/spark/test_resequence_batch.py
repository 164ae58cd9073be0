"""The Spark batch resequencer (``BatchOptions``, ``key=``) equals the in-process one.

The in-process reference drives :class:`BatchResequencer` with the keys as Python ``datetime``
values (Spark sorts a timestamp key as its microseconds), one per group (Spark's state is per key,
so are its window numbers): a finished table as rows in event-time order each after every deadline
up to its own time, then the end of input; a stream per micro-batch, ticked to the batch's
watermark before its rows. The output rows must be the same, column for column, ``window_closed``
rows included. Without Spark, :class:`BatchCore` with a dictionary for the state store gives the
same rows for any policy and any cut into micro-batches.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reassembly.resequencer import BatchOptions, BatchResequencer, DuplicatePolicy
from reassembly.resequencer.batch_model import BatchEvent, WindowClosed
from reassembly.spark.resequence import resequence, resequence_stream
from reassembly.spark.resequence.batch_core import (
    BATCH_EXTRA_FIELDS,
    BatchCore,
    BatchDecision,
    BatchItem,
    batch_core_options,
    batch_outputs,
)
from reassembly.spark.resequence.core import HELD, Clock

T0 = 1_700_000_000_000  # ms
EPOCH = datetime(1970, 1, 1)
Row = tuple[str, datetime | None, bytes, int]  # grp, stamp (the key), body, event ms
SCHEMA = pa.schema(
    [("grp", pa.string()), ("stamp", pa.timestamp("us")), ("body", pa.binary()), ("ts", pa.timestamp("ms"))]
)
SCHEMA_DDL = "grp string, stamp timestamp, body binary, ts timestamp"
BATCH = BatchOptions(batch_size=4, batch_timeout=30.0, duplicates=DuplicatePolicy.DROP, reverse=True)
STREAM = BatchOptions(batch_size=4, batch_timeout=30.0, duplicates=DuplicatePolicy.REPLACE)


def dataset(seed: int, files: int = 3) -> list[list[Row]]:
    """Four groups of stamps in a narrow range (equal ones happen), one row without a stamp; the event
    times of file f lie in [T0 + f * 100 s, ...): a window's timeout (30 s) passes between files."""
    rng = random.Random(seed)
    out: list[list[Row]] = [[] for _ in range(files)]
    for g in range(4):
        for i in range(rng.randrange(4, 11)):
            stamp = datetime(2026, 1, 1) + timedelta(seconds=rng.randrange(12), microseconds=rng.choice([0, 7]))
            out[rng.randrange(files)].append((f"g{g}", stamp, f"g{g}-{i}".encode(), 0))
    out[min(1, files - 1)].append(("g0", None, b"no stamp", 0))
    for f, rows in enumerate(out):
        rng.shuffle(rows)
        out[f] = [(*r[:3], T0 + f * 100_000 + i * 997) for i, r in enumerate(rows)]
    return out


def extra(ev: BatchEvent) -> tuple[Any, ...]:
    return next(e for _, e in batch_outputs([ev]))


def row_of(ev: BatchEvent) -> tuple[Any, ...]:
    """An event as the operator's output row: grp, body, then the extra columns."""
    head = (ev.group, None) if isinstance(ev, WindowClosed) else (ev.group, ev.item)
    return (*head, *extra(ev))


def order(r: Row) -> tuple[int, bool, Any]:
    return (r[3], r[1] is None, r[1] or EPOCH)


def in_process_batches(batches: list[list[Row]], options: BatchOptions) -> Counter[tuple[Any, ...]]:
    """The stream's specification: per micro-batch, every group ticked to its watermark (the newest
    event time of the earlier batches), then the batch's rows in event-time order; a resequencer per group."""
    clock = Clock()
    per: dict[str, BatchResequencer] = {}
    events: list[BatchEvent] = []
    wm = 0
    for batch in batches:
        clock.now = wm
        for r in per.values():
            events += r.tick()
        for grp, stamp, body, ms in sorted(batch, key=order):
            clock.now = ms
            rs = per.setdefault(grp, BatchResequencer(batch_core_options(options), clock=clock))
            events += rs.offer(grp, stamp, body)
        wm = max([wm, *(row[3] for row in batch)])
    clock.now = wm
    for r in per.values():
        events += r.tick()
    return Counter(row_of(e) for e in events)


def in_process_table(rows: list[Row], options: BatchOptions) -> Counter[tuple[Any, ...]]:
    """A finished table's specification: per group, each row after every deadline up to its own time,
    then every deadline passes and the rest is flushed."""
    events: list[BatchEvent] = []
    for grp in sorted({r[0] for r in rows}):
        clock = Clock()
        rs = BatchResequencer(batch_core_options(options), clock=clock)
        for _, stamp, body, ms in sorted((r for r in rows if r[0] == grp), key=order):
            clock.now = ms
            events += rs.tick() + rs.offer(grp, stamp, body)
        clock.now = float("inf")
        events += rs.tick() + rs.flush()
    return Counter(row_of(e) for e in events)


def _got(rows: list[Any]) -> Counter[tuple[Any, ...]]:
    cols = ("grp", "body", *(name for name, _ in BATCH_EXTRA_FIELDS))
    return Counter(tuple(bytes(r[c]) if c == "body" and r[c] is not None else r[c] for c in cols) for r in rows)


def utc(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


# ---------------------------------------------------------------- Spark
@pytest.mark.spark
def test_a_finished_table_equals_in_process(spark: Any) -> None:
    rows = [row for batch in dataset(seed=2) for row in batch]
    df = spark.createDataFrame([(g, s, b, utc(ms)) for g, s, b, ms in rows], SCHEMA_DDL)
    got = _got(resequence(df, group="grp", key="stamp", event_time="ts", options=BATCH).collect())
    want = in_process_table(rows, BATCH)
    assert got == want
    terminals = Counter(k[3] for k in got.elements())
    assert {"out", "duplicate", "invalid", "window_closed"} <= set(terminals), terminals
    assert {k[8] for k in got if k[3] == "window_closed"} >= {"size", "timeout"}
    assert sum(n for k, n in got.items() if k[3] != "window_closed") == len(rows)  # every row exactly once


def land(directory: Path, name: str, rows: list[Row], mtime: float) -> None:
    cols = list(zip(*rows, strict=True))
    ts = [utc(ms).replace(tzinfo=None) for ms in cols[3]]
    table = pa.table([pa.array(c, t.type) for c, t in zip([*cols[:3], ts], SCHEMA, strict=True)], schema=SCHEMA)
    tmp = directory.parent / f".{name}"
    pq.write_table(table, tmp)
    os.utime(tmp, (mtime, mtime))
    tmp.rename(directory / name)


@pytest.mark.spark
@pytest.mark.parametrize(
    "files", [1, pytest.param(3, marks=pytest.mark.slow)], ids=["one-file-one-marker", "three-files-two-markers"]
)
def test_a_stream_equals_in_process_fed_in_micro_batches(stream_spark: Any, tmp_path: Path, files: int) -> None:
    """Micro-batches of landing files; a marker file far later in event time pushes the watermark past
    every deadline, so the rows held in state leave by their timers (with three files, rows held in
    one micro-batch also leave by size, or as replaced duplicates, in a later one; with two markers,
    the second sees the first's window still held)."""
    far = T0 + 50 * 100_000
    markers = [[("zz", EPOCH, b"late marker", far)], [("zz", EPOCH, b"later marker", far + 1)]]
    batches = [*dataset(seed=1, files=files), *markers[: max(files - 1, 1)]]
    landing = tmp_path / "landing"
    landing.mkdir()
    for i, rows in enumerate(batches):
        land(landing, f"f{i}.parquet", rows, 1_600_000_000 + i)
    df = stream_spark.readStream.schema(SCHEMA_DDL).option("maxFilesPerTrigger", 1).parquet(str(landing))
    out = resequence_stream(df, group="grp", key="stamp", event_time="ts", options=STREAM)
    query = (
        out.writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(600) and query.exception() is None
    got = _got(stream_spark.read.parquet(str(tmp_path / "out")).collect())
    want = in_process_batches(batches, STREAM)
    assert got == want
    assert {"out", "duplicate", "invalid", "window_closed"} <= {k[3] for k in got}
    assert {k[8] for k in got if k[3] == "window_closed"} >= {"size", "timeout"}


@pytest.mark.spark
def test_what_spark_cannot_honour_is_refused_on_the_driver(spark: Any) -> None:
    df = spark.createDataFrame([("a", 1.5, utc(T0))], "grp string, score double, ts timestamp")
    with pytest.raises(ValueError, match="batch mode sorts integer, string, binary, timestamp and date"):
        resequence(df, group="grp", key="score", event_time="ts", options=BatchOptions())
    with pytest.raises(ValueError, match="key=COLUMN"):
        resequence(df, group="grp", seq="score", event_time="ts", options=BatchOptions())
    with pytest.raises(ValueError, match="seq=COLUMN"):
        resequence(df, group="grp", key="score", event_time="ts")
    with pytest.raises(ValueError, match="compute it with withColumn"):
        resequence(df, group="grp", key="ts", event_time="ts", options=BatchOptions(key=lambda m: m))
    with pytest.raises(ValueError, match="max_window_items/max_window_bytes"):
        resequence(df, group="grp", key="ts", event_time="ts", options=BatchOptions(batch_size=5, max_items=10))


# ---------------------------------------------------------------- the core without Spark
@dataclass
class KeyState:
    """What Spark's state store holds for one key."""

    snapshot: bytes | None = None
    held: dict[int, Row] = field(default_factory=dict)
    timer: int | None = None


class Store:
    """The batch processor's part, with a dictionary for Spark's state: apply each decision as it does,
    and fire timers as Spark does (after a micro-batch's rows, those at or before its watermark)."""

    def __init__(self, options: BatchOptions) -> None:
        self.core = BatchCore(options)
        self.keys: dict[str, KeyState] = {}
        self.out: Counter[tuple[Any, ...]] = Counter()

    def _apply(self, key: str, d: BatchDecision, rows: list[Row]) -> None:
        state = self.keys[key]
        for o in d.rows:
            if o.at is None:
                head: tuple[Any, ...] = (key, None)
            elif o.at == HELD:
                head = (key, state.held.pop(o.seq)[2])
            else:
                head = (key, rows[o.at][2])
            self.out[(*head, *o.extra)] += 1
        for i, serial in d.hold:
            assert serial not in state.held
            state.held[serial] = rows[i]
        state.snapshot, state.timer = d.snapshot, d.deadline

    def batch(self, rows: list[Row], watermark: int) -> None:
        for key in dict.fromkeys(r[0] for r in rows):
            mine = [r for r in rows if r[0] == key]
            micros = [None if r[1] is None else (r[1] - EPOCH) // timedelta(microseconds=1) for r in mine]
            items = [BatchItem(r[3], m, 0) for r, m in zip(mine, micros, strict=True)]
            state = self.keys.setdefault(key, KeyState())
            self._apply(key, self.core.offer(state.snapshot, watermark, key, items), mine)
        for key, state in self.keys.items():
            if state.timer is not None and state.timer <= watermark:
                self._apply(key, self.core.fire(state.snapshot, watermark, state.timer), [])


@given(st.integers(0, 10**6), st.sampled_from(list(DuplicatePolicy)), st.booleans(), st.sampled_from([None, 2, 4]))
@settings(max_examples=20, deadline=None)
def test_the_core_with_a_dictionary_for_state_equals_in_process(
    seed: int, policy: DuplicatePolicy, reverse: bool, size: int | None
) -> None:
    options = BatchOptions(batch_size=size, batch_timeout=30.0, duplicates=policy, reverse=reverse)
    far = T0 + 50 * 100_000
    batches = [*dataset(seed), [("zz", EPOCH, b"late marker", far)], [("zz", EPOCH, b"later marker", far + 1)]]
    store = Store(options)
    wm = 0
    for batch in batches:
        store.batch(batch, wm)
        wm = max([wm, *(r[3] for r in batch)])
    store.batch([], wm)
    assert store.out == in_process_batches(batches, options)
    held = sum(len(s.held) for s in store.keys.values())  # the markers' window: its timeout is ahead
    rows_out = sum(n for k, n in store.out.items() if k[3] != "window_closed")
    assert rows_out + held == sum(len(b) for b in batches)  # every row once, or still held
