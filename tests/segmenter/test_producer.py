"""One producer behaviour: every input form follows the same rule for the message checksum.

The rule (docs/concepts/wire-format.md, "Where the message checksum is carried"): only the last
segment of a message carries the whole-message checksum. The same payload given as bytes,
a bytearray, a memoryview, a real file, a pipe or a ``MessageWriter`` gives the same
segments, except for exactly the differences the document lists (and these tests name).
"""

from __future__ import annotations

import io
import itertools
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from reassembly import reassemble, reassemble_all
from segmenter import (
    ChecksumAlgorithm,
    Codec,
    MsgFlags,
    Segment,
    Segmenter,
    SegmentHeader,
    checksum,
    decode_segment,
    segment,
)
from segmenter.wire import HEADER_LENGTH, UNKNOWN_LENGTH

GID = bytes(range(24))
PAYLOADS = st.binary(max_size=6000) | st.integers(0, 6000).map(lambda n: b"abc" * (n // 3))  # compressible too
SEGMENT_SIZES = st.integers(HEADER_LENGTH + 1, HEADER_LENGTH + 700)
CODECS = st.sampled_from(list(Codec))
ALGORITHMS = st.sampled_from(list(ChecksumAlgorithm))
PIPE_BUFFER = 65536  # Linux's default pipe capacity: payloads up to this need no writer thread


def check_rule(segs: list[Segment], payload: bytes, algorithm: ChecksumAlgorithm) -> None:
    """The carried-checksum rule, and that every segment is valid on the wire."""
    assert segs, "every message has at least one segment"
    *before, last = segs
    assert last.header.message_checksum == checksum(algorithm, payload)
    assert all(s.header.message_checksum is None for s in before)
    assert all(not s.header.is_last_segment for s in before) and (last.header.is_last_segment or not before)
    encoded = [s.encode() for s in segs]
    for raw, s in zip(encoded, segs, strict=True):
        assert decode_segment(raw).header == s.header  # the wire carries exactly this header
        assert raw[7] & 0x01 == (s is last)  # header flag bit 0: "has message checksum"


def as_deferred(h: SegmentHeader, last: bool) -> SegmentHeader:
    """What an unsized input writes where a sized one writes the lengths."""
    if last:
        return h._replace(length_deferred=True)
    return h._replace(original_length=UNKNOWN_LENGTH, stored_length=UNKNOWN_LENGTH, length_deferred=True)


def stored_unknown_before_last(segs: list[Segment]) -> list[SegmentHeader]:
    """A zstd file's headers as the bytes input's: only stored_length before the last differs."""
    return [
        s.header._replace(stored_length=UNKNOWN_LENGTH) if i < len(segs) - 1 else s.header for i, s in enumerate(segs)
    ]


def from_real_file(seg: Segmenter, payload: bytes, prefix: bytes = b"") -> list[Segment]:
    """Segments of ``payload`` read from a file on disk, positioned after ``prefix``."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "payload.bin"
        path.write_bytes(prefix + payload)
        with path.open("rb") as f:
            f.seek(len(prefix))
            return materialize(seg.segment(f, group_id=GID))


def from_pipe(seg: Segmenter, payload: bytes) -> list[Segment]:
    """Segments of ``payload`` read from a real (unsized, unseekable) pipe."""
    assert len(payload) <= PIPE_BUFFER
    r, w = os.pipe()
    with os.fdopen(w, "wb") as writer:
        writer.write(payload)
    with os.fdopen(r, "rb") as reader:
        assert not reader.seekable()
        return materialize(seg.segment(reader, group_id=GID))


def materialize(segs: Iterator[Segment]) -> list[Segment]:
    """Own the data: file segments are already bytes, buffer ones are views of the caller's payload."""
    return [Segment(s.header, bytes(s.data)) for s in segs]


def chunked_writer(seg: Segmenter, payload: bytes, cuts: list[int], *, sized: bool) -> list[Segment]:
    w = seg.message_writer(group_id=GID, original_length=len(payload) if sized else UNKNOWN_LENGTH)
    out: list[Segment] = []
    bounds = sorted({0, len(payload), *(c % (len(payload) + 1) for c in cuts)})
    for a, b in itertools.pairwise(bounds):
        out += w.write(payload[a:b])
    return materialize(iter(out + w.close()))


def every_input_follows_the_rule(payload: bytes, size: int, codec: Codec, algorithm: ChecksumAlgorithm) -> None:
    seg = Segmenter(size, codec=codec, algorithm=algorithm)
    for segs in (
        materialize(seg.segment(payload, group_id=GID)),
        materialize(seg.segment(bytearray(payload), group_id=GID)),
        from_real_file(seg, payload),
        from_pipe(seg, payload),
    ):
        check_rule(segs, payload, algorithm)
        assert reassemble([s.encode() for s in segs]) == payload


def bytes_and_file_give_the_same_segments(payload: bytes, size: int, codec: Codec, prefix: bytes) -> None:
    seg = Segmenter(size, codec=codec)
    from_bytes = materialize(seg.segment(payload, group_id=GID))
    assert materialize(seg.segment(memoryview(payload), group_id=GID)) == from_bytes
    for from_file in (
        from_real_file(seg, payload, prefix),
        materialize(seg.segment(io.BytesIO(payload), group_id=GID)),
    ):
        assert [s.data for s in from_file] == [s.data for s in from_bytes]  # zstd too: one streaming frame
        if codec == Codec.NONE:
            assert [s.encode() for s in from_file] == [s.encode() for s in from_bytes]  # byte-identical
        else:  # the compressed size is known to a file reader only at the end
            assert [s.header for s in from_file] == stored_unknown_before_last(from_bytes)


INPUTS = {"payload": PAYLOADS, "size": SEGMENT_SIZES, "codec": CODECS}


@given(**INPUTS, algorithm=ALGORITHMS)
@settings(max_examples=40)
def test_every_input_follows_the_rule(payload: bytes, size: int, codec: Codec, algorithm: ChecksumAlgorithm) -> None:
    every_input_follows_the_rule(payload, size, codec, algorithm)


@pytest.mark.slow
@given(**INPUTS, algorithm=ALGORITHMS)
@settings(max_examples=1000)
def test_every_input_follows_the_rule_many(
    payload: bytes, size: int, codec: Codec, algorithm: ChecksumAlgorithm
) -> None:
    every_input_follows_the_rule(payload, size, codec, algorithm)


@given(**INPUTS, prefix=st.binary(max_size=50))
@settings(max_examples=40)
def test_bytes_and_file_give_the_same_segments(payload: bytes, size: int, codec: Codec, prefix: bytes) -> None:
    bytes_and_file_give_the_same_segments(payload, size, codec, prefix)


@pytest.mark.slow
@given(**INPUTS, prefix=st.binary(max_size=50))
@settings(max_examples=1000)
def test_bytes_and_file_give_the_same_segments_many(payload: bytes, size: int, codec: Codec, prefix: bytes) -> None:
    bytes_and_file_give_the_same_segments(payload, size, codec, prefix)


@given(payload=PAYLOADS, size=SEGMENT_SIZES, codec=CODECS)
@settings(max_examples=40)
def test_an_unsized_stream_differs_only_where_the_document_says(payload: bytes, size: int, codec: Codec) -> None:
    seg = Segmenter(size, codec=codec)
    from_bytes = materialize(seg.segment(payload, group_id=GID))
    from_stream = from_pipe(seg, payload)
    assert all(s.header.length_deferred for s in from_stream)
    if codec == Codec.NONE:
        n = len(from_bytes)
        assert [s.header for s in from_stream] == [as_deferred(s.header, i == n - 1) for i, s in enumerate(from_bytes)]
        assert [s.data for s in from_stream] == [s.data for s in from_bytes]
    else:  # a frame without a content size: another body, the same message
        body = b"".join(bytes(s.data) for s in from_stream)
        assert zstandard.ZstdDecompressor().decompressobj().decompress(body) == payload
        assert from_stream[-1].header.message_checksum == from_bytes[-1].header.message_checksum
        assert from_stream[-1].header.original_length == len(payload)


@given(payload=PAYLOADS, size=SEGMENT_SIZES, codec=CODECS, cuts=st.lists(st.integers(0, 6000), max_size=12))
@settings(max_examples=40)
def test_how_the_input_is_fed_never_matters(payload: bytes, size: int, codec: Codec, cuts: list[int]) -> None:
    seg = Segmenter(size, codec=codec)
    assert chunked_writer(seg, payload, cuts, sized=True) == materialize(seg.segment(io.BytesIO(payload), group_id=GID))
    assert chunked_writer(seg, payload, cuts, sized=False) == from_pipe(seg, payload)


@given(
    payloads=st.lists(PAYLOADS, min_size=1, max_size=4),
    as_file=st.lists(st.booleans(), min_size=4, max_size=4),
    size=SEGMENT_SIZES,
)
@settings(max_examples=25)
def test_group_members_follow_the_rule_whatever_their_form(
    payloads: list[bytes], as_file: list[bool], size: int
) -> None:
    seg = Segmenter(size)
    mixed = [io.BytesIO(p) if f else p for p, f in zip(payloads, as_file, strict=False)]
    segs = materialize(seg.segment_group(mixed, group_id=GID))
    assert segs == materialize(seg.segment_group(payloads, group_id=GID))
    for n, payload in enumerate(payloads, 1):
        check_rule([s for s in segs if s.header.msg_seq_number == n], payload, ChecksumAlgorithm.CRC32)
    assert reassemble_all([s.encode() for s in segs]) == payloads


def test_an_empty_payload_is_one_last_segment_with_the_checksum() -> None:
    for segs in (segment(b"", 100, group_id=GID), from_pipe(Segmenter(100), b"")):
        assert len(segs) == 1 and segs[0].header.data_length == 0
        assert segs[0].header.message_checksum == 0 and segs[0].header.msg_flags == MsgFlags.NONE


def test_a_pipe_from_another_process() -> None:
    """A real producer process writing more than a pipe holds; we cut while it writes."""
    payload = os.urandom(3 * PIPE_BUFFER + 123)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "p.bin"
        src.write_bytes(payload)
        code = f"import shutil,sys; shutil.copyfileobj(open({str(src)!r},'rb'), sys.stdout.buffer)"
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
        assert proc.stdout is not None
        segs = materialize(Segmenter(10_000).segment(proc.stdout, group_id=GID))
        assert proc.wait() == 0
    check_rule(segs, payload, ChecksumAlgorithm.CRC32)
    from_bytes = segment(payload, 10_000, group_id=GID)
    assert [s.header for s in segs] == [as_deferred(s.header, i == len(segs) - 1) for i, s in enumerate(from_bytes)]


def test_the_worked_example_in_the_wire_format_document() -> None:
    """docs/concepts/wire-format.md's first-segment bytes are what the producer writes."""
    doc = (Path(__file__).parents[2] / "docs" / "concepts" / "wire-format.md").read_text()
    block = doc.split("## Worked example", 1)[1].split("```", 2)[1]
    hex_lines = (re.match(r"((?:[0-9a-f]{2,}\s)+)", line.strip() + " ") for line in block.splitlines()[1:])
    documented = bytes.fromhex("".join(m.group(1).replace(" ", "") for m in hex_lines if m))
    first, second = segment(b"Hello, segmented world!", 100, group_id=GID)
    assert first.header.pack() == documented
    last = second.header.pack()
    assert last[7] == 0x01 and last[12:16].hex() == "00000004"  # has message checksum; LAST_SEGMENT
    assert last[72:84].hex() == "9297dfa9b613e5459319c455"  # data, message and header checksums


def test_file_like_without_seek_support_is_a_stream() -> None:
    """A wrapper that says it cannot seek is treated like a pipe: LENGTH_DEFERRED."""

    class Unseekable(io.RawIOBase):
        def __init__(self, data: bytes) -> None:
            self._f = io.BytesIO(data)

        def readable(self) -> bool:
            return True

        def readinto(self, b: bytearray) -> int:  # type: ignore[override]
            return self._f.readinto(b)

    payload = os.urandom(2500)
    stream: BinaryIO = io.BufferedReader(Unseekable(payload))
    segs = materialize(Segmenter(1000).segment(stream, group_id=GID))
    check_rule(segs, payload, ChecksumAlgorithm.CRC32)
    assert segs == from_pipe(Segmenter(1000), payload)
