"""Whole messages in parallel: the group dispatcher's runners against the sequential Kafka loop and the ideal.

``python -m bench.dispatch --rounds 3 --json FILE`` (``--quick``: a harness check in under 20 s;
``--table FILE``: the table of a results file).

Data: messages in MQ logical groups whose sizes follow a Zipf distribution (``--zipf`` exponent,
capped at ``--max-group``; key ordering over all-distinct keys would measure nothing), each
message ``--segments`` segments of exactly ``--segment-kib`` KiB (1 and 64), produced once per
segment size by :class:`~segmenter.brokers.KafkaSegmentProducer` into a topic of a librdkafka mock
cluster held by its own process (:mod:`bench.mockkafka`), spread over enough partitions that none
passes the mock's 5 MiB per partition. Every case then reads that topic from the start in a fresh
process, with a consumer group of its own.

Cases, for each handler work (``0``: nothing; ``sleep``: 1 ms of ``time.sleep``, I/O-like;
``cpu``: 1 ms of CPU in a busy loop):

* ``sequential``: :class:`~reassembly.brokers.kafka.KafkaReassembler` with the handler as its
  ``on_message``: the loop of a consumer without the dispatcher;
* ``threads``: :class:`~reassembly.runtime.ThreadRunner` over
  :class:`~reassembly.brokers.kafka_dispatch.KafkaDispatchSource`, ``Ordering.GROUP``, for each
  ``--workers`` count;
* ``processes`` (``cpu`` only): :class:`~reassembly.runtime.ProcessRunner`, the same.

Both read with an assembler delivering each message of a group (``unit_of_work=False``). A case
runs until every message is handled or ``--seconds`` after its first message, whichever is first;
its rate is the messages handled over the time from the first whole message to then. The ideal is
``workers / 1 ms`` for ``sleep``, ``min(workers, cores) / 1 ms`` for ``cpu``.

Rounds are interleaved (round r starts with the r-th case), ``--warmup-rounds`` whole rounds run
first and are not counted; the table gives medians over the rounds and the medians of the
per-round ratios: ``threads`` at 0 ms over ``sequential`` at 0 ms (goal >= 0.7), ``threads`` at
1 ms of sleep with the most workers over min(ideal, ``sequential`` at 0 ms) (goal >= 0.8), and
``processes`` at 1 ms of CPU over ``sequential`` at 1 ms of CPU; with each runner's peak held
bytes (what the budget counts: segments in assembly, messages waiting and in flight) against the
budget (``--budget-mib``, ``--budget-messages``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
KiB, MiB = 1 << 10, 1 << 20
RESULT = "RESULT "
WORKS = ("0", "sleep", "cpu")
PARTITION_BYTES = 4 * MiB  # below the mock's 5 MiB per partition
CONSUMER = {"enable.auto.commit": False, "auto.offset.reset": "earliest", "fetch.wait.max.ms": 10}


# ---------------------------------------------------------------- handlers (top level: the processes import them)


def work_0(m: Any) -> None:
    """No work: what the runner itself costs."""


def work_sleep(m: Any) -> None:
    """1 ms of waiting, as a database write or a service call."""
    time.sleep(0.001)


def work_cpu(m: Any) -> None:
    """1 ms of this thread's CPU."""
    end = time.thread_time() + 0.001
    while time.thread_time() < end:
        pass


HANDLERS = {"0": work_0, "sleep": work_sleep, "cpu": work_cpu}


# ---------------------------------------------------------------- data


