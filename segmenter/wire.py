"""The segment wire format, version 1 (specified in docs/concepts/wire-format.md).

A segment is an 84-byte big-endian header followed by the data. Big-endian
(network order) because the JVM reads it natively: Spark decodes headers in
SQL without a Python round trip. The header checksum is always CRC-32/IEEE so
any decoder, Spark SQL included, can verify it with a standard function.

Decoding validates everything before trusting anything: lengths are checked
against the buffer and the configured limits before any allocation, and every
failure is a :class:`~segmenter.errors.SegmentationError` subclass.

The fields and rules are one table, :mod:`segmenter.header_table`; ``check_prefix``,
``decode_header``, ``decode_segment`` and ``_check_header_fields`` are rendered from it into
``segmenter/_decoder.py`` (a committed module: ``python tools/render.py`` writes it), as the Spark
SQL is rendered at run time. Where the optional compiled decoder was built (``segmenter/_fastwire.c``,
from the same table), ``decode_segment`` is that one: same results, and the Python decoder raises
every error. This module is where callers import all of it from: the values and constants of
:mod:`segmenter.model`, the decoders, and the stream decoder and ``make_header`` defined here.
"""

from __future__ import annotations

import os
from typing import Any

from ._decoder import _ALGORITHMS, _CODECS, _DATA_CRC, check_prefix, decode_header, decode_segment
from ._decoder import _check_header_fields as _check_header_fields
from .buffers import Buffer
from .checksum import ChecksumAlgorithm, checksum
from .errors import HeaderError, MessageTooBigError, Reason
from .flags import Codec
from .model import (
    DEFAULT_MAX_SEGMENT_SIZE,
    GROUP_ID_LENGTH,
    HAS_MESSAGE_CHECKSUM,
    HEADER,
    HEADER_LENGTH,
    KNOWN_HEADER_FLAGS,
    LENGTH_DEFERRED,
    MAGIC,
    MAX_HEADER_LENGTH,
    MAX_LENGTH,
    MAX_SEQ_NUMBER,
    PREFIX_LENGTH,
    UNKNOWN_LENGTH,
    VERSION,
    Segment,
    SegmentHeader,
    table_constants,
    verify_data,
)

__all__ = [
    "COMPILED_DECODER",
    "DEFAULT_MAX_SEGMENT_SIZE",
    "GROUP_ID_LENGTH",
    "HAS_MESSAGE_CHECKSUM",
    "HEADER",
    "HEADER_LENGTH",
    "KNOWN_HEADER_FLAGS",
    "LENGTH_DEFERRED",
    "MAGIC",
    "MAX_HEADER_LENGTH",
    "MAX_LENGTH",
    "MAX_SEQ_NUMBER",
    "PREFIX_LENGTH",
    "UNKNOWN_LENGTH",
    "VERSION",
    "Buffer",
    "Segment",
    "SegmentHeader",
    "SegmentStreamDecoder",
    "check_prefix",
    "decode_header",
    "decode_segment",
    "make_header",
    "python_decode_segment",
    "table_constants",
    "verify_data",
]

python_decode_segment = decode_segment  # the rendered Python decoder: every error is raised by it


def _compiled_decoder() -> Any:
    """The optional compiled ``decode_segment`` (segmenter/_fastwire.c), or ``None`` when it was not
    built. It accepts what every rule of the same table accepts and hands anything else to
    :func:`python_decode_segment`, so only the speed differs: a broker receive decodes one segment
    per delivery, and decoding its header in Python is a fifth of that.
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
    """Build a header for ``data`` (computing its checksum unless given).

    ``group_id``: the 24-byte GroupId. ``msg_seq_number``: the message's MsgSeqNumber. ``offset``: where ``data`` starts
    in the stored message, in bytes. ``original_length``: the message's length before compression (UNKNOWN_LENGTH: not
    known). ``stored_length``: its length as stored, after compression (UNKNOWN_LENGTH: not known). ``msg_flags``: MQ's
    MsgFlags (segment and group bits). ``codec``: how the message is compressed. ``algorithm``: the checksum algorithm.
    ``message_checksum``: the whole message's checksum, on the last segment (None elsewhere). ``data_checksum``:
    ``data``'s checksum when already known (None: computed here).
    """
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

    ``max_message_size``: the largest message a header may declare, in bytes. ``verify``: True compares each segment's
    data checksum as it is decoded; False skips the comparison (for a caller that checks it later).
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
        """Add bytes; return every segment they complete.

        ``data``: the next bytes of the stream, any length (copied into the decoder's buffer).
        """
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
        if len(buf) < PREFIX_LENGTH:
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
