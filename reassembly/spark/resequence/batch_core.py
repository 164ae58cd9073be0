"""What the Spark batch resequencer decides for one group key: pure Python, no Spark, no clock.

The batch mode of both Spark forms (:mod:`reassembly.spark.resequence.functions` with
:class:`~reassembly.resequencer.batch_model.BatchOptions`) runs the in-process
:class:`~reassembly.resequencer.batch.BatchResequencer`, one per group key, with the event time in
milliseconds as its clock, in the shape both modes share
(:class:`~reassembly.spark.resequence.core.KeyCore`). This module gives the batch mode's
differences. A row reaches the resequencer as a :class:`BatchItem` (helper columns computed in the
JVM: event time, the key as a long, string or binary, size); the resequencer holds a
:class:`HeldRef` to where the row is. Each event becomes an output row's extra columns
(:func:`batch_outputs`); what is left at the end of a finished table is flushed.

Stream: :class:`BatchCore` returns a :class:`BatchDecision`. A row still held after the call is
kept in the state store under a serial number (map state; keys of equal value may be held
together, so the key cannot name a row), given above every serial held before the call. Batch:
:func:`batch_table`, one finished group in event order.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from reassembly.resequencer.batch import BatchResequencer
from reassembly.resequencer.batch_model import (
    BatchDuplicate,
    BatchEvent,
    BatchInvalid,
    BatchOptions,
    BatchReleased,
    WindowClosed,
)
from reassembly.spark.resequence.core import HELD, MS_COLUMN, SIZE_COLUMN, Clock, KeyCore, Out, deadline_of
from segmenter.errors import Reason

BATCH_EXTRA_FIELDS = (
    ("window", "bigint"),
    ("terminal", "string"),
    ("position", "bigint"),
    ("reason", "int"),
    ("reason_name", "string"),
    ("detail", "string"),
    ("cause", "string"),
    ("n_released", "bigint"),
    ("n_duplicates", "bigint"),
)
# The key as the core sorts it: a long (integers, timestamps in µs, dates in days), a string or binary.
KEY_COLUMN = "__reseq_key"
_SERIAL = struct.Struct(">q")


class HeldRef(NamedTuple):
    """What the resequencer holds for a Spark row: its place in this call's rows, or HELD and its serial."""

    row: int
    """The row's place in this call's rows; ``HELD`` (-1): held in the state store."""
    serial: int
    """The serial number the row is kept under in the state store (unique per key, never reused)."""


class BatchItem(NamedTuple):
    """One input row as the batch resequencer sees it: the helper columns' values."""

    ms: int | None
    """The row's event time in epoch milliseconds; None counts as 0."""
    key: Any
    """The row's sort key as the core sorts it; None: the row is refused (invalid)."""
    size: int | None
    """The row's size, counted toward the byte bounds; None counts as 0."""

    @classmethod
    def of(cls, row: Any) -> BatchItem:
        """From a row (a Spark Row or a dict) with the helper columns.

        ``row``: the input row.
        """
        return cls(row[MS_COLUMN], row[KEY_COLUMN], row[SIZE_COLUMN])


def batch_core_options(options: BatchOptions) -> BatchOptions:
    """Seconds to milliseconds; refuses what Spark cannot honour (``ValueError``, as the sequence mode).

    ``options``: the user's options.
    """
    if options.key is not None:
        raise ValueError("in Spark the key is a column (key=): compute it with withColumn, not BatchOptions(key=...)")
    if options.max_items < options.max_window_items or options.max_bytes < options.max_window_bytes:
        raise ValueError(
            "in Spark every group key has its own batch resequencer: max_items/max_bytes (in all) cannot be "
            "enforced across keys (transformWithState reaches only the key it is handling); bound each key's "
            "window with max_window_items/max_window_bytes (the state store bounds the keys together)"
        )
    timeout = options.batch_timeout
    return replace(options, batch_timeout=None if timeout is None else float(round(timeout * 1000)))


def batch_outputs(events: list[BatchEvent]) -> Iterator[tuple[BatchEvent, tuple[Any, ...]]]:
    """Every event with its extra columns (:data:`BATCH_EXTRA_FIELDS`): a row per item, and a row per
    :class:`~reassembly.resequencer.batch_model.WindowClosed` (terminal ``window_closed``).

    ``events``: the batch resequencer's events for one key, in order.
    """
    dup = int(Reason.RESEQ_DUPLICATE)
    for ev in events:
        if isinstance(ev, BatchReleased):
            yield ev, (ev.window, "out", ev.position, 0, "NONE", None, None, None, None)
        elif isinstance(ev, BatchDuplicate):
            detail = f"key equal to one held in window {ev.window}"
            yield ev, (ev.window, "duplicate", None, dup, Reason.RESEQ_DUPLICATE.name, detail, None, None, None)
        elif isinstance(ev, BatchInvalid):
            yield ev, (None, "invalid", None, int(ev.reason), ev.reason.name, str(ev.error), None, None, None)
        else:
            yield ev, (ev.window, "window_closed", None, 0, "NONE", None, ev.cause.value, ev.released, ev.duplicates)


