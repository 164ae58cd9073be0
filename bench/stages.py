"""Where the Spark path's time goes: task time per stage for the floor and for ours cut short at each step.

``python -m bench.stages DATA`` (a landing table from ``python -m bench``, e.g.
``/tmp/bench-work/data-1024M-64K-8``) runs, in one warm session, each variant
three times and prints the task seconds of the map stage (scan, header decoding,
shuffle write) and of the reduce stage (everything after the shuffle):

* ``floor``: shuffle the segments by message and write them;
* ``aggregate``: our routing and aggregate, write the concatenations;
* ``clean``: plus the JVM's clean test (CRC-32 of every message);
* ``ours``: the whole ``reassemble`` (plus the Python UDF operator and the row explode).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from typing import Any


def main(argv: list[str] | None = None) -> int:
    data = (argv or sys.argv[1:])[0]
    from pyspark.sql import functions as F

    from reassembly.session import get_session
    from reassembly.spark import jvm, reassemble
    from reassembly.spark.decode import decode_segments
    from segmenter.digest import NO_POLICY

    port = "4099"
    spark = get_session(
        "local[2]", conf={"spark.driver.memory": "8g", "spark.ui.enabled": "true", "spark.ui.port": port}
    )
    spark.sparkContext.setLogLevel("OFF")
    api = f"http://localhost:{port}/api/v1/applications/{spark.sparkContext.applicationId}/stages"

    def aggregate(df: Any) -> Any:
        return jvm.aggregate(jvm.route(decode_segments(df, "segment", 1 << 30), None), 8)

    variants: dict[str, Callable[[Any], Any]] = {
        "floor": lambda df: df.select(F.expr("substring(segment, 17, 28)").alias("k"), "segment").repartition(8, "k"),
        "aggregate": lambda df: aggregate(df).select("pk", "blob"),
        "clean": lambda df: aggregate(df).select("pk", F.when(F.expr(jvm.clean(NO_POLICY)), F.col("blob")).alias("p")),
        "ours": lambda df: reassemble(df).combined,
    }
    out = tempfile.mkdtemp(prefix="stages-")
    for run in range(3):
        for name, build in variants.items():
            before = {s["stageId"] for s in json.load(urllib.request.urlopen(api))}
            shutil.rmtree(out, ignore_errors=True)
            start = time.perf_counter()
            build(spark.read.parquet(data)).write.parquet(out)
            wall = time.perf_counter() - start
            stages = [s for s in json.load(urllib.request.urlopen(api)) if s["stageId"] not in before]
            tasks = [
                round(s["executorRunTime"] / 1000, 1)
                for s in sorted(stages, key=lambda s: s["stageId"])
                if s["numTasks"] > 1
            ]
            print(f"run {run + 1} {name:<10} wall {wall:5.1f} s   task seconds per stage {tasks}", flush=True)
    shutil.rmtree(out, ignore_errors=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
