"""Interrupts leave nothing behind: whatever the moment, an interrupted ``reassemble run`` leaves no
hidden temporary (checked as the process exits and again a little later, when a writer that outlived
its task would have recreated it), and OUTPUT is absent or complete. A killed run's leftovers are
removed by the next run; a live run's never are.

The processes are real (``python -m reassembly run``, Spark local); the in-process tests drive
:func:`reassembly._files.atomic_dir` and :func:`reassembly._files.remove_orphans` directly.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from reassembly._files import ORPHAN_AFTER, OWNER_FILE, atomic_dir, remove_orphans
from reassembly._processes import INTERRUPTED, descendants, on_interrupt, process_identity
from reassembly.cli.summary import problems
from reassembly.spark.testdata import generate, write_parquet
from tests.support.leftover import assert_none_left


@pytest.fixture(scope="module")
def landing(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """Enough segments that the write takes a while: (the input, how many messages a complete output has)."""
    ds = generate(n_messages=300, segments_per_message=8, segment_size=16 * 1024, groups=2)
    return write_parquet(ds, tmp_path_factory.mktemp("in"), files=4), len(ds.expected)


def leftovers(work: Path) -> list[str]:
    return sorted(p.name for p in work.iterdir() if p.name.startswith("."))


def assert_absent_or_complete(out: Path, messages: int) -> None:
    if out.exists():
        assert sorted(p.name for p in out.iterdir() if not p.name.startswith("_")) in (
            ["messages", "quarantine"],
            ["messages", "payloads", "quarantine"],
        )
        assert pq.read_table(out / "messages").num_rows == messages
        pq.read_table(out / "quarantine")
        assert not (out / OWNER_FILE).exists()


def start(landing: Path, out: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "reassembly", "run", str(landing), str(out), "--no-progress", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's job would be
    )


def wait_for(proc: subprocess.Popen[str], ready: Callable[[], bool], timeout: float = 600) -> bool:
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# (when, seconds after it): "spark" is the moment the command has started Spark's JVM (a child process:
# the session is starting), "writing" the moment the hidden temporary appears, "placed" the moment
# OUTPUT appears (the renames done, the summary next). Before "spark" the interpreter may still be
# importing, which Python itself handles (nothing is written by then).
POINTS = [("spark", 0.0), ("writing", 0.0), ("writing", 3.0), ("placed", 0.0)]
MORE_POINTS = [
    ("spark", 1.0),
    ("spark", 3.0),
    *(("writing", s) for s in (0.5, 1.0, 2.0, 5.0, 8.0, 12.0, 16.0, 24.0)),
    ("placed", 0.5),
]


def interrupt_at(landing: tuple[Path, int], work: Path, when: str, after: float, group: bool) -> None:
    data, messages = landing
    out, summary = work / "out", work / "summary.json"
    proc = start(data, out, "--summary-json", str(summary))
    try:
        ready = {
            "spark": lambda: bool(descendants(proc.pid)),
            "writing": lambda: bool(list(work.glob(".out.tmp-*"))),
            "placed": lambda: out.exists(),
        }[when]
        reached = wait_for(proc, ready)
        time.sleep(after)
        if proc.poll() is None:
            (os.killpg if group else os.kill)(proc.pid, signal.SIGINT)
        _, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert_none_left(proc.pid)  # its JVM and Python workers ended before it did
    at_exit = leftovers(work)
    time.sleep(2.0)  # a writer that outlived the run would have recreated something by now
    assert (at_exit, leftovers(work)) == ([], []), stderr[-2000:]
    assert reached or proc.returncode == 0, (when, stderr[-2000:])
    record = json.loads(summary.read_text())  # an orchestrator learns what happened
    assert problems(record) == [] and record["exit_code"] == proc.returncode
    if proc.returncode == 130:
        assert stderr.splitlines() == ["reassemble: interrupted"], stderr[-3000:]
        assert record["outcome"] == "interrupted" and record["error"] == "interrupted"
    else:  # the signal came after the last step
        assert proc.returncode == 0 and out.exists(), (proc.returncode, stderr[-3000:])
    if when == "placed":
        assert out.exists()
    assert_absent_or_complete(out, messages)


@pytest.mark.spark
@pytest.mark.parametrize(("when", "after"), POINTS)
def test_an_interrupt_at_any_point_leaves_no_temporary(
    landing: tuple[Path, int], tmp_path: Path, when: str, after: float
) -> None:
    """SIGINT to the process alone (as a scheduler sends it) or, every other point, to its group (a
    terminal's Ctrl-C, which reaches Spark's JVM too)."""
    interrupt_at(landing, tmp_path, when, after, group=POINTS.index((when, after)) % 2 == 1)


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.parametrize(("when", "after"), MORE_POINTS)
@pytest.mark.parametrize("group", [False, True], ids=["process", "group"])
def test_an_interrupt_at_many_more_points_leaves_no_temporary(
    landing: tuple[Path, int], tmp_path: Path, when: str, after: float, group: bool
) -> None:
    interrupt_at(landing, tmp_path, when, after, group)


@pytest.mark.spark
@pytest.mark.sweep
def test_the_next_run_removes_what_a_killed_run_left(landing: tuple[Path, int], tmp_path: Path) -> None:
    """SIGKILL cannot be cleaned up after by the process itself: its temporary stays, with the marker
    naming it (and its JVM); the next run for the same OUTPUT removes it, then writes OUTPUT."""
    data, messages = landing
    out = tmp_path / "out"
    proc = start(data, out)
    try:
        assert wait_for(proc, lambda: bool(list(tmp_path.glob(".out.tmp-*")))), proc.communicate()[1][-2000:]
        time.sleep(1.0)
        proc.kill()  # the Python process alone: its JVM ends once its stdin closes
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert_none_left(proc.pid, timeout=60)  # the JVM saw its stdin close
    left = list(tmp_path.glob(".out.tmp-*"))
    assert len(left) == 1
    owner = json.loads((left[0] / OWNER_FILE).read_text())
    pids = [p["pid"] for p in owner["processes"]]
    assert owner["host"] == socket.gethostname() and pids[0] == proc.pid and len(pids) == 2  # the run, its JVM
    again = subprocess.run(
        [sys.executable, "-m", "reassembly", "run", str(data), str(out), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert leftovers(tmp_path) == [] and again.stderr == ""
    assert_absent_or_complete(out, messages)


# ------------------------------------------------------------------ in process


@pytest.fixture
def interrupts() -> Iterator[None]:
    """The command's handler for SIGINT, and the flag cleared after."""
    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        INTERRUPTED.clear()


