"""The shared segment store's decisions, without I/O: what a write is, when a unit is ready, who
holds a lease, what the assembler made of a claimed unit.

Competing consumers (Kafka share groups, a queue read without message groups) hand the segments
of one message to different processes. Each process writes what it receives into one shared
store; the write that completes a message claims it. The database adapters
(:mod:`reassembly.segstore.sqlite`, :mod:`reassembly.segstore.postgres`) run these decisions
inside their transactions; this module only judges rows and headers given to it and returns
typed answers, with time passed in as numbers.

The one arbitration rule stays the assembler's: the store keeps every distinct copy of a
position (keyed by a fingerprint of its bytes), and :func:`assemble` feeds all of a unit's rows to
an :class:`~reassembly.assembler.core.Assembler` in batch mode, whose events say what is
delivered, what lost and why. :func:`ready` is only a cheap pre-check on headers (every byte of
every message of the unit present): it never decides a winner.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from reassembly.assembler import rules
from reassembly.assembler.core import Assembler
from reassembly.assembler.events import (
    Duplicate,
    GroupComplete,
    GroupFailed,
    MessageComplete,
    MessageFailed,
    Rejected,
    Unfinished,
)
from reassembly.assembler.model import Limits
from segmenter.coverage import RangeSet
from segmenter.errors import Reason, SegmentationError
from segmenter.flags import in_group, is_last_in_group, is_last_segment
from segmenter.wire import SegmentHeader, decode_segment

Delivered = MessageComplete | GroupComplete
"""What a claimant hands on: one message, or a whole Unit-of-Work group in MsgSeqNumber order."""

WHOLE_GROUP = 0
"""The unit number of a claim that covers a whole group (Unit-of-Work) or a message not in a group."""


def fingerprint(raw: bytes | memoryview) -> bytes:
    """What tells two copies of one position apart: the SHA-256 of the encoded segment (16 bytes)."""
    return hashlib.sha256(raw).digest()[:16]


class Write(str, Enum):
    """What a write did with one segment."""

    STORED = "stored"  # new: kept until its unit is settled or expires
    VARIANT = "variant"  # kept beside a different copy of the same position: the assembler arbitrates
    DUPLICATE = "duplicate"  # an identical copy of a held segment, or of a used segment of a settled unit
    QUARANTINED = "quarantined"  # refused (corrupt, a rule broken, late and different): its bytes are kept aside


@dataclass(frozen=True)
class Row:
    """One stored segment: where it sits, its copy's fingerprint, the header facts the store reads."""

    group_id: bytes
    unit: int
    seq: int
    offset: int
    fp: bytes
    length: int
    msg_flags: int

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass(frozen=True)
class Incoming:
    """A segment decoded and verified on its way in (or refused: ``error`` set, ``header`` maybe)."""

    raw: bytes
    header: SegmentHeader | None
    row: Row | None
    error: SegmentationError | None = None


def unit_of(h: SegmentHeader, unit_of_work: bool) -> int:
    """The claim a segment belongs to: the whole group (Unit-of-Work, or a message not in a
    group), else its own message of the group."""
    return WHOLE_GROUP if unit_of_work or not in_group(h.msg_flags) else h.msg_seq_number


def take(raw: bytes, limits: Limits, unit_of_work: bool) -> Incoming:
    """Decode and verify a segment (header and data checksums, sizes, the lone-message rule) before
    anything is written: what fails never enters the store, it is quarantined with its reason."""
    try:
        seg = decode_segment(raw, max_segment_size=limits.max_segment_size, max_message_size=limits.max_message_size)
    except SegmentationError as exc:
        return Incoming(raw, None, None, exc)
    h = seg.header
    err = rules.lone_refusal(h)
    if err is not None:
        return Incoming(raw, h, None, err.name_group(h.group_id))
    row = Row(
        h.group_id, unit_of(h, unit_of_work), h.msg_seq_number, h.offset, fingerprint(raw), h.data_length, h.msg_flags
    )
    return Incoming(raw, h, row)


def judge(row: Row, held: Iterable[bytes]) -> Write:
    """A write against the fingerprints already held at the row's position (same group, message, offset)."""
    fps = set(held)
    if row.fp in fps:
        return Write.DUPLICATE
    return Write.VARIANT if fps else Write.STORED


def judge_late(row: Row, used: bytes | None) -> tuple[Write, SegmentationError | None]:
    """A segment of a unit already settled, against the fingerprint of the segment used at its
    position (``None``: none was). Identical: a duplicate (a redelivery after the claimant settled).
    Anything else can no longer change what was delivered: quarantined, with its reason."""
    if used == row.fp:
        return Write.DUPLICATE, None
    if used is not None:
        err: SegmentationError = SegmentationError(
            f"different bytes for offset {row.offset} of delivered message {row.seq}",
            reason=Reason.CONFLICTING_DUPLICATE,
            offset=row.offset,
            msg_seq_number=row.seq,
        )
    else:
        err = SegmentationError(
            "segment for a message that is already delivered",
            reason=Reason.LATE_SEGMENT,
            msg_seq_number=row.seq,
            offset=row.offset,
        )
    return Write.QUARANTINED, err.name_group(row.group_id)


