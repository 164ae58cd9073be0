"""What the batch resequencer is told and what it reports: options, keys, typed events.

The batch resequencer (Apache Camel's *batch resequencer*) sorts the items of a window by a key
that only has to be totally ordered, not contiguous: a timestamp, a database sequence value with
holes, a text id. :mod:`reassembly.resequencer.batch` holds the core; this module its options
(:class:`BatchOptions`), the policies and causes as enums, the events (NamedTuples, as the
sequence mode's), and :func:`sort_key`, the one place that decides which keys are accepted.

Every item offered ends in exactly one of :class:`BatchReleased`, :class:`BatchDuplicate` or
:class:`BatchInvalid`, each carrying the item as given: nothing is discarded, nothing is silent.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from datetime import date, datetime
from enum import Enum
from typing import Any, NamedTuple

from segmenter.errors import Reason, SegmentationError

_MAX_INT = (1 << 63) - 1  # keys are 64-bit integers at most (a Spark bigint; a snapshot writes them)
_MAX_DEPTH = 4  # tuples of tuples... of keys, at most this deep
_MAX_WIDTH = 64  # members of a tuple key


class DuplicatePolicy(str, Enum):
    """What happens to an item whose key equals one already held in its window."""

    KEEP = "keep"  # all are released, equal keys in arrival order (Camel: allowDuplicates=true)
    DROP = "drop"  # the first is kept; each later one is reported (BatchDuplicate) instead
    REPLACE = "replace"  # the last is kept; the one it replaces is reported (Camel's allowDuplicates=false)


class WindowCause(str, Enum):
    """Why a window was released."""

    SIZE = "size"  # it held batch_size items
    TIMEOUT = "timeout"  # batch_timeout passed since its first item (in tick())
    FLUSH = "flush"  # flush(): the input ended
    LIMIT = "limit"  # a memory bound (max_window_items/bytes, max_items/bytes in all) released it early


@dataclass(frozen=True)
class BatchOptions:
    """How to resequence in windows. Durations are in the injected clock's unit (seconds for ``time.monotonic``).

    A window is per group: it opens with the group's first item and is released (sorted by key,
    ``reverse`` for descending; ties keep arrival order) when it holds ``batch_size`` items, when
    ``batch_timeout`` has passed since its first item (in :meth:`~reassembly.resequencer.batch.BatchResequencer.tick`),
    at :meth:`~reassembly.resequencer.batch.BatchResequencer.flush`, or early by a memory bound.
    At least one of ``batch_size`` and ``batch_timeout`` is needed: with neither a window would
    only be released by ``flush()`` or a bound. ``key``: a function of the item giving its key,
    for :meth:`~reassembly.resequencer.batch.BatchResequencer.offer_item` (as ``sorted``'s
    ``key=``). The bounds release windows, they never drop: a window over ``max_window_items`` or
    ``max_window_bytes`` (sizes as given to ``offer``) is released at once, and while the items or
    bytes held in all are over ``max_items`` / ``max_bytes`` the oldest window is released
    (cause ``limit`` each time).
    """

    batch_size: int | None = 100
    """Items that release a window at once (None: no count, ``batch_timeout`` alone releases it)."""
    batch_timeout: float | None = 1.0
    """Clock units after a window's first item at which :meth:`~reassembly.resequencer.batch.BatchResequencer.tick`
    releases it (None: no deadline, ``batch_size`` alone releases it)."""
    reverse: bool = False
    """Release each window in descending key order instead of ascending (ties keep arrival order)."""
    duplicates: DuplicatePolicy = DuplicatePolicy.KEEP
    """What a window does with a second item of the same key: keep both, drop the later, or let the
    later replace the earlier (:class:`DuplicatePolicy`; each one dropped or replaced is reported)."""
    key: Callable[[Any], Any] | None = None
    """The function giving an item's sort key for ``offer_item`` (as ``sorted``'s ``key=``); None:
    ``offer`` is given the key with each item."""
    max_window_items: int = 100_000
    """A window holding more items than this is released at once (cause ``limit``)."""
    max_window_bytes: int = 64 << 20
    """A window holding more bytes than this (sizes as given to ``offer``) is released at once."""
    max_items: int = 10_000_000
    """Items held in all windows together at most: over it, the oldest window is released."""
    max_bytes: int = 1 << 30
    """Bytes held in all windows together at most: over it, the oldest window is released."""

    def __post_init__(self) -> None:
        def refuse(why: str, **details: Any) -> SegmentationError:
            return SegmentationError(why, reason=Reason.STATE_ERROR, **details)

        if self.batch_size is None and self.batch_timeout is None:
            raise refuse("a batch window needs batch_size, batch_timeout or both")
        if self.batch_size is not None and (type(self.batch_size) is not int or self.batch_size < 1):
            raise refuse("batch_size must be a whole number >= 1", value=self.batch_size)
        t = self.batch_timeout
        if t is not None and (type(t) not in (int, float) or not math.isfinite(t) or t < 0):
            raise refuse("batch_timeout must be a finite number >= 0 (clock units)", value=t)
        if type(self.reverse) is not bool:
            raise refuse("reverse must be True or False")
        try:
            object.__setattr__(self, "duplicates", DuplicatePolicy(self.duplicates))
        except ValueError:
            raise refuse("duplicates must be 'keep', 'drop' or 'replace'", value=self.duplicates) from None
        if self.key is not None and not callable(self.key):
            raise refuse("key must be a function of the item")
        for name in ("max_window_items", "max_window_bytes", "max_items", "max_bytes"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise refuse(f"{name} must be a whole number >= 1", value=value)
        if self.batch_size is not None and self.batch_size > self.max_window_items:
            raise refuse(
                "batch_size is above max_window_items: the bound would always release first",
                batch_size=self.batch_size,
                max_window_items=self.max_window_items,
            )


# ------------------------------------------------------------------ events
class BatchReleased(NamedTuple):
    """Out: passed on in its window's sorted order; ``position`` counts 0, 1, ... within the window."""

    group: Any
    """The group the item was offered under."""
    window: int
    """The number of the item's window (one counter for every group, never reused)."""
    key: Any
    """The item's sort key, by which its window is sorted."""
    item: Any
    """The item as offered."""
    position: int


