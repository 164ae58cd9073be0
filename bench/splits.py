"""Shuffle only what must meet: the batch job on two landing layouts of the same messages, next to a
shuffle floor and a copy floor.

``python -m bench.splits --gib 1 --segment-kib 64 --rounds 3 --work /tmp/splits-work --json FILE``
(``--quick``: 64 MiB of 64 KiB segments in 8 MiB files, one round, no warm-up round: a harness check;
``--cluster``: every case on a loopback standalone cluster, a master and two one-core workers on
127.0.0.1 as ``tests/support/cluster.py`` starts them for the deployment tests).

The same messages (``--per-message`` segments each, random payloads) land in two layouts of
Parquet files (binary column ``segment``), generated once into ``--work`` from a fixed seed:

* ``lander``: each message's rows together, consecutive, in one file, files of about
  ``--file-mib``; 2 % of the messages straddle two files (their first segments at the end of one
  file, the rest at the start of the next: several messages per file boundary), and 1 % have one
  duplicate row (an exact copy of one of their segments) in another, random file;
* ``scattered``: the same rows (duplicates included) spread at random over as many files.

Cases, each run in a fresh process (``python -m bench.splits child``: its own JVM and Python
workers, after an untimed run on a small warm-up table, its data read into the page cache untimed,
as ``bench.sparkcase`` does), rounds interleaved (round r starts with the r-th case), after
``--warmup-rounds`` whole rounds that are not counted:

* ``ours``: ``reassemble(df, ...).save(out)`` as ``reassemble run`` runs it: each scan task stages
  the messages complete in it, only references and the rest cross the shuffle;
* ``today``: the same with ``assemble_in_splits=False``: every row crosses the shuffle;
* ``shuffle-floor``: read, repartition by the message key (GroupId and MsgSeqNumber, a substring
  of the header at its fixed offset), write;
* ``copy-floor``: read, write; no shuffle: the physical limit of any plan.

Every case writes with the same Parquet settings (``sparkbench.write_result``). Each run records
its wall time, its process tree's CPU, and per stage (Spark's REST API, read once every stage of the
run is final): tasks, wall, task run time, task-thread CPU, input, output, shuffle write and read
bytes and records (``bench.stages.stage_detail``). Spark's shuffle-write bytes are the sum of its
task metrics over the run's stages: what every task wrote to the shuffle, as Spark counts it; they are
reported as a share of the landing table's bytes on disk.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
MiB, KiB = 1 << 20, 1 << 10
LAYOUTS = ("lander", "scattered")
OURS, TODAY, SHUFFLE, COPY = "ours", "today", "shuffle-floor", "copy-floor"
CASES = (OURS, TODAY, SHUFFLE, COPY)
KNOWN = (OURS, TODAY, SHUFFLE, COPY)
STRADDLE, DUPLICATE = 0.02, 0.01  # shares of the messages, lander layout
SEED = 39
RESULT = "RESULT "  # the child's one line of output the parent reads
# Stage sums kept per run (Spark's REST API names).
SUMS = (
    "inputBytes",
    "inputRecords",
    "outputBytes",
    "outputRecords",
    "shuffleWriteBytes",
    "shuffleWriteRecords",
    "shuffleReadBytes",
    "shuffleReadRecords",
)


# ---------------------------------------------------------------- data


def _write(path: Path, rows: list[bytes]) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"segment": pa.array(rows, pa.binary())}), path)
    return path.stat().st_size


def plan_lander(
    messages: list[list[bytes]], files: int, rng: random.Random
) -> tuple[list[list[bytes]], dict[str, int]]:
    """The lander-shaped files: each message's rows consecutive in one file, the messages in order, about
    the same number per file; 2 % straddle a file boundary (the last messages of a file, cut after a
    random segment: the first part stays at the end of that file, the rest opens the next file); 1 % get
    one duplicate row (a copy of one of their segments) between two messages of a random other file."""
    n = len(messages)
    bounds = [n * k // files for k in range(files + 1)]
    home = {i: [k] for k in range(files) for i in range(bounds[k], bounds[k + 1])}
    cuts: dict[int, int] = {}  # a straddling message -> how many of its rows stay in its first file
    if files > 1:
        want = max(1, round(STRADDLE * n))
        for b in range(files - 1):
            k = want // (files - 1) + (1 if b < want % (files - 1) else 0)
            for i in range(max(bounds[b], bounds[b + 1] - k), bounds[b + 1]):
                if len(messages[i]) > 1:
                    cuts[i] = rng.randrange(1, len(messages[i]))
                    home[i] = [b, b + 1]
    # Each file as runs of rows (a message, or its part), so that a duplicate lands between two runs.
    runs: list[list[list[bytes]]] = []
    opening: list[int] = []  # runs that open each file (the straddlers' rest): no duplicate before them
    for k in range(files):
        tails = [messages[i][cuts[i] :] for i in range(bounds[k - 1], bounds[k]) if i in cuts] if k else []
        runs.append(tails + [messages[i][: cuts.get(i)] for i in range(bounds[k], bounds[k + 1])])
        opening.append(len(tails))
    straddling = len(cuts)
    duplicates = 0
    if files > 1:
        pool = [i for i in range(n) if len(home[i]) < files]
        for i in sorted(rng.sample(pool, min(len(pool), max(1, round(DUPLICATE * n))))):
            row = rng.choice(messages[i])
            other = rng.choice([k for k in range(files) if k not in home[i]])
            runs[other].insert(rng.randrange(opening[other], len(runs[other]) + 1), [row])
            duplicates += 1
    out = [[r for run in file_runs for r in run] for file_runs in runs]
    return out, {"straddling": straddling, "duplicates": duplicates}


def make_layouts(
    root: Path, total: int, segment_size: int, per_message: int, file_bytes: int, seed: int = SEED
) -> dict[str, dict[str, Any]]:
    """Both layouts of the same messages under ``root`` (``lander/``, ``scattered/``), generated once
    (a ``_DONE`` marker; ``info.json`` holds what each layout is); their facts by layout."""
    info_file = root / "info.json"
    if (root / "_DONE").exists():
        return dict(json.loads(info_file.read_text()))
    from segmenter import Segmenter

    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    rng = random.Random(seed)
    seg = Segmenter(segment_size)
    size = seg.data_size * per_message
    n = max(1, total // size)
    messages = [[s.encode() for s in seg.segment(rng.randbytes(size), group_id=rng.randbytes(24))] for _ in range(n)]
    files = max(1, round(n * per_message * segment_size / file_bytes))
    lander, facts = plan_lander(messages, files, rng)
    del messages
    rows = [r for f in lander for r in f]
    rng.shuffle(rows)
    scattered = [rows[k * len(rows) // files : (k + 1) * len(rows) // files] for k in range(files)]
    del rows
    info: dict[str, dict[str, Any]] = {}
    for layout, parts in (("lander", lander), ("scattered", scattered)):
        d = root / layout
        d.mkdir()
        on_disk = sum(_write(d / f"part-{k:04d}.parquet", part) for k, part in enumerate(parts))
        info[layout] = {
            "layout": layout,
            "path": str(d),
            "messages": n,
            "payload_bytes": n * size,
            "segment": segment_size,
            "per_message": per_message,
            "rows": sum(len(p) for p in parts),
            "files": files,
            "file_bytes": on_disk,
            **facts,  # the same rows in both layouts: the facts say which messages must meet in the lander one
        }
    info_file.write_text(json.dumps(info, indent=1))
    (root / "_DONE").touch()
    return info


# ---------------------------------------------------------------- one case, in its own process


def case_plan(spark: Any, name: str, payload_dir: Path) -> Any:
    """The landing DataFrame -> what ``sparkbench.write_result`` writes for case ``name``."""
    from reassembly.spark import ReassemblyOptions, reassemble

    from .sparkbench import APPROACHES, approaches

    table = approaches(spark, payload_dir)

    def shuffled(df: Any) -> Any:  # the plan in which every row crosses the shuffle
        return reassemble(df, options=ReassemblyOptions(payload_dir=str(payload_dir), assemble_in_splits=False))

    plans = {
        OURS: table[APPROACHES[0]],  # reassemble(), saved as `reassemble run` saves
        TODAY: shuffled,
        SHUFFLE: table[APPROACHES[4]],  # by substring(segment, 17, 28): GroupId + MsgSeqNumber
        COPY: lambda df: df,
    }
    return plans[name]


def settled_stages(spark: Any, before: set[int], timeout: float = 30.0) -> list[dict[str, Any]]:
    """The stages since ``before``, once every one is final and two reads agree (the REST API is fed
    by a listener that may lag the job by a few milliseconds)."""
    from .sparkcase import stages

    deadline, last = time.monotonic() + timeout, None
    while True:
        got = [s for s in stages(spark) if s["stageId"] not in before]
        final = all(s["status"] in ("COMPLETE", "SKIPPED", "FAILED") for s in got)
        if (final and got == last) or time.monotonic() > deadline:
            return got
        last = got
        time.sleep(0.25)


SCAN_SHUFFLE, SCAN_WRITE, AFTER, OTHER = "scan+shuffle write", "scan+write", "shuffle read+write", "other jobs"
ROLES = (SCAN_SHUFFLE, SCAN_WRITE, AFTER, OTHER)


def role(s: dict[str, Any], scanned_to_shuffle: int) -> str:
    """A stage's part in the plan: the scan (it read the landing rows: ``inputRecords``; Spark's
    ``inputBytes`` misses what the Parquet reader reads, see :func:`run_record`), the stage after the
    scan's shuffle (it reads at least half of what the scan stages wrote), or another job's (the judge
    of the groups the one pass set aside, the quarantine, file listing)."""
    if s.get("inputRecords", 0):
        return SCAN_SHUFFLE if s.get("shuffleWriteBytes", 0) else SCAN_WRITE
    if scanned_to_shuffle and s.get("shuffleReadBytes", 0) * 2 >= scanned_to_shuffle:
        return AFTER
    return OTHER


def stage_record(s: dict[str, Any], scanned_to_shuffle: int = 0) -> dict[str, Any]:
    """One stage: its role, ``stage_detail`` (wall, task run time, CPU, GC, spill, MiB), exact sums."""
    from .stages import stage_detail

    return {
        "stageId": s["stageId"],
        "status": s["status"],
        "name": s.get("name", ""),
        "role": role(s, scanned_to_shuffle),
        **stage_detail(s),
        **{k: s.get(k, 0) for k in SUMS},
    }


def run_record(
    seconds: float, stage_list: list[dict[str, Any]], cpu: float, python_cpu: float, partitions: int
) -> dict[str, Any]:
    """A timed run: seconds, CPU, the stage sums over the run, each stage.

    Spark's ``inputBytes`` is kept but not used: with pyspark 4.3 the Parquet reader's reads of the
    column chunks do not reach it (64 MiB read, 2.9 KiB counted); ``inputRecords`` is exact, and the
    landing table's size on disk is the input the shuffle is measured against."""
    done = [s for s in stage_list if s["status"] != "SKIPPED"]
    scanned = sum(s.get("shuffleWriteBytes", 0) for s in done if s.get("inputRecords", 0))
    recs = [stage_record(s, scanned) for s in done]
    sums = {k: sum(r[k] for r in recs) for k in SUMS}
    scan = [r["tasks"] for r in recs if r["inputRecords"]]
    return {
        "seconds": seconds,
        "cpu_seconds": round(cpu, 2),  # the JVM and every process under it (stages.cpu_seconds)
        "python_cpu_seconds": round(python_cpu, 2),  # the Python workers alone
        "input_partitions": partitions,  # the scan's planned partitions
        "scan_tasks": scan[0] if scan else None,
        **sums,
        "stages": recs,
    }


