"""The segment wire format, version 1 (specified in docs/wire-format.md).

A segment is an 84-byte big-endian header followed by the data. Big-endian
(network order) because the JVM reads it natively: Spark decodes headers in
SQL without a Python round trip. The header checksum is always CRC-32/IEEE so
any decoder, Spark SQL included, can verify it with a standard function.

Decoding validates everything before trusting anything: lengths are checked
against the buffer and the configured limits before any allocation, and every
failure is a :class:`~segmenter.errors.SegmentationError` subclass.

The fields and rules are one table, :mod:`segmenter.header_table`;
``check_prefix``, ``decode_header``, ``decode_segment`` and
``_check_header_fields`` are generated from it and compiled once at import
(``GENERATED_SOURCE`` holds their source), as the Spark SQL is. Where the optional compiled
decoder was built (``segmenter/_fastwire.c``, from the same table), ``decode_segment`` is that one:
same results, and the Python decoder raises every error.
"""

from __future__ import annotations

import os
import struct
import zlib
from typing import TYPE_CHECKING, Any, NamedTuple

from . import flags, header_table
from .checksum import ChecksumAlgorithm, checksum, checksum_function
from .errors import (  # noqa: F401 (the generated decoder raises these)
    ChecksumError,
    FlagsError,
    HeaderError,
    MessageTooBigError,
    OffsetError,
    OriginalLengthError,
    Reason,
    SegmentLengthZeroError,
    SequenceError,
)
from .flags import KNOWN_FLAGS, Codec, MsgFlags, is_last_segment  # noqa: F401 (named by the header table)
from .sources import byte_view  # noqa: F401 (the generated decoder flattens its input with it)

Buffer = bytes | bytearray | memoryview

MAGIC = b"SGMT"
VERSION = 1
HEADER = struct.Struct(header_table.struct_format(header_table.FIELDS))  # the fixed fields (no header checksum)
HEADER_LENGTH = header_table.HEADER_LENGTH  # 84: fixed fields and header checksum, no extension
PREFIX_LENGTH = header_table.PREFIX_LENGTH  # 10: magic .. header_length, enough to frame a header
MAX_HEADER_LENGTH = 4096  # a v1 reader skips extension bytes up to this
UNKNOWN_LENGTH = 0xFFFF_FFFF_FFFF_FFFF  # like MQOL_UNDEFINED: not known when this segment was cut
MAX_LENGTH = (1 << 63) - 1  # lengths above this are refused (signed 64-bit in Spark/Arrow)
MAX_SEQ_NUMBER = 999_999_999  # MQ's range for MsgSeqNumber
GROUP_ID_LENGTH = 24
HAS_MESSAGE_CHECKSUM = 0x01  # header_flags bit: message_checksum is meaningful
LENGTH_DEFERRED = 0x02  # header_flags bit: the producer did not know the length up front (streaming)
KNOWN_HEADER_FLAGS = HAS_MESSAGE_CHECKSUM | LENGTH_DEFERRED
DEFAULT_MAX_SEGMENT_SIZE = 100 * 1024 * 1024  # MQ's largest MAXMSGL
_HEADER_CRC = checksum_function(ChecksumAlgorithm.CRC32)
_PREFIX = struct.Struct(header_table.struct_format(header_table.PREFIX_FIELDS))
_FIXED = HEADER
_CODECS = {int(c): c for c in Codec}
_ALGORITHMS = {int(a): a for a in ChecksumAlgorithm}
_DATA_CRC = {int(a): checksum_function(a) for a in ChecksumAlgorithm}
_tuple_new = tuple.__new__  # builds a NamedTuple without calling its (Python) __new__
_pack_body = HEADER.pack
_pack_u32 = struct.Struct(">I").pack
# Same CRC-32/IEEE as _HEADER_CRC: for 80 bytes the per-call overhead dominates, and zlib's is lower than isal's.
_small_crc32 = zlib.crc32


