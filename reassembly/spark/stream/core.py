"""What the streaming job decides for one GroupId per micro-batch: pure Python, no Spark, no clock.

The streaming job keeps, per GroupId, the raw segments received so far and a
:class:`Summary` of their headers. When new ones arrive and the summary says a
decision is possible, every held segment is judged with the same batch
:class:`~reassembly.assembler.core.Assembler` the batch job uses (``batch=True``:
order-independent). The key is *decided* when that judgment leaves nothing
open: its rows are then exactly the rows the batch job would write for the
same segments. Otherwise the segments stay held until more arrive, the key's
expiry (event time) passes, or its byte bound would be exceeded. Without
Unit of Work, the complete messages of an open MQ group leave at once
(:class:`Partial`) and the rest stays held.

A decided key leaves a tombstone: the assembler's own snapshot once the group
has left it (its end state and the fingerprints of what it delivered, no
bytes). A segment arriving while the tombstone lives is judged by that
assembler's late rules: an identical copy of a delivered segment is a
duplicate, a different one a conflict, anything else ``late``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple, TypeVar, overload

from reassembly.assembler import snapshot as assembler_snapshot
from reassembly.assembler._state import GroupState
from reassembly.assembler.bodies import BodyStore
from reassembly.assembler.core import Assembler, Limits
from reassembly.assembler.events import (
    Cause,
    Duplicate,
    Event,
    GroupComplete,
    GroupFailed,
    MessageComplete,
    MessageFailed,
    Rejected,
    Unfinished,
)
from reassembly.assembler.model import Closed, Fingerprint, missing_numbers
from reassembly.assembler.positions import Ledger, Origin
from reassembly.spark.rows import GroupRows, Row, Sources, event_rows, receive
from reassembly.spark.stream.spool import IN_STATE, SpoolState
from segmenter.coverage import RangeSet
from segmenter.errors import Reason, SegmentationError
from segmenter.flags import in_group, is_last_in_group
from segmenter.wire import SegmentHeader, decode_header

T = TypeVar("T")
KIND_DUPLICATE = "duplicate"  # an identical copy of a segment whose message already left (counted, no bytes)


class Footprint(NamedTuple):
    """What one key (or, summed, the whole state) holds: the progress output's state fields.

    ``held_bytes`` are the bytes of held segments in state (whole segments; a spooled segment's
    header; counted raw, though state layout 3 stores them as base64 text, 4/3 as many),
    ``spooled_bytes`` the data bytes of held segments kept in spool files instead. A tombstone's
    bytes are its value (the assembler snapshot, how it ended, four longs: its times), not
    RocksDB's key and encoding overhead. Kept as per-batch changes (``kind = state`` rows, summed by
    the stream's sink, :class:`~reassembly.spark.stream.functions.BatchWriter`): exact.
    """

    groups: int = 0
    """Keys still open (segments held, undecided)."""
    segments: int = 0
    """Segments held in state."""
    held_bytes: int = 0
    """Bytes of held segments in state, counted as the class docstring says."""
    spooled_bytes: int = 0
    """Data bytes of held segments kept in spool files instead of state."""
    tombstones: int = 0
    """Decided keys remembered for late segments."""
    tombstone_bytes: int = 0
    """Bytes of the tombstones' values, counted as the class docstring says."""

    def plus(self, other: Footprint, sign: int = 1) -> Footprint:
        """This footprint with ``other`` added field by field, or subtracted with ``sign=-1`` (a key's change between
        batches)."""
        return Footprint(*(a + sign * b for a, b in zip(self, other, strict=True)))

    @classmethod
    def of(cls, rows: Iterable[tuple[bytes, int, SegmentHeader]]) -> Footprint:
        """Held rows (header-or-segment bytes, where the data is, header) as a footprint.

        ``rows``: each held segment as (the bytes kept in state, where its data is: in state or a spool position, its
        header).
        """
        segments = held = spooled = 0
        for head, at, h in rows:
            segments += 1
            held += len(head)
            spooled += 0 if at == IN_STATE else h.data_length
        return cls(segments=segments, held_bytes=held, spooled_bytes=spooled)

    @staticmethod
    def tombstone_size(blob: bytes, state: str) -> int:
        """The bytes of a tombstone's value: ``blob`` (the assembler snapshot), ``state`` (how the key
        ended) and its four longs (first, until, held bytes, last)."""
        return len(blob) + len(state.encode()) + 32  # + first, until, held bytes (0), last: four longs


