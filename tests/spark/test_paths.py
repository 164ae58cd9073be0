"""The Spark path's two halves agree with the one set of rules: the JVM fast path and the large-message files."""

from __future__ import annotations

import io
import os
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reassembly.spark import ReassemblyOptions, decode_segments, read_quarantined, reassemble
from reassembly.spark.testdata import Dataset, generate, write_parquet
from segmenter import ChecksumAlgorithm, Codec, SegmentationError, Segmenter
from segmenter.checksum import checksum
from segmenter.header_table import FIELDS
from segmenter.wire import HEADER, HEADER_LENGTH, UNKNOWN_LENGTH, check_prefix, decode_segment

pytestmark = pytest.mark.spark

MAX = 1 << 20  # the limit these tests reassemble under


def edge_rows() -> list[bytes]:
    """Messages the fault generator does not make: empty, one segment, CRC-32C, deferred length, tiny segments."""
    rows: list[bytes] = []
    for payload, seg in (
        (b"", Segmenter(100)),
        (b"x", Segmenter(100)),
        (os.urandom(3000), Segmenter(4096)),
        (os.urandom(3000), Segmenter(500, algorithm=ChecksumAlgorithm.CRC32C)),
        (os.urandom(700), Segmenter(85)),
    ):
        rows += [s.encode() for s in seg.segment(payload)]
    w = Segmenter(300).message_writer()
    rows += [s.encode() for s in w.write(os.urandom(2000)) + w.close()]
    rows += [s.encode() for s in Segmenter(300).segment(io.BytesIO(os.urandom(1000)))]
    return rows


@pytest.fixture(scope="module")
def landing(tmp_path_factory: pytest.TempPathFactory) -> tuple[Dataset, Path]:
    ds = generate(n_messages=30, segments_per_message=3, segment_size=2048, groups=2, seed=11)
    ds.rows += edge_rows()
    return ds, write_parquet(ds, tmp_path_factory.mktemp("landing"), files=4)


def rows_of(spark: Any, path: Path, **options: Any) -> list[Any]:
    opts = ReassemblyOptions(max_message_size=MAX, partitions=3, **options)
    return reassemble(spark.read.parquet(str(path)), options=opts).combined.collect()


def canonical(rows: list[Any]) -> list[str]:
    return sorted(repr(r.asDict(recursive=True)) for r in rows)


def test_the_jvm_fast_path_writes_exactly_what_the_assembler_would(spark: Any, landing: tuple[Dataset, Path]) -> None:
    _, path = landing
    fast = rows_of(spark, path)
    slow = rows_of(spark, path, jvm_fast_path=False)
    assert canonical(fast) == canonical(slow)
    complete = [r for r in fast if r.kind == "message" and r.status == "complete"]
    assert len(complete) > 20 and any(r.payload == b"" for r in complete)


def test_large_messages_become_files_with_the_same_outcomes(
    spark: Any, landing: tuple[Dataset, Path], tmp_path: Path
) -> None:
    ds, path = landing
    files = tmp_path / "payloads"
    rows = rows_of(spark, path, payload_dir=str(files), large_message_bytes=2500)
    in_memory = {(r.group_id, r.msg_seq_number): r for r in rows_of(spark, path) if r.kind == "message"}
    messages = [r for r in rows if r.kind == "message"]
    assert len(messages) == len(in_memory)
    stored = 0
    for r in messages:
        mem = in_memory[(r.group_id, r.msg_seq_number)]
        assert (r.status, r.reason, r.segments_used, r.duplicates, r.rejected) == (
            mem.status,
            mem.reason,
            mem.segments_used,
            mem.duplicates,
            mem.rejected,
        )
        assert r.missing_ranges == mem.missing_ranges
        if r.payload_path is not None:
            stored += 1
            assert r.payload is None and (files / r.payload_path).read_bytes() == mem.payload
            assert r.message_checksum == mem.message_checksum
        else:
            assert r.payload == mem.payload
    assert stored >= 10
    payloads = sorted(p.name for p in files.iterdir() if p.name != "quarantine")  # originals by reference
    assert payloads == sorted(r.payload_path for r in messages if r.payload_path)
    quarantine = [r for r in rows if r.kind == "quarantine"]
    in_row = [r.raw or b"" for r in rows_of(spark, path) if r.kind == "quarantine"]
    assert sorted(read_quarantined(q, files) or b"" for q in quarantine) == sorted(in_row)
    used = sum(r.segments_used for r in messages) + sum(r.duplicates for r in messages)
    assert used + len(quarantine) == len(ds.rows)