class SegmentHeader(NamedTuple):
    """The decoded header of one segment."""

    group_id: bytes
    msg_seq_number: int
    offset: int
    data_length: int
    original_length: int  # decoded message length, or UNKNOWN_LENGTH
    stored_length: int  # sum of all segment data of the message, or UNKNOWN_LENGTH
    msg_flags: int
    codec: Codec
    algorithm: ChecksumAlgorithm
    data_checksum: int
    message_checksum: int | None  # None when this segment does not carry it
    header_length: int = HEADER_LENGTH
    # Set in every segment of a message whose OriginalLength was not known when it was cut;
    # without it every segment declares OriginalLength, so a consumer can route by size per row.
    length_deferred: bool = False
    # Header bytes between the fixed fields and the header checksum (header_length > 84): carried
    # opaquely by v1 readers and written back by pack (header_length = 84 + len(extension)).
    extension: bytes = b""

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
    data: Buffer

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
    """Raise :class:`ChecksumError` unless ``data`` matches the header's data checksum."""
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


GENERATED_SOURCE = header_table.python_source(globals())
exec(compile(GENERATED_SOURCE, "<segmenter.header_table>", "exec"), globals())  # our own table, compiled once

if TYPE_CHECKING:  # the generated functions' signatures, for type checkers

    def _check_header_fields(h: SegmentHeader, max_message_size: int) -> None:
        """Range and consistency rules that need no data."""

    def check_prefix(buf: Buffer, max_header_length: int = MAX_HEADER_LENGTH) -> int:
        """Check magic, version and header length (the first 10 bytes); return the header length."""

    def decode_header(
        buf: Buffer, *, max_message_size: int = MAX_LENGTH, max_header_length: int = MAX_HEADER_LENGTH
    ) -> SegmentHeader:
        """Parse and validate a header from the start of ``buf`` (data not needed)."""

    def decode_segment(
        buf: Buffer,
        *,
        max_segment_size: int = DEFAULT_MAX_SEGMENT_SIZE,
        max_message_size: int = MAX_LENGTH,
        verify: bool = True,
    ) -> Segment:
        """Decode one whole encoded segment; the data is a view into ``buf`` (no copy)."""


python_decode_segment = decode_segment  # the generated Python decoder: every error is raised by it


def _compiled_decoder() -> Any:
    """The optional compiled ``decode_segment`` (segmenter/_fastwire.c), or ``None`` when it was not
    built. It accepts what every rule of the same table accepts and hands anything else to
    :func:`python_decode_segment`, so only the speed differs: a broker receive decodes one segment
    per delivery, and the Python decoder's header work was a fifth of it.
    ``SEGMENTER_PURE_PYTHON=1`` leaves it out (the tests run both)."""
    if os.environ.get("SEGMENTER_PURE_PYTHON") == "1":
        return None
    try:
        from . import _fastwire
    except ImportError:
        return None

    def table(members: dict[int, Any]) -> tuple[Any, ...]:
        return tuple(members.get(i) for i in range(max(members) + 1))

    _fastwire.configure(
        SegmentHeader,
        Segment,
        table(_CODECS),
        table(_ALGORITHMS),
        table(_DATA_CRC),
        python_decode_segment,
        DEFAULT_MAX_SEGMENT_SIZE,
        MAX_LENGTH,
        MAX_HEADER_LENGTH,
    )
    return _fastwire.decode_segment


COMPILED_DECODER = _compiled_decoder()
if COMPILED_DECODER is not None:
    decode_segment = COMPILED_DECODER  # same signature and results, compiled


def make_header(
    *,
    group_id: bytes,
    msg_seq_number: int,
    offset: int,
    data: Buffer,
    original_length: int,
    stored_length: int,
    msg_flags: int,
    codec: Codec,
    algorithm: ChecksumAlgorithm,
    message_checksum: int | None,
    data_checksum: int | None = None,
) -> SegmentHeader:
    """Build a header for ``data`` (computing its checksum unless given)."""
    return SegmentHeader(
        group_id=group_id,
        msg_seq_number=msg_seq_number,
        offset=offset,
        data_length=len(data),
        original_length=original_length,
        stored_length=stored_length,
        msg_flags=int(msg_flags),
        codec=codec,
        algorithm=algorithm,
        data_checksum=checksum(algorithm, data) if data_checksum is None else data_checksum,
        message_checksum=message_checksum,
    )


