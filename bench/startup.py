"""Where ``reassemble``'s start-up goes: ``run`` on a one-file table and the first micro-batch of
``stream``, split into phases.

    python -m bench.startup --rounds 5 --json FILE     # 16 min a round at a load average of 20-30
    python -m bench.startup --quick                    # one round, no warm-up: checks the harness

Every case runs in a fresh process (its own interpreter, its own JVM), the cases of a round one
after another, round r starting with the r-th case (rounds interleaved, so a shared machine's drift
falls on every case alike), after a warm-up round that is run and not counted (kept in the JSON as
``warmup``). Each figure is the median of the rounds, with the least and the most beside it.

* ``python``: the interpreter alone (``python -c pass``), the floor under every other case.
* ``imports``: ``import reassembly.cli.main``, what the command imports before it parses.
* ``jvm``: PySpark's JVM launched and its gateway answering, and nothing else: the floor of any
  Spark session (``jvm`` in the table is the launch itself, measured inside the process).
* ``session``: the session ``reassemble`` makes (every setting given as it is built, none after),
  then the bundled jar loaded into it (``session``, ``jar``).
* ``run``: ``reassemble run`` on a one-file table of 200 segments of 4 KiB, with the phases its
  ``--summary-json`` records: ``python_start`` (process start to ``main``), ``footers``,
  ``spark_start``, ``input``, ``jar``, ``read``, ``reassemble`` (the first jobs, which pay the fresh
  JVM's class loading and compilation, and the write), ``summary``.
* ``stream``: ``reassemble stream`` (available-now) over the same file: ``python_start``,
  ``spark_start``, ``first_batch`` (Spark's duration of the first micro-batch, from its status
  line) and the whole ``stream`` phase (query start, the batch, the stop).
* ``run@base``, ``stream@base`` (``--compare CHECKOUT``): the same with the library of another
  checkout, interleaved with the others (a before-and-after under the same load).

``wall`` is each process's whole life as the parent saw it (exit included: the command ends the
JVM it started before it exits). A case that fails (on a loaded machine Spark may time out a Python
worker starting) is kept in the JSON under ``failed`` and not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CASES = ("python", "imports", "jvm", "session", "run", "stream")

_JVM = """
import json, time
from reassembly.spark.engine.session import ensure_java
ensure_java()
t = time.monotonic()
from pyspark.java_gateway import launch_gateway
gateway = launch_gateway()
jvm = time.monotonic() - t
gateway.shutdown()
print(json.dumps({"jvm": jvm}))
"""

_SESSION = """
import json, time
from reassembly.spark.engine.session import end_jvm, get_session
from reassembly.spark.engine.bridge import reassembler
t = time.monotonic()
spark = get_session("local[2]", app_name="reassemble", quiet=True)
session = time.monotonic() - t
t = time.monotonic()
reassembler(spark)
jar = time.monotonic() - t
end_jvm()
print(json.dumps({"session": session, "jar": jar}))
"""

_STATUS = re.compile(r"batch (\d+) \((\d+\.\d)s\):")


def landing(directory: Path, segments: int = 200, size: int = 4096) -> Path:
    """A one-file landing table of whole messages (``segments`` segments of ``size`` bytes)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from segmenter import segment

    directory.mkdir(parents=True, exist_ok=True)
    rows = [
        s.encode() for i in range(segments // 4) for s in segment(os.urandom(4 * size - 400), max_segment_size=size)
    ]
    pq.write_table(pa.table({"segment": pa.array(rows[:segments], pa.binary())}), directory / "part-0.parquet")
    return directory


def _python(*args: str) -> list[str]:
    return [sys.executable, *args]


def run_case(case: str, work: Path, data: Path, base: str | None = None) -> dict[str, Any]:
    """One case in a fresh process: its wall time and its phases (seconds). ``CASE@base``: the same
    case with the library imported from ``base`` (another checkout: a before-and-after in one run)."""
    name = case
    case, at, _ = case.partition("@")
    scratch = Path(tempfile.mkdtemp(prefix=f"{case}-", dir=work))
    summary = scratch / "summary.json"
    argv = {
        "python": _python("-c", "pass"),
        "imports": _python("-c", "import reassembly.cli.main"),
        "jvm": _python("-c", _JVM),
        "session": _python("-c", _SESSION),
        "run": _python(
            "-m", "reassembly", "run", str(data), str(scratch / "out"), "--no-progress", "--summary-json", str(summary)
        ),
        "stream": _python(
            "-m",
            "reassembly",
            "stream",
            str(data),
            str(scratch / "out"),
            "--checkpoint",
            str(scratch / "ck"),
            "--summary-json",
            str(summary),
        ),
    }[case]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    if at:
        if base is None:
            raise ValueError(f"case {name}: no --compare checkout given")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [base, env.get("PYTHONPATH")]))
    start = time.monotonic()
    cwd = base if at else None  # the working directory comes first on sys.path: the checkout's own
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=1800, check=False)
    wall = time.monotonic() - start
    if done.returncode != 0:
        raise RuntimeError(f"{name} exited {done.returncode}: {done.stderr[-2000:]}")
    phases: dict[str, float] = {}
    if case in ("jvm", "session"):
        phases = json.loads(done.stdout.strip().splitlines()[-1])
    elif case in ("run", "stream"):
        phases = {k: v for k, v in json.loads(summary.read_text())["durations_seconds"].items() if v is not None}
        phases.pop("total", None)
        if case == "stream":
            first = _STATUS.search(done.stdout)
            if first is None:
                raise RuntimeError(f"stream printed no status line: {done.stdout[-2000:]}")
            phases["first_batch"] = float(first.group(2))
    shutil.rmtree(scratch, ignore_errors=True)
    return {"case": name, "wall": round(wall, 3), "phases": {k: round(float(v), 3) for k, v in phases.items()}}


