"""Resequencer throughput and memory (the goal: >= 1 million small messages/s, 1,000 open groups, one core).

    python -m bench.reseqbench [--messages 2000000] [--groups 1000] [--runs 5]

Cases, each over the same pre-built arrival list (building it is not timed):
``in_order`` (round-robin over the groups, each group's numbers in order;
``_no_end``: with ``end=None`` instead of ``EndAuto``, so no clock reading per message),
``swapped_10pct`` (one message in ten arrives after its successor: held,
then released by it) and ``window_64`` (each group's numbers shuffled in
windows of 64: the held dict works all the time). ``offer`` is called once per
message and every returned event list is consumed (counted), as a caller
would. Rates are per CPU second of this process (``time.process_time``: what
one core does, also on a machine other processes load) and per wall second.
``floor``: the same loop calling a function that only builds one
tuple in a list (the least any Python ``offer`` API costs): on a loaded
machine, read the ratio to it. Memory: ``tracemalloc`` over holding ``--hold`` messages (numbers
1.. with 0 never arriving), divided by the count: what one waiting message
costs beyond its item (a shared ``bytes`` object here).
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from reassembly.resequencer import Resequencer
from reassembly.resequencer.model import EndAuto, ResequenceOptions, StartAt

ITEM = b"small message"


def arrivals(case: str, messages: int, groups: int, seed: int = 1) -> list[tuple[int, int]]:
    per = messages // groups
    rng = random.Random(seed)
    seqs = list(range(per))
    orders: list[list[int]] = []
    for _ in range(groups):
        s = seqs[:]
        if case == "swapped_10pct":
            for i in range(0, per - 1, 10):
                s[i], s[i + 1] = s[i + 1], s[i]
        elif case == "window_64":
            for i in range(0, per, 64):
                window = s[i : i + 64]
                rng.shuffle(window)
                s[i : i + 64] = window
        orders.append(s)
    return [(g, orders[g][i]) for i in range(per) for g in range(groups)]


def base(case: str) -> str:
    """The arrival pattern a case name stands for."""
    return case.removeprefix("batch_").removesuffix("_no_end")


def options(case: str) -> ResequenceOptions:
    """Automatic end (the default mode: one clock reading per message for the idle timer), or none."""
    end = None if case.endswith("no_end") else EndAuto(idle=3600.0)
    return ResequenceOptions(start=StartAt(0), end=end, missing_timeout=60.0)


def floor(group: int, seq: int, item: bytes) -> list[tuple[int, int, bytes]]:
    """The least any Python ``offer`` can do: one call, one tuple, one list."""
    return [(group, seq, item)]


def timed(feed: list[tuple[int, int]], offer: Callable[[int, int, bytes], list[Any]]) -> tuple[float, float]:
    """CPU and wall seconds to call ``offer`` once per arrival, consuming every event list (gc off)."""
    n_events = 0
    gc.disable()
    cpu, wall = time.process_time(), time.perf_counter()
    for group, seq in feed:
        n_events += len(offer(group, seq, ITEM))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    gc.enable()
    assert n_events == len(feed)  # one event per message: nothing is lost, nothing is left held
    return cpu, wall


Batch = list[tuple[int, int, bytes]]


def timed_batches(batches: list[Batch], offer_many: Callable[[Batch], list[Any]]) -> tuple[float, float]:
    """CPU and wall seconds to hand over every batch, consuming every event list (gc off)."""
    n_events = 0
    gc.disable()
    cpu, wall = time.process_time(), time.perf_counter()
    for batch in batches:
        n_events += len(offer_many(batch))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    gc.enable()
    assert n_events == sum(map(len, batches))
    return cpu, wall


def floor_many(batch: Batch) -> Batch:
    """The least any Python batch entry point can do: a loop building one tuple per message."""
    out = []
    add = out.append
    for group, seq, item in batch:
        add((group, seq, item))
    return out


def run_once(feed: list[tuple[int, int]], case: str, batch: int) -> tuple[float, float]:
    r = Resequencer(options(case), clock=time.monotonic)
    if case.startswith("batch_"):
        batches = [[(g, s, ITEM) for g, s in feed[i : i + batch]] for i in range(0, len(feed), batch)]
        elapsed = timed_batches(batches, r.offer_many)  # building the batches (the consumer's work) is not timed
    else:
        elapsed = timed(feed, r.offer)
    assert r.held_messages == 0 and r.open_groups == len({g for g, _ in feed[:10_000]})
    return elapsed


def memory_per_waiting(hold: int, groups: int) -> float:
    r = Resequencer(options("memory"), clock=time.monotonic)
    per = hold // groups
    for g in range(groups):  # open the groups first: their own cost is not a waiting message's
        r.offer(g, 0, ITEM)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for g in range(groups):
        for seq in range(2, per + 2):  # 1 never arrives: everything waits
            r.offer(g, seq, ITEM)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert r.held_messages == per * groups
    return (after - before) / (per * groups)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=2_000_000)
    p.add_argument("--groups", type=int, default=1000)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--hold", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=1000, help="messages per offer_many call (a consumer's poll)")
    a = p.parse_args(argv)
    print(
        f"Python {sys.version.split()[0]}; {a.messages:,} messages over {a.groups:,} open groups; "
        f"{a.runs} runs; offer_many batches of {a.batch:,}"
    )
    cases = ("in_order", "in_order_no_end", "swapped_10pct", "window_64")
    cases += tuple(f"batch_{c}" for c in cases)
    patterns = {p: arrivals(p, a.messages, a.groups) for p in {base(c) for c in cases}}
    feeds = {c: patterns[base(c)] for c in cases}
    results: dict[str, list[tuple[float, float]]] = {c: [] for c in ("floor", "floor_batch", *feeds)}
    in_order = [[(g, s, ITEM) for g, s in feeds["in_order"][i : i + a.batch]] for i in range(0, a.messages, a.batch)]
    for _ in range(a.runs):  # interleaved: a load spike hits every case alike
        results["floor"].append(timed(feeds["in_order"], floor))
        results["floor_batch"].append(timed_batches(in_order, floor_many))
        for case, feed in feeds.items():
            results[case].append(run_once(feed, case, a.batch))
    n = len(feeds["in_order"])
    floor_best = n / min(cpu for cpu, _ in results["floor"])
    print("| case | msg per CPU second: median | best | best / floor's | wall clock msg/s: median | best |")
    print("|---|---:|---:|---:|---:|---:|")
    for case, times in results.items():
        cpu = [n / c for c, _ in times]
        wall = [n / w for _, w in times]
        print(
            f"| {case} | {statistics.median(cpu):,.0f} | {max(cpu):,.0f} | {max(cpu) / floor_best:.2f} "
            f"| {statistics.median(wall):,.0f} | {max(wall):,.0f} |"
        )
    per = memory_per_waiting(a.hold, a.groups)
    print(f"memory per waiting message: {per:.0f} bytes ({a.hold:,} held in {a.groups:,} groups, item shared)")


if __name__ == "__main__":
    main()
