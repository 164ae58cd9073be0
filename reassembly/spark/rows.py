"""From the assembler's events to output rows: pure Python, no Spark, shared by every Spark path.

One group's segments go into an :class:`~reassembly.assembler.core.Assembler`; its
events become rows of one combined schema (``kind`` = ``message`` or
``quarantine``). The accounting identity holds by construction: every input
segment is used (``segments_used``), counted as a duplicate (``duplicates``)
or appears as exactly one quarantine row with its original bytes, in the row
(``raw``) or, through a :class:`QuarantineSink`, by reference (``raw_path``,
``raw_offset``, ``raw_length``; see ``quarantine.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from reassembly.assembler.bodies import BodyStore, StoredBody, StoredOriginal
from reassembly.assembler.core import Assembler, Limits
from reassembly.assembler.events import (
    ConflictingDuplicate,
    Duplicate,
    Event,
    GroupComplete,
    GroupFailed,
    MessageComplete,
    MessageFailed,
    Rejected,
    ScatteredPayload,
    Unfinished,
)
from segmenter.errors import Reason, SegmentationError
from segmenter.wire import UNKNOWN_LENGTH, Buffer, Segment, SegmentHeader, decode_header

Row = dict[str, Any]
Original = bytes | StoredOriginal  # a segment's original bytes, or a handle on them left in a store


class QuarantineSink(Protocol):
    """Takes quarantined originals out of the rows (e.g. into a file): where each went, or None (keep it in-row)."""

    def put(self, original: Original) -> tuple[str, int, int] | None:
        """(path, offset, length) of the copy, or None: the row keeps the bytes."""
        ...


class Status:
    """Values of the ``status`` column (strings, so they read well in SQL)."""

    COMPLETE = "complete"
    INCOMPLETE = "incomplete"  # gaps or missing messages (2242 / 2241)
    CORRUPT = "corrupt"  # all pieces, but message checksum or decompression failed
    CONFLICT = "conflict"  # two verified assemblies differ, or incomplete with conflicting copies seen
    INVALID = "invalid"  # every segment of it was rejected
    GROUP_FAILED = "group_failed"  # intact, but another message of its Unit-of-Work group failed
    TOO_BIG = "too_big"  # declared size above the limit (2030)


@dataclass
class _Acc:
    """Per-message accounting while events are read."""

    seq: int
    status: str | None = None
    reason: int | None = None
    payload: bytes | bytearray | None = None
    payload_path: str | None = None  # set instead of payload for a message kept in a BodyStore
    message_checksum: int | None = None
    stored_length: int | None = None
    original_length: int | None = None
    missing_ranges: list[dict[str, int | None]] = field(default_factory=list)
    segments_used: int = 0
    duplicates: int = 0
    rejected: int = 0
    conflicts: int = 0
    reject_reasons: set[int] = field(default_factory=set)


def _unviewed(payload: bytes | memoryview | ScatteredPayload) -> bytes | bytearray:
    """The payload as the object behind the view (no copy) when the view covers it whole, else a copy.

    pyarrow (26.0.1 measured) never frees a ``memoryview`` that ``pa.array`` converts: a
    view in an output row would keep its whole message alive in the worker for good. A
    built message is a view of its own buffer, so this costs no copy; a one-piece message
    is a slice of its segment, copied (one segment at most).
    """
    if isinstance(payload, bytes):
        return payload
    if isinstance(payload, ScatteredPayload):  # not from the judge's assemblers (they join): any caller's
        return bytes(payload)
    whole = payload.obj
    if isinstance(whole, (bytes, bytearray)) and payload.contiguous and payload.nbytes == len(whole):
        return whole
    return payload.tobytes()


def _length(value: int) -> int | None:
    return None if value == UNKNOWN_LENGTH else value


def _quarantine(
    raw: Original | None, reason: int, detail: str, header: SegmentHeader | None, sink: QuarantineSink | None = None
) -> Row:
    row: Row = {
        "kind": "quarantine",
        "group_id": header.group_id if header else None,
        "msg_seq_number": header.msg_seq_number if header else None,
        "offset": header.offset if header else None,
        "reason": int(reason),
        "reason_name": Reason(reason).name,
        "detail": detail,
    }
    ref = sink.put(raw) if sink is not None and raw is not None else None
    if ref is None:  # in the row (a handle with no sink to copy it: read back, as without a store)
        row["raw"] = bytes(raw) if isinstance(raw, StoredOriginal) else raw
    else:
        row["raw"] = None
        row["raw_path"], row["raw_offset"], row["raw_length"] = ref
    return row


def _raw_rows(raws: Iterable[Original], reason: int, detail: str, sink: QuarantineSink | None) -> list[Row]:
    rows = []
    for raw in raws:
        try:
            header: SegmentHeader | None = decode_header(raw.head if isinstance(raw, StoredOriginal) else raw)
        except SegmentationError:
            header = None
        rows.append(_quarantine(raw, reason, detail, header, sink))
    return rows


class GroupRows:
    """Collects one group's events into message rows and quarantine rows."""

    def __init__(self, group_id: bytes | None, sink: QuarantineSink | None = None) -> None:
        self.group_id = group_id
        self.sink = sink
        self.messages: dict[int, _Acc] = {}
        self.quarantine: list[Row] = []
        self.missing_seq_numbers: list[int] = []

    def _acc(self, seq: int) -> _Acc:
        acc = self.messages.get(seq)
        if acc is None:
            acc = self.messages[seq] = _Acc(seq)
        return acc

    def _complete(self, ev: MessageComplete) -> None:
        acc = self._acc(ev.msg_seq_number)
        acc.status, acc.reason = Status.COMPLETE, 0
        if isinstance(ev.payload, StoredBody):
            acc.payload_path = ev.payload.location
        else:
            acc.payload = _unviewed(ev.payload)
        acc.message_checksum = ev.checksum
        acc.stored_length, acc.original_length = ev.stored_length, ev.original_length
        acc.segments_used = ev.segments

    def _failed(self, ev: MessageFailed) -> None:
        acc = self._acc(ev.msg_seq_number)
        conflict = ev.reason == Reason.CONFLICTING_DUPLICATE  # two assemblies passed every check
        acc.status, acc.reason = Status.CONFLICT if conflict else Status.CORRUPT, int(ev.reason)
        self.quarantine += _raw_rows((*ev.segments, *ev.stored), ev.reason, str(ev.error), self.sink)

    def add(self, ev: Event) -> None:
        """Account for one event."""
        if isinstance(ev, MessageComplete):
            self._complete(ev)
        elif isinstance(ev, GroupComplete):
            for m in ev.messages:
                self._complete(m)
        elif isinstance(ev, Duplicate):
            self._acc(ev.msg_seq_number).duplicates += 1
        elif isinstance(ev, Rejected):
            self.quarantine.append(_quarantine(ev.raw, ev.reason, str(ev.error), ev.header, self.sink))
            if ev.header is not None:
                acc = self._acc(ev.header.msg_seq_number)
                acc.rejected += 1
                acc.conflicts += isinstance(ev, ConflictingDuplicate)
                acc.reject_reasons.add(int(ev.reason))
        elif isinstance(ev, MessageFailed):
            self._failed(ev)
        elif isinstance(ev, GroupFailed):
            for f in ev.failed:
                self._failed(f)
            rows = _raw_rows((*ev.segments, *ev.stored), ev.reason, "another message of the group failed", self.sink)
            self.quarantine += rows
            for row in rows:
                acc = self._acc(row["msg_seq_number"])
                if acc.status is None:
                    acc.status, acc.reason = Status.GROUP_FAILED, int(ev.reason)
        elif isinstance(ev, Unfinished):
            self._unfinished(ev)

    def _unfinished(self, ev: Unfinished) -> None:
        rows = _raw_rows((*ev.segments, *ev.stored), ev.reason, f"group {ev.cause.value}: incomplete", self.sink)
        self.quarantine += rows
        gaps = {g.msg_seq_number: g for g in ev.gaps}
        held = {row["msg_seq_number"] for row in rows if row["msg_seq_number"] is not None}
        for seq in sorted(held | set(gaps) | set(ev.missing_seq_numbers)):
            acc = self._acc(seq)
            gap = gaps.get(seq)
            if gap is not None:
                acc.status = Status.CONFLICT if acc.conflicts else Status.INCOMPLETE
                acc.reason = int(Reason.INCOMPLETE_MSG)
                acc.stored_length = gap.stored_length
                acc.missing_ranges = [{"start": s, "end": e} for s, e in gap.missing_ranges]
            elif seq in ev.missing_seq_numbers:
                acc.status, acc.reason = Status.INCOMPLETE, int(Reason.INCOMPLETE_GROUP)
                acc.missing_ranges = [{"start": 0, "end": None}]
            else:  # whole, but its Unit-of-Work group is not
                acc.status, acc.reason = Status.INCOMPLETE, int(ev.reason)
        self.missing_seq_numbers = list(ev.missing_seq_numbers)

    def rows(self) -> list[Row]:
        """Message rows (by MsgSeqNumber) followed by quarantine rows."""
        out: list[Row] = []
        for seq in sorted(self.messages):
            acc = self.messages[seq]
            status, reason = acc.status, acc.reason
            if status is None:  # only rejected segments were seen for it
                # The lowest code among its rejections, never the first to arrive: the same row for
                # any arrival order (a set, so extra copies of one fault cannot outvote another).
                # MQ's codes sort before the library's, so a declared size above the limit (2030)
                # names the message too_big whatever else its copies show.
                reason = min(acc.reject_reasons, default=None)
                status = Status.TOO_BIG if reason == Reason.MSG_TOO_BIG else Status.INVALID
            out.append(
                {
                    "kind": "message",
                    "group_id": self.group_id,
                    "msg_seq_number": seq,
                    "status": status,
                    "reason": reason,
                    "reason_name": Reason(reason).name if reason else "NONE",
                    "payload": acc.payload,
                    "payload_path": acc.payload_path,
                    "stored_length": acc.stored_length,
                    "original_length": acc.original_length,
                    "message_checksum": acc.message_checksum,
                    "missing_ranges": acc.missing_ranges,
                    "missing_seq_numbers": self.missing_seq_numbers,
                    "segments_used": acc.segments_used,
                    "duplicates": acc.duplicates,
                    "rejected": acc.rejected,
                }
            )
        return out + self.quarantine


