"""Plumbing shared by the Spark jobs of the ``reassemble`` command.

Inputs and a claimed output (never overlapping: a run must not read or replace its own
input), a Spark session that fails fast and quietly, an atomic output directory (a hidden
sibling renamed into place only on success, removed on failure or Ctrl-C), a progress bar,
the summary and one-line errors. The jobs import this module; it imports no job and not the
command, so the command can import both without a circle.
"""

from __future__ import annotations

import fnmatch
import glob
import json
import os
import re
import shutil
import signal
import socket
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from segmenter.digest import DigestPolicy, Keyring
from segmenter.errors import SegmentationError

# A master that does not answer within this many seconds is reported at once (Spark itself
# retries for about a minute and then prints hundreds of lines of Java).
CONNECT_TIMEOUT = 5.0

_LOCAL = re.compile(r"local(\[(\*|\d+)(,\d+)?\])?|local-cluster\[\d+,\d+,\d+\]")
_SPARK_CONNECT_PORT = 15002


class JobError(Exception):
    """A failure to report in one line (no stack trace)."""


class UsageError(JobError):
    """Arguments that must not run at all (an output overlapping the input): exit code 2, nothing touched."""


@dataclass(frozen=True)
class SparkSettings:
    """How a job talks to Spark: the master, shuffle partitions, the progress bar and Spark's own output."""

    master: str = "local[2]"
    partitions: int | None = None
    progress: bool = False
    verbose: bool = False


def master_endpoints(master: str) -> list[tuple[str, int]]:
    """The (host, port) pairs a master URL names (none for local, YARN, Kubernetes); ValueError if malformed."""
    if _LOCAL.fullmatch(master) or master == "yarn" or master.startswith("k8s://"):
        return []
    scheme, sep, rest = master.partition("://")
    if not sep or scheme not in ("spark", "sc") or not rest:
        raise ValueError(
            f"not a Spark master URL: {master!r} (local[N], spark://HOST:PORT, sc://HOST, yarn, k8s://...)"
        )
    endpoints = []
    for hostport in rest.split("/")[0].split(";")[0].split(","):
        host, colon, port = hostport.rpartition(":")
        if not colon:
            host, port = hostport, "" if scheme == "spark" else str(_SPARK_CONNECT_PORT)
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"not a Spark master URL: {master!r} (bad HOST:PORT {hostport!r})")
        endpoints.append((host.strip("[]"), int(port)))
    return endpoints


def _check_master_answers(master: str) -> None:
    endpoints = master_endpoints(master)
    errors = []
    for host, port in endpoints:
        try:
            socket.create_connection((host, port), timeout=CONNECT_TIMEOUT).close()
            return
        except TimeoutError:
            errors.append(f"no answer within {CONNECT_TIMEOUT:g} s")
        except OSError as exc:
            errors.append(exc.strerror or type(exc).__name__)
    if endpoints:
        raise JobError(f"no Spark master answers at {master}: {errors[-1]}")


def open_session(settings: SparkSettings) -> Any:
    """A Spark session, or a one-line JobError naming why there is none."""
    from .session import get_session

    _check_master_answers(settings.master)
    try:
        spark = get_session(settings.master, app_name="reassemble", quiet=not settings.verbose)
    except Exception as exc:
        hint = "" if settings.verbose else " (--verbose shows Spark's own output)"
        raise JobError(f"cannot start Spark with master {settings.master}: {first_line(exc)}{hint}") from None
    if hasattr(spark, "sparkContext"):  # our own one-line errors replace Java stack traces
        spark.sparkContext.setLogLevel("WARN" if settings.verbose else "OFF")
    if threading.current_thread() is threading.main_thread():
        # pyspark's handler cancels jobs through the JVM connection the main thread is blocked
        # in (a re-entrant call that fails and logs tracebacks); a plain KeyboardInterrupt lets
        # atomic_dir stop Spark and remove the hidden output instead.
        signal.signal(signal.SIGINT, _interrupt)
    return spark


INTERRUPTED = threading.Event()
"""Set by Ctrl-C once a session is open. A terminal's Ctrl-C reaches the whole process group, so the
JVM may die before the driver raises KeyboardInterrupt and the error that surfaces is py4j's ("Answer
from Java side is empty"): the command reports such a failure as the interruption it is (exit 130)."""


