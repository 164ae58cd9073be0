"""``ReassemblyResult.save``: clean messages by a JVM-only job, the rest judged by a second job from
side files; the same rows as ``combined``, and no second job when nothing needs judging."""

from __future__ import annotations

import random
import re
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from reassembly.spark import ReassemblyOptions, reassemble
from reassembly.spark.batch.judge import read_side
from reassembly.spark.batch.save import SIDE, side_files
from reassembly.spark.testdata import Dataset, write_parquet
from segmenter import Segmenter
from tests.spark.test_differential import canonical  # tests/ is on sys.path (pytest's rootdir import mode)
from tests.spark.test_jvm_jar import hostile_rows


def saved_rows(spark: Any, out: Path) -> list[dict[str, Any]]:
    rows = []
    for kind, folder in (("message", "messages"), ("quarantine", "quarantine")):
        if any((out / folder).glob("*.parquet")):
            table = spark.read.parquet(str(out / folder))
            rows += [{**r.asDict(recursive=True), "kind": kind} for r in table.collect()]
    return rows


@pytest.mark.spark
@pytest.mark.parametrize("threshold", [None, 100, 3000])  # payload_dir: far rows, per-offset groups, large messages
def test_save_writes_the_rows_of_combined_on_hostile_input(spark: Any, tmp_path: Path, threshold: int | None) -> None:
    path = write_parquet(Dataset(rows=hostile_rows()), tmp_path / "in", files=3)
    df = spark.read.parquet(str(path)).union(spark.createDataFrame([(None,)], "segment binary"))
    base = tmp_path / "payloads"
    large: dict[str, Any] = {} if threshold is None else {"payload_dir": str(base), "large_message_bytes": threshold}
    result = reassemble(df, options=ReassemblyOptions(max_message_size=1 << 20, partitions=3, **large))
    saved = result.save(tmp_path / "out")
    assert saved.split and saved.side_files > 0  # hostile input: the second job ran
    assert not (tmp_path / "out" / SIDE).exists()
    combined = [r.asDict(recursive=True) for r in result.combined.collect()]
    got = saved_rows(spark, tmp_path / "out")
    assert canonical(got, base) == canonical(combined, base)
    assert sum(r["kind"] == "message" and r["status"] == "complete" for r in got) > 15


@pytest.mark.spark
def test_clean_input_is_written_without_a_second_job(spark: Any, tmp_path: Path) -> None:
    payloads = [bytes([i]) * (5000 + 301 * i) for i in range(12)]
    rows = [s.encode() for p in payloads for s in Segmenter(1024).segment(p)]
    path = write_parquet(Dataset(rows=rows[::-1]), tmp_path / "in", files=2)
    saved = reassemble(spark.read.parquet(str(path)), options=ReassemblyOptions(partitions=3)).save(tmp_path / "out")
    assert saved[:2] == (True, 0)
    got = saved_rows(spark, tmp_path / "out")
    assert sorted(bytes(r["payload"]) for r in got) == sorted(payloads)
    assert {r["status"] for r in got} == {"complete"} and sum(r["segments_used"] for r in got) == len(rows)
    assert (tmp_path / "out" / "quarantine").is_dir() and not (tmp_path / "out" / SIDE).exists()
    # nothing quarantined is still a table a reader can open (an empty directory: UNABLE_TO_INFER_SCHEMA)
    empty = spark.read.parquet(str(tmp_path / "out" / "quarantine"))
    assert empty.count() == 0 and {"raw", "reason", "raw_path"} <= set(empty.columns)


@pytest.mark.spark
def test_without_the_jar_save_writes_the_rows_of_combined(spark: Any, tmp_path: Path) -> None:
    path = write_parquet(Dataset(rows=hostile_rows()), tmp_path / "in", files=2)
    options = ReassemblyOptions(max_message_size=1 << 20, partitions=2, use_jar=False)
    result = reassemble(spark.read.parquet(str(path)), options=options)
    assert result.split is None and result.save(tmp_path / "out")[:2] == (False, 0)
    assert canonical(saved_rows(spark, tmp_path / "out")) == canonical(
        [r.asDict(recursive=True) for r in result.combined.collect()]
    )


