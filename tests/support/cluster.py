"""Where users run the job: the library's wheel, a packed virtual environment, a loopback standalone cluster.

The fixtures that use these live in tests/cli/conftest.py (one cluster and one wheel per test run).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SPARK_HOME = Path(__import__("pyspark").__file__).parent
REPO = Path(__file__).resolve().parents[2]
LIBRARY = ("segmenter", "reassembly", "refmsg")  # bench and tests are not installed
# What the Python workers import besides pyspark (which they take from SPARK_HOME/python/lib): the
# library's compiled dependencies. pyspark, py4j, pandas and the driver's tools stay out of the archive.
WORKER_DEPENDENCIES = ("pyarrow", "zstandard", "crc32c", "isal")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")


def alive_workers(ui_port: int) -> int:
    """The workers the master counts alive, from its web UI's JSON (``aliveworkers``); 0 while it
    does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as answer:
            return int(json.load(answer).get("aliveworkers", 0))
    except (OSError, ValueError):
        return 0


@contextmanager
def standalone_cluster(work: Path, workers: int = 2) -> Iterator[str]:
    """A master and ``workers`` one-core workers on 127.0.0.1 (``work/w<i>`` their work directories),
    stopped by PID whatever happens; yields the master URL. The daemons' own Python setting does not
    choose the executors' Python: the driver's ``spark.pyspark.python`` (or PYSPARK_PYTHON) does."""
    port, ui = free_port(), free_port()
    env = {**os.environ, "SPARK_LOG_DIR": str(work), "SPARK_PID_DIR": str(work), "PYSPARK_PYTHON": sys.executable}
    cls = str(SPARK_HOME / "bin" / "spark-class")
    master = ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port), "--webui-port"]
    procs = [subprocess.Popen([cls, *master, str(ui)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        wait_for_port(port)
        for i in range(workers):
            worker = [
                "org.apache.spark.deploy.worker.Worker",
                f"spark://127.0.0.1:{port}",
                *("--host", "127.0.0.1", "--cores", "1", "--memory", "1g"),
                *("--work-dir", str(work / f"w{i}"), "--webui-port", str(free_port())),
            ]
            procs.append(
                subprocess.Popen([cls, *worker], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            )
        deadline = time.monotonic() + 120
        while alive_workers(ui) < workers:  # they register a few seconds after they start
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"{alive_workers(ui)} of {workers} workers registered with the master")
            time.sleep(0.2)  # polls the master; the wait ends when every worker is alive
        yield f"spark://127.0.0.1:{port}"
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def build_wheel(src: Path, dist: Path) -> Path:
    """The wheel pip builds from a copy of the source in ``src`` (so no build/ or egg-info lands in the tree)."""
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for name in (*LIBRARY, "bench", "tests"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (built,) = dist.glob("*.whl")
    return built


def pack_environment(wheel: Path, work: Path) -> Path:
    """``work/env.tar.gz``: a virtual environment holding the library (``wheel``) and what the Python
    workers import with it, packed by venv-pack, for ``--archives env.tar.gz#environment``.

    The environment is made with ``python -m venv`` and the wheel installed into it by pip; the compiled
    dependencies (:data:`WORKER_DEPENDENCIES`) are copied from this venv's site-packages, as installed,
    with their pip records (installing them needs their wheels, which a test run does not download; a
    user runs ``pip install`` of the wheel with its dependencies instead). pyarrow's headers, tests,
    Arrow Flight and S3 are left out (the workers never load them): 137 MiB instead of 200. The Python
    inside is a link to the base interpreter this venv was made from, which venv-pack keeps: the archive
    works where that interpreter is at the same path (here; on a real cluster, nodes of one image)."""
    env = work / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    pip = [sys.executable, "-m", "pip", "--python", str(env / "bin" / "python"), "install", "-q", "--no-deps"]
    done = subprocess.run([*pip, "--no-index", str(wheel)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    ours = Path(sysconfig.get_paths()["purelib"])
    (theirs,) = (env / "lib").glob("python*/site-packages")
    # neither the library nor pyspark's workers use Arrow Flight or S3: 48 MiB of pyarrow left out
    skip = shutil.ignore_patterns("__pycache__", "include", "tests", "*flight*", "*_s3*")
    for name in WORKER_DEPENDENCIES:
        for found in [ours / name, *ours.glob(f"{name}-*.dist-info")]:
            shutil.copytree(found, theirs / found.name, ignore=skip)
    archive = work / "env.tar.gz"
    pack = [sys.executable, "-m", "venv_pack", "-p", str(env), "-o", str(archive), "--compress-level", "1"]
    done = subprocess.run(pack, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    shutil.rmtree(env)
    return archive


__all__ = [
    "LIBRARY",
    "REPO",
    "SPARK_HOME",
    "WORKER_DEPENDENCIES",
    "build_wheel",
    "free_port",
    "pack_environment",
    "standalone_cluster",
    "wait_for_port",
]
