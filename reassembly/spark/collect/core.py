"""What the streaming collector decides for one destination per call: pure Python, no Spark, no clock.

Spark's state keeps, per destination, the open batch (its members: payload and event time) and
the number the next batch takes (:class:`OpenBatch`). :class:`CollectCore` is handed that, the
destination's :class:`~reassembly.collector.core.Rule` and the new messages, and returns the
segments of every batch that closed and the open batch to keep (:class:`Step`), with the timer
change that goes with it; the processor (:mod:`reassembly.spark.collect.processor`) only reads
and writes the state. Time is event time in milliseconds, as the caller gives it.

A batch closes ``full`` (``max_messages`` members, or ``max_bytes``, or the next member would
pass ``max_bytes``), ``timeout`` (the open batch's oldest member + ``max_wait`` passed) or ``idle``
(its newest member + ``idle_timeout`` passed), whichever deadline came first (``timeout`` on a
tie), as the in-process :class:`~reassembly.collector.core.Collector` closes them when it ticks
at its next deadline. The event-time timer stands at the earlier deadline and moves with every
member added; a member arriving at or after it finds the batch due and closes it first, and
otherwise the timer does (:meth:`CollectCore.expire`), with the same cause either way. The held
members are gone through again with the new ones: a rule lowered since they arrived splits the
open batch at once. The batch number is state, so a replayed micro-batch names its batches
(``<destination>#<n>``) as the first attempt did.

``idle_timeout`` needs no state of its own: the members' event times are held, and the timer's
deadline is a number whichever rule set it. So the state layout is the same with and without it,
and a checkpoint whose open batches were timed by ``max_wait`` alone continues when the rule gains
an ``idle_timeout``: the next member moves the timer, and a timer that fires first names the
deadline that passed first.
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

    members: tuple[Member, ...] = ()
    """The open batch, in the order they joined it."""
    batch_no: int = 0
    """The number the open (next) batch takes."""
    deadline: int = NO_TIMER
    """The open batch's timer: min(oldest + max_wait, newest + idle_timeout)."""

    @property
    def first_ms(self) -> int:
        """The open batch's earliest event time (-1 when empty)."""
        return min((t for _, t in self.members), default=-1)

    @property
    def newest_ms(self) -> int:
        """The open batch's latest event time, which ``idle_timeout`` counts from (-1 when empty)."""
        return max((t for _, t in self.members), default=-1)

    @property
    def held_bytes(self) -> int:
        return sum(len(p) for p, _ in self.members)


class Out(NamedTuple):
    """One output row: a segment of a closed batch (the stream's output schema, in its column order)."""

    target: str
    """Where the batch goes: its rule's ``target`` (``OUTPUT/<target>/``)."""
    destination: str
    """The destination the batch was gathered for."""
    batch_id: str
    """The batch's id, ``<destination>#<n>``: unique per destination."""
    cause: str
    """Why the batch closed (a ``Cause`` value: full, timeout, idle...)."""
    segment: bytes
    """One encoded segment of the batch's group."""


@dataclass(frozen=True)
class Step:
    """What one call decided: rows to emit, the state to keep, and the timer change (None: leave it)."""

    rows: list[Out]
    """The output rows to emit: the segments of the batches closed by this call."""
    keep: OpenBatch
    """The state to keep for the destination (its open batch)."""
    cancel: int | None = None
    """The timer to delete."""
    register: int | None = None
    """The timer to set."""


