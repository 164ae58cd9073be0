"""Receiver side, like MQ's receiving exit: write each chunk into its object under a root.

File adapter over the sans-I/O :class:`~refmsg.core.ObjectState`. Under
``root/.refmsg/objects/`` every object in transfer has a part file
(``<key>.part``, the bytes so far, sparse) and a journal (``<key>.journal``,
see :mod:`refmsg.journal`); ``<key>`` is the hex ObjectInstanceId (or a hash of
the name when the sender left it zero). Per chunk:

1. decode and verify the message (header checksum, chunk checksum);
2. plan it against the state: offsets, LAST, object length and checksum;
3. compare the bytes that overlap applied ranges with the part file: any
   difference is a :class:`ConflictError` and nothing is written;
4. ``pwrite`` the new bytes, ``fsync`` the part, append RANGE (and OBJECT)
   records to the journal and ``fsync`` it: only then is the range applied.

When LAST has arrived and every byte is covered, the part file is re-read and
its checksum compared with the whole-object checksum, fsync'd, renamed to its
final name (atomically, never following a symlink) and the directory
fsync'd; a DONE record ends the journal. A receiver killed anywhere resumes
from the journal: applied ranges are never re-applied, unjournaled bytes are
simply written again.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple, Protocol

from segmenter.checksum import DEFAULT_ALGORITHM, ChecksumAlgorithm, checksum
from segmenter.digest import NO_POLICY, DigestPolicy, parse_extension
from segmenter.errors import ChecksumError, ConflictError, Reason, SegmentationError

from .core import DEFAULT_MAX_OBJECT_SIZE, ObjectState, Plan, Span, verify_chunk
from .errors import JournalError, PathError
from .integrity import ObjectCheck
from .journal import (
    ConflictRecord,
    DigestsRecord,
    DoneRecord,
    JournalFile,
    ObjectRecord,
    OpenRecord,
    RangeRecord,
    Record,
    read_journal,
)
from .message import ReferenceMessage, decode_message
from .paths import RESERVED, check_final, open_parent, open_root, split_name

Buffer = bytes | bytearray | memoryview
Clock = Callable[[], float]
_READ = 1 << 20
_JOURNAL = ".journal"
_PART = ".part"


class RangeSource(Protocol):
    """Where header-only reference messages point: shared storage read by range."""

    def read_range(self, env: str, name: str, offset: int, length: int) -> bytes: ...


class DirectorySource:
    """A shared directory as a :class:`RangeSource`; names are confined like destination names.

    ``root``: the shared directory the ranges are read from.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.fspath(root)

    def read_range(self, env: str, name: str, offset: int, length: int) -> bytes:
        parts = split_name(name)
        root_fd = open_root(self.root, create=False)
        try:
            dir_fd = open_parent(root_fd, parts, create=False)
            try:
                fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
            except OSError as exc:
                raise PathError(f"cannot open source {name!r}: {exc.strerror}", name=name) from None
            finally:
                os.close(dir_fd)
            try:
                size = os.fstat(fd).st_size  # before reading: a forged length must not size a buffer
                data = os.pread(fd, max(0, min(length, size - offset)), offset)
            finally:
                os.close(fd)
        finally:
            os.close(root_fd)
        if len(data) != length:
            raise SegmentationError(
                f"source {name!r} holds {len(data)} bytes at {offset}, {length} referenced",
                reason=Reason.TRUNCATED,
                offset=offset,
                length=length,
            )
        return data


class Outcome(Enum):
    """What a chunk did."""

    APPLIED = "applied"  # new bytes written and journaled
    DUPLICATE = "duplicate"  # every byte already applied and identical: nothing written
    COMPLETED = "completed"  # this chunk finished the object; it is visible under its name
    ALREADY_COMPLETE = "already_complete"  # the object was finished earlier; nothing written


class Receipt(NamedTuple):
    """What one chunk did to its object."""

    outcome: Outcome
    """What the chunk did: applied, a duplicate, completed the object, or came after it was complete."""
    name: str
    """The object's name (the name it is written under once complete)."""
    key: str
    """The transfer's key (its ObjectInstanceId in hex, else derived from its name)."""
    offset: int
    """Where the chunk starts in the object, in bytes."""
    length: int
    """Bytes of data the chunk carries."""
    written: int
    """New bytes written by this chunk."""
    path: str | None = None
    """The final path, once complete."""


