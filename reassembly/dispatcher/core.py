"""The group dispatcher: whole messages in, "what may worker W take next" out.

A message-group broker's rule, applied to reassembled messages: a group is owned by one worker
from the moment one of its messages is handed out until every handed-out message of it is
settled; a free worker takes the head of the oldest free group; a worker that goes away leaves
nothing behind but its unsettled messages, which come back to the head of their groups. Order is
kept within a group and nowhere else, so groups run in parallel and one slow or poisoned group
holds up only itself.

What a group is depends on :class:`~reassembly.dispatcher.model.Ordering`:

- ``GROUP`` (the default): a ``MessageComplete`` flagged in an MQ group (``MSG_IN_GROUP`` or
  ``LAST_MSG_IN_GROUP``) belongs to its ``group_id``; within the group the queued messages go out
  in ascending ``msg_seq_number``, one at a time. The assembler delivers each message of a group
  when it completes, which may be out of sequence; the dispatcher does not wait for a missing
  lower number (the assembler may never deliver it: waiting would hold the group forever), it
  hands out the lowest one queued. A message that arrives after a higher one of its group was
  handed out goes out when it arrives. A ``GroupComplete`` (unit-of-work delivery) is one message
  of its group. A message outside a group, and anything else offered without a key, is alone.
- ``KEY``: the key given at :meth:`Dispatcher.offer` (a Kafka record key); no key: alone.
- ``PARTITION``: the partition of the message's first segment; no positions: alone.
- ``UNORDERED``: every message alone.

Settlement moves the commit: per partition, :meth:`Dispatcher.floor` is the lowest offset of any
segment of a message not settled (queued, in flight, retrying, on hold), so a commit at
``min(floor, the assembler's safe position)`` never passes a message that was not handled. The
settled offsets above it are kept as a bounded list of ranges for the commit metadata
(:mod:`reassembly.dispatcher.offsets`).

Sans-I/O: the caller passes the time (``now``) and decides retry times (with
:class:`~reassembly.dispatcher.policy.RetryPolicy`); nothing here reads a clock, sleeps or locks.
One thread (a runner's control loop) calls it. Every call is O(log n) in the messages held,
amortized: free groups sit in a heap keyed by their head's offer order, retries in a heap keyed
by their time, floors in per-partition heaps; stale heap entries are skipped when they surface
and the heaps are rebuilt when garbage outgrows the live entries.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Hashable, Iterable
from typing import Any

from reassembly.assembler.events import GroupComplete, MessageComplete
from reassembly.dispatcher.model import (
    AfterDead,
    Alone,
    DispatchStats,
    Fenced,
    GroupView,
    Ordering,
    Outcome,
    Revoked,
    Settled,
    Work,
)
from segmenter.errors import Reason, SegmentationError
from segmenter.flags import MsgFlags

_IN_GROUP = MsgFlags.MSG_IN_GROUP.value | MsgFlags.LAST_MSG_IN_GROUP.value
_QUEUED = 0
_IN_FLIGHT = 1
# Settled ranges kept per partition above its commit: the lowest ones matter most (the commit
# moves up through them first); more would push the commit metadata past Kafka's 4 KB anyway.
MAX_SETTLED_RANGES = 1024
_SLACK = 64  # stale heap entries tolerated beyond twice the live ones before a rebuild


class _Entry:
    """One unsettled message."""

    __slots__ = (
        "failures",
        "fenced",
        "floors",
        "group",
        "message",
        "offered_at",
        "order",
        "positions",
        "retry_at",
        "size",
        "state",
        "ticket",
    )

    def __init__(
        self,
        ticket: int,
        group: _Group,
        order: int,
        message: object,
        size: int,
        positions: tuple[tuple[Hashable, int], ...],
        offered_at: float,
    ) -> None:
        self.ticket = ticket
        self.group = group
        self.order = order  # its place in its group: msg_seq_number (MQ groups) or the ticket
        self.message = message
        self.size = size
        self.positions = positions
        floors: dict[Hashable, int] = {}
        for partition, offset in positions:
            if partition not in floors or offset < floors[partition]:
                floors[partition] = offset
        self.floors = floors  # its lowest offset per partition: what holds each floor down
        self.offered_at = offered_at
        self.failures = 0  # RETRY settles so far: the next hand-out is attempt failures + 1
        self.retry_at: float | None = None
        self.state = _QUEUED
        self.fenced = False  # its partition was revoked while it was in flight


class _Group:
    """One ordering key's state: what the broker keeps per message group."""

    __slots__ = ("gid", "in_flight", "key", "on_hold", "owner", "queue")

    def __init__(self, key: Hashable, gid: int) -> None:
        self.key = key
        self.gid = gid  # an int for the heaps (keys need not be comparable); never reused
        self.queue: list[tuple[int, int, _Entry]] = []  # heap of (order, ticket, entry)
        self.owner: Hashable | None = None
        self.in_flight: dict[int, _Entry] = {}
        self.on_hold = False

    def head(self) -> _Entry | None:
        return self.queue[0][2] if self.queue else None


