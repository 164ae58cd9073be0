"""The command under spark-submit on the loopback standalone cluster, and a master that cannot start.

The executors' Python is the one the driver names (``spark.pyspark.python``, else ``PYSPARK_PYTHON``):
here PYSPARK_PYTHON is a Python without the library (tests/support/no_library.py), so the library
reaches the executors only if the packed environment travels with ``--archives`` (Spark's Python
package management guide); without it the job stops at its first task with one line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import reassembly.spark.engine.submit
from reassembly.spark.testdata import Dataset, generate, write_parquet
from tests.support.cluster import SPARK_HOME, pack_environment
from tests.support.no_library import environment_without_library

SUBMIT = reassembly.spark.engine.submit.__file__


@pytest.fixture(scope="module")
def packed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """env.tar.gz: a virtual environment with the library's wheel, packed by venv-pack."""
    return pack_environment(wheel, tmp_path_factory.mktemp("packed"))


@pytest.fixture(scope="module")
def landing(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Dataset]:
    ds = generate(n_messages=12, segments_per_message=3, segment_size=2048, groups=1)
    return write_parquet(ds, tmp_path_factory.mktemp("landing"), files=2), ds


def spark_submit(master: str, env: dict[str, str], *options: str, command: list[str]) -> Any:
    """spark-submit of the command file, on one executor (one core: the archive is unpacked once)."""
    return subprocess.run(
        [
            str(SPARK_HOME / "bin" / "spark-submit"),
            *("--master", master, "--conf", "spark.cores.max=1"),
            *("--conf", f"spark.pyspark.driver.python={sys.executable}"),  # the driver: this venv's Python
            *options,
            SUBMIT,
            *command,
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )


def quiet(log: str) -> str:
    """spark-submit's log without its INFO lines (for a failure's message)."""
    return "\n".join(line for line in log.splitlines() if " INFO " not in line)[-3000:]


def apps(cluster_dir: Path) -> set[Path]:
    """The executors' work directories the cluster's workers made (one per application and executor)."""
    return set(cluster_dir.glob("w*/app-*/*"))


@pytest.mark.cluster
def test_spark_submit_runs_the_command_with_the_environment_it_ships(
    cluster: str, cluster_dir: Path, packed: Path, landing: tuple[Path, Dataset], tmp_path: Path
) -> None:
    path, ds = landing
    before = apps(cluster_dir)
    out = tmp_path / "out"
    done = spark_submit(
        cluster,
        environment_without_library(tmp_path / "no-library"),
        *("--archives", f"{packed}#environment", "--conf", "spark.pyspark.python=./environment/bin/python"),
        command=["run", str(path), str(out), "--partitions", "2"],
    )
    assert done.returncode == 0, done.stdout[-3000:] + quiet(done.stderr)
    assert f"segments: {len(ds.rows)} in = " in done.stdout and ": holds" in done.stdout
    got = {(m["group_id"], m["msg_seq_number"]): m for m in pq.read_table(out / "messages").to_pylist()}
    assert {k: m["status"] for k, m in got.items()} == {k: e.status for k, e in ds.expected.items()}
    assert all(got[k]["payload"] == e.payload for k, e in ds.expected.items() if e.status == "complete")
    # It ran on the cluster (spark-submit's master, not the command's default local[2]), and the
    # executor ran the Python of the environment that travelled: unpacked in its work directory.
    (executor,) = apps(cluster_dir) - before
    assert (executor / "environment" / "bin" / "python").exists()
    site = next((executor / "environment" / "lib").glob("python*/site-packages"))
    assert (site / "reassembly" / "spark" / "engine" / "environment.py").exists()


# Slow: the same one-line refusal of workers without the library runs in the default run through a
# local session (tests/spark/test_own_session.py); this is its spark-submit variant.
@pytest.mark.slow
@pytest.mark.cluster
def test_spark_submit_without_the_environment_stops_at_the_first_task_in_one_line(
    cluster: str, cluster_dir: Path, landing: tuple[Path, Dataset], tmp_path: Path
) -> None:
    path, _ = landing
    before = apps(cluster_dir)
    out = tmp_path / "out"
    done = spark_submit(
        cluster, environment_without_library(tmp_path / "no-library"), command=["run", str(path), str(out)]
    )
    assert done.returncode == 1
    output = done.stdout + done.stderr  # spark-submit merges the driver's stderr into its stdout
    errors = [line for line in output.splitlines() if line.startswith("reassemble: error:")]
    assert len(errors) == 1, quiet(output)
    assert "[9060 ENVIRONMENT_ERROR] the Spark workers' Python (" in errors[0]
    assert "cannot import reassembly, segmenter, refmsg: install the library there" in errors[0]
    # the fix for a session spark-submit made, which the test above follows (--archives)
    assert "or pass spark-submit --conf spark.pyspark.python=PYTHON" in errors[0]
    assert "ModuleNotFoundError" not in output and "Traceback" not in output
    assert not out.exists() and not list(tmp_path.glob(".out.tmp-*"))
    assert apps(cluster_dir) - before  # the probe's task ran on the cluster's executor


def test_a_master_that_cannot_start_names_its_cause_in_one_line(tmp_path: Path) -> None:
    """YARN without HADOOP_CONF_DIR: spark-submit says why only in its own output, which the command
    keeps off the terminal; its one line carries that cause, not only pyspark's JAVA_GATEWAY_EXITED."""
    ds = generate(n_messages=2, segments_per_message=2, segment_size=512, groups=0, faults=False)
    landing = write_parquet(ds, tmp_path / "landing", files=1)
    env = {k: v for k, v in os.environ.items() if k not in ("HADOOP_CONF_DIR", "YARN_CONF_DIR")}
    done = subprocess.run(
        [sys.executable, "-m", "reassembly", "run", str(landing), str(tmp_path / "out"), "--master", "yarn"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("reassemble: error: cannot start Spark with master yarn: When running with master")
    assert "HADOOP_CONF_DIR" in lines[0] and "JAVA_GATEWAY_EXITED" in lines[0]
    assert not (tmp_path / "out").exists()
