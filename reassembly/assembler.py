"""The sans-I/O assembler: segments in (any order, any interleaving), typed events out.

No files, sockets, clocks or Spark in here: time comes from an injected
``clock`` and bytes come from the caller. The rules it enforces are the
project's single source of truth; the Spark path calls this same code.

Memory: segment data is held as given (a view into the caller's ``bytes``,
no copy); a message is copied exactly once, into a buffer preallocated at its
stored length, when its last piece arrives. Declared lengths are checked
against the limits before anything is allocated, and decompression never
produces more than the declared original length.
"""

from __future__ import annotations

import bisect
import itertools
import json
import struct
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import zstandard

from segmenter.checksum import ChecksumAlgorithm, Combiner, checksum
from segmenter.errors import (
    ChecksumError,
    ConflictError,
    DecompressionError,
    FlagsError,
    HeaderError,
    IncompleteError,
    LimitError,
    MessageTooBigError,
    OffsetError,
    OriginalLengthError,
    Reason,
    SegmentationError,
    SequenceError,
)
from segmenter.flags import Codec, group_bits, in_group, is_last_in_group
from segmenter.wire import (
    DEFAULT_MAX_SEGMENT_SIZE,
    UNKNOWN_LENGTH,
    Buffer,
    Segment,
    SegmentHeader,
    _check_header_fields,
    decode_header,
    decode_segment,
    verify_data,
)

from ._state import GroupInput, GroupState, transition
from .bodies import BodyStore, MessageKey, StoredBody
from .events import (
    Cause,
    ChecksumMismatch,
    ConflictingDuplicate,
    Duplicate,
    Event,
    GapReport,
    GroupComplete,
    GroupFailed,
    Late,
    MessageComplete,
    MessageFailed,
    Rejected,
    Unfinished,
)


@dataclass(frozen=True)
class Limits:
    """Bounds on what one assembler will hold. Defaults suit a single consumer process."""

    max_message_size: int = 1 << 30  # declared original/stored length above this: 2030
    max_segment_size: int = DEFAULT_MAX_SEGMENT_SIZE  # encoded segment above this: 2218
    max_buffered_bytes: int = 2 << 30  # segment data held across all open groups
    max_open_groups: int = 100_000
    expiry_seconds: float | None = None  # incomplete groups older than this expire (needs a clock)
    remember_closed: int = 100_000  # finished group ids kept to recognise late segments


@dataclass
class _Piece:
    header: SegmentHeader
    data: Buffer  # or, for a message kept in a BodyStore, the store's handle (compares, converts to bytes)

    @property
    def raw(self) -> bytes:
        return Segment(self.header, self.data).encode()


@dataclass
class _Message:
    seq: int
    ref: SegmentHeader  # first accepted header: what later segments must agree with
    offsets: list[int] = field(default_factory=list)  # sorted
    pieces: dict[int, _Piece] = field(default_factory=dict)
    received: int = 0
    duplicates: int = 0
    last_end: int | None = None  # end of the LAST segment, once seen
    stored_length: int = UNKNOWN_LENGTH
    original_length: int = UNKNOWN_LENGTH
    message_checksum: int | None = None
    alternates: dict[int, list[_Piece]] = field(default_factory=dict)  # conflicting copies, by offset
    stored: bool = False  # body kept in the BodyStore, not in memory
    decoded: bool = False  # stored and decompressed into the store's output

    @property
    def key(self) -> MessageKey:
        return (self.ref.group_id, self.seq)

    @property
    def covered(self) -> bool:
        return self.last_end is not None and self.received == self.last_end

    def raws(self) -> tuple[bytes, ...]:
        held = [self.pieces[o] for o in self.offsets] + [p for alts in self.alternates.values() for p in alts]
        return tuple(p.raw for p in held)

    def held_bytes(self) -> int:
        """Bytes held in memory (none for a stored body)."""
        if self.stored:
            return 0
        return sum(p.header.data_length for p in self.pieces.values()) + sum(
            p.header.data_length for alts in self.alternates.values() for p in alts
        )

    def gap_report(self) -> GapReport:
        missing: list[tuple[int, int | None]] = []
        pos = 0
        for o in self.offsets:
            if o > pos:
                missing.append((pos, o))
            pos = o + self.pieces[o].header.data_length
        end = self.stored_length if self.stored_length != UNKNOWN_LENGTH else None
        if end is None or pos < end:
            missing.append((pos, end))
        return GapReport(
            msg_seq_number=self.seq,
            missing_ranges=tuple(missing),
            stored_length=end,
            received_bytes=self.received,
            last_segment_seen=self.last_end is not None,
        )


