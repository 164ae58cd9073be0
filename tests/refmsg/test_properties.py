"""Properties: any object, chunking, order and duplicates reassemble exactly; any flipped bit is caught."""

from __future__ import annotations

import io
import itertools
import os
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refmsg import (
    RMH,
    Chunker,
    ChunkRow,
    Integrity,
    Outcome,
    Receiver,
    ReferenceMessage,
    RmhFlags,
    assemble_chunks,
    decode_message,
)
from refmsg.core import RangeSet
from refmsg.header import ENCODING_BIG_ENDIAN, ENCODING_NATIVE
from segmenter.checksum import ChecksumAlgorithm, checksum
from segmenter.errors import ChecksumError, ConflictError, IncompleteError, Reason, SegmentationError

IID = bytes(range(24))


def messages(
    payload: bytes, size: int, algorithm: ChecksumAlgorithm = ChecksumAlgorithm.CRC32
) -> list[ReferenceMessage]:
    return list(Chunker(max_length=size, algorithm=algorithm).messages(io.BytesIO(payload), "o", instance_id=IID))


def rows(msgs: list[ReferenceMessage]) -> list[ChunkRow]:
    out = []
    for m in msgs:
        assert m.integrity is not None
        out.append(
            ChunkRow(
                m.offset, m.length, bytes(m.data), m.is_last, m.integrity.chunk_checksum, m.integrity.object_checksum
            )
        )
    return out


@st.composite
def deliveries(draw: st.DrawFn) -> tuple[bytes, list[ReferenceMessage], ChecksumAlgorithm]:
    """An object, cut at one or two chunk sizes, delivered in any order with duplicates."""
    payload = draw(st.binary(max_size=3000))
    algorithm = draw(st.sampled_from(list(ChecksumAlgorithm)))
    msgs = messages(payload, draw(st.integers(1, 700)), algorithm)
    if draw(st.booleans()):  # a second sender run with another chunk size: overlapping, identical bytes
        again = messages(payload, draw(st.integers(1, 700)), algorithm)
        msgs += draw(st.lists(st.sampled_from(again), max_size=6))
    msgs += draw(st.lists(st.sampled_from(msgs), max_size=8))  # re-deliveries
    return payload, draw(st.permutations(msgs)), algorithm


@given(deliveries())
def test_any_chunking_order_and_duplicates_assemble_exactly(
    case: tuple[bytes, list[ReferenceMessage], ChecksumAlgorithm],
) -> None:
    payload, msgs, algorithm = case
    assert assemble_chunks(rows(msgs), algorithm=algorithm) == payload


@settings(max_examples=25)
@given(deliveries(), st.sampled_from([ENCODING_NATIVE, ENCODING_BIG_ENDIAN]))
def test_receiver_any_order_and_duplicates_gives_identical_file(
    case: tuple[bytes, list[ReferenceMessage], ChecksumAlgorithm], encoding: int
) -> None:
    payload, msgs, _ = case
    with tempfile.TemporaryDirectory() as root:
        with Receiver(root, fsync=False) as rx:
            outcomes = [rx.receive(m.encode(header_encoding=encoding)).outcome for m in msgs]
        assert outcomes.count(Outcome.COMPLETED) == 1
        with open(f"{root}/o", "rb") as f:
            assert f.read() == payload


@given(st.binary(min_size=1, max_size=2000), st.integers(1, 500), st.data())
def test_missing_chunk_or_last_is_incomplete(payload: bytes, size: int, data: st.DataObject) -> None:
    all_rows = rows(messages(payload, size))
    drop = data.draw(st.integers(0, len(all_rows) - 1))
    with pytest.raises(IncompleteError) as err:
        assemble_chunks(all_rows[:drop] + all_rows[drop + 1 :])
    assert err.value.reason == Reason.INCOMPLETE_MSG