@dataclass(frozen=True)
class Verdict:
    """A decided key: its output rows and the tombstone to keep."""

    rows: list[Row]
    """The key's output rows: messages, quarantined segments and the accounting."""
    tombstone: bytes
    """The assembler's snapshot after the group left (``Assembler.snapshot()``), kept to judge late segments."""
    state: str
    """How it ended: complete, failed, expired, evicted (for late segments' detail)."""


@dataclass(frozen=True)
class Partial:
    """Non-Unit-of-Work: some messages of an MQ group left (``rows``); the key stays open with ``keep``."""

    rows: list[Row]
    left: frozenset[int]
    """The messages that left now (their held segments go; the others stay held)."""


@dataclass
class Summary:
    """What the headers of a key's held segments say, kept in state beside them (no bytes).

    It answers "could judging now decide anything?" without reading the held
    segments back: a message can only be complete when the union of its
    segments covers ``[0, end)`` of one of its last segments (the assembler's
    own ``Message.ready``), and a Unit-of-Work group only when that holds for
    every message ``1..L`` of a message ``L`` flagged last in group. Judging is
    skipped while it cannot; that is exact, not a heuristic: the judgment
    would have returned undecided. So a message straddling *n* micro-batches
    is judged once when its last piece arrives, not *n* times.

    Non-Unit-of-Work groups also remember the messages that already left:
    their pieces' fingerprints (to judge late copies) and the last one's number.
    """

    spans: dict[int, RangeSet] = field(default_factory=dict)
    """MsgSeqNumber -> union of held ranges."""
    ends: dict[int, set[int]] = field(default_factory=dict)
    """Ends of held LAST segments."""
    lone: set[int] = field(default_factory=set)
    """Messages with a LAST segment not in a group."""
    lasts: set[int] = field(default_factory=set)
    """Messages with a segment flagged LAST_MSG_IN_GROUP."""
    delivered: dict[tuple[int, int], Fingerprint] = field(default_factory=dict)
    """The fingerprint of each piece that left, by ``(MsgSeqNumber, offset)``: what late copies are judged against."""
    left: set[int] = field(default_factory=set)
    """Messages that left (non-Unit-of-Work)."""
    last_left: int | None = None
    """The group's last message, if it left."""
    spool: SpoolState = field(default_factory=SpoolState)
    """Large messages: what is on disk."""

    def add(self, headers: Iterable[SegmentHeader]) -> None:
        """Note the held segments of ``headers`` (their ranges, last segments and group flags): what
        :meth:`ready` reads."""
        for h in headers:
            seq = h.msg_seq_number
            self.spans.setdefault(seq, RangeSet()).add(h.offset, h.end)
            if h.is_last_segment:
                self.ends.setdefault(seq, set()).add(h.end)
                if not in_group(h.msg_flags):
                    self.lone.add(seq)
            if is_last_in_group(h.msg_flags):
                self.lasts.add(seq)

    def _ready(self, seq: int) -> bool:
        spans = self.spans.get(seq)
        return spans is not None and any(spans.covers(0, end) for end in self.ends.get(seq, ()))

    def ready(self, unit_of_work: bool) -> bool:
        """True unless judging now certainly decides nothing (see the class docstring).

        ``unit_of_work``: the stream's Unit-of-Work setting (a group leaves whole, or message by message).
        """
        ready = {seq for seq in self.spans if self._ready(seq)}
        if not ready:
            return False
        if not unit_of_work or ready & self.lone:  # a message may leave alone (the batch rules decide)
            return True
        return any(all(s in ready for s in range(1, last + 1)) for last in self.lasts)

    def forget(self, seqs: Iterable[int]) -> None:
        """Messages that left: their held ranges go (late copies are judged by ``delivered``).

        ``seqs``: the MsgSeqNumbers of the messages that left.
        """
        for seq in seqs:
            self.spans.pop(seq, None)
            self.ends.pop(seq, None)
            self.lone.discard(seq)
            self.lasts.discard(seq)

    @property
    def whole(self) -> bool:
        """Every message 1..last of the group has left (non-Unit-of-Work)."""
        return self.last_left is not None and all(s in self.left for s in range(1, self.last_left + 1))

    def tombstone(self, group_id: bytes, state: GroupState = GroupState.COMPLETE) -> bytes:
        """An assembler snapshot remembering what left (what :func:`late_rows` judges against).

        ``group_id``: the key's GroupId. ``state``: how the group ended, which a late copy's detail names.
        """
        return assembler_snapshot.encode({}, {group_id: Closed(state, dict(self.delivered))}, Ledger())

    def dump(self) -> bytes:
        return json.dumps(
            {
                "spans": {s: [list(x) for x in r.spans()] for s, r in self.spans.items()},
                "ends": {s: sorted(e) for s, e in self.ends.items()},
                "lone": sorted(self.lone),
                "lasts": sorted(self.lasts),
                "delivered": [[*k, *fp] for k, fp in self.delivered.items()],
                "left": sorted(self.left),
                "last_left": self.last_left,
                "spool": self.spool.dump(),
            }
        ).encode()

    @classmethod
    def load(cls, blob: bytes) -> Summary:
        """The summary :meth:`dump` wrote: ``blob``, its JSON bytes."""
        d = json.loads(blob)
        return cls(
            {int(s): RangeSet(map(tuple, r)) for s, r in d["spans"].items()},
            {int(s): set(e) for s, e in d["ends"].items()},
            set(d["lone"]),
            set(d["lasts"]),
            {(f[0], f[1]): (f[2], f[3], f[4]) for f in d["delivered"]},
            set(d["left"]),
            d["last_left"],
            SpoolState.load(d["spool"]),
        )


