"""MQRMH version 1: byte-exact layout, both byte orders, string placement, every rejection reason."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from refmsg import RMH, ReferenceMessage, RmhError, RmhFlags, decode_message, decode_rmh
from refmsg.header import (
    ENCODING_BIG_ENDIAN,
    ENCODING_NATIVE,
    FORMAT_REF_MSG_HEADER,
    LENGTH_1,
    MAX_LOGICAL_OFFSET,
    OFFSET_UNIT,
    STRING_FIELDS,
    byte_order,
)
from segmenter.errors import Reason, SegmentationError

INSTANCE = bytes(range(24))
FULL = RMH(
    flags=RmhFlags.LAST,
    object_type="FLATFILE",
    object_instance_id=INSTANCE,
    src_env="env-a",
    src_name="/data/src.bin",
    dest_env="env-b",
    dest_name="dst/obj.bin",
    data_logical_length=30_000,
    data_logical_offset=40_000,
    format="MQSTR   ",
)
STRING_REASON = {
    "src_env": Reason.SRC_ENV_ERROR,
    "src_name": Reason.SRC_NAME_ERROR,
    "dest_env": Reason.DEST_ENV_ERROR,
    "dest_name": Reason.DEST_NAME_ERROR,
}
PAIR_AT = {"src_env": 64, "src_name": 72, "dest_env": 80, "dest_name": 88}


def expected_bytes(order: str, encoding: int) -> bytes:
    """The header built field by field at IBM's documented offsets, independently of the packer."""
    strings = b"env-a" + b"/data/src.bin" + b"env-b" + b"dst/obj.bin"  # 5 + 13 + 5 + 11 = 34
    struc_length = LENGTH_1 + 36  # 34 rounded up to a multiple of 4
    buf = bytearray(struc_length)
    end = "little" if order == "<" else "big"

    def put(offset: int, value: int) -> None:
        buf[offset : offset + 4] = value.to_bytes(4, end, signed=True)

    buf[0:4] = b"RMH "
    put(4, 1)
    put(8, struc_length)
    put(12, encoding)
    put(16, 1208)
    buf[20:28] = b"MQSTR   "
    put(28, 1)
    buf[32:40] = b"FLATFILE"
    buf[40:64] = INSTANCE
    put(64, 5)
    put(68, 108)
    put(72, 13)
    put(76, 113)
    put(80, 5)
    put(84, 126)
    put(88, 11)
    put(92, 131)
    put(96, 30_000)
    put(100, 40_000)
    put(104, 0)
    buf[108 : 108 + 34] = strings
    return bytes(buf)


@pytest.mark.parametrize(("encoding", "order"), [(ENCODING_NATIVE, "<"), (ENCODING_BIG_ENDIAN, ">")])
def test_pack_is_byte_exact_in_both_byte_orders(encoding: int, order: str) -> None:
    header = FULL.with_(encoding=encoding)
    packed = header.pack()
    assert packed == expected_bytes(order, encoding)
    decoded = decode_rmh(packed)
    assert decoded.header == header
    assert decoded.header_encoding == encoding
    assert decoded.struc_length == len(packed)
    assert decode_rmh(packed, encoding=encoding).header == header


def test_header_integers_follow_the_requested_encoding_not_the_field() -> None:
    # The MQMD's Encoding governs the header; the header's own Encoding field governs the data after it.
    packed = FULL.pack(header_encoding=ENCODING_BIG_ENDIAN)
    assert packed[4:8] == b"\0\0\0\x01"
    assert decode_rmh(packed).header.encoding == ENCODING_NATIVE
    with pytest.raises(RmhError) as err:
        decode_rmh(packed, encoding=ENCODING_NATIVE)  # wrong byte order announced: Version reads 16777216
    assert err.value.reason == Reason.RMH_ERROR


def test_constants() -> None:
    assert LENGTH_1 == 108
    assert FORMAT_REF_MSG_HEADER == "MQHREF  " and len(FORMAT_REF_MSG_HEADER) == 8
    assert RmhFlags.LAST == 1 and RmhFlags.NOT_LAST == 0
    assert ENCODING_NATIVE == 546 and ENCODING_BIG_ENDIAN == 273
    assert byte_order(546) == "<" and byte_order(273) == ">"


def test_no_strings_is_the_bare_fixed_part() -> None:
    packed = RMH().pack()
    assert len(packed) == LENGTH_1
    assert struct.unpack_from("<8i", packed, 64) == (0,) * 8
    assert decode_rmh(packed).spans == ()


