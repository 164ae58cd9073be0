"""One data set's Spark cases in a fresh process: ``python -m bench.sparkcase --data D --warmup W --out O NAME...``.

Prints ``BEGIN name``, then ``END name<TAB>seconds`` (or ``FAIL name<TAB>error``)
for each approach, so the parent (``sparkbench.run_cases``) can attribute the
memory it samples to the case that was running.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from reassembly.jobs import first_line
from reassembly.session import get_session
from reassembly.spark import ReassemblyResult

from .sparkbench import approaches


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sparkcase")
    p.add_argument("--data", required=True)
    p.add_argument("--warmup", required=True, help="a tiny data set: JIT and Python worker start-up paid there")
    p.add_argument("--out", required=True)
    p.add_argument("--keep", action="store_true", help="leave the last case's output and payload files")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="an extra Spark setting")
    p.add_argument("names", nargs="+")
    args = p.parse_args(argv)
    conf = {"spark.driver.memory": "8g"} | dict(kv.split("=", 1) for kv in args.conf)
    spark = get_session("local[2]", app_name="bench", conf=conf)
    spark.sparkContext.setLogLevel("OFF")
    out = Path(args.out)
    table = approaches(spark, out.parent / "payloads")

    def run(name: str, data: str) -> float:
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(out.parent / "payloads", ignore_errors=True)
        start = time.perf_counter()
        target = table[name](spark.read.parquet(data))
        if isinstance(target, ReassemblyResult):
            target.save(out)  # as `reassemble run` writes: messages/ and quarantine/
        else:
            target.write.parquet(str(out))
        return time.perf_counter() - start

    for name in args.names:
        run(name, args.warmup)
        print(f"BEGIN {name}", flush=True)
        try:
            seconds = run(name, args.data)
        except Exception as exc:  # recorded, not hidden: a baseline that cannot do a case says so
            print(f"FAIL {name}\t{first_line(exc)}", flush=True)
            continue
        print(f"END {name}\t{seconds}", flush=True)
    if not args.keep:
        shutil.rmtree(out, ignore_errors=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
