"""The header table is the one description of the header: the Python decoder and the Spark SQL both come from it.

The Python decoder is a committed module, ``segmenter/_decoder.py``; it must be exactly what the table renders.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from segmenter import ChecksumAlgorithm, Codec, SegmentationError, Segmenter, _decoder, errors, header_render, wire
from segmenter import header_table as table
from segmenter.checksum import checksum
from segmenter.flags import in_group, is_last_segment, is_segment
from segmenter.wire import (
    HEADER,
    HEADER_LENGTH,
    Segment,
    check_prefix,
    decode_header,
    decode_segment,
    table_constants,
)

ROOT = Path(__file__).resolve().parents[2]
SPARK = ROOT / "reassembly" / "spark"


def test_the_committed_python_decoder_is_what_the_header_table_renders() -> None:
    committed = (ROOT / "segmenter" / "_decoder.py").read_text()
    assert committed == header_render.python_source(table_constants()), "run python tools/render.py"


def test_wire_decodes_with_the_committed_decoder() -> None:
    assert wire.python_decode_segment is _decoder.decode_segment
    assert (wire.decode_header, wire.check_prefix) == (_decoder.decode_header, _decoder.check_prefix)
    assert wire._check_header_fields is _decoder._check_header_fields


def test_fields_tile_the_fixed_header_and_the_struct_comes_from_them() -> None:
    pos = 0
    for f in table.FIELDS:
        assert f.offset == pos, f.name
        pos += f.width
    assert pos == table.FIXED_LENGTH == HEADER.size and pos + table.CHECKSUM_FIELD.width == HEADER_LENGTH


def test_every_rule_names_a_real_reason_error_and_known_names() -> None:
    env = table_constants()
    known = {f.name for f in table.FIELDS} | set(table.DERIVED) | set(table.FROM_HEADER_FLAGS)
    known |= {"length", "header_checksum", "header_crc", "max_message_size", "max_segment_size", "max_header_length"}
    for rule in table.RULES:
        assert rule.reason in errors.Reason.__members__, rule.name
        assert issubclass(getattr(errors, rule.error), errors.SegmentationError), rule.name
        assert table.names_in(rule.predicate) <= known, rule.name
        assert rule.stage in ("segment", "frame", "prefix", "header", "checksum", "raw", "fields", "data")
        header_render.sql_expr(rule.predicate, env)  # renders


@given(flags=st.integers(0, 63))
def test_derived_names_mean_what_the_flag_helpers_mean(flags: int) -> None:
    env = table_constants()
    derived = {
        name: eval(header_render.python_expr(e, env), {}, {"msg_flags": flags})
        for name, e in table.DERIVED.items()
        if name != "end"
    }
    assert derived == {"segmented": is_segment(flags), "last": is_last_segment(flags), "in_group": in_group(flags)}


def _seal(body: bytes) -> bytes:
    return body + checksum(ChecksumAlgorithm.CRC32, body).to_bytes(4, "big")


def test_each_rule_rejects_with_its_own_reason() -> None:
    """One good segment, one field broken per rule (header checksum resealed): the first failing rule names it."""
    raw = next(iter(Segmenter(200).segment(b"x" * 300))).encode()
    fields = list(HEADER.unpack_from(raw))
    index = {f.name: i for i, f in enumerate(table.FIELDS)}
    data = raw[HEADER_LENGTH:]

    def forged(**changes: object) -> bytes:
        f = list(fields)
        for name, value in changes.items():
            f[index[name]] = value
        return _seal(HEADER.pack(*f)) + data

    cases = {
        "BAD_MAGIC": forged(magic=b"XXXX"),
        "UNSUPPORTED_VERSION": forged(version=2),
        "HEADER_LENGTH_ERROR": forged(header_length=83),
        "RESERVED_FIELD_ERROR": forged(reserved=1),
        "UNKNOWN_CHECKSUM": forged(algorithm=9),
        "UNKNOWN_CODEC": forged(codec=9),
        "MSG_SEQ_NUMBER_ERROR": forged(msg_seq_number=0),
        "MSG_FLAGS_ERROR": forged(msg_flags=0x22),
        "MSG_TOO_BIG": forged(original_length=1 << 40, stored_length=1 << 40),
        "OFFSET_ERROR": forged(msg_flags=0, offset=5),
        "SEGMENT_LENGTH_ZERO": forged(data_length=0),
        "ORIGINAL_LENGTH_ERROR": forged(original_length=(1 << 64) - 1),
        "HEADER_CHECKSUM_ERROR": raw[:20] + bytes([raw[20] ^ 1]) + raw[21:],
        "TRUNCATED": raw[:50],
    }
    for reason, bad in cases.items():
        with pytest.raises(SegmentationError) as info:
            decode_segment(bad, verify=False, max_message_size=1 << 30)
        assert info.value.reason.name == reason
    with pytest.raises(SegmentationError) as info:
        decode_segment(raw + b"zz")  # bytes after the declared data: named for what happened
    assert info.value.reason.name == "TRAILING_BYTES" and "2 bytes after the " in str(info.value)
    with pytest.raises(SegmentationError) as info:
        decode_segment(raw[:-1])
    assert info.value.reason.name == "TRUNCATED"
    with pytest.raises(SegmentationError) as info:
        decode_segment(raw, max_segment_size=len(raw) - 1)
    assert info.value.reason.name == "MSG_TOO_BIG_FOR_CHANNEL"


@given(extension=st.binary(max_size=300), payload=st.binary(max_size=500))
def test_header_extensions_round_trip_and_are_checksummed(extension: bytes, payload: bytes) -> None:
    for seg in Segmenter(200, codec=Codec.NONE).segment(payload):
        header = seg.header._replace(extension=extension, header_length=HEADER_LENGTH + len(extension))
        raw = Segment(header, seg.data).encode()
        assert check_prefix(raw) == HEADER_LENGTH + len(extension)
        back = decode_segment(raw)
        assert back.header == header and bytes(back.data) == bytes(seg.data)
        assert Segment(back.header, back.data).encode() == raw
        if extension:
            flipped = bytearray(raw)
            flipped[table.FIXED_LENGTH] ^= 1
            with pytest.raises(SegmentationError):
                decode_header(bytes(flipped))


def test_no_byte_offsets_or_bit_masks_are_written_by_hand_in_the_spark_code() -> None:
    literal = re.compile(r"substring\(\w+, (?!1,)\d|& \d|X'[0-9A-Fa-f]{2,}'|\[\d+:\d*\]")
    for path in SPARK.glob("*.py"):
        hits = [line for line in path.read_text().splitlines() if literal.search(line)]
        assert not hits, (path.name, hits)
