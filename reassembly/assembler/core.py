"""The sans-I/O assembler: segments in (any order, any interleaving), typed events out.

No files, sockets, clocks or Spark in here: time comes from an injected
``clock`` and bytes come from the caller. The rules it enforces are the
project's single source of truth (:mod:`reassembly.assembler.rules`, arbitration in
:mod:`segmenter.coverage`); the Spark path calls this same code.

Memory: segment data is held as given (a view into the caller's ``bytes``,
no copy); a message is copied exactly once, its pieces joined at its stored
length, when it is judged. Declared lengths are checked against the
limits before anything is allocated, and decompression never produces more
than the declared original length.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from operator import attrgetter
from typing import Any

from reassembly.assembler import rules
from reassembly.assembler import snapshot as codec
from reassembly.assembler._state import GroupInput, GroupState, transition
from reassembly.assembler.bodies import BodyStore, MessageKey, StoredBody, StoredOriginal
from reassembly.assembler.build import build
from reassembly.assembler.events import (
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
    ScatteredPayload,
    Unfinished,
)
from reassembly.assembler.model import (
    Closed,
    Facts,
    Fingerprint,
    Group,
    Limits,
    Message,
    Piece,
    Run,
    fingerprint,
    missing_numbers,
)
from reassembly.assembler.positions import Checkpoint, Ledger, Origin, Track
from segmenter.coverage import Arbitration, Outcome, RangeSet
from segmenter.errors import ChecksumError, ConflictError, IncompleteError, LimitError, Reason, SegmentationError
from segmenter.flags import Codec, in_group, is_last_in_group
from segmenter.sources import byte_view
from segmenter.wire import (
    Buffer,
    Segment,
    SegmentHeader,
    _check_header_fields,
    decode_header,
    decode_segment,
    verify_data,
)

Verdict = Arbitration[Piece, Facts, memoryview | StoredBody | ScatteredPayload]
_origin = attrgetter("origin")


class Assembler:
    """Reassembles segments of many interleaved messages and groups.

    ``unit_of_work=True`` (default) delivers a group only when every message
    1..last is present, as one :class:`GroupComplete` in MsgSeqNumber order;
    with ``False`` each message of a group is delivered as it completes.
    Messages not in a group are delivered as :class:`MessageComplete`.

    Every message is judged by one rule (:func:`reassembly.assembler.rules.decide`): among
    the complete candidate assemblies of its segments, exactly one that passes
    every check wins; two that pass with different bytes are a conflict and
    nothing is delivered. ``batch=True`` is for when every segment is at hand
    before any message is judged (a Spark group, a file): nothing is judged
    until :meth:`close`, so the events do not depend on arrival order. Without
    it a message is judged as soon as a complete candidate exists; what was
    delivered cannot be withdrawn, so a later different copy is a
    :class:`ConflictingDuplicate` (or :class:`Late`).

    Segments read from a log may come with a ``position`` and a ``partition``
    (:meth:`receive`); :meth:`checkpoints` then gives each partition's safe
    position to commit (:mod:`reassembly.assembler.positions`), :meth:`revoke` drops
    what a rebalance took away. ``second_chance=True`` lets a segment of an
    expired or evicted group start it again instead of being :class:`Late`.
    """

    # False: every segment is filed as it comes (what the tests compare runs against, :meth:`_collect`).
    _runs = True

    def __init__(
        self,
        limits: Limits | None = None,
        *,
        clock: Callable[[], float] | None = None,
        unit_of_work: bool = True,
        batch: bool = False,
        bodies: BodyStore | None = None,
        second_chance: bool = False,
        join: bool = True,
    ) -> None:
        self.limits = limits or Limits()
        # False: a message of several uncompressed segments is delivered as a ScatteredPayload of
        # views of its segments (no join: a broker receiver's largest cost), True: one buffer.
        self.join = join
        self.batch = batch
        self.bodies = bodies
        # Off by default: Late keeps "given up" final, so stragglers of an evicted group cannot
        # rebuild it (and be evicted again) under the very pressure that evicted it.
        self.second_chance = second_chance
        self._ledger = Ledger()
        if self.limits.expiry_seconds is not None and clock is None:
            raise SegmentationError("expiry_seconds needs a clock", reason=Reason.STATE_ERROR)
        gap = self.limits.expiry_offsets
        if gap is not None and (not isinstance(gap, int) or isinstance(gap, bool) or gap < 0):
            raise SegmentationError(f"expiry_offsets must be an int >= 0, not {gap!r}", reason=Reason.STATE_ERROR)
        # Per partition, a heap of (position, tie-breaker, group) for every piece held at an int
        # position while expiry_offsets is set. Entries are never removed when a piece leaves: one
        # is checked only when it has fallen more than the gap behind, so a receive costs one
        # push and a peek, never a scan of the open groups.
        self._behind: dict[Hashable, list[tuple[int, int, Group]]] = {}
        self._compact_at: dict[Hashable, int] = {}  # a heap this long drops the entries of ended groups
        self._tie = itertools.count()
        self._clock = clock
        self.unit_of_work = unit_of_work
        self._groups: OrderedDict[bytes, Group] = OrderedDict()  # oldest first
        self._closed: OrderedDict[bytes, Closed] = OrderedDict()
        self._buffered = 0  # held in groups (a run's bytes are not filed yet)
        self._run: Run | None = None  # the in-order start of the newest message, not yet filed

    @property
    def buffered_bytes(self) -> int:
        """Segment data held across all open groups."""
        return self._buffered + (0 if self._run is None else self._run.bytes)

    # ----------------------------------------------------------------- input
    def receive(
        self,
        item: Buffer | Segment,
        position: Any = None,
        partition: Hashable = None,
        *,
        seen: Callable[[SegmentHeader], object] | None = None,
    ) -> list[Event]:
        """Take one segment (encoded bytes or a :class:`Segment`); return what happened.

        ``position`` (opaque, ordered within its ``partition``: a Kafka offset) says where it
        was read: events then carry it in ``positions`` and :meth:`checkpoints` tracks it.
        ``seen`` is called with the header once the segment decoded and verified, before it is
        judged: a broker receiver files the delivery under its GroupId there, so the bytes are
        decoded once (not once by the caller to learn the GroupId and again here).
        """
        events: list[Event] = []
        if self.limits.expiry_seconds is not None:
            events += self.expire()
        if position is None and self._runs and not self.batch and self.bodies is None and not isinstance(item, Segment):
            piece = self._decode(item, events)
            if piece is not None:
                if seen is not None:
                    seen(piece.header)
                if not self._collect(piece) and not self._complete_run(piece, events):
                    self._flush()
                    self._accept(piece, events)
            return events
        track = None if position is None else self._ledger.track(partition)
        origin = None if track is None else Origin(partition, position)
        gap = self.limits.expiry_offsets is not None and _counts(position)
        if gap:  # before the segment, as a time expiry: it is the newest position of its partition
            assert track is not None
            self._expire_behind(partition, position if track.high is None else max(track.high, position), events)
        piece = self._decode(item, events, origin, track)
        if piece is not None:
            if seen is not None:
                seen(piece.header)
            self._flush()  # a segment with a position (or a Segment) after a run
            self._accept(piece, events)
        if track is not None:
            track.seen(position)
            if gap:  # a segment read again after a rewind may itself be held too far behind
                self._expire_behind(partition, track.high, events)
        return events

    def receive_many(self, items: Iterable[Buffer | Segment]) -> list[Event]:
        """``receive`` each item; all events in order."""
        events: list[Event] = []
        for item in items:
            events += self.receive(item)
        return events

    def _decode(
        self, item: Buffer | Segment, events: list[Event], origin: Origin | None = None, track: Track | None = None
    ) -> Piece | None:
        limits = self.limits
        try:
            if isinstance(item, Segment):
                _check_header_fields(item.header, limits.max_message_size)
                verify_data(item.header, item.data)
                return Piece(item.header, _own(item.data), item.header.pack(), origin, track)
            view = memoryview(_own(item))
            if view.ndim != 1 or view.itemsize != 1 or not view.c_contiguous:
                view = byte_view(view)  # raw and head are then the bytes, not items of a typed view
            seg = decode_segment(
                view, max_segment_size=limits.max_segment_size, max_message_size=limits.max_message_size
            )
            return Piece(seg.header, seg.data, view[: seg.header.header_length], origin, track)
        except SegmentationError as exc:
            raw = item.encode() if isinstance(item, Segment) else bytes(item)
            header = item.header if isinstance(item, Segment) else _header_or_none(raw)
            cls = ChecksumMismatch if isinstance(exc, ChecksumError) else Rejected
            if header is not None:
                exc.name_group(header.group_id)
            events.append(cls(exc.reason, exc, raw, header, () if origin is None else (origin,)))
            return None

    @staticmethod
    def _reject(events: list[Event], piece: Piece, exc: SegmentationError) -> None:
        cls = ConflictingDuplicate if isinstance(exc, ConflictError) else Rejected
        events.append(cls(exc.reason, exc.name_group(piece.header.group_id), piece.raw, piece.header, piece.positions))

    def _late(
        self, events: list[Event], piece: Piece, state: str, delivered: dict[tuple[int, int], Fingerprint]
    ) -> None:
        """A segment after its message left: a duplicate if identical to what was delivered."""
        h = piece.header
        held = delivered.get((h.msg_seq_number, h.offset))
        if held == fingerprint(h):
            events.append(Duplicate(h.group_id, h.msg_seq_number, h.offset, h.data_length, piece.positions))
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
            events.append(Late(err.reason, err.name_group(h.group_id), piece.raw, h, piece.positions))

    def _collect(self, piece: Piece) -> bool:
        """Hold ``piece`` in the run (False: it must be filed now). Only a piece that filing would
        hold without an event joins: the run's next piece, not LAST, under the limits (with the
        run's group counted); or the first piece of a message not in a group whose GroupId the
        assembler has never seen or has forgotten."""
        limits, run = self.limits, self._run
        if run is not None:
            held = self._buffered + run.bytes + piece.end - piece.offset
            # The limits again: they are the caller's to change between two segments.
            full = held > limits.max_buffered_bytes or len(self._groups) >= limits.max_open_groups
            return not full and run.extend(piece)
        gid = piece.header.group_id
        if (
            not Run.starts(piece)
            or gid in self._groups
            or gid in self._closed
            or len(self._groups) >= limits.max_open_groups
            or self._buffered + piece.end > limits.max_buffered_bytes
        ):
            return False
        self._run = Run(piece, self._clock() if self._clock else 0.0)
        return True

    def _complete_run(self, piece: Piece, events: list[Event]) -> bool:
        """The run's LAST piece: a message that passes every check is delivered without being filed
        (the run's pieces are the plain chain filing would judge, alone: :meth:`_collect`); anything
        else (False) is filed and judged as usual."""
        run = self._run
        h = piece.header
        if run is None or not piece.last or piece.offset != run.end or h.group_id != run.group_id:
            return False
        if h.msg_seq_number != 1:
            return False
        # Every piece of the run has the run's facts (Run.extend), so they merge to it: only the
        # LAST piece is left to merge, as the search's walk along the chain would. The chain is then
        # the only candidate: it wins if it passes every check (rules.decide would say the same);
        # if it does not, filing it lets the search judge and report it.
        facts = rules.fits(run.facts, piece)
        if facts is None:
            return False
        chain = (*run.pieces, piece)
        try:
            payload = self._verify((run.group_id, 1), False)(chain, facts)
        except SegmentationError:
            return False
        self._run = None
        events.append(self._complete(run.group_id, 1, facts, chain, payload, 0))
        state = transition(GroupState.OPEN, rules.OUTCOME_INPUT[Outcome.COMPLETE])
        self._remember(run.group_id, Closed(state, {(1, p.offset): fingerprint(p.header) for p in chain}, None))
        return True

    def _flush(self) -> None:
        """File the run as its pieces would have been filed one by one: nothing refuses, overlaps or
        completes them (:meth:`_collect`), so no event comes of it."""
        run, self._run = self._run, None
        if run is None:
            return
        group = Group(run.group_id, False, run.first_seen)
        msg = group.messages[1] = Message(run.group_id, 1)
        for p in run.pieces:
            msg.add(p)
        group.buffered = run.bytes
        self._buffered += run.bytes
        self._groups[run.group_id] = group

    def _reopens(self, closed: Closed, seq: int) -> bool:
        """A segment of a finished group starts it again: not for a message it delivered (that is
        a duplicate or a conflict), only for a revoked group, one whose delivered message was
        forgotten, or (``second_chance``) one that expired or was evicted."""
        again = closed.reopen or (self.second_chance and closed.state in (GroupState.EXPIRED, GroupState.EVICTED))
        return again and not closed.delivered_seq(seq)  # asked only when it may start again: no cost otherwise

    def _open(self, h: SegmentHeader, before: Closed | None) -> Group:
        """A new group; a restarted one keeps what it delivered (never delivered twice) and its last number."""
        group = Group(h.group_id, in_group(h.msg_flags), self._clock() if self._clock else 0.0)
        if before is not None:
            group.fingerprints = dict(before.delivered)
            group.delivered = {s for s, _ in before.delivered}
            group.last_seq = before.last_seq
        return group

    def _accept(self, piece: Piece, events: list[Event]) -> None:
        h = piece.header
        gid, seq = h.group_id, h.msg_seq_number
        closed = self._closed.get(gid)
        if closed is not None and not self._reopens(closed, seq):
            self._late(events, piece, closed.state.value, closed.delivered)
            return
        err = rules.lone_refusal(h)
        if err is not None:
            self._reject(events, piece, err)
            return
        group = self._groups.get(gid)
        opened = group is None
        if group is None:  # kept only once a piece is held: a refused one leaves no group behind
            group = self._open(h, self._closed.get(gid))
        if seq in group.delivered:
            self._late(events, piece, "delivered", group.fingerprints)
            return
        if not self.batch:  # streaming: the group's rules as known so far, first come first served
            err = rules.group_refusal(group.grouped, group.last_seq, group.messages.keys(), seq, h.msg_flags)
            if err is not None:
                # The group stays as it was, with what it delivered: dropping one that holds no
                # message would forget its delivered messages, and deliver a different copy of one again.
                self._reject(events, piece, err)
                return
        if opened:
            self._groups[gid] = group
            self._closed.pop(gid, None)
        msg = group.messages.get(seq)
        if msg is None:
            msg = group.messages[seq] = Message(gid, seq)
        if not self._keep(group, msg, piece, events):
            return
        if not self.batch and is_last_in_group(h.msg_flags):
            group.last_seq = seq
        self._progress(group, msg, events)
        self._enforce_limits(events, gid)

    def _keep(self, group: Group, msg: Message, piece: Piece, events: list[Event]) -> bool:
        """Hold a piece (no copy where safe, or in the store); False for an identical copy."""
        h = piece.header
        here = msg.at.get(h.offset)
        if here is not None:
            for held in here:
                if held.same_as(piece):
                    msg.duplicates += 1
                    if held.track is not None and not held.track.live and piece.track is not None:
                        # held from a revoked partition, read again now: this read keeps it unsettled
                        held.origin, held.track = piece.origin, piece.track
                        held.hold()
                        if self.limits.expiry_offsets is not None:
                            self._watch(group, held)
                    events.append(Duplicate(h.group_id, h.msg_seq_number, h.offset, h.data_length, piece.positions))
                    return False
        if self.bodies is not None and not msg.stored and self.bodies.wants(h):
            self._to_store(group, msg)
        if msg.stored:
            self._put(msg, piece, msg.present)
        else:
            group.buffered += h.data_length
            self._buffered += h.data_length
        msg.add(piece)
        piece.hold()
        if self.limits.expiry_offsets is not None:
            self._watch(group, piece)
        return True

    def _watch(self, group: Group, piece: Piece) -> None:
        """Note a held piece for ``expiry_offsets`` (a piece without an int position: nothing to note)."""
        origin = piece.origin
        if origin is not None and _counts(origin.position):
            partition = origin.partition
            heap = self._behind.setdefault(partition, [])
            heapq.heappush(heap, (origin.position, next(self._tie), group))
            if len(heap) > self._compact_at.get(partition, _COMPACT_AT):
                # Completed groups leave their entries behind until they fall past the gap: with a
                # large gap that is many, so drop them now and then (amortised: the threshold doubles).
                groups = self._groups
                heap[:] = [e for e in heap if groups.get(e[2].group_id) is e[2]]
                heapq.heapify(heap)
                self._compact_at[partition] = max(_COMPACT_AT, 2 * len(heap))

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
        self._buffered -= freed
        msg.stored = True
        msg.forget_bytes()
        placed = RangeSet()
        for p in msg.pieces():
            self._put(msg, p, placed)
            placed.add(p.offset, p.end)

    # ------------------------------------------------------------ judging
    def _decide(self, msg: Message) -> Verdict:
        return rules.decide(msg, self._verify(msg.key, msg.stored))

    def _verify(
        self, key: MessageKey, stored: bool
    ) -> Callable[[tuple[Piece, ...], Facts], memoryview | StoredBody | ScatteredPayload]:
        """What checks a candidate and builds its payload (raising the first check that fails)."""
        bodies = self.bodies if stored else None
        limit, digest, join = self.limits.max_message_size, self.limits.digest, self.join
        return lambda chain, facts: build(key, facts, chain, limit, bodies, digest, join)

    def _progress(self, group: Group, msg: Message, events: list[Event]) -> None:
        """Streaming: judge as soon as a complete candidate exists (Unit-of-Work: for every message)."""
        if self.batch or group.state != GroupState.OPEN or not msg.search or not msg.ready or not msg.worth_searching:
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
        for m, v in verdicts:  # messages without a winner answer to the winners' group rules too
            if v.outcome != Outcome.COMPLETE and m.seq in group.messages:
                self._refuse_unwon(group, m, grouped, last, admitted, events)
        group.grouped = grouped
        group.last_seq = last
        judged = [(m, v) for m, v in verdicts if m.seq in group.messages and v.outcome != Outcome.INCOMPLETE]
        # Length first: a forged last number (up to 999 999 999) must never size a list.
        whole = last == len(judged) and all(m.seq == n for n, (m, _) in enumerate(judged, 1))
        if not group.grouped or not self.unit_of_work or whole:
            self._conclude(group, judged, events)

    def _refuse_unwon(
        self, group: Group, m: Message, grouped: bool, last: int | None, admitted: list[int], events: list[Event]
    ) -> None:
        """Batch: a message without a winner (incomplete, failed, in conflict) whose every segment
        the group refuses by its own flags and number (one past the last message, a group flag
        the group does not have) is rejected segment by segment; kept, it would leave unreported
        with the group once the group's admitted messages conclude it. A message the group admits
        in part stays whole: its outcome reports all of its segments."""
        refusals = [(p, rules.group_refusal(grouped, last, admitted, m.seq, p.header.msg_flags)) for p in m.pieces()]
        if not refusals or any(err is None for _, err in refusals):
            return
        for p, err in sorted(refusals, key=lambda pe: Piece.key(pe[0])):
            assert err is not None
            self._reject(events, p, err)
        self._release(group, [m], delivered=False)
        del group.messages[m.seq]

    def _conclude(self, group: Group, judged: list[tuple[Message, Verdict]], events: list[Event]) -> None:
        """Events for judged messages: deliver, fail, or fail the whole Unit-of-Work group."""
        if not judged:
            return
        if group.grouped and not self.unit_of_work:
            for m, v in judged:
                if group.state != GroupState.OPEN:
                    return
                result = self._result(group, m, v, events)
                try:
                    self._release(group, [m], isinstance(result, MessageComplete))
                except SegmentationError:  # the store could not put it in place: not delivered, still held
                    for key in [k for k in group.fingerprints if k[0] == m.seq]:
                        del group.fingerprints[key]
                    raise
                group.delivered.add(m.seq)
                del group.messages[m.seq]
                if isinstance(result, MessageFailed):
                    raws, kept = group.originals()
                    events.append(
                        GroupFailed(
                            group.group_id, result.reason, (result,), raws, group.positions(), kept, group.last_seq
                        )
                    )
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
            others = [m.originals() for m, _ in judged if m.seq not in bad]
            raws, kept = tuple(r for o in others for r in o[0]), tuple(k for o in others for k in o[1])
            at = [m.split_positions() for m, _ in judged if m.seq not in bad]
            where = tuple(o for a in at for o in a[0]) + tuple(o for a in at for o in a[1])  # parallel to raws, kept
            self._release(group, [m for m, _ in judged], delivered=False)
            if group.grouped:
                events.append(
                    GroupFailed(group.group_id, results[0].reason, tuple(results), raws, where, kept, group.last_seq)
                )
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
        raws, kept = m.originals()
        stored, original = m.declared()
        return MessageFailed(m.group_id, m.seq, v.error.reason, v.error, raws, m.positions(), kept, stored, original)

    def _result(self, group: Group, m: Message, v: Verdict, events: list[Event]) -> MessageComplete | MessageFailed:
        """A complete message (its losing copies reported first), or its failure."""
        if v.outcome != Outcome.COMPLETE:
            return self._failure(m, v)
        assert v.payload is not None
        facts = v.facts
        assert facts is not None
        if sum(map(len, m.at.values())) > len(v.winner):  # copies or misfits held besides the winner
            used = {id(p) for p in v.winner}
            losers = sorted((p for p in m.pieces() if id(p) not in used), key=Piece.key)
            for p in losers:
                self._reject(events, p, rules.misfit(p, facts, v.winner))
        group.fingerprints.update(((m.seq, p.offset), fingerprint(p.header)) for p in v.winner)
        m.decoded = m.stored and facts.codec != Codec.NONE
        return self._complete(m.group_id, m.seq, facts, v.winner, v.payload, m.duplicates)

    @staticmethod
    def _complete(
        group_id: bytes,
        seq: int,
        facts: Facts,
        winner: tuple[Piece, ...],
        payload: memoryview | StoredBody | ScatteredPayload,
        duplicates: int,
    ) -> MessageComplete:
        assert facts.stored_length is not None
        return MessageComplete(
            group_id=group_id,
            msg_seq_number=seq,
            payload=payload,
            msg_flags=winner[-1].header.msg_flags,
            segments=len(winner),
            duplicates=duplicates,
            stored_length=facts.stored_length,
            original_length=facts.original_length,
            checksum=facts.message_checksum,
            positions=tuple(filter(None, map(_origin, winner))),  # an Origin is a non-empty tuple
        )

    # --------------------------------------------------- leaving the assembler
    def _release(self, group: Group, messages: list[Message], delivered: bool) -> None:
        for m in messages:
            freed = m.held_bytes()
            group.buffered -= freed
            self._buffered -= freed
            if m.stored and self.bodies is not None:
                if delivered:
                    self.bodies.finish(m.key, m.decoded)
                else:
                    self.bodies.discard(m.key)
            for ps in m.at.values():
                for p in ps:
                    if p.track is not None:  # only pieces read at a position have one to settle
                        p.release()
            m.at.clear()
            m.count = 0
            m.forget_bytes()

    def _terminate(self, group: Group, how: GroupInput) -> None:
        group.state = transition(group.state, how)
        for m in group.messages.values():
            if m.stored and self.bodies is not None:
                self.bodies.discard(m.key)  # not delivered: whatever the store kept goes
            for p in m.pieces():
                p.release()
        self._buffered -= group.buffered
        group.buffered = 0
        self._groups.pop(group.group_id, None)
        self._remember(
            group.group_id,
            Closed(group.state, group.fingerprints, group.last_seq, reopen=group.state == GroupState.REVOKED),
        )

    def _remember(self, group_id: bytes, closed: Closed) -> None:
        """A group left: its record recognises its late segments (the oldest records go first)."""
        self._closed[group_id] = closed
        while len(self._closed) > self.limits.remember_closed:
            self._closed.popitem(last=False)

    def _report(
        self,
        group: Group,
        cause: Cause,
        segments: tuple[bytes, ...] = (),
        positions: tuple[Origin, ...] = (),
        stored: tuple[StoredOriginal, ...] = (),
    ) -> Unfinished:
        gaps = tuple(
            m.gap_report() for _, m in sorted(group.messages.items()) if not (m.ready and rules.has_candidate(m))
        )
        present = set(group.messages) | group.delivered
        top = group.last_seq if group.last_seq is not None else max(present, default=0)
        missing = missing_numbers(present, top) if group.grouped else ()
        return Unfinished(
            group_id=group.group_id,
            cause=cause,
            reason=Reason.INCOMPLETE_MSG if gaps else Reason.INCOMPLETE_GROUP,
            gaps=gaps,
            missing_seq_numbers=missing,
            last_seq_number=group.last_seq if group.last_seq is not None else _claimed_last(group),
            segments=segments,
            positions=positions,
            stored=stored,
            grouped=group.grouped,
        )

    def _unfinished(self, group: Group, cause: Cause, how: GroupInput) -> Unfinished:
        raws, kept = group.originals()
        event = self._report(group, cause, raws, group.positions(), kept)
        self._terminate(group, how)
        return event

    def _enforce_limits(self, events: list[Event], current: bytes) -> None:
        """Evict oldest groups first; the current group last, only if alone it is too big. Checked
        after the segment was judged: a message complete within this call never held a group open."""
        limits = self.limits
        while self._groups and (
            self._buffered > limits.max_buffered_bytes or len(self._groups) > limits.max_open_groups
        ):
            victim = next((g for k, g in self._groups.items() if k != current), None) or self._groups[current]
            events.append(self._unfinished(victim, Cause.EVICTED, GroupInput.EVICT))

    def expire(self) -> list[Event]:
        """Expire groups strictly older than ``expiry_seconds`` (by the injected clock): a group
        whose age equals it is kept."""
        if self.limits.expiry_seconds is None or self._clock is None:
            return []
        now, expiry = self._clock(), self.limits.expiry_seconds
        if self._run is not None and not now - self._run.first_seen <= expiry:  # as the loop below: NaN expires
            self._flush()  # the newest group: older ones expire first, as they would have
        events: list[Event] = []
        while self._groups:
            group = next(iter(self._groups.values()))
            if now - group.first_seen <= expiry:
                break
            events.append(self._unfinished(group, Cause.EXPIRED, GroupInput.EXPIRE))
        return events

    def _expire_behind(self, partition: Hashable, newest: int, events: list[Event]) -> None:
        """Expire every open group holding a piece of ``partition`` more than ``expiry_offsets``
        positions behind ``newest`` (one ``Unfinished(cause=expired)`` each, as a time expiry).
        Entries of pieces that left, or of groups that ended, are dropped when they reach the top."""
        heap = self._behind.get(partition)
        assert self.limits.expiry_offsets is not None
        if not heap or not _counts(newest):
            return
        floor = newest - self.limits.expiry_offsets
        while heap and heap[0][0] < floor:
            position, _, group = heapq.heappop(heap)
            if self._groups.get(group.group_id) is group and _holds(group, Origin(partition, position)):
                events.append(self._unfinished(group, Cause.EXPIRED, GroupInput.EXPIRE))

    def close(self) -> list[Event]:
        """End of input: in batch mode, judge every group now; what is still open comes back as
        :class:`Unfinished` (cause closed)."""
        self._flush()
        events: list[Event] = []
        if self.batch:
            for group in list(self._groups.values()):
                self._judge_batch(group, events)
        events += [self._unfinished(g, Cause.CLOSED, GroupInput.CLOSE) for g in list(self._groups.values())]
        return events

    def pending(self) -> list[Unfinished]:
        """What open groups are missing right now, without closing them (segments left out)."""
        self._flush()
        return [self._report(g, Cause.CLOSED) for g in self._groups.values()]

    @property
    def open_groups(self) -> int:
        return len(self._groups) + (self._run is not None)

    # ------------------------------------------------------------ positions
    def checkpoints(self) -> dict[Hashable, Checkpoint]:
        """Each assigned partition's safe position to commit and position to restart from."""
        return {t.partition: t.checkpoint() for t in self._ledger}

    def checkpoint(self, partition: Hashable = None) -> Checkpoint:
        """One partition's checkpoint (all ``None`` for a partition nothing was received from)."""
        track = self._ledger.get(partition)
        return Checkpoint(partition, None, None, None) if track is None else track.checkpoint()

    def rewind(self, partition: Hashable, position: Any) -> None:
        """The application seeks ``partition`` back to ``position`` (to have a forgotten message
        again): its checkpoint stays at or below it until a segment at or after it is received."""
        self._ledger.track(partition).rewind(position)

    def revoke(self, partition: Hashable = None) -> list[Event]:
        """A rebalance took ``partition`` away: groups whose held segments all came from it leave as
        ``Unfinished(cause=revoked)`` (their next owner reads them again from the committed
        position; a segment of one arriving here later starts it again). A group also holding
        segments from elsewhere is kept whole: it may still complete here, and the revoked
        partition's segments in it settle when read again here (or never pin anything: the
        partition's positions are no longer tracked). Commit the partition's checkpoint first."""
        self._flush()
        track = self._ledger.revoke(partition)
        if track is None:
            return []
        return [
            self._unfinished(g, Cause.REVOKED, GroupInput.REVOKE)
            for g in list(self._groups.values())
            if g.tracks() == {track}
        ]

    def forget(self, group_id: bytes, msg_seq_number: int) -> bool:
        """Have a delivered message again (its processing failed): its next copy is assembled as new
        instead of counted a duplicate. A message delivered in a Unit-of-Work group forgets the whole
        group (the unit is the group). False when no delivery of it is remembered."""
        self._flush()
        group = self._groups.get(group_id)
        if group is not None:  # still open: a message of it delivered on its own
            if msg_seq_number not in group.delivered:
                return False
            group.delivered.discard(msg_seq_number)
            group.fingerprints = {k: v for k, v in group.fingerprints.items() if k[0] != msg_seq_number}
            return True
        closed = self._closed.get(group_id)
        if closed is None or not closed.delivered_seq(msg_seq_number):
            return False
        kept = {k: v for k, v in closed.delivered.items() if k[0] != msg_seq_number}
        if self.unit_of_work or not kept:
            del self._closed[group_id]
        else:
            self._closed[group_id] = Closed(closed.state, kept, closed.last_seq, reopen=True)
        return True

    # ----------------------------------------------------------- persistence
    def snapshot(self) -> bytes:
        """Serialise the open state (held segments with their positions, ages, counters, finished
        ids, each partition's positions)."""
        self._flush()
        return codec.encode(self._groups, self._closed, self._ledger)

    @classmethod
    def restore(
        cls,
        blob: bytes,
        limits: Limits | None = None,
        *,
        clock: Callable[[], float] | None = None,
        unit_of_work: bool = True,
        second_chance: bool = False,
        bodies: BodyStore | None = None,
        batch: bool = False,
        join: bool = True,
    ) -> Assembler:
        """Rebuild an assembler from :meth:`snapshot` output (segments are re-verified; with ``bodies``,
        those of large messages go back into the store, as they would have arrived). The keywords are
        the constructor's, given again (configuration, not state): a batch assembler's snapshot holds
        whole messages, which restore only into a batch assembler."""
        asm = cls(limits, clock=clock, unit_of_work=unit_of_work, second_chance=second_chance, bodies=bodies,
                  batch=batch, join=join)  # fmt: skip
        asm._closed = codec.decode(blob, asm._feed, asm._groups, asm._ledger)
        return asm

    def _feed(self, raw: bytes, origin: Origin | None, live: bool) -> None:
        if origin is None:
            track = None
        else:
            track = self._ledger.track(origin.partition) if live else self._ledger.detached(origin.partition)
        piece = self._decode(raw, [], origin, track)
        if piece is None:
            raise SegmentationError("a snapshot segment no longer decodes", reason=Reason.STATE_ERROR)
        events: list[Event] = []
        self._accept(piece, events)
        if events:  # what was held is held again under the same limits: nothing happens, or nothing is lost
            raise SegmentationError(
                f"restoring the snapshot produced {type(events[0]).__name__}: restore it under its own limits"
                " and options (lower limits? a batch assembler's snapshot restored with batch=False?)",
                reason=Reason.STATE_ERROR,
                events=len(events),
            )


_COMPACT_AT = 1024  # entries of one partition's expiry_offsets heap before its first compaction


def _counts(position: Any) -> bool:
    """A position ``expiry_offsets`` measures: an int (a Kafka offset); others are only ordered."""
    return isinstance(position, int) and not isinstance(position, bool)


def _holds(group: Group, origin: Origin) -> bool:
    """The group still holds a piece read at ``origin`` (asked only of a piece fallen too far behind)."""
    return any(p.origin == origin for m in group.messages.values() for p in m.pieces())


def _claimed_last(group: Group) -> int | None:
    """The last MsgSeqNumber the held segments of an MQ group claim (flagged LAST_MSG_IN_GROUP), when
    they name one. A batch assembler admits a last number only from a complete message (the rules
    trust nothing less); a report of what is missing may still say which number the pieces declare.
    Held pieces only: never above the highest number held, so no missing number comes of it."""
    if not group.grouped:
        return None
    claimed = {
        p.header.msg_seq_number
        for m in group.messages.values()
        for p in m.pieces()
        if is_last_in_group(p.header.msg_flags)
    }
    return claimed.pop() if len(claimed) == 1 else None


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
