"""Spark against in-process on landing files that Spark's scan reads in different input partitions.

Each landing file here is its own input partition (``spark.sql.files.openCostInBytes`` raised for the
test, so that Spark packs no two small files into one scan task; checked, not assumed). A message's
rows lie in one split, or straddle two, or have a duplicate, a conflicting copy (a bit flipped; or new
bytes with a valid data checksum and a resealed header) or a forged sibling (same GroupId, another
offset or other flags) in another split; an MQ group's messages lie in two. Whatever plan the job
runs, its rows (``combined``, and ``messages`` and ``quarantine`` as ``save()`` writes them, every
column) must equal the in-process assembler's over the whole multiset of rows, and the rows with the
JVM fast path off, and with every row shuffled (``assemble_in_splits=False``: ``save()`` then stages
nothing in the scan).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from reassembly.spark import ReassemblyOptions, reassemble
from reassembly.spark.batch.pipeline import STAGE
from reassembly.spark.engine.bridge import SK_HEADER
from reassembly.spark.rows import reassemble_group
from segmenter import Segmenter
from segmenter.checksum import ChecksumAlgorithm, checksum
from segmenter.digest import NO_POLICY
from segmenter.flags import MsgFlags
from segmenter.header_table import FIELD
from segmenter.wire import HEADER_LENGTH, decode_header
from tests.spark.test_differential import MAX, canonical, in_process, message, reseal, spark_rows
from tests.spark.test_save import saved_rows

pytestmark = pytest.mark.spark

OPEN_COST = "spark.sql.files.openCostInBytes"
GROUP_ID = slice(FIELD["group_id"].offset, FIELD["group_id"].offset + 24)


@pytest.fixture
def file_per_split(spark: Any) -> Iterator[Any]:
    """The run's session with every landing file (of a few KiB) in its own scan task: a file costs as
    much as a whole split to open (Spark packs files into a split only while their sizes plus that cost
    fit ``maxPartitionBytes``, 128 MiB); put back after."""
    before = spark.conf.get(OPEN_COST, None)
    spark.conf.set(OPEN_COST, str(128 << 20))
    yield spark
    if before is None:
        spark.conf.unset(OPEN_COST)
    else:
        spark.conf.set(OPEN_COST, before)


def write_files(directory: Path, files: list[list[bytes | None]]) -> Path:
    directory.mkdir(parents=True)
    for k, rows in enumerate(files):
        pq.write_table(pa.table({"segment": pa.array(rows, pa.binary())}), directory / f"part-{k:04d}.parquet")
    return directory


def splits_of(spark: Any, path: Path) -> dict[bytes, set[int]]:
    """Each GroupId's scan partitions (after checking that each file is one partition of its own)."""
    from pyspark.sql import functions as F

    df = spark.read.parquet(str(path))
    rows = df.select("segment", F.spark_partition_id().alias("p"), F.col("_metadata.file_path").alias("f")).collect()
    assert df.rdd.getNumPartitions() == len(list(path.glob("*.parquet")))
    assert len({r.p for r in rows}) == len({r.f for r in rows}) == len({(r.p, r.f) for r in rows})
    out: dict[bytes, set[int]] = {}
    for r in rows:  # the GroupId's bytes at their fixed place (a forged header need not decode)
        if r.segment is not None and len(r.segment) >= HEADER_LENGTH:
            out.setdefault(bytes(r.segment)[GROUP_ID], set()).add(r.p)
    return out


