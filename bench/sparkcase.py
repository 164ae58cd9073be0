"""One data set's Spark cases in a fresh process: ``python -m bench.sparkcase --data D --warmup W --out O NAME...``.

Prints ``BEGIN name``, then ``END name<TAB>seconds`` (or ``FAIL name<TAB>error``)
for each approach, so the parent (``sparkbench.run_cases``) can attribute the
memory it samples to the case that was running. ``--stages`` also prints
``STAGES name<TAB>json``: each stage of the timed run with its wall clock and its
task threads' CPU (``bench.stages.stage_detail``), where a fresh process spends it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from reassembly._errors import first_line
from reassembly.spark.engine.session import get_session

from .sparkbench import approaches, write_result
from .stages import stage_detail


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sparkcase")
    p.add_argument("--data", required=True)
    p.add_argument("--warmup", required=True, help="a tiny data set: JIT and Python worker start-up paid there")
    p.add_argument("--out", required=True)
    p.add_argument("--keep", action="store_true", help="leave the last case's output and payload files")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="an extra Spark setting")
    p.add_argument("--stages", action="store_true", help="print each timed stage's wall clock and CPU")
    p.add_argument("names", nargs="+")
    args = p.parse_args(argv)
    conf = {"spark.driver.memory": "8g"} | dict(kv.split("=", 1) for kv in args.conf)
    if args.stages:
        conf["spark.ui.enabled"] = "true"
    spark = get_session("local[2]", app_name="bench", conf=conf)
    spark.sparkContext.setLogLevel("OFF")
    out = Path(args.out)
    table = approaches(spark, out.parent / "payloads")

    def run(name: str, data: str) -> float:
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(out.parent / "payloads", ignore_errors=True)
        page_in(Path(data))
        start = time.perf_counter()
        write_result(table[name](spark.read.parquet(data)), out)
        return time.perf_counter() - start

    for name in args.names:
        run(name, args.warmup)
        before = {s["stageId"] for s in stages(spark)} if args.stages else set()
        print(f"BEGIN {name}", flush=True)
        try:
            seconds = run(name, args.data)
        except Exception as exc:  # recorded, not hidden: a baseline that cannot do a case says so
            print(f"FAIL {name}\t{first_line(exc)}", flush=True)
            continue
        print(f"END {name}\t{seconds}", flush=True)
        if args.stages:
            print(f"STAGES {name}\t{json.dumps(new_stages(spark, before))}", flush=True)
    if not args.keep:
        shutil.rmtree(out, ignore_errors=True)
    spark.stop()
    return 0


def page_in(data: Path) -> None:
    """Read every file of ``data`` once, untimed, so that the timed run finds it in the page cache.

    A small page cache, reclaimed by the host between cases, makes whichever case comes first
    after another data set read it from disk (seconds per GiB). The landing table's read costs
    every approach the same; it is left out of all of them alike."""
    for f in sorted(data.rglob("*") if data.is_dir() else [data]):
        if f.is_file():
            with open(f, "rb", buffering=0) as src:
                while src.read(64 << 20):
                    pass


def stages(spark: Any) -> list[dict[str, Any]]:
    """Every stage of the session so far (Spark's REST API), by id."""
    import urllib.request

    api = f"{spark.sparkContext.uiWebUrl}/api/v1/applications/{spark.sparkContext.applicationId}/stages"
    return sorted(json.load(urllib.request.urlopen(api)), key=lambda s: s["stageId"])


def new_stages(spark: Any, before: set[int]) -> list[dict[str, Any]]:
    """The stages run since ``before`` (their ids), those with more than one task, with their detail."""
    got = [s for s in stages(spark) if s["stageId"] not in before and s["numTasks"] > 1]
    return [{"stageId": s["stageId"]} | stage_detail(s) for s in got]


if __name__ == "__main__":
    sys.exit(main())
