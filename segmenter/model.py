"""The segment as values: the wire format's constants, :class:`SegmentHeader`, :class:`Segment`.

Apart from :mod:`segmenter.wire` so that the decoder rendered from the header table
(``segmenter/_decoder.py``) can build these without importing ``wire``, which imports it:
``wire`` re-exports everything here, and callers keep importing from there. The header table's
rules name these constants (:func:`table_constants`), which is why they are defined once, here.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any, NamedTuple

from . import flags, header_table
from .buffers import Buffer
from .checksum import ChecksumAlgorithm, checksum
from .errors import ChecksumError, Reason
from .flags import Codec, is_last_segment

MAGIC = b"SGMT"
VERSION = 1
HEADER = struct.Struct(header_table.struct_format(header_table.FIELDS))  # the fixed fields (no header checksum)
HEADER_LENGTH = header_table.HEADER_LENGTH  # 84: fixed fields and header checksum, no extension
PREFIX_LENGTH = header_table.PREFIX_LENGTH  # 10: magic .. header_length, enough to frame a header
MAX_HEADER_LENGTH = 4096  # header and extension records together: a longer header is refused
UNKNOWN_LENGTH = 0xFFFF_FFFF_FFFF_FFFF  # like MQOL_UNDEFINED: not known when this segment was cut
MAX_LENGTH = (1 << 63) - 1  # lengths above this are refused (signed 64-bit in Spark/Arrow)
MAX_SEQ_NUMBER = 999_999_999  # MQ's range for MsgSeqNumber
GROUP_ID_LENGTH = 24
HAS_MESSAGE_CHECKSUM = 0x01  # header_flags bit: message_checksum is meaningful
LENGTH_DEFERRED = 0x02  # header_flags bit: the producer did not know the length up front (streaming)
KNOWN_HEADER_FLAGS = HAS_MESSAGE_CHECKSUM | LENGTH_DEFERRED
DEFAULT_MAX_SEGMENT_SIZE = 100 * 1024 * 1024  # MQ's largest MAXMSGL
_pack_body = HEADER.pack
_pack_u32 = struct.Struct(">I").pack
# The header checksum is CRC-32/IEEE: for 80 bytes the per-call overhead dominates, and zlib's is lower than isal's.
_small_crc32 = zlib.crc32


class SegmentHeader(NamedTuple):
    """The decoded header of one segment."""

    group_id: bytes
    """The group's 24-byte identifier (MQ's GroupId): every segment of every message of a group carries it."""
    msg_seq_number: int
    """The message's position in its group, from 1 (MQ's MsgSeqNumber)."""
    offset: int
    """Where this segment's data starts in the message's stored bytes, in bytes (MQ's Offset)."""
    data_length: int
    """Bytes of data this segment carries after its header."""
    original_length: int
    """The decoded message's length in bytes, or ``UNKNOWN_LENGTH`` when it was not known as this segment was cut."""
    stored_length: int
    """The message's stored length in bytes (the sum of all its segments' data, compressed when ``codec`` says so),
    or ``UNKNOWN_LENGTH``."""
    msg_flags: int
    """MQ's MsgFlags bits (``MsgFlags``: segment, last segment, message in group, last message in group)."""
    codec: Codec
    """How the message's stored bytes are compressed (``Codec.NONE``: they are the original bytes)."""
    algorithm: ChecksumAlgorithm
    """The checksum algorithm of ``data_checksum`` and ``message_checksum``."""
    data_checksum: int
    """The checksum of this segment's data, verified before the data is used."""
    message_checksum: int | None
    """The whole message's checksum, or None when this segment does not carry it (the last segment does)."""
    header_length: int = HEADER_LENGTH
    """Bytes of header, extension included: 84 without an extension."""
    length_deferred: bool = False
    """Set in every segment of a message whose OriginalLength was not known when it was cut; without it every segment
    declares OriginalLength, so a consumer can route by size per row."""
    extension: bytes = b""
    """Header bytes between the fixed fields and the header checksum (header_length > 84): carried by every segment,
    read from the last one when the message is verified (9030 malformed, 9031 an unknown critical type), written back
    by pack (header_length = 84 + len(extension))."""

    @property
    def end(self) -> int:
        """Offset one past this segment's data."""
        return self.offset + self.data_length

    @property
    def is_last_segment(self) -> bool:
        return is_last_segment(self.msg_flags)

    def pack(self) -> bytes:
        """The header bytes (version 1 layout, header checksum included)."""
        # One unpack instead of thirteen attribute loads: pack runs once per segment on the send path.
        gid, seq, offset, length, original, stored, flags, codec, algo, data_crc, message_crc, _, deferred, ext = self
        if message_crc is None:
            hflags = 0
            message_crc = 0
        else:
            hflags = HAS_MESSAGE_CHECKSUM
        if deferred:
            hflags |= LENGTH_DEFERRED
        body = _pack_body(
            MAGIC,
            VERSION,
            algo,
            codec,
            hflags,
            HEADER_LENGTH + len(ext),
            0,
            flags,
            gid,
            seq,
            length,
            offset,
            original,
            stored,
            data_crc,
            message_crc,
        )
        if ext:
            body += ext
        return body + _pack_u32(_small_crc32(body))


class Segment(NamedTuple):
    """One segment: header plus data (a zero-copy view where possible)."""

    header: SegmentHeader
    """The segment's decoded header."""
    data: Buffer
    """The segment's data, ``header.data_length`` bytes (a view of the received bytes where possible)."""

    def encode(self) -> bytes:
        """Header and data as one ``bytes`` (the only copy on the send path)."""
        header = self.header.pack()
        try:
            return header + self.data  # one copy; bytes(data) first would be a second
        except TypeError:  # a non-contiguous view: bytes() gathers it
            return header + bytes(self.data)

    def __len__(self) -> int:
        return self.header.header_length + self.header.data_length


def verify_data(header: SegmentHeader, data: Buffer) -> None:
    """Raise :class:`ChecksumError` unless ``data`` matches the header's data checksum.

    ``header``: the segment's header. ``data``: its data, as received.
    """
    actual = checksum(header.algorithm, data)
    if actual != header.data_checksum:
        raise ChecksumError(
            f"data checksum mismatch in segment at offset {header.offset} of message {header.msg_seq_number}",
            reason=Reason.DATA_CHECKSUM_ERROR,
            offset=header.offset,
            msg_seq_number=header.msg_seq_number,
            expected=header.data_checksum,
            actual=actual,
        )


def table_constants() -> dict[str, Any]:
    """The names the header table's rules resolve in: this module's constants and segmenter.flags'.

    Here, not in the table, so that the table imports nothing of ours and model -> table stays
    one-way; every renderer of :mod:`segmenter.header_render` takes this as its ``env``.
    """
    return {**vars(flags), **globals()}
