"""How what the assembler holds leaves it: a segment refused, a message delivered, a group ended,
evicted by the limits or expired.

The assembler's intake (:mod:`reassembly.assembler.core`) holds segments and its judging
(:mod:`reassembly.assembler.judging`) decides them; what either refuses or lets go of leaves
here, in one place, so that the count of held bytes, the body store, the positions to settle and the record of
ended groups (which recognises their late segments) move together. The limits that push groups out
(``max_buffered_bytes``, ``max_open_groups``, ``expiry_offsets``) act through the same steps, and
report what they push out as :class:`~reassembly.assembler.events.Unfinished`, as a closed group is.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

from reassembly.assembler import rules
from reassembly.assembler._state import GroupInput, GroupState, transition
from reassembly.assembler.bodies import BodyStore, StoredOriginal
from reassembly.assembler.events import Cause, ConflictingDuplicate, Event, Rejected, Unfinished
from reassembly.assembler.model import Closed, Group, Limits, Message, Piece, missing_numbers
from reassembly.assembler.positions import Origin
from segmenter.errors import ConflictError, Reason, SegmentationError
from segmenter.flags import is_last_in_group

_COMPACT_AT = 1024  # entries of one partition's expiry_offsets heap before its first compaction


class _Leaving:
    """The assembler's held state and the steps that free it (the assembler sets the state up)."""

    limits: Limits
    bodies: BodyStore | None
    _groups: OrderedDict[bytes, Group]  # oldest first
    _closed: OrderedDict[bytes, Closed]
    _buffered: int
    _behind: dict[Hashable, list[tuple[int, int, Group]]]
    _compact_at: dict[Hashable, int]
    _tie: itertools.count[int]

    @staticmethod
    def _reject(events: list[Event], piece: Piece, exc: SegmentationError) -> None:
        """A refused segment leaves as an event: a conflict with what was held or delivered, or a rejection."""
        cls = ConflictingDuplicate if isinstance(exc, ConflictError) else Rejected
        events.append(cls(exc.reason, exc.name_group(piece.header.group_id), piece.raw, piece.header, piece.positions))

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
