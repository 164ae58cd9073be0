"""``reassemble run INPUT OUTPUT --incremental --checkpoint DIR``: the batch job on what landed since its last run.

A schedule (cron, an orchestrator) calls the same command again and again. Each run reads only the
landing files no committed run read, reassembles them together with what the last run carried
over, and publishes its rows in ``run`` folders of the layout ``reassemble run`` writes:
``OUTPUT/messages/run=N/``, ``OUTPUT/quarantine/run=N/`` and ``OUTPUT/payloads/run=N/`` (large
messages), so ``spark.read.parquet(OUTPUT/messages)`` has a ``run`` column and
:func:`reassembly.spark.batch.output.read_output` reads committed runs only. User documentation:
docs/how-to/scheduling.md.

**Which files are new.** A landing file is known by its path (symlinks resolved), size and
modification time, recorded in the commit record of the run that read it. A recorded file whose
size or modification time changed is an error naming it (its rows were used: read again they
would be delivered twice, skipped they would be lost); a recorded file that is gone is fine
(retention). Directories are listed as Spark lists them (names starting with ``_`` or ``.`` are
skipped), so a landing writer renaming finished files in keeps its work files out.

**What carries over.** A message still ``incomplete`` at the end of a run (not yet expired) is not
written: every landing row of its group (the rows the reassembly routed by that GroupId:
routable framing, the GroupId read from the header, :func:`with_routing_key`) is written to the
checkpoint's carry folder, with the time a run first read it, and the next run reads those rows
back beside its new files. A message whose segments land in two runs is thus complete in the
later one, and a Unit-of-Work group is decided whole. The group's other output rows (its held
segments' quarantine rows, a complete message of the same group) are dropped from this run's
output with it, so every landing row is in exactly one place: ``rows in (new + carried in) = used +
quarantined + duplicates + carried out``, checked before the run commits. Rows that are not
segments and messages decided otherwise (corrupt, conflict, ...) are final and never carried.

**Bounds.** A carried group older than ``expire_after`` (since a run first read one of its
rows) is written as incomplete, with what the reassembly found missing, instead of carried; so
are the oldest groups while the carried segment bytes exceed ``carry_max_bytes``.

**Checkpoint layout** (``DIR``)::

    _incremental.json            the binding: layout, checkpoint id, OUTPUT, segment column, format
    .lock                        flock'ed by the run in progress (a second run is refused)
    runs/N.json                  commit record of run N: its files (path, size, mtime),
                                 counts, carry facts and its attempt's staging name
    carry/run=N/                 the landing rows run N carried over (Parquet, their own
                                 columns plus FIRST_SEEN), read by run N+1 only

and in ``OUTPUT``: ``_incremental.json`` (the checkpoint id it belongs to), ``_runs/N`` (run N is
published: what :func:`~reassembly.spark.batch.output.read_output` reads) and, while a run works, its
hidden staging folder ``.run=N.<attempt>.staging/``.

**Commit protocol.** A run stages everything under hidden names: its output in
``OUTPUT/.run=N.<attempt>.staging/`` (``messages``, ``quarantine``, ``payloads``), its carry in
``DIR/carry/.run=N.<attempt>.staging``. The commit point is the record ``DIR/runs/N.json``
(written to a temporary name, fsynced, renamed, directory fsynced). Then publication: the carry
and each output folder renamed to its ``run=N`` name, the marker ``OUTPUT/_runs/N`` written last,
the previous carry removed. A crash before the record leaves the previous committed state (the
next run removes the staging and does the work again, with the same files); a crash after it
leaves run N committed, and the next run finishes its publication first (every step is a
rename that is skipped once done). So no visible folder ever holds an uncommitted run, not
even after a crash. Each attempt stages under its own name: a killed run's JVM still finishing a
task can only write into a folder no later attempt uses. Ctrl-C and SIGTERM during the commit
(milliseconds) take effect once it is done.
"""

from __future__ import annotations

import fcntl
import glob
import json
import logging
import os
import shutil
import signal
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from reassembly._errors import JobError, UsageError, first_line
from reassembly._files import claim_output, hadoop_literal, inputs, linked_overlap, overlap
from reassembly._processes import INTERRUPTED, deferred_interrupts
from reassembly.spark.batch.job import tidy_payloads, totals_by_status
from reassembly.spark.batch.output import PAYLOADS, RUN_MARKERS
from reassembly.spark.batch.pipeline import ReassemblyOptions
from reassembly.spark.engine.session import SparkSettings, open_session, stop_spark
from reassembly.spark.schema import MANIFEST as SCHEMA_MANIFEST
from reassembly.spark.writer import parquet_writer
from segmenter.header_table import FIELD
from segmenter.wire import GROUP_ID_LENGTH

log = logging.getLogger(__name__)


