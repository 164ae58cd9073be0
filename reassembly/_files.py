"""A job's files: the inputs it names, and the one home of its output.

Everything a job writes is claimed before anything starts (:func:`claim_output`): OUTPUT, its other
places (a checkpoint, a payload directory) and its summary file never overlap the input, whatever
way a path names it (a run must not read or replace its own input), and the places that must stay
apart do. The output is written into a hidden sibling renamed into place only on success
(:func:`atomic_dir`), removed on failure or Ctrl-C once whatever writes into it has stopped; one a
killed run left is removed by the next run, never one whose owner still runs (the owner marker).
The summary and commit records are written whole or not at all (:func:`write_json`).
"""

from __future__ import annotations

import fnmatch
import glob
import json
import logging
import os
import re
import shutil
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from reassembly._errors import JobError, UsageError
from reassembly._processes import deferred_interrupts, process_alive, process_identity

logger = logging.getLogger(__name__)


def fsync_path(path: Path) -> None:
    """Flush a file's bytes, or a directory's entries (a rename in it), to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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


def _a(noun: str) -> str:
    """``noun`` with its indefinite article: "an output", "a checkpoint"."""
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


@dataclass(frozen=True)
class Claim:
    """What a job may touch, checked before anything starts (:func:`claim_output`): the input's paths
    (``pattern``: the glob they came from, or None), OUTPUT, the other places it writes (``places``:
    name and absolute path, such as the checkpoint), and the file its summary goes to."""

    paths: tuple[str, ...]
    out: Path
    pattern: str | None = None
    places: tuple[tuple[str, Path], ...] = ()
    summary: Path | None = None

    def place(self, name: str) -> Path:
        """The absolute path of the place claimed as ``name``; KeyError if none was."""
        return dict(self.places)[name]


def _outside_input(name: str, given: str, paths: Sequence[str], pattern: str | None) -> Path:
    """``given`` as an absolute path, once it is known to share nothing with the input; UsageError if not."""
    path = Path(os.path.abspath(given))  # "." and ".." by name: the rename into place needs one
    real = path.resolve()
    for p in paths:
        why = overlap(real, Path(p).resolve())
        if why:
            raise UsageError(f"{name} {given} {why} {p}: choose {_a(name)} outside the input")
        why = linked_overlap(real, p)
        if why:
            raise UsageError(f"{name} {given} {why}: choose {_a(name)} outside the input")
    if pattern is not None and glob.has_magic(pattern) and _matches(pattern, path):
        raise UsageError(f"{name} {given} matches the input pattern {pattern}: choose {_a(name)} outside it")
    return path


def claim_output(
    output: str,
    paths: Sequence[str],
    *,
    pattern: str | None = None,
    may_exist: bool = False,
    apart: Sequence[tuple[str, str]] = (),
    beside: Sequence[tuple[str, str]] = (),
    summary: str | None = None,
) -> Claim:
    """Check, before anything starts, that OUTPUT and every other place the job writes can be written
    and share nothing with the input; the :class:`Claim`, or a one-line UsageError or JobError.

    Every path is compared with every input path after resolving symlinks, ``..`` and relative paths,
    whatever ``may_exist`` says: equal, inside or a parent of an input path, or of what a symlink under
    an input directory points to, is refused (the job would replace, re-read or delete its input). For
    a glob (``pattern``) none may match it either, or the next run with the same pattern would read it
    as input. ``apart``: places (name, path) kept apart from OUTPUT and from each other place too, as
    a checkpoint is (each holds files the other's reader does not expect); ``beside``: places that
    only need to lie outside the input and apart from those (a payload directory). ``summary``: the
    file the summary goes to (``--summary-json``): not in the input, nor in a place the job owns, where
    the job would replace or read it. OUTPUT that exists is refused unless ``may_exist`` (JobError).
    """
    out = _outside_input("output", output, paths, pattern)
    places = [(name, _outside_input(name, given, paths, pattern), given) for name, given in (*beside, *apart)]
    kept_apart = {name for name, _ in apart}
    owned = [("output", out, output), *places]
    for i, (name, path, given) in enumerate(owned):
        for other, other_path, other_given in owned[i + 1 :]:
            if kept_apart.isdisjoint((name, other)):
                continue
            if overlap(path.resolve(), other_path.resolve()) or overlap(other_path.resolve(), path.resolve()):
                raise UsageError(f"{name} {given} and {other} {other_given} overlap: keep them apart")
    target = None if summary is None else Path(os.path.abspath(summary))
    if target is not None and summary is not None:
        for name, where in [*(("input", p) for p in paths), *((n, g) for n, _, g in owned)]:
            if overlap(target.resolve(), Path(where).resolve()):
                raise UsageError(f"--summary-json {summary} is inside the {name} {where}: write it elsewhere")
        if pattern is not None and glob.has_magic(pattern) and _matches(pattern, target):
            raise UsageError(f"--summary-json {summary} matches the input pattern {pattern}: write it elsewhere")
    if out.exists() and not may_exist:
        raise JobError(f"output exists: {output} (use --overwrite)")
    if not out.parent.exists():
        raise JobError(f"output parent directory does not exist: {out.parent}")
    return Claim(tuple(paths), out, pattern, tuple((n, p) for n, p, _ in places), target)


def write_json(path: Path, doc: Any) -> None:
    """``doc`` as ``path``, all or nothing and durable: written to a hidden temporary beside it, flushed
    to the disk, renamed over it, and the rename flushed too. Readers never see half a file, and a
    commit record written so survives a crash of the machine."""
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_path(path.parent)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


# ------------------------------------------------------------------ who owns a temporary output
OWNER_FILE = ".reassemble-owner.json"
"""The marker in a hidden temporary (and in a replaced output being removed): the host and the
processes (this one and those it started to write there, such as Spark's JVM) of the run it is for."""

ORPHAN_AFTER = 60.0
"""Seconds after which a hidden temporary without a readable marker is taken for litter. A run
writes its marker right after creating the directory, so only a run killed in that instant, or a
writer that outlived its run and recreated a path under it, leaves one."""


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
                discard((tmp,), settle)


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


def discard(paths: Sequence[Path], settle: Callable[[], bool] | None = None) -> None:
    """Remove what a failed or interrupted job wrote, once ``settle`` has stopped whatever else writes
    there (see :func:`atomic_dir`); again for a moment if the writers were not seen to stop."""
    quiet = True
    if settle is not None:
        try:
            quiet = settle()
        except Exception:  # the writers' session is broken: nothing more to ask it
            logger.debug("stopping the writers failed", exc_info=True)
            quiet = False
    for path in paths:
        _remove(path)
    if not quiet:  # a writer not seen to stop may still recreate a path under one: look again
        for delay in (0.2, 0.5, 1.0):
            time.sleep(delay)
            for path in paths:
                if path.exists() or path.is_symlink():
                    _remove(path)


