"""Building one candidate assembly and running every message-level check on it.

A message is copied exactly once, into a buffer preallocated at its stored
length (or written into a :class:`~reassembly.bodies.BodyStore`);
decompression never produces more than the declared original length.
"""

from __future__ import annotations

from typing import Any

import zstandard

from segmenter.checksum import ChecksumAlgorithm, Combiner, checksum
from segmenter.errors import ChecksumError, DecompressionError, MessageTooBigError, OriginalLengthError, Reason
from segmenter.flags import Codec
from segmenter.wire import UNKNOWN_LENGTH

from .bodies import BodyStore, MessageKey, StoredBody
from .model import Facts, Piece


def build(
    key: MessageKey, facts: Facts, pieces: tuple[Piece, ...], max_message_size: int, bodies: BodyStore | None
) -> memoryview | StoredBody:
    """The verified payload of a candidate (pieces tiling the stored body, facts agreeing); raises
    the first check that fails."""
    if facts.message_checksum is None or facts.original_length == UNKNOWN_LENGTH:
        raise OriginalLengthError("message has no original length or checksum", msg_seq_number=key[1])
    if bodies is not None:
        return _build_stored(key, facts, pieces, bodies, max_message_size)
    return _build(key[1], facts, pieces, max_message_size)


def _combined_checksum(facts: Facts, pieces: tuple[Piece, ...]) -> int:
    """The message checksum from the pieces' verified checksums: no second pass over the bytes."""
    assert facts.algorithm is not None
    hot = pieces[0].header.data_length if len(pieces) > 2 else 0
    combiner = Combiner(facts.algorithm, hot)
    for p in pieces:
        combiner.add(p.header.data_checksum, p.header.data_length)
    return combiner.value


def _check_message(seq: int, facts: Facts, actual: int) -> None:
    if actual != facts.message_checksum:
        raise ChecksumError(
            f"message {seq} checksum mismatch",
            reason=Reason.MESSAGE_CHECKSUM_ERROR,
            expected=facts.message_checksum,
            actual=actual,
            msg_seq_number=seq,
        )


def _build(seq: int, facts: Facts, pieces: tuple[Piece, ...], max_message_size: int) -> memoryview:
    """Copy the pieces into one preallocated buffer, decode, verify the message checksum."""
    if facts.codec == Codec.NONE:
        # Pieces were verified on arrival; combine their checksums before copying anything.
        _check_message(seq, facts, _combined_checksum(facts, pieces))
    if len(pieces) == 1:
        body = memoryview(pieces[0].data).toreadonly()
    else:
        buf = bytearray(facts.stored_length)
        for p in pieces:
            buf[p.offset : p.end] = p.data
        body = memoryview(buf).toreadonly()
    if facts.codec == Codec.NONE:
        return body
    assert facts.algorithm is not None
    out = bytearray(facts.original_length)
    _inflate(body, facts.original_length, max_message_size, _BufferSink(out))
    payload = memoryview(out).toreadonly()
    _check_message(seq, facts, checksum(facts.algorithm, payload))
    return payload


def _build_stored(
    key: MessageKey, facts: Facts, pieces: tuple[Piece, ...], bodies: BodyStore, max_message_size: int
) -> StoredBody:
    """As :func:`_build`, for a body in a store: the pieces are already there, nothing is copied
    into memory; a compressed body is decompressed from the store into the store."""
    assert facts.algorithm is not None
    placed = [(p.offset, p.data) for p in pieces]
    if facts.codec == Codec.NONE:
        actual = _combined_checksum(facts, pieces)
        _check_message(key[1], facts, actual)  # before any I/O: a failing combination costs nothing
        bodies.body(key, placed, facts.stored_length)
        return StoredBody(bodies.location(key), facts.stored_length, actual)
    body = bodies.body(key, placed, facts.stored_length)
    out = bodies.output(key)
    out.seek(0)
    out.truncate()
    sink = _FileSink(out, facts.algorithm)
    _inflate(body, facts.original_length, max_message_size, sink)
    _check_message(key[1], facts, sink.crc)
    return StoredBody(bodies.location(key), facts.original_length, sink.crc)


class _BufferSink:
    """Decompressed bytes go straight into a preallocated buffer (no intermediate copy)."""

    def __init__(self, buf: bytearray) -> None:
        self._view = memoryview(buf)
        self._filled = 0

    def space(self, n: int) -> memoryview:
        return self._view[self._filled : self._filled + n]

    def commit(self, chunk: memoryview) -> None:
        self._filled += len(chunk)


class _FileSink:
    """Decompressed bytes go to a file through a 1 MiB window, checksummed on the way."""

    def __init__(self, out: Any, algorithm: ChecksumAlgorithm) -> None:
        self._out = out
        self._window = memoryview(bytearray(1 << 20))
        self._algorithm = algorithm
        self.crc = 0

    def space(self, n: int) -> memoryview:
        return self._window[: min(n, len(self._window))]

    def commit(self, chunk: memoryview) -> None:
        self._out.write(chunk)
        self.crc = checksum(self._algorithm, chunk, self.crc)


def _inflate(body: Any, original_length: int, max_message_size: int, sink: _BufferSink | _FileSink) -> None:
    """zstd, bounded: never more output than the declared original length, wherever it goes."""
    if original_length > max_message_size:
        raise MessageTooBigError(
            f"original length {original_length} above the limit {max_message_size}",
            declared=original_length,
            limit=max_message_size,
        )
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(body, read_across_frames=True)
        filled = 0
        while filled < original_length:
            space = sink.space(original_length - filled)
            n = reader.readinto(space)
            if n == 0:
                break
            sink.commit(space[:n])
            filled += n
        extra = reader.read(1)
    except zstandard.ZstdError as exc:
        raise DecompressionError(f"zstd: {exc}") from None
    if filled != original_length or extra:
        raise DecompressionError(
            f"decompressed size differs from the declared original length {original_length}",
            reason=Reason.DECOMPRESSION_ERROR,
            declared=original_length,
            produced=filled + len(extra),
        )