def undecodable(raw: bytes) -> bool:
    """True if the row has no readable header: it belongs to no group and is quarantined at once.

    ``raw``: the row's segment bytes.
    """
    try:
        decode_header(raw)
    except SegmentationError:
        return True
    return False


def reject_now(raws: Sequence[bytes], limits: Limits, sources: Sources | None = None) -> list[Row]:
    """Quarantine rows for rows with no readable header (the assembler gives the exact reason);
    ``sources``: the rows' kept columns, parallel to ``raws`` (lineage).

    ``raws``: the rows' segment bytes. ``limits``: the bounds the segments are checked against.
    """
    asm = Assembler(limits)
    return event_rows(receive(asm, enumerate(raws), sources), sources=sources)


def _seq(raw: bytes) -> int:
    return decode_header(raw).msg_seq_number


def judge(
    raws: Sequence[bytes],
    limits: Limits,
    unit_of_work: bool,
    final: Cause | None = None,
    summary: Summary | None = None,
    group_id: bytes | None = None,
    bodies: BodyStore | None = None,
    sources: Sources | None = None,
) -> Verdict | Partial | None:
    """Judge every segment held for one key; ``None`` while it is undecided and ``final`` is not given.

    Decided early only by success: every message of the key complete (a
    message, or a Unit-of-Work group, as a whole). A failure (message
    checksum, decompression, a failed group) or segments that were only
    rejected wait for ``final``: a good copy may still arrive, and the batch
    job, seeing it, would use it. ``final`` (expired, evicted) decides the key
    whatever it holds: what is open leaves as ``Unfinished`` with that cause
    (exact gaps; segments to quarantine). Without Unit of Work, the complete
    messages of an MQ group that is not complete leave at once (:class:`Partial`),
    as the in-process assembler delivers them; ``summary`` (updated here)
    remembers them. With ``bodies``, the messages it wants are built there (rows with
    ``payload_path``), as the batch job does with ``payload_dir``. ``sources``: the held segments'
    kept columns, parallel to ``raws`` (lineage: rows carry ``source`` / ``sources``).

    ``raws``: the held segments' bytes. ``limits``: the bounds applied. ``unit_of_work``: a group leaves whole (True) or
    message by message. ``group_id``: the key's GroupId (None: the key of messages not in a group).
    """
    summary = summary if summary is not None else Summary()
    asm = Assembler(limits, batch=True, unit_of_work=unit_of_work, bodies=bodies)
    events = receive(asm, enumerate(raws), sources) + asm.close()
    failed = any(isinstance(e, (MessageFailed, GroupFailed)) for e in events)
    complete = any(isinstance(e, (MessageComplete, GroupComplete)) for e in events)
    unfinished = any(isinstance(e, Unfinished) for e in events)
    if complete and not failed and not unfinished and not summary.left:
        return Verdict(_plain(event_rows(events, sources=sources)), asm.snapshot(), "complete")
    if final is None:
        return None if unit_of_work else _partial(raws, events, asm.snapshot(), summary, limits, sources)
    gid = decode_header(raws[0]).group_id if raws else group_id
    state = final.value if unfinished or not failed else "failed"
    events = [_finally(e, final, summary) if isinstance(e, Unfinished) else e for e in events]
    if summary.left and not unfinished and not summary.whole and gid is not None:
        events.append(_finally(Unfinished(gid, final, Reason.INCOMPLETE_GROUP, (), (), None), final, summary))
    every = event_rows(events, sources=sources)
    rows = [r for r in every if not (r["kind"] == "message" and r["msg_seq_number"] in summary.left)]
    rows = _with_last(rows, summary)
    tomb = asm.snapshot()
    if summary.left and gid is not None:
        closed = assembler_snapshot.decode(tomb, _nothing, {}, Ledger())
        summary.delivered.update(closed[gid].delivered if gid in closed else {})
        tomb = summary.tombstone(gid, GroupState(state))
    return Verdict(_plain(rows), tomb, state)


