"""Plumbing every job of the ``reassemble`` command shares, Spark or not.

Its errors (one line; a usage error exits 2 before anything is touched), the inputs it names
and the output it claims (never overlapping: a run must not read or replace its own input), an
atomic output directory (a hidden sibling renamed into place only on success, removed on failure
or Ctrl-C once whatever writes into it has stopped; one a killed run left is removed by the next
run, never one whose owner still runs), the interrupt flag, one-line errors and the digest policy
read from a keyring file. The collector's job and the Spark jobs both import it; it imports neither.
"""

from __future__ import annotations

import fnmatch
import glob
import json
import logging
import os
import re
import shutil
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from segmenter.digest import DigestPolicy, Keyring
from segmenter.errors import SegmentationError

logger = logging.getLogger(__name__)


class JobError(Exception):
    """A failure to report in one line (no stack trace)."""


class UsageError(JobError):
    """Arguments that must not run at all (an output overlapping the input): exit code 2, nothing touched."""


INTERRUPTED = threading.Event()
"""Set by Ctrl-C once a session is open. A terminal's Ctrl-C reaches the whole process group, so the
JVM may die before the driver raises KeyboardInterrupt and the error that surfaces is py4j's ("Answer
from Java side is empty"): the command reports such a failure as the interruption it is (exit 130)."""


def on_interrupt(signum: int, frame: Any) -> None:
    INTERRUPTED.set()
    raise KeyboardInterrupt


def inputs(pattern: str) -> list[str]:
    """The paths an input names (a file, a directory or a glob); JobError if none or unreadable."""
    paths = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
    missing = [p for p in paths if not os.path.exists(p)]
    if not paths or missing:
        raise JobError(f"input not found: {pattern}")
    unreadable = [p for p in paths if not os.access(p, os.R_OK)]
    if unreadable:
        raise JobError(f"input not readable: {unreadable[0]}")
    return paths


def overlap(out: Path, path: Path) -> str | None:
    """How ``out`` overlaps ``path`` ("is the input", "is inside the input", "contains the input"), or None.

    Compare resolved paths (``Path.resolve()``): symlinks, ``..`` and relative paths must not hide an overlap.
    """
    if out == path:
        return "is the input"
    if path in out.parents:
        return "is inside the input"
    if out in path.parents:
        return "contains the input"
    return None


def _link_targets(path: str) -> Iterator[tuple[str, Path]]:
    """Every symlink under a directory input, with its resolved target: Spark reads a linked file
    as part of the directory, so an output over the target would delete input it read."""
    if os.path.isdir(path):
        for root, dirs, files in os.walk(path):
            for name in (*dirs, *files):
                link = os.path.join(root, name)
                if os.path.islink(link):
                    yield link, Path(link).resolve()


def linked_overlap(real: Path, directory: str) -> str | None:
    """How ``real`` (resolved) overlaps the target of a symlink under ``directory`` ("is inside
    /x (linked from d/l)"), or None: Spark reads through those links."""
    for link, target in _link_targets(directory):
        why = overlap(real, target)
        if why:
            return f"{why} {target} (linked from {link})"
    return None


def hadoop_literal(path: str) -> str:
    """``path`` with Hadoop's glob characters escaped: Spark expands ``{a,b}``, ``[ab]``, ``*`` and
    ``?`` in the paths it reads, so a literal path naming such characters would read (and the
    output checks would miss) other paths than the one checked."""
    return re.sub(r"([\\{}\[\]*?])", r"\\\1", path)


def _matches(pattern: str, out: Path) -> bool:
    """Would ``pattern`` (its fixed leading directories resolved like the output) match ``out`` or a parent?"""
    parts = Path(os.path.abspath(pattern)).parts
    fixed = next(i for i, part in enumerate(parts) if glob.has_magic(part))
    resolved = str(Path(*parts[:fixed]).resolve().joinpath(*parts[fixed:]))
    candidates = {Path(os.path.abspath(out)), out.resolve()}
    return any(
        fnmatch.fnmatchcase(str(c), p)
        for p in (resolved, os.path.join(*parts))
        for o in candidates
        for c in (o, *o.parents)
    )