def _group_of(ev: Event) -> bytes | None:
    if isinstance(ev, Rejected):
        return ev.header.group_id if ev.header is not None else None
    return ev.group_id


class EventRows:
    """Events of any number of groups, added as they come, to rows (rows of one group together).

    Quarantined originals go to ``sink`` as each event is added, so an event's bytes (or its
    handles on a store, which may be purged once added) need not outlive the call.
    """

    def __init__(self, sink: QuarantineSink | None = None) -> None:
        self.sink = sink
        self.groups: dict[bytes | None, GroupRows] = {}

    def add(self, events: Iterable[Event]) -> None:
        for ev in events:
            gid = _group_of(ev)
            acc = self.groups.get(gid)
            if acc is None:
                acc = self.groups[gid] = GroupRows(gid, self.sink)
            acc.add(ev)

    def rows(self) -> list[Row]:
        return [row for acc in self.groups.values() for row in acc.rows()]


def event_rows(events: Iterable[Event], sink: QuarantineSink | None = None) -> list[Row]:
    """Output rows for events of any number of groups (rows of one group together)."""
    acc = EventRows(sink)
    acc.add(events)
    return acc.rows()


def null_row() -> Row:
    """The quarantine row of a NULL value: a row with no bytes at all is not a segment."""
    return _quarantine(None, Reason.TRUNCATED, "NULL value: no segment bytes", None)


