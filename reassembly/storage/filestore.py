"""The file store: message bodies written piece by piece into files as their segments arrive.

The I/O half of :mod:`reassembly.assembler.bodies`: the assembler decides what goes where and
this store writes it, so memory holds only headers whatever the message size.
"""

from __future__ import annotations

import errno
import os
import stat
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from reassembly.assembler.bodies import MessageKey
from segmenter.buffers import same_bytes
from segmenter.errors import Reason, SegmentationError
from segmenter.wire import Buffer, SegmentHeader


class FilePiece:
    """A piece kept in a file: compared and read back on demand (duplicates, quarantine).

    ``kept``: its store keeps it past a failure, so a failed message's originals can be
    handed out as :class:`StoredOriginal` handles instead of read back into memory. It holds
    its file (not a descriptor number: once the store purged the file, a number could name
    another file the process opened since, and a read would return its bytes).
    """

    __slots__ = ("file", "kept", "length", "position")

    def __init__(self, file: BinaryIO, position: int, length: int, kept: bool = False) -> None:
        self.file, self.position, self.length, self.kept = file, position, length, kept

    def _read(self, size: int, at: int) -> bytes:
        try:
            return os.pread(self.file.fileno(), size, at)
        except (ValueError, OSError) as exc:  # ValueError: the file was closed (purged)
            raise SegmentationError(
                f"stored piece unreadable (its store was purged or its file is gone): {exc}", reason=Reason.STORE_ERROR
            ) from None

    def __bytes__(self) -> bytes:
        return self._read(self.length, self.position)

    def blocks(self, size: int) -> Iterator[bytes]:
        """Its bytes, at most ``size`` at a time."""
        for at in range(0, self.length, size):
            yield self._read(min(size, self.length - at), self.position + at)

    def __len__(self) -> int:
        return self.length

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FilePiece):
            return bytes(self) == bytes(other)
        try:
            view = memoryview(other)  # type: ignore[arg-type]
        except TypeError:
            return NotImplemented
        return view.nbytes == self.length and same_bytes(bytes(self), view)

    __hash__ = None  # type: ignore[assignment]


@dataclass
class _Files:
    body: BinaryIO
    aside: BinaryIO | None = None
    decoded: BinaryIO | None = None
    at: dict[int, FilePiece] = field(default_factory=dict)  # the piece whose bytes are at each body offset
    final: str | None = None  # the name place() gave it


def _store_error(what: str, exc: OSError) -> SegmentationError:
    return SegmentationError(f"{what}: {exc}", reason=Reason.STORE_ERROR, errno=exc.errno)


