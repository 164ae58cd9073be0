"""The bundled jar (``jars/segmenter-jvm.jar``, source in ``jvm/src``, built by ``tools/build_jar.py``).

It holds what the header table's SQL cannot do cheaply: ``segmenter_crc32_combine``
folds the per-segment CRCs (verified in the map stage) into the whole message's
CRC, so the clean test never makes a second pass over a message's bytes. A
session without the jar still works: :func:`enable` says so and the job checks
the message CRC with Spark's ``crc32`` over the concatenation (same rows, slower).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

COMBINE = "segmenter_crc32_combine"  # the SQL function name the job registers
_CLASS = "segmenter.jvm.Crc32Combine"


def jar_path() -> str:
    """Absolute path of the bundled jar: pass it as ``spark.jars`` (or ``--jars``) to your session."""
    return str(Path(__file__).with_name("jars") / "segmenter-jvm.jar")


def is_connect(spark: Any) -> bool:
    return type(spark).__module__.startswith("pyspark.sql.connect")


def add_jar(spark: Any) -> None:
    """Add the jar to a running session: an artifact of a Connect session, ``ADD JAR`` on a classic one."""
    if is_connect(spark):
        spark.addArtifacts(jar_path())
    else:
        spark.sql(f"ADD JAR '{jar_path()}'")


def enable(spark: Any) -> bool:
    """Register the jar's function in ``spark``; False (nothing registered) if the jar is not loaded.

    A Connect session gets the jar as an artifact first (artifacts are private to their session).
    """
    if is_connect(spark):
        # An artifact already added under this name, or a server refusing artifacts: the lookup below decides.
        with contextlib.suppress(Exception):
            add_jar(spark)
    try:
        spark.udf.registerJavaFunction(COMBINE, _CLASS, "bigint")
    except Exception:  # class not found: a session started without the jar
        return False
    return True