def order(rounds: int, cases: tuple[str, ...] = CASES) -> list[list[str]]:
    """Each round's cases, round r starting with the r-th case (interleaved, rotated)."""
    return [list(cases[r % len(cases) :] + cases[: r % len(cases)]) for r in range(rounds)]


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 3), "min": min(values), "max": max(values)}


def medians(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per case: the wall time's and each phase's median, least and most over the counted rounds."""
    out: dict[str, dict[str, Any]] = {}
    for case in dict.fromkeys(r["case"] for r in runs):
        mine = [r for r in runs if r["case"] == case]
        names = list(dict.fromkeys(k for r in mine for k in r["phases"]))
        out[case] = {
            "wall": _spread([r["wall"] for r in mine]),
            "phases": {k: _spread([r["phases"][k] for r in mine if k in r["phases"]]) for k in names},
        }
    return out


def table(result: dict[str, Any]) -> str:
    """The Markdown table: a row per case, its wall time and its phases (median, least-most)."""
    lines = ["| case | wall s, median (min-max) | phases, median s |", "|---|---:|---|"]
    for case, m in result["medians"].items():
        w = m["wall"]
        phases = ", ".join(f"{k} {v['median']:.2f}" for k, v in m["phases"].items()) or "-"
        lines.append(f"| {case} | {w['median']:.2f} ({w['min']:.2f}-{w['max']:.2f}) | {phases} |")
    return "\n".join(lines)


def _load() -> str:
    try:
        return " / ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.startup", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5, help="rounds counted (default 5)")
    p.add_argument("--warmup-rounds", type=int, default=1, help="whole rounds run first, not counted (default 1)")
    p.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    p.add_argument("--quick", action="store_true", help="one round, no warm-up")
    p.add_argument("--work", default=None, help="scratch directory (default: a temporary one, removed)")
    p.add_argument("--json", default=None, help="write the runs and medians here")
    p.add_argument(
        "--compare",
        metavar="CHECKOUT",
        default=None,
        help="also run the run and stream cases with the library of another checkout (cases run@base, stream@base)",
    )
    args = p.parse_args(argv)
    rounds, warmup = (1, 0) if args.quick else (args.rounds, args.warmup_rounds)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench-startup-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        data = landing(work / "landing")
        cases = tuple(args.cases) + (
            tuple(f"{c}@base" for c in args.cases if c in ("run", "stream")) if args.compare else ()
        )
        load_before = _load()
        started = time.monotonic()
        runs: list[dict[str, Any]] = []
        warm: list[dict[str, Any]] = []
        failed: list[dict[str, Any]] = []
        for r, names in enumerate(order(warmup + rounds, cases)):
            for case in names:
                try:
                    got = run_case(case, work, data, args.compare) | {"round": r}
                except RuntimeError as exc:  # kept in the JSON, not counted (a loaded machine times workers out)
                    failed.append({"case": case, "round": r, "error": str(exc)[-2000:]})
                    print(f"round {r} {case}: FAILED {str(exc)[:300]}", file=sys.stderr)
                    continue
                (warm if r < warmup else runs).append(got)
                print(f"round {r}{' (warm-up)' if r < warmup else ''} {case}: {got['wall']:.2f} s", file=sys.stderr)
            if args.json:  # after every round: an interrupted run keeps what it measured
                partial = {"rounds_done": r + 1, "runs": runs, "warmup": warm, "failed": failed}
                Path(args.json).with_suffix(".partial.json").write_text(json.dumps(partial, indent=1) + "\n")
        result = {
            "machine": {
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "load_before": load_before,
                "load_after": _load(),
                "at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            },
            "rounds": rounds,
            "warmup_rounds": warmup,
            "seconds": round(time.monotonic() - started, 1),
            "compare": args.compare,
            "runs": runs,
            "warmup": warm,
            "failed": failed,
            "medians": medians(runs),
        }
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    m = result["machine"]
    print(f"{m['at']}, {m['cpus']} cores, load average {m['load_before']} before, {m['load_after']} after;"
          f" {rounds} round(s) after {warmup} warm-up round(s), {result['seconds']:.0f} s in all")  # fmt: skip
    print(table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
