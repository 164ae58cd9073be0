"""The sans-I/O batch resequencer (Apache Camel's batch resequencer): items in a window, released sorted by key.

The sequence mode (:class:`~reassembly.resequencer.core.Resequencer`) needs contiguous integers
and waits for each missing one. This mode needs only a key that is totally ordered (an int, a
timestamp, a text id, bytes, a tuple of these: :func:`~reassembly.resequencer.batch_model.sort_key`)
and never waits for anything in particular: it collects a window and sorts it.

Semantics, per group (a single stream is one group value):

- A group's window opens with its first item, at the clock's now, and is numbered from one counter
  for the whole resequencer (1, 2, 3... in the order windows open, over all groups), so
  ``(group, window)`` never names two windows, and neither does ``window`` alone. The counter is
  kept in snapshots.
- An item joins its group's window unless it is refused (:class:`BatchInvalid`: no key, a key type
  not ordered, a key of another kind than the window's first, a bad size) or its key equals one held
  and ``duplicates`` is ``drop`` or ``replace`` (:class:`BatchDuplicate`, carrying the item not
  passed on).
- The window is released: at once when it holds ``batch_size`` items (``size``); in :meth:`tick`
  once ``batch_timeout`` has passed since it opened (``timeout``, handled at its own time:
  ``opened + batch_timeout``); at :meth:`flush` (``flush``); early when a bound is passed
  (``limit``: the window over ``max_window_items`` / ``max_window_bytes``, or, while the totals are
  over ``max_items`` / ``max_bytes``, the oldest window). Released means: its items as
  :class:`BatchReleased`, sorted by key (descending with ``reverse``; equal keys keep their arrival
  order either way: the sort is stable), then one :class:`WindowClosed` with the counts.
- :meth:`offer` never fires a timeout (as in the sequence mode): the events for an interleaving of
  offers and ticks are the same however often ``tick`` is called, which is what lets the Spark
  operator, ticking when the watermark passes, give the in-process events exactly.

Order is only promised within a window: a window released by its timeout may hold keys below
those of the window before it. Size the window (``batch_size``, ``batch_timeout``) for the
disorder you expect, as with Camel's.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Iterable
from operator import itemgetter
from typing import Any

from reassembly.resequencer import batch_snapshot as codec
from reassembly.resequencer.batch_model import (
    BadKey,
    BatchDuplicate,
    BatchEvent,
    BatchInvalid,
    BatchOptions,
    BatchReleased,
    DuplicatePolicy,
    WindowCause,
    WindowClosed,
    kind_name,
    sort_key,
)
from segmenter.errors import Reason, SegmentationError

Clock = Callable[[], float]
BatchMessage = tuple[Hashable, Any, Any] | tuple[Hashable, Any, Any, int]
"""``(group, key, item)`` or ``(group, key, item, size)``: what :meth:`BatchResequencer.offer_many` takes."""
_key = itemgetter(0)


class Window:
    """One group's open window: its items in arrival order as ``[key, item, size]``."""

    __slots__ = ("deadline", "duplicates", "entries", "group", "index", "kind", "live", "nbytes", "number", "opened")

    def __init__(self, group: Any, number: int, opened: float, kind: Hashable) -> None:
        self.group = group
        self.number = number
        self.opened = opened
        self.kind = kind
        self.deadline: float | None = None
        self.entries: list[list[Any]] = []
        self.index: dict[Any, int] = {}  # key -> place in entries (duplicates drop/replace only)
        self.nbytes = 0
        self.duplicates = 0
        self.live = True  # False once released (its timer entry is then stale)


