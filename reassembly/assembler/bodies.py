"""Where the assembler keeps a message body too big for memory: the protocol and its handles.

The assembler stays sans-I/O: it decides *what* goes where (which piece is at
which offset, which copy wins, when a body is complete and verified) and a
:class:`BodyStore` does the I/O (the file store is
:mod:`reassembly.storage.filestore`: this module opens no file). Without a store every body is built in memory;
with one, each message the store ``wants`` is written piece by piece as
segments arrive, so memory holds only headers, whatever the message size.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, Protocol

from segmenter.wire import Buffer, SegmentHeader

MessageKey = tuple[bytes, int]  # GroupId, MsgSeqNumber


@dataclass(frozen=True)
class StoredBody:
    """A verified message that lives in a store: where, how long, and its checksum."""

    location: str
    length: int
    checksum: int


class BodyStore(Protocol):
    """The I/O side of large-message assembly (see :class:`FileBodyStore`)."""

    def wants(self, header: SegmentHeader) -> bool:
        """Keep the body of this header's message here instead of in memory."""
        ...

    def put(self, key: MessageKey, offset: int | None, data: Buffer) -> Any:
        """Keep a verified piece: at ``offset`` in the body, or aside (``None``: a conflicting copy).

        Returns what the assembler holds instead of the bytes: it must compare equal to
        a buffer with the same bytes and give them back with ``bytes()``.
        """
        ...

    def body(self, key: MessageKey, pieces: Sequence[tuple[int, Any]], length: int) -> BinaryIO:
        """The stored body (readable, at position 0) with exactly these pieces at these offsets."""
        ...

    def output(self, key: MessageKey) -> BinaryIO:
        """A writable file for the decoded (decompressed) message."""
        ...

    def place(self, key: MessageKey, checksum: int, content: BinaryIO) -> str:
        """Where the verified message (whose checksum is ``checksum``, whose bytes ``content``
        holds) will be once finished: what output rows point at, and where :meth:`finish` puts it."""
        ...

    def finish(self, key: MessageKey, decoded: bool) -> None:
        """Make the delivered message visible at its location (the body, or the decoded output)."""
        ...

    def discard(self, key: MessageKey) -> None:
        """Forget everything kept for a message that failed or was given up."""
        ...


class StoredPiece(Protocol):
    """A piece a store kept in its files: read back on demand, never held in memory by the handle."""

    length: int
    kept: bool

    def __bytes__(self) -> bytes: ...

    def blocks(self, size: int) -> Iterator[bytes]:
        """Its bytes, at most ``size`` at a time."""
        ...


@dataclass(frozen=True)
class StoredOriginal:
    """The original bytes of a segment of a failed stored message, left where its store kept them.

    ``head`` is the header as received; the data stays in the store's files (a
    :class:`FileBodyStore` with ``keep_failed``) until :meth:`FileBodyStore.purge`, so a
    consumer can copy a failed message of any size out block by block instead of holding it.
    """

    head: bytes
    data: StoredPiece

    @staticmethod
    def of(head: Buffer, data: object) -> StoredOriginal | None:
        """A handle for a piece whose store keeps it past a failure; None for any other piece."""
        return StoredOriginal(bytes(head), data) if getattr(data, "kept", False) is True else None  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self.head) + self.data.length

    def __bytes__(self) -> bytes:
        return self.head + bytes(self.data)

    def blocks(self, size: int) -> Iterator[bytes]:
        """The whole segment (header, then data), at most ``size`` data bytes at a time."""
        yield self.head
        yield from self.data.blocks(size)