class _Partition:
    """One partition's floor (a heap with lazy deletion) and its settled ranges."""

    __slots__ = ("heap", "his", "live", "los")

    def __init__(self) -> None:
        self.live: dict[int, int] = {}  # ticket -> its lowest offset here, for every unsettled message
        self.heap: list[tuple[int, int]] = []  # (offset, ticket), stale ones skipped
        self.los: list[int] = []  # settled ranges, ascending, disjoint, not adjacent: starts
        self.his: list[int] = []  # and ends (inclusive)

    def floor(self) -> int | None:
        heap, live = self.heap, self.live
        while heap and live.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def forget(self, ticket: int) -> None:
        del self.live[ticket]
        if len(self.heap) > 2 * len(self.live) + _SLACK:
            self.heap = [(offset, t) for t, offset in self.live.items()]
            heapq.heapify(self.heap)

    def add_settled(self, offsets: list[int]) -> None:
        """Record settled offsets, merged into ranges; beyond the cap the highest ranges go."""
        offsets.sort()
        start = previous = offsets[0]
        for offset in offsets[1:]:
            if offset > previous + 1:
                self._add_range(start, previous)
                start = offset
            previous = offset
        self._add_range(start, previous)
        if len(self.los) > MAX_SETTLED_RANGES:
            del self.los[MAX_SETTLED_RANGES:], self.his[MAX_SETTLED_RANGES:]

    def _add_range(self, lo: int, hi: int) -> None:
        los, his = self.los, self.his
        i = bisect_left(his, lo - 1)  # the first range ending at or after lo - 1: touches or follows
        j = bisect_right(los, hi + 1)  # past the last range starting at or before hi + 1
        if i < j:
            lo, hi = min(lo, los[i]), max(hi, his[j - 1])
            los[i:j] = [lo]
            his[i:j] = [hi]
        else:
            los.insert(i, lo)
            his.insert(i, hi)

    def trim(self, commit: int) -> None:
        """Forget what is at or below the commit: it will never be read again."""
        cut = bisect_right(self.his, commit)
        if cut:
            del self.los[:cut], self.his[:cut]
        if self.los and self.los[0] <= commit:
            self.los[0] = commit + 1


def _default_size(message: object) -> int:
    if isinstance(message, MessageComplete):
        return message.original_length
    if isinstance(message, GroupComplete):
        return sum(m.original_length for m in message.messages)
    if isinstance(message, bytes | bytearray | memoryview):
        return memoryview(message).nbytes
    return 0


def _default_positions(message: object) -> tuple[tuple[Hashable, int], ...]:
    origins: Any = getattr(message, "positions", ())
    return tuple((o[0], o[1]) for o in origins)


