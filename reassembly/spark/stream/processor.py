"""The streaming job's stateful processor: reads and writes one GroupId's Spark state, asks
:mod:`~reassembly.spark.stream.core`.

:class:`Reassembler` runs under ``transformWithState`` (Row API, event time), one instance per
state task: Spark pickles the instance made on the driver and calls :meth:`~Reassembler.init`
on each copy. What is decided (judged, held, evicted, late) is the core's; the class turns Spark
rows into bytes, the state variables of :mod:`.layout` into core values and back, and sets the
timers. This module imports pyspark (the base class); :func:`~.reassemble.reassemble_stream`
imports it only when a stream is set up.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark.sql import Row
from pyspark.sql.streaming.stateful_processor import StatefulProcessor

from reassembly.assembler.core import Limits
from reassembly.assembler.events import Cause
from reassembly.spark.engine.bridge import SRC
from reassembly.spark.rows import null_row
from reassembly.spark.schema import OUTPUT_FIELDS, SOURCE, SOURCES
from reassembly.spark.stream.core import (
    Footprint,
    Partial,
    Summary,
    Verdict,
    judge,
    late_rows,
    reject_now,
    take,
    undecodable,
)
from reassembly.spark.stream.layout import (
    FOOTPRINT_COLUMNS,
    HELD,
    KEY,
    KIND_STATE,
    OPENED_COLUMN,
    held_bytes,
    held_text,
)
from reassembly.spark.stream.spool import IN_STATE, HeldRows, Spool
from reassembly.storage.filestore import FileBodyStore
from segmenter.wire import SegmentHeader, decode_header

_NAMES = tuple(name for name, _, _ in OUTPUT_FIELDS)


def _struct(ddl: str) -> Any:
    """A state schema as a StructType: given as a DDL string, pyspark would send it to the JVM to be
    parsed, twice per state variable and task (two socket round trips each, every micro-batch)."""
    from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

    types = {"long": LongType(), "binary": BinaryType(), "string": StringType()}
    return StructType([StructField(name, types[kind]) for name, kind in (f.split() for f in ddl.split(", "))])


class _Profiler:
    """cProfile over one task's processor (init to close), dumped into a directory for ``pstats``."""

    def __init__(self, directory: str) -> None:
        import cProfile

        self.directory = Path(directory)
        self.profile = cProfile.Profile()
        self.profile.enable()

    def dump(self) -> None:
        self.profile.disable()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.profile.dump_stats(self.directory / f"{os.getpid()}-{uuid.uuid4().hex[:8]}.prof")


def _out(rows: list[dict[str, Any]], names: tuple[str, ...] = _NAMES) -> Iterator[Any]:
    for r in rows:
        yield Row(**{n: r.get(n) for n in names})


