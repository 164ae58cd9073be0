"""Where the Spark path's time goes: task time per stage for the floor and for ours cut short at each step.

``python -m bench.stages DATA [--runs 3] [--json FILE]`` (a landing table from
``python -m bench``, e.g. ``/tmp/bench-work/data-1024M-64K-8``) runs, in one warm
session, each variant ``--runs`` times (interleaved) and prints the task seconds of
the map stage (scan, header decoding, shuffle write) and of the reduce stage
(everything after the shuffle), the wall time and the CPU seconds of the JVM and every
process under it (the Python workers, also on their own), read from ``/proc``: the measure
other load distorts least. Each record's ``detail`` adds, per stage, Spark's executor CPU
seconds (the task threads only: no GC thread, no Python worker), GC time, the bytes the sorts
spilled and the shuffle bytes; ``--jfr FILE`` records the JVM with Java Flight Recorder from
run 2 on (``jfr print --events jdk.ExecutionSample FILE`` for the hot methods).
``--variants`` picks some (default: all but ``split``):

* ``floor``: shuffle the segments by message and write them;
* ``listagg``: the user's five-line query (SQL ``listagg`` by message, no validation);
* ``aggregate``: our routing and aggregate, write the concatenations;
* ``clean``: plus the JVM's clean test (CRC-32 of every message);
* ``onepass``: the jar's decoder and one pass (``bridge.decoded_in_jar``, ``bridge.fast_aggregate``:
  sort, concatenate, clean test), clean messages written, JVM only;
* ``ours``: the whole ``reassemble`` (the default: the one pass, then the Python UDF operator and
  the row explode);
* ``ours-files``: ``ours`` with a ``payload_dir`` (as ``reassemble run``: far rows routed apart);
* ``save``: ``reassemble(df).save(out)``: the clean messages by a JVM-only job, the rest (if any)
  judged by a second job; ``save-files`` the same with a ``payload_dir`` (what ``reassemble run`` does);
* ``ours-sql``: the whole ``reassemble`` with ``use_jar=False`` (the SQL path: ``listagg``
  aggregate, the SQL clean test, the Python UDF operator and the row explode);
* ``ours-split``: the one pass in two branches over one reused shuffle, clean rows written from
  the JVM, the rest behind their own small exchange into the judge (:func:`one_pass_split`);
* ``split``: the plan split after the shuffle (a candidate, measured and not adopted):
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

VARIANTS = (
    "floor",
    "listagg",
    "aggregate",
    "clean",
    "onepass",
    "ours",
    "ours-files",
    "save",
    "save-files",
    "ours-sql",
    "ours-split",
    "split",
)
DEFAULT = tuple(v for v in VARIANTS if v != "split")


def cpu_seconds(pid: int, children_only: bool = False) -> float:
    """CPU seconds of ``pid`` and every live process under it, with their reaped children's.

    ``children_only``: without ``pid``'s own threads (for the JVM: its Python workers alone)."""
    import os

    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    times: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
        times[int(entry)] = sum(int(x) for x in fields[11:15]) / tick  # utime stime cutime cstime
    total, todo = 0.0, list(children.get(pid, [])) if children_only else [pid]
    while todo:
        p = todo.pop()
        total += times.get(p, 0.0)
        todo += children.get(p, [])
    return total


def split(df: Any, partitions: int = 8) -> Any:
    """``reassemble(df).combined`` (default options) as two branches over one exchange (the ``split`` variant)."""
    from pyspark.sql import functions as F

    from reassembly.spark import ReassemblyOptions
    from reassembly.spark.batch import grouping
    from reassembly.spark.batch.decode import decode_segments
    from reassembly.spark.batch.judge import make_judge
    from reassembly.spark.schema import OUTPUT_FIELDS
    from segmenter.digest import NO_POLICY

    limits = ReassemblyOptions().limits()
    decoded = decode_segments(df, "segment", limits.max_message_size, limits.max_segment_size)
    agg = grouping.aggregate(grouping.route(decoded, None), partitions)
    ok = F.expr(f"coalesce({grouping.clean(NO_POLICY)}, false)")
    sql = grouping.clean_row()
    written = agg.where(ok).select(*[F.expr(f"CAST({sql[c]} AS {ddl})").alias(c) for c, ddl, _ in OUTPUT_FIELDS])
    job = F.struct("routable", "pk", F.lit(False).alias("large"), "blob", "meta")
    judged = agg.where(~ok).select(F.explode(make_judge(limits, True, None, None)(job)).alias("q"))
    return written.unionByName(judged.select(*[F.col(f"q.`{c}`").alias(c) for c, _, _ in OUTPUT_FIELDS]))