def _nothing(raw: bytes, origin: Origin | None, held: bool) -> None:
    """A snapshot taken after close holds no open group: nothing to feed back."""


def _finally(ev: Unfinished, final: Cause, summary: Summary) -> Unfinished:
    """The open rest of a group, told apart from its messages that already left."""
    if not summary.left:
        return replace(ev, cause=final)
    present = {g.msg_seq_number for g in ev.gaps} | {_seq(raw) for raw in ev.segments} | summary.left
    last = summary.last_left if summary.last_left is not None else ev.last_seq_number
    top = last if last is not None else max(present, default=0)
    missing = missing_numbers(present, top)
    return replace(ev, cause=final, missing_seq_numbers=missing, last_seq_number=last)


def _partial(
    raws: Sequence[bytes],
    events: list[Event],
    tomb: bytes,
    summary: Summary,
    limits: Limits,
    sources: Sources | None = None,
) -> Verdict | Partial | None:
    """The messages of an open non-Unit-of-Work group that are complete now leave (what the in-process
    assembler would have delivered); their other copies and duplicates leave with them."""
    done = {
        m.msg_seq_number: m.msg_flags
        for m in events
        if isinstance(m, MessageComplete)
        and in_group(m.msg_flags)
        and (summary.last_left is None or m.msg_seq_number <= summary.last_left)
    }
    if not done:
        return None
    gid = decode_header(raws[0]).group_id
    mine = [e for e in events if _about(e) in done]
    closed = assembler_snapshot.decode(tomb, _nothing, {}, Ledger())[gid]
    summary.delivered.update({k: fp for k, fp in closed.delivered.items() if k[0] in done})
    summary.left.update(done)
    summary.last_left = next((s for s, f in done.items() if is_last_in_group(f)), summary.last_left)
    summary.forget(done)
    rows = _with_last(_plain(event_rows(mine, sources=sources)), summary)
    if not summary.whole:
        return Partial(rows, frozenset(done))
    tombstone = summary.tombstone(gid)
    keep = [i for i, raw in enumerate(raws) if _seq(raw) not in done]  # beyond the last message: late
    late = late_rows(
        tombstone,
        "complete",
        [raws[i] for i in keep],
        limits,
        False,
        None if sources is None else [sources[i] for i in keep],
    )
    return Verdict(rows + late, tombstone, "complete")


def _with_last(rows: list[Row], summary: Summary) -> list[Row]:
    """Message rows of a group whose last message already left say its number, as the batch job's
    rows (which see the whole group at once) do."""
    if summary.last_left is not None:
        for r in rows:
            if r["kind"] == "message" and r.get("last_seq_number") is None:
                r["last_seq_number"] = summary.last_left
    return rows


def _about(ev: Event) -> int | None:
    """The message an event is about (None: a whole group's)."""
    if isinstance(ev, Rejected):
        return ev.header.msg_seq_number if ev.header is not None else None
    if isinstance(ev, (MessageComplete, Duplicate, MessageFailed)):
        return ev.msg_seq_number
    return None