def child(argv: list[str]) -> int:
    """``python -m bench.splits child --data D --warmup W --out O --case C``: one timed run, one RESULT line."""
    from reassembly._errors import first_line
    from reassembly.spark.engine.session import get_session

    from .sparkbench import write_result
    from .sparkcase import page_in, stages
    from .stages import cpu_seconds

    p = argparse.ArgumentParser(prog="python -m bench.splits child")
    p.add_argument("--data", required=True)
    p.add_argument("--warmup", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--case", required=True, choices=KNOWN)
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args(argv)
    conf = {"spark.driver.memory": "8g", "spark.ui.enabled": "true"} | dict(kv.split("=", 1) for kv in args.conf)
    spark = get_session("local[2]", app_name="bench-splits", conf=conf)
    spark.sparkContext.setLogLevel("OFF")
    pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    out = Path(args.out)
    plan = case_plan(spark, args.case, out.parent / "payloads")

    def run(data: str) -> float:
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(out.parent / "payloads", ignore_errors=True)
        page_in(Path(data))
        start = time.perf_counter()
        write_result(plan(spark.read.parquet(data)), out)
        return time.perf_counter() - start

    run(args.warmup)
    before = {s["stageId"] for s in stages(spark)}
    cpu0, py0 = cpu_seconds(pid), cpu_seconds(pid, children_only=True)
    try:
        seconds = run(args.data)
    except Exception as exc:  # recorded, not hidden
        print(RESULT + json.dumps({"seconds": None, "error": first_line(exc)}), flush=True)
        spark.stop()
        return 0
    cpu, py = cpu_seconds(pid) - cpu0, cpu_seconds(pid, children_only=True) - py0
    got = settled_stages(spark, before)
    partitions = spark.read.parquet(args.data).rdd.getNumPartitions()
    print(RESULT + json.dumps(run_record(seconds, got, cpu, py, partitions) | {"error": None}), flush=True)
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(out.parent / "payloads", ignore_errors=True)
    spark.stop()
    return 0


# ---------------------------------------------------------------- the parent


def run_case(data: Path, warmup: Path, out: Path, case: str, conf: dict[str, str] | None = None) -> dict[str, Any]:
    """``case`` on ``data`` in a fresh process: its RESULT record (or the error, if it died)."""
    cmd = [sys.executable, "-m", "bench.splits", "child", "--data", str(data), "--warmup", str(warmup)]
    cmd += ["--out", str(out), "--case", case, *(f"--conf={k}={v}" for k, v in (conf or {}).items())]
    with open(out.parent / "splits.log", "a") as log:  # Spark's chatter, kept for a post-mortem
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=log, text=True, cwd=HERE.parent, check=False)
    line = next((x for x in proc.stdout.splitlines() if x.startswith(RESULT)), None)
    if line is None:
        return {"seconds": None, "error": f"bench process exited {proc.returncode}"}
    return dict(json.loads(line[len(RESULT) :]))