def _interrupt(signum: int, frame: Any) -> None:
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
def atomic_dir(out: Path, spark: Any = None) -> Iterator[Path]:
    """A hidden sibling to write into; renamed to ``out`` on success, removed on failure or Ctrl-C."""
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt) and spark is not None:
            # stop Spark so no task still writes into what is removed next; the same Ctrl-C may have
            # killed the JVM already, and pyspark's "Unable to cleanly shutdown" warning would then
            # print beside our one line: expected here, so not shown
            with suppress(Exception), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if out.exists() or out.is_symlink():
        old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
        out.rename(old)
    tmp.rename(out)
    if old is not None:
        _remove(old)


class Progress:
    """A live bar on stderr from Spark's status tracker (stages and tasks done)."""

    def __init__(self, spark: Any, enabled: bool) -> None:
        self._sc = getattr(spark, "sparkContext", None) if enabled else None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Progress:
        if self._sc is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._sc is not None:
            self._thread.join()
            sys.stderr.write("\r" + " " * 78 + "\r")
            sys.stderr.flush()

    def _loop(self) -> None:
        tracker = self._sc.statusTracker()  # type: ignore[union-attr]
        start = time.monotonic()
        while not self._stop.wait(0.5):
            done = total = 0
            stages = []
            for sid in tracker.getActiveStageIds():
                info = tracker.getStageInfo(sid)
                if info is not None:
                    done += info.numCompletedTasks
                    total += info.numTasks
                    stages.append(str(sid))
            frac = done / total if total else 0.0
            bar = "#" * int(30 * frac) + "-" * (30 - int(30 * frac))
            label = f"stage {','.join(stages)}" if stages else "planning"
            sys.stderr.write(f"\r[{bar}] {done}/{total} tasks  {label}  {time.monotonic() - start:5.1f}s ")
            sys.stderr.flush()


@dataclass
class Job:
    """An opened job: its input paths and rows, its claimed output and the session that reads them."""

    pattern: str
    paths: list[str]
    out: Path
    spark: Any
    df: Any
    settings: SparkSettings

    @contextmanager
    def writing(self) -> Iterator[Path]:
        """The hidden directory to write into (with the progress bar); any failure becomes one line."""
        with atomic_dir(self.out, self.spark) as tmp, Progress(self.spark, self.settings.progress):
            try:
                yield tmp
            except JobError:
                raise
            except Exception as exc:
                raise JobError(f"job failed: {first_line(exc)}") from None
            if INTERRUPTED.is_set():  # a Ctrl-C that pyspark swallowed (see jar._loadable): not kept either
                raise KeyboardInterrupt

    def input_bytes(self) -> int:
        total = 0
        for p in self.paths:
            if os.path.isdir(p):
                total += sum(f.stat().st_size for f in Path(p).rglob("*.parquet"))
            else:
                total += os.path.getsize(p)
        return total


def open_job(pattern: str, output: str, *, overwrite: bool, column: str | None, settings: SparkSettings) -> Job:
    """Check input and output, start Spark, read the input (checking that ``column`` is binary)."""
    paths = inputs(pattern)
    out = claim_output(output, overwrite, pattern, paths)
    spark = open_session(settings)
    try:
        df = spark.read.parquet(*map(hadoop_literal, paths))
    except Exception as exc:
        raise JobError(f"cannot read {pattern}: {first_line(exc)}") from None
    if column is not None:
        types = dict(df.dtypes)
        if column not in types:
            raise JobError(f"column {column!r} not in input (columns: {', '.join(df.columns)})")
        if types[column] != "binary":
            raise JobError(f"column {column!r} is {types[column]}, expected binary (encoded segments)")
    return Job(pattern, paths, out, spark, df, settings)


def write_split(combined: Any, tmp: Path, folders: dict[str, str]) -> None:
    """Compute every kind of row in one pass (partitioned by ``kind``), then name each folder."""
    from .spark.writer import parquet_writer

    parquet_writer(combined).partitionBy("kind").parquet(str(tmp / "_combined"))
    for kind, name in folders.items():
        src = tmp / "_combined" / f"kind={kind}"
        if src.exists():
            src.rename(tmp / name)
        else:
            empty_folder(tmp / name)
    shutil.rmtree(tmp / "_combined")


