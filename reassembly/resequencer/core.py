"""The sans-I/O resequencer (IBM Message Broker's Resequence node): messages and ticks in, typed events out.

Groups are put in order independently. Time only comes from the injected
``clock`` and only moves decisions in :meth:`Resequencer.tick`: :meth:`offer`
never fires a timeout, so the events for a given interleaving of offers and
ticks are the same however often ``tick`` is called (a deadline is handled
*at its own time*, not at the tick's). This is what lets the Spark operator,
which ticks when the watermark passes, give the in-process events exactly.

Semantics, per group instance (options in :mod:`.resequence_model`):

- A message with number ``next`` (the next expected) is passed on at once,
  with every held message that follows it without a gap: to **Out**
  (:class:`Released`) or, once a gap has been skipped in this instance, to
  **Expire** (:class:`Expired`). Each gets the next ``position`` (0, 1, ...).
- A higher number is held. When the group has been waiting for ``next`` for
  ``missing_timeout`` (measured from when it began waiting for *that*
  number), the gap up to the lowest held number is skipped
  (:class:`Skipped`), and from then on everything goes to Expire.
- A number that was skipped and turns up later goes to **Missing** (once;
  again it is a duplicate). Anything else not acceptable goes to **Failure**
  (:class:`Failed`, with a :class:`~segmenter.errors.Reason` 9050-9056).
- Limits never drop: a group over its held-messages or held-bytes bound,
  or the group waiting longest when the totals are over theirs, is moved on
  as if its timeout had passed (``Skipped(cause=evicted)``), which releases
  at least one message each time.
- An instance closes (:class:`GroupClosed`) when its end is passed (at once
  if nothing was skipped, else after ``missing_timeout`` more), after
  ``EndAuto.idle`` with nothing held, when ``max_groups`` needs room, or at
  :meth:`close`. A later message for the group id opens instance + 1; once
  the closed instance is forgotten (``keep_closed``, ``max_closed``), one
  above every instance number forgotten so far (:attr:`Resequencer.instance_floor`),
  so a ``(group, instance)`` never names two instances.
- All-or-nothing (``release_partial=False``): nothing is passed on until the
  instance holds its whole sequence (start to end); then all of it goes to
  Out at once. A timeout, limit or close sends the held prefix to Expire and
  skips the gap after it; the instance then goes on as one with a gap.

Hot path: a dict lookup, one comparison against ``next`` and one event per
in-order message; a dict of held messages only when out of order; one timer
heap entry per group and deadline *moved earlier* (deadlines that move later,
as the idle timer of a busy group does, re-arm lazily when they pop).
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Callable, Hashable, Iterable
from typing import Any

from reassembly.resequencer import snapshot as codec
from reassembly.resequencer.model import (
    ALWAYS,
    NEVER,
    CloseCause,
    EndAt,
    EndAuto,
    EndWhen,
    Event,
    Expired,
    Failed,
    Group,
    GroupClosed,
    Missing,
    Phase,
    Released,
    ResequenceOptions,
    SkipCause,
    Skipped,
    StartAt,
    StartAuto,
    StartWhen,
    Step,
    step,
)
from segmenter.errors import Reason, SegmentationError

_MAX_SEQ = (1 << 63) - 1  # sequence numbers are 64-bit (a snapshot writes them as JSON numbers)

Clock = Callable[[], float]
Message = tuple[Hashable, Any, Any] | tuple[Hashable, Any, Any, int]
"""``(group, seq, item)`` or ``(group, seq, item, size)``: what :meth:`Resequencer.offer_many` takes."""
_new: Callable[..., Any] = tuple.__new__  # builds an event NamedTuple without its Python-level __new__ (2-3x faster)


def _predicate(p: Any, what: str) -> Callable[[int, Any], bool] | None:
    if p is None or callable(p):
        return p  # type: ignore[no-any-return]
    raise SegmentationError(
        f"{what} predicate must be callable in-process (SQL text is for reassembly.spark.resequence.functions)",
        reason=Reason.STATE_ERROR,
    )


class Resequencer:
    """Puts messages back in sequence-number order, per group.

    ``options``: where sequences start and end, how long a missing number is waited for, and the
    memory bounds (:class:`~reassembly.resequencer.model.ResequenceOptions`); ``clock``: a function
    returning the time now, in the unit of the options' durations (``time.monotonic``: seconds),
    injected so that the resequencer itself reads no clock. The rules, event by event, are in the
    resequencer how-to (docs/how-to/resequencer.md)."""

    def __init__(self, options: ResequenceOptions | None = None, *, clock: Clock) -> None:
        self.options = opts = options or ResequenceOptions()
        self._clock = clock
        self.limits = opts.limits
        s, e = opts.start, opts.end
        self._start_at = s.seq if isinstance(s, StartAt) else None
        self._start_when = _predicate(s.predicate if isinstance(s, StartWhen) else None, "start")
        self._gather = s.gather if isinstance(s, StartAuto) else None
        self._end_at = e.seq if isinstance(e, EndAt) else None
        self._end_when = _predicate(e.predicate if isinstance(e, EndWhen) else None, "end")
        self._idle = e.idle if isinstance(e, EndAuto) else None
        self._timeout = opts.missing_timeout
        self._whole = not opts.release_partial  # all-or-nothing: hold until start..end is all there
        self._groups: dict[Any, Group] = {}  # open, oldest first
        self._closed: dict[Any, Group] = {}  # closed, remembered for their instance number
        self._waiting: dict[Any, None] = {}  # groups holding messages, longest waiting first
        self._heap: list[tuple[float, int, Group]] = []
        self._serial = 0
        self._floor = 0  # the highest instance number forgotten: new instance numbers go above it
        self.held_messages = 0
        self.held_bytes = 0
        self._max_group = self.limits.max_group_messages
        self._max_total = self.limits.max_messages

    # ------------------------------------------------------------------ input
    def offer(self, group: Hashable, seq: Any, item: Any, size: int = 0) -> list[Event]:
        """One message of ``group`` with sequence number ``seq``; ``size`` counts toward the byte limits.

        The same fast paths as :meth:`offer_many`, kept here too: delegating to it doubles the cost of
        a single message (its per-batch set-up is paid per message).

        ``item``: the message itself, handed back in the events.
        """
        g = self._groups.get(group)
        events: list[Event]
        if g is not None and type(seq) is int and seq < g.stop:  # running, no end predicate, below the end
            nxt = g.next
            if seq == nxt:  # the in-order path
                pos = g.position
                g.position = pos + 1
                g.next = seq + 1
                if g.expiring:
                    g.n_expired += 1
                    events = [_new(Expired, (group, g.instance, seq, item, pos))]
                else:
                    events = [_new(Released, (group, g.instance, seq, item, pos))]
                if g.held:
                    self._progress(g, self._clock(), events)
                elif self._idle is not None:
                    g.deadline = self._clock() + self._idle
                    if g.armed is None:
                        self._arm(g)
                return events
            held = g.held
            if seq > nxt and not size and seq not in held:  # the out-of-order path: hold it
                if not held:
                    self._waiting[group] = None
                    if self._timeout is not None:
                        self._set(g, self._clock() + self._timeout)
                held[seq] = item
                self.held_messages += 1
                if len(held) <= self._max_group and self.held_messages <= self._max_total:
                    return []
                events = []
                self._bound(g, self._clock(), events)
                return events
        events = []
        self._offer(group, seq, item, size, self._clock(), events)
        return events

    def offer_many(self, messages: Iterable[Message], now: float | None = None) -> list[Event]:
        """Many messages at one time ``now`` (default: the clock, read once): ``(group, seq, item)`` or
        ``(group, seq, item, size)`` each, as a consumer's poll or a Spark partition delivers them.

        The events are exactly those of offering each message in turn with the clock reading ``now``
        (offers never fire timeouts, so only deadlines *set* by the batch see the sampled time). It is
        the fast form: one call, one clock reading and the attribute lookups per batch, not per message.

        ``messages``: the messages, offered in order.
        """
        t = self._clock() if now is None else now
        events: list[Event] = []
        add = events.append
        get = self._groups.get
        waiting = self._waiting
        idle, timeout, max_group, max_total = self._idle, self._timeout, self._max_group, self._max_total
        for m in messages:
            if len(m) == 3:
                group, seq, item = m
                size = 0
            else:
                group, seq, item, size = m
            g = get(group)
            if g is not None and type(seq) is int and seq < g.stop:  # running, no end predicate, below the end
                nxt = g.next
                if seq == nxt:  # the in-order path
                    pos = g.position
                    g.position = pos + 1
                    g.next = seq + 1
                    if g.expiring:
                        g.n_expired += 1
                        add(_new(Expired, (group, g.instance, seq, item, pos)))
                    else:
                        add(_new(Released, (group, g.instance, seq, item, pos)))
                    if g.held:
                        self._progress(g, t, events)
                    elif idle is not None:
                        g.deadline = t + idle  # a later deadline: re-armed lazily when the old one pops
                        if g.armed is None:
                            self._arm(g)
                    continue
                held = g.held
                if seq > nxt and not size and seq not in held:  # the out-of-order path: hold it
                    if not held:
                        waiting[group] = None
                        if timeout is not None:
                            self._set(g, t + timeout)
                    held[seq] = item
                    self.held_messages += 1
                    if len(held) > max_group or self.held_messages > max_total:
                        self._bound(g, t, events)
                    continue
            self._offer(group, seq, item, size, t, events)
        return events

    def tick(self) -> list[Event]:
        """Handle every deadline up to the clock's now, each at its own time, oldest first."""
        now = self._clock()
        events: list[Event] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            at, serial, g = heapq.heappop(heap)
            if not self._live(serial, g):
                continue  # stale entry
            g.armed = None
            if g.deadline is None:
                continue
            if g.deadline > at:  # moved later since it was armed
                self._arm(g)
                continue
            self._fire(g, at, events)
        return events

    def close(self, group: Hashable = ...) -> list[Event]:
        """End of input (of one ``group``, or of all): what is held is passed on (Expire), the group closes."""
        now = self._clock()
        events: list[Event] = []
        chosen = list(self._groups.values()) if group is ... else [self._groups[group]] if group in self._groups else []
        for g in chosen:
            while g.held:
                self._force(g, now, SkipCause.CLOSED, events)
            if g.key in self._groups:
                self._close(g, now, CloseCause.CLOSED, events)
        return events

    def next_deadline(self) -> float | None:
        """The earliest time :meth:`tick` has something to do (or None): when to call it next."""
        while self._heap:
            at, serial, g = self._heap[0]
            if self._live(serial, g):
                return at
            heapq.heappop(self._heap)
        return None

    @property
    def open_groups(self) -> int:
        return len(self._groups)

    @property
    def instance_floor(self) -> int:
        """The highest instance number forgotten (0: none). A group id with no closed instance
        remembered opens ``instance_floor + 1``: the one number that keeps ``(group, instance)``
        unique after closed instances are forgotten, so whoever keeps the state keeps it too."""
        return self._floor

    # ------------------------------------------------------------------ the rules
    def _fail(self, g: Group | None, key: Any, seq: Any, item: Any, reason: Reason, why: str, **details: Any) -> Failed:
        if g is not None:
            g.failed += 1
        err = SegmentationError(why, reason=reason, seq=seq, **details)
        return Failed(key, g.instance if g is not None else None, seq, item, reason, err)

    def _offer(self, key: Any, seq: Any, item: Any, size: int, now: float, events: list[Event]) -> None:
        g = self._groups.get(key)
        if type(seq) is not int or not -_MAX_SEQ <= seq <= _MAX_SEQ:  # beyond 64 bits no snapshot could hold it
            what = "sequence number is not an integer" if type(seq) is not int else "sequence number beyond 64 bits"
            events.append(self._fail(g, key, seq, item, Reason.RESEQ_BAD_NUMBER, what))
            return
        if type(size) is not int or size < 0:  # a negative size would lift the byte limits
            events.append(self._fail(g, key, seq, item, Reason.RESEQ_BAD_SIZE, "size is not a whole number >= 0"))
            return
        if g is None:  # refusals that need no group come first: a refused message opens nothing
            if self._start_at is not None and seq < self._start_at:
                events.append(self._before_start(None, key, seq, item, self._start_at))
                return
            if self._end_at is not None and seq > self._end_at:
                events.append(self._after_end(None, key, seq, item, self._end_at))
                return
            g = self._open(key, now, events)
        if g.start is not None and seq < g.start:
            events.append(self._before_start(g, key, seq, item, g.start))
        elif g.phase is not Phase.GATHERING and g.phase is not Phase.WAITING and seq < g.next:
            events.append(self._late(g, seq, item))
        elif g.end is not None and seq > g.end:
            events.append(self._after_end(g, key, seq, item, g.end))
        elif seq in g.held:
            events.append(self._fail(g, key, seq, item, Reason.RESEQ_DUPLICATE, "sequence number already held"))
        else:
            self._accept(g, seq, item, size, now, events)

    def _before_start(self, g: Group | None, key: Any, seq: int, item: Any, start: int) -> Failed:
        return self._fail(g, key, seq, item, Reason.RESEQ_BEFORE_START, "below the start of sequence", start=start)

    def _after_end(self, g: Group | None, key: Any, seq: int, item: Any, end: int) -> Failed:
        return self._fail(g, key, seq, item, Reason.RESEQ_AFTER_END, "above the end of sequence", end=end)

    def _late(self, g: Group, seq: int, item: Any) -> Event:
        """A number already passed: Missing if it was skipped (and not yet seen), else a failure."""
        lo, hi = g.gap_lo, g.gap_hi
        if g.floor is not None and seq < g.floor:
            return self._fail(g, g.key, seq, item, Reason.RESEQ_FORGOTTEN, "below the remembered gaps", floor=g.floor)
        i = bisect_right(lo, seq) - 1
        if i >= 0 and seq < hi[i]:
            a, b = lo[i], hi[i]
            pieces = [(x, y) for x, y in ((a, seq), (seq + 1, b)) if x < y]
            lo[i : i + 1] = [p[0] for p in pieces]
            hi[i : i + 1] = [p[1] for p in pieces]
            self._bound_gaps(g)  # a split adds a range: the same bound as a skip
            g.n_missing += 1
            return Missing(g.key, g.instance, seq, item)
        return self._fail(g, g.key, seq, item, Reason.RESEQ_DUPLICATE, "sequence number already passed on")

    def _accept(self, g: Group, seq: int, item: Any, size: int, now: float, events: list[Event]) -> None:
        key = g.key
        starts = g.phase is Phase.WAITING and self._start_when is not None and self._start_when(seq, item)
        if starts and g.held and min(g.held) < seq:
            events.append(
                self._fail(
                    g, key, seq, item, Reason.RESEQ_START_NOT_LOWEST, "start above a held number", lowest=min(g.held)
                )
            )
            return
        if g.end is None and self._end_when is not None and self._end_when(seq, item):
            top = max(g.held) if g.held else (g.next - 1 if g.phase is Phase.RUNNING else None)
            if top is not None and seq < top:
                why = "end below a received number"
                events.append(self._fail(g, key, seq, item, Reason.RESEQ_END_BELOW_RECEIVED, why, top=top))
                return
            g.end = seq
            self._restop(g)
        if starts or (g.phase is Phase.GATHERING and self._gather is not None and self._gather <= 0):
            self._start(g, seq, expiring=False)
        if g.phase is Phase.RUNNING and seq == g.next and not (self._whole and not g.expiring):
            g.held[seq] = item  # passed on at once by _progress
            self.held_messages += 1
            self._progress(g, now, events)
            return
        if not g.held:
            self._waiting[key] = None
            if g.phase is not Phase.GATHERING:
                self._set(g, None if self._timeout is None else now + self._timeout)
        g.held[seq] = item
        self.held_messages += 1
        if size:
            g.sizes[seq] = size
            g.nbytes += size
            self.held_bytes += size
        if self._whole and self._whole_now(g):
            self._progress(g, now, events)
            return
        self._bound(g, now, events)

    def _whole_now(self, g: Group) -> bool:
        """All-or-nothing: the instance holds every number from ``next`` to its end (held numbers lie
        in that range once running and are distinct, so counting them is enough)."""
        return g.phase is Phase.RUNNING and g.end is not None and len(g.held) == g.end - g.next + 1

    def _progress(self, g: Group, now: float, events: list[Event]) -> None:
        """After ``next`` moved: pass on what follows without a gap, then set the group's deadline."""
        if self._whole and not g.expiring and not self._whole_now(g):
            # All-or-nothing, not whole yet: keep holding. The missing timeout counts from the first
            # message held; a deadline that just fired (or none yet) is set again from now.
            if g.armed is None:
                self._set(g, None if self._timeout is None or not g.held else now + self._timeout)
            return
        held, sizes, key, instance = g.held, g.sizes, g.key, g.instance
        seq, pos = g.next, g.position
        kind = Expired if g.expiring else Released
        while seq in held:
            events.append(_new(kind, (key, instance, seq, held.pop(seq), pos)))
            if sizes and seq in sizes:
                size = sizes.pop(seq)
                g.nbytes -= size
                self.held_bytes -= size
            seq += 1
            pos += 1
        moved = pos - g.position
        self.held_messages -= moved
        if g.expiring:
            g.n_expired += moved
        g.next, g.position = seq, pos
        if not held:
            self._waiting.pop(g.key, None)
        if g.end is not None and g.next > g.end:
            if g.gap_lo and self._timeout is not None:
                g.phase = step(g.phase, Step.END)
                self._restop(g)
                self._set(g, now + self._timeout)
            else:
                self._close(g, now, CloseCause.ENDED if g.gap_lo else CloseCause.COMPLETE, events)
        else:  # waiting for a new ``next``, or idle (inlined ``_set``: this runs once per run released)
            span = self._timeout if held else self._idle
            g.deadline = deadline = None if span is None else now + span
            if deadline is not None and (g.armed is None or deadline < g.armed):
                self._arm(g)

    def _start(self, g: Group, seq: int, *, expiring: bool) -> None:
        g.phase = step(g.phase, Step.START)
        g.start = g.next = seq
        g.expiring = expiring
        self._restop(g)

    def _restop(self, g: Group) -> None:
        """The bound below which ``offer`` may take the fast paths (none: -inf)."""
        if g.phase is not Phase.RUNNING or self._end_when is not None or (self._whole and not g.expiring):
            g.stop = NEVER
        else:
            g.stop = ALWAYS if g.end is None else g.end

    def _bound_gaps(self, g: Group) -> None:
        """At most ``max_gaps`` skipped ranges: the oldest are forgotten (below their end is 9056)."""
        while len(g.gap_lo) > self.limits.max_gaps:
            g.floor = g.gap_hi[0]
            del g.gap_lo[0], g.gap_hi[0]

    def _force(self, g: Group, at: float, cause: SkipCause, events: list[Event]) -> None:
        """Move on without the next number: skip to the lowest held one; everything after goes to Expire."""
        if self._whole and g.phase is Phase.RUNNING and not g.expiring:
            g.expiring = True  # the sequence will not be whole: what is held is a partial one
            self._restop(g)
            if g.next in g.held:  # the held prefix, to Expire (no gap before it)
                self._progress(g, at, events)
                if not g.held or g.key not in self._groups:
                    return
        lowest = min(g.held)
        if g.phase is Phase.RUNNING:
            first: int | None = g.next
            g.gap_lo.append(g.next)
            g.gap_hi.append(lowest)
            self._bound_gaps(g)
            g.next = lowest
            g.expiring = True
        else:  # the start never came (or gathering was cut short): the prefix is unknown
            first = None
            self._start(g, lowest, expiring=True)
        events.append(Skipped(g.key, g.instance, first, lowest, cause))
        self._progress(g, at, events)

    def _bound(self, g: Group, now: float, events: list[Event]) -> None:
        lim = self.limits
        while g.held and (len(g.held) > lim.max_group_messages or g.nbytes > lim.max_group_bytes):
            self._force(g, now, SkipCause.EVICTED, events)
        while self.held_messages > lim.max_messages or self.held_bytes > lim.max_bytes:
            victim = self._groups[next(iter(self._waiting))]
            self._force(victim, now, SkipCause.EVICTED, events)

    def _fire(self, g: Group, at: float, events: list[Event]) -> None:
        """A deadline passed (``at`` is its time)."""
        if g.phase is Phase.CLOSED:
            del self._closed[g.key]
            self._floor = max(self._floor, g.instance)
        elif g.phase is Phase.GATHERING:
            self._start(g, min(g.held), expiring=False)
            self._progress(g, at, events)
        elif g.held:  # waiting for the start or for ``next``
            self._force(g, at, SkipCause.TIMEOUT, events)
        else:
            self._close(g, at, CloseCause.ENDED if g.phase is Phase.ENDING else CloseCause.IDLE, events)

    # ------------------------------------------------------------------ groups and timers
    def _open(self, key: Any, now: float, events: list[Event]) -> Group:
        while len(self._groups) >= self.limits.max_groups:
            oldest = next(iter(self._groups.values()))
            while oldest.held:
                self._force(oldest, now, SkipCause.EVICTED, events)
            if oldest.key in self._groups:
                self._close(oldest, now, CloseCause.EVICTED, events)
        was = self._closed.pop(key, None)
        instance = was.instance + 1 if was is not None else self._floor + 1
        if self._start_at is not None:
            g = Group(key, instance, Phase.RUNNING, self._start_at, self._end_at)
        elif self._start_when is not None:
            g = Group(key, instance, Phase.WAITING, None, self._end_at)
        else:
            g = Group(key, instance, Phase.GATHERING, None, self._end_at)
            assert self._gather is not None
            self._set(g, now + self._gather)
        self._restop(g)
        self._groups[key] = g
        return g

    def _close(self, g: Group, at: float, cause: CloseCause, events: list[Event]) -> None:
        del self._groups[g.key]
        self._waiting.pop(g.key, None)
        g.phase = step(g.phase, Step.CLOSE)
        self._restop(g)
        gaps = tuple(zip(g.gap_lo, g.gap_hi, strict=True))
        released = g.position - g.n_expired
        events.append(GroupClosed(g.key, g.instance, cause, released, g.n_expired, g.n_missing, g.failed, gaps))
        g.held, g.sizes, g.gap_lo, g.gap_hi = {}, {}, [], []
        self._closed[g.key] = g
        while len(self._closed) > self.limits.max_closed:
            forgotten = self._closed.pop(next(iter(self._closed)))
            self._floor = max(self._floor, forgotten.instance)
        keep = self.options.keep_closed
        self._set(g, None if keep is None else at + keep)

    def _set(self, g: Group, deadline: float | None) -> None:
        g.deadline = deadline
        if deadline is not None and (g.armed is None or deadline < g.armed):
            self._arm(g)

    def _live(self, serial: int, g: Group) -> bool:
        """A heap entry still stands for its group's timer (the last one armed, the group still kept).

        By serial, not time: an entry superseded by one at the same time would otherwise count as
        live too, fire in the place of the later one, and be written twice into a snapshot."""
        return g.serial == serial and (self._groups.get(g.key) is g or self._closed.get(g.key) is g)

    def _arm(self, g: Group) -> None:
        assert g.deadline is not None
        self._serial += 1
        heapq.heappush(self._heap, (g.deadline, self._serial, g))
        g.armed, g.serial = g.deadline, self._serial

    # ------------------------------------------------------------------ persistence
    def snapshot(self, encode: Callable[[Any], bytes] | None = None) -> bytes:
        """The whole state as bytes (see :mod:`reassembly.resequencer.snapshot`); ``encode`` turns an item into bytes
        (default: items must be bytes-like). Deadlines are stored as clock values: use a wall clock if a
        snapshot must outlive the process."""
        live = sorted(e for e in self._heap if self._live(e[1], e[2]))
        timers = [g for _, _, g in live]
        return codec.encode(self._groups, self._waiting, self._closed, timers, self._floor, encode)

    @classmethod
    def restore(
        cls,
        blob: bytes,
        options: ResequenceOptions | None = None,
        *,
        clock: Clock,
        decode: Callable[[bytes], Any] | None = None,
    ) -> Resequencer:
        """A resequencer in the snapshot's state; a malformed or hostile snapshot is a STATE_ERROR.

        ``blob``: the bytes :meth:`snapshot` returned. ``options``: the constructor's options, given again
        (configuration, not state; None: the defaults). ``clock``: the clock the timeouts are read on. ``decode``: turns
        each held item's bytes in the snapshot back into the item (None: items come back as bytes).
        """
        r = cls(options, clock=clock)
        r._groups, r._waiting, r._closed, timers, r._floor = codec.decode(blob, r.limits, decode, whole=r._whole)
        for g in timers:  # in the order they fire: equal deadlines keep their order
            assert g.armed is not None  # codec.decode() checked it
            r._serial += 1
            heapq.heappush(r._heap, (g.armed, r._serial, g))
            g.serial = r._serial
        for g in (*r._groups.values(), *r._closed.values()):
            r.held_messages += len(g.held)
            r.held_bytes += g.nbytes
            r._restop(g)
            if g.deadline is not None and g.armed is None:  # a version-1 snapshot: no timers kept
                r._arm(g)
        return r


__all__ = ["Resequencer"]