def group_sizes(messages: int, exponent: float, cap: int, seed: int) -> list[int]:
    """Zipf-distributed group sizes (capped) summing to ``messages``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    sizes: list[int] = []
    total = 0
    while total < messages:
        n = int(min(cap, rng.zipf(exponent), messages - total))
        sizes.append(n)
        total += n
    return sizes


def produce(bootstrap: str, topic: str, sizes: list[int], segment: int, segments: int, partitions: int) -> int:
    """Every group with ``send_group``, groups spread over the partitions in turn; bytes produced."""
    from segmenter.brokers.kafka import KafkaSegmentProducer
    from segmenter.wire import HEADER_LENGTH

    payload_len = segments * (segment - HEADER_LENGTH)
    producer = KafkaSegmentProducer(
        topic, {"bootstrap.servers": bootstrap, "linger.ms": 5}, max_record_bytes=segment + 1024,
        max_segment_size=segment,
    )  # fmt: skip
    sent = 0
    try:
        for i, n in enumerate(sizes):
            payloads = [os.urandom(16) * (payload_len // 16) for _ in range(n)]
            producer.send_group(payloads, partition=i % partitions)
            sent += n * segments * segment
            if i % 200 == 0:
                producer.poll(0)
        producer.flush(120)
    finally:
        producer.close()
    return sent


# ---------------------------------------------------------------- one case, in its own process


def child(argv: list[str]) -> int:
    """``python -m bench.dispatch child ...``: one timed case, one RESULT line."""
    p = argparse.ArgumentParser(prog="python -m bench.dispatch child")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--messages", type=int, required=True)
    p.add_argument("--case", required=True, choices=("sequential", "threads", "processes"))
    p.add_argument("--work", required=True, choices=WORKS)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--budget-mib", type=float, default=64.0)
    p.add_argument("--budget-messages", type=int, default=5000)
    p.add_argument("--prefetch", type=int, default=None)
    a = p.parse_args(argv)
    from reassembly.assembler import Assembler

    config = {"bootstrap.servers": a.bootstrap, "group.id": f"bench-{uuid.uuid4().hex}", **CONSUMER}
    handler = HANDLERS[a.work]
    cpu0 = time.process_time()
    if a.case == "sequential":
        rec = _sequential(config, a, Assembler(unit_of_work=False), handler)
    else:
        rec = _runner(config, a, Assembler(unit_of_work=False), handler)
    rec["cpu_seconds"] = time.process_time() - cpu0
    rec["max_rss_bytes"] = _peak_rss()
    print(RESULT + json.dumps(rec), flush=True)
    return 0


def _peak_rss() -> int | None:
    """This process's peak resident set (VmHWM: ru_maxrss would carry the parent's peak across exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * KiB
    return None


def _sequential(config: dict[str, Any], a: argparse.Namespace, asm: Any, handler: Any) -> dict[str, Any]:
    from reassembly.brokers.kafka import KafkaReassembler

    state = {"count": 0, "first": 0.0, "cpu": 0.0}

    def on_message(m: Any) -> None:
        if not state["count"]:
            state["first"] = time.monotonic()
            state["cpu"] = time.process_time()
        handler(m)
        state["count"] += 1

    loop = KafkaReassembler(config, [a.topic], assembler=asm, on_message=on_message, batch=500)
    peak = 0
    join_deadline = time.monotonic() + 60
    try:
        while state["count"] < a.messages:
            loop.poll(0.05)
            peak = max(peak, asm.buffered_bytes)
            now = time.monotonic()
            if (state["count"] and now - state["first"] >= a.seconds) or now > join_deadline:
                break
        end, cpu = time.monotonic(), time.process_time()
    finally:
        loop.close()
    n = int(state["count"])
    seconds = end - state["first"] if n else None
    return {"handled": n, "seconds": seconds, "rate": n / seconds if seconds else None, "peak_held_bytes": peak,
            "window_cpu_seconds": cpu - state["cpu"] if n else None}  # fmt: skip


def _runner(config: dict[str, Any], a: argparse.Namespace, asm: Any, handler: Any) -> dict[str, Any]:
    from reassembly.brokers.kafka_dispatch import KafkaDispatchSource
    from reassembly.dispatcher import Budget, Ordering
    from reassembly.runtime import ProcessRunner, ThreadRunner

    first: list[float] = []

    class Timed(KafkaDispatchSource):
        def fetch(self, timeout: float) -> Any:
            out = super().fetch(timeout)
            if out and not first:
                first.append(time.monotonic())
                first.append(time.process_time())
            return out

    budget = Budget(a.budget_messages, int(a.budget_mib * MiB))
    source = Timed(config, [a.topic], assembler=asm, batch=500, budget_bytes=budget.max_bytes)
    kind = ThreadRunner if a.case == "threads" else ProcessRunner
    extra = {} if a.prefetch is None else {"prefetch": a.prefetch}
    runner = kind(source, handler, workers=a.workers, ordering=Ordering.GROUP, budget=budget, **extra)
    join_deadline = time.monotonic() + 60
    ended: list[tuple[float, int]] = []

    def stop() -> bool:
        now = time.monotonic()
        done = runner.summary.done
        if done >= a.messages or (first and now - first[0] >= a.seconds) or now > join_deadline:
            ended.append((now, done, time.process_time()))
            return True
        return False

    try:
        summary = runner.run(stop=stop)
    finally:
        source.close()
    end, n, cpu = ended[0] if ended else (time.monotonic(), runner.summary.done, time.process_time())
    seconds = end - first[0] if first else None
    return {
        "handled": n,
        "window_cpu_seconds": cpu - first[1] if first else None,
        "seconds": seconds,
        "rate": n / seconds if seconds else None,
        "peak_held_bytes": summary.peak_held_bytes,
        "peak_held_messages": summary.peak_held_messages,
        "budget_bytes": budget.max_bytes,
        "budget_messages": budget.max_messages,
        "pauses": summary.pauses,
    }