class SegmentStreamDecoder:
    """Incremental decoder for a byte stream of concatenated segments.

    Feed bytes in chunks of any size; complete segments come out in order. A
    declared data length above ``max_segment_size`` is refused before any
    buffering, so a hostile header cannot make the decoder allocate.
    After an error the decoder stays failed: a corrupt stream has no
    trustworthy frame boundary to resume from. Segments framed before the error in the same
    :meth:`feed` are returned first and the error is raised by the next call (``feed`` or
    :meth:`close`), so what comes out does not depend on how the bytes were chunked.
    """

    def __init__(
        self,
        *,
        max_segment_size: int = DEFAULT_MAX_SEGMENT_SIZE,
        max_message_size: int = MAX_LENGTH,
        verify: bool = True,
    ) -> None:
        self._buf = bytearray()
        self._max_segment_size = max_segment_size
        self._max_message_size = max_message_size
        # False: data checksums are left to the consumer (an assembler reports a bad one as an event;
        # a damaged data part does not move any boundary, so the stream stays framed)
        self._verify = verify
        self._failed: Exception | None = None
        self._deferred: Exception | None = None  # an error met after segments the same call returned

    def feed(self, data: Buffer) -> list[Segment]:
        """Add bytes; return every segment they complete."""
        self._raise_deferred()
        if self._failed is not None:
            raise HeaderError("stream decoder failed earlier", reason=Reason.STATE_ERROR) from self._failed
        self._buf += data
        out: list[Segment] = []
        try:
            while True:
                seg = self._next()
                if seg is None:
                    return out
                out.append(seg)
        except Exception as exc:
            self._failed = exc
            if out:  # whole segments framed before the error: theirs first, the error at the next call
                self._deferred = exc
                return out
            raise

    def _raise_deferred(self) -> None:
        exc, self._deferred = self._deferred, None
        if exc is not None:
            raise exc

    def _next(self) -> Segment | None:
        buf = self._buf
        if len(buf) < _PREFIX.size:
            if len(buf) >= len(MAGIC) and bytes(buf[:4]) != MAGIC:
                raise HeaderError(f"bad magic {bytes(buf[:4])!r}", reason=Reason.BAD_MAGIC)
            return None
        header_length = check_prefix(buf)
        if len(buf) < header_length:
            return None
        header = decode_header(buf, max_message_size=self._max_message_size)
        total = header.header_length + header.data_length
        if total > self._max_segment_size:
            raise MessageTooBigError(
                f"segment of {total} bytes exceeds the limit {self._max_segment_size}",
                reason=Reason.MSG_TOO_BIG_FOR_CHANNEL,
                length=total,
                limit=self._max_segment_size,
            )
        if len(buf) < total:
            return None
        raw = bytes(buf[:total])
        del buf[:total]
        return decode_segment(
            raw, max_segment_size=self._max_segment_size, max_message_size=self._max_message_size, verify=self._verify
        )

    @property
    def pending(self) -> int:
        """Bytes received that do not yet form a whole segment."""
        return len(self._buf)

    def close(self) -> None:
        """Raise if the stream ended inside a segment (or with an error not yet raised)."""
        self._raise_deferred()
        if self._buf:
            raise HeaderError(
                f"stream ended with {len(self._buf)} bytes of an unfinished segment",
                reason=Reason.TRUNCATED,
                pending=len(self._buf),
            )


def table_constants() -> dict[str, Any]:
    """The names the header table's rules resolve in (for SQL): this module's constants and segmenter.flags'.

    Here, not in the table, so the table imports nothing of ours and wire -> table stays one-way.
    """
    return {**vars(flags), **globals()}
