"""The checkpoint and the commit of a run: the paths checked, the binding of OUTPUT to its checkpoint, the
lock, the commit record (the commit point) and the publication after it, and the recovery of a run whose
publication a crash cut short (:mod:`reassembly.spark.incremental`, "Commit protocol")."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import signal
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from reassembly._errors import JobError, first_line
from reassembly._files import Claim, claim_output, inputs, write_json
from reassembly.spark.batch.output import RUN_MARKERS
from reassembly.spark.incremental.model import CARRY, FOLDERS, KILL_AT, LAYOUT, LOCK, MANIFEST, RECORDS
from reassembly.spark.schema import MANIFEST as SCHEMA_MANIFEST

log = logging.getLogger(__name__)


def check_paths(pattern: str, output: str, checkpoint: str, summary: str | None = None) -> Claim:
    """The input paths, OUTPUT, the checkpoint and the summary file claimed, or a one-line error;
    touches nothing.

    OUTPUT is claimed as ``reassemble run`` claims it (:func:`~reassembly._files.claim_output`: equal
    to, inside or a parent of an input path, through symlinks, or matched by the glob: a UsageError);
    it may exist (it is appended to). The checkpoint likewise, and the two apart (each holds files the
    other's reader does not expect).

    ``pattern``: the input path or glob. ``output``: OUTPUT. ``checkpoint``: the checkpoint directory. ``summary``: the
    ``--summary-json`` file (None: none).
    """
    claimed = claim_output(
        output, inputs(pattern), pattern=pattern, may_exist=True, apart=[("checkpoint", checkpoint)], summary=summary
    )
    ck = claimed.place("checkpoint")
    if not ck.parent.exists():
        raise JobError(f"checkpoint parent directory does not exist: {ck.parent}")
    return claimed


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise JobError(f"cannot read {path}: {first_line(exc)}") from None


def _entries(directory: Path, ignore: Sequence[str] = ()) -> list[str]:
    return [p.name for p in directory.iterdir() if p.name not in ignore] if directory.is_dir() else []


def recorded_runs(ck: Path) -> list[int]:
    folder = ck / RECORDS
    return sorted(int(p.stem) for p in folder.glob("*.json") if p.stem.isdigit()) if folder.is_dir() else []


def check_binding(out: Path, ck: Path, raw_column: str, encoded: bool) -> dict[str, Any] | None:
    """The checkpoint's manifest as this run binds it (None: a new checkpoint), or a JobError saying
    why this OUTPUT, checkpoint and input format do not belong together; touches nothing.

    ``out``: OUTPUT. ``ck``: the checkpoint directory. ``raw_column``: the column of encoded segments the checkpoint
    reads. ``encoded``: True when the landing rows hold encoded segments, False when they hold segments as columns.
    """
    manifest = read_json(ck / MANIFEST)
    bound = read_json(out / MANIFEST)
    if manifest is None:
        if _entries(ck, (LOCK,)):
            raise JobError(f"checkpoint {ck} is not empty and not an incremental checkpoint (a stream's?)")
        if _entries(out):
            raise JobError(f"output exists and is not the incremental output of checkpoint {ck}: {out}")
        return None
    if manifest.get("layout") != LAYOUT:
        raise JobError(f"checkpoint {ck} has layout {manifest.get('layout')}; this version reads layout {LAYOUT}")
    if manifest.get("output") != str(out.resolve()):
        raise JobError(f"checkpoint {ck} belongs to output {manifest.get('output')}, not {out}")
    runs = recorded_runs(ck)
    fmt = {"raw_column": raw_column, "encoded": encoded}
    changed = {k: (manifest.get(k), v) for k, v in fmt.items() if manifest.get(k) != v}
    if changed and runs:  # before a first commit there is no carry: a corrected option is simply taken
        raise JobError(
            f"checkpoint {ck} was begun with "
            + ", ".join(f"{k}={a!r} (now {b!r})" for k, (a, b) in changed.items())
            + ": its carried rows are in that form; use the same, or start a new checkpoint and output"
        )
    if bound is None:
        if runs:
            raise JobError(f"output {out} is missing its runs ({MANIFEST} is gone) that checkpoint {ck} records")
        if [e for e in _entries(out) if e != RUN_MARKERS] or _entries(out / RUN_MARKERS):
            raise JobError(f"output exists and is not the incremental output of checkpoint {ck}: {out}")
    elif bound.get("checkpoint_id") != manifest.get("id"):
        raise JobError(f"output {out} belongs to another checkpoint ({bound.get('checkpoint')}), not {ck}")
    return {**manifest, **fmt}


def bind(out: Path, ck: Path, manifest: dict[str, Any] | None, raw_column: str, encoded: bool) -> None:
    """Write the two manifests where missing or changed (:func:`check_binding` allowed the change):
    the checkpoint's first (a crash between the two is resumed: a checkpoint without runs accepts an
    empty output without its manifest)."""
    if manifest is None:
        manifest = {
            "layout": LAYOUT,
            "id": uuid.uuid4().hex,
            "output": str(out.resolve()),
            "raw_column": raw_column,
            "encoded": encoded,
        }
    if read_json(ck / MANIFEST) != manifest:
        write_json(ck / MANIFEST, manifest)
    out.mkdir(exist_ok=True)
    (out / RUN_MARKERS).mkdir(exist_ok=True)
    if not (out / MANIFEST).exists():
        write_json(out / MANIFEST, {"layout": LAYOUT, "checkpoint_id": manifest["id"], "checkpoint": str(ck)})


@contextmanager
def locked(ck: Path) -> Iterator[None]:
    """The checkpoint to this process alone (``flock``: released when the process dies, however)."""
    ck.mkdir(exist_ok=True)
    fd = os.open(ck / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise JobError(f"another run is using checkpoint {ck} (it holds {ck / LOCK})") from None
        yield
    finally:
        os.close(fd)


def reached(point: str) -> None:
    """The fault-injection point ``point`` of the commit protocol (see :data:`KILL_AT`)."""
    if os.environ.get(KILL_AT) == point:
        os.kill(os.getpid(), signal.SIGKILL)


# ------------------------------------------------------------------ commit and recovery


def staging_dir(out: Path, run: int, attempt: str) -> Path:
    return out / f".run={run}.{attempt}.staging"


def carry_staging(ck: Path, run: int, attempt: str) -> Path:
    return ck / CARRY / f".run={run}.{attempt}.staging"


def publish(out: Path, ck: Path, record: dict[str, Any]) -> None:
    """Make committed run N visible; every step is skipped once done, so a crash anywhere is resumed."""
    n, attempt = int(record["run"]), str(record["attempt"])
    staged_carry, carry = carry_staging(ck, n, attempt), ck / CARRY / f"run={n}"
    if staged_carry.exists() and not carry.exists():
        staged_carry.rename(carry)
    staging = staging_dir(out, n, attempt)
    for name in FOLDERS:
        src, dst = staging / name, out / name / f"run={n}"
        if src.exists() and not dst.exists():
            dst.parent.mkdir(exist_ok=True)
            src.rename(dst)
        if name == "messages":
            reached("published-messages")
    if (staging / SCHEMA_MANIFEST).exists():  # the schema version of the latest run's folders
        os.replace(staging / SCHEMA_MANIFEST, out / SCHEMA_MANIFEST)
    shutil.rmtree(staging, ignore_errors=True)
    write_json(out / RUN_MARKERS / str(n), record["summary"])
    reached("published")
    for old in (ck / CARRY).glob("run=*"):
        if old.name != carry.name:
            shutil.rmtree(old, ignore_errors=True)


def recover(out: Path, ck: Path) -> tuple[int, dict[str, Any] | None]:
    """Finish publishing the committed runs, remove what uncommitted attempts left; the last run and its record."""
    runs = recorded_runs(ck)
    published = set(_entries(out / RUN_MARKERS))
    for n in runs:
        if str(n) not in published:
            log.info("run %d is committed but not fully published: publishing it", n)
            publish(out, ck, read_json(ck / RECORDS / f"{n}.json"))
    final = runs[-1] if runs else 0
    last = read_json(ck / RECORDS / f"{final}.json") if runs else None
    stale = [p for p in (ck / CARRY).glob("run=*") if p.name != f"run={final}"]  # superseded carries
    for leftover in [*out.glob(".run=*.staging"), *(ck / CARRY).glob(".run=*"), *stale]:
        log.info("removing %s (left by an attempt that did not commit, or superseded)", leftover)
        shutil.rmtree(leftover, ignore_errors=True)
    for tmp in [*(ck / RECORDS).glob(".*.tmp*"), *(out / RUN_MARKERS).glob(".*.tmp*")]:  # write_json's
        tmp.unlink(missing_ok=True)
    for name in FOLDERS:
        numbers = {p: p.name.removeprefix("run=") for p in (out / name).glob("run=*")}
        ahead = [p for p, n in numbers.items() if not n.isdigit() or int(n) > final]
        if ahead:
            raise JobError(f"output holds {ahead[0]}, a run checkpoint {ck} does not record: was it replaced?")
    return final, last