@pytest.mark.spark
@pytest.mark.parametrize("use_jar", [True, False])  # the clean job's writer, and write_split's
def test_the_writer_holds_one_message_over_a_row_group_not_a_hundred(spark: Any, tmp_path: Path, use_jar: bool) -> None:
    """Parquet looks at what its writer holds after every row we write (``writer.LARGE_ROWS``), not
    after the first 100: with a 1 MiB row group, six 1.5 MiB messages in one file are six row groups,
    where Parquet's defaults buffer all six (they would be 100 messages of up to max_message_size); and
    it writes the payloads without trying a dictionary."""
    payloads = [random.Random(i).randbytes(3 << 19) for i in range(6)]  # what Parquet counts is compressed
    rows = [s.encode() for p in payloads for s in Segmenter(1 << 18).segment(p)]
    path = write_parquet(Dataset(rows=rows), tmp_path / "in", files=2)
    spark.conf.set("parquet.block.size", str(1 << 20))  # Spark copies its SQL settings into Parquet's
    try:
        options = ReassemblyOptions(partitions=1, use_jar=use_jar)
        reassemble(spark.read.parquet(str(path)), options=options).save(tmp_path / "out")
    finally:
        spark.conf.unset("parquet.block.size")
    files = list((tmp_path / "out" / "messages").glob("*.parquet"))
    assert [pq.ParquetFile(f).metadata.num_rows for f in files] == [6]
    meta = pq.ParquetFile(files[0]).metadata
    assert meta.num_row_groups == 6
    payload = meta.schema.names.index("payload")  # a message is no dictionary entry (writer.LARGE_ROWS)
    assert not any("DICTIONARY" in e for g in range(6) for e in meta.row_group(g).column(payload).encodings)
    assert sorted(bytes(r["payload"]) for r in saved_rows(spark, tmp_path / "out")) == sorted(payloads)


def test_every_parquet_write_of_ours_goes_through_the_large_rows_writer() -> None:
    """The stream and collect jobs' writers too: no ``df.write`` without ``parquet_writer``'s settings."""
    root = Path(__file__).resolve().parents[2] / "reassembly"
    raw = re.compile(r"\.write\s*\.\s*(parquet|partitionBy|mode|format|option|save|insertInto|saveAsTable)\b")
    found = [
        f"{p}:{i}"
        for p in root.rglob("*.py")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if raw.search(line)
    ]
    assert found == []
    assert "parquet_writer(" in (root / "spark" / "stream" / "sink.py").read_text()  # the stream's sink
    assert "parquet_writer(" in (root / "spark" / "collect" / "functions.py").read_text()


def test_one_finished_side_file_per_partition(tmp_path: Path) -> None:
    for name in ("0-1-9.side", "0-0-5.side", "1-0-7.side", "2-0-3.tmp", "10-0-4.side"):
        (tmp_path / name).write_bytes(b"")
    # an unfinished attempt (.tmp) is never read; of two finished attempts one is read
    assert [Path(p).name for p in side_files(tmp_path)] == ["0-0-5.side", "1-0-7.side", "10-0-4.side"]


def side_bytes(*groups: tuple[bool, bool, list[bytes | None]]) -> bytes:
    out = b""
    for routable, large, raws in groups:
        out += struct.pack(">BBi", routable, large, len(raws))
        for raw in raws:
            out += struct.pack(">q", -1) if raw is None else struct.pack(">q", len(raw)) + raw
    return out


def test_a_side_file_reads_back_group_by_group(tmp_path: Path) -> None:
    groups = [(True, False, [b"h1data", b"", b"h2x"]), (False, False, [None, b"junk"]), (True, True, [])]
    (tmp_path / "0-0-1.side").write_bytes(side_bytes(*groups))
    assert [tuple(g)[:3] for g in read_side(str(tmp_path / "0-0-1.side"))] == groups  # no .src: nothing kept


@pytest.mark.parametrize("cut", [1, 5, 9, 14, 20])
def test_a_side_file_cut_short_is_an_error_not_an_early_end(tmp_path: Path, cut: int) -> None:
    data = side_bytes((True, False, [b"0123456789"]))
    (tmp_path / "s.side").write_bytes(data[: len(data) - cut])
    with pytest.raises(OSError, match="cut short"):
        list(read_side(str(tmp_path / "s.side")))


