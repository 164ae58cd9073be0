"""The suite fails when a test leaves a Spark process behind (``tests/support/leftover.py``): a test
run whose only test starts an orphan that looks like Spark's JVM fails, naming the test; one whose
test ends what it started passes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A child that starts a grandchild and exits at once: the grandchild is an orphan, as a JVM whose
# command ended without ending it would be. Its command line names a Spark class.
SPAWN = """
import subprocess, sys
child = [sys.executable, "-c", "import time; time.sleep(60)", "org.apache.spark.deploy.SparkSubmit"]
print(subprocess.Popen(child, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)
"""

TESTS = """
import os, signal, subprocess, sys

def start():
    done = subprocess.run([sys.executable, "spawn.py"], capture_output=True, text=True, check=True)
    open("orphan.pid", "w").write(done.stdout.strip())
    return int(done.stdout)

def test_leaves_a_jvm_behind():
    start()

def test_ends_what_it_started():
    os.kill(start(), signal.SIGTERM)
"""


def run(tmp_path: Path, name: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "spawn.py").write_text(SPAWN)
    (tmp_path / "test_sample.py").write_text(TESTS)
    env = {**os.environ, "REASSEMBLY_LEFTOVER_GRACE": "2", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.support.leftover"]
    try:
        return subprocess.run(
            [*command, "-k", name, "test_sample.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int((tmp_path / "orphan.pid").read_text()), signal.SIGKILL)


def test_a_spark_process_left_behind_fails_the_run(tmp_path: Path) -> None:
    done = run(tmp_path, "leaves_a_jvm_behind")
    assert done.returncode == 1, done.stdout[-3000:]
    assert "Spark processes left running by this test run" in done.stdout
    assert "test_sample.py::test_leaves_a_jvm_behind" in done.stdout
    assert "1 passed" in done.stdout


def test_a_run_that_ends_what_it_started_passes(tmp_path: Path) -> None:
    done = run(tmp_path, "ends_what_it_started")
    assert done.returncode == 0, done.stdout[-3000:]
    assert "left running" not in done.stdout