class BatchResequencer:
    """Sorts each group's items within windows of size and/or time.

    ``options``: the windows' size and timeout, the sort order, what a duplicate key does and the
    memory bounds (:class:`~reassembly.resequencer.batch_model.BatchOptions`); ``clock``: a function
    returning the time now, in the unit of ``batch_timeout`` (``time.monotonic``: seconds), injected
    so that the resequencer itself reads no clock."""

    def __init__(self, options: BatchOptions | None = None, *, clock: Clock) -> None:
        self.options = opts = options or BatchOptions()
        self._clock = clock
        self._size = opts.batch_size
        self._timeout = opts.batch_timeout
        self._unique = opts.duplicates is not DuplicatePolicy.KEEP
        self._windows: dict[Any, Window] = {}  # open, oldest first
        self._heap: list[tuple[float, int, Window]] = []
        self._next = 1  # the next window's number
        self.held_items = 0
        self.held_bytes = 0

    # ------------------------------------------------------------------ input
    def offer(self, group: Hashable, key: Any, item: Any, size: int = 0) -> list[BatchEvent]:
        """One item of ``group`` with sort key ``key``; ``size`` counts toward the byte bounds.

        ``group``: the item's group (any hashable). ``key``: its sort key. ``item``: the item itself, handed back in the
        events.
        """
        events: list[BatchEvent] = []
        self._offer(group, key, item, size, self._clock(), events)
        return events

    def offer_item(self, group: Hashable, item: Any, size: int = 0) -> list[BatchEvent]:
        """One item whose key is ``options.key(item)``; a key function that raises is a 9050
        :class:`BatchInvalid` (key None), not an exception out of here.

        ``group``: the item's group. ``item``: the item, whose key the options' key function gives. ``size``: its size
        in bytes, counted toward the byte bounds.
        """
        fn = self.options.key
        if fn is None:
            raise SegmentationError("offer_item needs BatchOptions(key=...)", reason=Reason.STATE_ERROR)
        try:
            key = fn(item)
        except Exception as exc:  # the caller's function on hostile input: a refused item, nothing lost
            why = f"the key function raised {type(exc).__name__}: {exc}"
            err = SegmentationError(why, reason=Reason.RESEQ_BAD_NUMBER)
            return [BatchInvalid(group, None, item, err.reason, err)]
        return self.offer(group, key, item, size)

    def offer_many(self, messages: Iterable[BatchMessage], now: float | None = None) -> list[BatchEvent]:
        """Many items at one time ``now`` (default: the clock, read once): exactly the events of
        offering each in turn with the clock reading ``now``.

        ``messages``: the items, each a tuple (group, key, item) or (group, key, item, size), offered in order.
        """
        t = self._clock() if now is None else now
        events: list[BatchEvent] = []
        for m in messages:
            if len(m) == 3:
                group, key, item = m
                size = 0
            else:
                group, key, item, size = m
            self._offer(group, key, item, size, t, events)
        return events

    def tick(self) -> list[BatchEvent]:
        """Release every window whose ``batch_timeout`` has passed by the clock's now, each at its own
        time, in the order of those times (equal ones: the older window first)."""
        now = self._clock()
        events: list[BatchEvent] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            at, _, w = heapq.heappop(heap)
            if w.live:
                self._release(w, WindowCause.TIMEOUT, at, events)
        return events

    def flush(self, group: Hashable = ...) -> list[BatchEvent]:
        """End of input (of one ``group``, or of all): release what is held, oldest window first."""
        now = self._clock()
        events: list[BatchEvent] = []
        if group is ...:
            chosen = list(self._windows.values())
        else:
            w = self._windows.get(group)
            chosen = [] if w is None else [w]
        for w in chosen:
            self._release(w, WindowCause.FLUSH, now, events)
        return events

    def next_deadline(self) -> float | None:
        """The earliest time :meth:`tick` has something to do (or None): when to call it next."""
        while self._heap:
            at, _, w = self._heap[0]
            if w.live:
                return at
            heapq.heappop(self._heap)
        return None

    @property
    def open_windows(self) -> int:
        return len(self._windows)

    @property
    def next_window(self) -> int:
        """The number the next window to open will get (numbers are never reused)."""
        return self._next

    # ------------------------------------------------------------------ the rules
    def _offer(self, group: Any, key: Any, item: Any, size: int, now: float, events: list[BatchEvent]) -> None:
        try:
            w = self._windows.get(group)
        except TypeError:
            raise SegmentationError("group ids must be hashable", reason=Reason.STATE_ERROR) from None
        if type(size) is not int or size < 0:  # a negative size would lift the byte bounds
            err = SegmentationError("size is not a whole number >= 0", reason=Reason.RESEQ_BAD_SIZE, size=size)
            events.append(BatchInvalid(group, key, item, err.reason, err))
            return
        try:
            kind, key = sort_key(key)
        except BadKey as exc:
            err = SegmentationError(str(exc), reason=Reason.RESEQ_BAD_NUMBER, key_type=type(key).__name__)
            events.append(BatchInvalid(group, key, item, err.reason, err))
            return
        if w is None:
            w = self._open(group, kind, now)
        elif kind != w.kind:
            why = f"a {kind_name(kind)} key cannot be ordered with this window's {kind_name(w.kind)} keys"
            err = SegmentationError(why, reason=Reason.RESEQ_BAD_NUMBER, window=w.number)
            events.append(BatchInvalid(group, key, item, err.reason, err))
            return
        if self._unique and key in w.index:
            i = w.index[key]
            w.duplicates += 1
            if self.options.duplicates is DuplicatePolicy.DROP:
                events.append(BatchDuplicate(group, w.number, key, item))
                return
            old = w.entries[i]  # replace: the later item takes the earlier one's place
            events.append(BatchDuplicate(group, w.number, old[0], old[1]))
            w.entries[i] = [key, item, size]
            self._count(w, 0, size - old[2])
        else:
            if self._unique:
                w.index[key] = len(w.entries)
            w.entries.append([key, item, size])
            self._count(w, 1, size)
        self._bound(w, now, events)

    def _count(self, w: Window, items: int, nbytes: int) -> None:
        w.nbytes += nbytes
        self.held_items += items
        self.held_bytes += nbytes

    def _bound(self, w: Window, now: float, events: list[BatchEvent]) -> None:
        opts = self.options
        n = len(w.entries)
        if self._size is not None and n >= self._size:
            self._release(w, WindowCause.SIZE, now, events)
        elif n > opts.max_window_items or w.nbytes > opts.max_window_bytes:
            self._release(w, WindowCause.LIMIT, now, events)
        while self.held_items > opts.max_items or self.held_bytes > opts.max_bytes:
            self._release(next(iter(self._windows.values())), WindowCause.LIMIT, now, events)

    def _open(self, group: Any, kind: Hashable, now: float) -> Window:
        w = Window(group, self._next, now, kind)
        self._next += 1
        self._windows[group] = w
        if self._timeout is not None:
            w.deadline = now + self._timeout
            heapq.heappush(self._heap, (w.deadline, w.number, w))
        return w

    def _release(self, w: Window, cause: WindowCause, at: float, events: list[BatchEvent]) -> None:
        del self._windows[w.group]
        w.live = False
        entries = w.entries
        entries.sort(key=_key, reverse=self.options.reverse)  # stable: equal keys keep arrival order
        group, number = w.group, w.number
        events.extend(BatchReleased(group, number, k, item, pos) for pos, (k, item, _) in enumerate(entries))
        events.append(WindowClosed(group, number, cause, len(entries), w.duplicates, w.opened, at))
        self.held_items -= len(entries)
        self.held_bytes -= w.nbytes
        w.entries, w.index = [], {}

    # ------------------------------------------------------------------ persistence
    def snapshot(self, encode: Callable[[Any], bytes] | None = None) -> bytes:
        """The whole state as bytes (see :mod:`reassembly.resequencer.batch_snapshot`): the window
        counter and every open window with its keys (as accepted, never recomputed by the key
        function on restore) and items; ``encode`` turns an item into bytes (default: items must be
        bytes-like). Group ids must be str, int, bytes or None. Times are stored as clock values: use a
        wall clock if a snapshot must outlive the process."""
        windows = [(w.group, w.number, w.opened, w.duplicates, w.entries) for w in self._windows.values()]
        return codec.encode(self._next, windows, encode)

    @classmethod
    def restore(
        cls,
        blob: bytes,
        options: BatchOptions | None = None,
        *,
        clock: Clock,
        decode: Callable[[bytes], Any] | None = None,
    ) -> BatchResequencer:
        """A batch resequencer in the snapshot's state, under ``options`` (configuration, not state:
        give the same ones; a snapshot holding more than their bounds allow is refused). A malformed
        or hostile snapshot is a STATE_ERROR.

        ``blob``: the bytes :meth:`snapshot` returned. ``clock``: the clock the windows are timed on, as the
        constructor's. ``decode``: turns each held item's bytes in the snapshot back into the item (None: items come
        back as bytes).
        """
        r = cls(options, clock=clock)
        r._next, loaded = codec.decode(blob, r.options, decode)
        for group, number, opened, duplicates, entries in loaded:
            w = Window(group, number, opened, sort_key(entries[0][0])[0])
            w.duplicates = duplicates
            for key, item, size in entries:
                if r._unique:
                    w.index[key] = len(w.entries)
                w.entries.append([key, item, size])
                r._count(w, 1, size)
            r._windows[group] = w
            if r._timeout is not None:
                w.deadline = opened + r._timeout
                heapq.heappush(r._heap, (w.deadline, number, w))
        return r


__all__ = ["BatchMessage", "BatchResequencer"]