def _message_covered(rows: Sequence[Row]) -> bool:
    """Every byte up to some LAST segment's end is present (an overlap or a variant may still lose:
    the assembler decides)."""
    present = RangeSet((r.offset, r.end) for r in rows)
    return any(is_last_segment(r.msg_flags) and present.covers(0, r.end) for r in rows)


def ready(rows: Sequence[Row]) -> bool:
    """Every message of a unit has all its bytes: a message alone or one message of a group (its
    rows), or a Unit-of-Work group (a message flagged LAST_MSG_IN_GROUP, and every message from 1
    to it covered). A pre-check on headers: worth a claim, not yet a verdict."""
    if not rows:
        return False
    by_seq: dict[int, list[Row]] = {}
    for r in rows:
        by_seq.setdefault(r.seq, []).append(r)
    if rows[0].unit != WHOLE_GROUP or not any(in_group(r.msg_flags) for r in rows):
        return all(_message_covered(rs) for rs in by_seq.values())
    last = max((r.seq for r in rows if is_last_in_group(r.msg_flags)), default=None)
    if last is None:
        return False
    return all(s in by_seq and _message_covered(by_seq[s]) for s in range(1, last + 1))


# ------------------------------------------------------------------ leases
@dataclass(frozen=True)
class Lease:
    """A unit's claim: who holds it, until when, and the token that proves it (bumped on every claim)."""

    claimant: str | None
    until: float | None
    token: int

    def live(self, now: float) -> bool:
        """Held, and not yet expired (a lease ending exactly now has expired)."""
        return self.claimant is not None and self.until is not None and now < self.until

    def expired(self, now: float) -> bool:
        return self.claimant is not None and not self.live(now)


def claim(lease: Lease, member: str, now: float, seconds: float) -> Lease:
    """The lease ``member`` takes: a fresh token, valid for ``seconds`` from ``now``."""
    if lease.live(now):
        raise SegmentationError(f"unit held by {lease.claimant} until {lease.until}", reason=Reason.STATE_ERROR)
    return Lease(member, now + seconds, lease.token + 1)


# ------------------------------------------------------------------ assembly
@dataclass(frozen=True)
class Quarantine:
    """A stored segment that will never be part of a delivered message: kept with its reason."""

    index: int  # into the rows given to :func:`assemble`
    reason: Reason
    detail: str


@dataclass(frozen=True)
class Assembly:
    """What the assembler made of a claimed unit's rows.

    ``decided`` False: the headers looked complete but no candidate assembly exists yet (a header
    disagreement, a variant that breaks the tiling): nothing is settled, the unit waits for more
    segments or its expiry. Otherwise ``delivered`` (to hand on), ``quarantined`` (losers, failed
    messages) and ``used`` / ``duplicates`` (indices into the rows) account for every row.
    """

    decided: bool
    delivered: tuple[Delivered, ...] = ()
    used: frozenset[int] = frozenset()
    duplicates: frozenset[int] = frozenset()
    quarantined: tuple[Quarantine, ...] = ()
    failures: tuple[MessageFailed | GroupFailed, ...] = ()


def _positions(event: object) -> list[int]:
    return [int(o.position) for o in getattr(event, "positions", ())]


def assemble(raws: Sequence[bytes], limits: Limits, unit_of_work: bool) -> Assembly:
    """Feed a unit's stored segments to a batch :class:`Assembler` (order-independent: the same
    arbitration, checksums, digests and decompression bounds as every other path) and sort its
    events into what to deliver, use, count and quarantine."""
    asm = Assembler(limits, unit_of_work=unit_of_work, batch=True)
    events = []
    for i, raw in enumerate(raws):
        events += asm.receive(raw, position=i)
    events += asm.close()
    # Not decided while a held message is incomplete; a unit of one message of a group (no Unit of
    # Work) leaves the group open for its other messages, which are other units: not this one's gap.
    if any(isinstance(e, Unfinished) and (unit_of_work or e.gaps) for e in events):
        return Assembly(False)
    delivered: list[Delivered] = []
    used: set[int] = set()
    dups: set[int] = set()
    quarantined: list[Quarantine] = []
    failures: list[MessageFailed | GroupFailed] = []
    for e in events:
        if isinstance(e, MessageComplete | GroupComplete):
            delivered.append(e)
            used.update(_positions(e))
        elif isinstance(e, Duplicate):
            dups.update(_positions(e))
        elif isinstance(e, Rejected):
            quarantined += [Quarantine(i, e.reason, str(e.error)) for i in _positions(e)]
        elif isinstance(e, MessageFailed):
            failures.append(e)
            quarantined += [Quarantine(i, e.reason, str(e.error)) for i in _positions(e)]
        elif isinstance(e, GroupFailed):
            failures.append(e)
            for f in e.failed:
                quarantined += [Quarantine(i, f.reason, str(f.error)) for i in _positions(f)]
            quarantined += [Quarantine(i, e.reason, "a message of its group failed") for i in _positions(e)]
    accounted = used | dups | {q.index for q in quarantined}
    left = [i for i in range(len(raws)) if i not in accounted]
    quarantined += [Quarantine(i, Reason.STATE_ERROR, "not accounted for by the assembler") for i in left]
    return Assembly(True, tuple(delivered), frozenset(used), frozenset(dups), tuple(quarantined), tuple(failures))