class Dispatcher:
    """Hands whole messages to workers, one group to one worker at a time, oldest group first.

    ``max_in_flight_per_group`` above 1 lets the owner of a group take several of its messages at
    once (they start in order; they may end in any order): for handlers that keep order
    themselves. ``after_dead`` says what a group does after one of its messages went dead.
    ``ordering``: what makes a group (:class:`~reassembly.dispatcher.Ordering`: the messages' MQ
    groups by default; their keys, their partitions, or none).
    """

    def __init__(
        self,
        ordering: Ordering = Ordering.GROUP,
        *,
        after_dead: AfterDead = AfterDead.CONTINUE,
        max_in_flight_per_group: int = 1,
    ) -> None:
        if not isinstance(ordering, Ordering) or not isinstance(after_dead, AfterDead):
            raise SegmentationError(
                f"ordering and after_dead take their enums, not {ordering!r} and {after_dead!r}",
                reason=Reason.ARGUMENT_ERROR,
            )
        if not isinstance(max_in_flight_per_group, int) or max_in_flight_per_group < 1:
            raise SegmentationError(
                f"max_in_flight_per_group must be a whole number >= 1, not {max_in_flight_per_group!r}",
                reason=Reason.ARGUMENT_ERROR,
            )
        self.ordering = ordering
        self.after_dead = after_dead
        self.max_in_flight_per_group = max_in_flight_per_group
        self._next_ticket = 1
        self._next_gid = 1
        self._now = float("-inf")  # the latest time a caller gave: for calls that take none
        self._entries: dict[int, _Entry] = {}  # every unsettled message (fenced in-flight ones too)
        self._order: deque[int] = deque()  # tickets in offer order, settled ones skipped lazily
        self._groups: dict[Hashable, _Group] = {}
        self._by_gid: dict[int, _Group] = {}
        self._free: list[tuple[int, int]] = []  # (head ticket, gid): free groups by their head's age
        self._waiting: list[tuple[float, int, int]] = []  # (retry_at, head ticket, gid): free, head not due
        self._owned: dict[Hashable, dict[int, _Group]] = {}  # worker -> the groups it owns
        self._parts: dict[Hashable, _Partition] = {}
        self._held_bytes = 0
        self._in_flight = 0
        self._on_hold = 0  # groups waiting for release()
        self._offered = self._done = self._dead = self._retries = 0
        self._returned = self._fenced = self._dropped = 0

    # ------------------------------------------------------------------ messages in

    def offer(
        self,
        message: object,
        *,
        now: float,
        key: Hashable | None = None,
        size: int | None = None,
        positions: Iterable[tuple[Hashable, int]] | None = None,
    ) -> int:
        """Queue a whole message; the ticket that will settle it.

        ``message``: the whole message (a ``MessageComplete``, a ``GroupComplete``, or anything
        else a source offers). ``now``: the caller's clock, in seconds (a runner's: the offer time
        :meth:`oldest_offer` reports). ``key``: the message's group under ``Ordering.KEY`` (a Kafka
        record key), and under ``Ordering.GROUP`` for a message that is neither a
        ``MessageComplete`` nor a ``GroupComplete`` (``None``: alone). ``size`` (bytes held, for
        the budget) defaults to the payload length; ``positions`` (every segment's partition and
        offset, what the message holds down) to the message's own.
        """
        ticket = self._next_ticket
        self._next_ticket += 1
        if size is None:
            size = _default_size(message)
        elif not isinstance(size, int) or size < 0:
            raise SegmentationError(f"size must be a whole number >= 0, not {size!r}", reason=Reason.ARGUMENT_ERROR)
        held = _default_positions(message) if positions is None else tuple((p, o) for p, o in positions)
        group_key, order = self._key_of(message, key, ticket, held)
        group = self._groups.get(group_key)
        if group is None:
            group = self._groups[group_key] = _Group(group_key, self._next_gid)
            self._by_gid[group.gid] = group
            self._next_gid += 1
        entry = _Entry(ticket, group, order, message, size, held, now)
        self._entries[ticket] = entry
        self._order.append(ticket)
        self._held_bytes += size
        self._offered += 1
        self._now = max(self._now, now)
        for partition, offset in entry.floors.items():
            part = self._parts.get(partition)
            if part is None:
                part = self._parts[partition] = _Partition()
            part.live[ticket] = offset
            heapq.heappush(part.heap, (offset, ticket))
        heapq.heappush(group.queue, (order, ticket, entry))
        if group.queue[0][2] is entry:  # a new head: the group's place among free groups changes
            self._schedule(group)
        return ticket

    def _key_of(
        self, message: object, key: Hashable | None, ticket: int, positions: tuple[tuple[Hashable, int], ...]
    ) -> tuple[Hashable, int]:
        """(group key, order within the group) for one offer."""
        ordering = self.ordering
        if ordering is Ordering.GROUP:
            if isinstance(message, MessageComplete):
                if message.msg_flags & _IN_GROUP:
                    return message.group_id, message.msg_seq_number
                return (message.group_id, message.msg_seq_number), ticket
            if isinstance(message, GroupComplete):
                return message.group_id, 0
            return (Alone(ticket) if key is None else key), ticket
        if ordering is Ordering.KEY:
            return (Alone(ticket) if key is None else key), ticket
        if ordering is Ordering.PARTITION and positions:
            return positions[0][0], ticket
        return Alone(ticket), ticket

    # ------------------------------------------------------------------ hand-out

    def take(self, worker: Hashable, now: float) -> Work | None:
        """The next message for ``worker``: its own group's next one while it owns a group and the
        per-group limit allows, else the head of the oldest free group that is ready; ``None``
        when nothing may go now (see :meth:`next_wakeup` for when a retry falls due). ``now``: the
        caller's clock, in seconds: a retry goes out once ``now`` reaches its ``retry_at``."""
        self._now = max(self._now, now)
        waiting, free = self._waiting, self._free
        while waiting and waiting[0][0] <= now:
            _, head, gid = heapq.heappop(waiting)
            heapq.heappush(free, (head, gid))  # checked when it surfaces there
        owned = self._owned.get(worker)
        if owned and self.max_in_flight_per_group > 1:
            # its own groups first (the oldest head among those with room): they are its already
            best: _Group | None = None
            for mine in owned.values():
                first = mine.head()
                if (
                    first is not None
                    and len(mine.in_flight) < self.max_in_flight_per_group
                    and not mine.on_hold
                    and (first.retry_at is None or first.retry_at <= now)
                    and (best is None or first.ticket < best.queue[0][1])
                ):
                    best = mine
            if best is not None:
                return self._hand(best, worker)
        by_gid = self._by_gid
        while free:
            head, gid = heapq.heappop(free)
            group = by_gid.get(gid)
            if group is None or group.owner is not None or group.on_hold or not group.queue:
                continue
            entry = group.queue[0][2]
            if entry.ticket != head:
                continue
            if entry.retry_at is not None and entry.retry_at > now:
                heapq.heappush(waiting, (entry.retry_at, head, gid))
                continue
            return self._hand(group, worker)
        return None

    def _hand(self, group: _Group, worker: Hashable) -> Work:
        _, ticket, entry = heapq.heappop(group.queue)
        entry.state = _IN_FLIGHT
        entry.retry_at = None
        group.in_flight[ticket] = entry
        self._in_flight += 1
        if group.owner is None:
            group.owner = worker
            owned = self._owned.get(worker)
            if owned is None:
                owned = self._owned[worker] = {}
            owned[group.gid] = group
        return Work(ticket, group.key, entry.message, entry.failures + 1, entry.size, entry.positions)

    def _schedule(self, group: _Group) -> None:
        """Give a group that may be free and ready its place in the free or waiting heap."""
        if group.owner is not None or group.on_hold or not group.queue:
            return
        entry = group.queue[0][2]
        if entry.retry_at is not None and entry.retry_at > self._now:
            heapq.heappush(self._waiting, (entry.retry_at, entry.ticket, group.gid))
        else:
            heapq.heappush(self._free, (entry.ticket, group.gid))
        if len(self._free) + len(self._waiting) > 2 * len(self._groups) + _SLACK:
            self._rebuild_heaps()

    def _rebuild_heaps(self) -> None:
        """Drop the stale entries of the free and waiting heaps: one valid place per free group."""
        self._free, self._waiting = [], []
        for group in self._groups.values():
            if group.owner is None and not group.on_hold and group.queue:
                entry = group.queue[0][2]
                if entry.retry_at is not None and entry.retry_at > self._now:
                    self._waiting.append((entry.retry_at, entry.ticket, group.gid))
                else:
                    self._free.append((entry.ticket, group.gid))
        heapq.heapify(self._free)
        heapq.heapify(self._waiting)

    # ------------------------------------------------------------------ settlement

    def settle(self, ticket: int, outcome: Outcome, *, now: float, retry_at: float | None = None) -> Settled | Fenced:
        """End one hand-out. ``DONE`` and ``DEAD`` settle the message (its offsets may be
        committed); ``RETRY`` puts it back at the head of its group, not handed out before
        ``retry_at``. The worker's hold on the group ends with its last message in flight.
        ``ticket``: the hand-out's (:attr:`~reassembly.dispatcher.Work.ticket`, what :meth:`offer`
        returned). ``outcome``: ``DONE``, ``DEAD`` or ``RETRY``. ``now``: the caller's clock, in
        seconds.

        A ticket fenced by a revocation answers :class:`Fenced` and counts for nothing; a ticket
        not in flight (unknown, queued, settled) is a caller's error (9016): settling twice
        would commit past a message handled once and lost once.
        """
        entry = self._entries.get(ticket)
        if entry is None or entry.state != _IN_FLIGHT:
            state = "unknown or already settled" if entry is None else "not in flight"
            raise SegmentationError(f"ticket {ticket} is {state}", reason=Reason.STATE_ERROR, ticket=ticket)
        if not isinstance(outcome, Outcome):
            raise SegmentationError(f"an outcome is an Outcome, not {outcome!r}", reason=Reason.ARGUMENT_ERROR)
        self._now = max(self._now, now)
        group = entry.group
        attempt = entry.failures + 1
        del group.in_flight[ticket]
        self._in_flight -= 1
        if not group.in_flight:
            owned = self._owned[group.owner]
            del owned[group.gid]
            if not owned:
                del self._owned[group.owner]
            group.owner = None
        if entry.fenced:
            self._forget(entry)
            self._fenced += 1
            self._after_change(group)
            return Fenced(ticket, group.key, outcome)
        if outcome is Outcome.RETRY:
            entry.failures += 1
            entry.retry_at = retry_at
            entry.state = _QUEUED
            heapq.heappush(group.queue, (entry.order, ticket, entry))
            self._retries += 1
        else:
            self._forget(entry)
            self._record_settled(entry)
            if outcome is Outcome.DONE:
                self._done += 1
            else:
                self._dead += 1
                if self.after_dead is AfterDead.HOLD and not group.on_hold:
                    group.on_hold = True
                    self._on_hold += 1
        free = group.owner is None
        on_hold = group.on_hold
        self._after_change(group)
        return Settled(
            ticket, group.key, outcome, attempt, retry_at if outcome is Outcome.RETRY else None, free, on_hold
        )

    def _record_settled(self, entry: _Entry) -> None:
        if len(entry.positions) == 1:
            partition, offset = entry.positions[0]
            part = self._parts.get(partition)
            if part is not None:
                part.add_settled([offset])
            return
        offsets: dict[Hashable, list[int]] = {}
        for partition, offset in entry.positions:
            offsets.setdefault(partition, []).append(offset)
        for partition, found in offsets.items():
            part = self._parts.get(partition)
            if part is not None:
                part.add_settled(found)

    def _forget(self, entry: _Entry) -> None:
        """Remove an unsettled message from everything but its group's queue (the caller's)."""
        del self._entries[entry.ticket]
        self._held_bytes -= entry.size
        for partition in entry.floors:
            part = self._parts.get(partition)
            if part is not None and entry.ticket in part.live:
                part.forget(entry.ticket)
        order = self._order
        while order and order[0] not in self._entries:
            order.popleft()
        if len(order) > 2 * len(self._entries) + _SLACK:
            self._order = deque(t for t in order if t in self._entries)

    def _after_change(self, group: _Group) -> None:
        """A group that is idle and empty goes; a free one takes its place in the heaps."""
        if not group.queue and not group.in_flight and not group.on_hold:
            del self._groups[group.key]
            del self._by_gid[group.gid]
        elif group.owner is None:
            self._schedule(group)

    def worker_gone(self, worker: Hashable) -> list[int]:
        """A worker died or left: its messages in flight go back to the head of their groups
        (not counted as attempts: the handler may never have run) and its groups are free. The
        runner must ignore any later result of that worker. Returns the tickets that came back.
        ``worker``: as :meth:`take` was given it."""
        returned: list[int] = []
        for group in self._owned.pop(worker, {}).values():
            for ticket, entry in group.in_flight.items():
                if entry.fenced:
                    self._forget(entry)  # its partition left: nobody here handles it again
                    continue
                entry.state = _QUEUED
                heapq.heappush(group.queue, (entry.order, ticket, entry))
                returned.append(ticket)
            self._in_flight -= len(group.in_flight)
            group.in_flight.clear()
            group.owner = None
            self._after_change(group)
        self._returned += len(returned)
        return sorted(returned)

    def revoke(self, partition: Hashable) -> Revoked:
        """A partition was taken away (a rebalance): forget every message with a segment there.
        ``partition``: as the messages' positions name it (Kafka: ``(topic, partition)``).

        Queued ones are dropped: the partition's next owner reads them again. Ones in flight are
        fenced: the worker finishes (or not), its settle answers :class:`Fenced` and commits
        nothing, and its group stays owned until then, so no second worker of this process
        starts on the group meanwhile. Such a message stops holding down the floors of its other
        partitions too (the next owner of this one reassembles it again).
        """
        part = self._parts.pop(partition, None)
        if part is None:
            return Revoked(partition, (), (), 0)
        dropped: list[int] = []
        fenced: list[int] = []
        dropped_bytes = 0
        touched: dict[int, _Group] = {}
        for ticket in sorted(part.live):
            entry = self._entries[ticket]
            if entry.state == _IN_FLIGHT:
                entry.fenced = True
                fenced.append(ticket)
                for other in entry.floors:
                    other_part = self._parts.get(other)
                    if other_part is not None and ticket in other_part.live:
                        other_part.forget(ticket)
            else:
                dropped.append(ticket)
                dropped_bytes += entry.size
                self._forget(entry)
                touched[entry.group.gid] = entry.group
        for group in touched.values():
            group.queue = [item for item in group.queue if item[1] in self._entries]
            heapq.heapify(group.queue)
            self._after_change(group)
        self._dropped += len(dropped)
        return Revoked(partition, tuple(dropped), tuple(fenced), dropped_bytes)

    def release(self, group: Hashable) -> int:
        """Let a group on hold (``AfterDead.HOLD`` after a dead message) go on; the number of its
        messages that may now go out (0 for a group not on hold). ``group``: its ordering key
        (:attr:`~reassembly.dispatcher.GroupView.group`)."""
        state = self._groups.get(group)
        if state is None or not state.on_hold:
            return 0
        state.on_hold = False
        self._on_hold -= 1
        self._after_change(state)
        return len(state.queue)

    # ------------------------------------------------------------------ commits

    def floor(self, partition: Hashable) -> int | None:
        """The lowest offset of any segment of an unsettled message in ``partition`` (queued, in
        flight, retrying, on hold), or ``None``: nothing there holds the commit back."""
        part = self._parts.get(partition)
        return None if part is None else part.floor()

    def commit_offset(self, partition: Hashable, assembler_next: int | None) -> int | None:
        """What may be committed: the lower of the assembler's next offset (its safe position) and
        the floor, either one absent; ``None`` when neither says anything. ``partition``: as the
        messages' positions name it. ``assembler_next``: the assembler's next offset there
        (``None``: not known)."""
        floor = self.floor(partition)
        if floor is None:
            return assembler_next
        return floor if assembler_next is None else min(floor, assembler_next)

    def settled_above(self, partition: Hashable, commit: int) -> list[tuple[int, int]]:
        """Offset ranges ``(lo, hi)`` (inclusive, ascending, above ``commit``) whose segments all
        belong to settled messages: what the commit metadata lists so that a restart skips them.
        What is at or below ``commit`` is forgotten (it is never read again). ``partition``: as the
        messages' positions name it; ``commit``: the offset about to be committed there."""
        part = self._parts.get(partition)
        if part is None:
            return []
        part.trim(commit)
        return list(zip(part.los, part.his, strict=True))

    # ------------------------------------------------------------------ what is held

    def next_wakeup(self) -> float | None:
        """The earliest time a waiting retry falls due (the head of a free group), or ``None``.
        Exact after :meth:`take` answered ``None``: what falls due is found there."""
        waiting = self._waiting
        while waiting:
            due, head, gid = waiting[0]
            group = self._by_gid.get(gid)
            if (
                group is not None
                and group.owner is None
                and not group.on_hold
                and group.queue
                and group.queue[0][1] == head
                and group.queue[0][2].retry_at == due
            ):
                return due
            heapq.heappop(waiting)
        return None

    def oldest_offer(self) -> float | None:
        """The offer time of the oldest unsettled message (its age is what a stuck group shows)."""
        order = self._order
        while order and order[0] not in self._entries:
            order.popleft()
        return self._entries[order[0]].offered_at if order else None

    def groups(self) -> list[GroupView]:
        """Every group with something held or on hold, as a message-group broker lists them."""
        views = []
        for group in self._groups.values():
            entries = [item[2] for item in group.queue] + list(group.in_flight.values())
            oldest = min((e.offered_at for e in entries), default=None)
            views.append(
                GroupView(group.key, len(group.queue), group.owner, len(group.in_flight), oldest, group.on_hold)
            )
        return views

    @property
    def stats(self) -> DispatchStats:
        """The counters and gauges, at this moment: O(workers), cheap enough for every loop."""
        in_flight = self._in_flight
        return DispatchStats(
            held_messages=len(self._entries),
            held_bytes=self._held_bytes,
            queued=len(self._entries) - in_flight,
            in_flight=in_flight,
            groups=len(self._groups),
            groups_owned=sum(len(o) for o in self._owned.values()),
            groups_on_hold=self._on_hold,
            offered=self._offered,
            done=self._done,
            dead=self._dead,
            retries=self._retries,
            returned=self._returned,
            fenced=self._fenced,
            dropped=self._dropped,
        )

    def held_bytes(self) -> int:
        """The size of every unsettled message (in flight included): what the budget counts."""
        return self._held_bytes

    def held_messages(self) -> int:
        """The number of unsettled messages (in flight included)."""
        return len(self._entries)
