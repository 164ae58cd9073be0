"""What the resequencer is told and what it reports: options, phases (as data), typed events.

The events are NamedTuples (cheap to build: the in-order path creates one per
message and must run at about a million a second). Every message offered
ends in exactly one of :class:`Released`, :class:`Expired`, :class:`Missing`
or :class:`Failed`, each carrying the item as given: nothing is discarded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NamedTuple

from segmenter.errors import Reason, SegmentationError

Predicate = Callable[[int, Any], bool] | str
"""``(seq, item) -> bool`` in-process; in Spark a SQL boolean expression over the input row."""


# ------------------------------------------------------------------ start and end modes
@dataclass(frozen=True)
class StartAt:
    """Literal start: nothing is released until ``seq`` arrives; lower numbers are failures."""

    seq: int = 0
    """The first number of every group's sequence."""


@dataclass(frozen=True)
class StartWhen:
    """Predicate start: the first message for which ``predicate`` is true starts the sequence.

    It must be lower than every message held for the group so far (else it is a
    failure, 9054, and the group keeps waiting); later lower numbers are failures (9051).
    """

    predicate: Predicate
    """A function of a message (as offered) that is true for the message that starts its group's sequence."""


@dataclass(frozen=True)
class StartAuto:
    """Automatic start: gather for ``gather`` (clock units) from the group's first message, then
    start from the lowest number held (released to Out: nothing is known to be missing). A
    number below that start arriving later is a failure (9051), never reordered in."""

    gather: float
    """Clock units from a group's first message to its start at the lowest number held."""


@dataclass(frozen=True)
class EndAt:
    """Literal end: ``seq`` (>= a literal start) is the last number; higher numbers are failures."""

    seq: int
    """The last number of every group's sequence."""


@dataclass(frozen=True)
class EndWhen:
    """Predicate end: the message for which ``predicate`` is true fixes the end. If a message with a
    higher number was already received it is a failure (9055); after it, higher numbers are (9052)."""

    predicate: Predicate
    """A function of a message (as offered) that is true for the last message of its group's sequence."""


@dataclass(frozen=True)
class EndAuto:
    """Automatic end: the group closes once it has held nothing for ``idle`` (clock units)."""

    idle: float
    """Clock units a group may hold nothing before it closes (its next message opens a new instance)."""


Start = StartAt | StartWhen | StartAuto
End = EndAt | EndWhen | EndAuto | None  # None: never ends (closed only by a limit or close())


@dataclass(frozen=True)
class ResequenceLimits:
    """Bounds. Passing one forces the resequencer on (Expire) rather than refusing or dropping."""

    max_group_messages: int = 100_000
    """Messages one group may hold waiting for a missing number; past it the group moves on (Expire)."""
    max_group_bytes: int = 64 << 20
    """Bytes one group may hold waiting (sizes as given to ``offer``); past it the group moves on."""
    max_messages: int = 10_000_000
    """Messages held waiting in all groups together; past it the group holding the oldest moves on."""
    max_bytes: int = 1 << 30
    """Bytes held waiting in all groups together; past it the group holding the oldest moves on."""
    max_groups: int = 1_000_000
    """Open groups at most: opening one more closes the oldest (cause ``EVICTED``)."""
    max_gaps: int = 10_000
    """Skipped ranges remembered per group (to tell a late message from a new one); older ones are
    forgotten (9056)."""
    max_closed: int = 1_000_000
    """Closed groups remembered for their instance number (0: none, every group id opens afresh)."""

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if type(value) is not int or value < (0 if name == "max_closed" else 1):
                raise SegmentationError(f"{name} must be a whole number >= 1", reason=Reason.STATE_ERROR, value=value)


