"""Streaming reassembly against the batch job, in one process, as ratios (issue 10's performance goals).

1. ``available-now`` over the whole landing table in one run, against
   ``reassemble`` (batch) on the same files, both writing Parquet.
2. The same data arriving as ``--files`` files, one every ``--every``
   seconds, with a processing-time trigger: for every message, the delay
   from its last file's arrival to the commit of the batch that wrote it
   (p50/p99), and the state rows at the end.

    python -m bench.streambench --mib 256 --files 20 --every 1
"""

from __future__ import annotations

import argparse
import json
import shutil
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
    from reassembly.spark.stream import StreamOptions, file_source, read_committed, reassemble_stream, start

    landing = work / "landing"
    landing.mkdir()
    rows = pq.read_table(data).column("segment").to_pylist()
    query = start(
        reassemble_stream(file_source(spark, str(landing)), options=StreamOptions(watermark=0)),
        work / "out",
        str(work / "ck"),
        f"{int(every * 1000)} milliseconds",
    )
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
    expected = len(arrived)
    deadline = time.monotonic() + 600
    while len(read_committed(work / "out", "message")) < expected and time.monotonic() < deadline:
        time.sleep(0.2)
    progress = query.lastProgress
    query.stop()
    commits = {int(p.name): p.stat().st_mtime for p in (work / "out" / "_commits").iterdir() if p.name.isdigit()}
    delays = [commits[m["batch"]] - arrived[m["group_id"]] for m in read_committed(work / "out", "message")]
    state_rows = sum(o.numRowsTotal for o in progress.stateOperators) if progress is not None else None
    return {
        "files": files,
        "every_s": every,
        "messages": len(delays),
        "delay_p50_s": round(_percentile(delays, 0.5), 2),
        "delay_p99_s": round(_percentile(delays, 0.99), 2),
        "state_rows_at_end": state_rows,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mib", type=int, default=256, help="payload MiB (the issue's goal is stated for 1024)")
    p.add_argument("--files", type=int, default=20)
    p.add_argument("--every", type=float, default=1.0, help="seconds between files, and the trigger interval")
    p.add_argument("--work", default=None, help="work directory (default: a temporary one)")
    args = p.parse_args(argv)
    from reassembly.session import get_session
    from reassembly.spark.stream import ROCKSDB

    work = Path(args.work or tempfile.mkdtemp(prefix="streambench-"))
    data = work / "data"
    info = make_dataset(data, args.mib << 20, 64 * 1024, 8)
    spark = get_session("local[2]", conf={"spark.sql.streaming.stateStore.providerClass": ROCKSDB})
    spark.sparkContext.setLogLevel("OFF")
    shutil.rmtree(work / "runs", ignore_errors=True)
    _batch(spark, data, work / "runs" / "warmup")  # JIT and Python workers warm for both
    batch = _batch(spark, data, work / "runs" / "batch")
    stream = _available_now(spark, data, work / "runs" / "stream")
    result = {
        "data": info,
        "batch_s": round(batch, 1),
        "available_now_s": round(stream, 1),
        "ratio": round(stream / batch, 2),
        "arrivals": _arrivals(spark, data, work / "runs" / "arrivals", args.files, args.every),
    }
    print(json.dumps(result, indent=2))
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
