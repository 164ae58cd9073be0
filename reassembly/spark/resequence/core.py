"""What the Spark resequencer decides for one group key: pure Python, no Spark, no clock.

Both Spark forms (:mod:`reassembly.spark.resequence.functions`) run an in-process resequencer,
one per group key, with the event time in milliseconds as its clock. Both modes, the sequence mode
here (:class:`~reassembly.resequencer.core.Resequencer`) and the batch mode
(:mod:`reassembly.spark.resequence.batch_core`), drive it in one shape (:class:`KeyCore`):

Stream: per call, the core restores the key's resequencer from its snapshot, ticks it to the
watermark, offers the call's rows in event-time order, each at its own time (or, for a fired timer,
ticks it to the timer's time), turns the events into output rows and returns a decision: the rows
to emit (each from this call's rows, from the held rows in state, or a row of its own), which of
this call's rows to hold, the snapshot to keep and the one timer to set. The processor
(:mod:`reassembly.spark.resequence.processor`) only reads and writes the state. Batch
(:meth:`KeyCore.table`): one finished group in event order, each row offered after every deadline
up to its own time; then every deadline passes and what is left comes out.

A mode gives its differences: how a row is offered and ordered within one time, how its
resequencer is made or restored, each event's extra columns and row, and what a call keeps. In the
sequence mode a row reaches the resequencer as an :class:`Item` (the helper columns computed in
the JVM: event time, sequence number, predicate flags, size) and the resequencer holds a
:class:`Ref` to where the row is; each event becomes an output row's extra columns (:func:`outputs`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

from reassembly.resequencer.core import Resequencer
from reassembly.resequencer.model import (
    EndAuto,
    EndWhen,
    Event,
    Expired,
    Failed,
    GroupClosed,
    Missing,
    Released,
    ResequenceOptions,
    Skipped,
    StartAuto,
    StartWhen,
)

EXTRA_FIELDS = (
    ("instance", "bigint"),
    ("terminal", "string"),
    ("position", "bigint"),
    ("reason", "int"),
    ("reason_name", "string"),
    ("detail", "string"),
    ("cause", "string"),
    ("skip_first", "bigint"),
    ("skip_stop", "bigint"),
    ("n_released", "bigint"),
    ("n_expired", "bigint"),
    ("n_missing", "bigint"),
    ("n_failed", "bigint"),
    ("gaps", "array<array<bigint>>"),
)
# The helper columns added to the input (event ms, sequence number, predicate flags, size).
MS_COLUMN, SEQ_COLUMN, FLAGS_COLUMN, SIZE_COLUMN = "__reseq_ms", "__reseq_seq", "__reseq_flags", "__reseq_size"
STARTS, ENDS = 1, 2  # bits of a row's predicate flags, computed in the JVM
HELD = -1  # Ref.row of a row held in the state store (not in this call's rows)


class Ref(NamedTuple):
    """What the resequencer holds for a Spark row: its predicate flags and where the row is."""

    flags: int
    """STARTS: the start predicate is true, ENDS: the end predicate is true."""
    row: int
    """The row's place in this call's rows; HELD (-1): held in the state store."""


class Item(NamedTuple):
    """One input row as the resequencer sees it: the helper columns' values."""

    ms: int | None
    """The row's event time in epoch milliseconds; None counts as 0."""
    seq: int | None
    """The row's sequence number; None when the row has none (a failure)."""
    flags: int
    """The predicate flags computed in the JVM: ``STARTS`` (1), ``ENDS`` (2)."""
    size: int | None
    """The row's size, counted toward the byte limits; None counts as 0."""

    @classmethod
    def of(cls, row: Any) -> Item:
        """From a row (a Spark Row or a dict) with the helper columns.

        ``row``: the input row.
        """
        return cls(row[MS_COLUMN], row[SEQ_COLUMN], row[FLAGS_COLUMN], row[SIZE_COLUMN])


