"""Building one candidate assembly and running every message-level check on it.

A message is copied exactly once, joined from its pieces at its stored
length (or written into a :class:`~reassembly.assembler.bodies.BodyStore`);
decompression never produces more than the declared original length.
The optional SHA-256 / HMAC-SHA-256 (the last piece's header extension) are
checked over the decoded payload after the message checksum: one more check
every candidate must pass, so a copy forged to every CRC fails here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO

import zstandard

from reassembly.assembler.bodies import BodyStore, MessageKey, StoredBody
from reassembly.assembler.events import ScatteredPayload
from reassembly.assembler.model import Facts, Piece
from segmenter.checksum import ChecksumAlgorithm, checksum, combine, combine_run
from segmenter.digest import NO_POLICY, DigestPolicy, Digests, Hasher, parse_extension
from segmenter.errors import ChecksumError, DecompressionError, MessageTooBigError, OriginalLengthError, Reason
from segmenter.flags import Codec
from segmenter.wire import UNKNOWN_LENGTH, Buffer

_WINDOW = 1 << 20  # bytes read or decompressed at a time for a body in a store
# A decompressed message is preallocated whole only up to this and when its zstd frame declares the
# length too (a forged header costs at most this); above it, or otherwise, chunks follow the output.
_PREALLOCATE = 64 << 20
_NOTHING_DECLARED = parse_extension(b"")  # what a last segment without extension declares (the usual case)

Built = memoryview | StoredBody | ScatteredPayload  # a built payload: one buffer, a stored body, or views


def build(
    key: MessageKey,
    facts: Facts,
    pieces: tuple[Piece, ...],
    max_message_size: int,
    bodies: BodyStore | None,
    digest: DigestPolicy = NO_POLICY,
    join: bool = True,
) -> Built:
    """The verified payload of a candidate (pieces tiling the stored body, facts agreeing); raises
    the first check that fails. ``join=False``: several uncompressed pieces stay as they are."""
    if facts.message_checksum is None or facts.original_length == UNKNOWN_LENGTH:
        raise OriginalLengthError("message has no original length or checksum", msg_seq_number=key[1])
    check = _DigestCheck(digest, pieces[-1].header.extension)
    if bodies is not None:
        return _build_stored(key, facts, pieces, bodies, max_message_size, check)
    return _build(key[1], facts, pieces, max_message_size, check, join)


class _DigestCheck:
    """The digests the candidate's last piece declares, checked as the policy says.

    ``hasher`` is None when there is nothing to compute (no digest declared that
    this reader can check, none demanded): the CRC-only path does no extra work.
    """

    __slots__ = ("declared", "hasher", "policy")

    def __init__(self, policy: DigestPolicy, extension: bytes) -> None:
        self.policy = policy
        self.declared: Digests = parse_extension(extension) if extension else _NOTHING_DECLARED
        checkable = self.declared.sha256 is not None or (policy.keyring is not None and self.declared.hmac is not None)
        demanded = policy.sha256 or policy.keyring is not None
        self.hasher: Hasher | None = policy.verifier(self.declared) if checkable or demanded else None

    def over(self, chunks: Iterable[Buffer]) -> None:
        """Check a whole payload given in chunks."""
        if self.hasher is not None:
            for chunk in chunks:
                self.hasher.update(chunk)
            self.finish()

    def finish(self) -> None:
        if self.hasher is not None:
            self.policy.check(self.declared, self.hasher.digests())


def _combined_checksum(facts: Facts, pieces: tuple[Piece, ...]) -> int:
    """The message checksum from the pieces' verified checksums: no second pass over the bytes.

    The leading run of pieces as long as the first (all but the last, as the Segmenter cuts) is
    folded by ``combine_run`` in one call; any piece after it is appended by ``combine``."""
    algorithm = facts.algorithm
    assert algorithm is not None
    size = pieces[0].header.data_length
    crcs: list[int] = []
    for p in pieces:
        if p.header.data_length != size:
            break
        crcs.append(p.header.data_checksum)
    value = combine_run(algorithm, crcs, size)
    for p in pieces[len(crcs) :]:
        value = combine(algorithm, value, p.header.data_checksum, p.header.data_length)
    return value


def _check_message(seq: int, facts: Facts, actual: int) -> None:
    if actual != facts.message_checksum:
        raise ChecksumError(
            f"message {seq} checksum mismatch",
            reason=Reason.MESSAGE_CHECKSUM_ERROR,
            expected=facts.message_checksum,
            actual=actual,
            msg_seq_number=seq,
        )


def _build(
    seq: int, facts: Facts, pieces: tuple[Piece, ...], max_message_size: int, check: _DigestCheck, join: bool
) -> memoryview | ScatteredPayload:
    """Join the pieces into one buffer, decode, verify the message checksum and digests."""
    if facts.codec == Codec.NONE:
        # Pieces were verified on arrival; combine their checksums before copying anything.
        _check_message(seq, facts, _combined_checksum(facts, pieces))
        check.over(p.data for p in pieces)
        if not join and len(pieces) > 1:
            return ScatteredPayload(tuple(p.data for p in pieces))
    if len(pieces) == 1:
        body = memoryview(pieces[0].data).toreadonly()
    else:
        # The pieces tile [0, stored length) in order (a candidate is a contiguous chain ending
        # with the LAST piece, which declares the stored length): one join is the one copy, into
        # memory that is never zeroed first (a bytearray of the length would be: one more pass).
        body = memoryview(b"".join([p.data for p in pieces]))
        assert len(body) == facts.stored_length
    if facts.codec == Codec.NONE:
        return body
    assert facts.algorithm is not None
    if facts.original_length <= _PREALLOCATE and _frame_declares(body, facts.original_length):
        out = bytearray(facts.original_length)
        _inflate(body, facts.original_length, max_message_size, _BufferSink(out))
        payload = memoryview(out).toreadonly()
    else:  # a size only a header says: memory follows what the frames really produce
        chunks = _ChunkSink()
        _inflate(body, facts.original_length, max_message_size, chunks)
        payload = chunks.payload()
    _check_message(seq, facts, checksum(facts.algorithm, payload))
    check.over((payload,))
    return payload


def _blocks(f: BinaryIO) -> Iterator[bytes]:
    """A stored body read back in windows (never whole)."""
    f.seek(0)
    while block := f.read(_WINDOW):
        yield block


def _build_stored(
    key: MessageKey,
    facts: Facts,
    pieces: tuple[Piece, ...],
    bodies: BodyStore,
    max_message_size: int,
    check: _DigestCheck,
) -> StoredBody:
    """As :func:`_build`, for a body in a store: the pieces are already there, nothing is copied
    into memory; a compressed body is decompressed from the store into the store."""
    assert facts.algorithm is not None
    placed = [(p.offset, p.data) for p in pieces]
    if facts.codec == Codec.NONE:
        actual = _combined_checksum(facts, pieces)
        _check_message(key[1], facts, actual)  # before any I/O: a failing combination costs nothing
        body = bodies.body(key, placed, facts.stored_length)
        check.over(_blocks(body))
        return StoredBody(bodies.place(key, actual, body), facts.stored_length, actual)
    body = bodies.body(key, placed, facts.stored_length)
    out = bodies.output(key)
    out.seek(0)
    out.truncate()
    sink = _FileSink(out, facts.algorithm, check.hasher)
    _inflate(body, facts.original_length, max_message_size, sink)
    _check_message(key[1], facts, sink.crc)
    check.finish()
    return StoredBody(bodies.place(key, sink.crc, out), facts.original_length, sink.crc)


class _BufferSink:
    """Decompressed bytes go straight into a preallocated buffer (no intermediate copy)."""

    def __init__(self, buf: bytearray) -> None:
        self._view = memoryview(buf)
        self._filled = 0

    def space(self, n: int) -> memoryview:
        return self._view[self._filled : self._filled + n]

    def commit(self, chunk: memoryview) -> None:
        self._filled += len(chunk)


def _frame_declares(body: Buffer, length: int) -> bool:
    """The (first) zstd frame's header declares exactly ``length`` decompressed bytes."""
    try:
        return bool(zstandard.get_frame_parameters(body).content_size == length)
    except zstandard.ZstdError:
        return False