def _n(count: int, noun: str) -> str:
    """``count`` and ``noun``, plural unless one: "1 incomplete group", "3 rows"."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


LAYOUT = 1  # of the checkpoint and of the output's incremental files (raise it when either changes meaning)
MANIFEST = "_incremental.json"  # in DIR and in OUTPUT
RECORDS = "runs"  # DIR/runs/N.json
CARRY = "carry"  # DIR/carry/run=N
LOCK = ".lock"
FIRST_SEEN = "_reassembly_first_seen_ms"  # carried rows: when a run first read the row (ms since the epoch)
FOLDERS = ("messages", "quarantine", PAYLOADS)  # a run's output folders, in publication order
DEFAULT_EXPIRE_AFTER = 7 * 86400.0
DEFAULT_CARRY_MAX_BYTES = 1 << 30
# Fault injection for the tests of the commit protocol: the process kills itself (SIGKILL) on
# reaching the named point (KILL_POINTS). Never set in production.
KILL_AT = "REASSEMBLY_INCREMENTAL_KILL_AT"
KILL_POINTS = ("staged", "recorded", "published-messages", "published")

_GID_AT = FIELD["group_id"].offset  # where the GroupId sits in a header (from the header table)
_PACK = "__reassembly_landing"  # helper column names: chosen not to meet a landing table's
_KEY, _GID, _FILE, _REF = "__reassembly_key", "__reassembly_gid", "__reassembly_file", "__reassembly_ref"


@dataclass(frozen=True)
class IncrementalOptions:
    """What ``--incremental`` adds to a run: where its checkpoint is, and the carry's bounds."""

    checkpoint: str
    """The directory recording the files each run read and the rows carried over (keep it; outside
    the input and the output)."""
    expire_after: float = DEFAULT_EXPIRE_AFTER
    """Seconds since a run first read a carried group's first row after which the group is written as
    incomplete instead of carried again."""
    carry_max_bytes: int = DEFAULT_CARRY_MAX_BYTES
    """Segment bytes carried over at most; past it the oldest incomplete groups are written as
    incomplete."""

    @classmethod
    def from_flags(
        cls,
        incremental: bool,
        checkpoint: str | None,
        overwrite: bool,
        expire_after: float | None,
        carry_max_bytes: int | None,
    ) -> IncrementalOptions | None:
        """The options the command line's flags ask for, None for a plain run, or a UsageError.

        ``--overwrite`` is refused: an incremental output is appended to, run by run; replacing
        it would leave a checkpoint recording runs the output no longer holds. Starting over is
        removing OUTPUT and the checkpoint."""
        if not incremental:
            named = [f for f, v in (("--checkpoint", checkpoint), ("--expire-after", expire_after),
                                    ("--carry-max-bytes", carry_max_bytes)) if v is not None]  # fmt: skip
            if named:
                raise UsageError(f"{named[0]} needs --incremental")
            return None
        if checkpoint is None:
            raise UsageError("--incremental needs --checkpoint DIR (what earlier runs processed and carried)")
        if overwrite:
            raise UsageError(
                "--overwrite with --incremental: an incremental output is appended to, run by run;"
                " to start over remove OUTPUT and the checkpoint"
            )
        return cls(
            checkpoint,
            DEFAULT_EXPIRE_AFTER if expire_after is None else expire_after,
            DEFAULT_CARRY_MAX_BYTES if carry_max_bytes is None else carry_max_bytes,
        )


@dataclass(frozen=True)
class LandingFile:
    """A landing file as the checkpoint knows it: real path, size, modification time (ns)."""

    path: str
    size: int
    mtime_ns: int

    def as_json(self) -> list[Any]:
        return [self.path, self.size, self.mtime_ns]


class CarryAccounting(NamedTuple):
    """Every row a run read is accounted for: used, quarantined, a duplicate copy, or carried over."""

    new: int
    carried_in: int
    used: int
    quarantined: int
    duplicates: int
    carried_out: int

    @property
    def rows_in(self) -> int:
        return self.new + self.carried_in

    @property
    def holds(self) -> bool:
        return self.rows_in == self.used + self.quarantined + self.duplicates + self.carried_out

    def line(self) -> str:
        return (
            f"segments: {self.rows_in} in ({self.new} new + {self.carried_in} carried in) = {self.used} used + "
            f"{self.quarantined} quarantined + {self.duplicates} duplicates + {self.carried_out} carried out: "
            f"{'holds' if self.holds else 'BROKEN'}"
        )


@dataclass(frozen=True)
class CarryFacts:
    """What a run carried over (in its record): rows, segment bytes, groups, the oldest first-seen time."""

    rows: int = 0
    bytes: int = 0
    groups: int = 0
    oldest_ms: int | None = None

    def due(self, now_ms: int, options: IncrementalOptions) -> bool:
        """Would a run now write some carried group instead of carrying it (age or size)?"""
        if not self.rows:
            return False
        old = self.oldest_ms is not None and now_ms - self.oldest_ms >= options.expire_after * 1000
        return old or self.bytes > options.carry_max_bytes


@dataclass(frozen=True)
class IncrementalReport:
    """One call's outcome: the run committed (None: nothing to do), the lines to show, its accounting
    and the messages it wrote by status (expired groups' included)."""

    run: int | None
    lines: tuple[str, ...]
    accounting: CarryAccounting | None
    output: Path
    checkpoint: Path
    statuses: Mapping[str, int] = field(default_factory=dict)
    summary: Mapping[str, Any] = field(default_factory=dict)
    """The run's counts as its record in the checkpoint and ``OUTPUT/_runs/N`` hold them; idle: only
    ``carried``, what the last run carried over and still is (its rows, groups, bytes, ``oldest_ms``)."""


# ------------------------------------------------------------------ paths, binding, lock