def empty_folder(path: Path) -> None:
    """An output folder with no rows, as one empty Parquet file with the rows' columns: Spark cannot
    read a directory that holds no file (UNABLE_TO_INFER_SCHEMA), so a reader of a clean run's
    ``quarantine`` broke on exactly the healthy runs."""
    import pyarrow.parquet as pq

    from .spark.schema import OUTPUT_ARROW

    path.mkdir(parents=True)
    schema = OUTPUT_ARROW.remove(OUTPUT_ARROW.get_field_index("kind"))  # the folder is the kind
    pq.write_table(schema.empty_table(), path / "part-00000-empty.parquet")


def tidy_payloads(directory: Path) -> None:
    """Drop work files of failed or speculative task attempts; drop the folder if no message needed it."""
    if not directory.exists():
        return
    for leftover in directory.glob(".*"):
        leftover.unlink()
    if not any(directory.iterdir()):
        directory.rmdir()


class Accounting(NamedTuple):
    """Every input row is accounted for: used in a message, quarantined, or a duplicate copy."""

    rows_in: int
    used: int
    quarantined: int
    duplicates: int

    @property
    def holds(self) -> bool:
        return self.rows_in == self.used + self.quarantined + self.duplicates

    def line(self) -> str:
        return (
            f"segments: {self.rows_in} in = {self.used} used + {self.quarantined} quarantined + "
            f"{self.duplicates} duplicates: {'holds' if self.holds else 'BROKEN'}"
        )


def has_parquet(directory: Path) -> bool:
    return any(directory.glob("*.parquet"))


def totals_by_status(messages: Any) -> Any:
    """Messages, bytes, segments used and duplicates per status of a ``messages`` table. A complete
    message's bytes are its verified original length, in the row or in payloads/: read from that
    column, never from ``payload`` (measuring those values read them: batches of 100 MiB payloads
    took the JVM's heap, and the job failed at its summary after writing everything)."""
    from pyspark.sql import functions as F

    return (
        messages.groupBy("status")
        .agg(
            F.count("*").alias("n"),
            F.sum(F.when(F.col("status") == "complete", F.col("original_length"))).alias("bytes"),
            F.sum("segments_used").alias("used"),
            F.sum("duplicates").alias("duplicates"),
        )
        .orderBy(F.desc("n"))
    )


def summarize(spark: Any, out: Path, rows_in: int, input_bytes: int, seconds: float) -> tuple[str, Accounting]:
    """The end-of-job report (messages by status, bytes, throughput, quarantine by reason, accounting)."""
    from pyspark.sql import functions as F

    lines = []
    msgs_dir, q_dir = out / "messages", out / "quarantine"
    by_status: list[Any] = []
    if has_parquet(msgs_dir):
        by_status = totals_by_status(spark.read.parquet(str(msgs_dir))).collect()
    by_reason: list[Any] = []
    if has_parquet(q_dir):
        q = spark.read.parquet(str(q_dir))
        by_reason = q.groupBy("reason", "reason_name").count().orderBy(F.desc("count")).collect()
    lines.append("messages by status")
    lines.append(f"  {'status':<14}{'messages':>10}{'bytes':>16}")
    for r in by_status:
        lines.append(f"  {r.status:<14}{r.n:>10}{(r.bytes or 0):>16,}")
    lines.append("quarantined segments by reason")
    lines.append(f"  {'reason':<34}{'segments':>10}")
    for r in by_reason:
        lines.append(f"  {f'{r.reason} {r.reason_name}':<34}{r['count']:>10}")
    if not by_reason:
        lines.append("  (none)")
    mib = input_bytes / (1 << 20)
    lines.append(f"input {mib:,.1f} MiB in {seconds:,.1f} s: {mib / max(seconds, 1e-9):,.1f} MiB/s")
    accounting = Accounting(
        rows_in,
        sum(r.used or 0 for r in by_status),
        sum(r["count"] for r in by_reason),
        sum(r.duplicates or 0 for r in by_status),
    )
    lines.append(accounting.line())
    return "\n".join(lines), accounting


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