def batch_ref_of(ev: BatchEvent) -> HeldRef | None:
    """Where an item event's row is; None for ``WindowClosed`` (a row of its own).

    ``ev``: the batch resequencer's event.
    """
    return None if isinstance(ev, WindowClosed) else ev.item  # type: ignore[no-any-return]


def _order(item: BatchItem) -> tuple[int, bool, Any]:
    """Event-time order; within one time, by key (no key last)."""
    return (item.ms or 0, item.key is None, 0 if item.key is None else item.key)


@dataclass(frozen=True)
class BatchDecision:
    """What one call decided for a key."""

    rows: list[Out]
    """In event order; Out.seq is a held row's serial."""
    hold: list[tuple[int, int]]
    """(this call's row, its serial) to keep in the state store."""
    snapshot: bytes | None
    """The resequencer's state to keep; None: nothing to keep."""
    deadline: int | None
    """The one timer the key needs; None: none."""


class BatchCore(KeyCore[BatchResequencer, BatchItem, BatchEvent, int, BatchDecision]):
    """The stream's per-key decisions in the batch mode (see the module docstring). Made from the
    user's options (seconds): refuses options Spark cannot honour (:func:`batch_core_options`).

    ``options``: the user's batch resequencing options.
    """

    def __init__(self, options: BatchOptions) -> None:
        self.options = batch_core_options(options)

    def _load(self, snapshot: bytes | None, clock: Clock) -> tuple[BatchResequencer, int]:
        """The resequencer, and the highest serial its snapshot holds (0: none)."""
        if snapshot is None:
            return BatchResequencer(self.options, clock=clock), 0
        top = [0]

        def held(raw: bytes) -> HeldRef:
            (serial,) = _SERIAL.unpack(raw)
            top[0] = max(top[0], serial)
            return HeldRef(HELD, serial)

        r = BatchResequencer.restore(snapshot, self.options, clock=clock, decode=held)
        return r, top[0]

    def _order(self, item: BatchItem) -> tuple[int, bool, Any]:
        return _order(item)

    def _offer_row(self, r: BatchResequencer, group: Any, item: BatchItem, row: int) -> list[BatchEvent]:
        return r.offer(group, item.key, HeldRef(row, -1), size=item.size or 0)

    def _finish(self, r: BatchResequencer) -> list[BatchEvent]:
        return r.flush()

    def _outputs(self, events: list[BatchEvent]) -> Iterator[tuple[BatchEvent, tuple[Any, ...]]]:
        return batch_outputs(events)

    def _ref_of(self, ev: BatchEvent) -> HeldRef | None:
        return batch_ref_of(ev)

    def _state_key(self, ev: BatchEvent, ref: HeldRef) -> int:
        return ref.serial

    def _decide(self, r: BatchResequencer, rows: list[Out], order: list[int], top: int) -> BatchDecision:
        hold: list[tuple[int, int]] = []

        def encode(ref: HeldRef) -> bytes:
            if ref.row == HELD:
                return _SERIAL.pack(ref.serial)
            hold.append((ref.row, top + 1 + len(hold)))
            return _SERIAL.pack(hold[-1][1])

        # The window counter stays once a window has opened, or the key's next window could repeat a number.
        keep = None if r.open_windows == 0 and r.next_window == 1 else r.snapshot(encode=encode)
        return BatchDecision(rows, hold, keep, deadline_of(r))


def batch_table(
    options: BatchOptions, group: Any, rows: list[dict[str, Any]]
) -> list[tuple[int | None, tuple[Any, ...]]]:
    """One group of a finished table, in-process: ``(row index, extras)`` per output row, in event
    order (index None: a ``window_closed`` row). Rows are offered in event-time order, each after
    every deadline up to its own time; then every deadline passes and what is left is flushed.

    ``options``: the user's batch resequencing options. ``group``: the group's value. ``rows``: the group's rows, as
    dicts with the helper columns.
    """
    return BatchCore(options).table(group, [BatchItem.of(row) for row in rows])


__all__ = [
    "BATCH_EXTRA_FIELDS",
    "KEY_COLUMN",
    "BatchCore",
    "BatchDecision",
    "BatchItem",
    "HeldRef",
    "batch_core_options",
    "batch_outputs",
    "batch_ref_of",
    "batch_table",
]
