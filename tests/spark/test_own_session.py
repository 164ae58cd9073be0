"""A SparkSession the user built (not ``get_session``): ``configure()``, the worker check, shipping the library.

The sessions whose workers lack the library run in their own Python processes (one session per
process; the suite's shared session is not touched): a plain ``SparkSession.builder`` whose
``PYSPARK_PYTHON`` is this venv's Python with the library taken out of its import system
(tests/support/no_library.py), as on a machine where only pyspark and pyarrow are installed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import reassembly.spark
import reassembly.spark.stream
from reassembly.spark import Configured, WorkerPythonError, configure, reassemble
from reassembly.spark.engine.environment import (
    DEPENDENCIES,
    LIBRARY,
    WHEEL,
    SessionKind,
    WorkerPython,
    _probe_function,
    _refusal,
    check_worker_python,
    library_zip,
    session_kind,
)
from reassembly.spark.engine.session import DEFAULT_CONF, root_cause
from reassembly.spark.engine.state_store import CHANGELOG, PROVIDER, ROCKSDB
from reassembly.spark.testdata import generate, write_parquet
from segmenter.errors import Reason, SegmentationError
from tests.support.no_library import environment_without_library, python_without_library

REPO = Path(__file__).resolve().parents[2]

# A user's job: their own builder, then the library's functions. MODE "plain" calls reassemble() as is;
# "ship" calls configure(spark, ship=True) first; "environment" sets PYSPARK_PYTHON to its own Python
# before the builder. The rows go to OUT as Parquet. Two shuffle partitions, as configure() would set
# on two cores: with Spark's 200 the library's shuffle (which takes the session's number as given)
# wrote these 16 messages through 200 tasks, 16 s of the job's 20; what is checked here does not
# depend on it.
JOB = """
import sys
from pyspark.sql import SparkSession

mode, landing, out = sys.argv[1:4]
if mode == "environment":  # the fix the one line names for a builder's session
    import os

    os.environ["PYSPARK_PYTHON"] = sys.executable
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "2").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
from reassembly.spark import configure, reassemble

if mode == "ship":
    done = configure(spark, ship=True)
    print("shipped", done.shipped is not None, "jar", done.jar, "workers ok", done.workers.ok)