def landing(seed: int = 3) -> tuple[list[list[bytes | None]], dict[str, tuple[bytes, int]]]:
    """Four files; each case names its GroupId and the number of splits its rows are in."""
    rng = random.Random(seed)
    seg = Segmenter(300)  # 216 data bytes a segment: a 1,000-byte message is 5 rows

    def msg() -> tuple[bytes, list[bytes]]:
        gid = rng.randbytes(24)
        return gid, [s.encode() for s in seg.segment(rng.randbytes(rng.randrange(700, 1100)), group_id=gid)]

    files: list[list[bytes | None]] = [[], [], [], []]
    cases: dict[str, tuple[bytes, int]] = {}
    for name, k in (("confined-0", 0), ("confined-1", 1), ("confined-3", 3)):
        gid, rows = msg()
        files[k] += rows
        cases[name] = (gid, 1)
    gid, rows = msg()  # straddling: its first rows close file 0, the rest open file 1; a copy of its last in 2
    files[0] += rows[:2]
    files[1][:0] = rows[2:]
    files[2].append(rows[-1])
    cases["straddling, duplicate elsewhere"] = (gid, 3)
    gid, rows = msg()  # whole in file 2, an exact copy of one row in file 0
    files[2] += rows
    files[0].append(rows[1])
    cases["duplicate elsewhere"] = (gid, 2)
    gid, rows = msg()  # whole in file 1, a copy of one row with a bit flipped in its data in file 3
    files[1] += rows
    flipped = bytearray(rows[2])
    flipped[-1] ^= 0x01
    files[3].append(bytes(flipped))
    cases["conflicting copy, bad checksum"] = (gid, 2)
    gid, rows = msg()  # whole in file 2, a copy with other bytes, its data checksum valid, in file 0
    files[2] += rows
    h = decode_header(rows[1])
    data = rng.randbytes(h.data_length)
    files[0].append(reseal(rows[1], data, data_checksum=checksum(ChecksumAlgorithm.CRC32, data)))
    cases["conflicting copy, valid checksum"] = (gid, 2)
    gid, rows = msg()  # whole in file 3; forged siblings in files 1 and 2: another offset, other flags
    files[3] += rows
    first, second = decode_header(rows[0]), decode_header(rows[1])
    files[1].append(reseal(rows[1], offset=second.offset + 5))
    files[2].append(reseal(rows[0], msg_flags=first.msg_flags | MsgFlags.LAST_SEGMENT))
    cases["forged siblings"] = (gid, 3)
    gid, rows = msg()  # whole in file 0 and, an exact copy of all of it, whole in file 2 too
    files[0] += rows
    files[2] += rows
    cases["whole copy elsewhere"] = (gid, 2)
    gid, rows = msg()  # whole in file 1 twice, another message between the copies
    other, others = msg()
    files[1] += rows + others + rows
    cases["whole copy in its split"] = (gid, 1)
    cases["between copies"] = (other, 1)
    group = rng.randbytes(24)  # an MQ group: messages 1 and 2 in file 1, message 3 in file 3
    parts = [rng.randbytes(rng.randrange(100, 500)) for _ in range(3)]
    for s in seg.segment_group(parts, group_id=group):
        files[3 if s.header.msg_seq_number == 3 else 1].append(s.encode())
    cases["MQ group"] = (group, 2)
    files[2].append(None)  # and rows that are no segment
    files[3].append(b"SGMT" + rng.randbytes(40))
    return files, cases


def test_split_layouts_give_the_in_process_rows(file_per_split: Any, tmp_path: Path) -> None:
    spark = file_per_split
    files, cases = landing()
    path = write_files(tmp_path / "landing", files)
    where = splits_of(spark, path)
    assert {name: len(where[gid]) for name, (gid, _) in cases.items()} == {n: k for n, (_, k) in cases.items()}
    expected = in_process([r for f in files for r in f])
    assert canonical(spark_rows(spark, path, NO_POLICY)) == expected, "combined, JVM fast path on"
    assert canonical(spark_rows(spark, path, NO_POLICY, jvm_fast_path=False)) == expected, "JVM fast path off"
    df = spark.read.parquet(str(path))
    for name, threshold in (("as reassemble run", 128 << 20), ("large-message path", 150)):
        payloads, out = tmp_path / f"payloads-{threshold}", tmp_path / f"out-{threshold}"
        opts = ReassemblyOptions(
            max_message_size=MAX, partitions=3, payload_dir=str(payloads), large_message_bytes=threshold
        )
        reassemble(df, options=opts).save(out)
        assert canonical(saved_rows(spark, out), payloads) == expected, f"save(), {name}"
    payloads, out = tmp_path / "payloads-shuffled", tmp_path / "out-shuffled"
    opts = ReassemblyOptions(max_message_size=MAX, partitions=3, payload_dir=str(payloads), assemble_in_splits=False)
    reassemble(df, options=opts).save(out)
    assert canonical(saved_rows(spark, out), payloads) == expected, "save(), every row shuffled"
    outcome = reassemble_group([r for f in files for r in f], ReassemblyOptions(max_message_size=MAX).limits())
    # What the rules make of it (the subject is that Spark agrees, whatever the layout): every message
    # complete, each bad copy quarantined with its reason, wherever it landed.
    assert [r["status"] for r in outcome if r["kind"] == "message"] == ["complete"] * 14
    assert sorted(r["reason"] for r in outcome if r["kind"] == "quarantine") == [2251, 2252, 9002, 9005, 9007, 9012]


@st.composite
def spread(draw: st.DrawFn) -> list[list[bytes | None]]:
    """test_differential's hostile messages, landed as a lander would: each message's rows in one file,
    but each row (a duplicate, a conflicting or forged copy, a straddling part) may land in another."""
    files: list[list[bytes | None]] = [[] for _ in range(draw(st.integers(2, 4)))]
    for i in range(draw(st.integers(1, 6))):
        home = draw(st.integers(0, len(files) - 1))
        for row in draw(message(i)):
            k = draw(st.sampled_from([home] * 3 + list(range(len(files)))))
            files[k].append(row)
    return files