def _holds(path: Path, content: BinaryIO, block: int = 1 << 20) -> bool | None:
    """What is at ``path``: None nothing; True a regular file with ``content``'s bytes (compared
    through the descriptors, no file position moves); False anything else: other bytes, a
    directory, a link, a FIFO or device, a file this process cannot open or read. A name holding
    anything but the same bytes is taken: the store never replaces, follows or opens for writing
    what it did not put there. The other file is opened without following a link and without
    blocking (a FIFO put there since the ``lstat``), and compared only if it is still a regular file."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    fd = content.fileno()
    if not stat.S_ISREG(st.st_mode) or st.st_size != os.fstat(fd).st_size:
        return False
    try:
        there = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(there).st_mode):
            return False
        for at in range(0, st.st_size, block):
            try:
                theirs = os.pread(there, block, at)
            except OSError:
                return False
            if not same_bytes(theirs, os.pread(fd, block, at)):
                return False
    finally:
        os.close(there)
    return True


def _put_in_place(done: BinaryIO, target: Path) -> None:
    """Give the work file its final name without replacing anything but the same bytes: another
    writer in the directory may have put something there since :meth:`FileBodyStore.place` found
    the name free (a crafted same-CRC body and a race), and a rename would replace it silently. A
    link never replaces anything; the same bytes there (a retried or replayed delivery) go to the
    rename, as does every body on a file system without hard links."""
    try:
        os.link(done.name, target)
    except FileExistsError:
        if _holds(target, done) is False:
            raise FileExistsError(errno.EEXIST, "another writer put something else there", str(target)) from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
    else:
        os.unlink(done.name)
        return
    os.replace(done.name, target)


class FileBodyStore:
    """Bodies as files under ``directory``: ``<GroupId hex>-<MsgSeqNumber>-<checksum>.bin`` once verified.

    Work in progress is written to names with ``token`` (unique per writer, e.g. a Spark task
    attempt) and renamed into place only when the message is verified, so two attempts
    never corrupt each other and a reader never sees a partial file.

    Which bodies come here goes by *declared* sizes (a few bytes of zstd can declare and
    decode to gigabytes; decompression is bounded by the declared original length, so a
    header that lies only makes its message fail): a message declaring more than
    ``threshold`` bytes (or deferring its length) is stored. ``inline`` bounds the total the
    others may leave in memory: a message whose declared size would take the bodies kept in
    memory since the last :meth:`release` above ``inline`` is stored too, so a batch of
    medium messages (or an MQ group of them) holds at most ``inline`` decoded bytes however
    many there are. ``None``: no such bound.

    ``keep_failed``: the files of a discarded (failed) message stay until :meth:`purge`, and its
    pieces come back from the assembler's failure events as :class:`StoredOriginal` handles
    (``stored``) instead of bytes read back: the caller copies them out, then purges.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        token: str,
        threshold: int = 0,
        inline: int | None = None,
        keep_failed: bool = False,
    ) -> None:
        self.directory = Path(directory)
        self.token = token
        self.threshold = threshold  # messages declaring more than this (or deferring their length) go to files
        self.inline = inline
        self.keep_failed = keep_failed
        self._failed: list[tuple[MessageKey, _Files]] = []  # discarded, kept until purge (keep_failed)
        self._open: dict[MessageKey, _Files] = {}
        self._in_memory: dict[MessageKey, int] = {}  # declared size of each body left in memory
        self._in_memory_total = 0

    def place(self, key: MessageKey, checksum: int, content: BinaryIO) -> str:
        """``<GroupId hex>-<MsgSeqNumber>-<checksum, 8 hex>.bin``: a replay of the same delivery
        gets the same name, a later message under the same GroupId and number (a stream reusing a
        GroupId after its tombstone left) another one; without the checksum its body replaced the
        earlier delivery's file, which committed rows still named. A checksum is no protection (a
        body can be made to match any CRC), so a file already there under the name with other bytes
        keeps it, as does anything else there (a directory, a link, a FIFO, a file it cannot read):
        this body takes the first free ``-2``, ``-3``, ... name (or one holding the same bytes: the
        replay of that one)."""
        stem = f"{key[0].hex()}-{key[1]}-{checksum & 0xFFFFFFFF:08x}"
        name, n = f"{stem}.bin", 1
        try:
            content.flush()
            while _holds(self.directory / name, content) is False:
                n += 1
                name = f"{stem}-{n}.bin"
        except OSError as exc:
            raise _store_error(f"cannot compare {name} with the message", exc) from None
        self._files(key).final = name
        return name

    def _create(self, key: MessageKey, kind: str) -> BinaryIO:
        """A new work file: a name no other open has used (the token, then random), created
        exclusively (``x``: never through a link or over a file someone planted under a name
        derived from a GroupId they chose: that wrote outside the directory; nor over the kept
        files of an earlier, failed attempt at the same message)."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            name = f".{key[0].hex()}-{key[1]}.{kind}-{self.token}-{uuid.uuid4().hex[:12]}"
            return open(self.directory / name, "x+b")
        except OSError as exc:
            raise _store_error("cannot create a work file", exc) from None

    def _files(self, key: MessageKey) -> _Files:
        files = self._open.get(key)
        if files is None:
            files = self._open[key] = _Files(self._create(key, "part"))
        return files

    def wants(self, header: SegmentHeader) -> bool:
        if header.length_deferred or header.original_length > self.threshold:
            return True
        if self.inline is None:
            return False
        key = (header.group_id, header.msg_seq_number)
        more = header.original_length - self._in_memory.get(key, 0)  # a later segment may declare more
        if more <= 0:
            return False
        if self._in_memory_total + more > self.inline:
            return True
        self._in_memory[key] = header.original_length
        self._in_memory_total += more
        return False

    def release(self) -> None:
        """The bodies left in memory so far have been handed on: count ``inline`` from zero again."""
        self._in_memory.clear()
        self._in_memory_total = 0

    def put(self, key: MessageKey, offset: int | None, data: Buffer) -> Any:
        files = self._files(key)
        if offset is None:
            return self._aside(key, files, data)
        try:
            os.pwrite(files.body.fileno(), data, offset)
        except OSError as exc:
            raise _store_error("cannot write a body", exc) from None
        piece = files.at[offset] = FilePiece(files.body, offset, len(memoryview(data)), self.keep_failed)
        return piece

    def _aside(self, key: MessageKey, files: _Files, data: Buffer) -> FilePiece:
        if files.aside is None:
            files.aside = self._create(key, "aside")
        try:
            position = files.aside.seek(0, os.SEEK_END)
            files.aside.write(data)
            files.aside.flush()
        except OSError as exc:
            raise _store_error("cannot write an aside file", exc) from None
        return FilePiece(files.aside, position, len(memoryview(data)), self.keep_failed)

    def body(self, key: MessageKey, pieces: Sequence[tuple[int, Any]], length: int) -> BinaryIO:
        files = self._files(key)
        for offset, piece in pieces:
            if files.at.get(offset) is piece:
                continue
            # Another copy won: keep the displaced bytes of every piece the winner overlaps (the
            # caller still holds their handles, e.g. to quarantine them), then put the winner in place.
            self._displace(key, files, offset, offset + piece.length, keep=piece)
            os.pwrite(files.body.fileno(), bytes(piece), offset)
            files.at[offset] = piece
        self._displace(key, files, length, 1 << 63)  # the body is cut at ``length``
        files.body.truncate(length)
        files.body.seek(0)
        return files.body

    def _displace(self, key: MessageKey, files: _Files, start: int, end: int, keep: FilePiece | None = None) -> None:
        """Move aside the pieces in the body at ``start`` or overlapping [start, end) (their handles follow)."""
        for at, occupant in list(files.at.items()):
            if occupant is not keep and (at == start or (at < end and start < at + occupant.length)):
                moved = self._aside(key, files, bytes(occupant))
                occupant.file, occupant.position = moved.file, moved.position
                del files.at[at]

    def output(self, key: MessageKey) -> BinaryIO:
        files = self._files(key)
        if files.decoded is None:
            files.decoded = self._create(key, "decoded")
        return files.decoded

    def finish(self, key: MessageKey, decoded: bool) -> None:
        files = self._open[key]
        done = files.decoded if decoded else files.body
        assert done is not None and files.final is not None  # placed when it was verified
        target = self.directory / files.final
        try:
            done.flush()
            os.fsync(done.fileno())
            _put_in_place(done, target)
        except OSError as exc:  # e.g. a disk error, or a race lost: the files stay open, owned
            raise _store_error(f"cannot put {files.final} in place", exc) from None
        del self._open[key]  # only once it is in place: the pieces' files stay open until then
        self._close(key, files, keep=done)

    def discard(self, key: MessageKey) -> None:
        files = self._open.pop(key, None)
        if files is None:
            return
        if self.keep_failed:
            self._failed.append((key, files))
        else:
            self._close(key, files, keep=None)

    def purge(self) -> None:
        """Drop the files of failed messages kept since the last purge (their handles are dead after)."""
        failed, self._failed = self._failed, []
        for key, files in failed:
            self._close(key, files, keep=None)

    def _close(self, key: MessageKey, files: _Files, keep: BinaryIO | None) -> None:
        for f in (files.body, files.aside, files.decoded):
            if f is not None:
                f.close()
                if f is not keep:
                    Path(f.name).unlink(missing_ok=True)

    def close(self) -> None:
        """Discard every body still open (their messages were reported, not delivered)."""
        for key in list(self._open):
            self.discard(key)
        self.purge()