def _mutant(rng: random.Random, good: list[bytes]) -> bytes:
    """A real segment with one or two header fields set anywhere in (or just outside) their rules,
    the header checksum recomputed: only the field rules can tell."""
    big = [0, 1, 83, 100, 5000, MAX, MAX + 1, 2**63 - 1, 2**63, 2**64 - 1]
    choices: dict[int, list[Any]] = {
        1: [1, 1, 1, 2],
        2: [1, 2, 3],
        3: [0, 1, 2],
        4: [0, 1, 2, 3, 4],
        6: [0, 1],
        7: [0, 1, 2, 4, 6, 8, 10, 12, 16, 18, 20, 32],
        9: [0, 1, 2, 999_999_999, 1_000_000_000],
        10: [0, 1, 100, 5000],
        11: big,
        12: big,
        13: big,
        5: [84, 84, 84, 84, 83, 85, 4097],
    }
    raw = rng.choice(good)
    fields = list(HEADER.unpack_from(raw))
    for index in rng.sample(sorted(choices), rng.choice([0, 1, 1, 2])):
        fields[index] = rng.choice(choices[index])
    body = HEADER.pack(*fields)
    data = raw[HEADER_LENGTH:]
    if rng.random() < 0.1:
        data = data[:-1]
    return body + checksum(ChecksumAlgorithm.CRC32, body).to_bytes(4, "big") + data


def _framed(raw: bytes) -> bool:
    """Routable, by hand: the prefix holds, the header is present and its checksum matches."""
    try:
        hl = check_prefix(raw)
    except SegmentationError:
        return False
    sealed = int.from_bytes(raw[hl - 4 : hl], "big")
    return len(raw) >= hl and checksum(ChecksumAlgorithm.CRC32, raw[: hl - 4]) == sealed


def test_jvm_header_rules_route_exactly_like_the_python_decoder(spark: Any, tmp_path: Path) -> None:
    rng = random.Random(5)
    good = [s.encode() for p in (b"", b"x" * 100, os.urandom(5000)) for s in Segmenter(1000).segment(p)]
    w = Segmenter(1000).message_writer()
    good += [s.encode() for s in w.write(os.urandom(3000)) + w.close()]
    good += [s.encode() for s in Segmenter(1000).segment_group([b"a" * 100, b"b" * 2000])]
    raws = [_mutant(rng, good) for _ in range(3000)]
    pq.write_table(pa.table({"segment": pa.array(raws, pa.binary())}), tmp_path / "h.parquet")
    decoded = decode_segments(spark.read.parquet(str(tmp_path / "h.parquet")), "segment", MAX).collect()
    got = [r.header_ok for r in decoded]
    assert [r.routable for r in decoded] == [_framed(raw) for raw in raws]
    expected, why = [], []
    for raw in raws:
        try:
            decode_segment(raw, verify=False, max_message_size=MAX, max_segment_size=1 << 62)
            expected.append(True)
            why.append("")
        except SegmentationError as exc:
            expected.append(False)
            why.append(f"{exc.reason.name}: {exc}")
    assert 100 < sum(expected) < len(raws) - 100  # both outcomes well represented
    differ = [(HEADER.unpack_from(raw), why[i]) for i, raw in enumerate(raws) if got[i] != expected[i]]
    assert not differ, differ[:3]


def test_zstd_and_groups_take_the_assembler_path_and_still_complete(spark: Any, tmp_path: Path) -> None:
    payload = b"record;" * 5000
    rows = [s.encode() for s in Segmenter(1000, codec=Codec.ZSTD).segment(payload)]
    rows += [s.encode() for s in Segmenter(1000).segment_group([b"a" * 1500, b"b" * 10, b"c" * 2500])]
    pq.write_table(pa.table({"segment": pa.array(rows, pa.binary())}), tmp_path / "z.parquet")
    out = rows_of(spark, tmp_path / "z.parquet")
    payloads = sorted(bytes(r.payload) for r in out if r.kind == "message" and r.status == "complete")
    assert payloads == sorted([payload, b"a" * 1500, b"b" * 10, b"c" * 2500])


