"""Streaming reassembly against the batch job, in one process, as ratios (the goals: available-now within
1.5x of the batch job; p50 of 2 s from a message's last file's arrival to its output).

1. ``available-now`` over the whole landing table in one run, against
   ``reassemble`` (batch) on the same files, both writing Parquet.
2. The same data arriving as ``--files`` files, one every ``--every``
   seconds, with a processing-time trigger: for every message, the delay
   from its last file's arrival to the commit of the batch that wrote it
   (p50/p99), the arrival rate, the median per-micro-batch durations
   (Spark's ``durationMs`` and the state operator's commit time), apart for
   the batches that read files and the no-data batches Spark runs after the
   watermark moved, and what state holds at the end (held bytes: 0 when
   every message is out; tombstones until ``--tombstone``). A warm-up file
   goes through the query first, so the delays are a running stream's, not
   its cold start's (the first micro-batch of a session starts the Python
   state workers, loads RocksDB and compiles the plan: seconds).

Each measurement records the load average before and after it (the machine
may be shared: compare ratios and runs made side by side). ``--profile DIR``
profiles the arrivals' state processors (``reassembly.spark.stream.functions.PROFILE``)
and adds their summed calls and cumulative seconds: the state round trips
(``round_trips``: every request to the JVM's state server) and what they were.

Both use :func:`reassembly.spark.stream.functions.configure` (state partitions = cores,
changelog checkpointing), as ``reassemble stream`` does.

    python -m bench.streambench --mib 1024 --files 20 --every 1 --json bench/results/stream.json
    python -m bench.streambench --mib 128 --files 20 --every 1 --arrivals-only
    python -m bench.streambench --mib 32 --files 20 --every 1 --arrivals-only --profile /tmp/prof
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from bench.sparkbench import make_dataset
from segmenter.producer import Segmenter
from segmenter.wire import decode_header


def _batch(spark: Any, data: Path, out: Path) -> float:
    from reassembly.spark import reassemble

    start = time.monotonic()
    reassemble(spark.read.parquet(str(data))).combined.write.partitionBy("kind").parquet(str(out))
    return time.monotonic() - start


def _available_now(spark: Any, data: Path, work: Path) -> float:
    from reassembly.spark.stream.functions import StreamOptions, file_source, reassemble_stream, start

    start_t = time.monotonic()
    rows = reassemble_stream(file_source(spark, str(data)), options=StreamOptions(watermark=0))
    query = start(rows, work / "out", str(work / "ck"), "available-now")
    query.awaitTermination()
    return time.monotonic() - start_t


def _load() -> float:
    return round(os.getloadavg()[0], 1)


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds() -> dict[str, float]:
    """CPU seconds (user + system, reaped children included) of this process ("driver"), the JVM it
    started ("jvm") and the Python workers under the JVM ("python"), from /proc: what a loaded machine
    does not change much, unlike wall time. Workers that exited count through their reaping parent."""
    procs: dict[int, tuple[int, str, float]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        ticks = sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
        procs[int(d)] = (int(fields[1]), name, ticks / _TICK)
    totals = {"driver": 0.0, "jvm": 0.0, "python": 0.0}
    me = os.getpid()

    def kind(pid: int) -> str | None:
        path = []
        while pid in procs and pid != me:
            path.append(procs[pid][1])
            pid = procs[pid][0]
        if pid != me:
            return None
        return "driver" if not path else "jvm" if len(path) == 1 else "python"

    for pid, (_, _, secs) in procs.items():
        k = "driver" if pid == me else kind(pid)
        if k is not None:
            totals[k] += secs
    return {k: round(v, 2) for k, v in totals.items()}


def jvm_threads() -> dict[int, tuple[str, float]]:
    """CPU seconds of every thread of the JVM this process started, by thread id (name, seconds)."""
    me = str(os.getpid())
    threads: dict[int, tuple[str, float]] = {}
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if stat[stat.rindex(")") + 2 :].split()[1] != me or "java" not in stat[: stat.rindex(")")]:
            continue
        for tid in os.listdir(f"/proc/{d}/task"):
            try:
                with open(f"/proc/{d}/task/{tid}/stat") as f:
                    t = f.read()
            except OSError:
                continue
            fields = t[t.rindex(")") + 2 :].split()
            threads[int(tid)] = (t[t.index("(") + 1 : t.rindex(")")], (int(fields[11]) + int(fields[12])) / _TICK)
    return threads


def thread_cpu(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """The JVM's CPU seconds between two :func:`jvm_threads`, by thread name (numbers folded), largest first."""
    import re

    by: dict[str, float] = {}
    for tid, (name, secs) in after.items():
        key = re.sub(r"\d+", "N", name)
        by[key] = by.get(key, 0.0) + secs - before.get(tid, (name, 0.0))[1]
    return {k: round(v, 1) for k, v in sorted(by.items(), key=lambda kv: -kv[1]) if v >= 0.1}


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


