"""The optional compiled decoder (``segmenter._fastwire``) is the Python decoder, faster.

It must accept exactly what the generated Python decoder accepts, return the same segment (same
header, same types, the data a view of the same buffer), and leave everything else to the Python
decoder, which raises the error it raises without the compiled one. Checked here from several sides: segments the
segmenter cut, headers forged field by field with boundary values and a resealed header checksum
(so the rules, not the CRC, decide), bit flips, truncations, garbage, every buffer kind, hostile
keyword values; and that no path leaks a reference or reads outside the buffer it was given.
"""

from __future__ import annotations

import array
import contextlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from segmenter import ChecksumAlgorithm, Codec, Segmenter, wire
from segmenter.checksum import checksum
from segmenter.errors import Reason, SegmentationError
from segmenter.header_render import c_source
from segmenter.header_table import FIELDS

ROOT = Path(__file__).resolve().parents[2]
COMPILED = wire.COMPILED_DECODER
PY = wire.python_decode_segment
needs_compiled = pytest.mark.skipif(COMPILED is None, reason="segmenter._fastwire was not built (no C compiler)")
U64 = (1 << 64) - 1


def test_the_committed_c_table_is_what_the_header_table_renders() -> None:
    committed = (ROOT / "segmenter" / "_fastwire_table.h").read_text()
    assert committed == c_source(wire.table_constants()), "run python tools/render.py"


@needs_compiled
def test_the_package_decodes_with_the_compiled_decoder_when_it_was_built() -> None:
    """Built wherever the dev install runs (CI: a skip here fails the run); every caller gets it."""
    from reassembly.assembler import core as assembler

    assert wire.decode_segment is COMPILED
    assert assembler.decode_segment is COMPILED


def test_without_the_compiled_decoder_the_python_one_decodes_the_same() -> None:
    code = (
        "from segmenter import Segmenter, wire\n"
        "assert wire.COMPILED_DECODER is None and wire.decode_segment is wire.python_decode_segment\n"
        "raw = next(iter(Segmenter(100).segment(b'x' * 250))).encode()\n"
        "assert bytes(wire.decode_segment(raw).data) == b'x' * 16\n"
    )
    env = {**os.environ, "SEGMENTER_PURE_PYTHON": "1"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=ROOT)


def outcome(fn: Callable[..., Any], buf: Any, *args: Any, **kw: Any) -> tuple[Any, ...]:
    """What a decoder did, comparable across the two: the segment, or the error with its details."""
    try:
        seg = fn(buf, *args, **kw)
    except Exception as exc:
        return ("raised", type(exc), str(exc), getattr(exc, "details", None))
    data = seg.data
    h = seg.header
    return (
        "decoded",
        type(seg),
        type(h),
        tuple(h),
        tuple(type(x) for x in h),
        type(data),
        bytes(data),
        data.format,
        data.readonly,
        id(data.obj),
    )


def same(buf: Any, *args: Any, **kw: Any) -> tuple[Any, ...]:
    py = outcome(PY, buf, *args, **kw)
    if COMPILED is not None:
        assert outcome(COMPILED, buf, *args, **kw) == py
    return py


# ---------------------------------------------------------------- forged headers
_INDEX = {f.name: i for i, f in enumerate(FIELDS)}
_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "magic": st.sampled_from([b"SGMT", b"SGMU"]),
    "version": st.sampled_from([1, 0, 255]),
    "algorithm": st.sampled_from([1, 2, 0, 3, 255]),
    "codec": st.sampled_from([0, 1, 2, 255]),
    "header_flags": st.sampled_from([0, 1, 2, 3, 4, 255]),
    "reserved": st.sampled_from([0, 1, 0x8000]),
    "msg_flags": st.one_of(st.integers(0, 31), st.sampled_from([32, 0x80000000, 0xFFFFFFFF])),
    "group_id": st.binary(min_size=24, max_size=24),
    "msg_seq_number": st.sampled_from([1, 2, 0, 999_999_999, 1_000_000_000, 0xFFFFFFFF]),
    "offset": st.sampled_from([0, 1, 100, 2**63 - 101, 2**63 - 1, 2**63, U64 - 10, U64]),
    "original_length": st.sampled_from([0, 1, 50, 150, 2**63 - 1, 2**63, U64 - 1, U64]),
    "stored_length": st.sampled_from([0, 1, 50, 150, 2**63 - 1, 2**63, U64 - 1, U64]),
    "message_checksum": st.integers(0, 0xFFFFFFFF),
}


