"""Positions in a log (Kafka offsets and their kin): which one a consumer may safely commit.

A log consumer does not acknowledge messages one by one: it commits a
position per partition, and a restart re-reads from there. Committing the
position of the last segment read loses every half-built message; the safe
position (LinkedIn's large-message client calls it the safe offset) is the
highest one at or below which every segment *settled*: it belongs to a message
that was delivered, was handed back (rejected, failed, unfinished: expired,
evicted, revoked) or was counted a duplicate. Segments still held in an open
group keep their partition's restart position at or below them.

Positions are opaque: any values ordered within a partition (``int`` offsets,
``(epoch, offset)`` tuples...). Partitions are any hashable key (``(topic,
partition)``). Sans-I/O like the assembler that feeds it: nothing here reads a
clock, a socket or a file.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterator
from typing import Any, NamedTuple


class Origin(NamedTuple):
    """Where one segment was read: its partition and its position there."""

    partition: Hashable
    """The partition the segment was read from (a Kafka partition number, or any key the caller uses)."""
    position: Any
    """The segment's position in that partition (a Kafka offset, or any ordered value the caller uses)."""


class Checkpoint(NamedTuple):
    """One partition's positions.

    ``safe``: every segment received at or below it has settled (commit it; ``None``: no such
    position is known). ``restart``: the lowest position still held (or rewound to), the first to
    read again after a crash; ``None`` when nothing is held (continue after ``safe``). ``high``:
    the highest position received (where a consumer restored from a snapshot resumes, after it);
    ``None`` while a rewound position has not been read again: that position is neither settled
    nor in a snapshot, so a restored consumer resumes at ``restart`` (resuming after ``high`` would
    lose the forgotten message).
    """

    partition: Hashable
    """The partition these positions are in (a Kafka partition number, or any key the caller uses)."""
    safe: Any
    restart: Any
    high: Any


def next_offset(cp: Checkpoint) -> int | None:
    """The offset a Kafka-style log commits for this checkpoint (the next one to read), or
    ``None`` when nothing was received: ``restart`` when something is held, else ``safe + 1``.

    ``cp``: one partition's checkpoint.
    """
    if cp.restart is not None:
        return int(cp.restart)
    return None if cp.safe is None else int(cp.safe) + 1


class Track:
    """The positions of one partition for one assignment of it.

    ``floor``: every position received at or below it settled, except the held ones below it
    (a segment re-read after a rewind). Settled positions above the lowest held one wait in
    ``settled`` and fold into ``floor`` when it settles, so memory is bounded by what is held.
    A revoked track is ``live=False``: pieces still pointing at it release into nothing.

    ``partition``: the partition whose positions it tracks.
    """

    __slots__ = ("_held", "_low", "_pins", "floor", "high", "live", "partition", "settled")

    def __init__(self, partition: Hashable) -> None:
        self.partition = partition
        self.live = True
        self.floor: Any = None
        self.high: Any = None
        self.settled: list[Any] = []  # heap: settled positions above floor
        self._held: dict[Any, int] = {}  # position -> segments held there
        self._low: list[Any] = []  # heap of held positions (lazily cleaned)
        self._pins: list[Any] = []  # rewound-to positions not read again yet

    def hold(self, position: Any) -> None:
        """A segment read at ``position`` is held in an open group."""
        n = self._held.get(position, 0)
        if n == 0:
            heapq.heappush(self._low, position)
        self._held[position] = n + 1

    def release(self, position: Any) -> None:
        """A held segment left the assembler (in an event).

        ``position``: the segment's position.
        """
        n = self._held[position] - 1
        if n:
            self._held[position] = n
            return
        del self._held[position]
        self._settle(position)

    def seen(self, position: Any) -> None:
        """A segment was received at ``position`` and its receive call is over."""
        if self.high is None or position > self.high:
            self.high = position
        if self._pins:
            self._pins = [p for p in self._pins if p > position]
        if position not in self._held:
            self._settle(position)
        else:
            self._fold()

    def rewind(self, position: Any) -> None:
        """The application will read again from ``position``: never pass it until it is read."""
        self._pins.append(position)

    def _settle(self, position: Any) -> None:
        if self.floor is None or position > self.floor:
            heapq.heappush(self.settled, position)
        self._fold()

    def _lowest(self) -> Any:
        low = self._low
        while low and low[0] not in self._held:
            heapq.heappop(low)
        lowest = low[0] if low else None
        for pin in self._pins:
            if lowest is None or pin < lowest:
                lowest = pin
        return lowest

    def _fold(self) -> None:
        lowest = self._lowest()
        settled = self.settled
        while settled and (lowest is None or settled[0] < lowest):
            p = heapq.heappop(settled)
            if self.floor is None or p > self.floor:
                self.floor = p

    def checkpoint(self) -> Checkpoint:
        lowest = self._lowest()
        floor = self.floor
        safe = floor if floor is not None and (lowest is None or floor < lowest) else None
        return Checkpoint(self.partition, safe, lowest, None if self._pins else self.high)

    def state(self) -> list[Any]:
        """What a snapshot keeps (held positions come back with the held segments)."""
        return [self.partition, self.floor, self.high, sorted(self.settled), sorted(self._pins)]


