"""Which landing files are new: the input listed as Spark lists it, each file known by its path, size
and modification time, and a recorded file that changed refused (:mod:`reassembly.spark.incremental`,
"Which files are new")."""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Sequence
from pathlib import Path

from reassembly._errors import JobError
from reassembly.spark.incremental.commit import read_json
from reassembly.spark.incremental.model import RECORDS, LandingFile


def _skipped(name: str) -> bool:
    """Names Spark's file index skips when it lists a directory (hidden, metadata, files being copied)."""
    return name.startswith(".") or (name.startswith("_") and "=" not in name) or name.endswith("._COPYING_")


def landing_files(pattern: str, paths: Sequence[str]) -> list[LandingFile]:
    """Every file the input names, as Spark would read it: directories listed recursively (through
    symlinks, each real directory once) without the names Spark skips; a glob's matches likewise.

    ``pattern``: the input as given (a path or a glob): a file named literally is read whatever its name. ``paths``:
    what it expands to.
    """
    found: dict[str, LandingFile] = {}
    seen_dirs: set[str] = set()

    def add(path: str) -> None:
        real = os.path.realpath(path)
        st = os.stat(real)
        found.setdefault(real, LandingFile(real, st.st_size, st.st_mtime_ns))

    literal = not glob.has_magic(pattern)
    for p in paths:
        if not os.path.isdir(p):
            if literal or not _skipped(os.path.basename(p)):
                add(p)
            continue
        for root, dirs, files in os.walk(p, followlinks=True):
            real = os.path.realpath(root)
            if real in seen_dirs:
                dirs[:] = []
                continue
            seen_dirs.add(real)
            dirs[:] = sorted(d for d in dirs if not _skipped(d))
            for name in sorted(files):
                if not _skipped(name):
                    add(os.path.join(root, name))
    return sorted(found.values(), key=lambda f: f.path)


def processed_files(ck: Path, runs: Sequence[int]) -> dict[str, tuple[int, int, int]]:
    """Every file a committed run read: real path -> (size, mtime_ns, run)."""
    known: dict[str, tuple[int, int, int]] = {}
    for n in runs:
        for path, size, mtime_ns in read_json(ck / RECORDS / f"{n}.json")["files"]:
            known[path] = (size, mtime_ns, n)
    return known


def iso_utc(ns: int, digits: int = 9) -> str:
    """A time in ns since the epoch as UTC ISO 8601, with ``digits`` of the second's fraction."""
    fraction = f"{ns % 1_000_000_000:09d}"[:digits]
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // 1_000_000_000)) + f".{fraction}Z"


def new_files(listing: Sequence[LandingFile], known: dict[str, tuple[int, int, int]]) -> list[LandingFile]:
    """The files of ``listing`` no committed run read; JobError naming a read file that has changed since.

    ``known``: every file a committed run read, real path -> (size, modification time in ns, run).
    """
    fresh, changed = [], []
    for f in listing:
        was = known.get(f.path)
        if was is None:
            fresh.append(f)
        elif (f.size, f.mtime_ns) != was[:2]:
            changed.append((f, was))
    if changed:
        f, (size, mtime_ns, n) = changed[0]
        more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        raise JobError(
            f"landing file {f.path} changed after run {n} read it (size {size} -> {f.size}, modified "
            f"{iso_utc(mtime_ns)} -> {iso_utc(f.mtime_ns)}){more}: its rows were used; land new rows as a new file"
            " and restore or move this one out of the input"
        )
    return fresh


def restat(f: LandingFile) -> LandingFile:
    try:
        st = os.stat(f.path)
    except OSError:
        return LandingFile(f.path, -1, -1)
    return LandingFile(f.path, st.st_size, st.st_mtime_ns)
