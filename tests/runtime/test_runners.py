"""The runners over an IterableSource: exactly once, in order, one handler per group, retries, dead
letters, AfterDead, the budget, draining and fencing; the same checks for threads and asyncio."""

from __future__ import annotations

import asyncio
import functools
import random
import threading
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reassembly.assembler import MessageComplete
from reassembly.dispatcher import AfterDead, Budget, Dispatcher, Outcome, RetryPolicy, Work
from reassembly.runtime import (
    AsyncRunner,
    IterableSource,
    Offered,
    ParquetDeadLetter,
    Runner,
    ThreadRunner,
    read_dead_letters,
)
from tests.runtime.support import check_log, interleaved, message, name, recording

FAST = RetryPolicy(max_attempts=3, base=0.001, cap=0.002, jitter=0.5)
SIZES = [7, 1, 3, 12, 1, 1, 5, 2, 9, 4, 1, 6]


def make_runner(kind: str, source: Any, handler: Callable[[Any], object], **kw: Any) -> Runner:
    if kind == "threads":
        return ThreadRunner(source, handler, **kw)

    async def async_handler(m: Any) -> None:
        await asyncio.to_thread(handler, m)  # the recording handler is synchronous; sleeping off-loop

    return AsyncRunner(source, async_handler, **kw)


