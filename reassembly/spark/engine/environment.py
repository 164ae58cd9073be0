"""What a SparkSession needs to run this library, for a session you built yourself.

:func:`reassembly.spark.engine.session.get_session` builds a session with everything set before it starts
(``DEFAULT_CONF``, the workers' Python, Java). A session built elsewhere (your own builder, a
notebook's, spark-submit's) is already running, so :func:`configure` sets what a running session
still accepts and says what it cannot:

* **set**: the Arrow batch bounds (64 MiB per batch: the memory bound in README "Limits" assumes it),
  ``spark.sql.codegen.hugeMethodLimit`` where the session lets it change, and the streaming state
  store (RocksDB, changelog checkpointing, state partitions);
* **loaded**: the bundled jar (``ADD JAR``: the one pass), where the session allows it; where it does
  not (Spark Connect, platforms that refuse jars) :func:`reassembly.spark.reassemble` takes the SQL
  path: the same rows, slower;
* **checked**: that the workers' Python can import the library (:func:`check_worker_python`), or it
  raises :class:`WorkerPythonError` in one line naming the fix; ``ship=True`` sends the library's
  pure-Python packages to the workers first;
* **reported**: what only a new session can change (the driver's memory in local mode, a static
  ``hugeMethodLimit``), in the returned :class:`Configured` and one logged warning.

The worker check runs one tiny task once per SparkContext (per session on Spark Connect) and is
cached; :func:`configure` runs it, and so do the first :func:`~reassembly.spark.reassemble` and
:func:`~reassembly.spark.reassemble_stream` on a session: the one eager step of those lazy
functions. Without it, a worker Python that lacks the library fails only at the first write, as
``ModuleNotFoundError`` in hundreds of lines of worker stderr.

Environment failures raise :class:`~reassembly.spark.engine.session.SparkEnvironmentError` (reason 9060
``ENVIRONMENT_ERROR``; :class:`WorkerPythonError` here), of the library's error family
(:class:`~segmenter.errors.SegmentationError`): catch it, or read ``err.reason``, like any other
refusal of the library. Nothing here imports pyspark at import time.
"""

from __future__ import annotations

import atexit
import enum
import hashlib
import importlib
import io
import json
import logging
import re
import shutil
import tempfile
import threading
import weakref
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reassembly._errors import first_line
from reassembly.spark.engine import bridge
from reassembly.spark.engine.session import DEFAULT_CONF, SparkEnvironmentError
from reassembly.spark.engine.state_store import CHANGELOG, PROVIDER, ROCKSDB

logger = logging.getLogger(__name__)

LIBRARY = ("reassembly", "segmenter", "refmsg")
"""The library's top-level packages: what a worker imports to run its functions, and what ``ship`` sends."""
DEPENDENCIES = ("pyarrow", "zstandard", "crc32c", "isal")
"""Compiled modules the library imports on the workers: shipping cannot carry them, they must be installed."""
DISTRIBUTION = "segment-reassembly"
"""The library's distribution name (its metadata; its wheel is ``segment_reassembly-*.whl``)."""

# Runtime SQL settings of the library's session that configure() sets on yours.
RUNTIME = (
    "spark.sql.execution.arrow.pyspark.enabled",
    "spark.sql.execution.arrow.maxBytesPerBatch",  # the memory bound assumes 64 MiB per input batch
    "spark.sql.execution.arrow.maxRecordsPerBatch",
    "spark.sql.codegen.hugeMethodLimit",  # static in some Spark builds: then reported, not set
)
DRIVER_MEMORY = "spark.driver.memory"
SHIP_HINT = "configure(spark, ship=True)"


class WorkerPythonError(SparkEnvironmentError):
    """The Spark workers' Python cannot import the library (or cannot run a task at all)."""


@dataclass(frozen=True)
class WorkerPython:
    """What the probe task found in a worker's Python."""

    executable: str
    """The path of the worker's Python (its ``sys.executable``)."""
    python: str
    """The worker Python's version (``3.11.7``)."""
    missing: tuple[str, ...]
    """Modules of LIBRARY and DEPENDENCIES it cannot import."""
    library: str | None
    """The version pip installed there, if any (a shipped zip has none)."""
    requested: str | None = None
    """The Python Spark was told to start (spark.pyspark.python, PYSPARK_PYTHON)."""

    @property
    def ok(self) -> bool:
        return not self.missing


