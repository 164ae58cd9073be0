"""Spark reassembly (local mode) against what a user would write, and against the shuffle floor.

Every approach reads the same Parquet landing table and writes Parquet, so
the scan and the sink cost the same for all; only the reassembly differs.
"""

from __future__ import annotations

import os
import shutil
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa
import pyarrow.parquet as pq

from segmenter import Segmenter

MiB = 1 << 20


def make_dataset(path: Path, total: int, segment_size: int, per_message: int) -> dict[str, Any]:
    """Clean encoded segments of ``total`` payload bytes, shuffled, in Parquet (generated once, cached)."""
    data_size = segment_size - 84
    msg_size = data_size * per_message
    n = max(1, total // msg_size)
    if not (path / "_DONE").exists():
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        blob = os.urandom(msg_size)
        seg = Segmenter(segment_size)
        batch: list[bytes] = []
        part = 0
        order = list(range(n))
        __import__("random").Random(1).shuffle(order)
        for i in order:
            payload = i.to_bytes(8, "big") + blob[8:]
            batch += [s.encode() for s in seg.segment(payload)]
            if len(batch) * segment_size >= 128 * MiB:
                pq.write_table(pa.table({"segment": pa.array(batch, pa.binary())}), path / f"part-{part:04d}.parquet")
                batch, part = [], part + 1
        if batch:
            pq.write_table(pa.table({"segment": pa.array(batch, pa.binary())}), path / f"part-{part:04d}.parquet")
        (path / "_DONE").touch()
    return {"messages": n, "bytes": n * msg_size, "segment": segment_size, "per_message": per_message}


class PeakMemory:
    """Samples RSS of the driver JVM (local mode: also the executor) and of the Python workers."""

    def __init__(self) -> None:
        self.jvm = 0
        self.python_workers = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        me = psutil.Process()
        while not self._stop.wait(0.2):
            jvm = workers = 0
            for p in me.children(recursive=True):
                try:
                    name, rss = p.name(), p.memory_info().rss
                except psutil.Error:
                    continue
                if name == "java":
                    jvm += rss
                elif "python" in name:
                    workers += rss
            self.jvm = max(self.jvm, jvm)
            self.python_workers = max(self.python_workers, workers)


def approaches(spark: Any) -> dict[str, Callable[[Any], Any]]:
    """Each maps the landing DataFrame to a DataFrame to write."""
    from pyspark.sql import functions as F

    from reassembly.spark import reassemble

    def keyed(df: Any) -> Any:
        return df.select(
            F.expr("substring(segment, 17, 28)").alias("key"),  # GroupId + MsgSeqNumber
            F.expr("conv(hex(substring(segment, 49, 8)), 16, 10)").cast("bigint").alias("offset"),
            F.expr("substring(segment, 85)").alias("data"),
        )

    def ours(df: Any) -> Any:
        return reassemble(df).combined

    def listagg(df: Any) -> Any:
        return keyed(df).groupBy("key").agg(F.expr("listagg(data, X'') WITHIN GROUP (ORDER BY offset)").alias("p"))

    def collect_concat(df: Any) -> Any:
        return (
            keyed(df)
            .groupBy("key")
            .agg(F.expr("array_sort(collect_list(struct(offset, data)))").alias("s"))
            .select("key", F.expr("aggregate(s, X'', (acc, x) -> concat(acc, x.data))").alias("p"))
        )

    def pandas_udf(df: Any) -> Any:
        def join(pdf: Any) -> Any:
            import pandas as pd

            pdf = pdf.sort_values("offset")
            return pd.DataFrame({"key": [pdf["key"].iloc[0]], "p": [b"".join(pdf["data"])]})

        return keyed(df).groupBy("key").applyInPandas(join, "key binary, p binary")

    def floor(df: Any) -> Any:
        return df.select(F.expr("substring(segment, 17, 28)").alias("key"), "segment").repartition(
            int(spark.conf.get("spark.sql.shuffle.partitions")), "key"
        )

    return {
        "ours (validated)": ours,
        "(a) SQL listagg, no validation": listagg,
        "(b) collect_list+aggregate concat, no validation": collect_concat,
        "(c) applyInPandas b''.join, no validation": pandas_udf,
        "(d) floor: shuffle by message + write": floor,
    }


def run_case(spark: Any, name: str, build: Callable[[Any], Any], src: Path, out: Path, repeat: int) -> dict[str, Any]:
    times = []
    mem = PeakMemory()
    error = None
    with mem:
        for _ in range(repeat):
            shutil.rmtree(out, ignore_errors=True)
            start = time.perf_counter()
            try:
                build(spark.read.parquet(str(src))).write.parquet(str(out))
            except Exception as exc:  # recorded, not hidden: a baseline that cannot do a case says so
                error = str(exc).splitlines()[0][:200]
                break
            times.append(time.perf_counter() - start)
    shutil.rmtree(out, ignore_errors=True)
    return {
        "approach": name,
        "seconds": statistics.median(times) if times else None,
        "runs": times,
        "error": error,
        "peak_jvm_rss": mem.jvm,
        "peak_python_workers_rss": mem.python_workers,
    }


def spark_cases(work: Path, quick: bool) -> Iterator[dict[str, Any]]:
    from reassembly.session import get_session

    spark = get_session("local[2]", app_name="bench", conf={"spark.driver.memory": "8g"})
    spark.sparkContext.setLogLevel("OFF")
    table = approaches(spark)
    warm = work / "warmup"
    make_dataset(warm, 4 * MiB, 64 * 1024, 4)
    for build in table.values():  # JIT, Python worker start-up: paid here, not by the first approach timed
        run_case(spark, "warm-up", build, warm, work / "out", 1)
    if quick:
        matrix = [(64 * MiB, 64 * 1024, 8)]
    else:
        matrix = [
            (1024 * MiB, 64 * 1024, 8),
            (1024 * MiB, 64 * 1024, 64),
            (1024 * MiB, 16 * 1024, 8),
            (1024 * MiB, 1024 * 1024, 8),
        ]
    repeat = 1 if quick else 2
    for total, ssize, per in matrix:
        src = work / f"data-{total // MiB}M-{ssize // 1024}K-{per}"
        info = make_dataset(src, total, ssize, per)
        for name, build in table.items():
            yield {"kind": "matrix", **info, **run_case(spark, name, build, src, work / "out", repeat)}
    if quick:
        spark.stop()
        return
    # Scaling: data size, and segments per message at fixed size.
    for gib in (0.25, 0.5, 1.0, 2.0):
        total = int(gib * 1024) * MiB
        src = work / f"data-{total // MiB}M-64K-8"
        info = make_dataset(src, total, 64 * 1024, 8)
        for name in ("ours (validated)", "(d) floor: shuffle by message + write"):
            yield {"kind": "scale_size", **info, **run_case(spark, name, table[name], src, work / "out", 1)}
    for per in (2, 8, 32, 128):
        src = work / f"data-512M-64K-{per}"
        info = make_dataset(src, 512 * MiB, 64 * 1024, per)
        for name in ("ours (validated)", "(a) SQL listagg, no validation"):
            yield {"kind": "scale_per_message", **info, **run_case(spark, name, table[name], src, work / "out", 1)}
    # One single 1 GiB message (1 MiB segments).
    src = work / "data-1024M-1024K-1024"
    info = make_dataset(src, 1024 * MiB, 1024 * 1024, 1024)
    for name in ("ours (validated)", "(a) SQL listagg, no validation", "(d) floor: shuffle by message + write"):
        yield {"kind": "single_1g", **info, **run_case(spark, name, table[name], src, work / "out", 1)}
    spark.stop()