def one_pass_split(df: Any, reassembler: Any, partitions: int = 8) -> Any:
    """``reassemble(df).combined`` as a JVM-only clean branch and a dirty branch behind its own exchange.

    Both branches scan one run of the jar's pass (one ``LogicalRDD``: its shuffle is written once,
    its sort and pass run once per branch), each keeping one kind; the dirty rows go through a small
    exchange so that, when there are none, AQE could drop the Python stage (it does not).
    """
    from pyspark.sql import functions as F

    from reassembly.spark import ReassemblyOptions
    from reassembly.spark.batch import grouping
    from reassembly.spark.batch.judge import make_judge
    from reassembly.spark.engine import bridge
    from reassembly.spark.schema import OUTPUT_FIELDS

    limits = ReassemblyOptions().limits()
    routed = bridge.decoded_in_jar(df, "segment", limits, None)
    size = limits.max_message_size

    both = bridge.fast_aggregate(routed, partitions, size, reassembler)

    def kind(clean: bool) -> Any:
        return both.where(F.col("clean") if clean else ~F.col("clean"))

    sql = grouping.clean_row()
    written = kind(True).select(*[F.expr(f"CAST({sql[c]} AS {ddl})").alias(c) for c, ddl, _ in OUTPUT_FIELDS])
    job = F.struct("routable", "pk", F.col("bk").isNotNull().alias("large"), "blob", "meta")
    dirty = kind(False).repartition("pk")  # AQE coalesces it (to one task when there are no rows)
    judged = dirty.select(F.explode(make_judge(limits, True, None, None)(job)).alias("q"))
    return written.unionByName(judged.select(*[F.col(f"q.`{c}`").alias(c) for c, _, _ in OUTPUT_FIELDS]))


# Per-stage metrics of Spark's REST API kept in each record's "detail" (times in s, bytes in MiB).
_DETAIL = {
    "executorCpuTime": 1e-9,
    "jvmGcTime": 1e-3,
    "memoryBytesSpilled": 1 / (1 << 20),
    "diskBytesSpilled": 1 / (1 << 20),
    "shuffleReadBytes": 1 / (1 << 20),
    "shuffleWriteBytes": 1 / (1 << 20),
    "outputBytes": 1 / (1 << 20),
}


def _stamp(text: str) -> float:
    from datetime import datetime

    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fGMT").timestamp()


def stage_detail(stage: dict[str, Any]) -> dict[str, float]:
    """The metrics of one stage that say where its time goes: wall clock, CPU, GC, spill, shuffle bytes."""
    out = {"tasks": stage["numTasks"], "run": round(stage["executorRunTime"] / 1000, 2)}
    if stage.get("submissionTime") and stage.get("completionTime"):
        out["wall"] = round(_stamp(stage["completionTime"]) - _stamp(stage["submissionTime"]), 2)
    return out | {k: round(stage.get(k, 0) * scale, 2) for k, scale in _DETAIL.items()}


def jfr(pid: int, command: str, *args: str) -> None:
    """``jcmd PID JFR.<command>``: a flight recording of the session's JVM (``--jfr``)."""
    import subprocess

    subprocess.run(["jcmd", str(pid), f"JFR.{command}", *args], check=True, capture_output=True)


