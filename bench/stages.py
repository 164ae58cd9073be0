"""Where the Spark path's time goes: task time per stage for the floor and for ours cut short at each step.

``python -m bench.stages DATA [--runs 3] [--json FILE]`` (a landing table from
``python -m bench``, e.g. ``/tmp/bench-work/data-1024M-64K-8``) runs, in one warm
session, each variant ``--runs`` times (interleaved) and prints the task seconds of
the map stage (scan, header decoding, shuffle write) and of the reduce stage
(everything after the shuffle):

* ``floor``: shuffle the segments by message and write them;
* ``aggregate``: our routing and aggregate, write the concatenations;
* ``clean``: plus the JVM's clean test (CRC-32 of every message);
* ``ours``: the whole ``reassemble`` (plus the Python UDF operator and the row explode);
* ``split``: the plan split after the shuffle (issue 14's candidate, measured and not adopted):
  clean messages written by a JVM-only branch, the rest through the judge UDF in a second
  branch over the same (reused) exchange; each branch runs the aggregate and the clean test.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from typing import Any

VARIANTS = ("floor", "aggregate", "clean", "ours", "split")


def split(df: Any, partitions: int = 8) -> Any:
    """``reassemble(df).combined`` (default options) as two branches over one exchange (the ``split`` variant)."""
    from pyspark.sql import functions as F

    from reassembly.spark import ReassemblyOptions, jvm
    from reassembly.spark.decode import decode_segments
    from reassembly.spark.judge import make_judge
    from reassembly.spark.schema import OUTPUT_FIELDS
    from segmenter.digest import NO_POLICY

    limits = ReassemblyOptions().limits()
    decoded = decode_segments(df, "segment", limits.max_message_size, limits.max_segment_size)
    agg = jvm.aggregate(jvm.route(decoded, None), partitions)
    ok = F.expr(f"coalesce({jvm.clean(NO_POLICY)}, false)")
    sql = jvm.clean_row()
    written = agg.where(ok).select(*[F.expr(f"CAST({sql[c]} AS {ddl})").alias(c) for c, ddl, _ in OUTPUT_FIELDS])
    job = F.struct("routable", "pk", F.lit(False).alias("large"), "blob", "meta")
    judged = agg.where(~ok).select(F.explode(make_judge(limits, True, None, None)(job)).alias("q"))
    return written.unionByName(judged.select(*[F.col(f"q.`{c}`").alias(c) for c, _, _ in OUTPUT_FIELDS]))


def profile(data: str, runs: int = 3) -> list[dict[str, Any]]:
    """One record per (run, variant): wall seconds and the task seconds of each stage, map stage first.

    A variant whose building blocks a newer ``jvm`` module no longer offers is recorded with its
    error instead of stopping the profile.
    """
    from pyspark.sql import functions as F

    from reassembly.session import get_session
    from reassembly.spark import jvm, reassemble
    from reassembly.spark.decode import decode_segments
    from segmenter.digest import NO_POLICY

    spark = get_session("local[2]", conf={"spark.driver.memory": "8g", "spark.ui.enabled": "true"})
    spark.sparkContext.setLogLevel("OFF")
    api = f"{spark.sparkContext.uiWebUrl}/api/v1/applications/{spark.sparkContext.applicationId}/stages"

    def aggregate(df: Any) -> Any:
        return jvm.aggregate(jvm.route(decode_segments(df, "segment", 1 << 30), None), 8)

    variants: dict[str, Callable[[Any], Any]] = {
        "floor": lambda df: df.select(F.expr("substring(segment, 17, 28)").alias("k"), "segment").repartition(8, "k"),
        "aggregate": lambda df: aggregate(df).select("pk", "blob"),
        "clean": lambda df: aggregate(df).select("pk", F.when(F.expr(jvm.clean(NO_POLICY)), F.col("blob")).alias("p")),
        "ours": lambda df: reassemble(df).combined,
        "split": split,
    }
    out = tempfile.mkdtemp(prefix="stages-")
    records: list[dict[str, Any]] = []
    for run in range(1, runs + 1):
        for name, build in variants.items():
            before = {s["stageId"] for s in json.load(urllib.request.urlopen(api))}
            shutil.rmtree(out, ignore_errors=True)
            start = time.perf_counter()
            try:
                build(spark.read.parquet(data)).write.parquet(out)
            except Exception as exc:  # recorded: the profile goes on without this variant
                records.append({"run": run, "variant": name, "error": f"{type(exc).__name__}: {exc}"[:300]})
                continue
            wall = time.perf_counter() - start
            stages = [s for s in json.load(urllib.request.urlopen(api)) if s["stageId"] not in before]
            tasks = [
                round(s["executorRunTime"] / 1000, 2)
                for s in sorted(stages, key=lambda s: s["stageId"])
                if s["numTasks"] > 1
            ]
            records.append({"run": run, "variant": name, "wall": wall, "stages": tasks})
            print(f"run {run} {name:<10} wall {wall:5.1f} s   task seconds per stage {tasks}", flush=True)
    shutil.rmtree(out, ignore_errors=True)
    spark.stop()
    return records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.stages", description=__doc__)
    p.add_argument("data", help="a landing table directory (Parquet, column 'segment')")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--json", default=None, help="also write the records here")
    args = p.parse_args(argv)
    records = profile(args.data, args.runs)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