class Reassembler(StatefulProcessor):
    """Per key and call, each state call is a socket round trip to the JVM (milliseconds on a loaded
    machine): a key decided by its first segments costs 4 with the framework's own (set the key, get
    ``key``, store the tombstone, its timer), an open key's next segments 4 (set, get, append, update),
    the call that decides it 5 (set, get, read the held list, clear it, store the tombstone).

    The constructor takes what every task needs, decided on the driver (all picklable: the instance
    travels to the workers); :meth:`init` opens the state variables on each worker's copy.

    ``limits``: the assembler's bounds. ``unit_of_work``: a group leaves whole (True) or message by message.
    ``max_held_bytes``: the most bytes one key may hold in state before it is evicted. ``expire_ms``: an undecided key
    leaves as incomplete this many milliseconds (event time) after its first segment. ``tombstone_ms``: how long, in
    milliseconds, a decided key is remembered to judge late copies. ``large_message_bytes``: a message at least this
    large is built in a spool file instead of in memory. ``spool``: where held large segments' data go (None: all in
    state). ``profile``: a directory each task's cProfile output is written to (None: no profiling). ``lineage``: the
    StructType of the input columns kept beside each segment (None: nothing kept).
    """

    def __init__(
        self,
        *,
        limits: Limits,
        unit_of_work: bool,
        max_held_bytes: int,
        expire_ms: int,
        tombstone_ms: int,
        large_message_bytes: int,
        spool: Spool | None = None,
        profile: str | None = None,
        lineage: Any = None,
    ) -> None:
        self.limits = limits
        self.uow = unit_of_work
        self.max_held_bytes = max_held_bytes
        self.expire_ms = expire_ms  # an undecided key leaves as incomplete this long after its first segment
        self.tomb_ms = tombstone_ms  # a decided key's tombstone stays this long
        self.large_message_bytes = large_message_bytes
        self.spool = spool  # large messages' data on disk (None: everything in state)
        self.profile = profile  # a directory: cProfile each task's processor into it (for the bench)
        # Lineage: the kept columns' StructType; each input row's ``src`` is held beside its segment (a
        # field of its held row) and given to the rows (``source`` / ``sources``). None: nothing kept.
        self.lineage = lineage
        self.names = _NAMES + ((SOURCES, SOURCE) if lineage is not None else ())

    def init(self, handle: Any) -> None:
        """Open the key's state variables through Spark's ``handle`` (the StatefulProcessorHandle), on each worker's
        copy."""
        self.profiler = _Profiler(self.profile) if self.profile else None
        self.handle = handle
        held = _struct(HELD)
        if self.lineage is not None:  # a checkpoint records the kept columns (StreamOptions): no mixing
            held = held.add(SRC, self.lineage)
        self.held = handle.getListState("held", held)
        self.key = handle.getValueState("key", _struct(KEY))
        self.change = Footprint()  # what this call changed in the key's state (one kind=state row)
        self.gid: bytes = b""  # the call's key, and its first event time if the call opened it (the state row)
        self.opened: int | None = None
        self.read: list[tuple[bytes, int, SegmentHeader]] | None = None  # held rows, read once a call
        self.read_src: list[Any] = []  # lineage: the held rows' kept columns, parallel to ``read``

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        """Spark's call for one key's new rows of a micro-batch: ``key`` (the GroupId, as a one-field row), ``rows``
        (the raw segments and their event times), ``timerValues`` (the watermark, for rows without an event time);
        yields the output rows."""
        self.change, self.read = Footprint(), None
        self.gid, self.opened = bytes(key[0]), None
        raws: list[bytes] = []
        stamps: list[int | None] = []
        srcs: list[Any] = []  # lineage: each row's kept columns, parallel to raws
        nulls: list[Any] = []
        for r in rows:
            if r.raw is None:  # no bytes at all: quarantined (9007) with its value, NULL, as `run` does
                nulls.append(r[SRC] if self.lineage is not None else None)
                continue
            raws.append(bytes(r.raw))
            stamps.append(r.event_ms)
            if self.lineage is not None:
                srcs.append(r[SRC])
        # A NULL event time: the row counts as arriving with the call's latest (else the watermark).
        known_times = [t for t in stamps if t is not None]
        fill = max(known_times) if known_times else timerValues.getCurrentWatermarkInMs()
        times = [fill if t is None else t for t in stamps]
        unreadable = [undecodable(raw) for raw in raws]
        good = [raw for raw, u in zip(raws, unreadable, strict=True) if not u]
        lineage = None if self.lineage is None else nulls
        result = [null_row(lineage, i) for i in range(len(nulls))]
        bad = [i for i, u in enumerate(unreadable) if u]
        result += reject_now([raws[i] for i in bad], self.limits, self._pick(srcs, bad))
        good_srcs = self._pick(srcs, [i for i, u in enumerate(unreadable) if not u])
        now = self.key.get() if good else None  # one round trip: new (None), open, or decided
        if now is not None and now[5] is not None:
            result += late_rows(bytes(now[4]), now[5], good, self.limits, self.uow, good_srcs)
        elif good:
            result += self._take(bytes(key[0]), good, times, now, good_srcs)
            if self.spool is not None:
                self.spool.sync()  # before the state that points at the spool files commits
        return _out(result + self._accounted(), self.names)

    def _pick(self, srcs: list[Any], at: list[int]) -> list[Any] | None:
        """Lineage: the kept columns of the rows at ``at`` (None: nothing kept)."""
        return None if self.lineage is None else [srcs[i] for i in at]

    def _take(
        self,
        gid: bytes,
        good: list[bytes],
        times: list[int],
        now: tuple[Any, ...] | None,
        srcs: list[Any] | None = None,
    ) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        known = now is not None
        if now is not None:
            first, deadline, held_bytes_, last, blob, _ = now
            summary = Summary.load(bytes(blob))
            if summary.left:  # non-Unit-of-Work: copies of messages that already left are judged late
                left = [decode_header(raw).msg_seq_number in summary.left for raw in good]
                gone = [i for i, x in enumerate(left) if x]
                rows += late_rows(
                    summary.tombstone(gid),
                    "complete",
                    [good[i] for i in gone],
                    self.limits,
                    self.uow,
                    None if srcs is None else [srcs[i] for i in gone],
                )
                srcs = None if srcs is None else [s for s, x in zip(srcs, left, strict=True) if not x]
                good = [raw for raw, x in zip(good, left, strict=True) if not x]
        else:
            first, held_bytes_, last, summary = min(times), 0, min(times), Summary()
            deadline = first + self.expire_ms  # its timer is registered only if the key stays open (_keep)
        if held_bytes_ == 0:
            self.read, self.read_src = [], []  # nothing held: no need to ask the state store
        last = max(last, *times)
        if not good:
            return rows
        store = self._store()
        lineage = None if srcs is None else self._held_sources
        verdict = take(
            self._held, good, held_bytes_, summary, self.max_held_bytes, self.limits, self.uow, store, lineage, srcs
        )
        if verdict is None:
            fresh = self._hold(good, summary)
            self.held.appendList(self._state(fresh, srcs))
            self._keep(first, deadline, held_bytes_ + Footprint.of(fresh).held_bytes, last, summary, known)
        elif isinstance(verdict, Partial):
            before = self._rows()
            stays = [r[2].msg_seq_number not in verdict.left for r in before]
            kept = [r for r, x in zip(before, stays, strict=True) if x]
            new = [decode_header(raw).msg_seq_number not in verdict.left for raw in good]
            every = kept + self._hold([raw for raw, x in zip(good, new, strict=True) if x], summary)
            every_srcs = None
            if srcs is not None:
                every_srcs = [s for s, x in zip(self._held_sources(), stays, strict=True) if x]
                every_srcs += [s for s, x in zip(srcs, new, strict=True) if x]
            if every:
                self.held.put(self._state(every, every_srcs))  # replaces the list: one round trip
            elif before:
                self.held.clear()
            self.change = self.change.plus(Footprint.of(kept)).plus(Footprint.of(before), -1)
            self._keep(first, deadline, Footprint.of(every).held_bytes, last, summary, known)
            rows += verdict.rows
        else:
            self._decided(verdict, first, deadline, last, known)
            rows += verdict.rows
        if store is not None:
            store.close()  # bodies not delivered (still open, or failed): their work files go
        return rows

    def _store(self) -> FileBodyStore | None:
        """Where this call builds large messages (work files named for it; finished ones renamed)."""
        if self.spool is None:
            return None
        return FileBodyStore(self.spool.directory, uuid.uuid4().hex, self.large_message_bytes)

    def _hold(self, raws: list[bytes], summary: Summary) -> list[tuple[bytes, int, SegmentHeader]]:
        """Segments to hold, as held rows (a large message's data goes to its spool files), accounted;
        the caller writes them."""
        held = []
        spool = self.spool
        for raw in raws:
            h = decode_header(raw)
            head, at = (
                spool.put(raw, h, summary.spool) if spool is not None and spool.wants(raw, h) else (raw, IN_STATE)
            )
            held.append((head, at, h))
        self.change = self.change.plus(Footprint.of(held))
        return held

    def _rows(self) -> list[tuple[bytes, int, SegmentHeader]]:
        if self.read is None:
            items = list(self.held.get())
            heads = [(held_bytes(item[0]), item[1]) for item in items]
            self.read = [(head, at, decode_header(head)) for head, at in heads]
            self.read_src = [item[2] for item in items] if self.lineage is not None else []
        return self.read

    def _held_sources(self) -> list[Any]:
        """Lineage: the held rows' kept columns, in the order of :meth:`_rows`."""
        self._rows()
        return self.read_src

    def _state(self, rows: list[tuple[bytes, int, SegmentHeader]], srcs: list[Any] | None) -> list[tuple[Any, ...]]:
        """Held rows as the state stores them (with their kept columns, when kept)."""
        if self.lineage is None or srcs is None:
            return [(held_text(head), at) for head, at, _ in rows]
        return [(held_text(head), at, src) for (head, at, _), src in zip(rows, srcs, strict=True)]

    def _held(self) -> HeldRows:
        return HeldRows(self._rows(), self.spool)

    def _keep(self, first: int, deadline: int, held: int, last: int, summary: Summary, known: bool) -> None:
        self.key.update((first, deadline, held, last, summary.dump(), None))
        if not known:
            self.handle.registerTimer(deadline)
            self.change = self.change._replace(groups=self.change.groups + 1)
            self.opened = first  # the state row says when the key opened (the sink's oldest held key)

    def _decided(
        self, verdict: Verdict, first: int, deadline: int, last: int, known: bool, fired: int | None = None
    ) -> None:
        """The key's held segments go, its tombstone stays until ``tombstone`` past the later of its last
        segment and its expiry deadline. An open key's expiry timer is left in place: when it fires, it
        sets the tombstone's (a round trip then, not on the way of the message leaving now). A key decided
        by its first segments, or by that timer (``fired``: its time), sets the tombstone's timer now."""
        state, blob = verdict.state, verdict.tombstone
        self.change = self.change.plus(Footprint.of(self._rows()), -1).plus(
            Footprint(groups=-int(known), tombstones=1, tombstone_bytes=Footprint.tombstone_size(blob, state))
        )
        if self._rows():
            self.held.clear()
        until = max(last, deadline) + self.tomb_ms
        if fired is not None:
            until = max(until, fired + 1)  # a timer set at the firing time would go with the fired one
        self.key.update((first, until, 0, last, blob, state))
        if not known or fired is not None:
            self.handle.registerTimer(until)

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:
        """Spark's call when a key's timer fires: ``key`` (the GroupId), ``timerValues`` (the current times),
        ``expiredTimerInfo`` (the time the timer was set for): an open key leaves as expired, a tombstone is
        dropped."""
        self.change, self.read = Footprint(), None
        self.gid, self.opened = bytes(key[0]), None
        at = expiredTimerInfo.getExpiryTimeInMs()
        rows: list[dict[str, Any]] = []
        now = self.key.get()
        if now is not None:
            first, deadline, held, last, blob, state = now
            if state is None and deadline == at:  # an open key's expiry
                if held == 0:
                    self.read, self.read_src = [], []
                store = self._store()
                summary = Summary.load(bytes(blob))
                lineage = self._held_sources() if self.lineage is not None else None
                verdict = judge(
                    self._held(), self.limits, self.uow, Cause.EXPIRED, summary, bytes(key[0]), store, lineage
                )
                assert isinstance(verdict, Verdict)  # a final cause always decides
                if store is not None:
                    store.close()
                self._decided(verdict, first, deadline, last, True, fired=at)
                rows = verdict.rows
            elif state is not None and deadline <= max(at, timerValues.getCurrentWatermarkInMs()):
                # the tombstone's time is up (also when this is the expiry timer of a key decided before
                # it, and the watermark has passed the tombstone's time too: as its own timer would now)
                self.key.clear()
                self.change = Footprint(tombstones=-1, tombstone_bytes=-Footprint.tombstone_size(bytes(blob), state))
            elif state is not None:  # the expiry timer of a key decided before it: now the tombstone's
                self.handle.registerTimer(deadline)
        return _out(rows + self._accounted(), self.names)

    def _accounted(self) -> list[dict[str, Any]]:
        """The call's change of the key's footprint as one ``state`` row (none if nothing changed)."""
        if self.change == Footprint():
            return []
        footprint = {FOOTPRINT_COLUMNS[k]: v for k, v in self.change._asdict().items()}
        return [{"kind": KIND_STATE, "group_id": self.gid, OPENED_COLUMN: self.opened, **footprint}]

    def close(self) -> None:
        if self.profiler is not None:
            self.profiler.dump()


__all__ = ["Reassembler"]