class Clock:
    """Event time in milliseconds, set by the caller before each step."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _starts(seq: Any, ref: Ref) -> bool:
    return bool(ref.flags & STARTS)


def _ends(seq: Any, ref: Ref) -> bool:
    return bool(ref.flags & ENDS)


def core_options(options: ResequenceOptions) -> ResequenceOptions:
    """Seconds to milliseconds; SQL predicates to readers of the flags computed in the JVM.

    ``options``: the user's options.
    """

    lim = options.limits
    if lim.max_messages < lim.max_group_messages or lim.max_bytes < lim.max_group_bytes:
        raise ValueError(
            "in Spark every group key has its own resequencer: max_messages/max_bytes (in all) cannot be "
            "enforced across keys (transformWithState reaches only the key it is handling); bound each key "
            "with max_group_messages/max_group_bytes (the state store bounds the keys together)"
        )

    def ms(x: float | None) -> float | None:
        return None if x is None else float(round(x * 1000))

    start, end = options.start, options.end
    if isinstance(start, StartWhen):
        start = StartWhen(_starts)
    elif isinstance(start, StartAuto):
        start = StartAuto(ms(start.gather) or 0.0)
    if isinstance(end, EndWhen):
        end = EndWhen(_ends)
    elif isinstance(end, EndAuto):
        end = EndAuto(ms(end.idle) or 0.0)
    timeout, keep = ms(options.missing_timeout), ms(options.keep_closed)
    return replace(options, start=start, end=end, missing_timeout=timeout, keep_closed=keep)


def outputs(events: list[Event]) -> Iterator[tuple[Event, tuple[Any, ...]]]:
    """Every event with its extra columns (:data:`EXTRA_FIELDS`): a row per message, and a row per
    ``Skipped`` (terminal ``skipped``) and ``GroupClosed`` (terminal ``group_closed``).

    ``events``: the resequencer's events for one key, in order.
    """
    none = (None,) * 8  # cause, skip_first, skip_stop, the four counts, gaps
    for ev in events:
        if isinstance(ev, Failed):
            yield ev, (ev.instance, "failure", None, int(ev.reason), ev.reason.name, str(ev.error), *none)
        elif isinstance(ev, Missing):
            yield ev, (ev.instance, "missing", None, 0, "NONE", None, *none)
        elif isinstance(ev, (Released, Expired)):
            terminal = "out" if isinstance(ev, Released) else "expire"
            yield ev, (ev.instance, terminal, ev.position, 0, "NONE", None, *none)
        elif isinstance(ev, Skipped):
            yield ev, (ev.instance, "skipped", None, 0, "NONE", None, ev.cause.value, ev.first, ev.stop, *none[:5])
        else:
            counts = (ev.released, ev.expired, ev.missing, ev.failed)
            gaps = [list(g) for g in ev.gaps]
            yield ev, (ev.instance, "group_closed", None, 0, "NONE", None, ev.cause.value, None, None, *counts, gaps)


def ref_of(ev: Event) -> Ref | None:
    """Where a message event's row is; None for ``Skipped`` / ``GroupClosed`` (rows of their own).

    ``ev``: the resequencer's event.
    """
    return None if isinstance(ev, (Skipped, GroupClosed)) else ev.item  # type: ignore[no-any-return]


def group_of(key: Sequence[Any]) -> Any:
    """The group value of a Spark grouping key (binary as bytes: the resequencer hashes it).

    ``key``: Spark's grouping key, a row of one value.
    """
    k = key[0]
    return bytes(k) if isinstance(k, (bytearray, memoryview)) else k


def _order(item: Item) -> tuple[int, bool, int]:
    """Event-time order; within one time, by sequence number (no number last)."""
    return (item.ms or 0, item.seq is None, item.seq or 0)


def _held_ref(flags: bytes) -> Ref:
    return Ref(flags[0], HELD)


def _flags(ref: Ref) -> bytes:
    return bytes([ref.flags])


class Out(NamedTuple):
    """One output row: where its input columns come from, and its extra columns."""

    at: int | None
    """This call's row at that place (>= 0); ``HELD``: the held row ``seq``, which leaves the state store; None: a row
    of its own (``skipped``, ``group_closed``: of the input columns only the group's)."""
    seq: Any
    """The state store key of a held row (the message's sequence number; the batch mode's serial), read when ``at`` is
    ``HELD``; None for a row of its own."""
    extra: tuple[Any, ...]
    """The values of the extra columns (``instance``, ``terminal``, ``position``, ``reason``...), in order."""


@dataclass(frozen=True)
class Decision:
    """What one call decided for a key."""

    rows: list[Out]
    """The output rows, in event order."""
    hold: list[int]
    """This call's rows to keep in the state store (they have not left), in the order offered."""
    snapshot: bytes | None
    """The resequencer's state to keep; None: nothing left to keep."""
    deadline: int | None
    """The one timer the key needs (every other goes); None: none."""


E = TypeVar("E")  # the resequencer's events
C = TypeVar("C")  # what a mode learns restoring a snapshot (the batch mode: the top serial held)
D = TypeVar("D")  # what a call decides


class Stepped(Protocol[E]):
    """A resequencer as the loop sees it: time passes (``tick``), what is due comes out."""

    def tick(self) -> list[E]: ...

    def next_deadline(self) -> float | None: ...


class Timed(Protocol):
    """A row as the loop sees it: its event time (None counts as 0)."""

    @property
    def ms(self) -> int | None: ...


R = TypeVar("R", bound=Stepped[Any])
I = TypeVar("I", bound=Timed)  # noqa: E741  (the item type)


class RowRef(Protocol):
    """Where an event's row is: its place in this call's rows, or :data:`HELD`."""

    @property
    def row(self) -> int: ...


class KeyCore(ABC, Generic[R, I, E, C, D]):
    """One group key's resequencer driven by event time: the loop both modes share (see the module).

    A mode gives :meth:`_load` (a new or restored resequencer, and what restoring taught it),
    :meth:`_order` (the order of rows within one time), :meth:`_offer_row`, :meth:`_finish` (what
    is left at the end of a finished table), :meth:`_outputs` and :meth:`_ref_of` (an event's extra
    columns and where its row is), :meth:`_state_key` (what names a held row in the state store)
    and :meth:`_decide` (what a call keeps).
    """

    # --- the mode's differences -----------------------------------------------------------------
    @abstractmethod
    def _load(self, snapshot: bytes | None, clock: Clock) -> tuple[R, C]: ...

    @abstractmethod
    def _order(self, item: I) -> tuple[Any, ...]: ...

    @abstractmethod
    def _offer_row(self, r: R, group: Any, item: I, row: int) -> list[E]: ...

    @abstractmethod
    def _finish(self, r: R) -> list[E]: ...

    @abstractmethod
    def _outputs(self, events: list[E]) -> Iterator[tuple[E, tuple[Any, ...]]]: ...

    @abstractmethod
    def _ref_of(self, ev: E) -> RowRef | None: ...

    @abstractmethod
    def _state_key(self, ev: E, ref: Any) -> Any: ...

    @abstractmethod
    def _decide(self, r: R, rows: list[Out], order: list[int], loaded: C) -> D: ...

    # --- the shape --------------------------------------------------------------------------------
    def offer(self, snapshot: bytes | None, watermark: int, group: Any, items: Sequence[I]) -> D:
        """A micro-batch's rows for one key: first every deadline up to the watermark, then the rows in
        event-time order, each at its own time."""
        clock = Clock()
        r, loaded = self._load(snapshot, clock)
        order = self._event_order(items)
        clock.now = watermark
        events = r.tick()
        for i in order:
            clock.now = items[i].ms or 0
            events += self._offer_row(r, group, items[i], i)
        return self._decide(r, self._rows(events), order, loaded)

    def fire(self, snapshot: bytes | None, watermark: int, at: int) -> D:
        """The key's timer fired at ``at``: every deadline up to it (or the watermark, if later)."""
        clock = Clock()
        r, loaded = self._load(snapshot, clock)
        clock.now = max(watermark, at)
        return self._decide(r, self._rows(r.tick()), [], loaded)

    def table(self, group: Any, items: Sequence[I]) -> list[tuple[int | None, tuple[Any, ...]]]:
        """One group of a finished table, in-process: ``(row index, extras)`` per output row, in event
        order (index None: a row of its own)."""
        clock = Clock()
        r, _ = self._load(None, clock)
        events: list[E] = []
        for i in self._event_order(items):
            clock.now = items[i].ms or 0
            events += r.tick()
            events += self._offer_row(r, group, items[i], i)
        clock.now = float("inf")
        events += r.tick() + self._finish(r)
        return [(o.at, o.extra) for o in self._rows(events)]

    def _event_order(self, items: Sequence[I]) -> list[int]:
        """The places of ``items`` in event-time order (within one time, the mode's order)."""
        return sorted(range(len(items)), key=lambda i: self._order(items[i]))

    def _rows(self, events: list[E]) -> list[Out]:
        """The events as output rows: from this call's rows, from the held ones, or rows of their own."""
        rows = []
        for ev, extra in self._outputs(events):
            ref = self._ref_of(ev)
            rows.append(Out(None, None, extra) if ref is None else Out(ref.row, self._state_key(ev, ref), extra))
        return rows


def deadline_of(r: Stepped[Any]) -> int | None:
    """The one timer the key needs, in whole milliseconds; None: none."""
    deadline = r.next_deadline()
    return None if deadline is None else int(deadline)


class ResequenceCore(KeyCore[Resequencer, Item, Event, None, Decision]):
    """The stream's per-key decisions in the sequence mode (see the module docstring). Made from the
    user's options (seconds, SQL predicates): refuses options Spark cannot honour (:func:`core_options`).

    ``options``: the user's resequencing options.
    """

    def __init__(self, options: ResequenceOptions) -> None:
        self.options = core_options(options)

    def _load(self, snapshot: bytes | None, clock: Clock) -> tuple[Resequencer, None]:
        if snapshot is not None:
            return Resequencer.restore(snapshot, self.options, clock=clock, decode=_held_ref), None
        return Resequencer(self.options, clock=clock), None

    def _order(self, item: Item) -> tuple[int, bool, int]:
        return _order(item)

    def _offer_row(self, r: Resequencer, group: Any, item: Item, row: int) -> list[Event]:
        return r.offer(group, item.seq, Ref(item.flags, row), size=item.size or 0)

    def _finish(self, r: Resequencer) -> list[Event]:
        return r.close()

    def _outputs(self, events: list[Event]) -> Iterator[tuple[Event, tuple[Any, ...]]]:
        return outputs(events)

    def _ref_of(self, ev: Event) -> Ref | None:
        return ref_of(ev)

    def _state_key(self, ev: Event, ref: Ref) -> Any:
        return ev.seq  # type: ignore[union-attr]  # a message event (one with a row)

    def _decide(self, r: Resequencer, rows: list[Out], order: list[int], loaded: None) -> Decision:
        left = {o.at for o in rows if o.at is not None and o.at != HELD}
        # Nothing open, nothing timed and no instance number forgotten: the key's state can go. Once one
        # is forgotten the snapshot (a few bytes) stays, or the key's next instance could repeat a number.
        idle = r.open_groups == 0 and r.next_deadline() is None and r.instance_floor == 0
        keep = None if idle else r.snapshot(encode=_flags)
        hold = [i for i in order if i not in left]
        return Decision(rows, hold, keep, deadline_of(r))


def resequence_table(
    options: ResequenceOptions, group: Any, rows: list[dict[str, Any]]
) -> list[tuple[int | None, tuple[Any, ...]]]:
    """One group of a finished table, in-process: ``(row index, extras)`` per output row, in event order
    (index None: a ``skipped`` or ``group_closed`` row).

    ``options``: the user's resequencing options. ``group``: the group's value. ``rows``: the group's rows, as dicts
    with the helper columns.
    """
    return ResequenceCore(options).table(group, [Item.of(row) for row in rows])


__all__ = [
    "ENDS",
    "EXTRA_FIELDS",
    "FLAGS_COLUMN",
    "HELD",
    "MS_COLUMN",
    "SEQ_COLUMN",
    "SIZE_COLUMN",
    "STARTS",
    "Clock",
    "Decision",
    "Item",
    "Out",
    "Ref",
    "ResequenceCore",
    "core_options",
    "group_of",
    "outputs",
    "ref_of",
    "resequence_table",
]
