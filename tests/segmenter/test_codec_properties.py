"""Property-based proof for the codec: checksums, wire format, segmenter and assembler together."""

from __future__ import annotations

import contextlib
import io
import os
import random
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reassembly import Assembler, Limits, MessageComplete, Unfinished
from segmenter import (
    HEADER_LENGTH,
    ChecksumAlgorithm,
    Codec,
    MessageTooBigError,
    MsgFlags,
    Reason,
    SegmentationError,
    Segmenter,
    SegmentStreamDecoder,
    decode_segment,
    segment,
    segment_group,
)
from segmenter.checksum import checksum, combine, combine_run, reference_function
from segmenter.properties import from_jms, from_kafka, jms_properties, kafka_headers, kafka_key, mqmd_fields
from segmenter.wire import make_header

ALGORITHMS = st.sampled_from(list(ChecksumAlgorithm))
CODECS = st.sampled_from(list(Codec))


# ------------------------------------------------------------- checksums
@given(data=st.binary(max_size=5000), algo=ALGORITHMS)
def test_fast_checksums_equal_crcmod(data: bytes, algo: ChecksumAlgorithm) -> None:
    assert checksum(algo, data) == reference_function(algo)(data)


@given(pieces=st.lists(st.binary(max_size=700), min_size=1, max_size=8), algo=ALGORITHMS)
def test_combined_checksum_equals_checksum_of_concatenation(pieces: list[bytes], algo: ChecksumAlgorithm) -> None:
    value = checksum(algo, pieces[0])
    for p in pieces[1:]:
        value = combine(algo, value, checksum(algo, p), len(p))
    assert value == checksum(algo, b"".join(pieces))


@given(data=st.data(), length=st.integers(1, 300), n=st.integers(0, 300), algo=ALGORITHMS)
def test_combined_run_equals_checksum_of_concatenation(
    data: st.DataObject, length: int, n: int, algo: ChecksumAlgorithm
) -> None:
    """Both of ``combine_run``'s ways (a loop below ``_TREE_MIN`` pieces, the tree above)."""
    pieces = [data.draw(st.binary(min_size=length, max_size=length)) for _ in range(n)]
    expected = checksum(algo, b"".join(pieces)) if pieces else 0
    assert combine_run(algo, [checksum(algo, p) for p in pieces], length) == expected


# --------------------------------------------------------------- round trip
@settings(max_examples=40)
@given(
    payload=st.binary(max_size=20_000),
    extra=st.integers(1, 3000),
    codec=CODECS,
    algo=ALGORITHMS,
    seed=st.integers(0, 2**32),
    dup_rate=st.floats(0, 0.5),
    join=st.booleans(),
)
def test_any_payload_size_order_and_duplicates_reassemble_exactly(
    payload: bytes, extra: int, codec: Codec, algo: ChecksumAlgorithm, seed: int, dup_rate: float, join: bool
) -> None:
    size = HEADER_LENGTH + extra
    segs = [s.encode() for s in Segmenter(size, codec=codec, algorithm=algo).segment(payload)]
    assert all(len(s) <= size for s in segs)
    rng = random.Random(seed)
    arrivals = segs + [s for s in segs if rng.random() < dup_rate]
    rng.shuffle(arrivals)
    asm = Assembler(join=join)  # join=False: the message as views of its segments (broker receivers)
    events = asm.receive_many(arrivals)
    done = [e for e in events if isinstance(e, MessageComplete)]
    assert len(done) == 1 and done[0].payload == payload and bytes(done[0].payload) == payload
    assert asm.close() == []