@dataclass(frozen=True)
class Configured:
    """What :func:`configure` did to a session, and what it could not do."""

    applied: dict[str, str]
    """Settings it set: key -> value."""
    cannot: dict[str, str]
    """What a running session cannot take, or refused: key -> what differs and how to fix it."""
    jar: bool
    """The bundled jar loads (the one pass); False: reassemble() takes the SQL path."""
    partitions: int
    """``spark.sql.shuffle.partitions`` as set (the state partitions of a new stream)."""
    workers: WorkerPython | None = None
    """What the worker check found (None: check_workers=False)."""
    shipped: str | None = None
    """The zip of the library's packages added to the session (ship=True)."""
    warnings: tuple[str, ...] = field(default=(), repr=False)
    """The lines logged as a warning."""


# ------------------------------------------------------------------ the worker check

# The probe runs on a worker whose Python may lack the library, so it must not be pickled by reference
# to this module (unpickling would import reassembly there and fail before it can report anything):
# compiled into a namespace no process can import, cloudpickle sends it by value.
_PROBE = """
def probe(_):
    import importlib.util, json, platform, sys
    missing = []
    for name in NAMES:
        try:
            found = importlib.util.find_spec(name) is not None
        except Exception:  # an import system that refuses the name: as good as absent
            found = False
        if not found:
            missing.append(name)
    library = None
    if not any(name in missing for name in LIBRARY):
        try:
            from importlib.metadata import version
            library = version(DISTRIBUTION)
        except Exception:  # shipped, not installed
            library = None
    return json.dumps([sys.executable, platform.python_version(), missing, library])
"""


def _probe_function() -> Callable[[Any], str]:
    namespace: dict[str, Any] = {
        "__name__": "reassembly_worker_probe",
        "NAMES": (*LIBRARY, *DEPENDENCIES),
        "LIBRARY": LIBRARY,
        "DISTRIBUTION": DISTRIBUTION,
    }
    exec(compile(_PROBE, "<reassembly worker probe>", "exec"), namespace)
    probe: Callable[[Any], str] = namespace["probe"]
    return probe


_checked: weakref.WeakKeyDictionary[Any, WorkerPython] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _key(spark: Any) -> Any:
    """What a check is cached under: the SparkContext (its workers' Python is fixed with it); on Spark
    Connect, which has none, the session."""
    return spark if bridge.is_connect(spark) else spark.sparkContext


def probe_workers(spark: Any) -> WorkerPython:
    """Run the probe: one task of one row on a worker, asking its Python what it can import.

    It uses a plain (pickled, not Arrow) Python UDF, so a worker without pyarrow still answers.
    A worker that cannot run a Python task at all (no such executable, another Python version than
    the driver's) raises :class:`WorkerPythonError` with Spark's root cause in one line.

    ``spark``: the session whose workers are asked.
    """
    from pyspark.sql import functions as F

    probe = F.udf(_probe_function(), "string", useArrow=False)
    try:
        (row,) = spark.range(1, numPartitions=1).select(probe("id").alias("probe")).collect()
    except Exception as exc:
        logger.debug("worker probe failed", exc_info=True)
        raise WorkerPythonError(f"the Spark workers' Python cannot run a task: {first_line(exc)}") from None
    executable, python, missing, library = json.loads(row["probe"])
    requested = None if bridge.is_connect(spark) else str(spark.sparkContext.pythonExec)
    return WorkerPython(str(executable), str(python), tuple(missing), library, requested)


class SessionKind(enum.Enum):
    """How a session was made, which decides how its workers' Python is chosen (and so the fix)."""

    BUILDER = "builder"
    """This process launched the JVM (``SparkSession.builder``, ``get_session``): the workers run
    ``PYSPARK_PYTHON`` as this process's environment held it when the context started (else
    ``python3`` from PATH); the setting ``spark.pyspark.python`` is read by spark-submit only."""
    SPARK_SUBMIT = "spark-submit"
    """spark-submit started this process: ``--conf spark.pyspark.python`` (else ``PYSPARK_PYTHON``
    in spark-submit's environment) names the workers' Python, ``--archives`` can carry one."""
    PLATFORM = "platform"
    """The JVM was started elsewhere (a managed platform's or a notebook's cluster, Spark Connect):
    the platform's cluster settings choose the workers' Python."""


def session_kind(spark: Any) -> SessionKind:
    """How ``spark`` was made (:class:`SessionKind`)."""
    from reassembly.spark.engine.session import submitted

    if bridge.is_connect(spark):
        return SessionKind.PLATFORM
    if submitted():
        return SessionKind.SPARK_SUBMIT
    gateway = getattr(spark.sparkContext, "_gateway", None)
    return SessionKind.BUILDER if getattr(gateway, "proc", None) is not None else SessionKind.PLATFORM


WHEEL = "pip install segment_reassembly-*.whl, the wheel pip wheel builds from the library's source"
"""How to install the library where it is missing: from its wheel (it is not on the package index)."""