@dataclass
class _Group:
    group_id: bytes
    grouped: bool
    first_seen: float
    messages: dict[int, _Message] = field(default_factory=dict)
    last_seq: int | None = None
    delivered: set[int] = field(default_factory=set)  # non-UoW: messages already delivered
    fingerprints: dict[tuple[int, int], Fingerprint] = field(default_factory=dict)  # of delivered pieces
    buffered: int = 0
    state: GroupState = GroupState.OPEN


Fingerprint = tuple[int, int, int]  # data_length, data_checksum, msg_flags


def _fingerprint(h: SegmentHeader) -> Fingerprint:
    return (h.data_length, h.data_checksum, h.msg_flags)


@dataclass
class _Closed:
    """What is remembered of a finished group: its end state and what it delivered."""

    state: GroupState
    delivered: dict[tuple[int, int], Fingerprint]  # (MsgSeqNumber, Offset) of delivered pieces


_SNAPSHOT_MAGIC = b"SGAS\x01"
_MAX_TRIALS = 64  # combinations of conflicting copies tried against the message checksum
_LEN = struct.Struct(">Q")


class Assembler:
    """Reassembles segments of many interleaved messages and groups.

    ``unit_of_work=True`` (default) delivers a group only when every message
    1..last is present, as one :class:`GroupComplete` in MsgSeqNumber order;
    with ``False`` each message of a group is delivered as it completes.
    Messages not in a group are delivered as :class:`MessageComplete`.

    ``batch=True`` is for when every segment is at hand before any message is
    judged (a Spark group, a file): nothing completes until :meth:`close`, so
    the result does not depend on arrival order, not even for conflicting
    copies (the message checksum picks the right one whatever came first).
    """

    def __init__(
        self,
        limits: Limits | None = None,
        *,
        clock: Callable[[], float] | None = None,
        unit_of_work: bool = True,
        batch: bool = False,
        bodies: BodyStore | None = None,
    ) -> None:
        self.limits = limits or Limits()
        self.batch = batch
        self.bodies = bodies
        if self.limits.expiry_seconds is not None and clock is None:
            raise SegmentationError("expiry_seconds needs a clock", reason=Reason.STATE_ERROR)
        self._clock = clock
        self.unit_of_work = unit_of_work
        self._groups: OrderedDict[bytes, _Group] = OrderedDict()  # oldest first
        self._closed: OrderedDict[bytes, _Closed] = OrderedDict()
        self.buffered_bytes = 0

    # ----------------------------------------------------------------- input
    def receive(self, item: Buffer | Segment) -> list[Event]:
        """Take one segment (encoded bytes or a :class:`Segment`); return what happened."""
        events: list[Event] = []
        if self.limits.expiry_seconds is not None:
            events += self.expire()
        segment = self._decode(item, events)
        if segment is not None:
            self._accept(segment, events)
        return events

    def receive_many(self, items: Iterable[Buffer | Segment]) -> list[Event]:
        """``receive`` each item; all events in order."""
        events: list[Event] = []
        for item in items:
            events += self.receive(item)
        return events

    def _decode(self, item: Buffer | Segment, events: list[Event]) -> Segment | None:
        limits = self.limits
        try:
            if isinstance(item, Segment):
                _check_header_fields(item.header, limits.max_message_size)
                verify_data(item.header, item.data)
                return item
            return decode_segment(
                item, max_segment_size=limits.max_segment_size, max_message_size=limits.max_message_size
            )
        except SegmentationError as exc:
            raw = item.encode() if isinstance(item, Segment) else bytes(item)
            header = item.header if isinstance(item, Segment) else _header_or_none(raw)
            cls = ChecksumMismatch if isinstance(exc, ChecksumError) else Rejected
            events.append(cls(exc.reason, exc, raw, header))
            return None

    def _reject(
        self, events: list[Event], seg: Segment, exc: SegmentationError, cls: type[Rejected] = Rejected
    ) -> None:
        events.append(cls(exc.reason, exc, seg.encode(), seg.header))

    def _late(
        self, events: list[Event], seg: Segment, state: str, delivered: dict[tuple[int, int], Fingerprint]
    ) -> None:
        """A segment after its message left: a duplicate if identical to what was delivered."""
        h = seg.header
        held = delivered.get((h.msg_seq_number, h.offset))
        if held == _fingerprint(h):
            events.append(Duplicate(h.group_id, h.msg_seq_number, h.offset, h.data_length))
        elif held is not None:
            err: SegmentationError = ConflictError(
                f"different bytes for offset {h.offset} of delivered message {h.msg_seq_number}",
                offset=h.offset,
                msg_seq_number=h.msg_seq_number,
                held_checksum=held[1],
                new_checksum=h.data_checksum,
            )
            self._reject(events, seg, err, ConflictingDuplicate)
        else:
            err = SegmentationError(
                f"segment for a message that is already {state}",
                reason=Reason.LATE_SEGMENT,
                state=state,
                msg_seq_number=h.msg_seq_number,
                offset=h.offset,
            )
            self._reject(events, seg, err, Late)

    def _accept(self, seg: Segment, events: list[Event]) -> None:
        h = seg.header
        gid = h.group_id
        closed = self._closed.get(gid)
        if closed is not None:
            self._late(events, seg, closed.state.value, closed.delivered)
            return
        group = self._groups.get(gid)
        if group is None:
            if not in_group(h.msg_flags) and h.msg_seq_number != 1:
                self._reject(
                    events,
                    seg,
                    SequenceError("a message not in a group must have MsgSeqNumber 1", msg_seq_number=h.msg_seq_number),
                )
                return
            while len(self._groups) >= self.limits.max_open_groups:
                oldest = next(iter(self._groups.values()))
                events.append(self._unfinished(oldest, Cause.EVICTED, GroupInput.EVICT))
            group = _Group(gid, in_group(h.msg_flags), self._clock() if self._clock else 0.0)
            self._groups[gid] = group
        if h.msg_seq_number in group.delivered:
            self._late(events, seg, "delivered", group.fingerprints)
            return
        msg = group.messages.get(h.msg_seq_number)
        created = msg is None
        if msg is None:
            msg = _Message(h.msg_seq_number, h, stored=self.bodies is not None and self.bodies.wants(h))
        try:
            self._check_group(group, h)
            if self._store(msg, seg, events) and not msg.stored:
                group.buffered += h.data_length
                self.buffered_bytes += h.data_length
                if is_last_in_group(h.msg_flags):
                    group.last_seq = h.msg_seq_number
        except SegmentationError as exc:
            self._reject(events, seg, exc, ConflictingDuplicate if isinstance(exc, ConflictError) else Rejected)
            if not group.messages:
                del self._groups[gid]
            return
        if created:
            group.messages[h.msg_seq_number] = msg
        self._progress(group, msg, events)
        self._enforce_memory(events, gid)

    def _check_group(self, group: _Group, h: SegmentHeader) -> None:
        seq = h.msg_seq_number
        if in_group(h.msg_flags) != group.grouped:
            raise FlagsError("MSG_IN_GROUP flags disagree within the group", msg_flags=h.msg_flags, msg_seq_number=seq)
        if not group.grouped:
            if seq != 1:
                raise SequenceError("a message not in a group must have MsgSeqNumber 1", msg_seq_number=seq)
            return
        if group.last_seq is not None and seq > group.last_seq:
            raise SequenceError(
                f"MsgSeqNumber {seq} is beyond the group's last message {group.last_seq}",
                msg_seq_number=seq,
                last_seq_number=group.last_seq,
            )
        if is_last_in_group(h.msg_flags):
            if group.last_seq is not None and group.last_seq != seq:
                raise FlagsError(
                    f"LAST_MSG_IN_GROUP repeated: on {seq}, already on {group.last_seq}",
                    msg_seq_number=seq,
                    last_seq_number=group.last_seq,
                )
            beyond = [s for s in group.messages if s > seq]
            if beyond:
                raise SequenceError(
                    f"LAST_MSG_IN_GROUP on {seq} but message {max(beyond)} exists",
                    msg_seq_number=seq,
                    highest_seq_number=max(beyond),
                )
        elif group.last_seq == seq:
            raise FlagsError("message is LAST_MSG_IN_GROUP in other segments", msg_seq_number=seq)

    def _store(self, msg: _Message, seg: Segment, events: list[Event]) -> bool:
        """Validate against what the message already holds; keep the piece. False for a duplicate."""
        h, ref = seg.header, msg.ref
        if (h.codec, h.algorithm, group_bits(h.msg_flags), h.length_deferred) != (
            ref.codec,
            ref.algorithm,
            group_bits(ref.msg_flags),
            ref.length_deferred,
        ):
            raise HeaderError(
                "codec, checksum algorithm, group flags or LENGTH_DEFERRED differ from earlier segments of the message",
                reason=Reason.HEADER_MISMATCH,
                msg_seq_number=h.msg_seq_number,
                offset=h.offset,
            )
        stored = _merge(msg.stored_length, h.stored_length, "stored_length", h)
        original = _merge(msg.original_length, h.original_length, "original_length", h)
        mcrc = msg.message_checksum
        if h.message_checksum is not None:
            if mcrc is not None and mcrc != h.message_checksum:
                raise HeaderError(
                    "message checksum differs from earlier segments",
                    reason=Reason.HEADER_MISMATCH,
                    expected=mcrc,
                    actual=h.message_checksum,
                )
            mcrc = h.message_checksum
        existing = msg.pieces.get(h.offset)
        if existing is not None:
            alternates = msg.alternates.setdefault(h.offset, [])
            for held in (existing, *alternates):
                if _fingerprint(held.header) == _fingerprint(h) and held.data == seg.data:
                    msg.duplicates += 1
                    events.append(Duplicate(h.group_id, h.msg_seq_number, h.offset, h.data_length))
                    return False
            eh = existing.header
            if (eh.data_length, eh.msg_flags) != (h.data_length, h.msg_flags):
                raise ConflictError(
                    f"different segment at offset {h.offset} of message {h.msg_seq_number}; first copy kept",
                    offset=h.offset,
                    msg_seq_number=h.msg_seq_number,
                    held_length=eh.data_length,
                    new_length=h.data_length,
                )
            # Same place, same size, other bytes: keep both until the message checksum decides.
            alternates.append(_Piece(h, self._keep(msg, None, seg.data)))
            return True
        i = bisect.bisect_left(msg.offsets, h.offset)
        neighbours = [msg.pieces[msg.offsets[j]].header for j in (i - 1, i) if 0 <= j < len(msg.offsets)]
        for other in neighbours:
            if other.offset < h.end and h.offset < other.end:
                raise OffsetError(
                    f"segment [{h.offset}, {h.end}) overlaps [{other.offset}, {other.end})",
                    offset=h.offset,
                    end=h.end,
                    other_offset=other.offset,
                    other_end=other.end,
                )
        if h.is_last_segment:
            if msg.last_end is not None:
                raise FlagsError(
                    f"LAST_SEGMENT repeated: at offset {h.offset}, earlier one ends at {msg.last_end}",
                    offset=h.offset,
                    last_end=msg.last_end,
                )
            if msg.offsets and msg.pieces[msg.offsets[-1]].header.end > h.end:
                raise OffsetError(f"data beyond the last segment (ends {h.end})", offset=h.offset, end=h.end)
        elif msg.last_end is not None and h.end > msg.last_end:
            raise OffsetError(
                f"segment [{h.offset}, {h.end}) lies past the last segment's end {msg.last_end}",
                offset=h.offset,
                last_end=msg.last_end,
            )
        if stored != UNKNOWN_LENGTH and h.end > stored:
            raise OffsetError(f"segment ends at {h.end}, past stored length {stored}", end=h.end, stored_length=stored)
        msg.offsets.insert(i, h.offset)
        msg.pieces[h.offset] = _Piece(h, self._keep(msg, h.offset, seg.data))
        msg.received += h.data_length
        msg.stored_length, msg.original_length, msg.message_checksum = stored, original, mcrc
        if h.is_last_segment:
            msg.last_end = h.end
        return True

    def _keep(self, msg: _Message, offset: int | None, data: Buffer) -> Buffer:
        """What to hold for a piece: the bytes (no copy where safe), or the store's handle."""
        if msg.stored:
            assert self.bodies is not None
            held: Buffer = self.bodies.put(msg.key, offset, data)
            return held
        return _own(data)

    # ------------------------------------------------------------ completion
    def _progress(self, group: _Group, msg: _Message, events: list[Event], final: bool = False) -> None:
        if not msg.covered or group.state != GroupState.OPEN or (self.batch and not final):
            return
        if not group.grouped:
            self._finish(group, [msg], events)
        elif not self.unit_of_work:
            group.delivered.add(msg.seq)
            result, conflicts = self._build(group.group_id, msg)
            self._release(group, [msg], isinstance(result, MessageComplete))
            del group.messages[msg.seq]
            if isinstance(result, MessageFailed):
                self._terminate(group, GroupInput.FAIL)
                events.append(GroupFailed(group.group_id, result.reason, (result,), self._group_raws(group)))
                return
            events += conflicts
            events.append(result)
            if group.last_seq is not None and len(group.delivered) == group.last_seq:
                self._terminate(group, GroupInput.COMPLETE)
        elif (
            group.last_seq is not None
            and len(group.messages) == group.last_seq
            and all(m.covered for m in group.messages.values())
        ):
            self._finish(group, [group.messages[s] for s in range(1, group.last_seq + 1)], events)

    def _finish(self, group: _Group, messages: list[_Message], events: list[Event]) -> None:
        built = [self._build(group.group_id, m) for m in messages]
        results = [r for r, _ in built]
        failed = tuple(r for r in results if isinstance(r, MessageFailed))
        bad = {f.msg_seq_number for f in failed}
        others = tuple(raw for m in messages if m.seq not in bad for raw in m.raws()) if failed else ()
        self._release(group, messages, not failed)
        if not failed:
            events += [c for _, conflicts in built for c in conflicts]
        if failed and not group.grouped:
            events.append(failed[0])
        elif failed:
            events.append(GroupFailed(group.group_id, failed[0].reason, failed, others))
        elif group.grouped:
            events.append(GroupComplete(group.group_id, tuple(r for r in results if isinstance(r, MessageComplete))))
        else:
            events.append(results[0])
        self._terminate(group, GroupInput.FAIL if failed else GroupInput.COMPLETE)

    def _build(self, group_id: bytes, msg: _Message) -> tuple[MessageComplete | MessageFailed, list[Event]]:
        """Assemble and verify; with conflicting copies, the combination the message checksum accepts wins.

        The first copies are tried first (MQ's "first copy kept"); alternatives are
        tried only when that fails, at most ``_MAX_TRIALS`` combinations. Losing
        copies come back as :class:`ConflictingDuplicate` events.
        """
        choices = [[msg.pieces[o], *msg.alternates.get(o, ())] for o in msg.offsets]
        first_error: SegmentationError | None = None
        for combo in itertools.islice(itertools.product(*choices), _MAX_TRIALS):
            try:
                payload = self._assemble(msg, combo)
            except SegmentationError as exc:
                first_error = first_error or exc
                continue
            winners = {id(w) for w in combo}
            losers = [p for options in choices for p in options if id(p) not in winners]
            msg.pieces = {w.header.offset: w for w in combo}
            msg.alternates = {}
            for p in losers:
                msg.alternates.setdefault(p.header.offset, []).append(p)
            conflicts: list[Event] = [
                ConflictingDuplicate(
                    Reason.CONFLICTING_DUPLICATE,
                    ConflictError(
                        f"copy at offset {p.header.offset} of message {msg.seq} lost to the one that matches the"
                        " message checksum",
                        offset=p.header.offset,
                        msg_seq_number=msg.seq,
                    ),
                    p.raw,
                    p.header,
                )
                for p in losers
            ]
            complete = MessageComplete(
                group_id=group_id,
                msg_seq_number=msg.seq,
                payload=payload,
                msg_flags=msg.ref.msg_flags,
                segments=len(combo),
                duplicates=msg.duplicates,
                stored_length=msg.stored_length,
                original_length=msg.original_length,
                checksum=msg.message_checksum,
            )
            return complete, conflicts
        assert first_error is not None
        return MessageFailed(group_id, msg.seq, first_error.reason, first_error, msg.raws()), []

    def _assemble(self, msg: _Message, pieces: tuple[_Piece, ...]) -> memoryview | StoredBody:
        if msg.message_checksum is None or msg.original_length == UNKNOWN_LENGTH:
            raise OriginalLengthError("message has no original length or checksum", msg_seq_number=msg.seq)
        if msg.stored:
            assert self.bodies is not None
            return _assemble_stored(msg, pieces, self.bodies, self.limits.max_message_size)
        return _assemble(msg, pieces, self.limits.max_message_size)

    # --------------------------------------------------- leaving the assembler
    def _release(self, group: _Group, messages: list[_Message], delivered: bool) -> None:
        for m in messages:
            if delivered:
                group.fingerprints.update(((m.seq, o), _fingerprint(p.header)) for o, p in m.pieces.items())
            freed = m.held_bytes()
            group.buffered -= freed
            self.buffered_bytes -= freed
            if m.stored and self.bodies is not None:
                if delivered:
                    self.bodies.finish(m.key, m.decoded)
                else:
                    self.bodies.discard(m.key)
            m.pieces.clear()
            m.offsets.clear()
            m.alternates.clear()

    def _group_raws(self, group: _Group) -> tuple[bytes, ...]:
        return tuple(raw for m in group.messages.values() for raw in m.raws())

    def _terminate(self, group: _Group, how: GroupInput) -> None:
        group.state = transition(group.state, how)
        if self.bodies is not None:
            for m in group.messages.values():
                if m.stored:
                    self.bodies.discard(m.key)  # not delivered: whatever the store kept goes
        self.buffered_bytes -= group.buffered
        group.buffered = 0
        self._groups.pop(group.group_id, None)
        self._closed[group.group_id] = _Closed(group.state, group.fingerprints)
        while len(self._closed) > self.limits.remember_closed:
            self._closed.popitem(last=False)

    def _report(self, group: _Group, cause: Cause, segments: tuple[bytes, ...] = ()) -> Unfinished:
        gaps = tuple(m.gap_report() for _, m in sorted(group.messages.items()) if not m.covered)
        present = set(group.messages) | group.delivered
        top = group.last_seq if group.last_seq is not None else max(present, default=0)
        missing = tuple(s for s in range(1, top + 1) if s not in present) if group.grouped else ()
        return Unfinished(
            group_id=group.group_id,
            cause=cause,
            reason=Reason.INCOMPLETE_MSG if gaps else Reason.INCOMPLETE_GROUP,
            gaps=gaps,
            missing_seq_numbers=missing,
            last_seq_number=group.last_seq,
            segments=segments,
        )

    def _unfinished(self, group: _Group, cause: Cause, how: GroupInput) -> Unfinished:
        event = self._report(group, cause, self._group_raws(group))
        self._terminate(group, how)
        return event

    def _enforce_memory(self, events: list[Event], current: bytes) -> None:
        """Evict oldest groups first; the current group last, only if alone it is too big."""
        while self.buffered_bytes > self.limits.max_buffered_bytes and self._groups:
            victim = next((g for k, g in self._groups.items() if k != current), None) or self._groups[current]
            events.append(self._unfinished(victim, Cause.EVICTED, GroupInput.EVICT))

    def expire(self) -> list[Event]:
        """Expire groups older than ``expiry_seconds`` (by the injected clock)."""
        if self.limits.expiry_seconds is None or self._clock is None:
            return []
        deadline = self._clock() - self.limits.expiry_seconds
        events: list[Event] = []
        while self._groups:
            group = next(iter(self._groups.values()))
            if group.first_seen > deadline:
                break
            events.append(self._unfinished(group, Cause.EXPIRED, GroupInput.EXPIRE))
        return events

    def close(self) -> list[Event]:
        """End of input: in batch mode, judge every group now; what is still open comes back as
        :class:`Unfinished` (cause closed)."""
        events: list[Event] = []
        if self.batch:
            for group in list(self._groups.values()):
                for seq in sorted(group.messages):
                    if seq in group.messages:
                        self._progress(group, group.messages[seq], events, final=True)
        events += [self._unfinished(g, Cause.CLOSED, GroupInput.CLOSE) for g in list(self._groups.values())]
        return events

    def pending(self) -> list[Unfinished]:
        """What open groups are missing right now, without closing them (segments left out)."""
        return [self._report(g, Cause.CLOSED) for g in self._groups.values()]

    @property
    def open_groups(self) -> int:
        return len(self._groups)

    # ----------------------------------------------------------- persistence
    def snapshot(self) -> bytes:
        """Serialise the open state (held segments, ages, counters, finished ids)."""
        meta = {
            "groups": [
                {
                    "id": g.group_id.hex(),
                    "first_seen": g.first_seen,
                    "duplicates": {str(s): m.duplicates for s, m in g.messages.items()},
                    "delivered": sorted(g.delivered),
                    "segments": sum(len(m.pieces) for m in g.messages.values()),
                }
                for g in self._groups.values()
            ],
            "closed": [
                [k.hex(), v.state.value, [[*key, *fp] for key, fp in v.delivered.items()]]
                for k, v in self._closed.items()
            ],
        }
        blob = json.dumps(meta).encode()
        parts = [_SNAPSHOT_MAGIC, _LEN.pack(len(blob)), blob]
        for g in self._groups.values():
            for raw in self._group_raws(g):
                parts += [_LEN.pack(len(raw)), raw]
        return b"".join(parts)

    @classmethod
    def restore(
        cls,
        blob: bytes,
        limits: Limits | None = None,
        *,
        clock: Callable[[], float] | None = None,
        unit_of_work: bool = True,
    ) -> Assembler:
        """Rebuild an assembler from :meth:`snapshot` output (segments are re-verified)."""
        asm = cls(limits, clock=clock, unit_of_work=unit_of_work)
        view = memoryview(blob)
        try:
            if bytes(view[:5]) != _SNAPSHOT_MAGIC:
                raise SegmentationError("not an assembler snapshot", reason=Reason.STATE_ERROR)
            (n,) = _LEN.unpack_from(view, 5)
            meta = json.loads(bytes(view[13 : 13 + n]))
            pos = 13 + n
            for g in meta["groups"]:
                for _ in range(g["segments"]):
                    (size,) = _LEN.unpack_from(view, pos)
                    seg = decode_segment(bytes(view[pos + 8 : pos + 8 + size]), max_segment_size=1 << 62)
                    pos += 8 + size
                    asm._accept(seg, [])
                group = asm._groups[bytes.fromhex(g["id"])]
                group.first_seen = g["first_seen"]
                group.delivered = set(g["delivered"])
                for s, d in g["duplicates"].items():
                    group.messages[int(s)].duplicates = d
            asm._closed = OrderedDict(
                (bytes.fromhex(k), _Closed(GroupState(v), {(f[0], f[1]): (f[2], f[3], f[4]) for f in prints}))
                for k, v, prints in meta["closed"]
            )
        except (ValueError, KeyError, TypeError, struct.error) as exc:
            raise SegmentationError(f"corrupt snapshot: {exc}", reason=Reason.STATE_ERROR) from None
        return asm


