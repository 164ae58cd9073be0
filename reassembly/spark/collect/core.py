"""What the streaming collector decides for one destination per call: pure Python, no Spark, no clock.

Spark's state keeps, per destination, the open batch (its members: payload and event time) and
the number the next batch takes (:class:`OpenBatch`). :class:`CollectCore` is handed that, the
destination's :class:`~reassembly.collector.core.Rule` and the new messages, and returns the
segments of every batch that closed and the open batch to keep (:class:`Step`), with the timer
change that goes with it; the processor (:mod:`reassembly.spark.collect.processor`) only reads
and writes the state. Time is event time in milliseconds, as the caller gives it.

A batch closes ``full`` (``max_messages`` members, or ``max_bytes``, or the next member would
pass ``max_bytes``) or ``timeout`` (a member arriving at or after the open batch's first member
+ ``max_wait``; or the event-time timer at that moment, :meth:`CollectCore.expire`). The held
members are gone through again with the new ones: a rule lowered since they arrived splits the
open batch at once. The batch number is state, so a replayed micro-batch names its batches
(``<destination>#<n>``) as the first attempt did.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from reassembly.collector.core import BatchReady, Cause, Held, Rule, batch_segments
from segmenter.producer import DEFAULT_SEGMENT_SIZE, Segmenter

NO_TIMER = -1  # a deadline that is not set (state keeps -1: a long, never null)

Member = tuple[bytes, int]  # (payload, event time in ms)


@dataclass(frozen=True)
class OpenBatch:
    """What state keeps for one destination between calls."""

    members: tuple[Member, ...] = ()  # the open batch, in the order they joined it
    batch_no: int = 0  # the number the open (next) batch takes
    deadline: int = NO_TIMER  # the open batch's timer: its first member's time + max_wait

    @property
    def first_ms(self) -> int:
        """The open batch's earliest event time (-1 when empty)."""
        return min((t for _, t in self.members), default=-1)

    @property
    def held_bytes(self) -> int:
        return sum(len(p) for p, _ in self.members)


class Out(NamedTuple):
    """One output row: a segment of a closed batch (the stream's output schema, in its column order)."""

    target: str
    destination: str
    batch_id: str
    cause: str
    segment: bytes


@dataclass(frozen=True)
class Step:
    """What one call decided: rows to emit, the state to keep, and the timer change (None: leave it)."""

    rows: list[Out]
    keep: OpenBatch
    cancel: int | None = None  # the timer to delete
    register: int | None = None  # the timer to set


class CollectCore:
    """The streaming collector's decisions (see the module docstring); holds only the segmenter."""

    def __init__(self, max_segment_size: int = DEFAULT_SEGMENT_SIZE) -> None:
        self.segmenter = Segmenter(max_segment_size=max_segment_size)

    def take(self, destination: str, rule: Rule, state: OpenBatch, new: Iterable[Member]) -> Step:
        """New messages for ``destination``: within one call ordered by event time (ties by bytes, so the
        order does not depend on how Spark delivered them), after the held ones."""
        incoming = sorted(new, key=lambda m: (m[1], m[0]))
        batch_no = state.batch_no
        out: list[Out] = []
        members: list[Member] = []
        held_bytes = 0
        wait_ms = int(rule.max_wait * 1000)
        for payload, t in (*state.members, *incoming):
            if members and t >= members[0][1] + wait_ms:  # it came after the open batch's deadline
                out += self._emit(destination, members, Cause.TIMEOUT, rule, batch_no)
                batch_no, members, held_bytes = batch_no + 1, [], 0
            elif members and held_bytes + len(payload) > rule.max_bytes:
                out += self._emit(destination, members, Cause.FULL, rule, batch_no)
                batch_no, members, held_bytes = batch_no + 1, [], 0
            members.append((payload, t))
            held_bytes += len(payload)
            if len(members) >= rule.max_messages or held_bytes >= rule.max_bytes:
                out += self._emit(destination, members, Cause.FULL, rule, batch_no)
                batch_no, members, held_bytes = batch_no + 1, [], 0
        first = min((t for _, t in members), default=NO_TIMER)
        due = first + wait_ms if members else NO_TIMER  # the open batch's timer moves with its first member
        old = state.deadline
        return Step(
            out,
            OpenBatch(tuple(members), batch_no, due),
            cancel=old if old != due and old >= 0 else None,
            register=due if members and due != old else None,
        )

    def expire(self, destination: str, rule: Rule, state: OpenBatch | None, at: int) -> Step | None:
        """The timer set for ``at`` fired: the open batch leaves as ``timeout`` if that is its timer;
        None (nothing to do) for a timer the open batch no longer has."""
        if state is None or not state.members or at != state.deadline:
            return None
        rows = self._emit(destination, list(state.members), Cause.TIMEOUT, rule, state.batch_no)
        return Step(rows, OpenBatch((), state.batch_no + 1, NO_TIMER))

    def _emit(self, destination: str, members: list[Member], cause: Cause, rule: Rule, n: int) -> list[Out]:
        batch = BatchReady(
            destination,
            f"{destination}#{n}",
            tuple(Held(i, p, t / 1000) for i, (p, t) in enumerate(members)),
            cause,
            rule,
        )
        return [
            Out(rule.target, destination, batch.batch_id, cause.value, s.encode())
            for s in batch_segments(batch, self.segmenter)
        ]


__all__ = ["NO_TIMER", "CollectCore", "Member", "OpenBatch", "Out", "Step"]