@settings(max_examples=40)
@given(st.binary(min_size=2, max_size=1500), st.integers(1, 400), st.data())
def test_a_verified_conflicting_copy_is_a_conflict_in_any_order(payload: bytes, size: int, data: st.DataObject) -> None:
    """Both copies pass their chunk checksum: no guess, in the batch function and in the receiver."""
    msgs = messages(payload, size)
    victim = data.draw(st.sampled_from([m for m in msgs if m.length]))
    at = data.draw(st.integers(0, victim.length - 1))
    changed = bytearray(victim.data)
    changed[at] ^= 0x01
    assert victim.integrity is not None
    forged = victim._replace(data=bytes(changed), integrity=victim.integrity._replace(chunk_checksum=checksum(
        victim.integrity.algorithm, changed)))  # fmt: skip
    _refused_in_any_order(data.draw(st.permutations([*msgs, forged])), (payload,))


@settings(max_examples=40)
@given(st.binary(min_size=2, max_size=1500), st.integers(1, 400), st.binary(min_size=1, max_size=300), st.data())
def test_a_last_chunk_declaring_another_end_is_a_conflict_in_any_order(
    payload: bytes, size: int, extension: bytes, data: st.DataObject
) -> None:
    """A verified LAST chunk that ends the object elsewhere (shorter or longer; its own checksums
    right): no order lets one of the two ends win after both were seen."""
    msgs = messages(payload, size)
    end = data.draw(st.sampled_from([e for e in (data.draw(st.integers(1, len(payload) - 1)), len(payload) + len(
        extension)) if e != len(payload)]))  # fmt: skip
    other = (payload + extension)[:end]
    start = data.draw(st.integers(0, end - 1))
    piece, crc = other[start:], ChecksumAlgorithm.CRC32
    header = RMH(flags=RmhFlags.LAST, object_instance_id=IID, dest_name="o", data_logical_offset=start,
                 data_logical_length=len(piece))  # fmt: skip
    forged = ReferenceMessage(header, piece, Integrity(crc, checksum(crc, piece), end, checksum(crc, other)))
    _refused_in_any_order(data.draw(st.permutations([*msgs, forged])), (payload, other))


def _refused_in_any_order(order: list[ReferenceMessage], genuine: tuple[bytes, ...]) -> None:
    """Two chunks that pass every check contradict each other: the batch function refuses the
    object; the receiver refuses whichever it sees second and delivers nothing, unless the object
    was whole before that (it cannot be withdrawn: it is then one of ``genuine``)."""
    with pytest.raises(ConflictError):
        assemble_chunks(rows(order))
    with tempfile.TemporaryDirectory() as root:
        with Receiver(root, fsync=False) as rx:
            outcomes: list[Outcome | None] = []
            for m in order:
                try:
                    outcomes.append(rx.receive(m.encode()).outcome)
                except ConflictError:
                    outcomes.append(None)
                except ChecksumError:  # a forged copy completed the object and failed its checksum
                    outcomes.append(Outcome.APPLIED)
        assert None in outcomes
        if Outcome.COMPLETED in outcomes:
            assert outcomes.index(Outcome.COMPLETED) < outcomes.index(None)
            with open(f"{root}/o", "rb") as f:
                assert f.read() in genuine
        else:
            assert not os.path.exists(f"{root}/o")


