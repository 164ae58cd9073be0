"""The control loop the three runners share: the only caller of the Dispatcher and the Source.

A runner is this loop plus a *carrier* that moves :class:`~reassembly.dispatcher.Work` to workers
(threads, asyncio tasks, processes) and brings results back. The shape is the same for all three:

* the loop fetches whole messages from the :class:`Source` and offers them to the
  :class:`~reassembly.dispatcher.Dispatcher`, which decides who may take what (a group is owned by
  one worker from the moment one of its messages is handed out until it is settled);
* it hands work out in batches through each worker's own queue (a worker's identity is what the
  dispatcher's ownership and ``worker_gone`` speak of), sized by the handler's measured time per
  message: first about ``batch_seconds`` of work to each worker in turn, the least loaded first (a
  fast handler wakes few workers, each with a large batch: one hand-over per batch, not per
  message), then, when a turn of the loop takes longer (a fetch that assembles a large batch),
  level by level up to what lasts two turns (every worker gets one more before any gets two more:
  a slow handler's work spreads over every worker, and no worker runs dry while the loop fetches);
  never more than ``prefetch`` each;
* workers post ``(worker, [(ticket, failure or None), ...], seconds busy)`` back on one results
  queue after each batch; the loop blocks on that queue (never a busy wait) for no longer than the
  next thing it must do: a retry coming due, a commit coming due, a fetch while workers are idle;
* it settles in batches: DONE; a failure is retried (:class:`~reassembly.dispatcher.RetryPolicy`,
  its random draw injected) or, past ``max_attempts``, written to the :class:`DeadLetter` and only
  then settled DEAD, so a commit never passes a message that is neither handled nor dead-lettered;
* it feeds the :class:`~reassembly.dispatcher.Budget` with everything held (segments in assembly:
  ``source.held_bytes()``; messages waiting and in flight: ``dispatcher.held_bytes()``) and pauses
  or resumes the source; it commits every ``commit_every`` settlements or ``commit_interval``
  seconds and when it stops, and also at the interval with no settlement when the source says a
  commit may move or must be made again (``commit_wanted()``, optional: Kafka's source after it
  read records that settle without a message, or after the cluster refused a commit); it passes
  the source's revoked partitions to ``dispatcher.revoke`` (work of a revoked partition still in
  flight is fenced: its result commits nothing).

Stopping (:meth:`Runner.stop`, a signal through :func:`stop_on_signals`, ``stop()`` returning true,
``idle_exit``) drains: nothing new is fetched or handed out, work in flight finishes within
``drain_timeout`` seconds and is settled, the safe offsets are committed, then :meth:`Runner.run`
returns its :class:`RunSummary`. Work still running at the deadline stays unsettled: the commit
stays below it and the next consumer handles it again (at least once: a duplicate, never a loss).

The runner leaves the source and the dead letter open: whoever made them closes them.

The shapes of what the loop meets (:class:`Source`, :class:`Offered`, the carrier, the dead
letter, :class:`Failure`, :class:`RunSummary`) are in :mod:`reassembly.runtime.contracts` and
importable from here; this module holds the loop itself.
"""

from __future__ import annotations

import logging
import queue
import random as _random
import signal
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

from reassembly.dispatcher import (
    AfterDead,
    Budget,
    Dispatcher,
    Fenced,
    GroupView,
    Ordering,
    Outcome,
    RetryPolicy,
    Work,
)
from reassembly.runtime.contracts import Carrier as Carrier
from reassembly.runtime.contracts import DeadLetter as DeadLetter
from reassembly.runtime.contracts import DeadRecord as DeadRecord
from reassembly.runtime.contracts import Failure as Failure
from reassembly.runtime.contracts import Handler as Handler
from reassembly.runtime.contracts import Offered as Offered
from reassembly.runtime.contracts import Result as Result
from reassembly.runtime.contracts import RunSummary as RunSummary
from reassembly.runtime.contracts import Source as Source
from reassembly.runtime.metrics import Metrics
from segmenter.errors import Reason, SegmentationError

if TYPE_CHECKING:
    pass

log = logging.getLogger("reassembly.runtime")


# ---------------------------------------------------------------- control requests


