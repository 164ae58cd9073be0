"""A message stored in a file is judged without reading it back into memory, and still quarantined whole.

Judging must not read every stored piece back into the byte-agreement reference
(``rules.agree``): the largest Python worker would grow with the message (the single 8 GiB
message of ``python -m bench.largecase --gib 8`` checks it with every process kind's peak RSS).
The in-process test measures the Python heap with ``tracemalloc`` while
the assembler judges (every ``bytes`` read back from the store is a Python allocation, so the
count is exact, not a sampled RSS); the Spark test checks that large messages failing after
many far rows still quarantine every original byte (by reference: tests/spark/test_quarantine_ref.py).
"""

from __future__ import annotations

import random
import tracemalloc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reassembly import Assembler, Limits
from reassembly.assembler.bodies import StoredBody
from reassembly.assembler.events import MessageComplete
from reassembly.assembler.rules import _overlapping
from reassembly.spark import ReassemblyOptions, read_quarantined, reassemble
from reassembly.storage.filestore import FileBodyStore
from segmenter import ChecksumAlgorithm, Segmenter
from segmenter.checksum import checksum
from segmenter.header_table import FIELDS
from segmenter.wire import HEADER, HEADER_LENGTH, decode_segment

KiB, MiB = 1 << 10, 1 << 20
SEGMENT = 64 * KiB


def segments(size: int, seed: int) -> list[bytes]:
    """One message of ``size`` random bytes in ``SEGMENT`` segments, shuffled."""
    rng = random.Random(seed)
    rows = [s.encode() for s in Segmenter(SEGMENT).segment(rng.randbytes(size))]
    rng.shuffle(rows)
    return rows


def test_a_stored_message_is_judged_without_reading_its_body_into_memory(tmp_path: Path) -> None:
    size = 32 * MiB
    asm = Assembler(Limits(max_message_size=1 << 40), batch=True, bodies=FileBodyStore(tmp_path, "t"))
    assert asm.receive_many(segments(size, seed=1)) == []
    tracemalloc.start()
    try:
        events = asm.close()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    [done] = events
    assert isinstance(done, MessageComplete) and isinstance(done.payload, StoredBody)
    assert (tmp_path / done.payload.location).stat().st_size == size
    # Not the whole body (32 MiB): judging needs the pieces' handles and a 1 MiB read window.
    assert peak < 2 * MiB, peak


@dataclass(frozen=True)
class _Span:
    offset: int
    end: int


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 12)), max_size=12))
def test_overlapping_finds_exactly_the_pieces_sharing_a_byte_with_another(spans: list[tuple[int, int]]) -> None:
    """``rules.agree`` reads only these: any piece it skips must overlap nothing (checked by brute force)."""
    pieces = sorted((_Span(o, o + n) for o, n in spans), key=lambda p: (p.offset, -p.end))
    want = [
        p
        for i, p in enumerate(pieces)
        if any(j != i and max(p.offset, q.offset) < min(p.end, q.end) for j, q in enumerate(pieces))
    ]
    assert [id(p) for p in _overlapping(pieces)] == [id(p) for p in want]  # type: ignore[arg-type]


def _forge_message_checksum(raw: bytes) -> bytes:
    index = [f.name for f in FIELDS].index("message_checksum")
    fields = list(HEADER.unpack_from(raw))
    fields[index] ^= 1
    body = HEADER.pack(*fields)
    return body + checksum(ChecksumAlgorithm.CRC32, body).to_bytes(4, "big") + raw[HEADER_LENGTH:]


@pytest.mark.spark
def test_large_messages_failing_after_many_far_rows_quarantine_every_original_byte(spark: Any, tmp_path: Path) -> None:
    """With ``large_message_bytes`` 64 KiB, every segment past the first is a far row in its own
    aggregate; a wrong message checksum (judged at the end) and a missing middle segment
    (incomplete at the end) both give back every segment exactly as it arrived."""
    size = 2 * MiB  # 32 segments: 31 far rows each
    good = segments(size, seed=3)
    bad_crc = segments(size, seed=4)
    last = next(i for i, r in enumerate(bad_crc) if decode_segment(r).header.is_last_segment)
    bad_crc[last] = _forge_message_checksum(bad_crc[last])
    gap = segments(size, seed=5)
    middle = sorted(decode_segment(r).header.offset for r in gap)[7]
    gap = [r for r in gap if decode_segment(r).header.offset != middle]
    rows = good + bad_crc + gap
    random.Random(6).shuffle(rows)
    pq.write_table(pa.table({"segment": pa.array(rows, pa.binary())}), tmp_path / "in.parquet")
    payloads = tmp_path / "payloads"
    options = ReassemblyOptions(payload_dir=str(payloads), large_message_bytes=64 * KiB, partitions=2)
    out = reassemble(spark.read.parquet(str(tmp_path / "in.parquet")), options=options).combined.collect()
    gid = {decode_segment(x[0]).header.group_id: name for x, name in ((good, "good"), (bad_crc, "crc"), (gap, "gap"))}
    status = {gid[r.group_id]: (r.status, r.reason_name) for r in out if r.kind == "message"}
    assert status == {
        "good": ("complete", "NONE"),
        "crc": ("corrupt", "MESSAGE_CHECKSUM_ERROR"),
        "gap": ("incomplete", "INCOMPLETE_MSG"),
    }, status
    quarantined = [r for r in out if r.kind == "quarantine"]
    assert all(r.raw is None for r in quarantined)  # by reference, in payloads/quarantine/
    assert sorted(read_quarantined(r, payloads) or b"" for r in quarantined) == sorted(bad_crc + gap)
    [complete] = [r for r in out if r.kind == "message" and r.status == "complete"]
    assert (payloads / complete.payload_path).stat().st_size == size
    # nothing left of the failed ones' bodies: the completed message and the quarantine copies only
    assert sorted(p.name for p in payloads.iterdir()) == sorted([complete.payload_path, "quarantine"])