result = reassemble(spark.read.parquet(landing))
result.combined.write.parquet(out)
print("written")
"""


@pytest.fixture(scope="module")
def landing(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ds = generate(n_messages=16, segments_per_message=3, segment_size=2048, groups=2)  # every fault kind
    return write_parquet(ds, tmp_path_factory.mktemp("landing"), files=2)


def _user_job(mode: str, landing: Path, out: Path, tmp_path: Path) -> Any:
    return subprocess.run(
        [sys.executable, "-c", JOB, mode, str(landing), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,  # not the repository: its packages must not be found from the working directory
        env=environment_without_library(tmp_path / "no-library"),
    )


def _rows(table: Any) -> list[tuple[Any, ...]]:
    """Every row as a tuple, in one order (rows have no order of their own)."""
    return sorted((tuple(r.values()) for r in table.to_pylist()), key=repr)


def test_a_worker_python_without_the_library_fails_at_once_in_one_line(landing: Path, tmp_path: Path) -> None:
    done = _user_job("plain", landing, tmp_path / "out", tmp_path)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "reassembly.spark.engine.environment.WorkerPythonError: [9060 ENVIRONMENT_ERROR] the Spark workers' Python ("
    ), done.stderr[-3000:]
    assert last.endswith(
        f"cannot import reassembly, segmenter, refmsg: install the library there ({WHEEL}), or set PYSPARK_PYTHON"
        " to a Python that has it in this process's environment before the session starts"
        " (os.environ['PYSPARK_PYTHON'] = sys.executable; the builder ignores spark.pyspark.python),"
        " or ship it (configure(spark, ship=True))"
    )
    assert str(tmp_path / "no-library" / "python") in last  # the Python Spark was told to use
    # raised by reassemble() on the driver before any job: no worker traceback, nothing written
    assert done.stderr.count("Traceback") == 1 and "ModuleNotFoundError" not in done.stderr
    assert "written" not in done.stdout and not (tmp_path / "out").exists()


def test_configure_ship_makes_the_same_job_work_with_the_library_sessions_rows(
    spark: Any, landing: Path, tmp_path: Path
) -> None:
    done = _user_job("ship", landing, tmp_path / "out", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "shipped True jar True workers ok True" in done.stdout  # the check passed once shipped
    got = pq.read_table(tmp_path / "out")
    want = reassemble(spark.read.parquet(str(landing))).combined.toArrow()
    assert got.num_rows == want.num_rows > 0
    assert _rows(got.select(want.schema.names)) == _rows(want)


def test_the_builder_s_fix_the_line_names_makes_the_same_job_work(landing: Path, tmp_path: Path) -> None:
    """PYSPARK_PYTHON set in the job's own environment before its builder runs: the workers import the
    library (the environment it was started with named a Python without it)."""
    done = _user_job("environment", landing, tmp_path / "out", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "written" in done.stdout and pq.read_table(tmp_path / "out").num_rows > 0


def test_configure_sets_what_a_running_session_takes_and_reports_the_rest(spark: Any) -> None:
    session = spark.newSession()  # its own SQL settings: the shared session's stay as they are
    before = check_worker_python(session)
    done = configure(session, 3)
    assert isinstance(done, Configured) and done.jar and done.partitions == 3
    for key in (
        "spark.sql.execution.arrow.maxBytesPerBatch",
        "spark.sql.execution.arrow.maxRecordsPerBatch",
        "spark.sql.execution.arrow.pyspark.enabled",
    ):
        assert done.applied[key] == DEFAULT_CONF[key] == session.conf.get(key)
    assert done.applied[PROVIDER] == ROCKSDB == session.conf.get(PROVIDER)
    assert session.conf.get(CHANGELOG) == "true" and session.conf.get("spark.sql.shuffle.partitions") == "3"
    # the library's session: 4g and every runtime setting already as wanted: nothing to report
    assert done.cannot == {} and done.warnings == ()
    assert done.workers == before  # checked once per SparkContext, then cached
    assert (
        done.workers is not None and done.workers.ok and done.workers.python == ".".join(map(str, sys.version_info[:3]))
    )
    assert configure(session).partitions == spark.sparkContext.defaultParallelism  # default: the cores


def test_one_configure_for_batch_and_streams() -> None:
    assert reassembly.spark.configure is reassembly.spark.stream.configure
    assert "configure" in reassembly.spark.__all__ and "Configured" in reassembly.spark.__all__
    assert issubclass(WorkerPythonError, SegmentationError)
    assert WorkerPythonError("x").reason == Reason.ENVIRONMENT_ERROR == 9060


def test_the_refusal_is_one_line_naming_what_is_missing_and_the_fixes_that_apply() -> None:
    worker = WorkerPython("/usr/bin/python3", "3.11.2", LIBRARY, None, "python3")
    lacking = _refusal(worker)
    assert lacking == (
        "the Spark workers' Python (python3, which runs /usr/bin/python3) cannot import reassembly, segmenter,"
        f" refmsg: install the library there ({WHEEL}), or set PYSPARK_PYTHON to a Python that has it in this"
        " process's environment before the session starts (os.environ['PYSPARK_PYTHON'] = sys.executable;"
        " the builder ignores spark.pyspark.python), or ship it (configure(spark, ship=True))"
    )
    submitted = _refusal(worker, SessionKind.SPARK_SUBMIT)
    assert submitted.endswith(
        f"install the library there ({WHEEL}), or pass spark-submit --conf spark.pyspark.python=PYTHON naming a"
        " Python that has it on every node (or --archives env.tar.gz#environment --conf"
        " spark.pyspark.python=./environment/bin/python), or ship it (configure(spark, ship=True))"
    )
    platform = _refusal(worker, SessionKind.PLATFORM)
    assert platform.endswith(
        "install it on the cluster (the platform's cluster libraries or its environment),"
        " or ship it (configure(spark, ship=True))"
    )
    compiled = _refusal(WorkerPython("/opt/py/bin/python", "3.11.2", ("zstandard", "isal"), None, "/opt/py/bin/python"))
    assert compiled.startswith("the Spark workers' Python (/opt/py/bin/python) cannot import zstandard, isal")
    assert "shipping cannot carry them" in compiled and "ship it" not in compiled
    for line in (lacking, submitted, platform, compiled):
        assert "\n" not in line and "pip install segment-reassembly" not in line


def test_the_session_kind_is_the_builder_s_for_a_session_this_process_launched(spark: Any) -> None:
    assert session_kind(spark) is SessionKind.BUILDER


def test_the_probe_travels_by_value(tmp_path: Path) -> None:
    """The probe must unpickle where the library is absent: by value, not as a reference to this module."""
    from pyspark import cloudpickle  # what pyspark pickles a UDF with

    blob = cloudpickle.dumps(_probe_function())
    assert b"reassembly.spark" not in blob
    code = "import pickle, sys; print(pickle.loads(sys.stdin.buffer.read())(0))"
    python = python_without_library(tmp_path / "no-library")
    done = subprocess.run([str(python), "-c", code], input=blob, capture_output=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    executable, _, missing, library = json.loads(done.stdout)
    assert executable == sys.executable and missing == list(LIBRARY) and library is None
    assert not set(DEPENDENCIES) & set(missing)


def test_the_shipped_zip_holds_the_library_sources_and_nothing_compiled() -> None:
    names = set(zipfile.ZipFile(library_zip()).namelist())
    source = {str(p.relative_to(REPO)) for top in LIBRARY for p in (REPO / top).rglob("*.py")}
    assert names == source
    assert library_zip() == library_zip()  # built once per process


@pytest.mark.parametrize(
    ("output", "cause"),
    [
        (
            [
                "WARNING: Using incubator modules: jdk.incubator.vector",
                "26/11/27 01:00:34 WARN Utils: Set SPARK_LOCAL_IP if you need to bind to another address",
                "Exception in thread \"main\" org.apache.spark.SparkException: When running with master 'yarn'"
                " either HADOOP_CONF_DIR or YARN_CONF_DIR must be set in the environment.",
                "\tat org.apache.spark.deploy.SparkSubmitArguments.error(SparkSubmitArguments.scala:670)",
            ],
            "When running with master 'yarn' either HADOOP_CONF_DIR or YARN_CONF_DIR must be set in the environment.",
        ),
        (
            [
                'Exception in thread "main" java.lang.RuntimeException: outer',
                "\tat a.b(C.java:1)",
                "Caused by: java.net.UnknownHostException: nosuchhost: Name or service not known",
                "\t... 3 more",
            ],
            "nosuchhost: Name or service not known",
        ),
        (
            ["Error: Master must either be yarn or start with spark, k8s, or local", "Run with --help for usage"],
            "Error: Master must either be yarn or start with spark, k8s, or local",
        ),
        (["/usr/lib/jvm/x/bin/java: No such file or directory"], "/usr/lib/jvm/x/bin/java: No such file or directory"),
        ([], None),
    ],
)
def test_the_root_cause_of_a_launch_that_failed(output: list[str], cause: str | None) -> None:
    assert root_cause(output) == cause
