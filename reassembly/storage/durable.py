"""The durable collector: the :class:`~reassembly.collector.core.Collector` core over a database and batch files.

The order of writes is what makes every message land in exactly one batch file:

1. **store**: an input's messages are written in one transaction (with the input's name, so a
   re-read input is stored once); only then is the input acknowledged (the landing file is
   marked done). A crash before the commit loses nothing: the input is read again.
2. **claim**: a closed batch is recorded with its members packed in its row, and their message
   rows deleted, in one transaction, only while this collector holds the destination's lease
   and only if every member's row is still there (not taken by another batch). From here the
   batch's content is fixed in the database.
3. **emit**: the batch is written as ``OUTPUT/<target>/<batch_id>.parquet`` (a temporary file,
   fsync, rename, fsync of the directory): the name and the bytes follow from the claim
   (the GroupId is derived from the batch id), so writing it again gives the same file.
4. **mark**: once the directory is synced, the batch is marked emitted and its packed members
   dropped (in the commit of the next claim, or at the next tick).

A crash between 2 and 4 leaves a claimed, unemitted batch: whoever holds the destination's
lease next (this collector restarted, or another one once the lease expired) emits it again
from the database, under the same name; if the file is already there it is kept. A message
is therefore never lost (stored before acknowledged, deleted only after its batch file is in
place) and never in two batches (a row is moved once, and the file name is the batch's).

A write that fails (the target directory cannot be made, the disk refuses, the batch cannot be
segmented) is counted in the batch's row and tried again at every lease renewal; the other
batches, of this destination and of the others, go on. After the rule's ``max_attempts`` the
batch is dead: its messages are written to the dead-letter directory (``<OUTPUT>.dead-letter/
<target>/<batch_id>.parquet``, the landing columns ``destination`` and ``payload``, so the file
can be landed again once the cause is fixed) and its row is marked dead with the reason and the
attempts (:meth:`~reassembly.storage.collector.Storage.dead_batches` lists them).

A destination's batch can be forced out now: in this process with :meth:`DurableCollector.force`,
and in a running collector through a request row (``Storage.request_flush``), which the lease
holder picks up at its next :meth:`DurableCollector.tick` (every poll).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple
from urllib.parse import quote

from reassembly._errors import first_line
from reassembly._files import fsync_path
from reassembly.collector.core import BatchReady, Cause, Collector, Rule, batch_segments
from reassembly.storage.collector import DeadBatch, RuleCache, Storage
from segmenter.producer import Segmenter

_MAX_NAME = 200  # bytes of a percent-encoded name kept whole
_log = logging.getLogger(__name__)


def safe_name(text: str) -> str:
    """A file-name component for a target or destination: percent-encoded, never empty, ``.`` or ``..``,
    and at most 200 bytes (file systems refuse names over 255: one such target blocked every batch).
    A longer one keeps its first 150 bytes and ends with ``%%`` and 40 hex digits of its SHA-256:
    ``%%`` never occurs in percent-encoding, so it cannot equal another target's name."""
    name = quote(text, safe="-_.")
    if len(name) > _MAX_NAME:
        return f"{name[:150]}%%{hashlib.sha256(text.encode('utf-8', 'surrogatepass')).hexdigest()[:40]}"
    return name if name.strip(".") else f"%2E{name}"


def batch_path(output: Path, target: str, batch_id: str) -> Path:
    return output / safe_name(target) / f"{safe_name(batch_id)}.parquet"


def write_batch(output: Path, batch: BatchReady, segmenter: Segmenter, *, sync_dir: bool = True) -> Path:
    """The batch as a Parquet file of encoded segments (column ``segment``), atomically; kept if present.

    ``sync_dir=False`` leaves the directory's fsync (which makes the rename durable) to the
    caller, who may sync once for several files before recording them as emitted.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = batch_path(output, batch.rule.target, batch.batch_id)
    if path.exists():  # an earlier attempt got as far as the rename: same claim, same content
        return path
    segments = [s.encode() for s in batch_segments(batch, segmenter)]
    # No compression or statistics: segments of small messages are mostly unique bytes, and the
    # file is read whole by the job that reassembles it.
    table = pa.table({"segment": pa.array(segments, pa.binary())})
    _put(path, lambda tmp: pq.write_table(table, tmp, compression="none", write_statistics=False), sync_dir)
    return path


def dead_letter_dir(output: Path) -> Path:
    """Where dead batches go: ``<OUTPUT>.dead-letter`` beside the output (not inside it, so a job
    reading ``OUTPUT/<target>`` never sees them)."""
    output = Path(os.path.abspath(output))
    return output.with_name(f"{output.name}.dead-letter")


def write_dead_letter(directory: Path, batch: BatchReady) -> Path:
    """The batch's messages as a landing file (``destination``, ``payload``, and ``received_at``), atomically."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = batch_path(directory, batch.rule.target, batch.batch_id)
    table = pa.table(
        {
            "destination": pa.array([batch.destination] * len(batch.messages), pa.string()),
            "payload": pa.array([m.payload for m in batch.messages], pa.binary()),
            "received_at": pa.array([m.received_at for m in batch.messages], pa.float64()),
        }
    )
    _put(path, lambda tmp: pq.write_table(table, tmp), sync_dir=True)
    return path