def profile(
    data: str, runs: int = 3, only: tuple[str, ...] = DEFAULT, jfr_file: str | None = None
) -> list[dict[str, Any]]:
    """One record per (run, variant): wall seconds and the task seconds of each stage, map stage first.

    Each record's ``detail`` has every stage's CPU, GC, spill and shuffle bytes (:func:`stage_detail`).
    ``jfr_file``: a JFR recording of the JVM over every run after the first (JIT warm-up) goes there.

    A variant whose building blocks ``grouping`` and ``bridge`` do not offer is recorded with its error
    instead of stopping the profile.
    """
    from pyspark.sql import functions as F

    from reassembly.spark import ReassemblyOptions, reassemble
    from reassembly.spark.batch import grouping
    from reassembly.spark.batch.decode import decode_segments
    from reassembly.spark.engine import bridge
    from reassembly.spark.engine.bridge import fast_aggregate, reassembler
    from reassembly.spark.engine.session import get_session
    from segmenter.digest import NO_POLICY

    from .sparkbench import write_result

    spark = get_session("local[2]", conf={"spark.driver.memory": "8g", "spark.ui.enabled": "true"})
    spark.sparkContext.setLogLevel("OFF")
    import os

    jvm_pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    one_pass = reassembler(spark)
    clean = grouping.clean(NO_POLICY)
    api = f"{spark.sparkContext.uiWebUrl}/api/v1/applications/{spark.sparkContext.applicationId}/stages"

    def routed(df: Any) -> Any:
        return grouping.route(decode_segments(df, "segment", 1 << 30), None)

    def aggregate(df: Any) -> Any:
        return grouping.aggregate(routed(df), 8)

    def in_jar(df: Any) -> Any:  # what reassemble() decodes with where the jar runs
        return bridge.decoded_in_jar(df, "segment", ReassemblyOptions().limits(), None)

    def listagg(df: Any) -> Any:
        return (
            df.select(
                F.expr("substring(segment, 17, 28)").alias("key"),
                F.expr("conv(hex(substring(segment, 49, 8)), 16, 10)").cast("bigint").alias("offset"),
                F.expr("substring(segment, 85)").alias("data"),
            )
            .groupBy("key")
            .agg(F.expr("listagg(data, X'') WITHIN GROUP (ORDER BY offset)").alias("p"))
        )

    variants: dict[str, Callable[[Any], Any]] = {
        "floor": lambda df: df.select(F.expr("substring(segment, 17, 28)").alias("k"), "segment").repartition(8, "k"),
        "aggregate": lambda df: aggregate(df).select("pk", "blob"),
        "clean": lambda df: aggregate(df).select("pk", F.when(F.expr(clean), F.col("blob")).alias("p")),
        "onepass": lambda df: fast_aggregate(in_jar(df), 8, 1 << 30, one_pass).where("clean").select("pk", "blob"),
        "ours": lambda df: reassemble(df).combined,
        "ours-files": lambda df: reassemble(df, options=files).combined,
        "save": reassemble,
        "save-files": lambda df: reassemble(df, options=files),
        "ours-sql": lambda df: reassemble(df, options=ReassemblyOptions(use_jar=False)).combined,
        "ours-split": lambda df: one_pass_split(df, one_pass),
        "listagg": listagg,
        "split": split,
    }
    variants = {name: variants[name] for name in VARIANTS if name in only}
    out = tempfile.mkdtemp(prefix="stages-")
    files = ReassemblyOptions(payload_dir=out + "-payloads")
    records: list[dict[str, Any]] = []
    for run in range(1, runs + 1):
        if jfr_file and run == min(2, runs):
            jfr(jvm_pid, "start", "name=stages", "settings=profile")
        for name, build in variants.items():
            before = {s["stageId"] for s in json.load(urllib.request.urlopen(api))}
            shutil.rmtree(out, ignore_errors=True)
            start, cpu, py = time.perf_counter(), cpu_seconds(jvm_pid), cpu_seconds(jvm_pid, children_only=True)
            try:
                write_result(build(spark.read.parquet(data)), out)
            except Exception as exc:  # recorded: the profile goes on without this variant
                records.append({"run": run, "variant": name, "error": f"{type(exc).__name__}: {exc}"[:300]})
                continue
            wall, cpu = time.perf_counter() - start, cpu_seconds(jvm_pid) - cpu
            py = cpu_seconds(jvm_pid, children_only=True) - py
            stages = [s for s in json.load(urllib.request.urlopen(api)) if s["stageId"] not in before]
            tasks = [
                round(s["executorRunTime"] / 1000, 2)
                for s in sorted(stages, key=lambda s: s["stageId"])
                if s["numTasks"] > 1
            ]
            load = os.getloadavg()[0]
            detail = [stage_detail(s) for s in sorted(stages, key=lambda s: s["stageId"]) if s["numTasks"] > 1]
            record = {"run": run, "variant": name, "wall": wall, "cpu": cpu, "python_cpu": py, "load": load}
            record["stages"] = tasks
            records.append(record | {"detail": detail})
            print(
                f"run {run} {name:<10} wall {wall:5.1f} s  cpu {cpu:5.1f} s (Python {py:4.1f})  load {load:4.1f}"
                f"  task seconds per stage {tasks}",
                flush=True,
            )
            for d in detail:
                print(f"    {d}", flush=True)
    if jfr_file:
        jfr(jvm_pid, "stop", "name=stages", f"filename={os.path.abspath(jfr_file)}")
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(out + "-payloads", ignore_errors=True)
    spark.stop()
    return records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.stages", description=__doc__)
    p.add_argument("data", help="a landing table directory (Parquet, column 'segment')")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--json", default=None, help="also write the records here")
    p.add_argument("--variants", default=",".join(DEFAULT), help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--jfr", default=None, help="record the JVM with JFR (runs 2 on) into this file")
    args = p.parse_args(argv)
    records = profile(args.data, args.runs, tuple(args.variants.split(",")), args.jfr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