@dataclass
class _Request:
    """A question for the loop from another thread (snapshot, release): answered between batches."""

    kind: str
    arg: Any = None
    answer: Any = None
    ready: threading.Event = field(default_factory=threading.Event)


DEFAULT_MESSAGES = 10_000  # the budget when none is given: messages held (waiting, in flight)
DEFAULT_BYTES = 256 << 20  # and bytes held (those and the segments in assembly)

_WAKE = object()  # put on the results queue by stop(): the loop looks at its flags at once


class RunnerOptions(TypedDict, total=False):
    """The keyword arguments every runner passes on to :class:`Runner` (its defaults and meaning are
    there): one list, so that a runner states only what it adds (its carrier, its handler)."""

    workers: int
    ordering: Ordering
    retry: RetryPolicy | None
    after_dead: AfterDead
    dead_letter: DeadLetter | None
    budget: Budget | None
    clock: Callable[[], float]
    random: Callable[[], float]
    metrics: Metrics | None
    drain_timeout: float
    prefetch: int
    batch_seconds: float
    commit_every: int
    commit_interval: float
    fetch_wait: float


class Runner:
    """The control loop over a carrier; :class:`~reassembly.runtime.ThreadRunner`,
    :class:`~reassembly.runtime.AsyncRunner` and :class:`~reassembly.runtime.ProcessRunner`
    give it theirs.

    ``workers``: how many handlers run at once. ``prefetch``: the most messages a worker may hold
    (running and queued to it, each of a group it owns); below it, as many as take about
    ``batch_seconds`` (or two turns of the loop) at the handler's measured pace. ``commit_every`` /
    ``commit_interval``: settlements / seconds between commits. ``fetch_wait``: how long one fetch
    may wait when workers are idle (also the longest the loop sleeps while anything is in flight and
    the source may have more).
    ``budget``: default :data:`DEFAULT_MESSAGES` messages and :data:`DEFAULT_BYTES` bytes.
    ``clock`` and ``random`` are injected (the core is given ``now`` and the retry draw).

    ``source``: where the whole messages come from (:class:`Source`; the runner leaves it open).
    ``carrier``: what moves work to the workers and their results back (each runner gives its
    own). ``ordering``: what makes a group, one worker at a time
    (:class:`~reassembly.dispatcher.Ordering`). ``retry``: when a failed message is handed out
    again, and after how many attempts it is dead (``None``:
    :class:`~reassembly.dispatcher.RetryPolicy`'s defaults). ``after_dead``: what a group does
    after one of its messages went dead: ``CONTINUE`` goes on, ``HOLD`` waits for :meth:`release`.
    ``dead_letter``: where a dead message is written before it is settled (``None``: it is only
    logged, and counted in ``summary.unwritten_dead``). ``metrics``: the counters and gauges
    (``None``: a :class:`~reassembly.runtime.Metrics` with its defaults, which logs the
    gauges and serves no endpoint). ``drain_timeout``: the seconds the work in flight at a stop has
    to finish; what still runs then is left unsettled (handled again after a restart).
    """

    def __init__(
        self,
        source: Source,
        carrier: Carrier,
        *,
        workers: int = 8,
        ordering: Ordering = Ordering.GROUP,
        retry: RetryPolicy | None = None,
        after_dead: AfterDead = AfterDead.CONTINUE,
        dead_letter: DeadLetter | None = None,
        budget: Budget | None = None,
        clock: Callable[[], float] = time.monotonic,
        random: Callable[[], float] = _random.random,
        metrics: Metrics | None = None,
        drain_timeout: float = 30.0,
        prefetch: int = 256,
        batch_seconds: float = 0.002,
        commit_every: int = 1000,
        commit_interval: float = 5.0,
        fetch_wait: float = 0.05,
    ) -> None:
        if workers < 1:
            raise SegmentationError(f"workers must be at least 1, not {workers}", reason=Reason.ARGUMENT_ERROR)
        if prefetch < 1:
            raise SegmentationError(f"prefetch must be at least 1, not {prefetch}", reason=Reason.ARGUMENT_ERROR)
        self.source = source
        self.carrier = carrier
        self.workers = workers
        self.retry = retry if retry is not None else RetryPolicy()
        self.dead_letter = dead_letter
        self.budget = budget if budget is not None else Budget(DEFAULT_MESSAGES, DEFAULT_BYTES)
        self.clock = clock
        self.random = random
        self.metrics = metrics if metrics is not None else Metrics()
        self.drain_timeout = drain_timeout
        self.prefetch = prefetch
        self.batch_seconds = batch_seconds
        self._pace = 0.001  # seconds per message, measured (moving average); a guess until then
        self._hold = min(prefetch, 2)  # what a worker may hold now
        self._fill = 1  # what a worker is given first, before the others get more
        self._turn = 0.0  # seconds per turn of the loop (moving average): a worker's batch must outlast one
        self.commit_every = commit_every
        self.commit_interval = commit_interval
        self.fetch_wait = fetch_wait
        self.dispatcher = Dispatcher(ordering, after_dead=after_dead)
        bind = getattr(source, "bind", None)
        if callable(bind):  # a source that fences inside its rebalance callback (KafkaDispatchSource)
            bind(self.dispatcher)
        self.summary = RunSummary()
        self._results: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._running = threading.Event()
        self._inflight: dict[int, tuple[Work, int, float]] = {}  # ticket -> (work, worker, handed at)
        self._outstanding = [0] * workers  # messages held by each worker
        self._dead_pending: list[DeadRecord] = []  # dead, waiting for the dead letter to take them
        self._dead_retry_at = 0.0
        self._since_commit = 0
        self._last_commit = 0.0
        self._paused = False
        self._source_done = False

    @property
    def fetch_paused(self) -> bool:
        """Fetching is paused by the budget."""
        return self._paused

    # ------------------------------------------------------------------ other threads
    def stop(self) -> None:
        """Drain and return from :meth:`run`: safe from any thread and from a signal handler."""
        self._stopping.set()
        self._results.put(_WAKE)  # SimpleQueue.put is reentrant: safe in a signal handler

    def snapshot(self) -> list[GroupView]:
        """Every group held: id, messages, owner, acquired (asked of the loop while it runs)."""
        if not self._running.is_set():
            return self.dispatcher.groups()
        answer: list[GroupView] = self._ask("snapshot")
        return answer

    def release(self, group: Hashable) -> int:
        """Let a group held after a dead message (``AfterDead.HOLD``) go on; messages released.
        ``group``: its ordering key (:attr:`~reassembly.dispatcher.GroupView.group`, as
        :meth:`snapshot` lists it)."""
        if not self._running.is_set():
            return self.dispatcher.release(group)
        released: int = self._ask("release", group)
        return released

    def _ask(self, kind: str, arg: Any = None) -> Any:
        req = _Request(kind, arg)
        self._results.put(req)
        if not req.ready.wait(10.0) and self._running.is_set():
            raise SegmentationError(f"the runner's loop did not answer {kind} in 10 s", reason=Reason.STATE_ERROR)
        if not req.ready.is_set():  # the loop ended meanwhile
            return self.dispatcher.groups() if kind == "snapshot" else self.dispatcher.release(arg)
        return req.answer

    # ------------------------------------------------------------------ the loop
    def run(self, stop: Callable[[], bool] | None = None, idle_exit: float | None = None) -> RunSummary:
        """Fetch, dispatch, settle and commit until :meth:`stop`, ``stop()`` true, the source's end
        (an :class:`~reassembly.runtime.IterableSource` that ran out) or ``idle_exit`` seconds with
        nothing fetched and nothing held; then drain (see the module's docstring)."""
        started = self.clock()
        self._last_commit = started
        self.metrics.started(self)  # first: a missing extra fails before any worker starts
        self.carrier.start(self.workers, self._results)
        self._running.set()
        idle_since = started
        try:
            while True:
                now = turn_start = self.clock()
                if self._stopping.is_set() or (stop is not None and stop()):
                    break
                self._revocations()
                self._hand_out(now)  # ready work first: the fetch may wait only when workers are idle
                got, waited = self._fetch(now)
                now = self.clock()
                if got:
                    self._hand_out(now)
                if got or not self._quiet():
                    idle_since = now
                elif self._exhausted() or (idle_exit is not None and now - idle_since >= idle_exit):
                    # quiet right after a hand-out to idle workers: whatever is still held waits
                    # for an operator (AfterDead.HOLD), and a finite source has nothing more
                    break
                self._collect(self._wait(now, got, waited))
                self._after_settling()
                self._turn += 0.2 * (self.clock() - turn_start - self._turn)
        finally:
            try:
                self._drain()
            finally:
                self._running.clear()
                self._answer_pending()
                self.summary.seconds = self.clock() - started
                self.metrics.finished(self)
        return self.summary

    def _exhausted(self) -> bool:
        """A finite source (an :class:`~reassembly.runtime.IterableSource`) that ran out."""
        return bool(getattr(self.source, "exhausted", False))

    def _quiet(self) -> bool:
        """Nothing running, nothing coming due."""
        return not self._inflight and not self._dead_pending and self.dispatcher.next_wakeup() is None

    def _revocations(self) -> None:
        for partition in self.source.revoked():
            r = self.dispatcher.revoke(partition)
            self.summary.revoked_partitions += 1
            dropped = len(r.dropped)
            self.summary.dropped_by_revoke += dropped
            log.info("partition %s revoked: %d queued messages dropped, the rest fenced", partition, dropped)

    def _fetch(self, now: float) -> tuple[int, bool]:
        """Fetch and offer: (messages, whether the fetch could wait). It waits only when no worker
        has anything to do; an exhausted source is not asked."""
        if self._exhausted():
            return 0, False
        timeout = 0.0 if self._inflight or self._paused else self._until_due(now, self.fetch_wait)
        offered = self.source.fetch(timeout)
        for o in offered:
            self.dispatcher.offer(o.message, now=now, key=o.key, size=o.size, positions=o.positions)
            self.summary.offered += 1
        # after every fetch, not only one that completed a message: the segments of messages still
        # in assembly count too, and fetches that only add to them must pause once they fill the budget
        self._check_budget()
        return len(offered), timeout > 0

    def _until_due(self, now: float, wait: float) -> float:
        """``wait``, cut short by the next retry, commit or dead-letter attempt coming due."""
        wake = self.dispatcher.next_wakeup()
        if wake is not None:
            wait = min(wait, wake - now)
        if self._since_commit or self._commit_wanted():
            wait = min(wait, self._last_commit + self.commit_interval - now)
        if self._dead_pending:
            wait = min(wait, self._dead_retry_at - now)
        return max(0.0, wait)

    def _hand_out(self, now: float) -> None:
        """First a batch of about ``batch_seconds`` of work to each worker in turn, the least loaded
        first (a fast handler: few workers woken, each with a large batch); then, while a turn of the
        loop outlasts such a batch, level by level up to what lasts two turns (every worker gets one
        more before any gets two more: a slow handler's work spreads over every worker)."""
        out = self._outstanding
        batches: dict[int, list[Work]] = {}
        fill = self._fill
        for w in sorted(range(self.workers), key=out.__getitem__):
            while out[w] < fill:
                if not self._take(w, now, batches):
                    self._send(batches)
                    return
        for level in range(fill, self._hold):
            for w in range(self.workers):
                if out[w] != level:
                    continue
                if not self._take(w, now, batches):
                    self._send(batches)
                    return
        self._send(batches)

    def _take(self, w: int, now: float, batches: dict[int, list[Work]]) -> bool:
        """Adds the next work the dispatcher gives worker ``w`` to its batch and counts it as held;
        False when the dispatcher has none to give (the hand-out stops there)."""
        work = self.dispatcher.take(w, now)
        if work is None:
            return False
        batches.setdefault(w, []).append(work)
        self._inflight[work.ticket] = (work, w, now)
        self._outstanding[w] += 1
        return True

    def _send(self, batches: dict[int, list[Work]]) -> None:
        for w, batch in batches.items():
            self.carrier.hand(w, batch)

    def _wait(self, now: float, fetched: int, waited: bool) -> list[Any]:
        """Results that arrived. Blocks (on the results queue: stop() wakes it) only when there is
        nothing else to do, and never longer than until the next fetch, retry or commit is due."""
        items: list[Any] = []
        get = self._results.get_nowait
        try:
            while True:
                items.append(get())
        except queue.Empty:
            pass
        if items or waited:
            return items
        if fetched and not self._paused:
            return items  # more may be waiting at the source: fetch ahead (the budget bounds it) first
        try:
            items.append(self._results.get(timeout=self._until_due(now, self.fetch_wait)))
        except queue.Empty:
            return items
        try:
            while True:
                items.append(get())
        except queue.Empty:
            pass
        return items

    def _collect(self, items: list[Any]) -> None:
        """Settle a batch of results (and answer requests) in arrival order."""
        now = self.clock()
        for item in items:
            if item is _WAKE:
                continue
            if isinstance(item, _Request):
                self._answer(item)
                continue
            worker, results, busy = item
            for ticket, failure in results:
                self._settle(worker, ticket, failure, now)
            if results:
                self._pace += 0.2 * (busy / len(results) - self._pace)
                pace = max(self._pace, 1e-7)
                self._fill = max(1, min(self.prefetch, int(self.batch_seconds / pace)))
                self._hold = max(self._fill, min(self.prefetch, int(2 * self._turn / pace)))
        for worker, running in self.carrier.gone():
            self._worker_lost(worker, running, now)
        self._write_dead(now)

    def _settle(self, worker: int, ticket: int, failure: Failure | None, now: float) -> None:
        entry = self._inflight.pop(ticket, None)
        if entry is None:
            return  # came back through worker_gone already
        work, w, _handed = entry
        self._outstanding[w] -= 1
        d = self.dispatcher
        if failure is None:
            r = d.settle(ticket, Outcome.DONE, now=now)
            if isinstance(r, Fenced):
                self.summary.fenced += 1
                return
            self.summary.done += 1
            self._since_commit += 1
            self.source.settled(work, Outcome.DONE)
            self.metrics.handled_one(now - _handed)
            return
        retry_at = self.retry.decide(work.attempt, now, self.random())
        if retry_at is not None:
            r = d.settle(ticket, Outcome.RETRY, now=now, retry_at=retry_at)
            if isinstance(r, Fenced):
                self.summary.fenced += 1
                return
            self.summary.retries += 1
            self.metrics.retried()
            log.warning(
                "handler failed (attempt %d of %d, retry in %.2f s) on %s: %s",
                work.attempt,
                self.retry.max_attempts,
                retry_at - now,
                describe(work),
                failure,
            )
            return
        self._dead_pending.append(DeadRecord(work, failure, work.attempt))

    def _write_dead(self, now: float) -> None:
        """Dead messages to the dead letter, then settled DEAD: never the other way round."""
        if not self._dead_pending or now < self._dead_retry_at:
            return
        records, self._dead_pending = self._dead_pending, []
        if self.dead_letter is not None:
            try:
                self.dead_letter.write(records)
            except Exception as exc:
                self._dead_pending = records + self._dead_pending
                self._dead_retry_at = now + 1.0
                log.error("dead letter refused %d messages (trying again in 1 s): %s", len(records), exc)
                return
        for rec in records:
            if self.dead_letter is None:
                self.summary.unwritten_dead += 1
                log.error(
                    "no dead letter configured: %s given up after %d attempts, settled dead: %s",
                    describe(rec.work),
                    rec.attempts,
                    rec.failure,
                )
            r = self.dispatcher.settle(rec.work.ticket, Outcome.DEAD, now=now)
            if isinstance(r, Fenced):
                self.summary.fenced += 1
                continue
            self.summary.dead += 1
            self._since_commit += 1
            self.metrics.dead()
            self.source.settled(rec.work, Outcome.DEAD)

    def _worker_lost(self, worker: int, running: int | None, now: float) -> None:
        """A worker died: the message it was running counts as a failed attempt (a handler that kills
        its process must not loop forever); the others it held come back untouched."""
        self.summary.workers_lost += 1
        log.error("worker %d died%s", worker, "" if running is None else f" running ticket {running}")
        if running is not None and running in self._inflight:
            self._settle(worker, running, Failure("WorkerDied", f"worker {worker} died running it"), now)
        self.dispatcher.worker_gone(worker)
        for ticket in [t for t, (_w, w, _h) in self._inflight.items() if w == worker]:
            del self._inflight[ticket]
        self._outstanding[worker] = 0

    def _after_settling(self) -> None:
        self._check_budget()
        now = self.clock()
        due = self._since_commit >= self.commit_every or (
            (self._since_commit or self._commit_wanted()) and now - self._last_commit >= self.commit_interval
        )
        if due:
            self._commit(now, force=False)
        self.metrics.tick(self, now)

    def _check_budget(self) -> None:
        held_bytes = self.source.held_bytes() + self.dispatcher.held_bytes()
        held_messages = self.dispatcher.held_messages()
        s = self.summary
        s.peak_held_bytes = max(s.peak_held_bytes, held_bytes)
        s.peak_held_messages = max(s.peak_held_messages, held_messages)
        change = self.budget.update(held_messages, held_bytes)
        if change is True and not self._paused:
            self._paused = True
            self.summary.pauses += 1
            self.source.pause()
            log.info("fetch paused: %d messages, %d bytes held", held_messages, held_bytes)
        elif change is False and self._paused:
            self._paused = False
            self.summary.resumes += 1
            self.source.resume()
            log.info("fetch resumed: %d messages, %d bytes held", held_messages, held_bytes)

    def _commit_wanted(self) -> bool:
        """The source's ``commit_wanted()`` (optional): a commit may move an offset, or must be made
        again, though no message settled since the last one."""
        wanted = getattr(self.source, "commit_wanted", None)
        return bool(wanted()) if callable(wanted) else False

    def _commit(self, now: float, *, force: bool) -> None:
        self._revocations()
        self.source.commit(self.dispatcher, force=force)
        self.summary.commits += 1
        self._since_commit = 0
        self._last_commit = now

    def _drain(self) -> None:
        """No new work; what is in flight finishes (until the deadline) and is settled; commit."""
        deadline = self.clock() + self.drain_timeout
        if self._inflight:
            log.info("draining: %d messages in flight, up to %.1f s", len(self._inflight), self.drain_timeout)
        while self._inflight or self._dead_pending:
            now = self.clock()
            if now >= deadline:
                break
            try:
                item = self._results.get(timeout=min(0.5, deadline - now))
            except queue.Empty:
                self._collect([])
                continue
            self._collect([item])
        self.summary.unfinished = len(self._inflight)
        self.summary.drained = not self._inflight
        if self._inflight:
            log.warning(
                "drain deadline passed with %d messages in flight: left unsettled (handled again after a restart)",
                len(self._inflight),
            )
        self._revocations()
        try:
            self._commit(self.clock(), force=True)
        finally:
            self.carrier.shutdown(0.0 if self._inflight else 5.0)

    def _answer(self, req: _Request) -> None:
        if req.kind == "snapshot":
            req.answer = self.dispatcher.groups()
        elif req.kind == "release":
            req.answer = self.dispatcher.release(req.arg)
        req.ready.set()

    def _answer_pending(self) -> None:
        try:
            while True:
                item = self._results.get_nowait()
                if isinstance(item, _Request):
                    self._answer(item)
        except queue.Empty:
            pass


def describe(work: Work) -> str:
    """One line naming a message: its group and sequence number, ticket, attempt."""
    m = work.message
    gid = getattr(m, "group_id", None)
    seq = getattr(m, "msg_seq_number", None)
    name = f"GroupId {bytes(gid).hex()}" if isinstance(gid, bytes | bytearray) else f"group {work.group!r}"
    if seq is not None:
        name += f" seq {seq}"
    return f"{name} (ticket {work.ticket}, attempt {work.attempt})"


@contextmanager
def stop_on_signals(runner: Runner, signals: Sequence[int] = (signal.SIGTERM, signal.SIGINT)) -> Iterator[None]:
    """SIGTERM (and SIGINT) drain the runner instead of killing the process; the handlers before are
    put back on exit. Call from the main thread (Python delivers signals there).

    ``runner``: the runner to stop (:meth:`Runner.stop`). ``signals``: the signals that stop it.
    """
    before = {s: signal.getsignal(s) for s in signals}

    def handler(signum: int, frame: Any) -> None:
        log.info("signal %d: draining", signum)
        runner.stop()

    for s in signals:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in before.items():
            signal.signal(s, h)
