"""Producer side: split payloads into segments, singly or as MQ logical groups.

API shape follows python-zstandard: one-shot functions (:func:`segment`,
:func:`segment_group`), a configured object (:class:`Segmenter`) and streaming
writers (:class:`MessageWriter`, :class:`GroupWriter`), all over one core.

``max_segment_size`` counts the 84-byte header: it is the size of what travels
through the pipe (MQ MAXMSGL, Kafka ``message.max.bytes``), so every encoded
segment is at most that long. In-memory payloads are sliced with memoryviews,
never copied; files are streamed in segment-sized reads and never read whole.

Whatever the input, only the last segment of a message carries the
whole-message checksum (docs/concepts/wire-format.md, "Where the message checksum is
carried"): a stream knows it only at its end, and one rule for every input
makes a payload in memory and the same payload read from a file give the same
segments. The optional SHA-256 / HMAC-SHA-256 of a ``digest`` policy follow the
same rule (header extension of the last segment); every segment's data is then
``max_segment_size - 84 - policy.extension_size()`` bytes, so the last one fits
too whatever its length.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import chain, repeat
from typing import BinaryIO

import zstandard

from .checksum import DEFAULT_ALGORITHM, ChecksumAlgorithm, checksum_function, combine, combine_run
from .digest import NO_POLICY, DigestPolicy
from .errors import FlagsError, OriginalLengthError, Reason, SegmentationError, SequenceError
from .flags import Codec, MsgFlags
from .sources import argument_error, byte_view, read_some
from .wire import (
    GROUP_ID_LENGTH,
    HEADER_LENGTH,
    MAX_LENGTH,
    MAX_SEQ_NUMBER,
    UNKNOWN_LENGTH,
    Buffer,
    Segment,
    SegmentHeader,
)

DEFAULT_SEGMENT_SIZE = 4 * 1024 * 1024  # IBM MQ's default MAXMSGL
# Plain ints: IntFlag arithmetic per segment costs microseconds.
_SEGMENT = MsgFlags.SEGMENT.value
_LAST_SEGMENT = MsgFlags.LAST_SEGMENT.value
_ANY_GROUP = MsgFlags.MSG_IN_GROUP.value | MsgFlags.LAST_MSG_IN_GROUP.value
_MIN_LEVEL, _MAX_LEVEL = -(1 << 17), zstandard.MAX_COMPRESSION_LEVEL  # zstd's negative (fast) levels to 22
Payload = Buffer | BinaryIO


def new_group_id() -> bytes:
    """A random 24-byte GroupId (MQ's size); 192 random bits never collide in practice."""
    return os.urandom(24)


def _group_flags(in_group: bool, last_in_group: bool) -> int:
    """IBM's convention: MSG_IN_GROUP on all but the last, LAST_MSG_IN_GROUP alone on the last."""
    if not in_group:
        return 0
    return MsgFlags.LAST_MSG_IN_GROUP if last_in_group else MsgFlags.MSG_IN_GROUP


_MAX_DATA = (1 << 32) - 1  # DataLength is a 4-byte field


def _checked_group_id(group_id: object) -> bytes:
    """A GroupId of exactly 24 bytes (the wire's field): a shorter one would be padded with NULs
    and a longer one cut, so two different ids could become one group on the wire."""
    if group_id is None:
        return new_group_id()
    if isinstance(group_id, (bytes, bytearray, memoryview)):
        gid = bytes(group_id)
        if len(gid) == GROUP_ID_LENGTH:
            return gid
    raise SegmentationError(
        f"GroupId must be {GROUP_ID_LENGTH} bytes", reason=Reason.GROUP_ID_ERROR, group_id=repr(group_id)[:80]
    )


def _checked_seq(msg_seq_number: object) -> int:
    if (
        isinstance(msg_seq_number, int)
        and not isinstance(msg_seq_number, bool)
        and 1 <= msg_seq_number <= MAX_SEQ_NUMBER
    ):
        return int(msg_seq_number)
    raise SequenceError(f"MsgSeqNumber {msg_seq_number!r} is not a whole number in 1..{MAX_SEQ_NUMBER}")


def _checked_group_flags(group_flags: object) -> int:
    """Only the group bits: the segment bits are the segmenter's to set, unknown bits no reader takes."""
    if isinstance(group_flags, int) and not isinstance(group_flags, bool) and not group_flags & ~_ANY_GROUP:
        return int(group_flags)
    raise FlagsError(
        f"group_flags may hold only MSG_IN_GROUP and LAST_MSG_IN_GROUP, not {group_flags!r}",
        group_flags=repr(group_flags)[:80],
    )


def _file_size(f: BinaryIO) -> int:
    """Bytes left in a seekable file, or UNKNOWN_LENGTH."""
    try:
        if not f.seekable():
            return UNKNOWN_LENGTH
        pos = f.tell()
        end = f.seek(0, io.SEEK_END)
        f.seek(pos)
        return end - pos
    except (OSError, ValueError):
        return UNKNOWN_LENGTH


@dataclass(frozen=True)
class Segmenter:
    """Configured segmenter.

    ``codec=Codec.ZSTD`` compresses the whole message before splitting (so the
    offsets are into the compressed body); the whole-message checksum is
    always over the original bytes, and so are the optional digests (``digest``).
    """

    max_segment_size: int = DEFAULT_SEGMENT_SIZE
    """Bytes per segment, header included: what the pipe carries at most in one message."""
    codec: Codec = Codec.NONE
    """How the whole message is compressed before it is split (``Codec.ZSTD``), or not at all."""
    level: int = 3
    """The compression level of ``codec`` (zstd's, 1 to 22)."""
    algorithm: ChecksumAlgorithm = DEFAULT_ALGORITHM
    """The checksum of every segment's data and of the whole message (CRC-32 by default, or CRC-32C)."""
    segmentation_allowed: bool = False
    """MQ's MQMF_SEGMENTATION_ALLOWED: whether a queue manager on the way may segment the message again."""
    digest: DigestPolicy = NO_POLICY
    """Adds a whole-message SHA-256 and/or an HMAC-SHA-256 to the last segment's header extension."""

    def __post_init__(self) -> None:
        if not isinstance(self.digest, DigestPolicy):
            raise argument_error(f"digest must be a DigestPolicy, not {type(self.digest).__name__}")
        header = HEADER_LENGTH + self.digest.extension_size()
        size = self.max_segment_size
        if not isinstance(size, int) or isinstance(size, bool) or not header < size <= header + _MAX_DATA:
            raise argument_error(
                f"max_segment_size must be a whole number above the {header}-byte header and at most"
                f" {header + _MAX_DATA} (a segment's DataLength is 4 bytes)",
                max_segment_size=repr(size)[:40],
                header_length=header,
            )
        try:
            object.__setattr__(self, "codec", Codec(self.codec))
        except ValueError:
            raise argument_error(f"unknown codec {self.codec!r}", codec=repr(self.codec)[:40]) from None
        level = self.level
        if not isinstance(level, int) or isinstance(level, bool) or not _MIN_LEVEL <= level <= _MAX_LEVEL:
            raise argument_error(
                f"zstd level must be a whole number in {_MIN_LEVEL}..{_MAX_LEVEL}", level=repr(level)[:40]
            )
        if not isinstance(self.segmentation_allowed, bool):
            raise argument_error("segmentation_allowed must be True or False")
        object.__setattr__(self, "algorithm", ChecksumAlgorithm.parse(self.algorithm))

    @property
    def data_size(self) -> int:
        """Data bytes per full segment (room kept for the last segment's digest extension)."""
        return self.max_segment_size - HEADER_LENGTH - self.digest.extension_size()

    def _compressor(self, size: int) -> zstandard.ZstdCompressionObj:
        """The one zstd frame writer for every input (``size`` -1 when unknown).

        Streaming compression gives the same frame however the input is fed, so
        a payload in memory and the same payload read from a file compress to
        the same body (the one-shot ``compress`` would give another frame).
        """
        return zstandard.ZstdCompressor(level=self.level).compressobj(size=size)

    def _base_flags(self, group_flags: int) -> int:
        return group_flags | (MsgFlags.SEGMENTATION_ALLOWED if self.segmentation_allowed else 0)

    def segment(
        self,
        payload: Payload,
        *,
        group_id: bytes | None = None,
        msg_seq_number: int = 1,
        group_flags: int = 0,
    ) -> Iterator[Segment]:
        """Split one logical message (bytes-like or binary file object). Arguments are checked here,
        before the first segment: a GroupId of another length than 24 bytes (2258), a MsgSeqNumber
        outside 1..999,999,999 (2250), flags other than the group bits (2249), a payload that is not
        bytes (9020).

        ``payload``: the message, bytes-like or a binary file object read to its end. ``group_id``: the 24-byte MQ
        GroupId of the segments (None: a random one). ``msg_seq_number``: the message's MsgSeqNumber in its group (1 for
        a message alone). ``group_flags``: the group bits of MsgFlags (MSG_IN_GROUP, LAST_MSG_IN_GROUP; 0 for a message
        alone).
        """
        gid = _checked_group_id(group_id)
        seq = _checked_seq(msg_seq_number)
        flags = _checked_group_flags(group_flags)
        if hasattr(payload, "read"):
            return self._segment_file(payload, gid, seq, flags)  # type: ignore[arg-type]
        return self._segment_buffer(byte_view(payload), gid, seq, flags)

    def _segment_buffer(self, view: memoryview, gid: bytes, seq: int, group_flags: int) -> Iterator[Segment]:
        crc = checksum_function(self.algorithm)
        if len(view) <= self.data_size and self.codec == Codec.NONE and not self.digest.extension_size():
            # One segment, nothing to compress, combine or sign: the same segment the general path
            # gives, at a seventh of its cost (a collector's batch is a group of many small messages).
            c = crc(view, 0)
            n = len(view)
            flags = int(self._base_flags(group_flags))
            yield Segment(
                SegmentHeader(gid, seq, 0, n, n, n, flags, self.codec, self.algorithm, c, c, HEADER_LENGTH, False, b""),
                view,
            )
            return
        extension = self.digest.sign((view,)).extension()
        if self.codec == Codec.ZSTD:
            message_crc: int | None = crc(view, 0)
            compressor = self._compressor(len(view))
            body = memoryview(compressor.compress(view) + compressor.flush())
        else:
            message_crc = None
            body = view
        size = self.data_size
        stored = len(body)
        count = max(1, -(-stored // size))
        final = count - 1
        # Per-segment work is done by C iterators (map/zip/repeat), not Python bytecode: at 64 KiB
        # segments the interpreter's per-segment cost, not the CRC, bounds the throughput.
        pieces = [body[i : i + size] for i in range(0, count * size, size)]  # beats map(slice, ...): no slice() calls
        crcs = list(map(crc, pieces, repeat(0)))
        last_length = len(pieces[final])
        if message_crc is None:  # from the piece CRCs: one pass over the data
            message_crc = (
                combine(self.algorithm, combine_run(self.algorithm, crcs[:final], size), crcs[final], last_length)
                if final
                else crcs[0]
            )
        base = int(self._base_flags(group_flags))
        mid = base | _SEGMENT if count > 1 else base
        last = base | _LAST_SEGMENT if count > 1 else base
        # tuple.__new__(cls, fields) builds the NamedTuples in C; their own __new__ is Python code.
        headers = map(
            tuple.__new__,
            repeat(SegmentHeader),
            zip(
                repeat(gid),
                repeat(seq),
                range(0, count * size, size),
                chain(repeat(size, final), (last_length,)),
                repeat(len(view)),
                repeat(stored),
                chain(repeat(mid, final), (last,)),
                repeat(self.codec),
                repeat(self.algorithm),
                crcs,
                chain(repeat(None, final), (message_crc,)),  # only the last segment carries it
                chain(repeat(HEADER_LENGTH, final), (HEADER_LENGTH + len(extension),)),
                repeat(False),
                chain(repeat(b"", final), (extension,)),  # digests: the last segment only
            ),
        )
        yield from map(tuple.__new__, repeat(Segment), zip(headers, pieces, strict=True))

    def _segment_file(self, f: BinaryIO, gid: bytes, seq: int, group_flags: int) -> Iterator[Segment]:
        writer = MessageWriter(
            self, group_id=gid, msg_seq_number=seq, group_flags=group_flags, original_length=_file_size(f)
        )
        read_size = max(self.data_size, 1 << 16)
        while chunk := read_some(f, read_size):
            yield from writer.write(chunk)
        yield from writer.close()

    def segment_group(self, payloads: Iterable[Payload], *, group_id: bytes | None = None) -> Iterator[Segment]:
        """Split several logical messages sent as one MQ group (MsgSeqNumber 1..n).

        ``payloads``: the messages, in order, each bytes-like or a binary file object. ``group_id``: the 24-byte GroupId
        they share (None: a random one).
        """
        writer = GroupWriter(self, group_id=group_id)
        it = iter(payloads)
        try:
            current = next(it)
        except StopIteration:
            raise SegmentationError("a group needs at least one message") from None
        for following in it:
            yield from writer.add(current)
            current = following
        yield from writer.add(current, last=True)

    def message_writer(self, *, group_id: bytes | None = None, original_length: int = UNKNOWN_LENGTH) -> MessageWriter:
        """A streaming writer for one message whose bytes arrive over time.

        ``group_id``: the 24-byte GroupId (None: a random one). ``original_length``: the message's length in bytes when
        known (UNKNOWN_LENGTH: not known; the last segment carries the exact length either way).
        """
        return MessageWriter(self, group_id=_checked_group_id(group_id), original_length=original_length)

    def group_writer(self, *, group_id: bytes | None = None) -> GroupWriter:
        """A writer that adds messages to one group as they are produced.

        ``group_id``: the 24-byte GroupId of every message added (None: a random one).
        """
        return GroupWriter(self, group_id=group_id)


class MessageWriter:
    """Streaming encoder for one message: ``write`` bytes, then ``close``.

    Segments are emitted as soon as they are full, except that the newest full
    one is held back until more data (or ``close``) shows whether it is the
    last. Lengths not known in advance are written as UNKNOWN_LENGTH; the
    last segment always carries the exact lengths and the message checksum,
    and only the last carries the checksum (the rule :meth:`Segmenter.segment`
    follows for in-memory payloads too, so every input gives the same segments).

    ``segmenter``: the settings (segment size, codec, checksum, digests) the segments are made with. ``group_id``: the
    24-byte GroupId. ``msg_seq_number``, ``group_flags``: the message's place in its group, as for
    :meth:`Segmenter.segment`. ``original_length``: the message's length when known, else UNKNOWN_LENGTH.
    """

    def __init__(
        self,
        segmenter: Segmenter,
        *,
        group_id: bytes,
        msg_seq_number: int = 1,
        group_flags: int = 0,
        original_length: int = UNKNOWN_LENGTH,
    ) -> None:
        if not isinstance(original_length, int) or isinstance(original_length, bool):
            raise argument_error(f"original_length must be a whole number, not {original_length!r}")
        if original_length != UNKNOWN_LENGTH and not 0 <= original_length <= MAX_LENGTH:
            raise OriginalLengthError(
                f"original_length {original_length} outside 0..{MAX_LENGTH}", original_length=original_length
            )
        self._s = segmenter
        self._gid = _checked_group_id(group_id)
        self._seq = _checked_seq(msg_seq_number)
        self._base = segmenter._base_flags(_checked_group_flags(group_flags))
        self._original_length = original_length
        self._deferred = original_length == UNKNOWN_LENGTH
        self._crc = checksum_function(segmenter.algorithm)
        self._signer = segmenter.digest.signer()
        self._message_crc = 0
        self._written = 0
        self._offset = 0
        self._pending = bytearray()
        self._closed = False
        self._compressor = (
            segmenter._compressor(-1 if original_length == UNKNOWN_LENGTH else original_length)
            if segmenter.codec == Codec.ZSTD
            else None
        )

    def _stored_length(self) -> int:
        return self._original_length if self._compressor is None else UNKNOWN_LENGTH

    def _emit(self, data: bytes, last: bool) -> Segment:
        single = last and self._offset == 0
        extension = self._signer.digests().extension() if last else b""
        flags = self._base if single else self._base | (MsgFlags.LAST_SEGMENT if last else MsgFlags.SEGMENT)
        header = SegmentHeader(
            group_id=self._gid,
            msg_seq_number=self._seq,
            offset=self._offset,
            data_length=len(data),
            original_length=self._written if last else self._original_length,
            stored_length=self._offset + len(data) if last else self._stored_length(),
            msg_flags=flags,
            codec=self._s.codec,
            algorithm=self._s.algorithm,
            data_checksum=self._crc(data, 0),
            message_checksum=self._message_crc if last else None,
            header_length=HEADER_LENGTH + len(extension),
            length_deferred=self._deferred,
            extension=extension,
        )
        self._offset += len(data)
        return Segment(header, data)

    def _drain(self) -> list[Segment]:
        size = self._s.data_size
        out = []
        while len(self._pending) > size:  # strictly more: keep one full segment back
            out.append(self._emit(bytes(self._pending[:size]), last=False))
            del self._pending[:size]
        return out

    def write(self, data: Buffer) -> list[Segment]:
        """Add message bytes; return the segments now complete.

        ``data``: the next bytes of the message, any bytes-like object, counted by bytes (not items); it is copied, so
        the buffer may be reused after the call.
        """
        if self._closed:
            raise SegmentationError("write after close")
        data = byte_view(data)  # its bytes, not its items: an array('I') view counts 4 per item
        self._message_crc = self._crc(data, self._message_crc)
        self._signer.update(data)
        self._written += len(data)
        if self._original_length != UNKNOWN_LENGTH and self._written > self._original_length:
            raise OriginalLengthError(
                f"{self._written} bytes written, {self._original_length} declared",
                written=self._written,
                declared=self._original_length,
            )
        self._pending += data if self._compressor is None else self._compressor.compress(data)
        return self._drain()

    def close(self) -> list[Segment]:
        """Finish the message: emit the remaining segments, the last one flagged."""
        if self._closed:
            return []
        self._closed = True
        if self._original_length != UNKNOWN_LENGTH and self._written != self._original_length:
            raise OriginalLengthError(
                f"{self._written} bytes written, {self._original_length} declared",
                written=self._written,
                declared=self._original_length,
            )
        if self._compressor is not None:
            self._pending += self._compressor.flush()
        out = self._drain()
        out.append(self._emit(bytes(self._pending), last=True))
        self._pending.clear()
        return out


class GroupWriter:
    """Adds logical messages to one group, MsgSeqNumber 1, 2, ...; flag the last with ``last=True``.

    ``segmenter``: the settings the segments are made with. ``group_id``: the 24-byte GroupId of the group (None: a
    random one).
    """

    def __init__(self, segmenter: Segmenter, *, group_id: bytes | None = None) -> None:
        self._s = segmenter
        self.group_id = _checked_group_id(group_id)
        self._next_seq = 1
        self._done = False

    def add(self, payload: Payload, *, last: bool = False) -> Iterator[Segment]:
        """Segments of the next message of the group. A payload refused here uses up no MsgSeqNumber
        (a retry takes the same number, so the group has no hole).

        ``payload``: the message, bytes-like or a binary file object. ``last``: True for the group's last message (its
        segments carry LAST_MSG_IN_GROUP).
        """
        if self._done:
            raise SequenceError("the group's last message was already added", msg_seq_number=self._next_seq)
        segments = self._s.segment(
            payload, group_id=self.group_id, msg_seq_number=self._next_seq, group_flags=_group_flags(True, last)
        )
        self._next_seq += 1
        self._done = last
        return segments


def segment(
    payload: Payload,
    max_segment_size: int = DEFAULT_SEGMENT_SIZE,
    *,
    codec: Codec = Codec.NONE,
    algorithm: ChecksumAlgorithm = DEFAULT_ALGORITHM,
    group_id: bytes | None = None,
    digest: DigestPolicy = NO_POLICY,
) -> list[Segment]:
    """One-shot: the segments of one payload.

    ``payload``: the message, bytes-like or a binary file object. ``max_segment_size``, ``codec``, ``algorithm``,
    ``digest``: as the :class:`Segmenter` fields of those names. ``group_id``: the 24-byte GroupId (None: a random one).
    """
    s = Segmenter(max_segment_size=max_segment_size, codec=codec, algorithm=algorithm, digest=digest)
    return list(s.segment(payload, group_id=group_id))


def segment_group(
    payloads: Iterable[Payload],
    max_segment_size: int = DEFAULT_SEGMENT_SIZE,
    *,
    codec: Codec = Codec.NONE,
    algorithm: ChecksumAlgorithm = DEFAULT_ALGORITHM,
    group_id: bytes | None = None,
    digest: DigestPolicy = NO_POLICY,
) -> list[Segment]:
    """One-shot: the segments of a logical group of messages.

    ``payloads``: the messages, in order. ``max_segment_size``, ``codec``, ``algorithm``, ``digest``: as the
    :class:`Segmenter` fields of those names. ``group_id``: the 24-byte GroupId they share (None: a random one).
    """
    s = Segmenter(max_segment_size=max_segment_size, codec=codec, algorithm=algorithm, digest=digest)
    return list(s.segment_group(payloads, group_id=group_id))


def write_segments(sink: BinaryIO, segments: Iterable[Segment]) -> int:
    """Write segments back to back (header, then data: no concatenation copy); return bytes written.

    ``sink``: a binary file object written to. ``segments``: the segments, written in the order given.
    """
    total = 0
    for seg in segments:
        total += sink.write(seg.header.pack()) + sink.write(seg.data)
    return total
