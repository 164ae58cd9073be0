"""The batch job's benchmark in one run: ours (validated) next to what a user would write, and the floor.

``python -m bench.jvmbench --rounds 3 --work /tmp/bench-work --readme`` (also
``python -m bench --only matrix --rounds 3``):

* the matrix: 1 GiB at 16 KiB, 64 KiB and 1 MiB segments and 4 GiB at 64 KiB, 8 segments per
  message; ours, (a) SQL ``listagg``, (b) ``collect_list`` + concat, (c) ``applyInPandas``
  ``b''.join`` and (d) the shuffle floor; every case ``--rounds`` times, interleaved (round 1
  of every case, then round 2, ...), each in a fresh process, after ``--warmup-rounds`` whole
  rounds that are not counted (default 1: see ``sparkbench.interleaved``); the median is
  reported, every run (warm-up ones too) is kept in the JSON;
* one ``--large-gib`` message (default 8 GiB of 1 MiB segments) streamed to a payload file,
  its file checked by size and CRC-32, every process kind's peak RSS (``bench.largecase``);
* where the time goes: ``bench.stages`` on each 1 GiB data set (task seconds per stage).

Writes ``<date>-spark-matrix-<HHMM>.json`` and ``.md`` (the generated part of the README section;
the run's UTC start) into ``--out``; ``--readme`` also replaces that part of ``bench/README.md``. ``--scale`` shrinks
every matrix data set (0.25: 256 MiB and 1 GiB) for a run that only proves the harness.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import largecase, sparkbench, stages
from .host import machine
from .report import _size

HERE = Path(__file__).parent
MiB, KiB = 1 << 20, 1 << 10
MATRIX = ((1024 * MiB, 16 * KiB, 8), (1024 * MiB, 64 * KiB, 8), (1024 * MiB, 1024 * KiB, 8), (4096 * MiB, 64 * KiB, 8))
GOAL = 1.15  # ours within this of the floor, and faster than listagg
BEGIN, END = "<!-- MATRIX:BEGIN -->", "<!-- MATRIX:END -->"
OURS, LISTAGG, FLOOR = sparkbench.APPROACHES[0], sparkbench.APPROACHES[1], sparkbench.APPROACHES[4]


def shapes(scale: float) -> list[tuple[int, int, int]]:
    """The matrix, each total scaled (whole MiB, at least 16 MiB)."""
    return [(max(16, int(total * scale) // MiB) * MiB, seg, per) for total, seg, per in MATRIX]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.jvmbench", description=__doc__)
    p.add_argument("--rounds", type=int, default=3, help="runs of every case, interleaved (default 3)")
    p.add_argument("--warmup-rounds", type=int, default=1, help="whole rounds first, not counted (default 1)")
    p.add_argument("--scale", type=float, default=1.0, help="shrink the matrix data sets (default 1: 1 and 4 GiB)")
    p.add_argument("--large-gib", type=float, default=8.0, help="the single message's size; 0 skips it")
    p.add_argument("--stage-runs", type=int, default=2, help="stage-profile runs per 1 GiB data set; 0 skips it")
    p.add_argument("--pyspark-memory", default="", help="spark.executor.pyspark.memory for the large case")
    p.add_argument("--work", default=None, help="scratch directory for generated data (default: a temp dir)")
    p.add_argument("--out", default=str(HERE / "results"), help="where the results JSON and its .md go")
    p.add_argument("--readme", action="store_true", help="replace the generated part of bench/README.md's section")
    p.add_argument("--render", metavar="JSON", help="no run: the section from a results file (partial ones too)")
    p.add_argument("--large-json", metavar="JSON", help="with --render: the large case from bench.largecase --json")
    args = p.parse_args(argv)
    if args.render:
        return render(Path(args.render), args.large_json, args.readme)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench-"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    started = time.monotonic()
    results: dict[str, Any] = {
        "machine": machine(),
        "rounds": args.rounds,
        "warmup_rounds": args.warmup_rounds,
        "scale": args.scale,
        "runs": [],
        "warmup_runs": [],
    }
    results["load_before"] = os.getloadavg()
    partial = out / "spark-matrix.partial.json"
    warm = work / "warmup-32M"
    sparkbench.make_dataset(warm, 32 * MiB, 64 * KiB, 8)
    data = sparkbench.datasets(work, "matrix", shapes(args.scale))
    cases = sparkbench.interleaved(data, sparkbench.APPROACHES, warm, work / "out", args.rounds, args.warmup_rounds)
    for case in cases:
        case["load"] = os.getloadavg()[0]
        print(f"round {case['round']} {_size(case['bytes'])} {_size(case['segment'])} {case['approach']}: "
              f"{case['seconds']} (load {case['load']:.1f})", flush=True)  # fmt: skip
        results["warmup_runs" if case["warmup"] else "runs"].append(case)
        partial.write_text(json.dumps(results, indent=1))  # survives a crash
    results["summary"] = sparkbench.summarize(results["runs"])
    results["stages"] = []
    for _, src, info in data if args.stage_runs else ():
        if info["bytes"] <= 1024 * MiB:
            print(f"stages {src.name} ...", flush=True)
            results["stages"].append({**info, "records": stage_profile(src, args.stage_runs, work)})
            partial.write_text(json.dumps(results, indent=1))
    if args.large_gib:
        print(f"single {args.large_gib:g} GiB message ...", flush=True)
        size, conf = int(args.large_gib * 1024) * MiB, largecase.conf(args.pyspark_memory)
        results["large"] = largecase.run(work, size, 1024 * KiB, conf, keep_data=False)
    results["load_after"] = os.getloadavg()
    results["seconds_total"] = time.monotonic() - started
    name = stem(results)
    (out / f"{name}.json").write_text(json.dumps(results, indent=1))
    partial.unlink(missing_ok=True)
    text = section(results)
    (out / f"{name}.md").write_text(text)
    if args.readme:
        update_readme(HERE / "README.md", text)
    print(text)
    return 0


def render(results_file: Path, large_json: str | None, readme: bool) -> int:
    """Write the section from a saved run (``spark-matrix.partial.json`` of an interrupted run too)."""
    r = json.loads(results_file.read_text())
    r["summary"] = sparkbench.summarize(r["runs"])
    if "seconds_total" not in r:
        r |= {"partial": True, "load_after": r["load_before"], "seconds_total": 0}
    if large_json:
        r["large"] = json.loads(Path(large_json).read_text())
    text = section(r)
    if readme:
        update_readme(HERE / "README.md", text)
    print(text)
    return 0


def stem(r: dict[str, Any]) -> str:
    """A run's file name: its UTC start and the case, e.g. ``2026-11-25-spark-matrix-0958``."""
    day, clock = r["machine"]["date"].split()[:2]
    return f"{day}-spark-matrix-{clock.replace(':', '')}"


