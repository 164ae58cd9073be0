"""What the benchmarks ran on: recorded beside every result, since ratios hold per machine."""

from __future__ import annotations

import platform
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


def machine() -> dict[str, Any]:
    import psutil
    import pyarrow
    import pyspark
    import zstandard

    cpu = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            platform.processor(),
        )
        if Path("/proc/cpuinfo").exists()
        else platform.processor()
    )
    from reassembly.spark.engine.session import ensure_java

    return {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu,
        "cores": psutil.cpu_count(),
        "ram_gib": round(psutil.virtual_memory().total / (1 << 30), 1),
        "python": sys.version.split()[0],
        "pyspark": pyspark.__version__,
        "pyarrow": pyarrow.__version__,
        "zstandard": zstandard.__version__,
        "java_home": ensure_java(),
    }