def claim_output(output: str, overwrite: bool, pattern: str, paths: Sequence[str]) -> Path:
    """Check that OUTPUT can be written and shares nothing with the input; JobError if not.

    OUTPUT is compared with every input path after resolving symlinks, ``..`` and relative
    paths, whatever ``--overwrite`` says: equal, inside or a parent of an input is refused
    (it would replace, re-read or delete the input). For a glob, OUTPUT must not match the
    glob either, or the next run with the same pattern would read it as input.
    """
    out = Path(os.path.abspath(output))  # "." and ".." by name: the rename into place needs one
    real = out.resolve()
    for p in paths:
        why = overlap(real, Path(p).resolve())
        if why:
            raise UsageError(f"output {output} {why} {p}: choose an output outside the input")
        why = linked_overlap(real, p)
        if why:
            raise UsageError(f"output {output} {why}: choose an output outside it")
    if glob.has_magic(pattern) and _matches(pattern, out):
        raise UsageError(f"output {output} matches the input pattern {pattern}: choose an output outside it")
    if out.exists() and not overwrite:
        raise JobError(f"output exists: {output} (use --overwrite)")
    if not out.parent.exists():
        raise JobError(f"output parent directory does not exist: {out.parent}")
    return out


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


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


# ------------------------------------------------------------------ who owns a temporary output
OWNER_FILE = ".reassemble-owner.json"
"""The marker in a hidden temporary (and in a replaced output being removed): the host and the
processes (this one and those it started to write there, such as Spark's JVM) of the run it is for."""

ORPHAN_AFTER = 60.0
"""Seconds after which a hidden temporary without a readable marker is taken for litter. A run
writes its marker right after creating the directory, so only a run killed in that instant, or a
writer that outlived its run and recreated a path under it, leaves one."""


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


def _write_owner(directory: Path, pids: Sequence[int]) -> None:
    owner = {
        "host": socket.gethostname(),
        "processes": [{"pid": p, "identity": process_identity(p)} for p in dict.fromkeys([os.getpid(), *pids])],
        "created": datetime.now(timezone.utc).isoformat(),
    }
    (directory / OWNER_FILE).write_text(json.dumps(owner))


def _owner_alive(path: Path) -> tuple[bool, str]:
    """(whether a run owning the hidden sibling ``path`` may still be at work, why)."""
    owner: Any = None
    if path.is_dir() and not path.is_symlink():
        try:
            owner = json.loads((path / OWNER_FILE).read_text())
        except (OSError, ValueError):
            owner = None
    processes = owner.get("processes") if isinstance(owner, dict) else None
    if not isinstance(processes, list) or not all(isinstance(p, dict) for p in processes):
        try:
            age = time.time() - path.lstat().st_mtime
        except OSError:
            return True, "gone already"
        if age < ORPHAN_AFTER:
            return True, f"no owner recorded, changed {age:.0f} s ago"
        return False, f"no owner recorded, unchanged for {age:.0f} s"
    host = owner.get("host")
    if host != socket.gethostname():
        return True, f"owned by a run on host {host}"
    running = [
        p["pid"] for p in processes if isinstance(p.get("pid"), int) and process_alive(p["pid"], p.get("identity"))
    ]
    if running:
        return True, f"its run still runs (pid {running[0]})"
    pids = ", ".join(str(p.get("pid")) for p in processes)
    return False, f"its run ended (pid {pids} on {host})"


def remove_orphans(out: Path) -> list[Path]:
    """Remove the hidden siblings of ``out`` (``.OUT.tmp-*``, ``.OUT.old-*``) left by runs that ended
    without removing them (killed, or a machine that went down); returns what was removed.

    A sibling is removed only when the marker in it names processes on this host of which none
    runs any more, or, with no readable marker, when it has not changed for :data:`ORPHAN_AFTER`
    seconds. A live run's temporary, and one owned by a run on another host (a shared filesystem),
    are left alone: the latter is logged, as there only its own host can tell.
    """
    removed = []
    for kind in ("tmp", "old"):
        for path in sorted(out.parent.glob(f".{glob.escape(out.name)}.{kind}-*")):
            alive, why = _owner_alive(path)
            if alive:
                if why.startswith("owned by a run on host"):
                    logger.warning("left in place: %s (%s)", path, why)
                continue
            _remove(path)
            logger.info("removed %s: %s", path, why)
            removed.append(path)
    return removed