WARM_MESSAGES = 16  # per warm-up round: 8 MiB as two files


def _arrivals(spark: Any, data: Path, work: Path, files: int, every: float, warm_rounds: int = 0) -> dict[str, Any]:
    from reassembly.spark.stream.functions import (
        StreamOptions,
        committed_batches,
        file_source,
        read_committed,
        reassemble_stream,
        start,
        state_after,
    )

    landing = work / "landing"
    landing.mkdir(parents=True)
    rows = pq.read_table(data).column("segment").to_pylist()
    load = [_load()]
    query = start(
        reassemble_stream(file_source(spark, str(landing)), options=StreamOptions(watermark=0)),
        work / "out",
        str(work / "ck"),
        f"{int(every * 1000)} milliseconds",
    )

    def land(name: str, part: list[bytes]) -> float:
        tmp = work / f".{name}"
        pq.write_table(pa.table({"segment": pa.array(part, pa.binary())}), tmp)
        tmp.rename(landing / name)
        return time.time()

    def out(n: int) -> None:
        deadline = time.monotonic() + 600
        while len(read_committed(work / "out", "message")) < n and time.monotonic() < deadline:
            time.sleep(0.2)

    land("warmup.parquet", [s.encode() for s in Segmenter(1000).segment(b"warm-up" * 1000)])
    out(1)  # the cold first micro-batch is not part of the measurement
    done = 1
    for r in range(warm_rounds):
        # Messages straddling two micro-batches, as the measured ones do: the held-state paths (list append
        # and read back, the state server's pickling) run, and the JVM compiles them, before the clock starts.
        # A running stream has long done so; without this the C2 compiler's first ~10 CPU seconds land on
        # the first measured seconds of 2 shared cores.
        seg = Segmenter(64 * 1024)
        msgs = [[x.encode() for x in seg.segment(os.urandom(seg.data_size * 8))] for _ in range(WARM_MESSAGES)]
        before = len(committed_batches(work / "out"))
        land(f"warmup-{r}a.parquet", [x for m in msgs for x in m[:4]])
        while len(committed_batches(work / "out")) == before:
            time.sleep(0.2)
        land(f"warmup-{r}b.parquet", [x for m in msgs for x in m[4:]])
        done += len(msgs)
        out(done)
    warm = committed_batches(work / "out")[-1]  # Spark posts its progress a moment after the sink commits
    cpu, threads = cpu_seconds(), jvm_threads()
    began = time.time()
    arrived: dict[bytes, float] = {}  # GroupId -> arrival of the last file holding one of its segments
    for i in range(files):
        part = rows[i::files]
        now = land(f"f{i}.parquet", part)
        for raw in part:
            arrived[decode_header(raw).group_id] = now
        time.sleep(every)
    landed = time.time() - began
    out(done + len(arrived))
    drained = time.time() - began
    cpu_after, threads_after = cpu_seconds(), jvm_threads()
    progress = query.lastProgress
    timings = _durations([p for p in query.recentProgress if p.batchId > warm])
    query.stop()
    load.append(_load())
    commits = {int(p.name): p.stat().st_mtime for p in (work / "out" / "_commits").iterdir() if p.name.isdigit()}
    delays = [
        commits[m["batch"]] - arrived[m["group_id"]]
        for m in read_committed(work / "out", "message")
        if m["group_id"] in arrived
    ]
    ops = progress.stateOperators if progress is not None else []
    held = state_after(work / "out")
    data_mib = sum(len(r) for r in rows) / (1 << 20)
    return {
        "files": files,
        "every_s": every,
        "warm_up_rounds": warm_rounds,
        "landing_s": round(landed, 1),  # writing the files and sleeping between them
        "arrival_mib_per_s": round(data_mib / landed, 1),
        "messages": len(delays),
        "delay_p50_s": round(_percentile(delays, 0.5), 2),
        "delay_p99_s": round(_percentile(delays, 0.99), 2),
        "drained_s": round(drained, 1),  # from the first file to the last message's commit
        "cpu_s": {k: round(cpu_after[k] - v, 1) for k, v in cpu.items()},  # of that span, by process
        "jvm_threads_cpu_s": thread_cpu(threads, threads_after),
        "micro_batches": len([b for b in commits if b > warm]),
        **timings,
        "load_average": load,  # before and after
        "state_at_end": held._asdict() if held is not None else None,  # held 0; tombstones until --tombstone
        "store_rows_at_end": sum(o.numRowsTotal for o in ops),  # Spark's count: tombstones and their timers
    }