def _glob_reaches(pattern: str, path: Path) -> bool:
    """Would the glob ``pattern`` match ``path`` or a folder above it (so a later run would read it)?"""
    import fnmatch

    parts = Path(os.path.abspath(pattern)).parts
    fixed = next(i for i, part in enumerate(parts) if glob.has_magic(part))
    patterns = {os.path.join(*parts), str(Path(*parts[:fixed]).resolve().joinpath(*parts[fixed:]))}
    candidates = {Path(os.path.abspath(path)), path.resolve()}
    return any(fnmatch.fnmatchcase(str(c), p) for p in patterns for o in candidates for c in (o, *o.parents))


def check_paths(pattern: str, output: str, checkpoint: str) -> tuple[list[str], Path, Path]:
    """The input paths, OUTPUT and the checkpoint, or a one-line error; touches nothing.

    OUTPUT is checked as ``reassemble run`` checks it (:func:`~reassembly._files.claim_output`:
    equal to, inside or a parent of an input path, through symlinks, or matched by the glob: a
    UsageError); it may exist (it is appended to). The checkpoint likewise, and the two apart
    (each holds files the other's reader does not expect)."""
    paths = inputs(pattern)
    out = claim_output(output, True, pattern, paths)
    ck = Path(os.path.abspath(checkpoint))
    real = ck.resolve()
    for p in paths:
        why = overlap(real, Path(p).resolve()) or linked_overlap(real, p)
        if why:
            raise UsageError(f"checkpoint {checkpoint} {why} {p}: choose a checkpoint outside the input")
    if glob.has_magic(pattern) and _glob_reaches(pattern, ck):
        raise UsageError(f"checkpoint {checkpoint} matches the input pattern {pattern}: choose one outside it")
    if overlap(out.resolve(), real) or overlap(real, out.resolve()):
        raise UsageError(f"output {output} and checkpoint {checkpoint} overlap: keep them apart")
    if not ck.parent.exists():
        raise JobError(f"checkpoint parent directory does not exist: {ck.parent}")
    return paths, out, ck


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise JobError(f"cannot read {path}: {first_line(exc)}") from None


def _write_json(path: Path, doc: Any) -> None:
    """``doc`` under ``path``, atomically and durably (temporary name, fsync, rename, directory fsync)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps(doc, indent=1) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _entries(directory: Path, ignore: Sequence[str] = ()) -> list[str]:
    return [p.name for p in directory.iterdir() if p.name not in ignore] if directory.is_dir() else []


def _records(ck: Path) -> list[int]:
    folder = ck / RECORDS
    return sorted(int(p.stem) for p in folder.glob("*.json") if p.stem.isdigit()) if folder.is_dir() else []


def check_binding(out: Path, ck: Path, raw_column: str, encoded: bool) -> dict[str, Any] | None:
    """The checkpoint's manifest as this run binds it (None: a new checkpoint), or a JobError saying
    why this OUTPUT, checkpoint and input format do not belong together; touches nothing."""
    manifest = _read_json(ck / MANIFEST)
    bound = _read_json(out / MANIFEST)
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
    runs = _records(ck)
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


def _bind(out: Path, ck: Path, manifest: dict[str, Any] | None, raw_column: str, encoded: bool) -> None:
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
    if _read_json(ck / MANIFEST) != manifest:
        _write_json(ck / MANIFEST, manifest)
    out.mkdir(exist_ok=True)
    (out / RUN_MARKERS).mkdir(exist_ok=True)
    if not (out / MANIFEST).exists():
        _write_json(out / MANIFEST, {"layout": LAYOUT, "checkpoint_id": manifest["id"], "checkpoint": str(ck)})


@contextmanager
def _locked(ck: Path) -> Iterator[None]:
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


def _reached(point: str) -> None:
    """The fault-injection point ``point`` of the commit protocol (see :data:`KILL_AT`)."""
    if os.environ.get(KILL_AT) == point:
        os.kill(os.getpid(), signal.SIGKILL)


# ------------------------------------------------------------------ commit and recovery


def _staging(out: Path, run: int, attempt: str) -> Path:
    return out / f".run={run}.{attempt}.staging"


def _carry_staging(ck: Path, run: int, attempt: str) -> Path:
    return ck / CARRY / f".run={run}.{attempt}.staging"


def _publish(out: Path, ck: Path, record: dict[str, Any]) -> None:
    """Make committed run N visible; every step is skipped once done, so a crash anywhere is resumed."""
    n, attempt = int(record["run"]), str(record["attempt"])
    staged_carry, carry = _carry_staging(ck, n, attempt), ck / CARRY / f"run={n}"
    if staged_carry.exists() and not carry.exists():
        staged_carry.rename(carry)
    staging = _staging(out, n, attempt)
    for name in FOLDERS:
        src, dst = staging / name, out / name / f"run={n}"
        if src.exists() and not dst.exists():
            dst.parent.mkdir(exist_ok=True)
            src.rename(dst)
        if name == "messages":
            _reached("published-messages")
    if (staging / SCHEMA_MANIFEST).exists():  # the schema version of the latest run's folders
        os.replace(staging / SCHEMA_MANIFEST, out / SCHEMA_MANIFEST)
    shutil.rmtree(staging, ignore_errors=True)
    _write_json(out / RUN_MARKERS / str(n), record["summary"])
    _reached("published")
    for old in (ck / CARRY).glob("run=*"):
        if old.name != carry.name:
            shutil.rmtree(old, ignore_errors=True)


def _recover(out: Path, ck: Path) -> tuple[int, dict[str, Any] | None]:
    """Finish publishing the committed runs, remove what uncommitted attempts left; the last run and its record."""
    runs = _records(ck)
    published = set(_entries(out / RUN_MARKERS))
    for n in runs:
        if str(n) not in published:
            log.info("run %d is committed but not fully published: publishing it", n)
            _publish(out, ck, _read_json(ck / RECORDS / f"{n}.json"))
    final = runs[-1] if runs else 0
    last = _read_json(ck / RECORDS / f"{final}.json") if runs else None
    stale = [p for p in (ck / CARRY).glob("run=*") if p.name != f"run={final}"]  # superseded carries
    for leftover in [*out.glob(".run=*.staging"), *(ck / CARRY).glob(".run=*"), *stale]:
        log.info("removing %s (left by an attempt that did not commit, or superseded)", leftover)
        shutil.rmtree(leftover, ignore_errors=True)
    for tmp in [*(ck / RECORDS).glob(".*.tmp"), *(out / RUN_MARKERS).glob(".*.tmp")]:
        tmp.unlink(missing_ok=True)
    for name in FOLDERS:
        numbers = {p: p.name.removeprefix("run=") for p in (out / name).glob("run=*")}
        ahead = [p for p, n in numbers.items() if not n.isdigit() or int(n) > final]
        if ahead:
            raise JobError(f"output holds {ahead[0]}, a run checkpoint {ck} does not record: was it replaced?")
    return final, last


# ------------------------------------------------------------------ landing files


def _skipped(name: str) -> bool:
    """Names Spark's file index skips when it lists a directory (hidden, metadata, files being copied)."""
    return name.startswith(".") or (name.startswith("_") and "=" not in name) or name.endswith("._COPYING_")


