# Generated from segmenter/header_table.py by `python tools/render.py`: edit the table, not this file.
"""The Python segment decoder: the header table's fields and rules as straight-line code.

Rendered from :mod:`segmenter.header_table` by :func:`segmenter.header_render.python_source` and
committed, so that it reads and steps like any module; ``python tools/render.py`` writes it, and
tests/segmenter/test_header_table.py fails when it is not what the table renders. Each rule is one
``if`` that raises the rule's error, in table order: the first rule that fails names the reason.
:mod:`segmenter.wire` re-exports these functions; where the optional compiled decoder was built
(``segmenter/_fastwire.c``, from the same table), it hands every segment it does not accept to
:func:`decode_segment` here, so the errors raised are always these.
"""

from __future__ import annotations

import struct

from .buffers import Buffer
from .checksum import ChecksumAlgorithm, checksum_function
from .errors import (
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
from .flags import KNOWN_FLAGS, Codec
from .model import (
    DEFAULT_MAX_SEGMENT_SIZE,
    HEADER_LENGTH,
    MAX_HEADER_LENGTH,
    MAX_LENGTH,
    MAX_SEQ_NUMBER,
    Segment,
    SegmentHeader,
    verify_data,
)
from .sources import byte_view

_PREFIX = struct.Struct(">4sBBBBH")  # magic .. header_length: enough to frame a header
_FIXED = struct.Struct(">4sBBBBHHI24sIIQQQII")  # every fixed field (the header checksum follows)
_HEADER_CRC = checksum_function(ChecksumAlgorithm.CRC32)  # the header checksum: CRC-32/IEEE, always
_CODECS = {int(c): c for c in Codec}
_ALGORITHMS = {int(a): a for a in ChecksumAlgorithm}
_DATA_CRC = {int(a): checksum_function(a) for a in ChecksumAlgorithm}
_tuple_new = tuple.__new__  # builds a NamedTuple without calling its (Python) __new__


def _check_header_fields(h: SegmentHeader, max_message_size: int) -> None:
    """Range and consistency rules that need no data (a header decoded, or built by a caller)."""
    (
        group_id,
        msg_seq_number,
        offset,
        data_length,
        original_length,
        stored_length,
        msg_flags,
        codec,
        _algorithm,
        _data_checksum,
        message_checksum,
        _header_length,
        length_deferred,
        _extension,
    ) = h
    has_message_checksum = message_checksum is not None
    end = offset + data_length
    segmented = (msg_flags & (2 | 4)) != 0
    last = ((msg_flags & 4) != 0) or ((msg_flags & 2) == 0)
    if len(group_id) != 24:
        raise HeaderError("GroupId must be 24 bytes", reason=Reason.GROUP_ID_ERROR, length=len(group_id))
    if (msg_seq_number < 1) or (msg_seq_number > 999999999):
        raise SequenceError(
            f"MsgSeqNumber {msg_seq_number} outside 1..{MAX_SEQ_NUMBER}",
            reason=Reason.MSG_SEQ_NUMBER_ERROR,
            msg_seq_number=msg_seq_number,
        )
    if (msg_flags & (~31)) != 0:
        raise FlagsError(
            f"unknown MsgFlags bits 0x{msg_flags & ~KNOWN_FLAGS:x}", reason=Reason.MSG_FLAGS_ERROR, msg_flags=msg_flags
        )
    if (original_length != 18446744073709551615) and (original_length > max_message_size):
        raise MessageTooBigError(
            f"declared original_length {original_length} exceeds the limit {max_message_size}",
            reason=Reason.MSG_TOO_BIG,
            declared=original_length,
            limit=max_message_size,
            field="original_length",
        )
    if (stored_length != 18446744073709551615) and (stored_length > max_message_size):
        raise MessageTooBigError(
            f"declared stored_length {stored_length} exceeds the limit {max_message_size}",
            reason=Reason.MSG_TOO_BIG,
            declared=stored_length,
            limit=max_message_size,
            field="stored_length",
        )
    if end > max_message_size:
        raise MessageTooBigError(
            f"segment [{offset}, {end}) ends past the largest message allowed, {max_message_size}",
            reason=Reason.MSG_TOO_BIG,
            offset=offset,
            end=end,
            limit=max_message_size,
        )
    if (offset > 9223372036854775807) or (end > 9223372036854775807):
        raise OffsetError(f"offset {offset} out of range", reason=Reason.OFFSET_ERROR, offset=offset)
    if (not segmented) and (offset != 0):
        raise OffsetError("an unsegmented message must have offset 0", reason=Reason.OFFSET_ERROR, offset=offset)
    if (data_length == 0) and (not last):
        raise SegmentLengthZeroError(
            "only the last segment of a message may be empty",
            reason=Reason.SEGMENT_LENGTH_ZERO,
            offset=offset,
            msg_seq_number=msg_seq_number,
        )
    if (stored_length != 18446744073709551615) and (end > stored_length):
        raise OffsetError(
            f"segment [{offset}, {end}) runs past the stored length {stored_length}",
            reason=Reason.OFFSET_ERROR,
            offset=offset,
            end=end,
            stored_length=stored_length,
        )
    if (stored_length != 18446744073709551615) and last and (end != stored_length):
        raise OriginalLengthError(
            f"last segment ends at {end}, stored length is {stored_length}",
            reason=Reason.ORIGINAL_LENGTH_ERROR,
            end=end,
            stored_length=stored_length,
        )
    if (stored_length == 18446744073709551615) and last:
        raise OriginalLengthError(
            "the last segment must carry the stored length", reason=Reason.ORIGINAL_LENGTH_ERROR, offset=offset
        )
    if (original_length == 18446744073709551615) and (not length_deferred):
        raise OriginalLengthError(
            "OriginalLength must be declared in every segment unless the LENGTH_DEFERRED header flag is set",
            reason=Reason.ORIGINAL_LENGTH_ERROR,
            offset=offset,
            msg_seq_number=msg_seq_number,
        )
    if last and ((original_length == 18446744073709551615) or (not has_message_checksum)):
        raise OriginalLengthError(
            "the last segment must carry the original length and the message checksum",
            reason=Reason.ORIGINAL_LENGTH_ERROR,
            offset=offset,
        )
    if (
        (codec == 0)
        and (original_length != 18446744073709551615)
        and (stored_length != 18446744073709551615)
        and (original_length != stored_length)
    ):
        raise OriginalLengthError(
            f"uncompressed message: original length {original_length} != stored length {stored_length}",
            reason=Reason.ORIGINAL_LENGTH_ERROR,
            original_length=original_length,
            stored_length=stored_length,
        )


def check_prefix(buf: Buffer, max_header_length: int = MAX_HEADER_LENGTH) -> int:
    """Check magic, version and header length (the first 10 bytes); return the latter.

    ``buf``: the bytes, from the header's first. ``max_header_length``: the longest header accepted, in bytes.
    """
    view = memoryview(buf)
    if view.ndim != 1 or view.itemsize != 1 or not view.c_contiguous:
        view = byte_view(view)
    if view.nbytes < 10:
        raise HeaderError("the prefix needs 10 bytes", reason=Reason.TRUNCATED)
    magic: bytes
    version: int
    header_length: int
    magic, version, _algorithm, _codec, _header_flags, header_length = _PREFIX.unpack_from(view)
    if magic != b"SGMT":
        raise HeaderError(f"bad magic {bytes(magic)!r}", reason=Reason.BAD_MAGIC)
    if version != 1:
        raise HeaderError(f"unsupported version {version}", reason=Reason.UNSUPPORTED_VERSION, version=version)
    if (header_length < 84) or (header_length > max_header_length):
        raise HeaderError(
            f"header length {header_length} outside {HEADER_LENGTH}..{max_header_length}",
            reason=Reason.HEADER_LENGTH_ERROR,
            header_length=header_length,
        )
    return header_length


def decode_header(
    buf: Buffer, *, max_message_size: int = MAX_LENGTH, max_header_length: int = MAX_HEADER_LENGTH
) -> SegmentHeader:
    """Parse and validate a header from the start of ``buf`` (data not needed).

    ``max_message_size``: the largest message the header may declare, in bytes. ``max_header_length``: the longest
    header accepted, in bytes.
    """
    view = memoryview(buf)
    if view.ndim != 1 or view.itemsize != 1 or not view.c_contiguous:
        view = byte_view(view)
    length = len(view)
    if length < 10:
        raise HeaderError(f"{length} bytes cannot hold a segment header", reason=Reason.TRUNCATED, length=length)
    magic: bytes
    version: int
    algorithm: int
    codec: int
    header_flags: int
    header_length: int
    reserved: int
    msg_flags: int
    group_id: bytes
    msg_seq_number: int
    data_length: int
    offset: int
    original_length: int
    stored_length: int
    data_checksum: int
    message_checksum: int
    # Every fixed field at once where the bytes hold them (one unpack per segment, not two); the
    # rules read only the prefix's fields until the header checksum passed. A shorter buffer: the
    # prefix alone, and the header rule (length >= header_length >= 84) refuses it first.
    if length >= 80:
        (
            magic,
            version,
            algorithm,
            codec,
            header_flags,
            header_length,
            reserved,
            msg_flags,
            group_id,
            msg_seq_number,
            data_length,
            offset,
            original_length,
            stored_length,
            data_checksum,
            message_checksum,
        ) = _FIXED.unpack_from(view)
    else:
        magic, version, algorithm, codec, header_flags, header_length = _PREFIX.unpack_from(view)
    if magic != b"SGMT":
        raise HeaderError(f"bad magic {bytes(magic)!r}", reason=Reason.BAD_MAGIC)
    if version != 1:
        raise HeaderError(f"unsupported version {version}", reason=Reason.UNSUPPORTED_VERSION, version=version)
    if (header_length < 84) or (header_length > max_header_length):
        raise HeaderError(
            f"header length {header_length} outside {HEADER_LENGTH}..{max_header_length}",
            reason=Reason.HEADER_LENGTH_ERROR,
            header_length=header_length,
        )
    if length < header_length:
        raise HeaderError(
            f"{length} bytes, header declares {header_length}",
            reason=Reason.TRUNCATED,
            length=length,
            header_length=header_length,
        )
    header_checksum = int.from_bytes(view[header_length - 4 : header_length], "big")
    header_crc = _HEADER_CRC(view[: header_length - 4], 0)
    if header_checksum != header_crc:
        raise ChecksumError(
            "header checksum mismatch", reason=Reason.HEADER_CHECKSUM_ERROR, expected=header_checksum, actual=header_crc
        )
    has_message_checksum = (header_flags & 1) != 0
    length_deferred = (header_flags & 2) != 0
    end = offset + data_length
    segmented = (msg_flags & (2 | 4)) != 0
    last = ((msg_flags & 4) != 0) or ((msg_flags & 2) == 0)
    if (reserved != 0) or ((header_flags & (~3)) != 0):
        raise HeaderError("reserved header bits are set", reason=Reason.RESERVED_FIELD_ERROR)
    if algorithm not in (1, 2):
        raise HeaderError(f"unknown checksum algorithm {algorithm}", reason=Reason.UNKNOWN_CHECKSUM)
    if codec not in (0, 1):
        raise HeaderError(f"unknown codec {codec}", reason=Reason.UNKNOWN_CODEC)
    if len(group_id) != 24:
        raise HeaderError("GroupId must be 24 bytes", reason=Reason.GROUP_ID_ERROR, length=len(group_id))
    if (msg_seq_number < 1) or (msg_seq_number > 999999999):
        raise SequenceError(
            f"MsgSeqNumber {msg_seq_number} outside 1..{MAX_SEQ_NUMBER}",
            reason=Reason.MSG_SEQ_NUMBER_ERROR,
            msg_seq_number=msg_seq_number,
        )
    if (msg_flags & (~31)) != 0:
        raise FlagsError(
            f"unknown MsgFlags bits 0x{msg_flags & ~KNOWN_FLAGS:x}", reason=Reason.MSG_FLAGS_ERROR, msg_flags=msg_flags
        )
    if (original_length != 18446744073709551615) and (original_length > max_message_size):
        raise MessageTooBigError(
            f"declared original_length {original_length} exceeds the limit {max_message_size}",
            reason=Reason.MSG_TOO_BIG,
            declared=original_length,
            limit=max_message_size,
            field="original_length",
        )
    if (stored_length != 18446744073709551615) and (stored_length > max_message_size):
        raise MessageTooBigError(
            f"declared stored_length {stored_length} exceeds the limit {max_message_size}",
            reason=Reason.MSG_TOO_BIG,
            declared=stored_length,
            limit=max_message_size,
            field="stored_length",
        )
    if end > max_message_size:
        raise MessageTooBigError(
            f"segment [{offset}, {end}) ends past the largest message allowed, {max_message_size}",
            reason=Reason.MSG_TOO_BIG,
            offset=offset,
            end=end,
            limit=max_message_size,
        )
    if (offset > 9223372036854775807) or (end > 9223372036854775807):
        raise OffsetError(f"offset {offset} out of range", reason=Reason.OFFSET_ERROR, offset=offset)
    if (not segmented) and (offset != 0):
        raise OffsetError("an unsegmented message must have offset 0", reason=Reason.OFFSET_ERROR, offset=offset)
    if (data_length == 0) and (not last):
        raise SegmentLengthZeroError(
            "only the last segment of a message may be empty",
            reason=Reason.SEGMENT_LENGTH_ZERO,
            offset=offset,
            msg_seq_number=msg_seq_number,
        )
    if (stored_length != 18446744073709551615) and (end > stored_length):
        raise OffsetError(
            f"segment [{offset}, {end}) runs past the stored length {stored_length}",
            reason=Reason.OFFSET_ERROR,
            offset=offset,
            end=end,
            stored_length=stored_length,
        )
    if (stored_length != 18446744073709551615) and last and (end != stored_length):
        raise OriginalLengthError(
            f"last segment ends at {end}, stored length is {stored_length}",
            reason=Reason.ORIGINAL_LENGTH_ERROR,
            end=end,
            stored_length=stored_length,
        )
    if (stored_length == 18446744073709551615) and last:
        raise OriginalLengthError(
            "the last segment must carry the stored length", reason=Reason.ORIGINAL_LENGTH_ERROR, offset=offset
        )
    if (original_length == 18446744073709551615) and (not length_deferred):
        raise OriginalLengthError(
            "OriginalLength must be declared in every segment unless the LENGTH_DEFERRED header flag is set",
            reason=Reason.ORIGINAL_LENGTH_ERROR,
            offset=offset,
            msg_seq_number=msg_seq_number,
        )
    if last and ((original_length == 18446744073709551615) or (not has_message_checksum)):
        raise OriginalLengthError(
            "the last segment must carry the original length and the message checksum",
            reason=Reason.ORIGINAL_LENGTH_ERROR,
            offset=offset,
        )
    if (
        (codec == 0)
        and (original_length != 18446744073709551615)
        and (stored_length != 18446744073709551615)
        and (original_length != stored_length)
    ):
        raise OriginalLengthError(
            f"uncompressed message: original length {original_length} != stored length {stored_length}",
            reason=Reason.ORIGINAL_LENGTH_ERROR,
            original_length=original_length,
            stored_length=stored_length,
        )
    extension = view[80 : header_length - 4].tobytes() if header_length > 84 else b""
    # tuple.__new__ directly: a NamedTuple's own __new__ is a Python function, called per segment
    header = _tuple_new(
        SegmentHeader,
        (
            group_id,
            msg_seq_number,
            offset,
            data_length,
            original_length,
            stored_length,
            msg_flags,
            _CODECS[codec],
            _ALGORITHMS[algorithm],
            data_checksum,
            message_checksum if has_message_checksum else None,
            header_length,
            length_deferred,
            extension,
        ),
    )
    return header


def decode_segment(
    buf: Buffer,
    *,
    max_segment_size: int = DEFAULT_MAX_SEGMENT_SIZE,
    max_message_size: int = MAX_LENGTH,
    verify: bool = True,
) -> Segment:
    """Decode one whole encoded segment; the data is a view into ``buf`` (no copy).

    The header's decoding is written out here again rather than called: a broker receive decodes one
    segment per delivery, and the call, a second flattening and the data checksum's two calls would be
    a tenth of it. The data checksum is compared here; ``verify_data`` explains a mismatch.

    ``max_segment_size``: the largest segment accepted, header included, in bytes. ``max_message_size``: the largest
    message the header may declare. ``verify``: True compares the data checksum; False skips it (for a caller that
    checks it later).
    """
    view = memoryview(buf)
    if view.ndim != 1 or view.itemsize != 1 or not view.c_contiguous:
        view = byte_view(view)
    length = len(view)
    max_header_length = MAX_HEADER_LENGTH
    if length > max_segment_size:
        raise MessageTooBigError(
            f"segment of {length} bytes exceeds the limit {max_segment_size}",
            reason=Reason.MSG_TOO_BIG_FOR_CHANNEL,
            length=length,
            limit=max_segment_size,
        )
    if length < 10:
        raise HeaderError(f"{length} bytes cannot hold a segment header", reason=Reason.TRUNCATED, length=length)
    magic: bytes
    version: int
    algorithm: int
    codec: int
    header_flags: int
    header_length: int
    reserved: int
    msg_flags: int
    group_id: bytes
    msg_seq_number: int
    data_length: int
    offset: int
    original_length: int
    stored_length: int
    data_checksum: int
    message_checksum: int
    # Every fixed field at once where the bytes hold them (one unpack per segment, not two); the
    # rules read only the prefix's fields until the header checksum passed. A shorter buffer: the
    # prefix alone, and the header rule (length >= header_length >= 84) refuses it first.
    if length >= 80:
        (
            magic,
            version,
            algorithm,
            codec,
            header_flags,
            header_length,
            reserved,
            msg_flags,
            group_id,
            msg_seq_number,
            data_length,
            offset,
            original_length,
            stored_length,
            data_checksum,
            message_checksum,
        ) = _FIXED.unpack_from(view)
    else:
        magic, version, algorithm, codec, header_flags, header_length = _PREFIX.unpack_from(view)
    if magic != b"SGMT":
        raise HeaderError(f"bad magic {bytes(magic)!r}", reason=Reason.BAD_MAGIC)
    if version != 1:
        raise HeaderError(f"unsupported version {version}", reason=Reason.UNSUPPORTED_VERSION, version=version)
    if (header_length < 84) or (header_length > max_header_length):
        raise HeaderError(
            f"header length {header_length} outside {HEADER_LENGTH}..{max_header_length}",
            reason=Reason.HEADER_LENGTH_ERROR,
            header_length=header_length,
        )
    if length < header_length:
        raise HeaderError(
            f"{length} bytes, header declares {header_length}",
            reason=Reason.TRUNCATED,
            length=length,
            header_length=header_length,
        )
    header_checksum = int.from_bytes(view[header_length - 4 : header_length], "big")
    header_crc = _HEADER_CRC(view[: header_length - 4], 0)
    if header_checksum != header_crc:
        raise ChecksumError(
            "header checksum mismatch", reason=Reason.HEADER_CHECKSUM_ERROR, expected=header_checksum, actual=header_crc
        )
    has_message_checksum = (header_flags & 1) != 0
    length_deferred = (header_flags & 2) != 0
    end = offset + data_length
    segmented = (msg_flags & (2 | 4)) != 0
    last = ((msg_flags & 4) != 0) or ((msg_flags & 2) == 0)
    if (reserved != 0) or ((header_flags & (~3)) != 0):
        raise HeaderError("reserved header bits are set", reason=Reason.RESERVED_FIELD_ERROR)
    if algorithm not in (1, 2):
        raise HeaderError(f"unknown checksum algorithm {algorithm}", reason=Reason.UNKNOWN_CHECKSUM)
    if codec not in (0, 1):
        raise HeaderError(f"unknown codec {codec}", reason=Reason.UNKNOWN_CODEC)
    if len(group_id) != 24:
        raise HeaderError("GroupId must be 24 bytes", reason=Reason.GROUP_ID_ERROR, length=len(group_id))
    if (msg_seq_number < 1) or (msg_seq_number > 999999999):
        raise SequenceError(
            f"MsgSeqNumber {msg_seq_number} outside 1..{MAX_SEQ_NUMBER}",
            reason=Reason.MSG_SEQ_NUMBER_ERROR,
            msg_seq_number=msg_seq_number,
        )
    if (msg_flags & (~31)) != 0:
        raise FlagsError(
            f"unknown MsgFlags bits 0x{msg_flags & ~KNOWN_FLAGS:x}", reason=Reason.MSG_FLAGS_ERROR, msg_flags=msg_flags
        )
    if (original_length != 18446744073709551615) and (original_length > max_message_size):
        raise MessageTooBigError(
            f"declared original_length {original_length} exceeds the limit {max_message_size}",
            reason=Reason.MSG_TOO_BIG,
            declared=original_length,
            limit=max_message_size,
            field="original_length",
        )
    if (stored_length != 18446744073709551615) and (stored_length > max_message_size):
        raise MessageTooBigError(
            f"declared stored_length {stored_length} exceeds the limit {max_message_size}",
            reason=Reason.MSG_TOO_BIG,
            declared=stored_length,
            limit=max_message_size,
            field="stored_length",
        )
    if end > max_message_size:
        raise MessageTooBigError(
            f"segment [{offset}, {end}) ends past the largest message allowed, {max_message_size}",
            reason=Reason.MSG_TOO_BIG,
            offset=offset,
            end=end,
            limit=max_message_size,
        )
    if (offset > 9223372036854775807) or (end > 9223372036854775807):
        raise OffsetError(f"offset {offset} out of range", reason=Reason.OFFSET_ERROR, offset=offset)
    if (not segmented) and (offset != 0):
        raise OffsetError("an unsegmented message must have offset 0", reason=Reason.OFFSET_ERROR, offset=offset)
    if (data_length == 0) and (not last):
        raise SegmentLengthZeroError(
            "only the last segment of a message may be empty",
            reason=Reason.SEGMENT_LENGTH_ZERO,
            offset=offset,
            msg_seq_number=msg_seq_number,
        )
    if (stored_length != 18446744073709551615) and (end > stored_length):
        raise OffsetError(
            f"segment [{offset}, {end}) runs past the stored length {stored_length}",
            reason=Reason.OFFSET_ERROR,
            offset=offset,
            end=end,
            stored_length=stored_length,
        )
    if (stored_length != 18446744073709551615) and last and (end != stored_length):
        raise OriginalLengthError(
            f"last segment ends at {end}, stored length is {stored_length}",
            reason=Reason.ORIGINAL_LENGTH_ERROR,
            end=end,
            stored_length=stored_length,
        )
    if (stored_length == 18446744073709551615) and last:
        raise OriginalLengthError(
            "the last segment must carry the stored length", reason=Reason.ORIGINAL_LENGTH_ERROR, offset=offset
        )
    if (original_length == 18446744073709551615) and (not length_deferred):
        raise OriginalLengthError(
            "OriginalLength must be declared in every segment unless the LENGTH_DEFERRED header flag is set",
            reason=Reason.ORIGINAL_LENGTH_ERROR,
            offset=offset,
            msg_seq_number=msg_seq_number,
        )
    if last and ((original_length == 18446744073709551615) or (not has_message_checksum)):
        raise OriginalLengthError(
            "the last segment must carry the original length and the message checksum",
            reason=Reason.ORIGINAL_LENGTH_ERROR,
            offset=offset,
        )
    if (
        (codec == 0)
        and (original_length != 18446744073709551615)
        and (stored_length != 18446744073709551615)
        and (original_length != stored_length)
    ):
        raise OriginalLengthError(
            f"uncompressed message: original length {original_length} != stored length {stored_length}",
            reason=Reason.ORIGINAL_LENGTH_ERROR,
            original_length=original_length,
            stored_length=stored_length,
        )
    extension = view[80 : header_length - 4].tobytes() if header_length > 84 else b""
    # tuple.__new__ directly: a NamedTuple's own __new__ is a Python function, called per segment
    header = _tuple_new(
        SegmentHeader,
        (
            group_id,
            msg_seq_number,
            offset,
            data_length,
            original_length,
            stored_length,
            msg_flags,
            _CODECS[codec],
            _ALGORITHMS[algorithm],
            data_checksum,
            message_checksum if has_message_checksum else None,
            header_length,
            length_deferred,
            extension,
        ),
    )
    if (length - header_length) < data_length:
        raise HeaderError(
            f"header declares {data_length} data bytes, {length - header_length} present",
            reason=Reason.TRUNCATED,
            declared=data_length,
            present=length - header_length,
        )
    if (length - header_length) > data_length:
        raise HeaderError(
            f"{length - header_length - data_length} bytes after the {data_length} data bytes the header declares",
            reason=Reason.TRAILING_BYTES,
            declared=data_length,
            present=length - header_length,
        )
    data = view[header_length:]
    if verify and _DATA_CRC[algorithm](data, 0) != data_checksum:
        verify_data(header, data)
    return _tuple_new(Segment, (header, data))