@st.composite
def forged(draw: st.DrawFn) -> bytes:
    """A header of drawn field values, sealed with a correct header checksum (mostly), then data."""
    base = draw(st.sampled_from([b"", b"q" * 50, os.urandom(150)]))
    raw = next(iter(Segmenter(200).segment(base))).encode()
    fields = list(wire.HEADER.unpack_from(raw))
    for name in draw(st.sets(st.sampled_from(sorted(_VALUES)), max_size=4)):
        fields[_INDEX[name]] = draw(_VALUES[name])
    cut = fields[_INDEX["data_length"]]
    data_length = draw(st.one_of(st.just(cut), st.sampled_from([cut, 0, 1, 50, 0xFFFFFFFF])))
    fields[_INDEX["data_length"]] = data_length
    extension = draw(st.sampled_from([b"", b"e", os.urandom(40)]))
    right = 84 + len(extension)  # mostly right, so that the rules after the framing decide
    header_length = draw(st.one_of(st.just(right), st.sampled_from([right, 84, 83, 0, 85, 4096, 4097, 0xFFFF])))
    fields[_INDEX["header_length"]] = header_length
    present = min(data_length, 300) + draw(st.sampled_from([0, 0, -1, 1]))
    data = draw(st.binary(min_size=max(present, 0), max_size=max(present, 0)))
    if draw(st.booleans()):
        fields[_INDEX["data_checksum"]] = checksum(ChecksumAlgorithm(fields[_INDEX["algorithm"]] % 2 + 1), data)
    body = wire.HEADER.pack(*fields) + extension
    seal = checksum(ChecksumAlgorithm.CRC32, body)
    if draw(st.integers(0, 9)) == 0:
        seal ^= 1 << draw(st.integers(0, 31))
    return body + seal.to_bytes(4, "big") + data


_LIMITS = st.sampled_from([None, 0, 1, 150, 4096, 1 << 20, 2**63 - 1, 2**63, U64, 1 << 70, -1])


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow])
@given(raw=forged(), segment_limit=_LIMITS, message_limit=_LIMITS, verify=st.booleans())
def test_forged_headers_get_the_same_verdict_and_error(
    raw: bytes, segment_limit: int | None, message_limit: int | None, verify: bool
) -> None:
    kw: dict[str, Any] = {"verify": verify}
    if segment_limit is not None:
        kw["max_segment_size"] = segment_limit
    if message_limit is not None:
        kw["max_message_size"] = message_limit
    same(raw, **kw)


