"""The bundled jar (``jars/segmenter-jvm.jar``, source in ``jvm/src``, built by ``tools/build_jar.py``).

It holds the one-pass reassembly of the fast path (``segmenter.jvm.Reassemble``,
used by :func:`reassembly.spark.batch.grouping.fast_aggregate`): called through py4j on the
session's Dataset, so only a classic session (local or cluster, PySpark driver)
can use it. A Spark Connect client has no py4j: there the job runs the SQL path
(``listagg`` + the SQL clean test), which gives the same rows, slower. So does a
classic session where the jar cannot be loaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

CLASS = "segmenter.jvm.Reassemble"


def jar_path() -> str:
    """Absolute path of the bundled jar: pass it as ``spark.jars`` (or ``--jars``) to your session."""
    return str(Path(__file__).parent.parent / "jars" / "segmenter-jvm.jar")


def is_connect(spark: Any) -> bool:
    return type(spark).__module__.startswith("pyspark.sql.connect")


def reassembler(spark: Any) -> Any | None:
    """The jar's ``Reassemble`` class in ``spark``'s JVM (``ADD JAR`` first if needed), or None.

    None on Spark Connect (no py4j) and where the jar cannot be loaded: the caller takes the SQL path.
    """
    if is_connect(spark):
        return None
    jvm = spark.sparkContext._jvm
    if not _loadable(jvm):
        try:
            spark.sql(f"ADD JAR '{jar_path()}'")
        except Exception:  # a session that refuses to add jars: the SQL path
            return None
        if not _loadable(jvm):
            return None
    return jvm.segmenter.jvm.Reassemble


def _loadable(jvm: Any, name: str = CLASS) -> bool:
    """Whether ``name`` loads, asked first without a Java exception: pyspark converts one under an
    ``except BaseException: pass`` (``CapturedException.__str__``), so a Ctrl-C that lands while it does
    is lost, and the expected ClassNotFoundException before ``ADD JAR`` would make that window every job's."""
    from py4j.protocol import Py4JError  # type: ignore[import-untyped]

    loader = jvm.Thread.currentThread().getContextClassLoader()
    if loader.getResource(name.replace(".", "/") + ".class") is None:
        return False
    try:
        jvm.java.lang.Class.forName(name, True, loader)  # a class that is there but does not link: the SQL path
    except Py4JError:
        return False
    return True