@dataclass(frozen=True)
class ResequenceOptions:
    """How to resequence. Durations are in the injected clock's unit (seconds for ``time.monotonic``).

    ``missing_timeout``: how long to wait for the next number (or, before a
    predicate start, for the start) while later ones are held, before moving
    on; ``None`` waits for ever (only a limit moves on). After a literal or
    predicate end is reached with numbers skipped, the group stays open this
    long more so they can still arrive (to Missing). ``keep_closed``: how long
    a closed group's instance number is remembered under its group id (a later
    message for it opens instance + 1). Forgetting it never lets a number
    repeat: a group id with no closed group remembered opens an instance
    above every instance number forgotten so far (one counter, kept in
    snapshots), so ``(group, instance)`` names one instance for as long as
    the state lives, with memory bounded by ``max_closed``.

    ``release_partial``: ``True`` (default) passes on every in-order prefix at
    once. ``False`` is all-or-nothing (Spring Integration's
    ``releasePartialSequences=false``): a group instance's messages are held
    until the whole sequence, start to end, is there, then all go to Out
    together. It needs an end that is known (``EndAt`` or ``EndWhen``): with
    no end a sequence is never whole. When the group is moved on without it
    (``missing_timeout`` counted from the first message held, a limit, or
    :meth:`~reassembly.resequencer.core.Resequencer.close`), the held prefix
    goes to Expire, the gap after it is skipped as in the default mode, and
    from then on the instance behaves as any instance with a skipped gap.
    """

    start: Start = field(default_factory=StartAt)
    """Where a group's sequence starts: :class:`StartAt` a number (default 0), :class:`StartWhen` a
    message a predicate picks, or :class:`StartAuto` the lowest number held after a gathering time."""
    end: End = field(default_factory=lambda: EndAuto(60.0))
    """Where it ends: :class:`EndAt` a number, :class:`EndWhen` a message a predicate picks,
    :class:`EndAuto` after an idle time (default 60), or None (never: closed only by a limit or ``close()``)."""
    missing_timeout: float | None = 30.0
    """Clock units to wait for a missing number while later ones are held, before moving on past it
    (None: for ever, only a limit moves on); after a known end with numbers skipped, how long the
    group stays open for them."""
    keep_closed: float | None = 3600.0
    """Clock units a closed group's instance number is remembered under its group id (None: as long as
    ``limits.max_closed`` allows)."""
    limits: ResequenceLimits = field(default_factory=ResequenceLimits)
    """The memory bounds (:class:`ResequenceLimits`): passing one moves a group on, never drops."""
    release_partial: bool = True
    """True: every in-order prefix passes on at once; False: all or nothing, a group instance's
    messages held until the whole sequence is there (needs :class:`EndAt` or :class:`EndWhen`)."""

    def __post_init__(self) -> None:
        s, e = self.start, self.end
        if isinstance(s, StartAt) and isinstance(e, EndAt) and e.seq < s.seq:
            raise SegmentationError(
                f"literal end {e.seq} is below the literal start {s.seq}", reason=Reason.STATE_ERROR, start=s.seq
            )
        if type(self.release_partial) is not bool:
            raise SegmentationError("release_partial must be True or False", reason=Reason.STATE_ERROR)
        if not self.release_partial and not isinstance(e, (EndAt, EndWhen)):
            raise SegmentationError(
                "release_partial=False needs an end that is known (EndAt or EndWhen): without one a sequence "
                "is never whole",
                reason=Reason.STATE_ERROR,
            )
        for name in ("missing_timeout", "keep_closed"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise SegmentationError(f"{name} must not be negative", reason=Reason.STATE_ERROR, value=value)


# ------------------------------------------------------------------ phases, as data
class Phase(str, Enum):
    GATHERING = "gathering"  # automatic start: collecting until the gather time passes
    WAITING = "waiting"  # predicate start: collecting until the start message arrives
    RUNNING = "running"  # start known: releasing in order from ``next``
    ENDING = "ending"  # end reached with numbers skipped: open for them until the missing timeout
    CLOSED = "closed"  # left; remembered only for its instance number


class Step(str, Enum):
    START = "start"
    END = "end"
    CLOSE = "close"


TRANSITIONS: dict[tuple[Phase, Step], Phase] = {
    (Phase.GATHERING, Step.START): Phase.RUNNING,
    (Phase.WAITING, Step.START): Phase.RUNNING,
    (Phase.RUNNING, Step.END): Phase.ENDING,
    (Phase.RUNNING, Step.CLOSE): Phase.CLOSED,
    (Phase.GATHERING, Step.CLOSE): Phase.CLOSED,  # only with nothing held (close() forces a start first)
    (Phase.WAITING, Step.CLOSE): Phase.CLOSED,
    (Phase.ENDING, Step.CLOSE): Phase.CLOSED,
}


def step(phase: Phase, what: Step) -> Phase:
    """The next phase, or a STATE_ERROR for a step the table does not allow."""
    try:
        return TRANSITIONS[(phase, what)]
    except KeyError:
        raise SegmentationError(f"no step {what.value} from {phase.value}", reason=Reason.STATE_ERROR) from None


# ------------------------------------------------------------------ events
class SkipCause(str, Enum):
    TIMEOUT = "timeout"  # the missing-message timeout passed
    EVICTED = "evicted"  # a held-messages or held-bytes limit forced the group on
    CLOSED = "closed"  # close(): the input ended


class CloseCause(str, Enum):
    COMPLETE = "complete"  # end reached, nothing skipped
    ENDED = "ended"  # end reached with numbers skipped; the missing timeout passed
    IDLE = "idle"  # automatic end: nothing held for the idle time
    EVICTED = "evicted"  # max_groups: the oldest group made room
    CLOSED = "closed"  # close(): the input ended


class Released(NamedTuple):
    """Out: passed on in order, nothing skipped before it. ``position`` counts from 0 per instance."""

    group: Any
    """The group the message was offered under."""
    instance: int
    """The number of the group's instance the message belongs to (a closed group's next message opens a new one)."""
    seq: int
    """The message's sequence number."""
    item: Any
    """The message as offered."""
    position: int


class Expired(NamedTuple):
    """Expire: passed on in order, but after a skipped gap (every later message of the instance too)."""

    group: Any
    """The group the message was offered under."""
    instance: int
    """The number of the group's instance the message belongs to (a closed group's next message opens a new one)."""
    seq: int
    """The message's sequence number."""
    item: Any
    """The message as offered."""
    position: int
    """Its position in the instance's output, counted from 0 (releases and expiries together)."""


class Missing(NamedTuple):
    """Missing: a message whose number was skipped, arriving afterwards (no position)."""

    group: Any
    """The group the message was offered under."""
    instance: int
    """The number of the group's instance the message belongs to."""
    seq: int
    """The message's sequence number, one the resequencer had already skipped."""
    item: Any
    """The message as offered, handed back so that nothing is lost."""


class Failed(NamedTuple):
    """Failure: not accepted; ``error.details`` has the numbers. ``instance`` is None if no group was opened."""

    group: Any
    """The group the message was offered under."""
    instance: int | None
    seq: Any
    """The message's sequence number as given (perhaps not a number: hence the failure)."""
    item: Any
    """The message as offered, handed back so that nothing is lost."""
    reason: Reason
    """Why the message was not accepted (a 905x code); the same as ``error.reason``."""
    error: SegmentationError


class Skipped(NamedTuple):
    """The resequencer moved on over ``[first, stop)`` (``first`` None: the start never came)."""

    group: Any
    """The group the resequencer moved on in."""
    instance: int
    """The number of the group's instance it moved on in."""
    first: int | None
    stop: int
    """The first number after the skipped range: the next one expected."""
    cause: SkipCause
    """Why it moved on: the missing-message timeout, a held-messages or held-bytes limit, or the input ended."""


class GroupClosed(NamedTuple):
    """An instance left; ``gaps`` are the skipped ranges ``[lo, hi)`` whose messages never came."""

    group: Any
    """The group that closed."""
    instance: int
    """The number of the instance that closed; a later message of the group opens the next one."""
    cause: CloseCause
    """Why it closed: complete, ended with gaps, idle, evicted, or closed at the end of input."""
    released: int
    """Messages of the instance released in order with nothing skipped before them."""
    expired: int
    """Messages of the instance passed on after a skipped gap."""
    missing: int
    """Messages of the instance that arrived after their number was skipped."""
    failed: int
    """Messages of the instance that were not accepted."""
    gaps: tuple[tuple[int, int], ...]


Event = Released | Expired | Missing | Failed | Skipped | GroupClosed

# ``Group.stop``: offer() takes its fast paths only for numbers below it. Correctness never depends on
# it (the general path handles every number); NEVER (below every int) keeps a group off them, ALWAYS is
# an int (int-to-int comparisons are the fast ones) above any realistic number: larger ones take the
# general path.
NEVER = float("-inf")
ALWAYS = 1 << 62


# ------------------------------------------------------------------ what is held
class Group:
    """One open (or recently closed) instance of a sequence group."""

    __slots__ = (
        "armed",
        "deadline",
        "end",
        "expiring",
        "failed",
        "floor",
        "gap_hi",
        "gap_lo",
        "held",
        "instance",
        "key",
        "n_expired",
        "n_missing",
        "nbytes",
        "next",
        "phase",
        "position",
        "serial",
        "sizes",
        "start",
        "stop",
    )

    def __init__(self, key: Any, instance: int, phase: Phase, start: int | None, end: int | None) -> None:
        self.key = key
        self.instance = instance
        self.phase = phase
        self.start = start
        self.end = end
        self.next = start if start is not None else 0  # meaningful once RUNNING
        self.held: dict[int, Any] = {}
        self.sizes: dict[int, int] = {}  # only messages offered with a size
        self.nbytes = 0
        self.expiring = False  # a gap was skipped: everything from now on goes to Expire
        self.position = 0
        self.gap_lo: list[int] = []  # skipped ranges [lo, hi), ascending
        self.gap_hi: list[int] = []
        self.floor: int | None = None  # numbers below it are past the forgotten gaps (max_gaps)
        self.deadline: float | None = None  # when this group must be looked at next
        self.armed: float | None = None  # the deadline of its live heap entry
        # Which heap entry is live: a superseded entry can have the same time as the live one (armed
        # at X, moved earlier, then later back to X), so the time alone does not tell them apart.
        self.serial = 0
        self.n_expired = self.n_missing = self.failed = 0
        self.stop: float | int = NEVER  # set by Resequencer._restop