class IncompleteObject(NamedTuple):
    """An object still in transfer, for reports and purging."""

    key: str
    """The transfer's key (its ObjectInstanceId in hex, else derived from its name), naming its journal file."""
    name: str
    """The object's name (the name it is written under once complete)."""
    first_seen: float
    """When its first chunk was journaled, in the receiver clock's seconds."""
    last_seen: float
    """When its latest chunk was journaled, in the receiver clock's seconds."""
    applied: int
    """Bytes of the object applied so far, each offset counted once."""
    object_length: int | None
    """The object's length, once the LAST chunk (or another declaring one) arrived; None until then."""
    last_arrived: bool
    """Whether the chunk flagged LAST has arrived."""
    gaps: tuple[Span, ...]
    """The byte ranges missing up to the object's length (or the largest end seen when it is not known)."""
    conflict: bool = False
    """Two verified copies of a chunk differ: it will never be delivered."""

    def age(self, now: float) -> float:
        """Seconds since its first chunk arrived, at ``now`` (on the receiver's clock)."""
        return now - self.first_seen


def object_key(instance_id: bytes, name: str) -> str:
    """File-name-safe identity of one transfer."""
    if any(instance_id):
        return instance_id.hex()
    return "n-" + hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:48]


@dataclass
class _Open:
    state: ObjectState
    journal: JournalFile
    part_fd: int  # -1 once done
    instance_id: bytes
    done: bool = False
    first_seen: float = 0.0


def _record_state(name: str, records: tuple[Record, ...], max_object_size: int) -> tuple[ObjectState, bool, float]:
    """Rebuild an object's state from its journal: (state, done, first_seen)."""
    if not records or not isinstance(records[0], OpenRecord):
        raise JournalError(f"journal of {name!r} does not start with OPEN")
    head = records[0]
    state = ObjectState(head.name, head.algorithm, max_object_size)
    done = False
    for record in records[1:]:
        if isinstance(record, RangeRecord):
            state.applied.add(record.offset, record.offset + record.length)
        elif isinstance(record, ObjectRecord):
            state.note(record.last, record.object_length, record.object_checksum)
        elif isinstance(record, ConflictRecord):
            state.conflict = True
        elif isinstance(record, DigestsRecord):
            state.note_digests(parse_extension(record.extension))
        elif isinstance(record, DoneRecord):
            state.note(True, record.object_length, record.object_checksum or state.object_checksum)
            state.applied.add(0, record.object_length)
            done = True
    return state, done, head.at