def _own(data: Buffer) -> Buffer:
    """Keep ``bytes`` and read-only views as they are (no copy); copy anything the caller could change.

    A read-only view is trusted not to change underneath (Arrow buffers, ``bytes``):
    callers that pass ``memoryview(x).toreadonly()`` promise not to modify ``x``.
    """
    if isinstance(data, bytes) or (isinstance(data, memoryview) and data.readonly):
        return data
    return bytes(data)


def _merge(known: int, new: int, name: str, h: SegmentHeader) -> int:
    if new == UNKNOWN_LENGTH:
        return known
    if known not in (UNKNOWN_LENGTH, new):
        raise OriginalLengthError(
            f"{name} {new} differs from {known} in earlier segments",
            field=name,
            expected=known,
            actual=new,
            offset=h.offset,
        )
    return new


def _header_or_none(raw: bytes) -> SegmentHeader | None:
    try:
        return decode_header(raw)
    except SegmentationError:
        return None


def _combined_checksum(msg: _Message, pieces: tuple[_Piece, ...]) -> int:
    """The message checksum from the pieces' verified checksums: no second pass over the bytes."""
    hot = pieces[0].header.data_length if len(pieces) > 2 else 0
    combiner = Combiner(msg.ref.algorithm, hot)
    for p in pieces:
        combiner.add(p.header.data_checksum, p.header.data_length)
    return combiner.value