@pytest.mark.slow
@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=(Phase.explicit, Phase.reuse, Phase.generate),  # no shrinking: each example is four Spark jobs
)
@given(files=spread())
def test_hostile_messages_spread_over_splits_give_the_in_process_rows(
    file_per_split: Any, tmp_path_factory: pytest.TempPathFactory, files: list[list[bytes | None]]
) -> None:
    spark = file_per_split
    path = write_files(tmp_path_factory.mktemp("split-layouts") / "landing", files)
    expected = in_process([r for f in files for r in f])
    assert canonical(spark_rows(spark, path, NO_POLICY)) == expected, "JVM fast path on"
    assert canonical(spark_rows(spark, path, NO_POLICY, jvm_fast_path=False)) == expected, "JVM fast path off"
    out, payloads = path.parent / "out", path.parent / "payloads"
    opts = ReassemblyOptions(max_message_size=MAX, partitions=3, payload_dir=str(payloads))
    reassemble(spark.read.parquet(str(path)), options=opts).save(out)
    assert canonical(saved_rows(spark, out), payloads) == expected, "save()"
    out, payloads = path.parent / "out-shuffled", path.parent / "payloads-shuffled"
    opts = ReassemblyOptions(max_message_size=MAX, partitions=3, payload_dir=str(payloads), assemble_in_splits=False)
    reassemble(spark.read.parquet(str(path)), options=opts).save(out)
    assert canonical(saved_rows(spark, out), payloads) == expected, "save(), every row shuffled"


def staged_group_ids(stage: Path) -> list[bytes]:
    """The GroupIds of the messages in a save's stage files (format: ``Stage.java``), one per record,
    read from each file's end (a record's trailer says how long its head and its bytes are)."""
    at = SK_HEADER + FIELD["group_id"].offset
    out = []
    for path in sorted(stage.glob("*.stage")):
        data = path.read_bytes()
        end = len(data)
        while end > 0:
            blob = int.from_bytes(data[end - 12 : end - 4], "big")
            head = int.from_bytes(data[end - 4 : end], "big")
            pos = end - 12 - head
            k = int.from_bytes(data[pos + 4 : pos + 8], "big")  # the first row's sort key
            out.append(data[pos + 8 : pos + 8 + k][at : at + 24])
            end = pos - blob
        assert end == 0, f"{path.name} is not records back to back"
    return out


def test_a_scan_task_stages_what_is_complete_in_it_and_delivers_what_meets_nothing_else(
    file_per_split: Any, tmp_path: Path
) -> None:
    """The plan itself: the scan stages every message complete and clean among its own consecutive rows
    (a whole copy in another split, or later in its own, is staged too); after the shuffle only those
    that met no other row are delivered as staged, the rest go to the judge with all their rows."""
    spark = file_per_split
    files, cases = landing()
    path = write_files(tmp_path / "landing", files)
    result = reassemble(spark.read.parquet(str(path)), options=ReassemblyOptions(max_message_size=MAX, partitions=3))
    assert result.split is not None
    side = tmp_path / "side"
    clean = result.split.clean(str(side)).select("group_id").collect()
    whole = [
        "confined-0",
        "confined-1",
        "confined-3",
        "duplicate elsewhere",
        "conflicting copy, bad checksum",
        "conflicting copy, valid checksum",
        "forged siblings",
        "between copies",
    ]
    twice = ["whole copy elsewhere", "whole copy in its split"]
    staged = staged_group_ids(side / STAGE)
    assert sorted(staged) == sorted([cases[c][0] for c in whole] + [cases[c][0] for c in twice] * 2)
    alone = ["confined-0", "confined-1", "confined-3", "between copies"]
    assert sorted(bytes(r.group_id) for r in clean) == sorted(cases[c][0] for c in alone)


