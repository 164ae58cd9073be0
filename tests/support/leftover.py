"""No Spark process outlives the test run that started it: a pytest plugin (``-p tests.support.leftover``
in pyproject.toml's ``addopts``) and the helpers the interrupt tests use.

Every process a test run starts inherits a marker in its environment (:data:`MARKER`, one value per
pytest process, so xdist workers tell theirs apart). At the end of the session, a Spark process
(Spark's JVM or a PySpark worker) carrying this process's marker that is no longer below it (its
parent exited: an orphan, reparented to init) fails the run, naming the test that started it (from
``PYTEST_CURRENT_TEST`` in its environment). Processes still below pytest end with it: a session's
own JVM among them. Other users of the machine (other test runs) carry other markers.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from reassembly._processes import descendants, process_alive, process_identity

MARKER = "REASSEMBLY_TEST_RUN"
# A JVM whose command was killed (SIGKILL) ends once its stdin closes: a moment, not a leftover.
# Seconds; the plugin's own test shortens it (REASSEMBLY_LEFTOVER_GRACE).
GRACE = float(os.environ.get("REASSEMBLY_LEFTOVER_GRACE", "15"))


@dataclass(frozen=True)
class Found:
    """A process: its PID, identity, command line and the test named in its environment."""

    pid: int
    identity: str | None
    command: str
    test: str


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, _, v in pairs}


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _stat(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return []


def _pids() -> Iterator[int]:
    return (int(e) for e in os.listdir("/proc") if e.isdigit())


def is_spark(command: str) -> bool:
    """Spark's JVM (``SparkSubmit``, a standalone master or worker, an executor) or a PySpark worker."""
    return "org.apache.spark" in command or "pyspark.daemon" in command or "pyspark.worker" in command


def in_session(sid: int) -> list[Found]:
    """Every live process of session ``sid`` (a command started with ``start_new_session=True`` has
    its PID as session id, and so has everything it starts that does not make a session of its own)."""
    found = []
    for pid in _pids():
        fields = _stat(pid)
        if len(fields) > 3 and fields[3] == str(sid) and fields[0] != "Z":
            found.append(Found(pid, process_identity(pid), _command(pid), _environ(pid).get("PYTEST_CURRENT_TEST", "")))
    return found


def assert_none_left(sid: int, timeout: float = 0.0) -> None:
    """No process of session ``sid`` runs (after waiting up to ``timeout`` seconds for them to end)."""
    deadline = time.monotonic() + timeout
    while (left := in_session(sid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left == [], "\n".join(f"{f.pid}: {f.command[:300]}" for f in left)


def orphans(marker: str, me: int) -> list[Found]:
    """Spark processes carrying ``marker`` that are not below process ``me``."""
    below = {pid for pid, _ in descendants(me)}
    found = []
    for pid in _pids():
        if pid == me or pid in below:
            continue
        command = _command(pid)
        if not is_spark(command):
            continue
        env = _environ(pid)
        if env.get(MARKER) == marker:
            found.append(Found(pid, process_identity(pid), command, env.get("PYTEST_CURRENT_TEST", "")))
    return found


def pytest_configure(config: pytest.Config) -> None:
    os.environ[MARKER] = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    marker = os.environ.get(MARKER)
    if marker is None or not os.path.isdir("/proc"):
        return
    deadline = time.monotonic() + GRACE
    while (left := orphans(marker, os.getpid())) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [f for f in left if process_alive(f.pid, f.identity)]
    if left:
        lines = "".join(f"\n  pid {f.pid} started by {f.test or '?'}: {f.command[:200]}" for f in left)
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        text = f"Spark processes left running by this test run:{lines}"
        if reporter is not None:
            reporter.write_line(text, red=True)
        else:
            print(text)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