@dataclass(frozen=True)
class GapReport:
    """One message of an expired (or listed) unit: what it is missing, from the assembler's report."""

    msg_seq_number: int
    """The MsgSeqNumber of the incomplete message."""
    missing_ranges: tuple[tuple[int, int | None], ...]
    """The byte ranges missing, each ``(start, end)`` with ``end`` excluded (offsets into the original bytes when no
    segment held declares a codec, else into the stored bytes); an ``end`` of None: open up to a length not yet
    known."""
    stored_length: int | None
    """The message's stored length when every segment declaring one agrees; None: not known."""
    received_bytes: int
    """Bytes of the message held, each offset counted once however many copies cover it."""


@dataclass(frozen=True)
class UnitReport:
    """An incomplete unit: its group, age, what it holds and what it is missing."""

    group_id: bytes
    """The GroupId of the incomplete unit."""
    unit: int
    """The unit's number: a message's MsgSeqNumber in a group, or ``WHOLE_GROUP`` (0)."""
    first_seen: float
    """When the unit's first segment was stored, by the store's clock (seconds)."""
    segments: int
    """Segments of the unit held."""
    bytes: int
    """Encoded segment bytes of the unit held."""
    gaps: tuple[GapReport, ...] = ()
    """What each incomplete message of the unit is missing."""
    missing_seq_numbers: tuple[int, ...] = ()
    """MsgSeqNumbers of the group of which nothing arrived, within the known range."""
    last_seq_number: int | None = None
    """The group's last MsgSeqNumber, when its LAST message was seen; None: not known."""


def gaps(
    raws: Sequence[bytes], limits: Limits, unit_of_work: bool
) -> tuple[tuple[GapReport, ...], tuple[int, ...], int | None]:
    """The exact missing ranges of a unit's stored segments, as the assembler reports them for an
    unfinished group (its ``pending`` report): per message, and the MsgSeqNumbers of which nothing is held."""
    asm = Assembler(limits, unit_of_work=unit_of_work)
    for raw in raws:
        asm.receive(raw)
    reports: list[GapReport] = []
    missing: tuple[int, ...] = ()
    last: int | None = None
    for u in asm.pending():
        reports += [GapReport(g.msg_seq_number, g.missing_ranges, g.stored_length, g.received_bytes) for g in u.gaps]
        missing, last = u.missing_seq_numbers, u.last_seq_number
    return tuple(reports), missing, last


# ------------------------------------------------------------------ observability
@dataclass(frozen=True)
class StoreStats:
    """What the store holds and has seen (counters are totals since the store was created)."""

    units: int = 0
    """Messages (or Unit-of-Work groups) held, incomplete or awaiting settlement."""
    segments: int = 0
    """Segments held in the units above."""
    bytes: int = 0
    """Encoded segment bytes held."""
    oldest_first_seen: float | None = None
    """When the oldest held unit got its first segment."""
    leases_held: int = 0
    """Units claimed under a live lease."""
    leases_expired: int = 0
    """Units whose claimant's lease ran out (not yet taken over)."""
    quarantined: int = 0
    """Segments and records in the quarantine now, their bytes kept aside."""
    counters: dict[str, int] = field(default_factory=dict)
    """Totals by name since the store was created, summed over members (``stored``, ``duplicates``, ``variants``,
    ``delivered``, ``taken_over``...)."""

    def as_dict(self, now: float) -> dict[str, object]:
        """The counters as a JSON-ready dict, the age of the oldest incomplete unit taken at ``now`` (the store
        clock's seconds)."""
        age = None if self.oldest_first_seen is None else max(0.0, now - self.oldest_first_seen)
        return {
            "units": self.units,
            "segments": self.segments,
            "bytes": self.bytes,
            "oldest_incomplete_age_seconds": age,
            "leases_held": self.leases_held,
            "leases_expired": self.leases_expired,
            "quarantined": self.quarantined,
            **dict(sorted(self.counters.items())),
        }