# ---------------------------------------------------------------- the parent


def run_case(cmd_args: list[str]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.dispatch", "child", *cmd_args]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE.parent, check=False, timeout=300)
    line = next((x for x in proc.stdout.splitlines() if x.startswith(RESULT)), None)
    if line is None:
        return {"rate": None, "error": f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}"}
    return dict(json.loads(line[len(RESULT) :]))


def cases(works: list[str], workers: list[int]) -> list[tuple[str, str, int]]:
    """(case, work, workers) of one segment size, in a fixed order."""
    out: list[tuple[str, str, int]] = []
    for w in works:
        out.append(("sequential", w, 1))
        out += [("threads", w, n) for n in workers]
        if w == "cpu":
            out += [("processes", w, n) for n in workers if n <= 8]
    return out


def schedule(items: list[Any], rounds: int, warmup_rounds: int) -> Iterator[tuple[int, Any]]:
    """(round, item), round r starting with the r-th item; warm-up rounds numbered 0, -1, ..."""
    for r in range(1 - warmup_rounds, rounds + 1):
        turn = (r - 1) % len(items)
        for item in items[turn:] + items[:turn]:
            yield r, item


def _median(xs: Iterable[float | None]) -> float | None:
    got = [x for x in xs if x is not None]
    return statistics.median(got) if got else None


def ideal(work: str, workers: int, cores: int) -> float | None:
    if work == "sleep":
        return workers / 0.001
    if work == "cpu":
        return min(workers, cores) / 0.001
    return None


def summarize(runs: list[dict[str, Any]], cores: int) -> list[dict[str, Any]]:
    """One row per (segment, case, work, workers): medians, and the medians of the per-round ratios
    to the sequential loop with the same work and to min(ideal, the sequential loop at 0 ms)."""
    rate = {(r["segment"], r["case"], r["work"], r["workers"], r["round"]): r.get("rate") for r in runs}
    keys = sorted({(r["segment"], r["case"], r["work"], r["workers"]) for r in runs},
                  key=lambda k: (k[0], WORKS.index(k[2]), k[1] != "sequential", k[1], k[3]))  # fmt: skip
    rounds = sorted({r["round"] for r in runs})
    out = []
    for seg, case, work, n in keys:
        rs = [r for r in runs if (r["segment"], r["case"], r["work"], r["workers"]) == (seg, case, work, n)]
        vs_seq, vs_bound = [], []
        for rd in rounds:
            mine = rate.get((seg, case, work, n, rd))
            seq = rate.get((seg, "sequential", work, 1, rd))
            seq0 = rate.get((seg, "sequential", "0", 1, rd))
            if mine and seq:
                vs_seq.append(mine / seq)
            best = ideal(work, n, cores)
            if mine and seq0 and best:
                vs_bound.append(mine / min(best, seq0))
        out.append(
            {
                "segment": seg,
                "case": case,
                "work": work,
                "workers": n,
                "rate": _median(r.get("rate") for r in rs),
                "min": min((r["rate"] for r in rs if r.get("rate")), default=None),
                "max": max((r["rate"] for r in rs if r.get("rate")), default=None),
                "ideal": ideal(work, n, cores),
                "vs_sequential": statistics.median(vs_seq) if vs_seq else None,
                "vs_bound": statistics.median(vs_bound) if vs_bound else None,
                "peak_held_bytes": max((r.get("peak_held_bytes") or 0 for r in rs), default=0),
                "budget_bytes": rs[0].get("budget_bytes"),
                "max_rss_bytes": _median(r.get("max_rss_bytes") for r in rs),
                "cpu_seconds": _median(r.get("cpu_seconds") for r in rs),
                # the process's CPU (every thread) per message handled, inside the timed window: what
                # a loaded machine changes least
                "cpu_us_per_message": _median(
                    1e6 * r["window_cpu_seconds"] / r["handled"]
                    for r in rs
                    if r.get("window_cpu_seconds") and r.get("handled")
                ),
                "error": next((r["error"] for r in rs if r.get("error")), None),
            }
        )
    return out


def _k(v: float | None) -> str:
    return "-" if v is None else f"{v / 1000:.1f}k"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _us(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def _mib(v: float | None) -> str:
    return "-" if not v else f"{v / MiB:.1f}"


def table(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        f"{m['date']}, {m['cpu']}, {m['cores']} cores, Python {m['python']}; "
        f"{', '.join(f'{n:,} messages of {k} segments' for k, n in results['messages_by_segment'].items())}, "
        f"groups Zipf({results['args']['zipf']}) "
        f"capped at {results['args']['max_group']}, {results['args']['segments']} segments per message; "
        f"{results['rounds']} rounds (+{results['warmup_rounds']} warm-up), up to {results['args']['seconds']} s "
        f"per case; load average {results['load_before'][0]:.1f} before, {results['load_after'][0]:.1f} after.",
        "",
        "| segment | work | case | workers | msgs/s (median) | min-max | ideal | vs sequential (same work) "
        "| vs min(ideal, sequential 0 ms) | CPU µs/msg | peak held MiB (budget) | peak RSS MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["summary"]:
        budget = f" ({_mib(r['budget_bytes'])})" if r.get("budget_bytes") else ""
        lines.append(
            f"| {r['segment'] // KiB} KiB | {r['work']} | {r['case']} | {r['workers']} | {_k(r['rate'])} "
            f"| {_k(r['min'])}-{_k(r['max'])} | {_k(r['ideal'])} "
            f"| {'' if r['case'] == 'sequential' else _x(r['vs_sequential'])} "
            f"| {_x(r['vs_bound']) if r['work'] != '0' and r['case'] != 'sequential' else ''} "
            f"| {_us(r.get('cpu_us_per_message'))} | {_mib(r['peak_held_bytes'])}{budget} "
            f"| {_mib(r['max_rss_bytes'])} |" + (f" {r['error']}" if r.get("error") else "")
        )
    lines += ["", "Goals (medians of per-round ratios):"]
    for seg in sorted({r["segment"] for r in results["summary"]}):
        rows = [r for r in results["summary"] if r["segment"] == seg]
        zero = [r for r in rows if r["case"] == "threads" and r["work"] == "0"]
        sleep = [r for r in rows if r["case"] == "threads" and r["work"] == "sleep"]
        cpu = [r for r in rows if r["case"] == "processes" and r["work"] == "cpu"]
        best0 = max(zero, key=lambda r: r["vs_sequential"] or 0, default=None)
        most = max(sleep, key=lambda r: r["workers"], default=None)
        bestc = max(cpu, key=lambda r: r["vs_sequential"] or 0, default=None)
        parts = []
        if best0:
            parts.append(
                f"0 ms: {_x(best0['vs_sequential'])} the sequential loop ({best0['workers']} workers; goal 0.7x)"
            )
        if most:
            parts.append(f"1 ms sleep, {most['workers']} workers: {_x(most['vs_bound'])} of min(ideal, "
                         "sequential at 0 ms) (goal 0.8x)")  # fmt: skip
        if bestc:
            parts.append(
                f"1 ms CPU: processes {_x(bestc['vs_sequential'])} the sequential loop ({bestc['workers']} workers)"
            )
        peak = max((r["peak_held_bytes"] for r in rows if r["case"] != "sequential"), default=0)
        budget = next((r["budget_bytes"] for r in rows if r.get("budget_bytes")), None)
        parts.append(f"peak held {_mib(peak)} MiB of a {_mib(budget)} MiB budget")
        lines.append(f"- {seg // KiB} KiB: " + "; ".join(parts) + ".")
    return "\n".join(lines)


def results_name(results: dict[str, Any]) -> str:
    day = results["machine"]["date"].split()[0]
    return f"{day}-dispatch{'-quick' if results.get('quick') else ''}"


def machine() -> dict[str, Any]:
    import platform

    cpu = platform.processor()
    if Path("/proc/cpuinfo").exists():
        cpu = next((x.split(":", 1)[1].strip() for x in Path("/proc/cpuinfo").read_text().splitlines()
                    if x.startswith("model name")), cpu)  # fmt: skip
    from datetime import datetime, timezone

    return {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu,
        "cores": os.cpu_count() or 1,
        "python": sys.version.split()[0],
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["child"]:
        return child(argv[1:])
    if argv[:1] == ["--table"]:  # the table of a results file, summarized again
        results = json.loads(Path(argv[1]).read_text())
        results["summary"] = summarize(results["runs"], results["machine"]["cores"])
        print(table(results))
        return 0
    p = argparse.ArgumentParser(prog="python -m bench.dispatch", description=__doc__.split("\n\n")[0])
    p.add_argument("--segment-kib", type=int, nargs="+", default=[1, 64], help="segment sizes (default 1 64)")
    p.add_argument("--messages", type=int, nargs="+", default=[40_000, 1_500],
                   help="messages per segment size, in the same order (default 40000 1500)")  # fmt: skip
    p.add_argument("--segments", type=int, default=2, help="segments per message (default 2)")
    p.add_argument("--zipf", type=float, default=1.5, help="Zipf exponent of the group sizes (default 1.5)")
    p.add_argument("--max-group", type=int, default=50, help="largest group (default 50)")
    p.add_argument("--works", default="0,sleep,cpu", help="comma-separated, of 0, sleep, cpu")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 8, 64], help="worker counts (default 1 8 64)")
    p.add_argument("--seconds", type=float, default=3.0, help="longest timed part of a case (default 3)")
    p.add_argument("--rounds", type=int, default=3, help="counted rounds, interleaved (default 3)")
    p.add_argument("--warmup-rounds", type=int, default=1, help="whole rounds first, not counted (default 1)")
    p.add_argument("--budget-mib", type=float, default=64.0, help="the runners' budget in MiB (default 64)")
    p.add_argument("--budget-messages", type=int, default=5000, help="and in messages (default 5000)")
    p.add_argument("--json", default=None, help="write the results here")
    quick = "a harness check: 1 KiB, 2,000 messages, work 0 and cpu, 2 workers, 1 round, no warm-up"
    p.add_argument("--quick", action="store_true", help=quick)
    a = p.parse_args(argv)
    if a.quick:
        a.segment_kib, a.messages, a.workers, a.rounds, a.warmup_rounds, a.seconds = [1], [2000], [2], 1, 0, 1.0
        a.works = "0,cpu"
    if len(a.messages) != len(a.segment_kib):
        p.error("give one --messages figure per --segment-kib")
    works = a.works.split(",")
    if bad := [w for w in works if w not in WORKS]:
        p.error(f"unknown work {bad[0]}")
    from .mockkafka import MockCluster

    cores = os.cpu_count() or 1
    results: dict[str, Any] = {"machine": machine(), "args": vars(a), "quick": a.quick, "rounds": a.rounds,
                               "warmup_rounds": a.warmup_rounds, "load_before": os.getloadavg(), "runs": [],
                               "warmup_runs": [], "data": {}}  # fmt: skip
    results["messages_by_segment"] = {f"{k} KiB": n for k, n in zip(a.segment_kib, a.messages, strict=True)}
    started = time.monotonic()
    with MockCluster() as cluster:
        topics = {}
        for kib, n in zip(a.segment_kib, a.messages, strict=True):
            sizes = group_sizes(n, a.zipf, a.max_group, seed=47)
            total = n * a.segments * kib * KiB
            partitions = max(4, -(-total // PARTITION_BYTES))
            topic = cluster.topic(f"dispatch-{kib}k-{uuid.uuid4().hex[:6]}", partitions)
            t0 = time.monotonic()
            produced = produce(cluster.bootstrap, topic, sizes, kib * KiB, a.segments, partitions)
            topics[kib] = (topic, n)
            results["data"][f"{kib} KiB"] = {"messages": n, "groups": len(sizes), "largest_group": max(sizes),
                                             "partitions": partitions, "bytes": produced,
                                             "produce_seconds": round(time.monotonic() - t0, 2)}  # fmt: skip
            print(f"data {kib} KiB: {n} messages in {len(sizes)} groups (largest {max(sizes)}), "
                  f"{partitions} partitions, {produced / MiB:.0f} MiB", flush=True)  # fmt: skip
        items = [(kib, c) for kib in a.segment_kib for c in cases(works, a.workers)]
        for r, (kib, (case, work, workers)) in schedule(items, a.rounds, a.warmup_rounds):
            topic, n = topics[kib]
            budget = ["--budget-mib", str(a.budget_mib), "--budget-messages", str(a.budget_messages)]
            rec = run_case(["--bootstrap", cluster.bootstrap, "--topic", topic, "--messages", str(n),
                            "--case", case, "--work", work, "--workers", str(workers), "--seconds", str(a.seconds),
                            *budget])  # fmt: skip
            rec |= {"round": r, "segment": kib * KiB, "case": case, "work": work, "workers": workers,
                    "load": os.getloadavg()[0]}  # fmt: skip
            results["warmup_runs" if r < 1 else "runs"].append(rec)
            print(f"round {r} {kib} KiB {work} {case} x{workers}: {_k(rec.get('rate'))} msgs/s"
                  f"{' ' + rec['error'] if rec.get('error') else ''} (load {rec['load']:.1f})", flush=True)  # fmt: skip
        results["mock_cluster_cpu_seconds"] = cluster.cpu_seconds()
    results["load_after"] = os.getloadavg()
    results["seconds_total"] = round(time.monotonic() - started)
    results["summary"] = summarize(results["runs"], cores)
    text = table(results)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
