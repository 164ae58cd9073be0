"""The Spark resequencer equals the in-process one: a stream fed in micro-batches, and a finished table.

Stream: six groups (gaps that arrive late or never, duplicates, numbers
above the end, a null number) land as three Parquet files, one micro-batch
each, event time rising from file to file; two files far later in event
time then push the watermark past every deadline. The in-process reference
drives one :class:`Resequencer` the way the operator is specified to: per
micro-batch, tick to the batch's watermark (the newest event time of the
earlier batches), then offer the batch's rows in event-time order. The
output rows must be the same, row for row and column for column: every
event, the ``skipped`` and ``group_closed`` rows included.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reassembly.resequencer import Resequencer
from reassembly.resequencer.model import EndWhen, Event, ResequenceOptions, StartAt
from reassembly.spark.engine.state_store import PROVIDER, ROCKSDB
from reassembly.spark.resequence import resequence, resequence_stream
from reassembly.spark.resequence.core import EXTRA_FIELDS, Clock, Ref, core_options, outputs, ref_of

pytestmark = pytest.mark.spark

T0 = 1_700_000_000_000  # ms
OPTIONS = ResequenceOptions(start=StartAt(0), end=EndWhen("is_last"), missing_timeout=30.0, keep_closed=100.0)
SCHEMA = pa.schema(
    [
        ("grp", pa.string()),
        ("seq", pa.int64()),
        ("body", pa.binary()),
        ("is_last", pa.bool_()),
        ("ts", pa.timestamp("ms")),
    ]
)
Row = tuple[str, int | None, bytes, bool, int]  # grp, seq, body, is_last, event ms


def dataset(seed: int = 3, files: int = 3) -> list[list[Row]]:
    rng = random.Random(seed)
    out: list[list[Row]] = [[] for _ in range(files)]
    for g in range(6):
        n = rng.randrange(3, 9)
        for seq in range(n):
            copies = rng.choices([0, 1, 2], weights=[1, 8, 1])[0]  # some never come, some twice
            for c in range(copies):
                f = rng.randrange(files)
                out[f].append((f"g{g}", seq, f"g{g}-{seq}-{c}".encode(), seq == n - 1, 0))
        out[rng.randrange(files)].append((f"g{g}", n + 2, b"after the end", False, 0))
    out[1].append(("g0", None, b"no number", False, 0))
    for f, rows in enumerate(out):  # event times inside the file's window, rising from file to file
        rng.shuffle(rows)
        out[f] = [(*r[:4], T0 + f * 100_000 + i * 997) for i, r in enumerate(rows)]
    return out


def flush(files: int) -> list[list[Row]]:
    far = T0 + (files + 50) * 100_000
    return [[("zz", 0, b"late marker", False, far)], [("zz", 1, b"later marker", False, far + 1)]]


def reference(batches: list[list[Row]], options: ResequenceOptions) -> Counter[tuple[Any, ...]]:
    """The operator's specification, in-process: per micro-batch, tick to its watermark, then offer its rows."""
    clock = Clock()
    r = Resequencer(core_options(options), clock=clock)
    rows = [row for batch in batches for row in batch]
    events: list[Event] = []
    seen = 0
    wm = 0
    for batch in batches:
        clock.now = wm
        events += r.tick()
        for row in sorted(batch, key=lambda row: (row[4], row[1] is None, row[1] or 0)):
            clock.now = row[4]
            flags = 2 if row[3] else 0
            events += r.offer(row[0], row[1], Ref(flags, rows.index(row, seen)), size=0)
        seen += len(batch)
        wm = max([wm, *(row[4] for row in batch)])
    clock.now = wm
    events += r.tick()
    return rows_of(events, rows)


def rows_of(events: list[Event], rows: list[Row]) -> Counter[tuple[Any, ...]]:
    """Every event as the operator's output row: grp, seq, body, then the extra columns."""
    out: Counter[tuple[Any, ...]] = Counter()
    for ev, extra in outputs(events):
        ref = ref_of(ev)
        head = (ev.group, None, None) if ref is None else rows[ref.row][:3]
        out[(*head, *(freeze(v) for v in extra))] += 1
    return out


def freeze(v: Any) -> Any:
    return tuple(tuple(x) for x in v) if isinstance(v, list) else v