@pytest.mark.parametrize("encoding", [ENCODING_NATIVE, ENCODING_BIG_ENDIAN])
@pytest.mark.parametrize(
    "offsets",
    [
        {"dest_name": 108, "dest_env": 130, "src_name": 150, "src_env": 200},  # reverse order
        {"src_env": 300, "src_name": 120, "dest_env": 500, "dest_name": 164},  # shuffled, with gaps
        {"dest_name": 400},  # only one moved, far away
    ],
)
def test_strings_in_any_order_and_with_gaps(encoding: int, offsets: dict[str, int]) -> None:
    header = FULL.with_(encoding=encoding)
    packed = header.pack(string_offsets=offsets)
    decoded = decode_rmh(packed)
    assert decoded.header == header
    for span in decoded.spans:
        if span.name in offsets:
            assert span.offset == offsets[span.name]
        assert span.offset >= LENGTH_1 and span.end <= decoded.struc_length


def test_string_offsets_ignored_when_length_is_zero() -> None:
    packed = bytearray(RMH(dest_name="x").pack())
    for name in ("src_env", "src_name", "dest_env"):
        struct.pack_into("<i", packed, PAIR_AT[name] + 4, 7)  # an offset inside the fixed part, length 0
    decoded = decode_rmh(bytes(packed))
    assert decoded.header.src_env == "" and decoded.header.dest_name == "x"


def test_padding_after_strings_and_explicit_struc_length() -> None:
    packed = FULL.pack(struc_length=1000)
    assert len(packed) == 1000
    assert decode_rmh(packed + b"bulk").struc_length == 1000