_POINT = {
    SessionKind.BUILDER: (
        "set PYSPARK_PYTHON to a Python that has it in this process's environment before the session starts"
        " (os.environ['PYSPARK_PYTHON'] = sys.executable; the builder ignores spark.pyspark.python)"
    ),
    SessionKind.SPARK_SUBMIT: (
        "pass spark-submit --conf spark.pyspark.python=PYTHON naming a Python that has it on every node"
        " (or --archives env.tar.gz#environment --conf spark.pyspark.python=./environment/bin/python)"
    ),
    SessionKind.PLATFORM: "install it on the cluster (the platform's cluster libraries or its environment)",
}


def _refusal(w: WorkerPython, kind: SessionKind = SessionKind.BUILDER) -> str:
    """The one line for a worker Python that lacks something: what, where, and the fixes that apply to
    a session made as ``kind`` (each one works for that kind of session)."""
    lacking = [n for n in LIBRARY if n in w.missing]
    compiled = [n for n in DEPENDENCIES if n in w.missing]
    told = f"{w.requested}, which runs {w.executable}" if w.requested not in (None, w.executable) else w.executable
    where = f"the Spark workers' Python ({told})"
    install = f"install the library there ({WHEEL})" if kind is not SessionKind.PLATFORM else _POINT[kind]
    point = "" if kind is SessionKind.PLATFORM else f", or {_POINT[kind]}"
    if lacking and not compiled:
        return f"{where} cannot import {', '.join(lacking)}: {install}{point}, or ship it ({SHIP_HINT})"
    return (
        f"{where} cannot import {', '.join(lacking + compiled)} ({', '.join(compiled)}: compiled, so shipping"
        f" cannot carry {'it' if len(compiled) == 1 else 'them'}): {install}{point}"
    )


def check_worker_python(spark: Any) -> WorkerPython:
    """What the workers' Python holds; :class:`WorkerPythonError` (one line, the fix) if it cannot run
    the library. Runs the probe once per SparkContext (per session on Spark Connect); later calls
    return the cached answer. A failed check is not cached: fix it (``ship=True``) and call again.

    ``spark``: the session whose workers are checked.
    """
    key = _key(spark)
    with _lock:
        known = _checked.get(key)
    if known is not None:
        return known
    found = probe_workers(spark)
    if not found.ok:
        raise WorkerPythonError(
            _refusal(found, session_kind(spark)), executable=found.executable, missing=list(found.missing)
        )
    with _lock:
        _checked[key] = found
    logger.info("Spark workers' Python %s (Python %s) imports the library", found.executable, found.python)
    return found


# ------------------------------------------------------------------ shipping the library

_zip_lock = threading.Lock()
_zip: Path | None = None


def library_zip() -> Path:
    """A zip of the library's pure-Python packages (``*.py`` of :data:`LIBRARY`, as installed here), built
    once per process in a temporary directory removed at exit. Its name holds a digest of its content:
    Spark refuses a second file of one name with other content, so a changed library gets a new name.
    The compiled decoder (``segmenter._fastwire``) is not in it: workers then use the Python decoder."""
    global _zip
    with _zip_lock:
        if _zip is not None and _zip.exists():
            return _zip
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
            for name in LIBRARY:
                root = Path(importlib.import_module(name).__file__ or "").parent
                for path in sorted(root.rglob("*.py")):
                    if "__pycache__" not in path.parts:
                        info = zipfile.ZipInfo(f"{name}/{path.relative_to(root).as_posix()}", (1980, 1, 1, 0, 0, 0))
                        z.writestr(info, path.read_bytes(), zipfile.ZIP_DEFLATED)
        data = buffer.getvalue()
        directory = Path(tempfile.mkdtemp(prefix="reassembly-ship-"))
        atexit.register(shutil.rmtree, directory, True)
        _zip = directory / f"reassembly-library-{hashlib.sha256(data).hexdigest()[:16]}.zip"
        _zip.write_bytes(data)
        return _zip


def ship_library(spark: Any) -> Path:
    """Add :func:`library_zip` to the session's Python path on every worker (``addArtifacts(pyfile=True)``:
    ``SparkContext.addPyFile`` on a classic session, an artifact on Spark Connect).

    Enough where the workers have the library's compiled dependencies (:data:`DEPENDENCIES`) but not the
    library. The driver keeps the packages it imported: the zip is put on ``sys.path`` here too (by
    pyspark, in local mode), so they are imported first, and packages already imported are not looked up
    on the path again.

    ``spark``: the session the library is added to.
    """
    for name in LIBRARY:
        importlib.import_module(name)
    path = library_zip()
    spark.addArtifacts(str(path), pyfile=True)
    with _lock:
        _checked.pop(_key(spark), None)
    logger.info("shipped the library's Python packages to the Spark workers as %s", path.name)
    return path


