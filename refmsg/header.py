"""IBM MQ's reference message header, MQRMH version 1, byte exact (layout in docs/how-to/refmsg.md).

The fixed part is 108 bytes of MQLONGs and fixed-width character fields. Four
optional strings (source/destination environment and name) live anywhere
inside ``StrucLength`` after the fixed part, each found through its own
offset, which is measured from the start of the header. Bulk data, if any,
starts at ``StrucLength``.

Like every MQ header, the MQRMH is written in the encoding and character set
of the structure before it (the MQMD): its own Encoding and CodedCharSetId
fields describe the bulk data that follows. Integers are in the byte order
that encoding names (546 little-endian, 273 big-endian); a reader given no
encoding detects it from the Version field, which must be 1. The four strings
are text in the header's character set (``header_ccsid``, default 1208
UTF-8); Format and ObjectType are ASCII. Decoding
checks every field before trusting it, and every failure is an
:class:`~refmsg.errors.RmhError` carrying MQ's reason: 2220 for the structure,
2261-2264 for a misplaced source environment, source name, destination
environment or destination name.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import IntFlag
from typing import NamedTuple

from segmenter.errors import Reason

from .errors import RmhError

Buffer = bytes | bytearray | memoryview

STRUC_ID = b"RMH "
VERSION_1 = 1
LENGTH_1 = 108  # MQRMH_LENGTH_1: the fixed part
FORMAT_REF_MSG_HEADER = "MQHREF  "  # MQFMT_REF_MSG_HEADER: the MQMD Format of a reference message
FORMAT_NONE = "        "  # MQFMT_NONE
DEFAULT_OBJECT_TYPE = "FLATFILE"  # what IBM's sample exits use
OBJECT_INSTANCE_ID_LENGTH = 24
ENCODING_NATIVE = 546  # 0x222: little-endian integers (Linux x86, Windows)
ENCODING_BIG_ENDIAN = 273  # 0x111: big-endian integers (AIX, z/OS)
CCSID_UTF8 = 1208
OFFSET_UNIT = 1_000_000_000  # DataLogicalOffset2 counts units of 10**9 bytes
MAX_OFFSET_FIELD = OFFSET_UNIT - 1
MAX_LOGICAL_OFFSET = MAX_OFFSET_FIELD * OFFSET_UNIT + MAX_OFFSET_FIELD
MAX_MQLONG = 2**31 - 1
_INTEGER_MASK = 0x0F  # MQENC_INTEGER_MASK
_INTEGER_NORMAL = 0x01  # big-endian
_INTEGER_REVERSED = 0x02  # little-endian

# The four strings: field name, MQ reason when misplaced, position of its (length, offset) pair.
STRING_FIELDS: tuple[str, ...] = ("src_env", "src_name", "dest_env", "dest_name")
_STRING_REASON = {
    "src_env": Reason.SRC_ENV_ERROR,
    "src_name": Reason.SRC_NAME_ERROR,
    "dest_env": Reason.DEST_ENV_ERROR,
    "dest_name": Reason.DEST_NAME_ERROR,
}
_STRING_FIELD_OFFSET = {"src_env": 64, "src_name": 72, "dest_env": 80, "dest_name": 88}

# Header character set -> Python codec for the four strings. Others are refused when strings are present.
CCSID_CODECS: Mapping[int, str] = {
    1208: "utf-8",
    819: "latin-1",
    367: "ascii",
    437: "cp437",
    850: "cp850",
    1252: "cp1252",
    37: "cp037",
    500: "cp500",
    1140: "cp1140",
    1200: "utf-16-be",
}


class RmhFlags(IntFlag):
    """MQRMH Flags."""

    NOT_LAST = 0  # MQRMHF_NOT_LAST
    LAST = 1  # MQRMHF_LAST


KNOWN_FLAGS = int(RmhFlags.LAST)


def _fixed(order: str) -> struct.Struct:
    # StrucId, Version, StrucLength, Encoding, CCSID, Format, Flags, ObjectType, ObjectInstanceId,
    # 4 x (length, offset), DataLogicalLength, DataLogicalOffset, DataLogicalOffset2.
    return struct.Struct(order + "4s3ii8si8s24s11i")


_STRUCTS = {"<": _fixed("<"), ">": _fixed(">")}
assert _STRUCTS["<"].size == LENGTH_1


def byte_order(encoding: int) -> str:
    """The struct byte-order character for an MQ encoding's integer part."""
    integer = encoding & _INTEGER_MASK
    if integer == _INTEGER_REVERSED:
        return "<"
    if integer == _INTEGER_NORMAL:
        return ">"
    raise RmhError(f"encoding {encoding} names no integer byte order", encoding=encoding)