class CollectCore:
    """The streaming collector's decisions (see the module docstring); holds only the segmenter.

    ``max_segment_size``: the largest segment a batch is cut into, in bytes.
    """

    def __init__(self, max_segment_size: int = DEFAULT_SEGMENT_SIZE) -> None:
        self.segmenter = Segmenter(max_segment_size=max_segment_size)

    def take(self, destination: str, rule: Rule, state: OpenBatch, new: Iterable[Member]) -> Step:
        """New messages for ``destination``: within one call ordered by event time (ties by bytes, so the
        order does not depend on how Spark delivered them), after the held ones.

        ``rule``: the destination's rule in force. ``state``: its open batch (empty when none). ``new``: the new
        messages, each (payload, event time in epoch milliseconds).
        """
        incoming = sorted(new, key=lambda m: (m[1], m[0]))
        batch_no = state.batch_no
        out: list[Out] = []
        members: list[Member] = []
        held_bytes = 0
        oldest = newest = NO_TIMER
        for payload, t in (*state.members, *incoming):
            cause = _due(rule, oldest, newest, t) if members else None  # due before t joins
            if cause is None and members and held_bytes + len(payload) > rule.max_bytes:
                cause = Cause.FULL
            if cause is not None:
                out += self._emit(destination, members, cause, rule, batch_no)
                batch_no, members, held_bytes = batch_no + 1, [], 0
            oldest, newest = (min(oldest, t), max(newest, t)) if members else (t, t)
            members.append((payload, t))
            held_bytes += len(payload)
            if len(members) >= rule.max_messages or held_bytes >= rule.max_bytes:
                out += self._emit(destination, members, Cause.FULL, rule, batch_no)
                batch_no, members, held_bytes = batch_no + 1, [], 0
        due = _deadline(rule, oldest, newest) if members else NO_TIMER  # re-counted with every member added
        return self._keep(out, OpenBatch(tuple(members), batch_no, due), state.deadline)

    def expire(self, destination: str, rule: Rule, state: OpenBatch | None, at: int) -> Step | None:
        """The timer set for ``at`` fired: the open batch leaves as ``timeout`` or ``idle``, after the
        deadline the rule in force says passed first; None (nothing to do) for a timer the open batch no
        longer has. A rule raised since the timer was set keeps the batch open and sets the timer its
        deadlines now give.

        ``destination``: the destination whose timer fired. ``rule``: its rule in force. ``state``: its open batch
        (None: none).
        """
        if state is None or not state.members or at != state.deadline:
            return None
        cause = _due(rule, state.first_ms, state.newest_ms, at)
        if cause is None:
            due = _deadline(rule, state.first_ms, state.newest_ms)
            return Step([], OpenBatch(state.members, state.batch_no, due), register=due)
        rows = self._emit(destination, list(state.members), cause, rule, state.batch_no)
        return Step(rows, OpenBatch((), state.batch_no + 1, NO_TIMER))

    @staticmethod
    def _keep(rows: list[Out], keep: OpenBatch, old: int) -> Step:
        """The step that keeps ``keep``: its timer replaces the one set before (``old``) if it moved."""
        due = keep.deadline
        return Step(
            rows,
            keep,
            cancel=old if old != due and old >= 0 else None,
            register=due if keep.members and due != old else None,
        )

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


def _ms(seconds: float) -> int:
    return int(seconds * 1000)


def _deadline(rule: Rule, oldest: int, newest: int) -> int:
    """When an open batch with these oldest and newest event times is due under ``rule``."""
    due = oldest + _ms(rule.max_wait)
    return due if rule.idle_timeout is None else min(due, newest + _ms(rule.idle_timeout))


def _due(rule: Rule, oldest: int, newest: int, at: int) -> Cause | None:
    """Why an open batch with these oldest and newest event times is closed by event time ``at``: after
    the earlier of its deadlines, named after it (``timeout`` on a tie), so a batch closes alike whether
    its timer fires or a later member finds it due; None when neither has passed."""
    timeout_at = oldest + _ms(rule.max_wait)
    idle_at = timeout_at if rule.idle_timeout is None else newest + _ms(rule.idle_timeout)
    if at < min(timeout_at, idle_at):
        return None
    return Cause.TIMEOUT if timeout_at <= idle_at else Cause.IDLE


__all__ = ["NO_TIMER", "CollectCore", "Member", "OpenBatch", "Out", "Step"]