def _put(path: Path, write: Callable[[Path], None], sync_dir: bool) -> None:
    """``write`` to a temporary name beside ``path``, fsync, rename; no temporary file left on failure."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        fsync_path(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    if sync_dir:
        fsync_path(path.parent)


class DurableCollector:
    """One collector process: a lease holder over some destinations of a shared database.

    Times are wall-clock seconds (``clock``): received times are stored and compared across
    processes. ``lease`` is how long a silent collector keeps its destinations; ``sync_every``
    how often leases are renewed, new work is looked for and failed writes are tried again
    (well under ``lease``). ``on_dead`` hears of each batch moved to the dead letter
    (``dead_letter``, by default :func:`dead_letter_dir` of ``output``); without it, each is
    logged as an error.
    """

    def __init__(
        self,
        storage: Storage,
        output: Path,
        *,
        segmenter: Segmenter | None = None,
        owner: str | None = None,
        lease: float = 30.0,
        rules_ttl: float = 5.0,
        clock: Callable[[], float] = time.time,
        on_batch: Callable[[BatchReady, Path], None] | None = None,
        on_dead: Callable[[DeadBatch], None] | None = None,
        dead_letter: Path | None = None,
    ) -> None:
        self.storage = storage
        self.output = output
        self.dead_letter = dead_letter or dead_letter_dir(output)
        self.owner = owner or f"{os.uname().nodename}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.lease = lease
        self.sync_every = lease / 3
        self.rules = RuleCache(storage.read_rules, rules_ttl, clock)
        self._clock = clock
        self._segmenter = segmenter or Segmenter()
        self._on_batch = on_batch
        self._on_dead = on_dead
        self.core = Collector(self.rules, clock)
        self.leased: set[str] = set()
        self._synced = float("-inf")
        self.emitted = 0
        self.dead: list[DeadBatch] = []  # the batches this collector moved to the dead letter
        self._retry: dict[str, BatchReady] = {}  # claimed batches whose write failed, by id
        self._unmarked: list[str] = []  # batch files in place, not yet marked emitted
        self._dirs: set[Path] = set()  # their directories, to fsync before the mark

    def ingest(self, name: str, messages: Sequence[tuple[str, bytes]]) -> bool:
        """Store one input durably (the acknowledgement), then batch what this collector holds leases for.

        False if the input was stored before (by this or another collector). Messages of
        destinations leased elsewhere are left to their lease holder.
        """
        now = self._clock()
        ids = self.storage.store(name, messages, now)
        if ids is None:
            return False
        ready: list[BatchReady] = []
        unleased = False
        for msg_id, (destination, payload) in zip(ids, messages, strict=True):
            if destination in self.leased:
                ready += self.core.add(destination, msg_id, payload, received_at=now)
            else:
                unleased = True
        self._emit(ready)
        if unleased:
            self.sync()
        return True

    def sync(self) -> None:
        """Renew and take leases; emit what earlier holders claimed but did not emit; load their open messages."""
        now = self._clock()
        self._synced = now
        leased = self.storage.acquire(self.owner, now, self.lease)
        for lost in self.leased - leased:
            self.core.drop(lost)  # their messages stay in the database for the new holder
        retry = [b for b in self._retry.values() if b.destination in leased]  # the rest: the new holder's
        self._retry = {}
        gained = leased - self.leased
        self.leased = leased
        for batch in retry:
            self._write(batch)
        retried = {b.batch_id for b in retry}
        for record in self.storage.unemitted(gained):
            if record.batch_id in retried:
                continue
            members = tuple(self.storage.members(record.batch_id))
            rule = Rule(record.destination, record.target)
            self._write(BatchReady(record.destination, record.batch_id, members, Cause(record.cause), rule))
        ready: list[BatchReady] = []
        for destination in sorted(leased):
            fresh = self.storage.open_messages(destination, self.core.held_ids(destination))
            if fresh:
                ready += self.core.restore(destination, fresh)
        self._emit(ready)

    def tick(self) -> None:
        """Close what is due and what a flush request asks for; renew leases and look for work every
        ``sync_every`` seconds."""
        if self._clock() - self._synced >= self.sync_every:
            self.sync()
        self._emit(self.core.tick())
        for destination, upto in self.storage.flush_requests().items():
            if destination in self.leased:  # else its lease holder's (or the next one's) to do
                self._force(destination, upto)
        self.settle()

    def force(self, destination: str) -> int:
        """Close ``destination``'s batch now (cause ``forced``), with every message of it stored so far,
        if this collector holds its lease; the number of batches written."""
        if destination not in self.leased:
            return 0
        before = self.emitted
        self._force(destination, None)
        self.settle()
        return self.emitted - before

    def _force(self, destination: str, upto: int | None) -> None:
        """Load the destination's messages stored elsewhere, then close its batch if it holds one up to ``upto``."""
        fresh = self.storage.open_messages(destination, self.core.held_ids(destination))
        ready = self.core.restore(destination, fresh) if fresh else []
        held = self.core.held_ids(destination)
        if held and (upto is None or min(held) <= upto):
            ready += self.core.force(destination)
        self._emit(ready)

    def flush(self) -> None:
        """Close every open batch now (cause ``shutdown``)."""
        self._emit(self.core.close())
        self.settle()

    def stop(self) -> None:
        """A clean stop: give the leases back; open batches stay in the database for the next holder."""
        self.settle()
        self.storage.release(self.owner)
        self.leased = set()

    def _emit(self, batches: Iterable[BatchReady]) -> None:
        """Claim the batches (one commit, carrying the marks of files written since), then write them."""
        # Members in storage order (id): the order a re-emit reads back from the database.
        closed = [replace(b, messages=tuple(sorted(b.messages))) for b in batches]
        if not closed:
            return
        self._sync_dirs()
        claimed = self.storage.claim(closed, self.owner, self._clock(), self.lease, self._unmarked)
        self._unmarked = []
        for batch, ok in zip(closed, claimed, strict=True):
            if ok:
                self._write(batch)
            else:  # the lease is gone (or a member is in another batch): forget the destination, re-sync
                self.core.drop(batch.destination)
                self.leased.discard(batch.destination)
                self._synced = float("-inf")

    def _write(self, batch: BatchReady) -> None:
        try:
            path = write_batch(self.output, batch, self._segmenter, sync_dir=False)
        except Exception as exc:  # whatever refuses this batch must not stop the others
            self._failed(batch, f"{type(exc).__name__}: {first_line(exc)}")
            return
        self._dirs.add(path.parent)
        self._unmarked.append(batch.batch_id)
        self.emitted += 1
        if self._on_batch is not None:
            self._on_batch(batch, path)

    def _failed(self, batch: BatchReady, reason: str) -> None:
        """Count the failed write; try again at the next sync, or, after the last attempt, bury the batch."""
        attempts = self.storage.record_failure(batch.batch_id, reason)
        limit = self.rules(batch.destination).max_attempts
        if attempts < limit:
            _log.warning("batch %s (%r) not written, attempt %d of %d: %s", batch.batch_id, batch.destination,
                         attempts, limit, reason)  # fmt: skip
            self._retry[batch.batch_id] = batch
            return
        try:
            path: str | None = str(write_dead_letter(self.dead_letter, batch))
        except Exception as exc:  # the messages stay packed in the batch row: still nothing lost
            path, reason = None, f"{reason}; dead-letter file not written: {type(exc).__name__}: {first_line(exc)}"
        now = self._clock()
        self.storage.mark_dead(batch.batch_id, reason, path, now)
        dead = DeadBatch(batch.batch_id, batch.destination, batch.rule.target, len(batch.messages), attempts,
                         reason, now, path)  # fmt: skip
        self.dead.append(dead)
        if self._on_dead is not None:
            self._on_dead(dead)  # the caller reports it (the command: one line)
        else:
            _log.error("batch %s (%r) dead after %d attempts: %s", batch.batch_id, batch.destination, attempts, reason)

    def _sync_dirs(self) -> None:
        for directory in self._dirs:
            fsync_path(directory)
        self._dirs.clear()

    def settle(self) -> None:
        """Record the batch files written so far as emitted (after syncing their directories)."""
        if self._unmarked:
            self._sync_dirs()
            self.storage.mark_emitted(self._unmarked, self._clock())
            self._unmarked = []