@pytest.mark.parametrize(
    "damage",
    [
        struct.pack(">BBi", 1, 0, 1) + struct.pack(">q", 1 << 62) + b"x",  # a length far past the end
        struct.pack(">BBi", 1, 0, 1) + struct.pack(">q", -5) + b"x",  # negative, not the NULL marker
        struct.pack(">BBi", 1, 0, -1),  # a negative row count
        struct.pack(">BBi", 1, 0, 1 << 30) + struct.pack(">q", -1),  # more rows than the file can hold
    ],
)
def test_a_damaged_side_file_is_refused_before_anything_is_allocated(tmp_path: Path, damage: bytes) -> None:
    (tmp_path / "s.side").write_bytes(side_bytes((False, False, [b"ok"])) + damage)
    groups = read_side(str(tmp_path / "s.side"))
    assert next(groups).raws == [b"ok"]  # what precedes the damage reads as written
    with pytest.raises(OSError, match="cut short or damaged"):
        next(groups)


@pytest.mark.spark
def test_a_message_of_unknown_size_is_a_file_on_every_path(spark: Any, tmp_path: Path) -> None:
    """With a payload_dir, a length-deferred message (a MessageWriter's) is a file whichever path
    judges it (the clean test or the assembler): the row's columns never depend on the path that ran."""
    import os

    from segmenter.digest import DigestPolicy

    rows = []
    payloads = {}
    for seg in (Segmenter(300, digest=DigestPolicy(sha256=True)), Segmenter(300)):
        w = seg.message_writer()
        body = os.urandom(500)
        segs = [*w.write(body), *w.close()]
        payloads[segs[0].header.group_id] = body
        rows += [s.encode() for s in segs]
    path = write_parquet(Dataset(rows=rows), tmp_path / "in", files=1)
    seen = []
    for i, opts in enumerate([{"use_jar": True}, {"use_jar": False}, {"jvm_fast_path": False}]):
        out = tmp_path / f"out{i}"
        options = ReassemblyOptions(payload_dir=str(out / "payloads"), partitions=1, **opts)  # type: ignore[arg-type]
        reassemble(spark.read.parquet(str(path)), options=options).save(out)
        got = saved_rows(spark, out)
        assert {r["status"] for r in got} == {"complete"} and len(got) == 2
        for r in got:
            assert (
                r["payload"] is None and (out / "payloads" / r["payload_path"]).read_bytes() == payloads[r["group_id"]]
            )
        seen.append(sorted((bytes(r["group_id"]), r["payload_path"]) for r in got))
    assert seen[0] == seen[1] == seen[2]


def test_the_side_judge_holds_no_payload_of_a_batch_while_spark_writes_it(tmp_path: Path) -> None:
    """While Spark writes a batch of output rows, neither the list of rows it was built from
    (``judged`` keeps the list until it resumes) nor the side file's reader and ``judged`` (the
    group's original rows) may still hold the payloads: a 100 MiB message would stay in the worker
    up to three times while its batch is written, and the default-threshold hostile-input test
    (``-m slow``) would go over its memory bound. Arrow's buffers are not Python allocations, so what
    tracemalloc still sees while a batch is out is what the judge kept."""
    import tracemalloc

    import pyarrow as pa

    from reassembly import Limits
    from reassembly.spark.batch.judge import make_side_judge

    judge = make_side_judge(Limits(max_message_size=1 << 30), True, None, None)

    def batches(payload: bytes, name: str) -> Iterator[pa.RecordBatch]:
        segs = [s.encode() for s in Segmenter(4 << 20).segment(payload)]
        (tmp_path / name).write_bytes(side_bytes((True, False, segs)))
        return judge(iter([pa.RecordBatch.from_pylist([{"path": str(tmp_path / name)}])]))

    for batch in batches(b"warm up: every module the judge imports on first use", "warm.side"):
        assert batch.num_rows == 1
    size = 24 << 20
    payload = bytes(range(256)) * (size // 256)
    out = batches(payload, "s.side")
    tracemalloc.start()
    try:
        held = []
        for batch in out:
            held.append(tracemalloc.get_traced_memory()[0])
            assert batch.column("payload")[0].as_py() == payload
            del batch
    finally:
        tracemalloc.stop()
    assert held and max(held) < size // 4, [h >> 20 for h in held]