def _durations(progress: list[Any]) -> dict[str, Any]:
    """Median of each ``durationMs`` part, of the state operator's commit and of the time its Python
    processor and timers took, apart for the micro-batches that read rows and the no-data ones (Spark
    runs one after a batch that moved the watermark: it fires the event-time timers)."""

    def medians(batches: list[Any]) -> dict[str, int]:
        parts: dict[str, list[int]] = {}
        for p in batches:
            for k, v in p.durationMs.items():
                parts.setdefault(k, []).append(v)
            ops = p.stateOperators
            parts.setdefault("stateCommit", []).append(sum(o.commitTimeMs for o in ops))
            parts.setdefault("stateAllUpdates", []).append(sum(o.allUpdatesTimeMs for o in ops))
            parts.setdefault("stateAllRemovals", []).append(sum(o.allRemovalsTimeMs for o in ops))
        return {k: int(statistics.median(v)) for k, v in sorted(parts.items())}

    data = [p for p in progress if p.numInputRows > 0]
    idle = [p for p in progress if p.numInputRows == 0]
    return {
        "data_batches": len(data),
        "batch_ms_median": medians(data),
        "no_data_batches": len(idle),
        "no_data_batch_ms_median": medians(idle),
    }


# What the state processors' time is spent on (cumulative seconds and calls, summed over every task):
# our own calls, the framework's per-key and per-task calls, and every socket round trip to the JVM.
_PROFILED = {
    "handleInputRows": "handleInputRows",
    "handleExpiredTimer": "handleExpiredTimer",
    "init": "init",
    "register_state": "get_value_state",  # per task and state variable (registers it in the JVM)
    "register_list_state": "get_list_state",
    "round_trips": "_send_proto_message",
    "value_get": "value_state_client.py:get",
    "value_update": "value_state_client.py:update",
    "value_clear": "value_state_client.py:clear",
    "list_get": "list_state_client.py:get",
    "list_append": "list_state_client.py:append_list",
    "list_clear": "list_state_client.py:clear",
    "list_exists": "list_state_client.py:exists",
    "register_timer": "register_timer",
    "delete_timer": "delete_timer",
    "set_implicit_key": "set_implicit_key",
    "expiry_timers": "get_expiry_timers_iterator",
    "judge": "stream_state.py:judge",
    "input_rows": "worker.py:generate_data_batches",  # Arrow batches to Rows (the payload's as_py copies)
    "output_rows": "worker.py:convert_results",  # our rows to an Arrow batch (from_pylist)
    "summary_dump": "stream_state.py:dump",
    "summary_load": "stream_state.py:load",
}