# ------------------------------------------------------------------ configure

_SIZE = re.compile(r"(\d+)\s*([kmgtp]?)b?", re.I)


def _mebibytes(text: str) -> int | None:
    """A JVM memory size (``4g``, ``4096m``, ``512``: MiB without a unit) in MiB; None if unreadable."""
    m = _SIZE.fullmatch(text.strip())
    if m is None:
        return None
    scale = {"": 1, "k": 1 / 1024, "m": 1, "g": 1024, "t": 1 << 20, "p": 1 << 30}[m.group(2).lower()]
    return int(int(m.group(1)) * scale)


def _get(spark: Any, key: str) -> str | None:
    try:
        value = spark.conf.get(key, None)
    except Exception:  # a key the session does not expose
        return None
    return None if value is None else str(value)


def _modifiable(spark: Any, key: str) -> bool:
    try:
        return bool(spark.conf.isModifiable(key))
    except Exception:
        return False


def _master(spark: Any) -> str:
    return _get(spark, "spark.master") or ("" if bridge.is_connect(spark) else str(spark.sparkContext.master))


def configure(
    spark: Any, partitions: int | None = None, *, ship: bool = False, check_workers: bool = True
) -> Configured:
    """Do to ``spark`` what the library's own session does, where a running session allows it.

    Sets the Arrow batch bounds (``spark.sql.execution.arrow.*``), ``hugeMethodLimit`` (where it may
    change), the streaming state store (RocksDB, changelog checkpointing) and the shuffle partitions
    (``partitions``; default: the cores Spark has, which a stream's state wants: every micro-batch pays a
    fixed cost per state partition; Spark fixes the number into a checkpoint at its first start, so a
    resumed stream keeps its own); loads the bundled jar; with ``ship=True`` sends the library's
    Python packages to the workers; then checks the workers' Python (:func:`check_worker_python`,
    :class:`WorkerPythonError` if it cannot run the library; ``check_workers=False`` skips it).

    Returns :class:`Configured`; what it cannot do is in ``cannot`` and logged as one warning."""
    applied: dict[str, str] = {}
    cannot: dict[str, str] = {}
    for key in RUNTIME:
        want = DEFAULT_CONF[key]
        if _modifiable(spark, key):
            spark.conf.set(key, want)
            applied[key] = want
        elif (now := _get(spark, key)) != want:
            cannot[key] = f"is {now or 'unset'}, the library's session uses {want}: set it when the session starts"
    if partitions is None:
        partitions = (
            int(_get(spark, "spark.sql.shuffle.partitions") or 200)  # Connect: keep the session's setting
            if bridge.is_connect(spark)
            else int(spark.sparkContext.defaultParallelism)
        )
    for key, value in {PROVIDER: ROCKSDB, CHANGELOG: "true", "spark.sql.shuffle.partitions": str(partitions)}.items():
        spark.conf.set(key, value)
        applied[key] = value
    if _master(spark).startswith("local"):  # local mode: the tasks run in the driver's JVM
        want = DEFAULT_CONF[DRIVER_MEMORY]
        now = _get(spark, DRIVER_MEMORY) or "1g"
        if (_mebibytes(now) or 0) < (_mebibytes(want) or 0):
            cannot[DRIVER_MEMORY] = (
                f"is {now}, the library's session uses {want} (local mode: every task runs in the driver's JVM):"
                f" set it before the JVM starts (spark-submit --driver-memory {want}, or the builder's config)"
            )
    loaded = bridge.reassembler(spark) is not None
    if not loaded:
        why = "Spark Connect has no py4j to call it through" if bridge.is_connect(spark) else "the session refused it"
        cannot["spark.jars"] = (
            f"the bundled jar cannot be loaded ({why}): reassemble() takes the SQL path (same rows, slower;"
            " docs/how-to/own-session.md)"
        )
    shipped = str(ship_library(spark)) if ship else None
    workers = check_worker_python(spark) if check_workers else None
    lines = tuple(f"{key} {why}" for key, why in cannot.items())
    if lines:
        logger.warning("configure: %s", "; ".join(lines))
    return Configured(applied, cannot, loaded, partitions, workers, shipped, lines)


__all__ = [
    "DEPENDENCIES",
    "LIBRARY",
    "SessionKind",
    "Configured",
    "SparkEnvironmentError",
    "WorkerPython",
    "WorkerPythonError",
    "check_worker_python",
    "configure",
    "library_zip",
    "probe_workers",
    "session_kind",
    "ship_library",
]