def landing_files(pattern: str, paths: Sequence[str]) -> list[LandingFile]:
    """Every file the input names, as Spark would read it: directories listed recursively (through
    symlinks, each real directory once) without the names Spark skips; a glob's matches likewise."""
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


def _processed(ck: Path, runs: Sequence[int]) -> dict[str, tuple[int, int, int]]:
    """Every file a committed run read: real path -> (size, mtime_ns, run)."""
    known: dict[str, tuple[int, int, int]] = {}
    for n in runs:
        for path, size, mtime_ns in _read_json(ck / RECORDS / f"{n}.json")["files"]:
            known[path] = (size, mtime_ns, n)
    return known


def _when(ns: int, digits: int = 9) -> str:
    """A time in ns since the epoch as UTC ISO 8601, with ``digits`` of the second's fraction."""
    fraction = f"{ns % 1_000_000_000:09d}"[:digits]
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // 1_000_000_000)) + f".{fraction}Z"


def new_files(listing: Sequence[LandingFile], known: dict[str, tuple[int, int, int]]) -> list[LandingFile]:
    """The files of ``listing`` no committed run read; JobError naming a read file that has changed since."""
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
            f"{_when(mtime_ns)} -> {_when(f.mtime_ns)}){more}: its rows were used; land new rows as a new file"
            " and restore or move this one out of the input"
        )
    return fresh


# ------------------------------------------------------------------ Spark


def with_routing_key(df: Any, raw_column: str, name: str = _KEY) -> Any:
    """``df`` with one more column, ``name``: the GroupId the reassembly routes the row by, NULL for a
    row it routes by a hash of its bytes (framing broken, NULL, too short).

    The same rules as :func:`~reassembly.spark.batch.decode.decode_segments`' ``routable`` (generated from
    :mod:`segmenter.header_table`, ``ROUTING_STAGES``), over ``df``'s other columns untouched (they
    travel in one struct while the header's fields are computed beside them)."""
    from pyspark.sql import functions as F

    from reassembly.spark.batch.decode import routable_sql
    from segmenter import header_render
    from segmenter.wire import table_constants

    env = table_constants()
    fields = header_render.sql_fields("raw")
    d = df.select(
        F.struct(*[F.col(f"`{c}`") for c in df.columns]).alias(_PACK),
        F.col(f"`{raw_column}`").cast("binary").alias("raw"),
    )
    d = d.select(_PACK, "raw", F.expr(fields["header_length"]).alias("header_length"))
    d = d.select("*", *[F.expr(sql).alias(n) for n, sql in fields.items() if n != "header_length"])
    d = d.select("*", *[F.expr(sql).alias(n) for n, sql in header_render.sql_derived(env).items()])
    routable = F.coalesce(F.expr(routable_sql(env)), F.lit(False))
    return d.select(f"{_PACK}.*", F.when(routable, F.col("group_id")).alias(name))


def _gid(raw_column: str) -> Any:
    """The GroupId's bytes of a row (what the routing key is when the row is routable)."""
    from pyspark.sql import functions as F

    return F.substring(F.col(f"`{raw_column}`"), _GID_AT + 1, GROUP_ID_LENGTH)


def _read(spark: Any, *paths: Path | str) -> Any:
    return spark.read.parquet(*(hadoop_literal(str(p)) for p in paths))


def _local(uri: str) -> Path:
    from urllib.parse import unquote, urlparse

    parsed = urlparse(uri)
    if parsed.scheme not in ("", "file"):
        raise JobError(f"the incremental job writes local paths only, found {uri}")
    return Path(unquote(parsed.path))


