"""Processes: the interrupt flag, interrupts deferred over steps that must not stop half-way, and
whether a process (told from a later one given the same PID) still runs.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

INTERRUPTED = threading.Event()
"""Set by Ctrl-C once a session is open. A terminal's Ctrl-C reaches the whole process group, so the
JVM may die before the driver raises KeyboardInterrupt and the error that surfaces is py4j's ("Answer
from Java side is empty"): the command reports such a failure as the interruption it is (exit 130)."""


def on_interrupt(signum: int, frame: Any) -> None:
    INTERRUPTED.set()
    raise KeyboardInterrupt


@contextmanager
def deferred_interrupts() -> Iterator[None]:
    """SIGINT and SIGTERM are noted, not raised, while the block runs; KeyboardInterrupt follows it.

    For steps that must not stop half-way: the renames that put an output in place (an interrupt
    between them would leave neither the old output nor the new) and the clean-up of a failed one.
    The flag :data:`INTERRUPTED` is set at once. Outside the main thread (no handlers there) the
    block runs as it is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []

    def note(signum: int, frame: Any) -> None:
        INTERRUPTED.set()
        came.append(signum)

    previous = {signum: signal.signal(signum, note) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
    if came:
        raise KeyboardInterrupt


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (Linux), or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rpartition(")")[2].split()


def process_identity(pid: int) -> str | None:
    """What tells this process from a later one given the same PID: the boot and the start time
    (Linux ``/proc``); None where that cannot be read (then the PID alone is compared)."""
    fields = _stat(pid)
    return f"{_boot_id()}:{fields[19]}" if fields and len(fields) > 19 else None


def process_alive(pid: int, identity: str | None = None) -> bool:
    """Whether process ``pid`` (the one whose :func:`process_identity` was ``identity``) still runs here.

    A zombie does not run; a PID now used by a process started later is not the same process.
    """
    try:
        os.kill(pid, 0)
    except PermissionError:
        pass  # another user's process: it exists
    except (ProcessLookupError, OverflowError, ValueError):
        return False
    except OSError:
        return False
    fields = _stat(pid)
    if fields is not None and fields[0] == "Z":
        return False
    if identity is not None:
        now = process_identity(pid)
        if now is not None and now != identity:
            return False
    return True


def descendants(pid: int) -> list[tuple[int, str | None]]:
    """Every process below ``pid`` (children, their children...) with its identity: Linux ``/proc``;
    empty where it cannot be read. Taken before a process tree is stopped, to wait for all of it."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields and len(fields) > 1 and fields[1].isdigit():
                children.setdefault(int(fields[1]), []).append(int(entry))
    found: list[tuple[int, str | None]] = []
    todo = list(children.get(pid, ()))
    while todo:
        child = todo.pop()
        found.append((child, process_identity(child)))
        todo.extend(children.get(child, ()))
    return found


def stop_tree(pid: int, *, exclude: Sequence[int] = (), root: bool = False, timeout: float = 10.0) -> list[int]:
    """Stop every process below ``pid`` (Linux ``/proc``; ``pid`` too with ``root``) except those in
    ``exclude``; the PIDs still running after ``timeout`` seconds and a SIGKILL (none, normally).

    The tree is frozen first (SIGSTOP until a scan finds nothing new), so no process forks a child
    that outlives its stopped parent unseen; then each gets SIGTERM (a JVM runs its shutdown hooks:
    Spark removes its temporary directories) and SIGCONT, and whatever has not exited by the
    deadline gets SIGKILL. For processes this one started and is giving up on, such as a Spark JVM
    still starting when Ctrl-C came: nothing else would end it.
    """
    skip = set(exclude)
    frozen: dict[int, str | None] = {}
    if root and pid not in skip:
        frozen[pid] = process_identity(pid)
        _signal(pid, frozen[pid], signal.SIGSTOP)
    for _ in range(20):  # a fixed point is reached in two or three scans
        new = [(p, i) for p, i in descendants(pid) if p not in skip and p not in frozen]
        if not new:
            break
        for p, identity in new:
            _signal(p, identity, signal.SIGSTOP)
            frozen[p] = identity
    for p, identity in frozen.items():
        _signal(p, identity, signal.SIGTERM)
        _signal(p, identity, signal.SIGCONT)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(process_alive(p, i) for p, i in frozen.items()):
        time.sleep(0.05)
    left = [p for p, i in frozen.items() if process_alive(p, i)]
    for p in left:
        _signal(p, frozen[p], signal.SIGKILL)
    return [p for p in left if process_alive(p, frozen[p])]


def _signal(pid: int, identity: str | None, signum: int) -> None:
    """Send ``signum`` to ``pid`` if it is still the process seen (not a later one given its PID)."""
    if process_alive(pid, identity):
        with suppress(OSError):  # it ended in between
            os.kill(pid, signum)