@pytest.mark.parametrize(
    "offset",
    [0, 999_999_999, 1_000_000_000, 1_000_000_001, 5 * OFFSET_UNIT + 123, MAX_LOGICAL_OFFSET],
)
@pytest.mark.parametrize("encoding", [ENCODING_NATIVE, ENCODING_BIG_ENDIAN])
def test_logical_offset_uses_offset2_past_one_billion(offset: int, encoding: int) -> None:
    header = RMH(data_logical_offset=offset, data_logical_length=10, encoding=encoding)
    packed = header.pack()
    order = "<" if encoding == ENCODING_NATIVE else ">"
    low, high = struct.unpack_from(order + "2i", packed, 100)
    assert (low, high) == (offset % OFFSET_UNIT, offset // OFFSET_UNIT)
    assert 0 <= low <= 999_999_999 and 0 <= high <= 999_999_999
    assert decode_rmh(packed).header.data_logical_offset == offset


def test_struc_length_includes_strings_and_bulk_data_starts_there() -> None:
    message = ReferenceMessage(FULL.with_(data_logical_length=5), b"HELLO")
    encoded = message.encode()
    decoded = decode_message(encoded)
    assert bytes(decoded.message.data) == b"HELLO"
    assert encoded[decoded.layout.struc_length :] == b"HELLO"
    assert decoded.layout.struc_length == len(FULL.pack())


def _mutate(packed: bytes, offset: int, value: int, order: str = "<") -> bytes:
    buf = bytearray(packed)
    struct.pack_into(order + "i", buf, offset, value)
    return bytes(buf)


GOOD = FULL.pack()
MALFORMED = {
    "short buffer": (GOOD[:107], Reason.RMH_ERROR),
    "empty": (b"", Reason.RMH_ERROR),
    "StrucId": (b"RMX " + GOOD[4:], Reason.RMH_ERROR),
    "version 2": (_mutate(GOOD, 4, 2), Reason.RMH_ERROR),
    "version 0": (_mutate(GOOD, 4, 0), Reason.RMH_ERROR),
    "StrucLength below 108": (_mutate(GOOD, 8, 107), Reason.RMH_ERROR),
    "StrucLength negative": (_mutate(GOOD, 8, -1), Reason.RMH_ERROR),
    "StrucLength past the message": (_mutate(GOOD, 8, len(GOOD) + 1), Reason.RMH_ERROR),
    "CCSID 0": (_mutate(GOOD, 16, 0), Reason.RMH_ERROR),
    "CCSID negative": (_mutate(GOOD, 16, -3), Reason.RMH_ERROR),
    "Encoding without integer order": (_mutate(GOOD, 12, 0x220), Reason.RMH_ERROR),
    "unknown Flags": (_mutate(GOOD, 28, 2), Reason.RMH_ERROR),
    "negative Flags": (_mutate(GOOD, 28, -1), Reason.RMH_ERROR),
    "Format not ASCII": (GOOD[:20] + b"\xff" * 8 + GOOD[28:], Reason.RMH_ERROR),
    "ObjectType not ASCII": (GOOD[:32] + b"\x80" * 8 + GOOD[40:], Reason.RMH_ERROR),
    "DataLogicalLength negative": (_mutate(GOOD, 96, -5), Reason.RMH_ERROR),
    "DataLogicalOffset 10**9": (_mutate(GOOD, 100, OFFSET_UNIT), Reason.RMH_ERROR),
    "DataLogicalOffset negative": (_mutate(GOOD, 100, -1), Reason.RMH_ERROR),
    "DataLogicalOffset2 10**9": (_mutate(GOOD, 104, OFFSET_UNIT), Reason.RMH_ERROR),
    "DataLogicalOffset2 negative": (_mutate(GOOD, 104, -1), Reason.RMH_ERROR),
}
for _name in STRING_FIELDS:
    _at = PAIR_AT[_name]
    _reason = STRING_REASON[_name]
    MALFORMED[f"{_name} before byte 108"] = (_mutate(GOOD, _at + 4, 107), _reason)
    MALFORMED[f"{_name} at offset 0"] = (_mutate(GOOD, _at + 4, 0), _reason)
    MALFORMED[f"{_name} negative offset"] = (_mutate(GOOD, _at + 4, -4), _reason)
    MALFORMED[f"{_name} past StrucLength"] = (_mutate(GOOD, _at + 4, len(GOOD) - 2), _reason)
    MALFORMED[f"{_name} length past StrucLength"] = (_mutate(GOOD, _at, len(GOOD)), _reason)
    MALFORMED[f"{_name} negative length"] = (_mutate(GOOD, _at, -1), _reason)
    MALFORMED[f"{_name} huge length"] = (_mutate(GOOD, _at, 2**31 - 1), _reason)
    _start = struct.unpack_from("<i", GOOD, _at + 4)[0]
    MALFORMED[f"{_name} not UTF-8"] = (GOOD[:_start] + b"\xff" + GOOD[_start + 1 :], _reason)


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_header_rejected_with_mq_reason(case: str) -> None:
    buf, reason = MALFORMED[case]
    with pytest.raises(RmhError) as err:
        decode_rmh(buf)
    assert err.value.reason == reason, str(err.value)
    with pytest.raises(SegmentationError):
        decode_message(buf)


def test_string_past_struc_length_but_inside_the_buffer_is_rejected() -> None:
    # The bytes exist (bulk data follows), but a string must lie within StrucLength.
    buf = _mutate(GOOD, 92, len(GOOD) - 4) + b"bulk-data-here"
    with pytest.raises(RmhError) as err:
        decode_rmh(buf)
    assert err.value.reason == Reason.DEST_NAME_ERROR


def test_big_endian_malformed_string_reason() -> None:
    good = FULL.pack(header_encoding=ENCODING_BIG_ENDIAN)
    with pytest.raises(RmhError) as err:
        decode_rmh(_mutate(good, 68, 12, ">"))
    assert err.value.reason == Reason.SRC_ENV_ERROR


WRITE_ERRORS = {
    "CCSID 0": (RMH(ccsid=0), Reason.RMH_ERROR),
    "CCSID 0 with strings": (RMH(ccsid=0, src_name="x"), Reason.RMH_ERROR),
    "CCSID negative": (RMH(ccsid=-1), Reason.RMH_ERROR),
    "unknown Flags": (RMH(flags=4), Reason.RMH_ERROR),
    "short ObjectInstanceId": (RMH(object_instance_id=b"x"), Reason.RMH_ERROR),
    "negative length": (RMH(data_logical_length=-1), Reason.RMH_ERROR),
    "length over MQLONG": (RMH(data_logical_length=2**31), Reason.RMH_ERROR),
    "offset too large": (RMH(data_logical_offset=MAX_LOGICAL_OFFSET + 1), Reason.RMH_ERROR),
    "negative offset": (RMH(data_logical_offset=-1), Reason.RMH_ERROR),
    "Format too long": (RMH(format="MQSTRING+"), Reason.RMH_ERROR),
    "ObjectType not ASCII": (RMH(object_type="FLATFILÉ"), Reason.RMH_ERROR),
    "encoding without byte order": (RMH(encoding=0), Reason.RMH_ERROR),
}


@pytest.mark.parametrize("case", sorted(WRITE_ERRORS))
def test_write_side_rules(case: str) -> None:
    header, reason = WRITE_ERRORS[case]
    with pytest.raises(RmhError) as err:
        header.pack()
    assert err.value.reason == reason


@pytest.mark.parametrize(
    ("header", "ccsid", "reason"),
    [
        (RMH(dest_name="\u20ac"), 819, Reason.DEST_NAME_ERROR),
        (RMH(src_env="\u20ac"), 367, Reason.SRC_ENV_ERROR),
    ],
)
def test_strings_must_fit_the_header_ccsid(header: RMH, ccsid: int, reason: Reason) -> None:
    with pytest.raises(RmhError) as err:
        header.pack(header_ccsid=ccsid)
    assert err.value.reason == reason


@pytest.mark.parametrize("name", STRING_FIELDS)
def test_pack_refuses_a_string_inside_the_fixed_part(name: str) -> None:
    with pytest.raises(RmhError) as err:
        FULL.pack(string_offsets={name: 100})
    assert err.value.reason == STRING_REASON[name]


def test_struc_length_too_small_for_strings_on_write() -> None:
    with pytest.raises(RmhError) as err:
        FULL.pack(struc_length=120)
    assert err.value.reason == Reason.RMH_ERROR


@pytest.mark.parametrize(("ccsid", "text"), [(1208, "objet-\u00e9t\u00e9"), (819, "caf\u00e9"), (500, "EBCDIC-NAME")])
def test_strings_follow_the_ccsid(ccsid: int, text: str) -> None:
    packed = RMH(dest_name=text, ccsid=ccsid).pack()
    assert decode_rmh(packed).header.dest_name == text


def test_bulk_data_shorter_than_data_logical_length_is_refused() -> None:
    encoded = ReferenceMessage(RMH(data_logical_length=5), b"HELLO").encode()
    with pytest.raises(RmhError) as err:
        decode_message(encoded[:-1])
    assert err.value.reason == Reason.RMH_ERROR
    with pytest.raises(RmhError):
        ReferenceMessage(RMH(data_logical_length=4), b"HELLO").encode()


_strings = st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=20)