def test_message_mode_delivers_the_intact_messages_of_an_incomplete_group(spark: Any, tmp_path: Path) -> None:
    segs = [s.encode() for s in Segmenter(1000).segment_group([b"a" * 1500, b"b" * 10, b"c" * 2500])]
    rows = [s for s in segs if int.from_bytes(s[40:44], "big") != 2]  # message 2 lost
    pq.write_table(pa.table({"segment": pa.array(rows, pa.binary())}), tmp_path / "g.parquet")
    status = {
        r.msg_seq_number: r.status
        for r in rows_of(spark, tmp_path / "g.parquet", unit_of_work=False)
        if r.kind == "message"
    }
    assert status == {1: "complete", 2: "incomplete", 3: "complete"}
    uow = {r.msg_seq_number: r.status for r in rows_of(spark, tmp_path / "g.parquet") if r.kind == "message"}
    assert uow == {1: "incomplete", 2: "incomplete", 3: "incomplete"}


@pytest.mark.parametrize("options", [{}, {"jvm_fast_path": False}, {"large_message_bytes": 100}])
def test_any_value_a_binary_column_holds_is_quarantined_never_a_crash(
    spark: Any, tmp_path: Path, options: dict[str, Any]
) -> None:
    good = [s.encode() for s in Segmenter(200).segment(b"kept" * 100)]
    whole = good[0]
    bad: list[bytes | None] = [
        None,
        None,
        b"",
        b"S",
        b"SGMT",
        whole[:9],
        whole[:10],
        whole[:83],
        whole[:84],
        whole[:-1],
        whole + b"!",
        os.urandom(500),
        b"SGMT" + os.urandom(200),
    ]
    path = tmp_path / "odd.parquet"
    pq.write_table(pa.table({"segment": pa.array([*good, *bad], pa.binary())}), path)
    payload_dir = str(tmp_path / "payloads") if "large_message_bytes" in options else None
    rows = rows_of(spark, path, **options, payload_dir=payload_dir)
    messages = [r for r in rows if r.kind == "message"]
    quarantine = [r for r in rows if r.kind == "quarantine"]
    assert [(m.status, m.segments_used) for m in messages] == [("complete", len(good))]
    assert len(quarantine) == len(bad) and all(q.reason and q.reason_name != "NONE" for q in quarantine)
    originals = [read_quarantined(q, payload_dir) for q in quarantine]  # in-row or by reference
    assert sorted(o for o in originals if o is not None) == sorted(b for b in bad if b is not None)
    nulls = [q for q, o in zip(quarantine, originals, strict=True) if o is None]
    assert len(nulls) == 2 and {q.reason_name for q in nulls} == {"TRUNCATED"}


def _reseal(raw: bytes, **changes: int) -> bytes:
    index = {f.name: i for i, f in enumerate(FIELDS)}
    fields = list(HEADER.unpack_from(raw))
    for name, value in changes.items():
        fields[index[name]] = value
    body = HEADER.pack(*fields)
    return body + checksum(ChecksumAlgorithm.CRC32, body).to_bytes(4, "big") + raw[HEADER_LENGTH:]


@pytest.mark.parametrize("large", [False, True])
def test_a_forged_segment_never_splits_its_message_and_too_big_messages_keep_their_row(
    spark: Any, tmp_path: Path, large: bool
) -> None:
    """One row per (GroupId, MsgSeqNumber), whatever one segment's header claims (routing)."""
    small = [s.encode() for s in Segmenter(300).segment(os.urandom(1000))]
    forged = [
        _reseal(small[1], original_length=MAX - 1, stored_length=MAX - 1),  # another size, still valid alone
        _reseal(small[2], header_flags=small[2][7] | 2, original_length=UNKNOWN_LENGTH),  # LENGTH_DEFERRED
        _reseal(small[0], original_length=1 << 40),  # too big
    ]
    too_big = [s.encode() for s in Segmenter(300).segment(os.urandom(MAX + 100))]
    rows = [*small, *forged, *too_big]
    pq.write_table(pa.table({"segment": pa.array(rows, pa.binary())}), tmp_path / "f.parquet")
    options: dict[str, Any] = {"payload_dir": str(tmp_path / "p"), "large_message_bytes": 500} if large else {}
    out = rows_of(spark, tmp_path / "f.parquet", **options)
    messages = [r for r in out if r.kind == "message"]
    keys = [(r.group_id, r.msg_seq_number) for r in messages]
    assert len(keys) == len(set(keys)) == 2
    status = {r.group_id: (r.status, r.reason) for r in messages}
    gid_small, gid_big = (decode_segment(x[0]).header.group_id for x in (small, too_big))
    assert status[gid_small] == ("complete", 0)
    assert status[gid_big] == ("too_big", 2030)
    assert len([r for r in out if r.kind == "quarantine"]) == len(forged) + len(too_big)