def input_name(path: Path) -> str:
    """An input's key in ``collect_inputs``: its absolute path, so two landing directories never collide.

    Collectors sharing one landing directory must mount it at the same path.
    """
    return str(path.parent.resolve() / path.name)


class Listing(NamedTuple):
    """One look at the landing directory."""

    new: list[Path]  # Parquet files not stored yet, by name (hidden and ``_`` files are in flight)
    stored: dict[Path, tuple[int, int, int]]  # files stored before: (inode, size, mtime_ns) now


def landing_files(directory: Path, done: set[str]) -> Listing:
    """Files to store, and what the ones stored before look like now (to notice a replaced one)."""
    base = directory.resolve()  # once per listing, not per file
    new, stored = [], {}
    for p in sorted(directory.glob("*.parquet")):
        if p.name.startswith((".", "_")):
            continue
        if str(base / p.name) not in done:
            if p.is_file():
                new.append(p)
            continue
        with contextlib.suppress(OSError):  # gone since the listing: nothing to compare
            st = p.stat()
            stored[p] = (st.st_ino, st.st_size, st.st_mtime_ns)
    return Listing(new, stored)


def read_messages(path: Path, destination_column: str, payload_column: str) -> list[tuple[str, bytes]]:
    """(destination, payload) per row. A missing destination is ``""`` (the default rule); a missing payload, b"".

    A non-string destination is its text; a string payload its UTF-8 bytes.
    """
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=[destination_column, payload_column])
    destinations = table.column(destination_column).to_pylist()
    payloads = table.column(payload_column).to_pylist()
    return [(_text(d), _body(p)) for d, p in zip(destinations, payloads, strict=True)]