class Ledger:
    """The tracks of every partition currently assigned."""

    def __init__(self) -> None:
        self._tracks: dict[Hashable, Track] = {}

    def track(self, partition: Hashable) -> Track:
        t = self._tracks.get(partition)
        if t is None:
            t = self._tracks[partition] = Track(partition)
        return t

    def get(self, partition: Hashable) -> Track | None:
        return self._tracks.get(partition)

    @staticmethod
    def detached(partition: Hashable) -> Track:
        """A track for segments read from a partition no longer assigned (restored from a snapshot).

        ``partition``: the partition the segments were read from.
        """
        t = Track(partition)
        t.live = False
        return t

    def revoke(self, partition: Hashable) -> Track | None:
        t = self._tracks.pop(partition, None)
        if t is not None:
            t.live = False
        return t

    def __iter__(self) -> Iterator[Track]:
        return iter(self._tracks.values())

    def state(self) -> list[list[Any]]:
        return [t.state() for t in self._tracks.values()]

    def load(self, saved: list[list[Any]]) -> None:
        """Positions as :meth:`state` wrote them. Raises TypeError or ValueError for any that could
        not have been written (a settled or pinned position missing, positions of one partition
        that do not compare): a later receive would fail on them, far from the cause.

        ``saved``: what :meth:`state` returned.
        """
        for partition, floor, high, settled, pins in saved:
            if not isinstance(settled, list) or not isinstance(pins, list):
                raise TypeError("settled and pinned positions must be lists")
            t = self.track(_hashable(partition))
            t.floor, t.high = _hashable(floor), _hashable(high)
            t.settled = sorted(_hashable(p) for p in settled)  # a heap, as state() sorted it
            t._pins = [_hashable(p) for p in pins]
            known = [p for p in (t.floor, t.high) if p is not None] + t.settled + t._pins
            if None in t.settled or None in t._pins:
                raise ValueError("a settled or pinned position is missing")
            sorted(known)  # TypeError when they do not compare


def _hashable(value: Any) -> Any:
    """JSON gives lists back where tuples went in: make them tuples again (hashable, ordered)."""
    return tuple(_hashable(v) for v in value) if isinstance(value, list) else value


def origin_from_json(value: Any) -> Origin | None:
    """Where a piece was read, from its JSON form ``value`` (a (partition, position) pair; None: not known)."""
    return None if value is None else Origin(_hashable(value[0]), _hashable(value[1]))


__all__ = ["Checkpoint", "Ledger", "Origin", "Track", "next_offset", "origin_from_json"]
