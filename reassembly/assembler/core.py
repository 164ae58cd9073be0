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

The assembler's parts: this module takes segments in (decoding, the in-order run, filing a piece
in its group) and answers the public calls; :mod:`reassembly.assembler.judging` turns the rule's
verdicts into events; :mod:`reassembly.assembler.leaving` frees what a group held when it is
delivered, ends, or is pushed out by the limits.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import Any

from reassembly.assembler import rules
from reassembly.assembler import snapshot as codec
from reassembly.assembler._state import GroupInput, GroupState, transition
from reassembly.assembler.bodies import BodyStore, StoredBody
from reassembly.assembler.events import (
    Cause,
    ChecksumMismatch,
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
from reassembly.assembler.judging import _Judging
from reassembly.assembler.leaving import _counts
from reassembly.assembler.model import (
    Closed,
    Fingerprint,
    Group,
    Limits,
    Message,
    Piece,
    Run,
    fingerprint,
)
from reassembly.assembler.positions import Checkpoint, Ledger, Origin, Track
from segmenter.coverage import Outcome, RangeSet
from segmenter.errors import ChecksumError, ConflictError, IncompleteError, LimitError, Reason, SegmentationError
from segmenter.flags import in_group, is_last_in_group
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


class Assembler(_Judging):
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

    ``limits``: the bounds on memory, sizes and age (None: :class:`Limits` with its defaults). ``clock``: seconds, from
    any monotonic origin, for expiry (needed when ``limits`` sets ``expiry_seconds``; None: no clock). ``bodies``: a
    :class:`BodyStore` that keeps the bodies of the large messages it wants out of memory (None: all in memory).
    ``join``: True delivers a message of several segments as one buffer; False as a :class:`ScatteredPayload` of views
    of its segments, saving the copy.
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

        ``item``: one segment, its encoded bytes (header and data) or a decoded :class:`Segment`.
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
        """``receive`` each item; all events in order.

        ``items``: the segments, encoded bytes or :class:`Segment`, received in the order given.
        """
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
        """One partition's checkpoint (all ``None`` for a partition nothing was received from).

        ``partition``: the partition given to :meth:`receive` (None: the segments received without one).
        """
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
        group (the unit is the group). False when no delivery of it is remembered.

        ``group_id``, ``msg_seq_number``: the delivered message, by its GroupId and MsgSeqNumber.
        """
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
        whole messages, which restore only into a batch assembler.

        ``blob``: the bytes :meth:`snapshot` returned. ``limits``, ``clock``, ``unit_of_work``, ``second_chance``,
        ``bodies``, ``batch``, ``join``: as the constructor's parameters of those names.
        """
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
    """One-shot: the payload of the single message in ``segments``; raises on any problem.

    ``segments``: the segments, encoded bytes or :class:`Segment`, in any order. ``limits``: the bounds applied (None:
    the defaults of :class:`Limits`).
    """
    messages = reassemble_all(segments, limits)
    if len(messages) != 1:
        raise SegmentationError(f"expected one message, found {len(messages)}", reason=Reason.STATE_ERROR)
    return messages[0]


def reassemble_all(segments: Iterable[Buffer | Segment], limits: Limits | None = None) -> list[bytes]:
    """One-shot: every message in ``segments`` (groups in order); raises the first problem found.

    ``segments``: the segments of every message, encoded bytes or :class:`Segment`, in any order. ``limits``: the bounds
    applied (None: the defaults of :class:`Limits`).
    """
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