def _codec(ccsid: int) -> str:
    codec = CCSID_CODECS.get(ccsid)
    if codec is None:
        raise RmhError(f"no codec for the header character set {ccsid}", ccsid=ccsid)
    return codec


def _char_field(value: str, width: int, name: str) -> bytes:
    raw = value.encode("ascii", errors="strict") if value.isascii() else b""
    if len(raw) != len(value) or len(raw) > width:
        raise RmhError(f"{name} {value!r} is not ASCII of at most {width} characters", field=name)
    return raw.ljust(width, b" ")


@dataclass(frozen=True)
class RMH:
    """The logical content of an MQRMH; the byte layout is chosen by :meth:`pack`.

    ``data_logical_offset`` is the whole logical offset (it may exceed 10**9);
    :meth:`pack` splits it into DataLogicalOffset and DataLogicalOffset2.
    ``encoding`` and ``ccsid`` are the header's Encoding and CodedCharSetId
    fields, which describe the bulk data that follows (MQ semantics); this
    library also writes the header's own integers in ``encoding`` unless told
    otherwise. The strings' character set is the header's own (``header_ccsid``).
    """

    flags: int = RmhFlags.NOT_LAST
    """The MQRMH Flags: ``RmhFlags.LAST`` on the last message of an object, else ``NOT_LAST``."""
    object_type: str = DEFAULT_OBJECT_TYPE
    """The ObjectType, 8 characters naming the kind of object."""
    object_instance_id: bytes = bytes(OBJECT_INSTANCE_ID_LENGTH)
    """The 24-byte ObjectInstanceId that identifies one transfer of an object (zeros: none)."""
    src_env: str = ""
    """The SrcEnv string: the source environment (for a claim check, the store's name)."""
    src_name: str = ""
    """The SrcName string: the object's name at the source (for a claim check, its key)."""
    dest_env: str = ""
    """The DestEnv string: the destination environment."""
    dest_name: str = ""
    """The DestName string: the object's name at the destination (the name a receiver writes it under)."""
    data_logical_length: int = 0
    """Bytes of the object's data this message covers (carried after the header, or not: a header-only message)."""
    data_logical_offset: int = 0
    format: str = FORMAT_NONE
    """The MQ Format of the data that follows the header."""
    encoding: int = ENCODING_NATIVE
    ccsid: int = CCSID_UTF8

    @property
    def is_last(self) -> bool:
        return bool(self.flags & RmhFlags.LAST)

    @property
    def offset_low(self) -> int:
        """DataLogicalOffset: the logical offset modulo 10**9."""
        return self.data_logical_offset % OFFSET_UNIT

    @property
    def offset_high(self) -> int:
        """DataLogicalOffset2: the logical offset divided by 10**9."""
        return self.data_logical_offset // OFFSET_UNIT

    @property
    def end(self) -> int:
        """Logical offset one past the data this header describes."""
        return self.data_logical_offset + self.data_logical_length

    def strings(self) -> dict[str, str]:
        return {name: getattr(self, name) for name in STRING_FIELDS}

    def with_(self, **changes: object) -> RMH:
        """A copy with some fields changed.

        ``**changes``: the fields to change, by name, with their new values.
        """
        return replace(self, **changes)  # type: ignore[arg-type]

    def encoded_strings(self, header_ccsid: int = CCSID_UTF8) -> dict[str, bytes]:
        """The non-empty strings in the header's character set.

        ``header_ccsid``: the character set (CodedCharSetId) the strings are encoded in.
        """
        out: dict[str, bytes] = {}
        for name, value in self.strings().items():
            if not value:
                continue
            codec = _codec(header_ccsid)
            try:
                out[name] = value.encode(codec)
            except UnicodeError:
                raise RmhError(
                    f"{name} cannot be written in CCSID {header_ccsid}",
                    reason=_STRING_REASON[name],
                    ccsid=header_ccsid,
                ) from None
        return out

    def validate(self) -> None:
        """The write-side rules (MQ refuses these on MQPUT)."""
        if self.ccsid == 0:
            raise RmhError("CodedCharSetId 0 is not allowed", ccsid=0)
        if self.ccsid < 0 or self.ccsid > MAX_MQLONG:
            raise RmhError(f"CodedCharSetId {self.ccsid} out of range", ccsid=self.ccsid)
        byte_order(self.encoding)
        if self.flags & ~KNOWN_FLAGS or self.flags < 0:
            raise RmhError(f"unknown Flags bits 0x{self.flags:x}", flags=self.flags)
        if len(self.object_instance_id) != OBJECT_INSTANCE_ID_LENGTH:
            raise RmhError("ObjectInstanceId must be 24 bytes", length=len(self.object_instance_id))
        if not 0 <= self.data_logical_length <= MAX_MQLONG:
            raise RmhError(
                f"DataLogicalLength {self.data_logical_length} out of range", length=self.data_logical_length
            )
        if not 0 <= self.data_logical_offset <= MAX_LOGICAL_OFFSET:
            raise RmhError(f"logical offset {self.data_logical_offset} out of range", offset=self.data_logical_offset)

    def pack(
        self,
        *,
        header_encoding: int | None = None,
        header_ccsid: int = CCSID_UTF8,
        string_offsets: Mapping[str, int] | None = None,
        struc_length: int | None = None,
        trailer: bytes = b"",
    ) -> bytes:
        """The header bytes: fixed part, strings, then ``trailer`` ending exactly at StrucLength.

        By default the strings follow the fixed part in field order and StrucLength
        is rounded up to a multiple of 4 (NUL padding). ``string_offsets``
        places them anywhere (any order, gaps filled with NULs); ``struc_length``
        pads the header. The header's integers are written in ``header_encoding``
        (default: the Encoding field), its strings in ``header_ccsid``.
        """
        self.validate()
        order = byte_order(self.encoding if header_encoding is None else header_encoding)
        encoded = self.encoded_strings(header_ccsid)
        offsets: dict[str, int] = {}
        cursor = LENGTH_1
        for name in STRING_FIELDS:
            if name not in encoded:
                continue
            if string_offsets is not None and name in string_offsets:
                offsets[name] = string_offsets[name]
            else:
                offsets[name] = cursor
            cursor = max(cursor, offsets[name] + len(encoded[name]))
        for name, at in offsets.items():
            if at < LENGTH_1:
                raise RmhError(f"{name} offset {at} inside the fixed part", reason=_STRING_REASON[name], offset=at)
        end = max([LENGTH_1, *(offsets[n] + len(encoded[n]) for n in offsets)])
        total = -(-(end + len(trailer)) // 4) * 4 if struc_length is None else struc_length  # default: 4-aligned
        if total < end + len(trailer) or total > MAX_MQLONG:
            raise RmhError(f"StrucLength {total} cannot hold {end + len(trailer)} bytes", struc_length=total)
        buf = bytearray(total)
        pairs: list[int] = []
        for name in STRING_FIELDS:
            if name in encoded:
                pairs += [len(encoded[name]), offsets[name]]
            else:
                pairs += [0, 0]
        _STRUCTS[order].pack_into(
            buf,
            0,
            STRUC_ID,
            VERSION_1,
            total,
            self.encoding,
            self.ccsid,
            _char_field(self.format, 8, "Format"),
            self.flags,
            _char_field(self.object_type, 8, "ObjectType"),
            self.object_instance_id,
            *pairs,
            self.data_logical_length,
            self.offset_low,
            self.offset_high,
        )
        for name, at in offsets.items():
            buf[at : at + len(encoded[name])] = encoded[name]
        if trailer:
            buf[total - len(trailer) :] = trailer
        return bytes(buf)


class StringSpan(NamedTuple):
    """Where one string lies, in bytes from the start of the MQRMH."""

    name: str
    offset: int
    length: int

    @property
    def end(self) -> int:
        return self.offset + self.length


class DecodedRMH(NamedTuple):
    """A decoded header and the facts about its layout a reader may need."""

    header: RMH
    """The header's logical content."""
    struc_length: int
    """The header's StrucLength in bytes: the fixed fields, the strings and any padding."""
    header_encoding: int
    """Byte order the integers were read in (546 or 273)."""
    header_ccsid: int
    """Character set the strings were read in."""
    spans: tuple[StringSpan, ...]
    """The present strings, in field order."""


def detect_encoding(buf: Buffer) -> int:
    """546 or 273: the byte order in which the Version field reads as 1."""
    version = bytes(buf[4:8])
    if int.from_bytes(version, "little", signed=True) == VERSION_1:
        return ENCODING_NATIVE
    if int.from_bytes(version, "big", signed=True) == VERSION_1:
        return ENCODING_BIG_ENDIAN
    raise RmhError(f"unsupported MQRMH version bytes {version.hex()}", version=version.hex())


def _text(raw: bytes, name: str) -> str:
    try:
        return raw.decode("ascii")
    except UnicodeDecodeError:
        raise RmhError(f"{name} is not ASCII", field=name) from None


def decode_rmh(buf: Buffer, *, encoding: int | None = None, ccsid: int = CCSID_UTF8) -> DecodedRMH:
    """Parse and validate the MQRMH at the start of ``buf``.

    ``encoding`` and ``ccsid`` are the header's own encoding and character set
    as the preceding structure (the MQMD) declares them; ``encoding=None``
    detects the byte order from the Version.
    """
    view = memoryview(buf)
    if len(view) < LENGTH_1:
        raise RmhError(f"{len(view)} bytes cannot hold the {LENGTH_1}-byte MQRMH", length=len(view))
    if bytes(view[0:4]) != STRUC_ID:
        raise RmhError(f"StrucId {bytes(view[0:4])!r} is not {STRUC_ID!r}", struc_id=bytes(view[0:4]).hex())
    header_encoding = detect_encoding(view) if encoding is None else encoding
    order = byte_order(header_encoding)
    fields = _STRUCTS[order].unpack_from(view)
    (_, version, struc_length, data_encoding, data_ccsid, fmt, flags, object_type, instance_id) = fields[:9]
    pairs = fields[9:17]
    data_length, offset_low, offset_high = fields[17:20]
    if version != VERSION_1:
        raise RmhError(f"unsupported MQRMH version {version}", version=version)
    if struc_length < LENGTH_1:
        raise RmhError(f"StrucLength {struc_length} below {LENGTH_1}", struc_length=struc_length)
    if struc_length > len(view):
        raise RmhError(
            f"StrucLength {struc_length} runs past the {len(view)}-byte message",
            struc_length=struc_length,
            length=len(view),
        )
    if data_ccsid <= 0:
        raise RmhError(f"CodedCharSetId {data_ccsid} is not valid", ccsid=data_ccsid)
    if data_encoding & _INTEGER_MASK not in (_INTEGER_NORMAL, _INTEGER_REVERSED):
        raise RmhError(f"Encoding {data_encoding} names no integer byte order", encoding=data_encoding)
    if flags & ~KNOWN_FLAGS:
        raise RmhError(f"unknown Flags bits 0x{flags & 0xFFFFFFFF:x}", flags=flags)
    if data_length < 0:
        raise RmhError(f"DataLogicalLength {data_length} is negative", length=data_length)
    for name, value in (("DataLogicalOffset", offset_low), ("DataLogicalOffset2", offset_high)):
        if not 0 <= value <= MAX_OFFSET_FIELD:
            raise RmhError(f"{name} {value} outside 0..{MAX_OFFSET_FIELD}", field=name, value=value)
    spans: list[StringSpan] = []
    texts: dict[str, str] = {}
    for index, name in enumerate(STRING_FIELDS):
        length, offset = pairs[2 * index], pairs[2 * index + 1]
        reason = _STRING_REASON[name]
        if length < 0:
            raise RmhError(f"{name} length {length} is negative", reason=reason, length=length)
        if length == 0:
            texts[name] = ""
            continue
        if offset < LENGTH_1 or offset + length > struc_length:
            raise RmhError(
                f"{name} [{offset}, {offset + length}) not within [{LENGTH_1}, {struc_length})",
                reason=reason,
                offset=offset,
                length=length,
                struc_length=struc_length,
            )
        codec = _codec(ccsid)
        try:
            texts[name] = bytes(view[offset : offset + length]).decode(codec)
        except UnicodeDecodeError:
            raise RmhError(f"{name} is not valid in CCSID {ccsid}", reason=reason, ccsid=ccsid) from None
        spans.append(StringSpan(name, offset, length))
    header = RMH(
        flags=flags,
        object_type=_text(object_type, "ObjectType"),
        object_instance_id=bytes(instance_id),
        data_logical_length=data_length,
        data_logical_offset=offset_high * OFFSET_UNIT + offset_low,
        format=_text(fmt, "Format"),
        encoding=data_encoding,
        ccsid=data_ccsid,
        **texts,
    )
    return DecodedRMH(header, struc_length, header_encoding, ccsid, tuple(spans))


def string_field_offset(name: str) -> int:
    """Byte offset of a string's length field in the fixed part (its offset field follows)."""
    return _STRING_FIELD_OFFSET[name]