@contextmanager
def atomic_dir(out: Path, settle: Callable[[], bool] | None = None, pids: Sequence[int] = ()) -> Iterator[Path]:
    """A hidden sibling to write into; renamed to ``out`` on success, removed on failure or Ctrl-C.

    ``settle`` stops whatever else writes into the directory (Spark's tasks and Python workers)
    and says whether it saw them stop; it runs before the directory is removed, so no writer
    recreates a path under it afterwards. When it could not tell, the removal is repeated for a
    moment. ``pids``: processes besides this one that write there (Spark's JVM), recorded in the
    marker that lets the next run remove what a killed one left (:func:`remove_orphans`, run first).
    The renames that put the output in place, and the clean-up, finish before an interrupt is raised.
    """
    remove_orphans(out)
    token = uuid.uuid4().hex[:8]
    tmp = out.parent / f".{out.name}.tmp-{token}"
    placed = False
    try:
        tmp.mkdir()
        _write_owner(tmp, pids)
        yield tmp
        with deferred_interrupts():
            _place(tmp, out, token, pids)
        placed = True
    finally:
        if not placed:
            with deferred_interrupts():
                _discard(tmp, settle)


def _place(tmp: Path, out: Path, token: str, pids: Sequence[int]) -> None:
    """``tmp`` becomes ``out``; an existing ``out`` is moved aside (marked as ours) and removed after."""
    old = None
    if out.exists() or out.is_symlink():
        old = out.parent / f".{out.name}.old-{token}"
        out.rename(old)
        if old.is_dir() and not old.is_symlink():
            _write_owner(old, pids)
    (tmp / OWNER_FILE).unlink(missing_ok=True)
    tmp.rename(out)
    if old is not None:
        _remove(old)


def _discard(tmp: Path, settle: Callable[[], bool] | None) -> None:
    quiet = True
    if settle is not None:
        try:
            quiet = settle()
        except Exception:  # the writers' session is broken: nothing more to ask it
            logger.debug("stopping the writers failed", exc_info=True)
            quiet = False
    _remove(tmp)
    if not quiet:  # a writer not seen to stop may still recreate a path under tmp: look again
        for delay in (0.2, 0.5, 1.0):
            time.sleep(delay)
            if tmp.exists():
                _remove(tmp)


_PYTHON_ERROR = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Interrupt|Exit)\b:?")


def first_line(exc: BaseException) -> str:
    """One informative line: the message and its root cause, never py4j's call site or a bare colon.

    A Java error's text is a header line, ``: Message`` and ``Caused by:`` lines; a Python
    worker's is a header ending in a colon followed by a traceback whose last exception
    line is the cause. The line names the head and, after a colon, the deepest cause.
    """
    text = str(exc).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("\t")]
    if not lines:
        return type(exc).__name__
    java = [line[2:] for line in lines if line.startswith(": ")]
    causes = [line.removeprefix("Caused by: ") for line in lines if line.startswith("Caused by: ")]
    python = [line for line in lines[1:] if _PYTHON_ERROR.match(line) and not line.startswith("Traceback")]
    head = java[0] if java else lines[0]
    cause = python[-1] if python else causes[-1] if causes else None
    if cause and cause not in head:
        head = f"{head.rstrip(': ')}: {cause}" if head.endswith(":") else f"{head} (cause: {cause})"
    elif head.endswith(":"):
        rest = [line for line in lines if line != head]
        head = f"{head} {rest[-1]}" if rest else head.rstrip(":")
    return head[:400]


def load_keyring(path: str) -> Keyring:
    """A keyring file: JSON ``{"current": "<key id>", "keys": {"<key id>": "<hex key>", ...}}``.

    ``current`` (optional) names the signing key; every key in ``keys`` verifies. Errors name
    the file and the key id, never a key. Keep the file readable by the job's user only.
    """
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as exc:
        raise UsageError(f"keyring {path}: {type(exc).__name__}: {first_line(exc)}") from None
    keys = doc.get("keys") if isinstance(doc, dict) else None
    if not isinstance(keys, dict) or not keys or not all(isinstance(v, str) for v in keys.values()):
        raise UsageError(f'keyring {path}: expected {{"current": ID, "keys": {{ID: HEX, ...}}}}')
    raw: dict[str, bytes] = {}
    for key_id, text in keys.items():
        try:
            raw[str(key_id)] = bytes.fromhex(text)
        except ValueError:
            raise UsageError(f"keyring {path}: key {key_id!r} is not hex") from None
    try:
        return Keyring(raw, current=doc.get("current"))
    except SegmentationError as exc:
        raise UsageError(f"keyring {path}: {exc}") from None


def digest_policy(require_sha256: bool, keyring_path: str | None) -> DigestPolicy:
    """The reader's policy from the command line (``--require-sha256``, ``--hmac-keyring FILE``)."""
    return DigestPolicy(sha256=require_sha256, keyring=load_keyring(keyring_path) if keyring_path else None)
