"""IterableSource: a runner's :class:`~reassembly.runtime.Source` over any iterable (tests, files).

Items are whole messages (``MessageComplete``, ``GroupComplete``, or an
:class:`~reassembly.runtime.Offered` carrying a key, a size or positions of its own) or any
other assembler event, which goes to ``on_event`` (default: logged at WARNING, a ``Duplicate`` at
DEBUG): nothing is dropped without a word. :meth:`IterableSource.from_segments` runs an
:class:`~reassembly.assembler.Assembler` over encoded segments first, so a file of segments (or a
list of ``(segment, partition, offset)``) feeds a runner as a log consumer would; its commits are
then the offsets a Kafka consumer would commit (``dispatcher.commit_offset`` over the assembler's
safe position), recorded in :attr:`IterableSource.commits`.

The source is finite: once the iterable is exhausted (:attr:`IterableSource.exhausted`) a runner
finishes what it holds and returns. It reads lazily, ``batch`` items per fetch, and not at all
while paused: held memory stays within the budget plus one fetch (``batch=1``: one message).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from typing import Any

import reassembly.dispatcher
from reassembly.assembler import Assembler, Duplicate, GroupComplete, MessageComplete
from reassembly.assembler.positions import next_offset
from reassembly.dispatcher import Dispatcher, Outcome, Work
from reassembly.runtime.base import Offered

log = logging.getLogger("reassembly.runtime")

SegmentItem = bytes | bytearray | memoryview | tuple[Any, Hashable, int]
"""An encoded segment, or ``(segment, partition, offset)`` where it was read."""


def _log_event(event: object) -> None:
    if isinstance(event, Duplicate):
        log.debug("duplicate segment ignored: %s", event)
    else:
        log.warning("not a whole message, not dispatched: %s", str(event)[:500])


class PauseFlag:
    """Back-pressure as a flag the source's ``fetch`` reads (a queue or a share group has no
    partitions to pause: while paused the source does not read); ``pauses`` counts the pauses."""

    _paused = False
    pauses = 0

    @property
    def paused(self) -> bool:
        return self._paused

    def pause(self) -> None:
        if not self._paused:
            self._paused = True
            self.pauses += 1

    def resume(self) -> None:
        self._paused = False


class IterableSource:
    """A finite :class:`~reassembly.runtime.Source` over ``items``.

    ``on_event``: where items that are not whole messages go. ``on_settled(work, outcome)``:
    called when a message is settled DONE or DEAD (what a broker would be told).

    ``items``: what is read, in order: :class:`~reassembly.runtime.Offered` messages, or an assembler's events (a
    ``MessageComplete`` or ``GroupComplete`` is offered, any other goes to ``on_event``). ``batch``: the most messages
    one :meth:`fetch` returns. ``assembler``: the assembler whose next offsets :meth:`commit` records
    (None: the dispatcher's floor alone).
    """

    def __init__(
        self,
        items: Iterable[object],
        *,
        batch: int = 64,
        on_event: Callable[[object], None] | None = None,
        on_settled: Callable[[Work, reassembly.dispatcher.Outcome], None] | None = None,
        assembler: Assembler | None = None,
    ) -> None:
        self._items: Iterator[object] = iter(items)
        self.batch = max(1, batch)
        self.on_event = on_event or _log_event
        self.on_settled = on_settled
        self.assembler = assembler
        self.exhausted = False
        self.paused = False
        self.pauses = 0
        self.resumes = 0
        self.fetched = 0
        self.settled_count = {Outcome.DONE: 0, Outcome.DEAD: 0}
        self.commits: list[dict[Hashable, int | None]] = []  # per commit: partition -> offset committed
        self._partitions: set[Hashable] = set()
        self._revoked: list[Hashable] = []
        self._lock = threading.Lock()

    @classmethod
    def from_segments(
        cls,
        segments: Iterable[SegmentItem],
        assembler: Assembler | None = None,
        *,
        batch: int = 64,
        on_event: Callable[[object], None] | None = None,
        on_settled: Callable[[Work, reassembly.dispatcher.Outcome], None] | None = None,
    ) -> IterableSource:
        """Encoded segments (or ``(segment, partition, offset)``) through an assembler; at the end
        its open groups come back as ``Unfinished`` events (to ``on_event``).

        ``segments``: the encoded segments, or ``(segment, partition, offset)`` triples, in arrival order.
        ``assembler``: the assembler they go through (None: a new one with the default limits). ``batch``, ``on_event``,
        ``on_settled``: as the constructor's.
        """
        asm = assembler if assembler is not None else Assembler()

        def events() -> Iterator[object]:
            for item in segments:
                if isinstance(item, tuple):
                    data, partition, offset = item
                    yield from asm.receive(data, offset, partition)
                else:
                    yield from asm.receive(item)
            yield from asm.close()

        return cls(events(), batch=batch, on_event=on_event, on_settled=on_settled, assembler=asm)

    # ------------------------------------------------------------------ Source
    def fetch(self, timeout: float) -> Sequence[Offered]:
        """Up to ``batch`` whole messages; nothing while paused or once exhausted (never waits:
        the items are there or they are not).

        ``timeout``: ignored (nothing is waited for).
        """
        out: list[Offered] = []
        if self.paused or self.exhausted:
            return out
        while len(out) < self.batch:
            try:
                item = next(self._items)
            except StopIteration:
                self.exhausted = True
                break
            if isinstance(item, Offered):
                out.append(item)
            elif isinstance(item, MessageComplete | GroupComplete):
                out.append(Offered(item))
            else:
                self.on_event(item)
                continue
            self._note(out[-1])
        self.fetched += len(out)
        return out

    def _note(self, o: Offered) -> None:
        positions = o.positions if o.positions is not None else getattr(o.message, "positions", ())
        for p in positions:
            self._partitions.add(p[0])

    def settled(self, work: Work, outcome: reassembly.dispatcher.Outcome) -> None:
        self.settled_count[outcome] = self.settled_count.get(outcome, 0) + 1
        if self.on_settled is not None:
            self.on_settled(work, outcome)

    def commit(self, dispatcher: Dispatcher, force: bool = False) -> None:
        """Record what a log consumer would commit per partition seen: ``dispatcher.commit_offset``
        over the assembler's next offset (its safe position; the dispatcher's floor alone without
        an assembler).

        ``dispatcher``: the runner's dispatcher, which knows what is settled. ``force``: True for the runner's last
        commit, as it stops (every commit is recorded either way).
        """
        checkpoints = self.assembler.checkpoints() if self.assembler is not None else {}
        done: dict[Hashable, int | None] = {}
        for p in sorted(self._partitions, key=repr):
            cp = checkpoints.get(p)
            assembler_next = next_offset(cp) if cp is not None else None
            done[p] = dispatcher.commit_offset(p, assembler_next)
        self.commits.append(done)

    def pause(self) -> None:
        self.paused = True
        self.pauses += 1

    def resume(self) -> None:
        self.paused = False
        self.resumes += 1

    def held_bytes(self) -> int:
        return self.assembler.buffered_bytes if self.assembler is not None else 0

    def revoke(self, partition: Hashable) -> None:
        """Take ``partition`` away (as a rebalance would): reported by the next :meth:`revoked`.
        Safe from any thread."""
        with self._lock:
            self._revoked.append(partition)
            self._partitions.discard(partition)

    def revoked(self) -> list[Hashable]:
        with self._lock:
            out, self._revoked = self._revoked, []
        return out

    def close(self) -> None:
        self.exhausted = True