def _check_message(msg: _Message, actual: int) -> None:
    if actual != msg.message_checksum:
        raise ChecksumError(
            f"message {msg.seq} checksum mismatch",
            reason=Reason.MESSAGE_CHECKSUM_ERROR,
            expected=msg.message_checksum,
            actual=actual,
            msg_seq_number=msg.seq,
        )


def _assemble(msg: _Message, pieces: tuple[_Piece, ...], max_message_size: int) -> memoryview:
    """Copy the pieces into one preallocated buffer, decode, verify the message checksum."""
    if len(pieces) == 1:
        body = memoryview(pieces[0].data).toreadonly()
    else:
        buf = bytearray(msg.stored_length)
        for p in pieces:
            buf[p.header.offset : p.header.end] = p.data
        body = memoryview(buf).toreadonly()
    if msg.ref.codec == Codec.NONE:
        # Pieces were verified on arrival; combine their checksums instead of a second pass.
        _check_message(msg, _combined_checksum(msg, pieces))
        return body
    out = bytearray(msg.original_length)
    _inflate(body, msg.original_length, max_message_size, _BufferSink(out))
    payload = memoryview(out).toreadonly()
    _check_message(msg, checksum(msg.ref.algorithm, payload))
    return payload


def _assemble_stored(msg: _Message, pieces: tuple[_Piece, ...], bodies: BodyStore, max_message_size: int) -> StoredBody:
    """As :func:`_assemble`, for a body in a store: the pieces are already in place, nothing is copied
    into memory; a compressed body is decompressed from the store into the store."""
    if msg.ref.codec == Codec.NONE:
        actual = _combined_checksum(msg, pieces)
        _check_message(msg, actual)  # before any I/O: a failing combination costs nothing
        bodies.body(msg.key, [(p.header.offset, p.data) for p in pieces], msg.stored_length)
        msg.decoded = False
        return StoredBody(bodies.location(msg.key), msg.stored_length, actual)
    body = bodies.body(msg.key, [(p.header.offset, p.data) for p in pieces], msg.stored_length)
    out = bodies.output(msg.key)
    out.seek(0)
    out.truncate()
    sink = _FileSink(out, msg.ref.algorithm)
    _inflate(body, msg.original_length, max_message_size, sink)
    _check_message(msg, sink.crc)
    msg.decoded = True
    return StoredBody(bodies.location(msg.key), msg.original_length, sink.crc)


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