class _ChunkSink:
    """Decompressed bytes into chunks allocated as output arrives (1 MiB, doubling to 64 MiB), joined
    at the end: a forged header declaring 1 GiB over a few bytes of garbage costs a megabyte, not a
    gigabyte, before the frame fails."""

    def __init__(self) -> None:
        self._full: list[memoryview] = []
        self._chunk = memoryview(bytearray(0))
        self._used = 0
        self._next = _WINDOW

    def space(self, n: int) -> memoryview:
        if self._used == len(self._chunk):
            if self._used:
                self._full.append(self._chunk)
            self._chunk, self._used = memoryview(bytearray(min(n, self._next))), 0
            self._next = min(2 * self._next, _PREALLOCATE)
        return self._chunk[self._used : self._used + n]

    def commit(self, chunk: memoryview) -> None:
        self._used += len(chunk)

    def payload(self) -> memoryview:
        parts = [*self._full, self._chunk[: self._used]]
        return parts[0].toreadonly() if len(parts) == 1 else memoryview(b"".join(parts))


class _FileSink:
    """Decompressed bytes go to a file through a 1 MiB window, checksummed (and hashed) on the way."""

    def __init__(self, out: Any, algorithm: ChecksumAlgorithm, hasher: Hasher | None) -> None:
        self._out = out
        self._window = memoryview(bytearray(_WINDOW))
        self._algorithm = algorithm
        self._hasher = hasher
        self.crc = 0

    def space(self, n: int) -> memoryview:
        return self._window[: min(n, len(self._window))]

    def commit(self, chunk: memoryview) -> None:
        self._out.write(chunk)
        self.crc = checksum(self._algorithm, chunk, self.crc)
        if self._hasher is not None:
            self._hasher.update(chunk)


def _inflate(
    body: Any, original_length: int, max_message_size: int, sink: _BufferSink | _ChunkSink | _FileSink
) -> None:
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
