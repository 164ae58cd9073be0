"""Streaming reassembly against the batch job, in one process, as ratios (issue 10's performance goals).

1. ``available-now`` over the whole landing table in one run, against
   ``reassemble`` (batch) on the same files, both writing Parquet.
2. The same data arriving as ``--files`` files, one every ``--every``
   seconds, with a processing-time trigger: for every message, the delay
   from its last file's arrival to the commit of the batch that wrote it
   (p50/p99), the arrival rate, the median per-micro-batch durations
   (Spark's ``durationMs`` and the state operator's commit time), and what
   state holds at the end (held bytes: 0 when every message is out;
   tombstones until ``--tombstone``).

Both use :func:`reassembly.spark.stream.configure` (state partitions = cores,
changelog checkpointing), as ``reassemble stream`` does.

    python -m bench.streambench --mib 1024 --files 20 --every 1 --json bench/results/stream.json
    python -m bench.streambench --mib 128 --files 20 --every 1 --arrivals-only
"""

from __future__ import annotations

import argparse
import json
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
from segmenter.wire import decode_header


def _batch(spark: Any, data: Path, out: Path) -> float:
    from reassembly.spark import reassemble

    start = time.monotonic()
    reassemble(spark.read.parquet(str(data))).combined.write.partitionBy("kind").parquet(str(out))
    return time.monotonic() - start


def _available_now(spark: Any, data: Path, work: Path) -> float:
    from reassembly.spark.stream import StreamOptions, file_source, reassemble_stream, start

    start_t = time.monotonic()
    rows = reassemble_stream(file_source(spark, str(data)), options=StreamOptions(watermark=0))
    query = start(rows, work / "out", str(work / "ck"), "available-now")
    query.awaitTermination()
    return time.monotonic() - start_t


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _arrivals(spark: Any, data: Path, work: Path, files: int, every: float) -> dict[str, Any]:
    from reassembly.spark.stream import (
        StreamOptions,
        file_source,
        read_committed,
        reassemble_stream,
        start,
        state_after,
    )

    landing = work / "landing"
    landing.mkdir(parents=True)
    rows = pq.read_table(data).column("segment").to_pylist()
    query = start(
        reassemble_stream(file_source(spark, str(landing)), options=StreamOptions(watermark=0)),
        work / "out",
        str(work / "ck"),
        f"{int(every * 1000)} milliseconds",
    )
    began = time.time()
    arrived: dict[bytes, float] = {}  # GroupId -> arrival of the last file holding one of its segments
    for i in range(files):
        part = rows[i::files]
        tmp = work / f".f{i}.parquet"
        pq.write_table(pa.table({"segment": pa.array(part, pa.binary())}), tmp)
        tmp.rename(landing / f"f{i}.parquet")
        now = time.time()
        for raw in part:
            arrived[decode_header(raw).group_id] = now
        time.sleep(every)
    landed = time.time() - began
    expected = len(arrived)
    deadline = time.monotonic() + 600
    while len(read_committed(work / "out", "message")) < expected and time.monotonic() < deadline:
        time.sleep(0.2)
    progress = query.lastProgress
    timings = _durations(query.recentProgress)
    query.stop()
    commits = {int(p.name): p.stat().st_mtime for p in (work / "out" / "_commits").iterdir() if p.name.isdigit()}
    delays = [commits[m["batch"]] - arrived[m["group_id"]] for m in read_committed(work / "out", "message")]
    ops = progress.stateOperators if progress is not None else []
    held = state_after(work / "out")
    data_mib = sum(len(r) for r in rows) / (1 << 20)
    return {
        "files": files,
        "every_s": every,
        "landing_s": round(landed, 1),  # writing the files and sleeping between them
        "arrival_mib_per_s": round(data_mib / landed, 1),
        "messages": len(delays),
        "delay_p50_s": round(_percentile(delays, 0.5), 2),
        "delay_p99_s": round(_percentile(delays, 0.99), 2),
        "micro_batches": len(commits),
        "batch_ms_median": timings,
        "state_at_end": held._asdict() if held is not None else None,  # held 0; tombstones until --tombstone
        "store_rows_at_end": sum(o.numRowsTotal for o in ops),  # Spark's count: tombstones and their timers
    }


def _durations(progress: list[Any]) -> dict[str, int]:
    """Median of each ``durationMs`` part and the state commit time over the micro-batches that read rows."""
    busy = [p for p in progress if p.numInputRows > 0]
    parts: dict[str, list[int]] = {}
    for p in busy:
        for k, v in p.durationMs.items():
            parts.setdefault(k, []).append(v)
        parts.setdefault("stateCommit", []).append(sum(o.commitTimeMs for o in p.stateOperators))
    return {k: int(statistics.median(v)) for k, v in sorted(parts.items())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=int, default=256, help="payload MiB (the issue's goal is stated for 1024)")
    p.add_argument("--files", type=int, default=20)
    p.add_argument("--every", type=float, default=1.0, help="seconds between files, and the trigger interval")
    p.add_argument("--work", default=None, help="work directory (default: a temporary one)")
    p.add_argument("--rounds", type=int, default=2, help="interleaved batch / available-now pairs")
    p.add_argument("--arrivals-only", action="store_true", help="only the files-over-time measurement")
    p.add_argument("--json", default=None, help="also write the result here (e.g. bench/results/stream.json)")
    args = p.parse_args(argv)
    from reassembly.session import get_session
    from reassembly.spark.stream import configure

    work = Path(args.work or tempfile.mkdtemp(prefix="streambench-"))
    data = work / "data"
    info = make_dataset(data, args.mib << 20, 64 * 1024, 8)
    spark = get_session("local[2]")
    spark.sparkContext.setLogLevel("OFF")
    result: dict[str, Any] = {"data": info, "state_partitions": configure(spark)}
    shutil.rmtree(work / "runs", ignore_errors=True)
    _batch(spark, data, work / "runs" / "warmup")  # JIT and Python workers warm for both
    if not args.arrivals_only:
        batches, streams = [], []
        for i in range(args.rounds):  # interleaved: the machine's load changes from minute to minute
            batches.append(_batch(spark, data, work / "runs" / f"batch{i}"))
            streams.append(_available_now(spark, data, work / "runs" / f"stream{i}"))
        result["batch_s"] = [round(t, 1) for t in batches]
        result["available_now_s"] = [round(t, 1) for t in streams]
        result["ratio"] = round(min(streams) / min(batches), 2)  # best against best
    result["arrivals"] = _arrivals(spark, data, work / "runs" / "arrivals", args.files, args.every)
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