def stage_profile(src: Path, runs: int, work: Path) -> list[dict[str, Any]]:
    """``bench.stages`` on one data set in its own process; its records."""
    target = work / f"stages-{src.name}.json"
    cmd = [sys.executable, "-m", "bench.stages", str(src), "--runs", str(runs), "--json", str(target)]
    with open(work / "stages.log", "a") as log:
        subprocess.run(cmd, stdout=log, stderr=log, cwd=HERE.parent, check=False)
    return list(json.loads(target.read_text())) if target.exists() else [{"error": "stage profile failed"}]


def _secs(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def _warmups(n: int) -> str:
    return f" after {n} warm-up round{'s' if n > 1 else ''} not counted (kept in the JSON)" if n else ""


def section(r: dict[str, Any]) -> str:
    """The generated part of the README section: machine, tables, verdicts, large case, stage profile."""
    m = r["machine"]
    lb, la = r["load_before"], r["load_after"]
    lines = [
        f"Run {m['date']} on {m['cpu']}, {m['cores']} cores, {m['ram_gib']} GiB; Python {m['python']}, "
        f"pyspark {m['pyspark']}, pyarrow {m['pyarrow']}; {r['rounds']} round(s) interleaved (round r starts with the "
        f"r-th approach){_warmups(r.get('warmup_rounds', 0))}, each case in a fresh process after a 32 MiB warm-up, "
        f"its data set read into the page cache "
        f"untimed; load average {lb[0]:.1f} before, {la[0]:.1f} after; "
        f"{r['seconds_total'] / 60:.0f} min in all.",
        *(["", "**Interrupted run: only the cases in the table were measured.**"] if r.get("partial") else []),
        "",
        "| data | segment | approach | median s | min-max s | MiB/s | vs floor | vs listagg "
        "| JVM peak | Py workers peak (all) | largest Py process |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    summary = r["summary"]

    def median_of(c: dict[str, Any], approach: str) -> float | None:
        return next(
            (
                s["seconds"]
                for s in summary
                if s["approach"] == approach and (s["bytes"], s["segment"]) == (c["bytes"], c["segment"])
            ),
            None,
        )

    verdicts = []
    for c in summary:
        secs, floor, listagg = c["seconds"], median_of(c, FLOOR), median_of(c, LISTAGG)
        shown = _secs(secs) if secs is not None else f"failed: {c['error']}"
        spread = f"{_secs(c['min'])}-{_secs(c['max'])}" if secs is not None else "-"
        rate = f"{c['bytes'] / MiB / secs:.0f}" if secs else "-"
        peaks = " | ".join(_size(c[k]) for k in ("peak_jvm_rss", "peak_python_workers_rss", "peak_python_worker_rss"))
        lines.append(
            f"| {_size(c['bytes'])} | {_size(c['segment'])} | {c['approach']} | {shown} | {spread} | {rate} "
            f"| {_ratio(secs, floor)} | {_ratio(secs, listagg)} | {peaks} |"
        )
        if c["approach"] == OURS:
            met = bool(secs and floor and listagg and secs < listagg and secs <= GOAL * floor)
            verdicts.append(
                f"- {_size(c['bytes'])} x {_size(c['segment'])}: ours {_ratio(secs, floor)} the floor, "
                f"{_ratio(secs, listagg)} listagg: goal **{'met' if met else 'not met'}**"
            )
    lines += ["", f"Goal (ours faster than `listagg` and within {GOAL}x of the floor, medians):", "", *verdicts]
    if r.get("large"):
        lines += ["", *large_lines(r["large"])]
    if r.get("stages"):
        lines += ["", *stage_lines(r["stages"])]
    return "\n".join(lines) + "\n"


def large_lines(c: dict[str, Any]) -> list[str]:
    """The single huge message: time, peaks per process kind, and the payload file's check."""
    if c.get("seconds") is None:
        return [f"**Single {_size(c['bytes'])} message**: failed: {c.get('error') or c.get('detail')}"]
    check = (
        f"payload file {c['file_bytes']:,} bytes, CRC-32 {c['file_crc32']:08x}: "
        f"{'matches the generator' if c['ok'] else 'DOES NOT match'}"
        if "file_bytes" in c
        else f"not checked: {c.get('detail')}"
    )
    cap = c["conf"].get("spark.executor.pyspark.memory")
    return [
        f"**Single {_size(c['bytes'])} message** ({c['per_message']:,} segments of {_size(c['segment'])}, "
        f"`large_message_bytes` {_size(sparkbench.LARGE_MESSAGE_BYTES)}"
        f"{f', spark.executor.pyspark.memory={cap}' if cap else ''}): {c['seconds']:.0f} s "
        f"({c['bytes'] / MiB / c['seconds']:.0f} MiB/s), status {c.get('status')}, {c.get('quarantined')} quarantined; "
        f"{check}. Peak RSS: driver {_size(c['peak_driver_rss'])}, JVM {_size(c['peak_jvm_rss'])}, "
        f"Python workers {_size(c['peak_python_workers_rss'])} together, largest single Python process "
        f"{_size(c['peak_python_worker_rss'])} (goal: under 512 MiB: "
        f"**{'met' if c['peak_python_worker_rss'] < 512 * MiB else 'not met'}**).",
    ]


def stage_lines(profiles: list[dict[str, Any]]) -> list[str]:
    """Task seconds per stage (medians over runs), and the reduce-stage cost each step adds."""
    lines = [
        "Where the time goes (`python -m bench.stages`, one warm session per data set, task seconds summed "
        "over both cores, medians; map = scan, decoding, shuffle write; reduce = everything after the shuffle):",
        "",
        "| data | segment | variant | wall s | map task s | reduce task s | reduce over previous step |",
        "|---:|---:|---|---:|---:|---:|---:|",
    ]
    for p in profiles:
        previous = None
        for variant in stages.VARIANTS:
            recs = [x for x in p["records"] if x.get("variant") == variant and "stages" in x and x["stages"]]
            if not recs:
                err = next((x.get("error") for x in p["records"] if x.get("variant") == variant), None)
                if err is None:  # a variant this results file predates: not a failure
                    continue
                lines.append(f"| {_size(p['bytes'])} | {_size(p['segment'])} | {variant} | {err} | | | |")
                continue
            wall = statistics.median(x["wall"] for x in recs)
            mapped = statistics.median(x["stages"][0] for x in recs)
            reduce = statistics.median(sum(x["stages"][1:]) for x in recs)
            step = "-" if previous is None else f"{reduce - previous:+.1f}"
            previous = reduce
            lines.append(
                f"| {_size(p['bytes'])} | {_size(p['segment'])} | {variant} | {wall:.1f} | {mapped:.1f} "
                f"| {reduce:.1f} | {step} |"
            )
    lines += [
        "",
        "Variants: `floor` shuffles the segments by message and writes them; `aggregate` is our routing and "
        "JVM aggregate (concatenation) written out; `clean` adds the JVM clean test (every CRC-32); `ours` is "
        "the whole `reassemble` (with the Python operator and the row explode); `split` (not adopted) splits the "
        "plan after the shuffle into a JVM-only branch for clean messages and a judge branch for the rest, each "
        "running the aggregate and the clean test over one reused exchange (its step is over `ours`).",
    ]
    return lines


def update_readme(path: Path, text: str) -> None:
    """Replace what lies between the MATRIX markers of ``path``."""
    readme = path.read_text()
    head, rest = readme.split(BEGIN, 1)
    path.write_text(f"{head}{BEGIN}\n{text}{END}{rest.split(END, 1)[1]}")


if __name__ == "__main__":
    sys.exit(main())