class Receiver:
    """Writes reference-message chunks into objects under ``root``; crash-safe and idempotent.

    One receiver per root at a time (an advisory lock enforces it). ``clock``
    stamps journal records and measures ages; ``source`` serves header-only
    messages; ``require_integrity`` refuses messages without the integrity
    block (and objects without a whole-object checksum); ``max_age`` (seconds)
    is the default age past which :meth:`incomplete` reports and :meth:`purge`
    deletes unfinished objects.

    ``root``: the directory objects are written under. ``digest``: the SHA-256 / HMAC-SHA-256 an object must carry, and
    the keys to check them. ``max_object_size``: the largest object accepted, in bytes. ``replace_existing``: True
    replaces a finished object already at the destination; False refuses the object instead (PathError). ``fsync``: True
    makes each applied range, journal record and rename durable before it counts as done.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        clock: Clock = time.time,
        require_integrity: bool = True,
        digest: DigestPolicy = NO_POLICY,
        source: RangeSource | None = None,
        max_object_size: int = DEFAULT_MAX_OBJECT_SIZE,
        replace_existing: bool = True,
        max_age: float | None = None,
        fsync: bool = True,
    ) -> None:
        self.root = os.fspath(root)
        self.max_age = max_age
        self.clock = clock
        self.require_integrity = require_integrity
        self.digest = digest
        self.source = source
        self.max_object_size = max_object_size
        self.replace_existing = replace_existing
        self._fsync = fsync
        self._open: dict[str, _Open] = {}
        self._root_fd = open_root(self.root)
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(RESERVED, 0o700, dir_fd=self._root_fd)
            self._meta_fd = open_parent(self._root_fd, (RESERVED, "x"), create=False)
            with contextlib.suppress(FileExistsError):
                os.mkdir("objects", 0o700, dir_fd=self._meta_fd)
            self._objects_fd = open_parent(self._meta_fd, ("objects", "x"), create=False)
            self._lock_fd = os.open("lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600, dir_fd=self._meta_fd)
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise SegmentationError(
                    f"another receiver holds {self.root!r}", reason=Reason.STATE_ERROR, root=self.root
                ) from None
        except BaseException:
            os.close(self._root_fd)
            raise

    # -- lifecycle ---------------------------------------------------------------------------------

    def close(self) -> None:
        for entry in self._open.values():
            self._close_entry(entry)
        self._open.clear()
        for fd in (self._lock_fd, self._objects_fd, self._meta_fd, self._root_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._root_fd = -1

    def __enter__(self) -> Receiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _close_entry(entry: _Open) -> None:
        entry.journal.close()
        if entry.part_fd >= 0:
            os.close(entry.part_fd)
            entry.part_fd = -1

    # -- receiving ---------------------------------------------------------------------------------

    def receive(self, message: Buffer | ReferenceMessage, *, encoding: int | None = None) -> Receipt:
        """Apply one reference message (encoded bytes or decoded); raise on anything wrong.

        ``message``: the reference message, its encoded bytes or decoded. ``encoding``: the MQMD Encoding of the
        header's integers, for encoded bytes (None: the header's own).
        """
        verified = not isinstance(message, ReferenceMessage)  # decode_message checks carried data
        if not isinstance(message, ReferenceMessage):
            message = decode_message(message, encoding=encoding, require_integrity=self.require_integrity).message
        elif message.integrity is None and self.require_integrity:
            raise ChecksumError("the message carries no integrity block", reason=Reason.HEADER_CHECKSUM_ERROR)
        rmh, integrity = message.header, message.integrity
        name = rmh.dest_name or rmh.src_name
        parts = split_name(name)
        data: Buffer = message.data
        if message.header_only:
            if self.source is None:
                raise SegmentationError(
                    f"header-only message for {name!r} and no source configured", reason=Reason.STATE_ERROR
                )
            data = self.source.read_range(
                rmh.src_env, rmh.src_name or name, rmh.data_logical_offset, rmh.data_logical_length
            )
        algorithm = integrity.algorithm if integrity is not None else DEFAULT_ALGORITHM
        if integrity is not None and (message.header_only or not verified):
            verify_chunk(algorithm, data, integrity.chunk_checksum, rmh.data_logical_offset)
        key = object_key(rmh.object_instance_id, name)
        entry = self._entry(key, name, rmh.object_instance_id, algorithm)
        state = entry.state
        if state.name != name:
            raise ConflictError(
                f"ObjectInstanceId {key} names {state.name!r}, this chunk names {name!r}", key=key, name=name
            )
        if integrity is not None and integrity.algorithm != state.algorithm:
            raise ConflictError(
                f"object {name!r} uses {state.algorithm.name}, this chunk {integrity.algorithm.name}", key=key
            )
        has_object = integrity is not None and integrity.has_object
        try:
            plan = state.plan(
                rmh.data_logical_offset,
                len(data),
                last=rmh.is_last,
                object_length=integrity.object_length if has_object and integrity else None,
                object_checksum=integrity.object_checksum if has_object and integrity else None,
            )
            if entry.done:
                return self._redelivered(entry, plan, data, parts, key)
            self._compare(entry.part_fd, plan, data, name)
            new_digests = integrity is not None and state.note_digests(integrity.digests)
        except ConflictError:
            if not entry.done and not state.conflict:
                # Two verified copies differ: no CRC can tell which is genuine, so neither is delivered.
                entry.journal.append([ConflictRecord(self.clock(), rmh.data_logical_offset, len(data))])
                state.conflict = True
            raise
        records: list[Record] = []
        now = self.clock()
        view = memoryview(data)
        for span in plan.write:
            piece = view[span.start - plan.offset : span.end - plan.offset]
            _pwrite_all(entry.part_fd, piece, span.start)
            records.append(RangeRecord(now, span.start, span.length, checksum(state.algorithm, piece)))
        if plan.write and self._fsync:
            os.fsync(entry.part_fd)
        declares = (plan.last and not state.last_arrived) or (
            (plan.object_length is not None and state.object_length is None)
            or (plan.object_checksum is not None and state.object_checksum is None)
        )
        if declares:
            records.append(ObjectRecord(now, plan.last, plan.object_length, plan.object_checksum))
        if new_digests:
            records.append(DigestsRecord(now, state.digests.extension()))
        entry.journal.append(records)
        state.commit(plan)
        written = sum(s.length for s in plan.write)
        if state.complete:
            path = self._finish(entry, parts, key)
            return Receipt(Outcome.COMPLETED, name, key, plan.offset, plan.length, written, path)
        outcome = Outcome.APPLIED if plan.write else Outcome.DUPLICATE
        return Receipt(outcome, name, key, plan.offset, plan.length, written)

    def _entry(self, key: str, name: str, instance_id: bytes, algorithm: ChecksumAlgorithm) -> _Open:
        entry = self._open.get(key)
        if entry is not None:
            return entry
        journal = JournalFile(self._objects_fd, key + _JOURNAL, fsync=self._fsync)
        try:
            records = journal.replay.records
            if not records:
                now = self.clock()
                journal.append([OpenRecord(now, algorithm, instance_id, name)])
                records = (OpenRecord(now, algorithm, instance_id, name),)
            state, done, first_seen = _record_state(name, records, self.max_object_size)
            part_fd = -1
            if not done:
                flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
                exists = _exists(self._objects_fd, key + _PART)
                if not exists and state.applied.total:
                    if state.complete and self._recover_renamed(state, split_name(state.name), journal):
                        done = True
                    else:
                        raise JournalError(
                            f"part file of {state.name!r} vanished with {state.applied.total} bytes journaled",
                            key=key,
                        )
                if not done:
                    part_fd = os.open(key + _PART, flags, 0o644, dir_fd=self._objects_fd)  # becomes the object
                    if self._fsync and not exists:
                        os.fsync(self._objects_fd)
        except BaseException:
            journal.close()
            raise
        entry = _Open(state, journal, part_fd, instance_id, done, first_seen)
        if done:  # finished objects are not kept open: their journal on disk remembers them
            journal.close()
            return entry
        self._open[key] = entry
        if not done and state.complete:  # killed after the last range was journaled, before the rename
            self._finish(entry, split_name(state.name), key)
        return entry

    def _compare(self, fd: int, plan: Plan, data: Buffer, name: str) -> None:
        view = memoryview(data)
        for span in plan.compare:
            have = os.pread(fd, span.length, span.start)
            if have != view[span.start - plan.offset : span.end - plan.offset]:
                raise ConflictError(
                    f"object {name!r}: bytes [{span.start}, {span.end}) differ from those applied; nothing written",
                    offset=plan.offset,
                    start=span.start,
                    end=span.end,
                )

    def _redelivered(self, entry: _Open, plan: Plan, data: Buffer, parts: tuple[str, ...], key: str) -> Receipt:
        """A chunk of a finished object: compare with the final file when it is still there."""
        name = entry.state.name
        try:
            dir_fd = open_parent(self._root_fd, parts, create=False)
        except PathError as exc:
            if exc.details.get("missing"):
                return Receipt(Outcome.ALREADY_COMPLETE, name, key, plan.offset, plan.length, 0)
            raise
        try:
            if not check_final(dir_fd, parts[-1], name):
                return Receipt(Outcome.ALREADY_COMPLETE, name, key, plan.offset, plan.length, 0)
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
            try:
                self._compare(fd, plan._replace(compare=(Span(plan.offset, plan.offset + plan.length),)), data, name)
            finally:
                os.close(fd)
        finally:
            os.close(dir_fd)
        return Receipt(Outcome.DUPLICATE, name, key, plan.offset, plan.length, 0)

    def _verify_object(self, fd: int, state: ObjectState) -> int:
        """Checksum of the first object_length bytes of ``fd``; raise when it is not the declared one."""
        assert state.object_length is not None
        if state.object_checksum is None and self.require_integrity:
            raise ChecksumError(
                f"object {state.name!r}: no whole-object checksum arrived", reason=Reason.MESSAGE_CHECKSUM_ERROR
            )
        check = ObjectCheck(state.algorithm, state.object_checksum, state.digests, self.digest)
        pos = 0
        while pos < state.object_length:
            block = os.pread(fd, min(_READ, state.object_length - pos), pos)
            if not block:
                break
            check.update(block)
            pos += len(block)
        if pos != state.object_length:
            raise ChecksumError(f"object {state.name!r}: file holds {pos} bytes", reason=Reason.MESSAGE_CHECKSUM_ERROR)
        return check.finish()

    def _finish(self, entry: _Open, parts: tuple[str, ...], key: str) -> str:
        state = entry.state
        assert state.object_length is not None
        os.ftruncate(entry.part_fd, state.object_length)
        crc = self._verify_object(entry.part_fd, state)
        if self._fsync:
            os.fsync(entry.part_fd)
        dir_fd = open_parent(self._root_fd, parts, create=True)
        try:
            if check_final(dir_fd, parts[-1], state.name) and not self.replace_existing:
                raise PathError(f"destination {state.name!r} already exists", name=state.name)
            os.rename(key + _PART, parts[-1], src_dir_fd=self._objects_fd, dst_dir_fd=dir_fd)
            if self._fsync:
                os.fsync(dir_fd)
                os.fsync(self._objects_fd)
        finally:
            os.close(dir_fd)
        entry.journal.append([DoneRecord(self.clock(), state.object_length, crc)])
        entry.done = True
        self._close_entry(entry)
        self._open.pop(key, None)
        return os.path.join(self.root, *parts)

    def _recover_renamed(self, state: ObjectState, parts: tuple[str, ...], journal: JournalFile) -> bool:
        """Killed between the rename and the DONE record: the final file is the object."""
        try:
            dir_fd = open_parent(self._root_fd, parts, create=False)
        except PathError:
            return False
        try:
            if not check_final(dir_fd, parts[-1], state.name):
                return False
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
        try:
            if os.fstat(fd).st_size != state.object_length:
                return False
            crc = self._verify_object(fd, state)
        except ChecksumError:
            return False
        finally:
            os.close(fd)
        assert state.object_length is not None
        journal.append([DoneRecord(self.clock(), state.object_length, crc)])
        return True

    # -- housekeeping ------------------------------------------------------------------------------

    def _journals(self) -> Iterator[str]:
        for entry in os.scandir(self._objects_fd):
            if entry.name.endswith(_JOURNAL):
                yield entry.name[: -len(_JOURNAL)]

    def _age_limit(self, older_than: float | None) -> float:
        if older_than is not None:
            return older_than
        if self.max_age is None:
            raise SegmentationError("no age given and no max_age configured", reason=Reason.STATE_ERROR)
        return self.max_age

    def incomplete(self, older_than: float | None = None) -> list[IncompleteObject]:
        """Objects still in transfer whose first chunk arrived at least ``older_than`` seconds ago.

        ``older_than`` defaults to the configured ``max_age``, or 0 (every unfinished object).
        """
        older_than = older_than if older_than is not None else (self.max_age or 0.0)
        now = self.clock()
        out: list[IncompleteObject] = []
        for key in sorted(self._journals()):
            replay = read_journal(self._objects_fd, key + _JOURNAL)
            if not replay.records:
                continue
            state, done, first_seen = _record_state(key, replay.records, self.max_object_size)
            if done or now - first_seen < older_than:
                continue
            out.append(
                IncompleteObject(
                    key,
                    state.name,
                    first_seen,
                    replay.records[-1].at,
                    state.applied.total,
                    state.object_length,
                    state.last_arrived,
                    tuple(state.gaps()),
                    state.conflict,
                )
            )
        return out

    def purge(self, older_than: float | None = None) -> list[IncompleteObject]:
        """Delete incomplete objects at least ``older_than`` (default ``max_age``) seconds old; return them."""
        stale = self.incomplete(self._age_limit(older_than))
        for item in stale:
            entry = self._open.pop(item.key, None)
            if entry is not None:
                self._close_entry(entry)
            for suffix in (_PART, _JOURNAL):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(item.key + suffix, dir_fd=self._objects_fd)
        if stale and self._fsync:
            os.fsync(self._objects_fd)
        return stale

    def forget_completed(self) -> int:
        """Drop the journals of finished objects (re-deliveries then start a new transfer)."""
        count = 0
        for key in list(self._journals()):
            replay = read_journal(self._objects_fd, key + _JOURNAL)
            if replay.records and isinstance(replay.records[-1], DoneRecord):
                entry = self._open.pop(key, None)
                if entry is not None:
                    self._close_entry(entry)
                os.unlink(key + _JOURNAL, dir_fd=self._objects_fd)
                count += 1
        return count


def _exists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _pwrite_all(fd: int, data: Buffer, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written