@pytest.mark.parametrize("existing", [False, True], ids=["new", "replacing"])
def test_an_interrupt_during_the_rename_waits_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, interrupts: None, existing: bool
) -> None:
    """A Ctrl-C between the renames (OUTPUT moved aside, the new one not yet in place) would leave no
    OUTPUT at all: the renames finish first, then the interrupt is raised, OUTPUT complete."""
    out = tmp_path / "out"
    if existing:
        (out / "messages").mkdir(parents=True)
        (out / "messages" / "old.parquet").write_bytes(b"old")
    real_rename = Path.rename
    sent: list[Path] = []

    def rename(self: Path, target: Path) -> Path:
        if not sent:
            sent.append(self)
            os.kill(os.getpid(), signal.SIGINT)  # delivered here, in the middle of placing OUTPUT
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", rename)
    with pytest.raises(KeyboardInterrupt), atomic_dir(out) as tmp:
        (tmp / "messages").mkdir()
        (tmp / "messages" / "new.parquet").write_bytes(b"new")
    assert sent and INTERRUPTED.is_set()
    assert [p.name for p in (out / "messages").iterdir()] == ["new.parquet"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_failure_waits_for_the_writers_before_removing_the_temporary(tmp_path: Path) -> None:
    """The clean-up first stops the writers (``settle``), then removes the directory; a writer not seen
    to stop (settle says False) that recreates a path under it afterwards is removed again."""
    out = tmp_path / "out"
    seen: list[bool] = []

    def settle() -> bool:
        tmp = next(tmp_path.glob(".out.tmp-*"))
        seen.append(tmp.exists())

        def straggler() -> None:  # a Python worker finishing its batch after the removal
            time.sleep(0.3)
            (tmp / "payloads").mkdir(parents=True, exist_ok=True)
            (tmp / "payloads" / "late.bin").write_bytes(b"x")

        threading.Thread(target=straggler).start()
        return False

    with pytest.raises(RuntimeError), atomic_dir(out, settle) as tmp:
        (tmp / "part-0.parquet").write_bytes(b"half")
        raise RuntimeError("the job failed")
    assert seen == [True]
    time.sleep(0.5)
    assert list(tmp_path.iterdir()) == []


def test_a_completed_output_holds_no_marker(tmp_path: Path) -> None:
    with atomic_dir(tmp_path / "out") as tmp:
        assert json.loads((tmp / OWNER_FILE).read_text())["processes"][0]["pid"] == os.getpid()
        (tmp / "messages").mkdir()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["messages"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def _sibling(parent: Path, name: str, owner: dict[str, object] | None) -> Path:
    path = parent / name
    (path / "messages").mkdir(parents=True)
    if owner is not None:
        (path / OWNER_FILE).write_text(json.dumps(owner))
    return path


def _ended_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def test_only_the_leftovers_of_ended_runs_on_this_host_are_removed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    host = socket.gethostname()
    me = {"pid": os.getpid(), "identity": process_identity(os.getpid())}
    ended = {"pid": _ended_pid(), "identity": None}
    live = _sibling(tmp_path, ".out.tmp-live", {"host": host, "processes": [ended, me]})  # its JVM lives on
    dead = _sibling(tmp_path, ".out.tmp-dead", {"host": host, "processes": [ended]})
    dead_old = _sibling(tmp_path, ".out.old-dead", {"host": host, "processes": [ended]})
    elsewhere = _sibling(tmp_path, ".out.tmp-away", {"host": host + "-other", "processes": [ended]})
    fresh = _sibling(tmp_path, ".out.tmp-fresh", None)  # a run between mkdir and its marker
    stale = _sibling(tmp_path, ".out.tmp-stale", None)
    os.utime(stale, (time.time() - ORPHAN_AFTER - 5,) * 2)
    other = _sibling(tmp_path, ".other.tmp-dead", {"host": host, "processes": [ended]})  # not this OUTPUT's
    if process_identity(os.getpid()) is not None:  # Linux: a PID reused by a later process is not the run
        reused = _sibling(tmp_path, ".out.tmp-reused", {"host": host, "processes": [{**me, "identity": "x:1"}]})
    else:
        reused = dead
    with caplog.at_level(logging.INFO, logger="reassembly._files"):
        removed = remove_orphans(tmp_path / "out")
    assert sorted(removed) == sorted({dead, dead_old, stale, reused})
    assert all(p.exists() for p in (live, elsewhere, fresh, other))
    assert not any(p.exists() for p in removed)
    assert f"left in place: {elsewhere} (owned by a run on host {host}-other)" in caplog.messages
    assert any(m.startswith(f"removed {dead}: its run ended (pid {ended['pid']} on {host})") for m in caplog.messages)