def take(
    held: Callable[[], Sequence[bytes]],
    new: Sequence[bytes],
    held_bytes: int,
    summary: Summary,
    max_held_bytes: int,
    limits: Limits,
    unit_of_work: bool,
    bodies: BodyStore | None = None,
    held_sources: Callable[[], Sequence[object]] | None = None,
    sources: Sequence[object] | None = None,
) -> Verdict | Partial | None:
    """New segments for an undecided key. If holding them all would pass ``max_held_bytes``, decided at
    once as evicted (the bound is checked before anything is stored). Else judged with what it holds, but
    only when ``summary`` (updated with ``new``) says that could decide something: ``held`` is read back
    only then. ``None``: hold ``new`` too. Lineage: ``held_sources`` and ``sources`` give the kept
    columns of the held and of the new segments, in their order.

    ``held_bytes``: the bytes the key holds already. ``limits``: the bounds applied. ``unit_of_work``: a group leaves
    whole (True) or message by message. ``bodies``: where large messages are built (None: in memory).
    """
    over = held_bytes + sum(len(r) for r in new) > max_held_bytes
    summary.add(decode_header(r) for r in new)
    if not over and not summary.ready(unit_of_work):
        return None
    every = _Chain(held(), new)
    srcs = None if held_sources is None or sources is None else _Chain(held_sources(), sources)
    return judge(every, limits, unit_of_work, Cause.EVICTED if over else None, summary, bodies=bodies, sources=srcs)


class _Chain(Sequence[T]):
    """Held segments (perhaps read from disk on demand), then the new ones: no list of them all."""

    def __init__(self, first: Sequence[T], second: Sequence[T]) -> None:
        self.first, self.second = first, second

    def __len__(self) -> int:
        return len(self.first) + len(self.second)

    @overload
    def __getitem__(self, i: int) -> T: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[T]: ...
    def __getitem__(self, i: int | slice) -> T | Sequence[T]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self.first)
        return self.first[i] if i < n else self.second[i - n]

    def __iter__(self) -> Iterator[T]:
        yield from self.first
        yield from self.second


def late_rows(
    tombstone: bytes,
    state: str,
    raws: Iterable[bytes],
    limits: Limits,
    unit_of_work: bool,
    sources: Sources | None = None,
) -> list[Row]:
    """Rows for segments of a decided key: duplicates (counted), conflicts and ``late`` (quarantined);
    ``sources``: the segments' kept columns, parallel to ``raws`` (lineage).

    ``tombstone``: the assembler snapshot kept when the key was decided. ``state``: how it ended (complete, failed,
    expired, evicted). ``limits``: the bounds applied. ``unit_of_work``: the stream's Unit-of-Work setting.
    """
    asm = Assembler.restore(tombstone, limits, unit_of_work=unit_of_work)
    out: list[Row] = []
    for i, raw in enumerate(raws):
        for ev in receive(asm, [(i, raw)], sources):
            if isinstance(ev, Duplicate):
                out.append(_duplicate_row(ev))
                if sources is not None:
                    out[-1]["source"] = sources[i]
                continue
            acc = GroupRows(ev.header.group_id if isinstance(ev, Rejected) and ev.header else None, None, sources)
            acc.add(ev)
            for row in acc.quarantine:
                if row["reason_name"] == "LATE_SEGMENT":
                    row["detail"] = f"segment after its group was {state} (tombstone kept)"
                out.append(row)
    return _plain(out)


def _duplicate_row(ev: Duplicate) -> Row:
    return {
        "kind": KIND_DUPLICATE,
        "group_id": ev.group_id,
        "msg_seq_number": ev.msg_seq_number,
        "offset": ev.offset,
        "reason": 0,
        "reason_name": "NONE",
        "detail": "identical copy of a segment already delivered",
    }


def _plain(rows: list[Row]) -> list[Row]:
    """Views become bytes: rows leave the Python worker through Spark's Row conversion."""
    for row in rows:
        for k, v in row.items():
            if isinstance(v, memoryview):
                row[k] = v.tobytes()
    return rows


__all__ = [
    "KIND_DUPLICATE",
    "Footprint",
    "Partial",
    "Summary",
    "Verdict",
    "judge",
    "late_rows",
    "reject_now",
    "take",
    "undecodable",
]
