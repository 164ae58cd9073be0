"""Run the benchmark suite: ``python -m bench [--quick] [--out DIR]``.

``python -m bench --only matrix [--rounds 3] [...]`` runs the batch-job matrix instead: ours
against the shuffle floor and ``listagg`` (:mod:`bench.jvmbench`; the other arguments go to it).

Writes ``results.json``, PNG plots and ``table.md`` into ``--out`` (default
``bench/results``); with the default it also rewrites the results section of
``bench/README.md``. Timings live here, never in tests.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import inprocess, report, sparkbench
from .host import machine

HERE = Path(__file__).parent


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:2] == ["--only", "matrix"]:
        from . import jvmbench

        return jvmbench.main(argv[2:])
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument(
        "--quick",
        action="store_true",
        help="small sizes, the Spark approaches in one process: a smoke run, not a measurement (about a minute)",
    )
    p.add_argument("--out", default=str(HERE / "results"), help="where results.json, plots and table.md go")
    p.add_argument("--work", default=None, help="scratch directory for generated data (default: a temp dir)")
    p.add_argument("--skip-spark", action="store_true")
    p.add_argument(
        "--skip-kafka", action="store_true", help="no Kafka case (bench.kafkabench; needs confluent-kafka)"
    )
    p.add_argument(
        "--only",
        choices=["matrix"],
        help="only the batch-job matrix of bench.jvmbench (must come first: --only matrix ...)",
    )
    p.add_argument(
        "--digests",
        action="store_true",
        help="only the digest comparison: CRC only, + SHA-256, + HMAC and the floor on 1 GiB (with --quick: 64 MiB)",
    )
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench-"))
    started = time.monotonic()
    if args.digests:
        return _digests(work, out, args.quick, started)
    results: dict[str, Any] = {"machine": machine(), "quick": args.quick}
    print("segmenter ...", flush=True)
    results["segmenter"] = inprocess.segmenter_cases(args.quick)
    print("assembler ...", flush=True)
    results["assembler"] = inprocess.assembler_cases(args.quick)
    results["spark"] = []
    if not args.skip_spark:
        for case in sparkbench.spark_cases(work, args.quick):
            print(f"spark {case['kind']} {case['bytes'] >> 20} MiB {case['approach']}: {case['seconds']}", flush=True)
            results["spark"].append(case)
            (out / "results.partial.json").write_text(json.dumps(results, indent=1))  # survives a crash
    if not args.skip_kafka:
        results["kafka"] = _kafka(args.quick)
    results["seconds_total"] = time.monotonic() - started
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "results.partial.json").unlink(missing_ok=True)
    table = report.markdown(results)
    (out / "table.md").write_text(table)
    report.plots(results, out)
    if out.resolve() == (HERE / "results").resolve():
        report.update_readme(HERE / "README.md", table)
    print(table)
    print(f"done in {results['seconds_total']:.0f} s; results in {out}")
    return 0


def _kafka(quick: bool) -> dict[str, Any]:
    """The Kafka case (:mod:`bench.kafkabench`), each case in a fresh process: 256 MiB per case, 5
    rounds after a warm-up round; ``--quick``: 8 MiB, one round, no warm-up (the harness only)."""
    from . import kafkabench

    print("kafka ...", flush=True)
    mib, rounds, warmup = (8, 1, 0) if quick else (256, 5, 1)
    kafka = kafkabench.run(mib, rounds, warmup, list(kafkabench.SIZES))
    print(kafkabench.table(kafka), flush=True)
    return kafka


def _digests(work: Path, out: Path, quick: bool, started: float) -> int:
    """The cost of SHA-256 and HMAC-SHA-256 next to CRC only, as ratios to the floor of the same run."""
    cases = []
    for case in sparkbench.digest_cases(work, quick):
        print(f"spark digests {case['bytes'] >> 20} MiB {case['approach']}: {case['seconds']}", flush=True)
        cases.append(case)
    results = {"machine": machine(), "quick": quick, "digests": cases, "seconds_total": time.monotonic() - started}
    (out / "digests.json").write_text(json.dumps(results, indent=1))
    print(report.digest_table(cases))
    return 0


if __name__ == "__main__":
    sys.exit(main())