def schedule(
    sets: list[tuple[int, str]], cases: list[str], rounds: int, warmup_rounds: int
) -> Iterator[tuple[int, int, str, str]]:
    """(round, segment size, layout, case), round after round; round r starts with the r-th case
    (as ``sparkbench.interleaved``); ``warmup_rounds`` rounds first, numbered 0, -1, ..."""
    for r in range(1 - warmup_rounds, rounds + 1):
        for segment, layout in sets:
            turn = (r - 1) % len(cases)
            for case in cases[turn:] + cases[:turn]:
                yield r, segment, layout, case


def _median(xs: Iterable[float | None]) -> float | None:
    got = [x for x in xs if x is not None]
    return statistics.median(got) if got else None


def _stage_roles(run: dict[str, Any]) -> dict[str, dict[str, float]]:
    """A run's stages summed by role: wall, task run time, task-thread CPU, stages."""
    out: dict[str, dict[str, float]] = {}
    for s in run.get("stages", []):
        r = out.setdefault(s["role"], {"stages": 0, "tasks": 0, "wall": 0.0, "run": 0.0, "cpu": 0.0})
        r["stages"] += 1
        r["tasks"] += s["tasks"]
        r["wall"] += s.get("wall", 0.0)
        r["run"] += s["run"]
        r["cpu"] += s["executorCpuTime"]
    return out


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (segment, layout, case): medians over its counted runs, and the medians of the
    per-round ratios of ``ours`` (and of the shuffle floor) to the floors of the same round."""
    groups: dict[tuple[int, str, str], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((r["segment"], r["layout"], r["case"]), []).append(r)
    by_round = {(r["segment"], r["layout"], r["case"], r["round"]): r["seconds"] for r in runs}

    def ratio(seg: int, layout: str, a: str, b: str) -> float | None:
        rounds = sorted({r for (s, lay, _c, r) in by_round if (s, lay) == (seg, layout)})
        per = [
            by_round[(seg, layout, a, r)] / by_round[(seg, layout, b, r)]  # type: ignore[operator]
            for r in rounds
            if by_round.get((seg, layout, a, r)) and by_round.get((seg, layout, b, r))
        ]
        return statistics.median(per) if per else None

    out = []
    for (seg, layout, case), rs in groups.items():
        ok = [r for r in rs if r["seconds"] is not None]
        row: dict[str, Any] = {
            "segment": seg,
            "layout": layout,
            "case": case,
            "seconds": _median(r["seconds"] for r in rs),
            "min": min((r["seconds"] for r in ok), default=None),
            "max": max((r["seconds"] for r in ok), default=None),
            "runs": [r["seconds"] for r in rs],
            "error": next((r["error"] for r in rs if r.get("error")), None),
            "cpu_seconds": _median(r.get("cpu_seconds") for r in ok),
            "python_cpu_seconds": _median(r.get("python_cpu_seconds") for r in ok),
            "input_partitions": _median(r.get("input_partitions") for r in ok),
            **{k: _median(r.get(k) for r in ok) for k in SUMS},
        }
        inp = rs[0].get("landing_bytes")
        row["landing_bytes"] = inp
        row["shuffle_write_pct"] = 100 * row["shuffleWriteBytes"] / inp if inp else None
        roles: dict[str, dict[str, float]] = {}
        per_run = [_stage_roles(r) for r in ok]
        for name in [x for x in ROLES if any(x in p for p in per_run)]:
            roles[name] = {
                m: _median(p[name][m] for p in per_run if name in p) or 0.0
                for m in ("stages", "tasks", "wall", "run", "cpu")
            }
        row["stage_roles"] = roles
        if case in (OURS, TODAY):
            row[f"{case}/copy-floor"] = ratio(seg, layout, case, COPY)
            row[f"{case}/shuffle-floor"] = ratio(seg, layout, case, SHUFFLE)
        if case == SHUFFLE:
            row["shuffle-floor/copy-floor"] = ratio(seg, layout, SHUFFLE, COPY)
        out.append(row)
    order = {c: i for i, c in enumerate(KNOWN)}
    return sorted(out, key=lambda r: (r["segment"], LAYOUTS.index(r["layout"]), order[r["case"]]))


def _size(n: float | None) -> str:
    from .report import _size as size

    return "-" if n is None else size(int(n))


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def table(results: dict[str, Any]) -> str:
    """The Markdown the command prints (and the README quotes): times, ratios, shuffle bytes, stages."""
    m = results["machine"]
    lb, la = results["load_before"], results["load_after"]
    lines = [
        f"Run {m['date']} on {m['cpu']}, {m['cores']} cores; pyspark {m['pyspark']}; {results['rounds']} round(s) "
        f"interleaved after {results['warmup_rounds']} warm-up round(s) not counted, each case in a fresh process; "
        f"load average {lb[0]:.1f} before, {la[0]:.1f} after.",
        "",
        "| segment | layout | files | input partitions | case | median s | min-max s | vs copy floor "
        "| vs shuffle floor | shuffle write | % of input | input (on disk) | output |",
        "|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    info = results["layouts"]
    for r in results["summary"]:
        facts = info.get(f"{r['segment']}/{r['layout']}", {})
        vs_copy = r.get(f"{r['case']}/copy-floor") or r.get("shuffle-floor/copy-floor")
        vs_shuffle = r.get(f"{r['case']}/shuffle-floor")
        spread = f"{_s(r['min'])}-{_s(r['max'])}" if r["min"] is not None else "-"
        shown = _s(r["seconds"]) if r["seconds"] is not None else f"failed: {r['error']}"
        pct = "-" if r["shuffle_write_pct"] is None else f"{r['shuffle_write_pct']:.1f} %"
        parts = "-" if r["input_partitions"] is None else f"{r['input_partitions']:.0f}"
        lines.append(
            f"| {_size(r['segment'])} | {r['layout']} | {facts.get('files', '-')} | {parts} | {r['case']} | {shown} "
            f"| {spread} | {_x(vs_copy)} | {_x(vs_shuffle)} | {_size(r['shuffleWriteBytes'])} | {pct} "
            f"| {_size(r['landing_bytes'])} | {_size(r['outputBytes'])} |"
        )
    lines += [
        "",
        "Ratios are medians of per-round ratios (the two cases of one round share the machine's load). "
        "Stages of each case (medians over its runs; wall = submission to completion, run = task time "
        "summed over tasks, CPU = task threads' CPU, Python workers not included):",
        "",
        "| segment | layout | case | stage | stages | tasks | wall s | task run s | task CPU s | process CPU s |",
        "|---:|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results["summary"]:
        for role, v in r["stage_roles"].items():
            lines.append(
                f"| {_size(r['segment'])} | {r['layout']} | {r['case']} | {role} | {v['stages']:.0f} "
                f"| {v['tasks']:.0f} | {v['wall']:.1f} | {v['run']:.1f} | {v['cpu']:.1f} | {_s(r['cpu_seconds'])} |"
            )
    lines += ["", "Layouts (the same rows in both):", ""]
    for facts in info.values():
        if facts["layout"] == "lander":
            lines.append(
                f"- {_size(facts['segment'])}: {facts['messages']:,} messages of {facts['per_message']} segments, "
                f"{facts['rows']:,} rows, {facts['files']} files ({_size(facts['file_bytes'])}); lander-shaped: "
                f"{facts['straddling']} messages straddle two files, {facts['duplicates']} have a duplicate row "
                f"in another file"
            )
    return "\n".join(lines) + "\n"


def results_name(results: dict[str, Any]) -> str:
    """``<date>-splits-<segments>``, e.g. ``2026-11-27-splits-64K``."""
    day = results["machine"]["date"].split()[0]
    segs = "-".join(f"{s // KiB}K" for s in results["segments"])
    return f"{day}-splits-{segs}{'-quick' if results.get('quick') else ''}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["child"]:
        return child(argv[1:])
    p = argparse.ArgumentParser(prog="python -m bench.splits", description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=1.0, help="payload per data set (default 1)")
    p.add_argument("--segment-kib", type=int, nargs="+", default=[64], help="segment sizes (default 64)")
    p.add_argument("--per-message", type=int, default=8, help="segments per message (default 8)")
    p.add_argument("--file-mib", type=float, default=64.0, help="landing file size (default 64)")
    p.add_argument("--rounds", type=int, default=3, help="counted runs of every case, interleaved (default 3)")
    p.add_argument("--warmup-rounds", type=int, default=1, help="whole rounds first, not counted (default 1)")
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(KNOWN)}")
    p.add_argument("--layouts", default=",".join(LAYOUTS), help="comma-separated, of lander, scattered")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="an extra Spark setting")
    p.add_argument("--work", default=None, help="where the data sets go (reused; default: a temp dir)")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--quick", action="store_true", help="64 MiB, 64 KiB segments, 8 MiB files, 1 round, no warm-up")
    p.add_argument(
        "--cluster", action="store_true", help="run every case on a loopback standalone cluster (two one-core workers)"
    )
    args = p.parse_args(argv)
    if args.cluster:
        sys.path.insert(0, str(HERE.parent))  # tests/support/cluster.py: the cluster the tests deploy to
        from tests.support.cluster import standalone_cluster

        with standalone_cluster(Path(tempfile.mkdtemp(prefix="splits-cluster-"))) as url:
            return _main(p, args, url)
    return _main(p, args, None)


def _main(p: argparse.ArgumentParser, args: argparse.Namespace, master: str | None) -> int:
    from .host import machine

    if args.quick:
        args.gib, args.segment_kib, args.file_mib, args.rounds, args.warmup_rounds = 1 / 16, [64], 8.0, 1, 0
    cases = args.cases.split(",")
    layouts = args.layouts.split(",")
    bad = [c for c in cases if c not in KNOWN] + [x for x in layouts if x not in LAYOUTS]
    if bad:
        p.error(f"unknown case or layout: {bad[0]}")
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="splits-"))
    work.mkdir(parents=True, exist_ok=True)
    conf = dict(kv.split("=", 1) for kv in args.conf) | ({} if master is None else {"spark.master": master})
    total = int(args.gib * 1024) * MiB
    from .sparkbench import make_dataset

    warm = work / ("warmup-4M" if args.quick else "warmup-32M")
    make_dataset(warm, (4 if args.quick else 32) * MiB, 64 * KiB, 8)
    info: dict[str, dict[str, Any]] = {}
    paths: dict[tuple[int, str], Path] = {}
    for kib in args.segment_kib:
        root = work / f"splits-{total // MiB}M-{kib}K-{args.per_message}-{args.file_mib:g}M"
        print(f"data {root.name} ...", flush=True)
        made = make_layouts(root, total, kib * KiB, args.per_message, int(args.file_mib * MiB))
        for layout in layouts:
            info[f"{kib * KiB}/{layout}"] = made[layout]
            paths[(kib * KiB, layout)] = Path(made[layout]["path"])
    results: dict[str, Any] = {
        "machine": machine(),
        "args": vars(args),
        "quick": args.quick,
        "segments": [k * KiB for k in args.segment_kib],
        "rounds": args.rounds,
        "warmup_rounds": args.warmup_rounds,
        "conf": conf,
        "layouts": info,
        "load_before": os.getloadavg(),
        "runs": [],
        "warmup_runs": [],
    }
    started = time.monotonic()
    partial = work / "splits.partial.json"
    sets = [(seg, layout) for seg in results["segments"] for layout in layouts]
    for r, seg, layout, case in schedule(sets, cases, args.rounds, args.warmup_rounds):
        rec = run_case(paths[(seg, layout)], warm, work / "out", case, conf)
        rec |= {"round": r, "warmup": r < 1, "segment": seg, "layout": layout, "case": case}
        rec["landing_bytes"] = info[f"{seg}/{layout}"]["file_bytes"]
        rec["load"] = os.getloadavg()[0]
        pct = (
            f"{100 * rec['shuffleWriteBytes'] / rec['landing_bytes']:.1f} % shuffled"
            if rec.get("seconds") is not None
            else rec.get("error")
        )
        print(f"round {r} {_size(seg)} {layout} {case}: {_s(rec['seconds'])} s, {pct} (load {rec['load']:.1f})",
              flush=True)  # fmt: skip
        results["warmup_runs" if rec["warmup"] else "runs"].append(rec)
        partial.write_text(json.dumps(results, indent=1))
    results["load_after"] = os.getloadavg()
    results["seconds_total"] = round(time.monotonic() - started)
    results["summary"] = summarize(results["runs"])
    text = table(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    partial.unlink(missing_ok=True)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
