"""The sans-I/O assembler: segments in (any order, any interleaving), typed events out.

No files, sockets, clocks or Spark in here: time comes from an injected
``clock`` and bytes come from the caller. The rules it enforces are the
project's single source of truth (:mod:`reassembly.rules`, arbitration in
:mod:`segmenter.coverage`); the Spark path calls this same code.

Memory: segment data is held as given (a view into the caller's ``bytes``,
no copy); a message is copied exactly once, into a buffer preallocated at its
stored length, when it is judged. Declared lengths are checked against the
limits before anything is allocated, and decompression never produces more
than the declared original length.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable

from segmenter.coverage import Arbitration, Outcome, RangeSet
from segmenter.errors import ChecksumError, ConflictError, IncompleteError, LimitError, Reason, SegmentationError
from segmenter.flags import Codec, in_group, is_last_in_group
from segmenter.wire import (
    Buffer,
    Segment,
    SegmentHeader,
    _check_header_fields,
    decode_header,
    decode_segment,
    verify_data,
)

from . import rules
from ._state import GroupInput, GroupState, transition
from .bodies import BodyStore, StoredBody
from .build import build
from .events import (
    Cause,
    ChecksumMismatch,
    ConflictingDuplicate,
    Duplicate,
    Event,
    GroupComplete,
    GroupFailed,
    Late,
    MessageComplete,
    MessageFailed,
    Rejected,
    Unfinished,
)
from .model import Closed, Facts, Fingerprint, Group, Limits, Message, Piece, fingerprint
from .snapshot import restore, snapshot

Verdict = Arbitration[Piece, Facts, memoryview | StoredBody]


class Assembler:
    """Reassembles segments of many interleaved messages and groups.

    ``unit_of_work=True`` (default) delivers a group only when every message
    1..last is present, as one :class:`GroupComplete` in MsgSeqNumber order;
    with ``False`` each message of a group is delivered as it completes.
    Messages not in a group are delivered as :class:`MessageComplete`.

    Every message is judged by one rule (:func:`reassembly.rules.decide`): among
    the complete candidate assemblies of its segments, exactly one that passes
    every check wins; two that pass with different bytes are a conflict and
    nothing is delivered. ``batch=True`` is for when every segment is at hand
    before any message is judged (a Spark group, a file): nothing is judged
    until :meth:`close`, so the events do not depend on arrival order. Without
    it a message is judged as soon as a complete candidate exists; what was
    delivered cannot be withdrawn, so a later different copy is a
    :class:`ConflictingDuplicate` (or :class:`Late`).
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
        self._groups: OrderedDict[bytes, Group] = OrderedDict()  # oldest first
        self._closed: OrderedDict[bytes, Closed] = OrderedDict()
        self.buffered_bytes = 0

    # ----------------------------------------------------------------- input
    def receive(self, item: Buffer | Segment) -> list[Event]:
        """Take one segment (encoded bytes or a :class:`Segment`); return what happened."""
        events: list[Event] = []
        if self.limits.expiry_seconds is not None:
            events += self.expire()
        piece = self._decode(item, events)
        if piece is not None:
            self._accept(piece, events)
        return events

    def receive_many(self, items: Iterable[Buffer | Segment]) -> list[Event]:
        """``receive`` each item; all events in order."""
        events: list[Event] = []
        for item in items:
            events += self.receive(item)
        return events

    def _decode(self, item: Buffer | Segment, events: list[Event]) -> Piece | None:
        limits = self.limits
        try:
            if isinstance(item, Segment):
                _check_header_fields(item.header, limits.max_message_size)
                verify_data(item.header, item.data)
                return Piece(item.header, _own(item.data), item.header.pack())
            view = memoryview(_own(item))
            if view.ndim != 1 or view.itemsize != 1:
                view = view.cast("B")
            seg = decode_segment(
                view, max_segment_size=limits.max_segment_size, max_message_size=limits.max_message_size
            )
            return Piece(seg.header, seg.data, view[: seg.header.header_length])
        except SegmentationError as exc:
            raw = item.encode() if isinstance(item, Segment) else bytes(item)
            header = item.header if isinstance(item, Segment) else _header_or_none(raw)
            cls = ChecksumMismatch if isinstance(exc, ChecksumError) else Rejected
            events.append(cls(exc.reason, exc, raw, header))
            return None

    @staticmethod
    def _reject(events: list[Event], piece: Piece, exc: SegmentationError) -> None:
        cls = ConflictingDuplicate if isinstance(exc, ConflictError) else Rejected
        events.append(cls(exc.reason, exc, piece.raw, piece.header))

    def _late(
        self, events: list[Event], piece: Piece, state: str, delivered: dict[tuple[int, int], Fingerprint]
    ) -> None:
        """A segment after its message left: a duplicate if identical to what was delivered."""
        h = piece.header
        held = delivered.get((h.msg_seq_number, h.offset))
        if held == fingerprint(h):
            events.append(Duplicate(h.group_id, h.msg_seq_number, h.offset, h.data_length))
        elif held is not None:
            self._reject(
                events,
                piece,
                ConflictError(
                    f"different bytes for offset {h.offset} of delivered message {h.msg_seq_number}",
                    offset=h.offset,
                    msg_seq_number=h.msg_seq_number,
                    held_checksum=held[1],
                    new_checksum=h.data_checksum,
                ),
            )
        else:
            err = SegmentationError(
                f"segment for a message that is already {state}",
                reason=Reason.LATE_SEGMENT,
                state=state,
                msg_seq_number=h.msg_seq_number,
                offset=h.offset,
            )
            events.append(Late(err.reason, err, piece.raw, h))

    def _accept(self, piece: Piece, events: list[Event]) -> None:
        h = piece.header
        gid, seq = h.group_id, h.msg_seq_number
        closed = self._closed.get(gid)
        if closed is not None:
            self._late(events, piece, closed.state.value, closed.delivered)
            return
        err = rules.lone_refusal(h)
        if err is not None:
            self._reject(events, piece, err)
            return
        group = self._groups.get(gid)
        if group is None:
            while len(self._groups) >= self.limits.max_open_groups:
                oldest = next(iter(self._groups.values()))
                events.append(self._unfinished(oldest, Cause.EVICTED, GroupInput.EVICT))
            group = Group(gid, in_group(h.msg_flags), self._clock() if self._clock else 0.0)
            self._groups[gid] = group
        if seq in group.delivered:
            self._late(events, piece, "delivered", group.fingerprints)
            return
        if not self.batch:  # streaming: the group's rules as known so far, first come first served
            err = rules.group_refusal(group.grouped, group.last_seq, group.messages.keys(), seq, h.msg_flags)
            if err is not None:
                self._reject(events, piece, err)
                if not group.messages:
                    del self._groups[gid]
                return
        msg = group.messages.get(seq)
        if msg is None:
            msg = group.messages[seq] = Message(gid, seq)
        if not self._keep(group, msg, piece, events):
            return
        if not self.batch and is_last_in_group(h.msg_flags):
            group.last_seq = seq
        self._progress(group, msg, events)
        self._enforce_memory(events, gid)

    def _keep(self, group: Group, msg: Message, piece: Piece, events: list[Event]) -> bool:
        """Hold a piece (no copy where safe, or in the store); False for an identical copy."""
        h = piece.header
        here = msg.at.get(h.offset)
        if here is not None:
            for held in here:
                if held.same_as(piece):
                    msg.duplicates += 1
                    events.append(Duplicate(h.group_id, h.msg_seq_number, h.offset, h.data_length))
                    return False
        if self.bodies is not None and not msg.stored and self.bodies.wants(h):
            self._to_store(group, msg)
        if msg.stored:
            self._put(msg, piece, msg.present)
        else:
            group.buffered += h.data_length
            self.buffered_bytes += h.data_length
        if here is None:
            msg.at[h.offset] = [piece]
        else:
            here.append(piece)
        msg.present.add(h.offset, h.end)
        if h.is_last_segment:
            msg.last_ends.add(h.end)
        return True

    def _put(self, msg: Message, piece: Piece, placed: RangeSet) -> None:
        """Move a piece into the store: into the body when nothing held overlaps it, else aside."""
        assert self.bodies is not None
        overlaps = bool(placed.covered(piece.offset, piece.end))
        piece.data = self.bodies.put(msg.key, None if overlaps else piece.offset, piece.buffer())
        piece.head = bytes(piece.head)  # do not keep the caller's whole buffer alive

    def _to_store(self, group: Group, msg: Message) -> None:
        """Some segment of the message wants the store: move what is held in memory there too,
        so where a body lives does not depend on which segment came first."""
        freed = msg.held_bytes()
        group.buffered -= freed
        self.buffered_bytes -= freed
        msg.stored = True
        placed = RangeSet()
        for p in msg.pieces():
            self._put(msg, p, placed)
            placed.add(p.offset, p.end)

    # ------------------------------------------------------------ judging
    def _decide(self, msg: Message) -> Verdict:
        bodies = self.bodies if msg.stored else None
        limit, digest = self.limits.max_message_size, self.limits.digest
        return rules.decide(msg, lambda chain, facts: build(msg.key, facts, chain, limit, bodies, digest))

    def _progress(self, group: Group, msg: Message, events: list[Event]) -> None:
        """Streaming: judge as soon as a complete candidate exists (Unit-of-Work: for every message)."""
        if self.batch or group.state != GroupState.OPEN or not msg.ready:
            return
        if not group.grouped or not self.unit_of_work:
            verdict = self._decide(msg)
            if verdict.outcome != Outcome.INCOMPLETE:
                self._conclude(group, [(msg, verdict)], events)
        elif group.last_seq is not None and len(group.messages) == group.last_seq:
            members = [group.messages[s] for s in range(1, group.last_seq + 1)]
            if all(m.ready and rules.has_candidate(m) for m in members):
                judged = [(m, self._decide(m)) for m in members]
                if all(v.outcome != Outcome.INCOMPLETE for _, v in judged):
                    self._conclude(group, judged, events)

    def _judge_batch(self, group: Group, events: list[Event]) -> None:
        """Batch: judge every message, then the group's rules over the winners in MsgSeqNumber order."""
        verdicts = [(m, self._decide(m)) for _, m in sorted(group.messages.items())]
        grouped: bool | None = None
        admitted: list[int] = []
        last: int | None = None
        for m, v in verdicts:
            if v.outcome != Outcome.COMPLETE:
                continue
            flags = v.winner[-1].header.msg_flags
            if grouped is None:
                grouped = in_group(flags)
            err = rules.group_refusal(grouped, last, admitted, m.seq, flags)
            if err is not None:
                for p in sorted(m.pieces(), key=Piece.key):
                    self._reject(events, p, err)
                self._release(group, [m], delivered=False)
                del group.messages[m.seq]
                continue
            admitted.append(m.seq)
            if is_last_in_group(flags):
                last = m.seq
        if grouped is None:  # no winner to ask: grouped if any segment says so
            grouped = any(in_group(p.header.msg_flags) for m in group.messages.values() for p in m.pieces())
        group.grouped = grouped
        group.last_seq = last
        judged = [(m, v) for m, v in verdicts if m.seq in group.messages and v.outcome != Outcome.INCOMPLETE]
        whole = last is not None and [m.seq for m, _ in judged] == list(range(1, last + 1))
        if not group.grouped or not self.unit_of_work or whole:
            self._conclude(group, judged, events)

    def _conclude(self, group: Group, judged: list[tuple[Message, Verdict]], events: list[Event]) -> None:
        """Events for judged messages: deliver, fail, or fail the whole Unit-of-Work group."""
        if not judged:
            return
        if group.grouped and not self.unit_of_work:
            for m, v in judged:
                if group.state != GroupState.OPEN:
                    return
                group.delivered.add(m.seq)
                result = self._result(group, m, v, events)
                self._release(group, [m], isinstance(result, MessageComplete))
                del group.messages[m.seq]
                if isinstance(result, MessageFailed):
                    events.append(GroupFailed(group.group_id, result.reason, (result,), group.raws()))
                    self._terminate(group, GroupInput.FAIL)  # after the raws: it discards stored bodies
                    return
                events.append(result)
                if group.last_seq is not None and len(group.delivered) == group.last_seq:
                    self._terminate(group, GroupInput.COMPLETE)
            return
        failed = [(m, v) for m, v in judged if v.outcome != Outcome.COMPLETE]
        if failed:
            results = [self._failure(m, v) for m, v in failed]
            bad = {m.seq for m, _ in failed}
            others = tuple(raw for m, _ in judged if m.seq not in bad for raw in m.raws())
            self._release(group, [m for m, _ in judged], delivered=False)
            if group.grouped:
                events.append(GroupFailed(group.group_id, results[0].reason, tuple(results), others))
            else:
                events.append(results[0])
            self._terminate(group, GroupInput.FAIL)
            return
        completes = [self._result(group, m, v, events) for m, v in judged]
        self._release(group, [m for m, _ in judged], delivered=True)
        if group.grouped:
            events.append(GroupComplete(group.group_id, tuple(c for c in completes if isinstance(c, MessageComplete))))
        else:
            events.append(completes[0])
        self._terminate(group, rules.OUTCOME_INPUT[Outcome.COMPLETE])

    def _failure(self, m: Message, v: Verdict) -> MessageFailed:
        assert v.error is not None
        return MessageFailed(m.group_id, m.seq, v.error.reason, v.error, m.raws())

    def _result(self, group: Group, m: Message, v: Verdict, events: list[Event]) -> MessageComplete | MessageFailed:
        """A complete message (its losing copies reported first), or its failure."""
        if v.outcome != Outcome.COMPLETE:
            return self._failure(m, v)
        assert v.payload is not None
        facts = v.facts
        assert facts is not None
        used = {id(p) for p in v.winner}
        losers = sorted((p for p in m.pieces() if id(p) not in used), key=Piece.key)
        for p in losers:
            self._reject(events, p, rules.misfit(p, facts, v.winner))
        group.fingerprints.update(((m.seq, p.offset), fingerprint(p.header)) for p in v.winner)
        m.decoded = m.stored and facts.codec != Codec.NONE
        assert facts.stored_length is not None
        return MessageComplete(
            group_id=m.group_id,
            msg_seq_number=m.seq,
            payload=v.payload,
            msg_flags=v.winner[-1].header.msg_flags,
            segments=len(v.winner),
            duplicates=m.duplicates,
            stored_length=facts.stored_length,
            original_length=facts.original_length,
            checksum=facts.message_checksum,
        )

    # --------------------------------------------------- leaving the assembler
    def _release(self, group: Group, messages: list[Message], delivered: bool) -> None:
        for m in messages:
            freed = m.held_bytes()
            group.buffered -= freed
            self.buffered_bytes -= freed
            if m.stored and self.bodies is not None:
                if delivered:
                    self.bodies.finish(m.key, m.decoded)
                else:
                    self.bodies.discard(m.key)
            m.at.clear()

    def _terminate(self, group: Group, how: GroupInput) -> None:
        group.state = transition(group.state, how)
        if self.bodies is not None:
            for m in group.messages.values():
                if m.stored:
                    self.bodies.discard(m.key)  # not delivered: whatever the store kept goes
        self.buffered_bytes -= group.buffered
        group.buffered = 0
        self._groups.pop(group.group_id, None)
        self._closed[group.group_id] = Closed(group.state, group.fingerprints)
        while len(self._closed) > self.limits.remember_closed:
            self._closed.popitem(last=False)

    def _report(self, group: Group, cause: Cause, segments: tuple[bytes, ...] = ()) -> Unfinished:
        gaps = tuple(
            m.gap_report() for _, m in sorted(group.messages.items()) if not (m.ready and rules.has_candidate(m))
        )
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

    def _unfinished(self, group: Group, cause: Cause, how: GroupInput) -> Unfinished:
        event = self._report(group, cause, group.raws())
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
                self._judge_batch(group, events)
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
        return snapshot(self._groups, self._closed)

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
        asm._closed = restore(blob, asm._feed, asm._groups)
        return asm

    def _feed(self, raw: bytes) -> None:
        piece = self._decode(raw, [])
        if piece is None:
            raise SegmentationError("a snapshot segment no longer decodes", reason=Reason.STATE_ERROR)
        self._accept(piece, [])


def _own(data: Buffer) -> Buffer:
    """Keep ``bytes`` and read-only views as they are (no copy); copy anything the caller could change.

    A read-only view is trusted not to change underneath (Arrow buffers, ``bytes``):
    callers that pass ``memoryview(x).toreadonly()`` promise not to modify ``x``.
    """
    if isinstance(data, bytes) or (isinstance(data, memoryview) and data.readonly):
        return data
    return bytes(data)


def _header_or_none(raw: bytes) -> SegmentHeader | None:
    try:
        return decode_header(raw)
    except SegmentationError:
        return None


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