@dataclass(frozen=True)
class _Carry:
    """The outcome of a run's carry decision."""

    facts: CarryFacts
    expired_by_age: int = 0
    expired_by_size: int = 0


def _decide_carry(
    spark: Any, rows: Any, raw_column: str, staging: Path, carry: Path, now_ms: int, options: IncrementalOptions
) -> _Carry:
    """Write the landing rows of the groups still incomplete (not expired) to ``carry``.

    Candidates: the GroupIds of the staged ``incomplete`` messages. Their rows: the landing rows
    routed by one of them (a broadcast semi-join on the header's GroupId bytes, then the exact
    routing rule on those rows only). Then the bounds, group by group, by first-seen time."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    candidates = (
        _read(spark, staging / "messages")
        .where("status = 'incomplete'")
        .select(F.col("group_id").alias(_GID))
        .distinct()
    )
    if candidates.limit(1).count() == 0:
        return _Carry(CarryFacts())
    every = carry.with_name(carry.name + ".all")
    near = rows.join(F.broadcast(candidates), _gid(raw_column) == F.col(_GID), "left_semi")
    exact = with_routing_key(near, raw_column).where(F.col(_KEY).isNotNull()).drop(_KEY)
    parquet_writer(exact).parquet(str(every))
    written = _read(spark, every)
    groups = written.groupBy(_gid(raw_column).alias(_GID)).agg(
        F.min(FIRST_SEEN).alias("first"),
        F.sum(F.length(F.col(f"`{raw_column}`"))).alias("bytes"),
        F.count("*").alias("rows"),
    )
    # Age first; then, newest first, the groups whose running total of bytes stays within the bound:
    # the same as writing the oldest out until what remains fits.
    aged = F.lit(now_ms) - F.col("first") >= F.lit(int(options.expire_after * 1000))
    newest_first = Window.orderBy(F.desc("first"), F.desc(_GID)).rowsBetween(Window.unboundedPreceding, 0)
    young = groups.where(~aged).withColumn("total", F.sum("bytes").over(newest_first))
    verdicts = groups.where(aged).select(_GID, "first", "bytes", "rows", F.lit("age").alias("verdict")).unionByName(
        young.select(
            _GID, "first", "bytes", "rows",
            F.when(F.col("total") > options.carry_max_bytes, "size").otherwise("carry").alias("verdict"),
        )
    ).cache()  # fmt: skip
    try:
        tally = {
            r.verdict: r
            for r in verdicts.groupBy("verdict")
            .agg(F.count("*").alias("groups"), F.sum("rows").alias("rows"), F.sum("bytes").alias("bytes"),
                 F.min("first").alias("oldest"))
            .collect()
        }  # fmt: skip
        kept = tally.get("carry")
        if kept is None:
            shutil.rmtree(every)
        elif len(tally) == 1:
            every.rename(carry)
        else:
            keep = verdicts.where("verdict = 'carry'").select(_GID)
            parquet_writer(written.join(F.broadcast(keep), _gid(raw_column) == F.col(_GID), "left_semi")).parquet(
                str(carry)
            )
            shutil.rmtree(every)
    finally:
        verdicts.unpersist()
    facts = CarryFacts(int(kept.rows), int(kept.bytes), int(kept.groups), int(kept.oldest)) if kept else CarryFacts()
    return _Carry(
        facts, int(tally["age"].groups) if "age" in tally else 0, int(tally["size"].groups) if "size" in tally else 0
    )


def _replace_files(spark: Any, folder: Path, files: list[str], kept: Any, columns: list[str]) -> None:
    """Rewrite ``files`` of ``folder`` (staged, not yet visible) as ``kept``: their rows but the dropped ones."""
    import pyarrow.parquet as pq

    schema = pq.read_schema(files[0])
    tmp = folder.with_name(f".{folder.name}.rewrite")
    shutil.rmtree(tmp, ignore_errors=True)
    parquet_writer(kept.select(*[f"`{c}`" for c in columns])).parquet(str(tmp))
    for f in map(Path, files):
        f.unlink()
        f.with_name(f".{f.name}.crc").unlink(missing_ok=True)  # Hadoop's checksum beside it
    for part in tmp.glob("*.parquet"):
        part.rename(folder / part.name)
    shutil.rmtree(tmp)
    if not any(folder.glob("*.parquet")):  # every row was carried: the folder keeps its columns
        pq.write_table(schema.empty_table(), folder / "part-00000-empty.parquet")


def _ref_keys(spark: Any, quarantine: Any, payloads: Path) -> Any:
    """The GroupId of each quarantine row by reference whose header did not decode (``group_id`` NULL):
    read from its original bytes in the payload folder (a few bytes each). Only a routable row is ever
    quarantined by reference (the judge's stores serve routed groups), so its routing key is those bytes."""
    refs = quarantine.where("group_id IS NULL AND raw IS NULL AND raw_path IS NOT NULL").select(
        "raw_path", "raw_offset"
    )
    found = []
    for r in refs.collect():
        with open(payloads / r.raw_path, "rb") as f:
            f.seek(r.raw_offset + _GID_AT)
            found.append((r.raw_path, r.raw_offset, f.read(GROUP_ID_LENGTH)))
    if not found:
        return None
    return spark.createDataFrame(found, f"raw_path string, raw_offset bigint, {_REF} binary")


def _drop_carried(spark: Any, staging: Path, carry: Path, raw_column: str) -> None:
    """Remove from the staged output every row of the carried groups (they are decided by a later run)."""
    from pyspark.sql import functions as F

    carried = _read(spark, carry).select(_gid(raw_column).alias(_GID)).distinct()

    def messages(paths: Sequence[Path | str]) -> Any:
        df = _read(spark, *paths)
        return df.select("*", F.col("_metadata.file_path").alias(_FILE)), df.columns, F.col("group_id")

    refs = _ref_keys(spark, _read(spark, staging / "quarantine"), staging / PAYLOADS)

    def quarantine(paths: Sequence[Path | str]) -> Any:
        df = _read(spark, *paths)
        keyed = with_routing_key(df.select("*", F.col("_metadata.file_path").alias(_FILE)), "raw")
        if refs is not None:
            keyed = keyed.join(F.broadcast(refs), ["raw_path", "raw_offset"], "left")
        else:
            keyed = keyed.withColumn(_REF, F.lit(None).cast("binary"))
        return keyed, df.columns, F.coalesce(F.col("group_id"), F.col(_KEY), F.col(_REF))

    for name, read in (("messages", messages), ("quarantine", quarantine)):
        folder = staging / name
        df, columns, key = read([folder])
        hit = df.join(F.broadcast(carried), key == F.col(_GID), "left_semi")
        files = sorted(str(_local(r[0])) for r in hit.select(_FILE).distinct().collect())
        if files:
            df, _, key = read(files)
            _replace_files(
                spark, folder, files, df.join(F.broadcast(carried), key == F.col(_GID), "left_anti"), columns
            )


def _prune_bodies(payloads: Path, messages: Path) -> None:
    """Remove staged body files no message row names (those of carried groups, of discarded attempts)."""
    import pyarrow.parquet as pq

    if not payloads.is_dir():
        return
    named: set[str] = set()
    for part in messages.glob("*.parquet"):
        named.update(p for p in pq.read_table(part, columns=["payload_path"]).column(0).to_pylist() if p is not None)
    for f in payloads.iterdir():
        if f.is_file() and not f.name.startswith(".") and f.name not in named:
            f.unlink()


def _tables(spark: Any, staging: Path) -> tuple[list[Any], list[Any]]:
    """Messages, bytes, used and duplicates by status; quarantined rows by reason (of the staged output)."""
    from pyspark.sql import functions as F

    by_status = totals_by_status(_read(spark, staging / "messages")).collect()
    q = _read(spark, staging / "quarantine")
    by_reason = q.groupBy("reason", "reason_name").count().orderBy(F.desc("count")).collect()
    return by_status, by_reason


def _report(
    run: int,
    files: Sequence[LandingFile],
    tables: tuple[list[Any], list[Any]],
    accounting: CarryAccounting,
    carry: _Carry,
    seconds: float,
) -> list[str]:
    by_status, by_reason = tables
    mib = sum(f.size for f in files) / (1 << 20)
    a = accounting
    lines = [f"run {run}: {len(files)} new files ({mib:,.1f} MiB), {a.new} rows; {a.carried_in} rows carried in"]
    lines.append("messages by status")
    lines.append(f"  {'status':<14}{'messages':>10}{'bytes':>16}")
    lines += [f"  {r.status:<14}{r.n:>10}{(r.bytes or 0):>16,}" for r in by_status]
    lines.append("quarantined segments by reason")
    lines.append(f"  {'reason':<34}{'segments':>10}")
    lines += [f"  {f'{r.reason} {r.reason_name}':<34}{r['count']:>10}" for r in by_reason] or ["  (none)"]
    f = carry.facts
    oldest = "" if f.oldest_ms is None else f", the oldest first read {_when(f.oldest_ms * 1_000_000, 3)}"
    lines.append(
        f"carried over: {accounting.carried_in} rows in, {f.rows} rows out ({_n(f.groups, 'incomplete group')}, "
        f"{f.bytes:,} bytes{oldest}); written as incomplete: {carry.expired_by_age} groups past --expire-after,"
        f" {carry.expired_by_size} past --carry-max-bytes"
    )
    lines.append(f"input {mib:,.1f} MiB in {seconds:,.1f} s: {mib / max(seconds, 1e-9):,.1f} MiB/s")
    lines.append(accounting.line())
    return lines


def _facts(record: dict[str, Any] | None) -> CarryFacts:
    return CarryFacts(**record["carry"]) if record else CarryFacts()


def run_incremental(
    pattern: str,
    output: str,
    options: IncrementalOptions,
    *,
    settings: SparkSettings,
    raw_column: str = "segment",
    encoded: bool = True,
    reassembly: ReassemblyOptions | None = None,
    keep_input_file: bool = False,
) -> IncrementalReport:
    """One incremental run (module doc): the rows of the new files and of the carry reassembled, the
    run committed and published; or nothing at all when there is nothing to do (``run`` None).

    ``reassembly``: how to reassemble (its ``payload_dir`` is the run's own). ``encoded=False``: the
    landing rows hold segments as columns (:class:`~reassembly.spark.schema.ColumnNames`' defaults);
    they are encoded first, and carried encoded. Lineage (``reassembly.keep_columns``) works across
    runs: a carried row keeps every column it landed with, and ``keep_input_file`` takes each new
    row's file path when the file is read (column ``input_file``), so a carried row keeps its own.
    Errors are one line: UsageError (nothing touched; an input that cannot hold segments too,
    :class:`~reassembly.spark.inputs.InputRefused`) or JobError.
    """
    from dataclasses import replace

    from reassembly.spark.batch.pipeline import INPUT_FILE

    reassembly = reassembly or ReassemblyOptions()
    if keep_input_file:
        reassembly = replace(reassembly, keep_columns=(*reassembly.keep_columns, INPUT_FILE))
    paths, out, ck = check_paths(pattern, output, options.checkpoint)
    column = raw_column if encoded else "segment"
    manifest = check_binding(out, ck, column, encoded)
    with _locked(ck):
        _bind(out, ck, manifest, column, encoded)
        last, record = _recover(out, ck)
        fresh = new_files(landing_files(pattern, paths), _processed(ck, _records(ck)))
        facts = _facts(record)
        now_ms = int(time.time() * 1000)
        if not fresh and not facts.due(now_ms, options):
            held = f"; carrying {_n(facts.groups, 'incomplete group')} ({_n(facts.rows, 'row')})" if facts.rows else ""
            line = f"idle: no new input (last run {last}{held})" if last else "idle: no input files"
            carried = {"rows": facts.rows, "groups": facts.groups, "bytes": facts.bytes, "oldest_ms": facts.oldest_ms}
            return IncrementalReport(None, (line,), None, out, ck, summary={"carried": carried})  # what it says
        job = _Run(out, ck, last + 1, fresh, facts, now_ms, options, column)
        return job.execute(pattern, settings, raw_column, encoded, reassembly, keep_input_file)


def _landing(
    spark: Any, fresh: Sequence[LandingFile], pattern: str, segments: Any, keep: tuple[str, ...], input_file: bool
) -> Any:
    """The new files' rows, refused when they cannot be what was meant (as ``run`` refuses them, the
    columns to keep too); with ``input_file`` each row's file path beside them (taken from the file
    source, so before anything else); segments given as columns are encoded (the other columns kept)."""
    from reassembly.spark.batch.pipeline import check_keep_columns, keep_input_file
    from reassembly.spark.inputs import check_input

    try:
        df = _read(spark, *(f.path for f in fresh))
    except Exception as exc:
        raise JobError(f"cannot read {pattern}: {first_line(exc)}") from None
    check_input(df, segments)
    if input_file:
        df = keep_input_file(df)
    if not segments.encoded:
        from reassembly.spark.columns import encode_columns

        used = {v for v in vars(segments.columns).values() if v is not None}
        if "segment" in df.columns:
            raise JobError("column 'segment' in input: --input-format columns with --incremental encodes into it")
        df = encode_columns(df, segments.columns, keep=tuple(c for c in df.columns if c not in used))
    if FIRST_SEEN in df.columns:
        raise JobError(f"column {FIRST_SEEN!r} in input: the incremental job keeps its own column of that name")
    check_keep_columns(df, keep, "segment" if not segments.encoded else segments.raw_column)
    return df


@dataclass
class _Run:
    """Run ``run`` of a checkpoint: the Spark work into staged folders, then the commit."""

    out: Path
    ck: Path
    run: int
    fresh: list[LandingFile]
    facts: CarryFacts  # what the previous run carried over
    now_ms: int
    options: IncrementalOptions
    column: str  # the binary column of encoded segments (of the new files once encoded, and of the carry)

    def execute(
        self,
        pattern: str,
        settings: SparkSettings,
        raw_column: str,
        encoded: bool,
        reassembly: ReassemblyOptions,
        input_file: bool,
    ) -> IncrementalReport:
        from reassembly.spark.inputs import SegmentInput

        attempt = uuid.uuid4().hex[:8]
        staging, carry = _staging(self.out, self.run, attempt), _carry_staging(self.ck, self.run, attempt)
        spark = open_session(settings)
        start = time.monotonic()
        try:
            segments, keep = SegmentInput(encoded, raw_column), reassembly.keep_columns
            new = _landing(spark, self.fresh, pattern, segments, keep, input_file) if self.fresh else None
            staging.mkdir()
            accounting, tables, decided = self._stage(spark, new, pattern, staging, carry, reassembly)
            if not accounting.holds:
                raise JobError(f"accounting identity broken, run {self.run} not committed: {accounting.line()}")
            moved = [f.path for f in self.fresh if _restat(f) != f]
            if moved:
                raise JobError(f"landing file {moved[0]} changed while run {self.run} read it: run not committed")
            if INTERRUPTED.is_set():  # a Ctrl-C that pyspark swallowed: not committed either
                raise KeyboardInterrupt
            _reached("staged")
        except BaseException as exc:
            with deferred_interrupts():
                _discard(spark, (staging, carry, carry.with_name(carry.name + ".all")))
            if isinstance(exc, Exception) and not isinstance(exc, JobError):
                raise JobError(f"job failed: {first_line(exc)}") from None
            raise
        lines = _report(self.run, self.fresh, tables, accounting, decided, time.monotonic() - start)
        by_status, by_reason = tables
        summary: dict[str, Any] = {
            "run": self.run,
            "started_ms": self.now_ms,
            "files": len(self.fresh),
            "input_bytes": sum(f.size for f in self.fresh),
            "accounting": accounting._asdict(),
            "messages": {r.status: r.n for r in by_status},
            "message_bytes": {r.status: r.bytes or 0 for r in by_status},
            "quarantined": {r.reason_name: r["count"] for r in by_reason},
            "quarantined_by_reason": [
                {"reason": r.reason, "reason_name": r.reason_name, "segments": r["count"]} for r in by_reason
            ],
            "seconds": round(time.monotonic() - start, 3),
            "carried": vars(decided.facts),
            "expired_groups": {"age": decided.expired_by_age, "size": decided.expired_by_size},
        }
        record = {
            "run": self.run,
            "attempt": attempt,
            "files": [f.as_json() for f in self.fresh],
            "carry": vars(decided.facts),
            "summary": summary,
        }
        with deferred_interrupts():  # the commit point, then publication: not left half-way by Ctrl-C
            (self.ck / RECORDS).mkdir(exist_ok=True)
            _write_json(self.ck / RECORDS / f"{self.run}.json", record)
            _reached("recorded")
            _publish(self.out, self.ck, record)
        shown = [str(self.out / n / f"run={self.run}") for n in FOLDERS if (self.out / n / f"run={self.run}").exists()]
        lines.append(f"output: {'  '.join(shown)}")
        lines.append(f"committed: run {self.run} (checkpoint {self.ck})")
        statuses = {r.status: r.n for r in by_status}
        return IncrementalReport(self.run, tuple(lines), accounting, self.out, self.ck, statuses, summary)

    def _stage(
        self, spark: Any, new: Any, pattern: str, staging: Path, carry: Path, reassembly: ReassemblyOptions
    ) -> tuple[CarryAccounting, tuple[list[Any], list[Any]], _Carry]:
        """Reassemble the new rows and the carried ones into ``staging``; carry what is still incomplete."""
        from dataclasses import replace

        from pyspark.sql import functions as F

        from reassembly.spark.batch.pipeline import reassemble
        from reassembly.spark.batch.quarantine import prune_unreferenced

        try:
            new_rows = new.count() if new is not None else 0  # the first read of every file: a damaged one fails here
        except Exception as exc:
            raise JobError(f"cannot read {pattern}: {first_line(exc)}") from None
        previous = self.ck / CARRY / f"run={self.run - 1}"
        carried = _read(spark, previous) if self.facts.rows else None
        carried_in = carried.count() if carried is not None else 0
        if carried_in != self.facts.rows:
            raise JobError(f"carry {previous} holds {carried_in} rows, its record says {self.facts.rows}")
        if new is None:
            rows = carried
        else:
            rows = new.withColumn(FIRST_SEEN, F.lit(self.now_ms).cast("bigint"))
            if carried is not None:
                rows = rows.unionByName(carried, allowMissingColumns=True)
        opts = replace(reassembly, payload_dir=str(staging / PAYLOADS))
        # Without a carry the bare scan goes in: the jar's decoder then reads the scan's column batches.
        result = reassemble(new if carried is None else rows, raw_column=self.column, options=opts)
        result.save(staging)
        decided = _decide_carry(spark, rows, self.column, staging, carry, self.now_ms, self.options)
        if decided.facts.rows:
            _drop_carried(spark, staging, carry, self.column)
        prune_unreferenced(staging / PAYLOADS, staging / "quarantine")  # files of discarded attempts, carried rows
        _prune_bodies(staging / PAYLOADS, staging / "messages")
        tidy_payloads(staging / PAYLOADS)
        tables = _tables(spark, staging)
        by_status, by_reason = tables
        accounting = CarryAccounting(
            new_rows,
            carried_in,
            sum(r.used or 0 for r in by_status),
            sum(r["count"] for r in by_reason),
            sum(r.duplicates or 0 for r in by_status),
            decided.facts.rows,
        )
        return accounting, tables, decided


def _discard(spark: Any, staged: Sequence[Path]) -> None:
    """Stop the session's work (no task or worker may write into what is removed next), then remove
    the staged folders; again for a moment if the writers were not seen to stop."""
    try:
        quiet = stop_spark(spark)
    except Exception:
        log.debug("stopping Spark failed", exc_info=True)
        quiet = False
    for delay in (0.0,) if quiet else (0.0, 0.2, 0.5, 1.0):
        time.sleep(delay)
        for p in staged:
            shutil.rmtree(p, ignore_errors=True)


def _restat(f: LandingFile) -> LandingFile:
    try:
        st = os.stat(f.path)
    except OSError:
        return LandingFile(f.path, -1, -1)
    return LandingFile(f.path, st.st_size, st.st_mtime_ns)


__all__ = [
    "CARRY",
    "DEFAULT_CARRY_MAX_BYTES",
    "DEFAULT_EXPIRE_AFTER",
    "FIRST_SEEN",
    "KILL_AT",
    "KILL_POINTS",
    "LAYOUT",
    "MANIFEST",
    "RECORDS",
    "CarryAccounting",
    "CarryFacts",
    "IncrementalOptions",
    "IncrementalReport",
    "LandingFile",
    "check_binding",
    "check_paths",
    "landing_files",
    "new_files",
    "run_incremental",
    "with_routing_key",
]