@settings(max_examples=300)
@given(
    payload=st.binary(max_size=3000),
    size=st.integers(90, 700),
    codec=st.sampled_from(list(Codec)),
    algorithm=st.sampled_from(list(ChecksumAlgorithm)),
    extension=st.binary(max_size=60),
    data=st.data(),
)
def test_cut_segments_decode_the_same_and_every_bit_flip_and_truncation_too(
    payload: bytes, size: int, codec: Codec, algorithm: ChecksumAlgorithm, extension: bytes, data: st.DataObject
) -> None:
    for seg in Segmenter(size, codec=codec, algorithm=algorithm).segment(payload):
        header = seg.header._replace(extension=extension, header_length=wire.HEADER_LENGTH + len(extension))
        raw = wire.Segment(header, seg.data).encode()
        assert same(raw)[0] == "decoded"
        bit = data.draw(st.integers(0, len(raw) * 8 - 1))
        flipped = bytearray(raw)
        flipped[bit // 8] ^= 1 << (bit % 8)
        assert same(bytes(flipped))[0] == "raised"
        assert same(raw[: data.draw(st.integers(0, len(raw) - 1))])[0] == "raised"


@given(junk=st.binary(max_size=400))
def test_garbage_is_refused_alike(junk: bytes) -> None:
    same(junk)
    same(b"SGMT\x01" + junk)


def test_bytes_after_the_declared_data_are_named_alike_by_both_decoders() -> None:
    """Too few data bytes are a truncation; bytes after the declared data are their own reason,
    in the compiled decoder's error as in the Python one's."""
    raw = _raw()
    same(raw + b"\0\0\0")
    for decode in (PY, COMPILED) if COMPILED is not None else (PY,):
        with pytest.raises(SegmentationError) as info:
            decode(raw + b"\0\0\0")
        assert info.value.reason == Reason.TRAILING_BYTES and "3 bytes after the 2" in str(info.value)
        with pytest.raises(SegmentationError) as info:
            decode(raw[:-1])
        assert info.value.reason == Reason.TRUNCATED


def _raw() -> bytes:
    return next(iter(Segmenter(300).segment(os.urandom(500)))).encode()


def test_every_kind_of_buffer_decodes_the_same_and_the_data_is_a_view_of_it() -> None:
    raw = _raw()
    big = b"<" + raw + b">"
    kinds: list[Any] = [
        raw,
        bytearray(raw),
        memoryview(raw),
        memoryview(big)[1:-1],
        memoryview(bytearray(raw)).toreadonly(),
        array.array("B", raw),
        memoryview(raw).cast("c"),
        array.array("I", raw[: len(raw) // 4 * 4]),  # items of 4 bytes: flattened, by the Python decoder
        memoryview(raw + raw)[::2],  # strided
        memoryview(raw).cast("B", (1, len(raw))),  # two dimensions
    ]
    for buf in kinds:
        same(buf)
    seg = wire.decode_segment(memoryview(big)[1:-1])
    assert isinstance(seg.data, memoryview) and seg.data.obj is big


def test_what_is_not_a_segment_argument_gets_the_python_decoder_s_error() -> None:
    raw = _raw()
    released = memoryview(raw)
    released.release()
    for buf in (None, 1, "SGMT", object(), released):
        assert same(buf)[0] == "raised"
    assert same(raw, 1)[0] == "raised"  # a second positional argument
    assert same(raw, unknown=1)[0] == "raised"
    for value in (True, 1.5, "9", None, 1 << 64, -(1 << 64)):
        same(raw, max_segment_size=value)
        same(raw, max_message_size=value)
    same(raw, verify=0)
    same(raw, verify=[])

    class Falsy:
        def __bool__(self) -> bool:
            raise RuntimeError("no truth")

    same(raw, verify=Falsy())

    class Counted:
        calls = 0

        def __bool__(self) -> bool:
            Counted.calls += 1
            return True

    for decoder in (PY, wire.decode_segment):  # asked once, by the Python decoder, whichever is called
        Counted.calls = 0
        decoder(raw, verify=Counted())
        assert Counted.calls == 1
    with pytest.raises(TypeError):
        wire.decode_segment()  # type: ignore[call-arg]


@needs_compiled
def test_no_path_keeps_a_reference() -> None:
    assert COMPILED is not None
    raw = _raw()
    good = bytes(raw)
    bad_crc = raw[:-1] + bytes([raw[-1] ^ 1])
    forged = raw[:10] + b"\x00\x01" + raw[12:]
    watched = [good, bad_crc, forged, Codec.NONE, ChecksumAlgorithm.CRC32, wire.SegmentHeader, wire.Segment]
    before = [sys.getrefcount(x) for x in watched]
    for _ in range(2000):
        seg = COMPILED(good)
        del seg
        for bad in (bad_crc, forged, None):
            with contextlib.suppress(Exception):
                COMPILED(bad)
        COMPILED(good, verify=False, max_segment_size=1 << 20)
    assert [sys.getrefcount(x) for x in watched] == before


def test_the_view_keeps_its_buffer_alive() -> None:
    seg = wire.decode_segment(bytes(_raw()))  # nothing else refers to the bytes
    assert len(bytes(seg.data)) == seg.header.data_length