def land(directory: Path, name: str, rows: list[Row], mtime: float) -> None:
    cols = list(zip(*rows, strict=True))
    ts = [datetime.fromtimestamp(ms / 1000, tz=timezone.utc).replace(tzinfo=None) for ms in cols[4]]
    table = pa.table([pa.array(c, t.type) for c, t in zip([*cols[:4], ts], SCHEMA, strict=True)], schema=SCHEMA)
    tmp = directory.parent / f".{name}"
    pq.write_table(table, tmp)
    os.utime(tmp, (mtime, mtime))
    tmp.rename(directory / name)


def _got(rows: list[Any]) -> Counter[tuple[Any, ...]]:
    cols = ("grp", "seq", "body", *(name for name, _ in EXTRA_FIELDS))
    return Counter(tuple(bytes(r[c]) if c == "body" and r[c] is not None else freeze(r[c]) for c in cols) for r in rows)


def test_stream_equals_in_process_fed_in_micro_batches(spark: Any, tmp_path: Path) -> None:
    spark.conf.set(PROVIDER, ROCKSDB)
    try:
        _stream_equals_in_process(spark, tmp_path)
    finally:
        spark.conf.unset(PROVIDER)


def _stream_equals_in_process(stream_spark: Any, tmp_path: Path) -> None:
    batches = dataset() + flush(3)
    landing = tmp_path / "landing"
    landing.mkdir()
    for i, rows in enumerate(batches):
        land(landing, f"f{i}.parquet", rows, 1_600_000_000 + i)
    df = stream_spark.readStream.schema(SCHEMA_DDL).option("maxFilesPerTrigger", 1).parquet(str(landing))
    out = resequence_stream(df, group="grp", seq="seq", event_time="ts", options=OPTIONS)
    query = (
        out.writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(600) and query.exception() is None
    got = _got(stream_spark.read.parquet(str(tmp_path / "out")).collect())
    want = reference(batches, OPTIONS)
    assert got == want
    terminals = Counter(k[4] for k in want.elements())
    every = {"out", "expire", "missing", "failure", "skipped", "group_closed"}
    assert every <= set(terminals), terminals  # the data exercises every terminal and both other events
    messages = sum(n for k, n in want.items() if k[4] not in ("skipped", "group_closed"))
    assert messages == sum(len(b) for b in batches)  # every row exactly once


SCHEMA_DDL = "grp string, seq bigint, body binary, is_last boolean, ts timestamp"


@pytest.mark.parametrize("options", [OPTIONS, replace(OPTIONS, release_partial=False)], ids=["partial", "whole"])
def test_batch_equals_in_process_with_a_perfect_watermark(spark: Any, options: ResequenceOptions) -> None:
    """Also all-or-nothing (``release_partial=False``): the operator passes the option through."""
    rows = [row for batch in dataset(seed=9) for row in batch]
    table = [(g, s, b, last, datetime.fromtimestamp(ms / 1000, tz=timezone.utc)) for g, s, b, last, ms in rows]
    df = spark.createDataFrame(table, SCHEMA_DDL)
    got = _got(resequence(df, group="grp", seq="seq", event_time="ts", options=options).collect())
    # the specification: each row sees every deadline up to its own time; then the input ends
    want: Counter[tuple[Any, ...]] = Counter()
    for grp in sorted({r[0] for r in rows}):
        mine = sorted((r for r in rows if r[0] == grp), key=lambda r: (r[4], r[1] is None, r[1] or 0))
        clock = Clock()
        rs = Resequencer(core_options(options), clock=clock)
        events: list[Event] = []
        for i, r in enumerate(mine):
            clock.now = r[4]
            events += rs.tick() + rs.offer(grp, r[1], Ref(2 if r[3] else 0, i))
        clock.now = float("inf")
        events += rs.tick() + rs.close()
        want += rows_of(events, mine)
    assert got == want
    assert {"skipped", "group_closed"} <= {k[4] for k in got}
    assert sum(n for k, n in got.items() if k[4] not in ("skipped", "group_closed")) == len(rows)


def test_stream_refuses_a_session_without_rocksdb(spark: Any) -> None:
    df = spark.readStream.format("rate").load()
    with pytest.raises(ValueError, match="providerClass"):
        resequence_stream(df, group="value", seq="value", event_time="timestamp")