class BatchDuplicate(NamedTuple):
    """Not passed on: its key equals one held in ``window`` (``duplicates`` ``drop``: this is the later
    item; ``replace``: the earlier one, which the later item replaced)."""

    group: Any
    """The group the item was offered under."""
    window: int
    key: Any
    """The item's sort key, equal to the key of an item already held in the window."""
    item: Any
    """The item as offered, handed back so that nothing is lost."""


class BatchInvalid(NamedTuple):
    """Not accepted (Camel's invalid exchange, never ignored silently): no key (None), a key of a type
    that is not ordered (9050), one that cannot be ordered with its window's keys (9050), or a size that
    is not a whole number >= 0 (9057). ``error.details`` has the numbers; no window is opened for it."""

    group: Any
    """The group the item was offered under."""
    key: Any
    """The item's sort key as given or computed; None when it has none, or its key function raised."""
    item: Any
    """The item as offered, handed back so that nothing is lost."""
    reason: Reason
    """Why the item was not accepted: 9050 (a key that cannot be ordered) or 9057 (a wrong size)."""
    error: SegmentationError


class WindowClosed(NamedTuple):
    """A window was released: after its :class:`BatchReleased` events, ``released`` of them, and
    ``duplicates`` items reported as :class:`BatchDuplicate`. ``opened`` is the clock when its first
    item came; ``at`` when it was released (for a timeout: ``opened + batch_timeout``, its own time)."""

    group: Any
    """The group whose window was released."""
    window: int
    """The number of the window released (one counter for every group, never reused)."""
    cause: WindowCause
    """Why it was released: it was full, timed out, the input ended, or a memory bound forced it."""
    released: int
    duplicates: int
    opened: float
    at: float


BatchEvent = BatchReleased | BatchDuplicate | BatchInvalid | WindowClosed


# ------------------------------------------------------------------ keys
class BadKey(Exception):
    """A key :func:`sort_key` refuses; the message says why (it becomes a 9050 :class:`BatchInvalid`)."""


def sort_key(key: Any, depth: int = 0) -> tuple[Hashable, Any]:
    """``(kind, key)`` for an acceptable key, or :class:`BadKey`.

    Accepted: ``int`` (64-bit, not ``bool``) and ``float`` (not NaN), one kind ``number``;
    ``str``; ``bytes`` (``bytearray``/``memoryview`` become ``bytes``); ``datetime``, naive or
    timezone-aware (two kinds: Python cannot order one against the other); ``date``; and tuples of
    these (the kind of each member is part of the tuple's kind, so two tuple keys of one kind always
    compare). Exact types only (a ``str`` enum or a pandas ``Timestamp`` is refused, not guessed at):
    within one kind every pair of keys compares and the order is total, and every key can be written
    into a snapshot and read back equal. Keys of one window must be of one kind.

    ``key``: the key offered. ``depth``: how deep in a tuple key this member is (0 for the key itself), bounded so a
    hostile key cannot nest without end.
    """
    t = type(key)
    if t is int:
        if not -_MAX_INT - 1 <= key <= _MAX_INT:
            raise BadKey("an integer key beyond 64 bits")
        return "number", key
    if t is str:
        return "str", key
    if t is bytes:
        return "bytes", key
    if t is datetime:
        try:
            aware = key.tzinfo is not None and key.utcoffset() is not None
        except Exception as exc:  # a tzinfo of the caller's that fails: not orderable
            raise BadKey(f"a datetime whose timezone fails: {exc}") from None
        return ("datetime (timezone-aware)" if aware else "datetime (naive)"), key
    if t is float:
        if math.isnan(key):
            raise BadKey("a NaN key (not ordered against anything)")
        return "number", key
    if t is date:
        return "date", key
    if t in (bytearray, memoryview):
        try:
            return "bytes", bytes(key)
        except (TypeError, ValueError) as exc:  # a memoryview of another format or shape
            raise BadKey(f"a {t.__name__} key that is not bytes: {exc}") from None
    if t is tuple:
        if depth >= _MAX_DEPTH or len(key) > _MAX_WIDTH:
            raise BadKey(f"a tuple key deeper than {_MAX_DEPTH} or wider than {_MAX_WIDTH}")
        members = [sort_key(k, depth + 1) for k in key]
        return ("tuple", *(k for k, _ in members)), tuple(v for _, v in members)
    if key is None:
        raise BadKey("no key (None)")
    raise BadKey(
        f"a key of type {t.__name__}: give int, float, str, bytes, datetime, date or a tuple of them"
    )


def kind_name(kind: Hashable) -> str:
    """A key kind as a reader names it (``tuple(number, str)``)."""
    if isinstance(kind, tuple):
        return f"tuple({', '.join(kind_name(k) for k in kind[1:])})"
    return str(kind)


__all__ = [
    "BatchDuplicate",
    "BatchEvent",
    "BatchInvalid",
    "BatchOptions",
    "BatchReleased",
    "DuplicatePolicy",
    "WindowCause",
    "WindowClosed",
    "sort_key",
]