@settings(max_examples=40)
@given(
    payload=st.binary(min_size=1, max_size=4000),
    extra=st.integers(1, 500),
    codec=CODECS,
    data=st.data(),
    join=st.booleans(),
)
def test_any_single_bit_flip_is_detected(
    payload: bytes, extra: int, codec: Codec, data: st.DataObject, join: bool
) -> None:
    segs = [s.encode() for s in segment(payload, HEADER_LENGTH + extra, codec=codec)]
    i = data.draw(st.integers(0, len(segs) - 1))
    bit = data.draw(st.integers(0, len(segs[i]) * 8 - 1))
    flipped = bytearray(segs[i])
    flipped[bit // 8] ^= 1 << (bit % 8)
    asm = Assembler(join=join)
    events = asm.receive_many([bytes(flipped) if j == i else s for j, s in enumerate(segs)]) + asm.close()
    assert not any(isinstance(e, MessageComplete) and e.payload != payload for e in events)
    assert not any(isinstance(e, MessageComplete) for e in events)  # the only copy is damaged


@settings(max_examples=40)
@given(payload=st.binary(min_size=2, max_size=6000), data=st.data())
def test_any_dropped_segment_is_reported_with_its_exact_byte_range(payload: bytes, data: st.DataObject) -> None:
    # At least two segments: a message whose only segment is lost leaves no trace to report.
    extra = data.draw(st.integers(1, min(700, len(payload) - 1)))
    segs = segment(payload, HEADER_LENGTH + extra)
    i = data.draw(st.integers(0, len(segs) - 1))
    asm = Assembler()
    asm.receive_many([s for j, s in enumerate(segs) if j != i])
    (event,) = asm.close()
    assert isinstance(event, Unfinished) and event.reason == Reason.INCOMPLETE_MSG
    h = segs[i].header
    assert event.gaps[0].missing_ranges == ((h.offset, h.end),)


# ---------------------------------------------------------- stream decoder
@settings(max_examples=30)
@given(
    payloads=st.lists(st.binary(max_size=3000), min_size=1, max_size=4), extra=st.integers(1, 900), seed=st.integers()
)
def test_stream_decoder_whole_byte_by_byte_and_random_chunks(payloads: list[bytes], extra: int, seed: int) -> None:
    segs = segment_group(payloads, HEADER_LENGTH + extra)
    blob = b"".join(s.encode() for s in segs)
    rng = random.Random(seed)
    for chunks in (
        [blob],
        [blob[i : i + 1] for i in range(len(blob))],
        _random_chunks(blob, rng),
    ):
        dec = SegmentStreamDecoder()
        out = [s for c in chunks for s in dec.feed(c)]
        dec.close()
        assert [s.header for s in out] == [s.header for s in segs]


def _random_chunks(blob: bytes, rng: random.Random) -> list[bytes]:
    out, i = [], 0
    while i < len(blob):
        n = rng.randint(1, 500)
        out.append(blob[i : i + n])
        i += n
    return out


def test_stream_decoder_refuses_huge_declared_segment_before_buffering() -> None:
    seg = segment(b"x" * 100, 200)[0]
    huge = make_header(
        group_id=seg.header.group_id,
        msg_seq_number=1,
        offset=0,
        data=b"",
        original_length=2**62,
        stored_length=2**62,
        msg_flags=MsgFlags.SEGMENT,
        codec=Codec.NONE,
        algorithm=ChecksumAlgorithm.CRC32,
        message_checksum=None,
    )._replace(data_length=2**32 - 1)
    dec = SegmentStreamDecoder(max_segment_size=1 << 20)
    tracemalloc.start()
    with pytest.raises(MessageTooBigError):
        dec.feed(huge.pack())
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1 << 20


def test_header_declaring_2_pow_62_bytes_is_refused_without_allocation() -> None:
    seg = segment(b"abc", 200)[0]
    h = seg.header._replace(original_length=2**62, stored_length=2**62, msg_flags=MsgFlags.SEGMENT)
    raw = h.pack() + bytes(seg.data)
    tracemalloc.start()
    events = Assembler(Limits(max_message_size=1 << 30)).receive(raw)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert events[0].reason == Reason.MSG_TOO_BIG and peak < 1 << 20
    with pytest.raises(MessageTooBigError):
        decode_segment(raw, max_message_size=1 << 30)


# ------------------------------------------------------------------- fuzz
@settings(max_examples=300)
@given(blob=st.binary(max_size=400))
def test_fuzz_only_library_errors_escape_decoders(blob: bytes) -> None:
    for feed in (
        lambda: decode_segment(blob),
        lambda: SegmentStreamDecoder().feed(blob),
        lambda: Assembler().receive(blob),
    ):
        with contextlib.suppress(SegmentationError):
            feed()


@settings(max_examples=300)
@given(data=st.data())
def test_fuzz_mutated_valid_segments(data: st.DataObject) -> None:
    raw = bytearray(segment(os.urandom(300), 200, codec=data.draw(CODECS))[0].encode())
    for _ in range(data.draw(st.integers(1, 8))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    for blob in (bytes(raw), bytes(raw[:cut])):
        with contextlib.suppress(SegmentationError):
            decode_segment(blob)
        asm = Assembler()
        asm.receive(blob)
        asm.close()


# -------------------------------------------------------------- segmenter
@pytest.mark.parametrize("size", [0, 1, 116, 117, 1 << 20, 64 << 20])
@pytest.mark.parametrize("codec", list(Codec))
def test_round_trip_from_bytes_and_file(size: int, codec: Codec, tmp_path: Path) -> None:
    payload = os.urandom(size) if codec == Codec.NONE or size < 1 << 20 else bytes(size // 2) + os.urandom(size // 2)
    seg_size = 200 if size < 1 << 20 else 1 << 20
    s = Segmenter(seg_size, codec=codec)
    from reassembly import reassemble

    assert reassemble(s.segment(payload), Limits(max_message_size=1 << 27)) == payload
    path = tmp_path / "payload.bin"
    path.write_bytes(payload)
    with path.open("rb") as f:
        assert reassemble(s.segment(f), Limits(max_message_size=1 << 27)) == payload


def test_segment_sizes_from_minimum_to_larger_than_payload() -> None:
    payload = os.urandom(3000)
    from reassembly import reassemble

    for size in (HEADER_LENGTH + 1, 100, 1000, 3083, 3084, 3085, 10_000):
        segs = segment(payload, size)
        assert all(len(s) <= size for s in segs)
        assert reassemble(segs) == payload
    with pytest.raises(SegmentationError):
        Segmenter(HEADER_LENGTH)


def test_non_seekable_stream_input() -> None:
    from reassembly import reassemble

    payload = os.urandom(50_000)

    class Pipe(io.RawIOBase):
        def __init__(self) -> None:
            self._b = io.BytesIO(payload)

        def readable(self) -> bool:
            return True

        def readinto(self, b: bytearray) -> int:  # type: ignore[override]
            return self._b.readinto(b)

    for codec in Codec:
        segs = list(Segmenter(1000, codec=codec).segment(io.BufferedReader(Pipe())))
        assert reassemble(segs) == payload


def test_file_path_memory_does_not_grow_with_file_size(tmp_path: Path) -> None:
    peaks = []
    for mib in (16, 128):
        path = tmp_path / f"f{mib}.bin"
        with path.open("wb") as f:
            for _ in range(mib):
                f.write(os.urandom(1 << 20))
        for codec in Codec:
            tracemalloc.start()
            with path.open("rb") as f:
                for seg in Segmenter(64 * 1024, codec=codec).segment(f):
                    seg.header.pack()
            peaks.append(tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
    assert max(peaks) < 8 << 20  # a few segments and read buffers, whatever the file size


def test_ibm_application_segmentation_of_logical_messages() -> None:
    """IBM's example: a group of four, messages 1, 2 and 4 segmented (3, 2, 3 segments), 3 not."""
    data = 200 - HEADER_LENGTH
    payloads = [os.urandom(3 * data), os.urandom(2 * data), os.urandom(10), os.urandom(3 * data)]
    flags = [s.header.msg_flags for s in segment_group(payloads, 200)]
    G, L, S, LS = MsgFlags.MSG_IN_GROUP, MsgFlags.LAST_MSG_IN_GROUP, MsgFlags.SEGMENT, MsgFlags.LAST_SEGMENT
    assert flags == [G | S, G | S, G | LS, G | S, G | LS, G, L | S, L | S, L | LS]


def test_only_the_last_segment_may_be_empty_and_data_is_zero_copy() -> None:
    payload = os.urandom(1000)
    segs = segment(payload, 200)
    assert all(s.header.data_length > 0 for s in segs[:-1])
    assert all(isinstance(s.data, memoryview) and s.data.obj is payload for s in segs)
    assert segment(b"", 200)[0].header.data_length == 0


# ------------------------------------------------------------- properties
def test_broker_properties_round_trip_and_verify() -> None:
    seg = segment(os.urandom(500), 200)[1]
    body = bytes(seg.data)
    assert from_kafka(kafka_headers(seg), body) == (seg.header, body)
    assert kafka_key(seg.header) == seg.header.group_id.hex().encode()
    props = jms_properties(seg)
    assert props["JMSXGroupSeq"] == 1 and props["JMSXGroupID"] == seg.header.group_id.hex()
    assert from_jms(props, body).header == seg.header
    with pytest.raises(SegmentationError) as err:
        from_jms(props, body[:-1] + bytes([body[-1] ^ 1]))
    assert err.value.reason == Reason.DATA_CHECKSUM_ERROR


def test_mqmd_fields_validated_against_mq_ranges() -> None:
    seg = segment(os.urandom(500), 200)[2]
    md = mqmd_fields(seg.header)
    assert (md.GroupId, md.MsgSeqNumber, md.Offset, md.OriginalLength) == (seg.header.group_id, 1, 232, 500)
    assert md.MsgFlags == MsgFlags.SEGMENT
    with pytest.raises(SegmentationError) as err:
        mqmd_fields(seg.header._replace(offset=10**9))
    assert err.value.reason == Reason.OFFSET_ERROR
    with pytest.raises(SegmentationError) as err:
        mqmd_fields(seg.header._replace(stored_length=2**31))
    assert err.value.reason == Reason.ORIGINAL_LENGTH_ERROR


@settings(max_examples=60)
@given(st.binary(min_size=1, max_size=2000), st.integers(120, 600), st.binary(min_size=4, max_size=40), st.data())
def test_a_stream_that_goes_bad_gives_the_same_segments_however_it_is_chunked(
    payload: bytes, size: int, garbage: bytes, data: st.DataObject
) -> None:
    """Whole segments framed before the bytes that cannot be framed are handed over first, then the
    error, however the bytes are chunked: dropping the segments a call framed with its error would make a
    1 MiB read lose the message a 1-byte read delivers."""
    from reassembly import read_events

    segs = [s.encode() for s in segment(payload, size)]
    garbage = b"X" + garbage[1:]  # never the magic
    blob = b"".join(segs) + garbage
    cuts = sorted(data.draw(st.sets(st.integers(1, len(blob) - 1), max_size=8)))
    chunks = [blob[a:b] for a, b in zip([0, *cuts], [*cuts, len(blob)], strict=True)]
    dec = SegmentStreamDecoder()
    got: list[bytes] = []
    with pytest.raises(SegmentationError) as err:
        for chunk in chunks:
            got += [s.encode() for s in dec.feed(chunk)]
        dec.close()
    assert got == segs and err.value.reason in (Reason.BAD_MAGIC, Reason.TRUNCATED)
    for chunk_size in (1, len(blob)):
        events: list[Any] = []
        with pytest.raises(SegmentationError):
            for ev in read_events(io.BytesIO(blob), chunk_size=chunk_size):
                events.append(ev)
        assert [bytes(e.payload) for e in events if isinstance(e, MessageComplete)] == [payload]