def profile_summary(directory: Path) -> dict[str, Any]:
    """Sum the per-task profiles (see ``reassembly.spark.stream.functions.PROFILE``): calls and cumulative seconds."""
    import pstats

    files = sorted(directory.glob("*.prof"))
    if not files:
        return {}
    stats = pstats.Stats(*map(str, files))
    table: dict[str, Any] = stats.stats  # type: ignore[attr-defined]  # (file, line, name) -> (cc, nc, tt, ct, callers)
    out: dict[str, Any] = {"tasks": len(files), "total_s": round(stats.total_tt, 2)}  # type: ignore[attr-defined]
    for label, want in _PROFILED.items():
        where, _, name = want.rpartition(":")
        hits = [v for (f, _, n), v in table.items() if n == name and f.endswith(where)]
        out[label] = {"calls": sum(v[1] for v in hits), "cum_s": round(sum(v[3] for v in hits), 3)}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=int, default=256, help="payload MiB (the goals are stated for 1024)")
    p.add_argument("--files", type=int, default=20)
    p.add_argument("--every", type=float, default=1.0, help="seconds between files, and the trigger interval")
    p.add_argument("--work", default=None, help="work directory (default: a temporary one)")
    p.add_argument("--rounds", type=int, default=2, help="interleaved batch / available-now pairs")
    p.add_argument("--arrivals-only", action="store_true", help="only the files-over-time measurement")
    p.add_argument("--no-arrivals", action="store_true", help="only the available-now against batch measurement")
    p.add_argument("--profile", default=None, help="profile the arrivals' state processors into this directory")
    p.add_argument("--jfr", default=None, help="record the JVM with Java Flight Recorder into this file")
    p.add_argument("--warm", type=int, default=3, help="warm-up rounds of straddling messages before the clock")
    p.add_argument("--java-options", default="", help="extra options for the JVM (e.g. -XX:TieredStopAtLevel=1)")
    p.add_argument("--floor-mib", type=int, default=0, help="also time the batch job on this many MiB")
    p.add_argument("--json", default=None, help="also write the result here (e.g. bench/results/stream.json)")
    args = p.parse_args(argv)
    from reassembly.spark.engine.session import get_session
    from reassembly.spark.stream.functions import configure

    work = Path(args.work or tempfile.mkdtemp(prefix="streambench-"))
    data = work / "data"
    info = make_dataset(data, args.mib << 20, 64 * 1024, 8)
    java = args.java_options.split() + (
        [f"-XX:StartFlightRecording=filename={args.jfr},settings=profile,dumponexit=true"] if args.jfr else []
    )
    spark = get_session("local[2]", conf={"spark.driver.extraJavaOptions": " ".join(java)} if java else None)
    spark.sparkContext.setLogLevel("OFF")
    result: dict[str, Any] = {"data": info, "state_partitions": configure(spark), "java_options": args.java_options}
    shutil.rmtree(work / "runs", ignore_errors=True)
    _batch(spark, data, work / "runs" / "warmup")  # JIT and Python workers warm for both
    small = work / "runs" / "small"
    small.mkdir(parents=True)
    first = next(pq.ParquetFile(sorted(data.glob("*.parquet"))[0]).iter_batches(batch_size=64))
    pq.write_table(pa.Table.from_batches([first]), small / "part-0.parquet")
    _available_now(spark, small, work / "runs" / "warmup-stream")  # the state workers and RocksDB too
    if args.floor_mib:
        # The floor for any micro-batch design here: the batch job on one arriving file's worth of data, warm.
        # If that takes more than about a trigger interval, no stream keeps up with files that size each second.
        one = make_dataset(work / "floor", args.floor_mib << 20, 64 * 1024, 8)
        times = [_batch(spark, work / "floor", work / "runs" / f"floor{i}") for i in range(args.rounds + 1)]
        result["floor"] = {
            "data": one,
            "batch_s": [round(t, 2) for t in times],
            "mib_per_s_best": round(one["bytes"] / (1 << 20) / min(times), 1),
            "load_average": _load(),
        }
    if not args.arrivals_only:
        batches, streams, load = [], [], [_load()]
        for i in range(args.rounds):  # interleaved: the machine's load changes from minute to minute
            batches.append(_batch(spark, data, work / "runs" / f"batch{i}"))
            streams.append(_available_now(spark, data, work / "runs" / f"stream{i}"))
            load.append(_load())
        result["batch_s"] = [round(t, 1) for t in batches]
        result["available_now_s"] = [round(t, 1) for t in streams]
        result["ratio"] = round(min(streams) / min(batches), 2)  # best against best
        result["ratio_per_round"] = [round(s / b, 2) for b, s in zip(batches, streams, strict=True)]
        result["load_average"] = load  # before the first round and after each
    if not args.no_arrivals:
        if args.profile:
            from reassembly.spark.stream.functions import PROFILE

            os.environ[PROFILE] = args.profile  # read when the query is built (in _arrivals)
        result["arrivals"] = _arrivals(spark, data, work / "runs" / "arrivals", args.files, args.every, args.warm)
        if args.profile:
            result["profile"] = profile_summary(Path(args.profile))
    spark.stop()
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