def reassemble(segments: Iterable[Buffer | Segment], limits: Limits | None = None) -> bytes:
    """One-shot: the payload of the single message in ``segments``; raises on any problem."""
    messages = reassemble_all(segments, limits)
    if len(messages) != 1:
        raise SegmentationError(f"expected one message, found {len(messages)}", reason=Reason.STATE_ERROR)
    return messages[0]


def reassemble_all(segments: Iterable[Buffer | Segment], limits: Limits | None = None) -> list[bytes]:
    """One-shot: every message in ``segments`` (groups in order); raises the first problem found."""
    asm = Assembler(limits)
    out: list[bytes] = []
    events = asm.receive_many(segments) + asm.close()
    for ev in events:
        if isinstance(ev, (MessageComplete, GroupComplete)):
            for m in ev.messages if isinstance(ev, GroupComplete) else (ev,):
                assert not isinstance(m.payload, StoredBody)  # no BodyStore here: every payload is in memory
                out.append(bytes(m.payload))
        elif isinstance(ev, (Rejected, MessageFailed)):
            raise ev.error
        elif isinstance(ev, GroupFailed):
            raise ev.failed[0].error
        elif isinstance(ev, Unfinished):
            raise IncompleteError(
                f"group {ev.group_id.hex()} incomplete: {ev.gaps or ev.missing_seq_numbers}",
                reason=ev.reason,
                missing=[g.missing_ranges for g in ev.gaps],
                missing_seq_numbers=list(ev.missing_seq_numbers),
            )
    return out


__all__ = ["Assembler", "Limits", "LimitError", "reassemble", "reassemble_all"]