def reassemble_group(
    segments: Iterable[Buffer | Segment | None],
    limits: Limits | None = None,
    *,
    unit_of_work: bool = True,
    bodies: BodyStore | None = None,
    sink: QuarantineSink | None = None,
) -> list[Row]:
    """All output rows for the segments of any number of groups (any order, duplicates, faults, NULLs).

    With ``bodies``, the messages it ``wants`` are built there (their rows carry ``payload_path``);
    with ``sink``, quarantined originals it takes leave by reference.
    """
    asm = Assembler(limits, batch=True, unit_of_work=unit_of_work, bodies=bodies)
    items = list(segments)
    events = asm.receive_many(s for s in items if s is not None)
    return event_rows(events + asm.close(), sink) + [null_row() for s in items if s is None]


def reject_rows(raws: Iterable[Buffer | None], limits: Limits | None = None) -> list[Row]:
    """Quarantine rows for rows Spark could not route (exact reason from the decoder; NULL rows too)."""
    asm = Assembler(limits)
    rows: list[Row] = []
    for raw in raws:
        if raw is None:
            rows.append(null_row())
            continue
        acc = GroupRows(None)
        for ev in asm.receive(raw):
            acc.add(ev)
        rows += acc.quarantine
        if not acc.quarantine:  # decodes after all: the JVM and Python header rules disagree (a bug)
            raise SegmentationError("row passed the decoder but not the Spark header check", reason=Reason.STATE_ERROR)
    return rows
