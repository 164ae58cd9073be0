"""The streaming job's committed rows: exactly the schema's columns, and the kept columns of the landing rows
they are or were built from, also for segments held in state across micro-batches and runs."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reassembly.spark import ReassemblyOptions
from reassembly.spark.schema import SOURCE, SOURCES, folder_columns
from reassembly.spark.stream.functions import (
    CheckpointMismatch,
    StreamOptions,
    bind_checkpoint,
    committed_batches,
    file_source,
    read_committed,
    reassemble_stream,
    start,
)
from reassembly.spark.stream.sink import FOLDERS
from reassembly.spark.testdata import generate
from segmenter.producer import Segmenter
from segmenter.wire import decode_segment

pytestmark = pytest.mark.spark

T0 = time.time() - 100_000


def land(directory: Path, name: str, rows: list[tuple[int, bytes | None]], at: float) -> None:
    ids, raws = zip(*rows, strict=True)
    table = pa.table(
        {
            "segment": pa.array(raws, pa.binary()),
            "id": pa.array(ids, pa.int64()),
            "topic": pa.array([f"t{i % 2}" for i in ids], pa.string()),
        }
    )
    tmp = directory.parent / f".{name}.parquet"
    pq.write_table(table, tmp)
    os.utime(tmp, (at, at))
    tmp.rename(directory / f"{name}.parquet")


def run(spark: Any, base: Path, keep: tuple[str, ...], max_files: int | None = None) -> None:
    options = StreamOptions(
        expire_after=300, watermark=0, tombstone=5000, reassembly=ReassemblyOptions(keep_columns=keep)
    )
    df = file_source(spark, str(base / "landing"), max_files=max_files, keep=("id", "topic") if keep else ())
    query = start(
        reassemble_stream(df, options=options), base / "out", str(base / "ck"), "available-now", options=options
    )
    assert query.awaitTermination(600), "available-now run did not end"
    assert query.exception() is None


def _stream(spark: Any, base: Path, keep: tuple[str, ...]) -> dict[int, bytes | None]:
    """Three files: messages straddling micro-batches and runs, duplicates, garbage, a NULL row,
    then a file far later in event time (what is still open expires), then a late copy."""
    (base / "landing").mkdir(parents=True)
    ds = generate(n_messages=10, segments_per_message=3, segment_size=1024, seed=5)
    rows: list[bytes | None] = [*ds.rows, None]
    random.Random(3).shuffle(rows)
    by_id = dict(enumerate(rows))
    items = list(by_id.items())
    land(base / "landing", "f0", items[0::2], T0)
    land(base / "landing", "f1", items[1::2], T0 + 10)
    run(spark, base, keep, max_files=1)  # two micro-batches: segments held across them
    n = len(by_id)
    fresh = [s.encode() for s in Segmenter(300).segment(b"pushes the watermark" * 20)]
    late = next(r for r in rows if r is not None)  # a copy of something long decided
    extra = [*fresh, late]
    land(base / "landing", "f2", [(n + i, r) for i, r in enumerate(extra)], T0 + 10_000)
    by_id.update({n + i: r for i, r in enumerate(extra)})
    run(spark, base, keep)
    return by_id


def test_committed_folders_hold_exactly_their_columns_and_their_sources(stream_spark: Any, tmp_path: Path) -> None:
    keep = ("id", "topic")
    by_id = _stream(stream_spark, tmp_path, keep)
    out = tmp_path / "out"
    assert len(committed_batches(out)) >= 3
    for kind, folder in FOLDERS.items():
        for f in (out / folder).glob("batch=*/*.parquet"):
            assert tuple(pq.read_schema(f).names) == folder_columns(kind, True), f
    messages, quarantine = read_committed(out, "message"), read_committed(out, "quarantine")
    duplicates = read_committed(out, "duplicate")
    used: list[int] = []
    for m in messages:
        ids = [s["id"] for s in m[SOURCES]]
        assert len(ids) == (m["segments_used"] or 0)
        assert all(s["topic"] == f"t{s['id'] % 2}" for s in m[SOURCES])
        segs = [decode_segment(by_id[i]) for i in ids]  # type: ignore[arg-type]
        assert [s.header.offset for s in segs] == sorted(s.header.offset for s in segs)
        assert {s.header.group_id for s in segs} <= {m["group_id"]}
        used += ids
    quarantined = [q[SOURCE]["id"] for q in quarantine]
    for q in quarantine:
        assert q["raw"] == by_id[q[SOURCE]["id"]]  # the landing row's value exactly (NULL stays NULL)
    copies = [d[SOURCE]["id"] for d in duplicates]
    for i in copies:
        assert by_id[i] is not None
    assert any(by_id[i] is None for i in quarantined)
    every = used + quarantined + copies
    assert len(set(every)) == len(every)  # each landing row once
    assert len(by_id) == len(every) + sum(m["duplicates"] for m in messages)
    # a checkpoint begun with kept columns is not continued without them (its held rows carry them)
    with pytest.raises(CheckpointMismatch, match="keep_columns"):
        bind_checkpoint(str(tmp_path / "ck"), StreamOptions())


def test_without_kept_columns_the_folders_hold_the_schema_alone(stream_spark: Any, tmp_path: Path) -> None:
    _stream(stream_spark, tmp_path, ())
    out = tmp_path / "out"
    seen = set()
    for kind, folder in FOLDERS.items():
        for f in (out / folder).glob("batch=*/*.parquet"):
            assert tuple(pq.read_schema(f).names) == folder_columns(kind, False), f
            seen.add(kind)
    assert seen == {"message", "quarantine", "duplicate"}