def _text(value: object) -> str:
    return "" if value is None else value if isinstance(value, str) else str(value)


def _body(value: object) -> bytes:
    """A binary payload as is; anything else as the UTF-8 of its text (a string column is a producer's
    choice, not an error; a number is its digits: ``bytes(3)`` would be three zero bytes, and a
    hostile 8-byte value would size an allocation)."""
    if value is None:
        return b""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    return (value if isinstance(value, str) else str(value)).encode("utf-8", "surrogatepass")


class Leftovers(NamedTuple):
    """What ``collect_directory(once=True)`` could not collect (both stay in place)."""

    unreadable: list[Path]
    replaced: list[Path]  # changed after they were stored under their name: never collected again


def collect_directory(
    collector: DurableCollector,
    landing: Path,
    *,
    destination_column: str = "destination",
    payload_column: str = "payload",
    poll: float = 0.5,
    once: bool = False,
    on_unreadable: Callable[[Path, Exception], None] | None = None,
    on_replaced: Callable[[Path], None] | None = None,
) -> Leftovers:
    """Collect from a landing directory as it fills, until interrupted (or, with ``once``, until done).

    ``once``: store every readable file present, close every open batch (``shutdown``), keep
    taking over expired leases until the database holds no message and no unemitted batch, and
    return the files that could not be read. A file that cannot be read (still being written,
    not Parquet, columns missing) is reported once and tried again at every poll: never skipped
    silently. An input is stored once by name; a file that changes under a stored name (another
    inode, size or modification time than when this process first saw it stored) is reported
    once with ``on_replaced`` and not collected: its content may be the same messages again, so
    only a new name says it is new input.
    """
    done = collector.storage.stored_inputs()
    reported: set[Path] = set()
    known: dict[Path, tuple[int, int, int]] = {}  # stored inputs as first seen (the baseline)
    replaced: dict[Path, None] = {}
    collector.sync()
    while True:
        stored = 0
        unreadable = []
        listing = landing_files(landing, done)
        for path, ident in listing.stored.items():
            if known.setdefault(path, ident) != ident and path not in replaced:
                replaced[path] = None
                if on_replaced is not None:
                    on_replaced(path)
        for path in listing.new:
            try:
                before = path.stat()
                messages = read_messages(path, destination_column, payload_column)
            except Exception as exc:  # pyarrow raises several types for a half-written or foreign file
                if path not in reported and on_unreadable is not None:
                    on_unreadable(path, exc)
                reported.add(path)
                unreadable.append(path)
                continue
            collector.ingest(input_name(path), messages)
            done.add(input_name(path))
            known[path] = (before.st_ino, before.st_size, before.st_mtime_ns)
            stored += 1
        collector.tick()
        if once and not stored:
            collector.flush()
            counts = collector.storage.counts()
            if counts["held"] == 0 and counts["closed"] == counts["emitted"] + counts["dead"]:
                return Leftovers(unreadable, list(replaced))
        time.sleep(poll)