def _every_flip_detected(encoded: bytes) -> None:
    for bit in range(len(encoded) * 8):
        flipped = bytearray(encoded)
        flipped[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(SegmentationError):
            decode_message(bytes(flipped), require_integrity=True)


@pytest.mark.parametrize("encoding", [ENCODING_NATIVE, ENCODING_BIG_ENDIAN])
@pytest.mark.parametrize("header_only", [False, True])
def test_every_single_bit_flip_is_detected_exhaustively(encoding: int, header_only: bool) -> None:
    msgs = list(
        Chunker(max_length=24).messages(
            io.BytesIO(b"reference message payload, 48 bytes long......"),
            "dir/name.bin",
            src_name="src",
            src_env="env",
            dest_env="denv",
            header_only=header_only,
        )
    )
    for m in msgs:
        _every_flip_detected(m.encode(header_encoding=encoding))


@given(st.binary(max_size=300), st.integers(1, 120), st.data())
def test_any_flipped_bit_is_detected(payload: bytes, size: int, data: st.DataObject) -> None:
    msg = data.draw(st.sampled_from(messages(payload, size)))
    encoded = bytearray(msg.encode(header_encoding=data.draw(st.sampled_from([ENCODING_NATIVE, ENCODING_BIG_ENDIAN]))))
    bit = data.draw(st.integers(0, len(encoded) * 8 - 1))
    encoded[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(SegmentationError):
        decode_message(bytes(encoded), require_integrity=True)


@given(st.binary(min_size=1, max_size=200), st.integers(1, 50), st.data())
def test_flipped_bit_in_a_row_is_detected(payload: bytes, size: int, data: st.DataObject) -> None:
    all_rows = rows(messages(payload, size))
    i = data.draw(st.integers(0, len(all_rows) - 1))
    row = all_rows[i]
    field = data.draw(
        st.sampled_from(["data", "chunk_checksum", "object_checksum"] if row.last else ["data", "chunk_checksum"])
    )
    if field == "data":
        if not row.length or row.data is None:
            return
        raw = bytearray(row.data)
        bit = data.draw(st.integers(0, len(raw) * 8 - 1))
        raw[bit // 8] ^= 1 << (bit % 8)
        all_rows[i] = row._replace(data=bytes(raw))
    else:
        value = getattr(row, field)
        all_rows[i] = row._replace(**{field: value ^ (1 << data.draw(st.integers(0, 31)))})
    with pytest.raises(ChecksumError):
        assemble_chunks(all_rows)


@given(
    st.lists(st.tuples(st.integers(0, 200), st.integers(0, 60)), max_size=30), st.integers(0, 260), st.integers(0, 60)
)
def test_rangeset_matches_a_bitmap(spans: list[tuple[int, int]], qs: int, ql: int) -> None:
    rs = RangeSet()
    bitmap = [False] * 400
    for start, length in spans:
        rs.add(start, start + length)
        for i in range(start, start + length):
            bitmap[i] = True
    covered = {i for s in rs.covered(qs, qs + ql) for i in range(s.start, s.end)}
    missing = {i for s in rs.missing(qs, qs + ql) for i in range(s.start, s.end)}
    assert covered == {i for i in range(qs, qs + ql) if bitmap[i]}
    assert missing == {i for i in range(qs, qs + ql) if not bitmap[i]}
    assert rs.total == sum(bitmap)
    spans_out = rs.spans()
    assert all(a.end < b.start for a, b in itertools.pairwise(spans_out))


def test_assemble_accepts_dicts_tuples_and_spark_rows() -> None:
    from pyspark.sql import Row

    payload = bytes(range(256)) * 10
    base = rows(messages(payload, 700))
    as_dicts = [r._asdict() | {"data": bytearray(r.data or b"")} for r in base]
    as_tuples = [tuple(r) for r in reversed(base)]
    as_spark = [Row(**r._asdict()) for r in base]
    for variant in (as_dicts, as_tuples, as_spark):
        assert assemble_chunks(variant) == payload  # type: ignore[arg-type]


def test_assemble_reports_header_only_rows_and_missing_checksums() -> None:
    base = rows(messages(b"abcdef", 4))
    with pytest.raises(SegmentationError) as err:
        assemble_chunks([base[0]._replace(data=None), base[1]])
    assert err.value.reason == Reason.STATE_ERROR
    with pytest.raises(ChecksumError):
        assemble_chunks([base[0]._replace(chunk_checksum=None), base[1]])
    assert assemble_chunks([base[0]._replace(chunk_checksum=None), base[1]], require_checksums=False) == b"abcdef"
    with pytest.raises(ChecksumError) as cerr:
        assemble_chunks([base[0], base[1]._replace(object_checksum=None)])
    assert cerr.value.reason == Reason.MESSAGE_CHECKSUM_ERROR