@given(
    strings=st.fixed_dictionaries({n: _strings for n in STRING_FIELDS}),
    encoding=st.sampled_from([ENCODING_NATIVE, ENCODING_BIG_ENDIAN]),
    offset=st.integers(0, MAX_LOGICAL_OFFSET),
    length=st.integers(0, 2**31 - 1),
    last=st.booleans(),
    gaps=st.lists(st.integers(0, 17), min_size=4, max_size=4),
    order=st.permutations(STRING_FIELDS),
)
def test_roundtrip_any_header(
    strings: dict[str, str],
    encoding: int,
    offset: int,
    length: int,
    last: bool,
    gaps: list[int],
    order: list[str],
) -> None:
    header = RMH(
        flags=RmhFlags.LAST if last else 0,
        data_logical_offset=offset,
        data_logical_length=length,
        encoding=encoding,
        **strings,
    )
    cursor = LENGTH_1
    offsets = {}
    for name, gap in zip(order, gaps, strict=True):
        cursor += gap
        offsets[name] = cursor
        cursor += len(strings[name].encode("utf-8"))
    packed = header.pack(string_offsets=offsets)
    assert decode_rmh(packed).header == header


@given(st.binary(max_size=400))
def test_fuzz_arbitrary_bytes_raise_only_segmentation_errors(data: bytes) -> None:
    for candidate in (data, b"RMH " + data, b"RMH \x01\0\0\0" + data, b"RMH \0\0\0\x01" + data):
        with contextlib.suppress(SegmentationError):
            decode_message(candidate)


@given(st.data())
def test_fuzz_mutated_valid_headers_raise_only_segmentation_errors(data: st.DataObject) -> None:
    base = bytearray(ReferenceMessage(FULL.with_(data_logical_length=4), b"DATA").encode())
    for _ in range(data.draw(st.integers(1, 8))):
        at = data.draw(st.integers(0, len(base) - 1))
        base[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(base)))
    for candidate in (bytes(base), bytes(base[:cut])):
        with contextlib.suppress(SegmentationError):
            decode_message(candidate, require_integrity=data.draw(st.booleans()))