KINDS = ["threads", "asyncio"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_message_once_in_order_one_handler_per_group(kind: str, tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    msgs = interleaved(SIZES)
    source = IterableSource(msgs, batch=8)
    runner = make_runner(kind, source, functools.partial(recording, log, sleep=0.001), workers=6)
    summary = runner.run()
    check_log(log, [name(m) for m in msgs])
    assert (summary.done, summary.dead, summary.offered, summary.unfinished) == (len(msgs), 0, len(msgs), 0)
    assert source.settled_count[Outcome.DONE] == len(msgs)
    assert runner.dispatcher.held_messages() == 0


class CheckedSource(IterableSource):
    """Checks every commit against the messages not yet settled: never at or past one's first segment."""

    def __init__(self, items: Sequence[object], **kw: Any) -> None:
        super().__init__(items, **kw)
        self.unsettled: dict[int, tuple[tuple[Hashable, int], ...]] = {}
        self.violations: list[str] = []

    def fetch(self, timeout: float) -> Sequence[Offered]:
        out = super().fetch(timeout)
        for o in out:
            assert isinstance(o.message, MessageComplete)
            self.unsettled[id(o.message)] = tuple((p, int(x)) for p, x in o.message.positions)
        return out

    def settled(self, work: Work, outcome: Outcome) -> None:
        super().settled(work, outcome)
        del self.unsettled[id(work.message)]

    def commit(self, dispatcher: Dispatcher, force: bool = False) -> None:
        super().commit(dispatcher, force)
        for p, offset in self.commits[-1].items():
            low = min((x for pos in self.unsettled.values() for q, x in pos if q == p), default=None)
            if offset is not None and low is not None and offset > low:
                self.violations.append(f"{p}: committed {offset} past unsettled {low}")


def test_commits_stay_below_unsettled_and_reach_the_end(tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    msgs = interleaved(SIZES, partitions=("a", "b", "c"))
    source = CheckedSource(msgs, batch=4)
    poison = frozenset({(3, 4), (8, 2)})
    dl = ParquetDeadLetter(tmp_path / "dead")
    runner = ThreadRunner(source, functools.partial(recording, log, sleep=0.0005, poison=poison), workers=4,
                          retry=FAST, dead_letter=dl, commit_every=3)  # fmt: skip
    summary = runner.run()
    assert source.violations == []
    assert summary.commits > 3
    ends = {p: 1 + max(m.positions[0].position for m in msgs if m.positions[0].partition == p) for p in "abc"}
    # Nothing unsettled: the floor is gone, the dispatcher allows whatever the assembler allows (None: no limit).
    assert all(source.commits[-1][p] in (None, ends[p]) for p in "abc")
    check_log(log, [name(m) for m in msgs], poison, attempts=3)


@pytest.mark.parametrize("kind", KINDS)
def test_retries_then_dead_letter(kind: str, tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    msgs = interleaved(SIZES, size=300)
    poison = frozenset({(0, 3), (3, 1), (8, 9)})
    dl = ParquetDeadLetter(tmp_path / "dead")
    runner = make_runner(kind, IterableSource(msgs), functools.partial(recording, log, poison=poison), workers=4,
                         retry=FAST, dead_letter=dl)  # fmt: skip
    summary = runner.run()
    assert (summary.dead, summary.done, summary.retries) == (3, len(msgs) - 3, 3 * 2)
    check_log(log, [name(m) for m in msgs], poison, attempts=3)
    rows = read_dead_letters(tmp_path / "dead")
    assert sorted((int.from_bytes(r["group_id"], "big"), r["msg_seq_number"]) for r in rows) == sorted(poison)
    by = {m.group_id: m for m in msgs if name(m) in poison}
    for r in rows:
        m = by[r["group_id"]]
        assert r["payload"] == m.payload and r["attempts"] == 3 and r["error_type"] == "ValueError"
        assert r["reason"].startswith("ValueError: poison") and r["positions"] == f'[["p",{m.positions[0].position}]]'
    assert not list((tmp_path / "dead").glob(".*")), "no temporary file left behind"


@pytest.mark.parametrize("after", [AfterDead.CONTINUE, AfterDead.HOLD])
def test_after_dead(after: AfterDead, tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    msgs = [message(1, s, last=s == 5, offset=s - 1) for s in range(1, 6)] + [message(2, 1, last=True, offset=5)]
    source = IterableSource(msgs)
    runner = ThreadRunner(source, functools.partial(recording, log, poison=frozenset({(1, 2)})), workers=2,
                          retry=RetryPolicy(max_attempts=1), dead_letter=ParquetDeadLetter(tmp_path / "d"),
                          after_dead=after)  # fmt: skip
    summary = runner.run()
    handled = sorted(name(m) for m in msgs if name(m) != (1, 2))
    if after is AfterDead.CONTINUE:
        check_log(log, handled, [(1, 2)])
        assert runner.snapshot() == []
    else:
        check_log(log, [(1, 1), (2, 1)], [(1, 2)])
        held = runner.snapshot()
        assert [(g.queued, g.owner, g.acquired, g.on_hold) for g in held] == [(3, None, 0, True)]
        assert source.commits[-1]["p"] == 2, "the commit waits below the held messages"
        assert runner.release(held[0].group) == 3
    assert summary.dead == 1


class PausingSource(IterableSource):
    """Counts pauses (IterableSource does) and signals the first."""

    def __init__(self, items: Sequence[object]) -> None:
        super().__init__(items, batch=1)
        self.paused_once = threading.Event()

    def pause(self) -> None:
        super().pause()
        self.paused_once.set()


def test_budget_pauses_and_bounds_what_is_held(tmp_path: Path) -> None:
    msgs = interleaved([1] * 300, size=1000)
    source = PausingSource(msgs)
    budget = Budget(max_messages=10_000, max_bytes=20_000)

    def slow(m: Any) -> None:
        assert source.paused_once.wait(30)  # held until the budget stops the fetching

    runner = ThreadRunner(source, slow, workers=2, budget=budget, prefetch=1)
    summary = runner.run()
    assert summary.done == 300
    assert source.pauses >= 2 and source.resumes >= 2
    assert summary.pauses == source.pauses and summary.resumes == source.resumes
    assert summary.peak_held_bytes <= 20_000 + 1000, "held bytes within the budget plus one message"


class AssemblingSource(PausingSource):
    """One segment per fetch, as a log consumer reads records: a message is offered when its last
    part arrives; until then its parts are held as segments in assembly (``held_bytes``)."""

    def __init__(self, records: Sequence[tuple[MessageComplete, int, bool]]) -> None:
        super().__init__([])
        self.records = iter(records)
        self.assembling = 0
        self.peak_assembling = 0
        self.runner: Runner | None = None
        self.peak_held = 0  # segments in assembly and the runner's messages, after every fetch

    def fetch(self, timeout: float) -> Sequence[Offered]:
        if self.paused or self.exhausted:
            return []
        record = next(self.records, None)
        if record is None:
            self.exhausted = True
            return []
        msg, part, last = record
        self.assembling += part
        self.peak_assembling = max(self.peak_assembling, self.assembling)
        if self.runner is not None:
            self.peak_held = max(self.peak_held, self.assembling + self.runner.dispatcher.held_bytes())
        if not last:
            return []
        self.assembling -= len(msg.payload)
        return [Offered(msg)]

    def held_bytes(self) -> int:
        return self.assembling


def records(msgs: Sequence[MessageComplete], parts: int) -> list[tuple[MessageComplete, int, bool]]:
    """Each message as ``parts`` records, the records of ``len(msgs)`` messages interleaved."""
    out = []
    for i in range(parts):
        for m in msgs:
            out.append((m, len(m.payload) // parts, i == parts - 1))
    return out


def test_every_fetch_counts_segments_in_assembly_against_the_budget() -> None:
    """Three messages' segments interleaved: two of three fetches complete nothing, yet the
    held bytes never pass the budget by more than one record."""
    msgs = [m for i in range(0, 120, 3) for m in interleaved([1, 1, 1], size=1200, first=i)]
    recs = [r for k in range(0, len(msgs), 3) for r in records(msgs[k : k + 3], 3)]
    source = AssemblingSource(recs)
    runner = ThreadRunner(source, lambda m: source.paused_once.wait(30), workers=2,
                          budget=Budget(max_messages=10_000, max_bytes=20_000))  # fmt: skip
    source.runner = runner
    summary = runner.run()
    assert summary.done == 120 and summary.pauses >= 1
    print("PEAK", source.peak_held, summary.peak_held_bytes)
    assert 20_000 <= source.peak_held <= 20_000 + 400, "held bytes within the budget plus one record"
    assert summary.peak_held_bytes == source.peak_held


def test_segments_in_assembly_alone_over_the_budget_do_not_stall_the_consumer() -> None:
    """Every message's first part before any second part: the segments in assembly pass the
    budget with no message held; a pause then could never end, so none is taken until messages
    are held, and every message is handled."""
    msgs = interleaved([1] * 60, size=1000)
    source = AssemblingSource(records(msgs, 2))
    runner = ThreadRunner(source, lambda m: None, workers=2, budget=Budget(max_messages=10_000, max_bytes=20_000))
    summary = runner.run()
    assert source.peak_assembling >= 60 * 500 > 20_000
    assert summary.done == 60


@pytest.mark.parametrize("kind", KINDS)
def test_stop_drains_in_flight_work(kind: str, tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    msgs = interleaved([3] * 20)
    started = threading.Semaphore(0)
    go = threading.Event()

    def blocking(m: Any) -> None:
        recording(log, m)
        started.release()
        assert go.wait(30)

    runner = make_runner(kind, IterableSource(msgs), blocking, workers=4, prefetch=1)
    result: list[Any] = []
    t = threading.Thread(target=lambda: result.append(runner.run()))
    t.start()
    for _ in range(4):
        assert started.acquire(timeout=30)
    runner.stop()
    go.set()
    t.join(30)
    summary = result[0]
    assert (summary.done, summary.unfinished, summary.drained) == (4, 0, True)
    assert summary.offered > 4, "fetched ahead, not handed out after the stop"


def test_drain_deadline_leaves_work_unsettled(tmp_path: Path) -> None:
    msgs = interleaved([2] * 4, partitions=("p",))
    started = threading.Semaphore(0)
    go = threading.Event()

    def stuck(m: Any) -> None:
        started.release()
        go.wait(30)

    source = IterableSource(msgs)
    runner = ThreadRunner(source, stuck, workers=2, prefetch=1, drain_timeout=0.2)
    result: list[Any] = []
    t = threading.Thread(target=lambda: result.append(runner.run()))
    t.start()
    for _ in range(2):
        assert started.acquire(timeout=30)
    runner.stop()
    t.join(30)
    go.set()
    summary = result[0]
    assert (summary.done, summary.unfinished, summary.drained) == (0, 2, False)
    assert source.commits[-1]["p"] == 0, "nothing committed past the unfinished messages"


class RevokingSource(IterableSource):
    """Signals when the loop has taken a revocation."""

    def __init__(self, items: Sequence[object]) -> None:
        super().__init__(items)
        self.taken = threading.Event()

    def revoked(self) -> list[Hashable]:
        out = super().revoked()
        if out:
            self.taken.set()
        return out


def test_result_of_a_revoked_partition_is_fenced() -> None:
    msgs = [message(1, 1, partition="a", last=True), message(2, 1, partition="b", last=True)]
    source = RevokingSource(msgs)
    in_a = threading.Event()
    go = threading.Event()

    def handler(m: Any) -> None:
        if m.positions[0].partition == "a":
            in_a.set()
            assert go.wait(30)

    runner = ThreadRunner(source, handler, workers=2)
    result: list[Any] = []
    t = threading.Thread(target=lambda: result.append(runner.run()))
    t.start()
    assert in_a.wait(30)
    source.revoke("a")
    assert source.taken.wait(30)
    go.set()
    t.join(30)
    summary = result[0]
    assert (summary.fenced, summary.done, summary.revoked_partitions) == (1, 1, 1)
    assert source.settled_count[Outcome.DONE] == 1, "a fenced result settles nothing at the source"


def test_snapshot_from_another_thread_while_running() -> None:
    msgs = interleaved([2, 2, 2])
    inside = threading.Event()
    go = threading.Event()

    def handler(m: Any) -> None:
        inside.set()
        assert go.wait(30)

    runner = ThreadRunner(IterableSource(msgs), handler, workers=1, prefetch=1)
    t = threading.Thread(target=runner.run)
    t.start()
    assert inside.wait(30)
    views = runner.snapshot()
    go.set()
    t.join(30)
    assert sum(v.acquired for v in views) == 1 and sum(v.queued for v in views) == 5
    assert [v.owner for v in views if v.acquired] == [0]


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=12),
    failures=st.lists(st.integers(0, 3), min_size=72, max_size=72),
    workers=st.integers(1, 5),
    after=st.sampled_from(AfterDead),
)
def test_random_failures_keep_the_invariants(
    sizes: list[int], failures: list[int], workers: int, after: AfterDead
) -> None:
    msgs = interleaved(sizes)
    fails_left = {name(m): failures[i] for i, m in enumerate(msgs)}  # failures before a success
    lock = threading.Lock()
    active: set[int] = set()
    calls: list[tuple[int, int, bool]] = []
    overlaps: list[int] = []

    def handler(m: Any) -> None:
        g, s = name(m)
        with lock:
            if g in active:
                overlaps.append(g)
            active.add(g)
        try:
            if random.random() < 0.3:
                threading.Event().wait(0.0001)  # a little work, so workers really overlap
            with lock:
                fail = fails_left[(g, s)] > 0
                fails_left[(g, s)] -= 1
                calls.append((g, s, not fail))
            if fail:
                raise RuntimeError("flaky")
        finally:
            with lock:
                active.discard(g)

    dead: list[tuple[int, int]] = []

    class Collect:
        def write(self, records: Sequence[Any]) -> None:
            dead.extend(name(r.work.message) for r in records)

        def close(self) -> None:
            pass

    retry = RetryPolicy(max_attempts=3, base=0.0, cap=0.0)
    runner = ThreadRunner(IterableSource(msgs, batch=5), handler, workers=workers, retry=retry,
                          dead_letter=Collect(), after_dead=after)  # fmt: skip
    summary = runner.run()
    assert overlaps == []
    expected_dead = {name(m) for i, m in enumerate(msgs) if failures[i] >= 3}
    if after is AfterDead.HOLD:  # later messages of a group with a dead one are never handed out
        first_dead = {}
        for g, s in sorted(expected_dead):
            first_dead.setdefault(g, s)
        expected_dead = {(g, s) for g, s in expected_dead if s == first_dead[g]}
        reached = {name(m) for m in msgs if name(m)[1] <= first_dead.get(name(m)[0], 10**9)}
    else:
        reached = {name(m) for m in msgs}
    assert sorted(dead) == sorted(expected_dead)
    ok = [(g, s) for g, s, good in calls if good]
    assert sorted(ok) == sorted(reached - expected_dead), "each handled ok exactly once"
    per_group: dict[int, list[int]] = {}
    for g, s, _good in calls:
        per_group.setdefault(g, []).append(s)
    assert all(seq == sorted(seq) for seq in per_group.values()), "attempts in group order"
    assert summary.done == len(ok) and summary.dead == len(expected_dead)


def test_sigterm_drains_a_runner_process() -> None:
    import signal
    import subprocess
    import sys

    root = Path(__file__).parents[2]
    proc = subprocess.Popen([sys.executable, "-m", "tests.runtime.sigterm_proc"], cwd=root, stdout=subprocess.PIPE,
                            text=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "started"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0
    _, done, unfinished, drained, started = out.split()
    assert (unfinished, drained) == ("0", "True")
    assert int(done) == int(started) < 200, "what had started finished; nothing new was handed out"