def test_runs_past_the_stage_cap_cross_the_shuffle_as_they_came(
    file_per_split: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scan task holds at most ``STAGE_CAP`` bytes of a run: with the cap at 500 bytes (two or three
    of the landing's 216-byte pieces) every run outgrows it part-way, its rows so far and the row that
    took it past the cap cross the shuffle, and the rows are still the in-process ones."""
    from reassembly.spark.engine import bridge

    monkeypatch.setattr(bridge, "STAGE_CAP", 500)
    spark = file_per_split
    files, _ = landing()
    path = write_files(tmp_path / "landing", files)
    out = tmp_path / "out"
    result = reassemble(spark.read.parquet(str(path)), options=ReassemblyOptions(max_message_size=MAX, partitions=3))
    assert result.split is not None
    result.split.clean(str(tmp_path / "side")).collect()
    assert staged_group_ids(tmp_path / "side" / STAGE) == []  # every message is longer than the cap
    result.save(out)
    assert canonical(saved_rows(spark, out)) == in_process([r for f in files for r in f])


def tally_of(saved: Any) -> tuple[int, int]:
    return saved.metrics["scan_tasks_staged"], saved.metrics["scan_tasks_passed_through"]


def test_a_scan_task_with_nothing_confined_in_its_first_rows_passes_them_through(
    file_per_split: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the probe at 8 rows: the landing's files laid out as a lander writes them (each message's
    rows together) are walked whole by every task and stage their messages; the same rows scattered
    over the files pass through after the first 8 rows of each task (the tasks stage nothing); a table
    with both kinds of files does each per task. The rows are the in-process ones every time (and,
    scattered, those of every row shuffled: ``assemble_in_splits=False``), and the saved metrics count
    the tasks."""
    from reassembly.spark.engine import bridge

    monkeypatch.setattr(bridge, "STAGE_PROBE_ROWS", 8)
    spark = file_per_split
    files, _ = landing()
    rows = [r for f in files for r in f]
    expected = in_process(rows)
    rng = random.Random(5)
    shuffled = rows[:]
    rng.shuffle(shuffled)
    scattered = [shuffled[k::4] for k in range(4)]
    rest = files[2] + files[3]  # files 0 and 1 as a lander wrote them, the rows of 2 and 3 scattered
    rng.shuffle(rest)
    mixed = [files[0], files[1], rest[::2], rest[1::2]]
    assert sorted(map(repr, [r for f in mixed for r in f])) == sorted(map(repr, rows))
    assert all(len(f) > 8 for f in files + scattered + mixed)
    tallies = {}
    for name, layout in (("lander", files), ("scattered", scattered), ("mixed", mixed)):
        path = write_files(tmp_path / name / "landing", layout)
        df = spark.read.parquet(str(path))
        got = {False: expected}
        for staging in (True, False) if name == "scattered" else (True,):
            payloads, out = tmp_path / name / f"payloads-{staging}", tmp_path / name / f"out-{staging}"
            opts = ReassemblyOptions(
                max_message_size=MAX, partitions=3, payload_dir=str(payloads), assemble_in_splits=staging
            )
            saved = reassemble(df, options=opts).save(out)
            got[staging] = canonical(saved_rows(spark, out), payloads)
            if staging:
                tallies[name] = tally_of(saved)
            else:
                assert tally_of(saved) == (0, 0), "nothing staged, nothing counted"
        assert got[True] == got[False] == expected, name
    assert tallies == {"lander": (4, 0), "scattered": (0, 4), "mixed": (2, 2)}


def test_the_staged_plan_reads_what_it_staged_back_whatever_the_segment_size(
    file_per_split: Any, tmp_path: Path
) -> None:
    """Pieces larger than the stage file's 1 MiB write buffer, messages whose rows straddle a buffer
    flush, runs released after some of their bytes reached the file: every message is staged once,
    read back whole, and the rows are the in-process ones."""
    spark = file_per_split
    rng = random.Random(11)
    files: list[list[bytes | None]] = [[], []]
    expected_staged = []
    for k, size in ((0, 300 << 10), (0, 1500 << 10), (1, 700 << 10), (1, 2 << 20)):
        seg = Segmenter(size)
        for _ in range(3):
            gid = rng.randbytes(24)
            rows = [s.encode() for s in seg.segment(rng.randbytes(3 * size + 1000), group_id=gid)]
            files[k] += rows
            expected_staged.append(gid)
        gid = rng.randbytes(24)  # a run that is released after its bytes were written: its LAST missing
        files[k] += [s.encode() for s in seg.segment(rng.randbytes(3 * size), group_id=gid)][:-1]
    path = write_files(tmp_path / "landing", files)
    opts = ReassemblyOptions(max_message_size=32 << 20, partitions=2)
    result = reassemble(spark.read.parquet(str(path)), options=opts)
    assert result.split is not None
    side = tmp_path / "side"
    result.split.clean(str(side)).collect()
    assert sorted(staged_group_ids(side / STAGE)) == sorted(expected_staged)
    out = tmp_path / "out"
    saved = reassemble(spark.read.parquet(str(path)), options=opts).save(out)
    assert tally_of(saved) == (2, 0)
    rows = [r for f in files for r in f]
    assert canonical(saved_rows(spark, out)) == canonical(reassemble_group(rows, opts.limits()))
