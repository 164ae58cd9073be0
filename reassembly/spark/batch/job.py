"""Plumbing shared by the Spark jobs of the ``reassemble`` command.

A Spark session that fails fast and quietly, an opened job (inputs read, output claimed
through :mod:`reassembly._files`), stopping a job's Spark work before its output is removed,
the split write and the summary. The jobs import this module; it imports no job and not the
command, so the command can import both without a circle. Nothing here prints: the summary is
returned as data and text for the command to show (the progress bar is the command's too).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import socket
import threading
import time
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from reassembly._errors import JobError, first_line
from reassembly._files import atomic_dir, claim_output, hadoop_literal, inputs
from reassembly._processes import INTERRUPTED, descendants, on_interrupt, process_alive
from reassembly.spark.footers import check_files
from reassembly.spark.inputs import InputRefused, SegmentInput, check_binary_column, check_input

logger = logging.getLogger(__name__)

# A master that does not answer within this many seconds is reported at once (Spark itself
# retries for about a minute and then prints hundreds of lines of Java).
CONNECT_TIMEOUT = 5.0

_LOCAL = re.compile(r"local(\[(\*|\d+)(,\d+)?\])?|local-cluster\[\d+,\d+,\d+\]")
_SPARK_CONNECT_PORT = 15002


@dataclass(frozen=True)
class SparkSettings:
    """How a job talks to Spark: the master, shuffle partitions, Spark's own output, and ``conf``:
    settings given to the session as it starts (``--conf KEY=VALUE``), over the library's defaults."""

    master: str = "local[2]"
    partitions: int | None = None
    verbose: bool = False
    conf: Mapping[str, str] = field(default_factory=dict)


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
    """A Spark session, or a one-line JobError naming why there is none (the launch's root cause, such
    as YARN's missing HADOOP_CONF_DIR, first). Under spark-submit, spark-submit's session and master."""
    from reassembly.spark.engine.session import SparkEnvironmentError, get_session, submitted

    if not submitted():  # under spark-submit the JVM runs already, with spark-submit's --master
        _check_master_answers(settings.master)
    try:
        spark = get_session(
            settings.master, app_name="reassemble", conf=dict(settings.conf), quiet=not settings.verbose
        )
    except Exception as exc:
        hint = "" if settings.verbose else " (--verbose shows Spark's own output)"
        why = exc.args[0] if isinstance(exc, SparkEnvironmentError) else first_line(exc)
        raise JobError(f"cannot start Spark with master {settings.master}: {why}{hint}") from None
    if hasattr(spark, "sparkContext"):  # our own one-line errors replace Java stack traces
        spark.sparkContext.setLogLevel("WARN" if settings.verbose else "OFF")
    if threading.current_thread() is threading.main_thread():
        # pyspark's handler cancels jobs through the JVM connection the main thread is blocked
        # in (a re-entrant call that fails and logs tracebacks); a plain KeyboardInterrupt lets
        # atomic_dir stop Spark and remove the hidden output instead.
        signal.signal(signal.SIGINT, on_interrupt)
    return spark


# How long an interrupted or failed job waits for Spark's tasks, then for its Python workers, to stop.
STOP_TASKS_TIMEOUT = 30.0
STOP_WORKERS_TIMEOUT = 10.0


def _wait(done: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def jvm_pid(spark: Any) -> int | None:
    """The PID of the JVM this process launched for ``spark`` (None for Connect, or a JVM started elsewhere)."""
    proc = getattr(getattr(getattr(spark, "sparkContext", None), "_gateway", None), "proc", None)
    pid = getattr(proc, "pid", None)
    return pid if isinstance(pid, int) else None


def stop_spark(spark: Any) -> bool:
    """Stop every piece of Spark work that may still write: True when it was seen to stop.

    Cancelling a job only marks its tasks; a task ends some time later, and a Python worker
    (which writes payload files itself) can go on well after its task has ended. So: cancel
    every job, wait until no job, stage or task is active, stop the session (pyspark's daemon
    then ends its workers), and wait for the processes that ran below the JVM to exit (Linux,
    where they can be listed). Each wait is bounded; a JVM that is gone already is not waited for.
    """
    sc = getattr(spark, "sparkContext", None)
    if sc is None:
        return spark is None  # no session: nothing writes; Connect: its server cannot be asked
    pid = jvm_pid(spark)
    workers = descendants(pid) if pid is not None else []
    quiet = True
    try:
        sc.cancelAllJobs()
        status, executors = sc.statusTracker(), sc._jsc.sc().statusTracker()

        def idle() -> bool:
            running = sum(e.numRunningTasks() for e in executors.getExecutorInfos())
            return not status.getActiveJobsIds() and not status.getActiveStageIds() and running == 0

        quiet = _wait(idle, STOP_TASKS_TIMEOUT)
        if not quiet:
            logger.warning("Spark tasks still running %.0f s after their jobs were cancelled", STOP_TASKS_TIMEOUT)
    except Exception:  # the JVM is gone (the same Ctrl-C, a crash): nothing left to cancel there
        logger.debug("cancelling Spark's jobs failed", exc_info=True)
        quiet = pid is not None and not process_alive(pid)
    with warnings.catch_warnings():  # pyspark warns when the JVM went first: expected here
        warnings.simplefilter("ignore")
        try:
            spark.stop()
        except Exception:
            logger.debug("stopping the session failed", exc_info=True)
    if pid is None:
        return False
    stopped = _wait(lambda: not any(process_alive(p, i) for p, i in workers), STOP_WORKERS_TIMEOUT)
    if not stopped:
        logger.warning("Spark's Python workers still running %.0f s after the session stopped", STOP_WORKERS_TIMEOUT)
    return quiet and stopped


@dataclass
class Job:
    """An opened job: its input paths and rows, its claimed output and the session that reads them."""

    pattern: str
    paths: list[str]
    out: Path
    spark: Any
    df: Any
    settings: SparkSettings
    skipped: list[SkippedFile] = field(default_factory=list)  # input files Spark did not read whole

    @contextmanager
    def writing(self) -> Iterator[Path]:
        """The hidden directory to write into; any failure becomes one line.

        On a failure or an interrupt the session's work is stopped (:func:`stop_spark`: the job is
        over, and no task or worker may write into the directory once it is removed) before the
        directory is removed; the JVM's PID goes into the directory's marker, so the next run removes
        it if this process is killed instead.
        """
        pid = jvm_pid(self.spark)
        with atomic_dir(self.out, lambda: stop_spark(self.spark), () if pid is None else (pid,)) as tmp:
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


def open_job(
    pattern: str,
    output: str,
    *,
    overwrite: bool,
    column: str | None,
    settings: SparkSettings,
    segments: SegmentInput | None = None,
) -> Job:
    """Check input and output, start Spark, read the input and refuse it (:class:`InputRefused`, a
    UsageError: exit code 2, nothing written) when it cannot be what was meant: with ``segments``,
    by :func:`~reassembly.spark.inputs.check_input` (the columns, their types, and whether the
    first values frame as segments); else a ``column`` that is missing or not binary."""
    paths = inputs(pattern)
    out = claim_output(output, overwrite, pattern, paths)
    strict = not skipping(settings.conf)
    check_files(paths, pattern, segments, column=column, strict=strict)  # from the footers, before Spark starts
    spark = open_session(settings)
    try:
        df = spark.read.parquet(*map(hadoop_literal, paths))
    except Exception as exc:
        raise JobError(f"cannot read {pattern}: {first_line(exc)}") from None
    if segments is not None:
        try:
            check_input(df, segments)
        except InputRefused:
            raise
        except Exception:  # the first values could not be read (a damaged file): the job's read says why
            logger.debug("the input's first values could not be read", exc_info=True)
    elif column is not None:
        check_binary_column(df.schema, column)
    return Job(pattern, paths, out, spark, df, settings)


# Spark's settings that make a read skip, without failing, a file it cannot read or that is gone.
SKIP_SETTINGS = ("spark.sql.files.ignoreCorruptFiles", "spark.sql.files.ignoreMissingFiles")


def skipping(conf: Mapping[str, str]) -> list[str]:
    """The settings of :data:`SKIP_SETTINGS` that ``conf`` turns on."""
    return [k for k in SKIP_SETTINGS if str(conf.get(k, "false")).strip().lower() == "true"]


def skip_settings(spark: Any) -> list[str]:
    """The settings of :data:`SKIP_SETTINGS` the session ``spark`` has on."""
    return skipping({k: str(spark.conf.get(k, "false")) for k in SKIP_SETTINGS})


@dataclass(frozen=True)
class SkippedFile:
    """A file of the input Spark listed but did not read whole: its path, the rows its footer holds
    (None: no readable footer) and the rows Spark read from it."""

    path: str
    rows_expected: int | None
    rows_read: int

    def line(self) -> str:
        if self.rows_expected is None:
            return f"{self.path} (unreadable)"
        return f"{self.path} ({self.rows_read} of {self.rows_expected} rows read)"


def read_rows(job: Job) -> tuple[int, list[SkippedFile]]:
    """The rows Spark reads from the input (the first read of every file) and the files it skipped.

    Where the session skips unreadable or missing files (:data:`SKIP_SETTINGS`, by ``--conf`` or its
    own settings), a file skipped would vanish without a word: the rows are counted per file and
    every listed file that gave fewer rows than its footer holds (or none, without a readable
    footer) is named. Otherwise Spark fails on such a file, and a plain count is enough."""
    from urllib.parse import unquote, urlparse

    from pyspark.sql import functions as F

    from reassembly.spark.footers import footer_rows

    if not skip_settings(job.spark):
        return int(job.df.count()), []
    counted = job.df.select(F.input_file_name().alias("file")).groupBy("file").count().collect()

    def local(uri: str) -> str | None:
        parsed = urlparse(uri)
        return unquote(parsed.path) if parsed.scheme in ("", "file") else None

    read = {local(str(r["file"])) or str(r["file"]): int(r["count"]) for r in counted}
    skipped = []
    for uri in sorted(job.df.inputFiles()):
        path = local(uri) or uri
        expected = footer_rows(path) if local(uri) is not None else None
        got = read.get(path, 0)
        if (expected is None and got == 0) or (expected is not None and got < expected):
            skipped.append(SkippedFile(path, expected, got))
    return sum(read.values()), skipped


def write_split(combined: Any, tmp: Path, folders: dict[str, str]) -> None:
    """Compute every kind of row in one pass (partitioned by ``kind``), then name each folder."""
    from reassembly.spark.writer import parquet_writer

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

    from reassembly.spark.schema import OUTPUT_ARROW

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
    column, never from ``payload`` (measuring those values would read them: batches of 100 MiB
    payloads would take the JVM's heap and fail the job at its summary, after writing everything)."""
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


@dataclass(frozen=True)
class StatusTotal:
    """One row of the summary's messages by status: messages, bytes (complete ones), segments used, duplicates."""

    status: str
    messages: int
    bytes: int
    used: int
    duplicates: int


@dataclass(frozen=True)
class ReasonTotal:
    """One row of the summary's quarantined segments by reason."""

    reason: int
    reason_name: str
    segments: int


@dataclass(frozen=True)
class Summary:
    """The end-of-job counts of a ``run`` (what its report prints), as data."""

    statuses: tuple[StatusTotal, ...]
    reasons: tuple[ReasonTotal, ...]
    accounting: Accounting
    input_bytes: int
    seconds: float

    def messages(self, status: str) -> int:
        return sum(s.messages for s in self.statuses if s.status == status)

    @property
    def mib_per_second(self) -> float:
        return self.input_bytes / (1 << 20) / max(self.seconds, 1e-9)

    def report(self) -> str:
        """The table the command prints: messages by status, bytes, throughput, quarantine by reason, accounting."""
        lines = ["messages by status", f"  {'status':<14}{'messages':>10}{'bytes':>16}"]
        lines += [f"  {s.status:<14}{s.messages:>10}{s.bytes:>16,}" for s in self.statuses]
        lines += ["quarantined segments by reason", f"  {'reason':<34}{'segments':>10}"]
        lines += [f"  {f'{r.reason} {r.reason_name}':<34}{r.segments:>10}" for r in self.reasons]
        if not self.reasons:
            lines.append("  (none)")
        mib = self.input_bytes / (1 << 20)
        lines.append(f"input {mib:,.1f} MiB in {self.seconds:,.1f} s: {self.mib_per_second:,.1f} MiB/s")
        lines.append(self.accounting.line())
        return "\n".join(lines)


def summarize(spark: Any, out: Path, rows_in: int, input_bytes: int, seconds: float) -> Summary:
    """The end-of-job counts, read back from the output (messages by status, quarantine by reason)."""
    from pyspark.sql import functions as F

    msgs_dir, q_dir = out / "messages", out / "quarantine"
    by_status: list[Any] = []
    if has_parquet(msgs_dir):
        by_status = totals_by_status(spark.read.parquet(str(msgs_dir))).collect()
    by_reason: list[Any] = []
    if has_parquet(q_dir):
        q = spark.read.parquet(str(q_dir))
        by_reason = q.groupBy("reason", "reason_name").count().orderBy(F.desc("count")).collect()
    statuses = tuple(StatusTotal(r.status, r.n, r.bytes or 0, r.used or 0, r.duplicates or 0) for r in by_status)
    reasons = tuple(ReasonTotal(r.reason, r.reason_name, r["count"]) for r in by_reason)
    accounting = Accounting(
        rows_in,
        sum(s.used for s in statuses),
        sum(r.segments for r in reasons),
        sum(s.duplicates for s in statuses),
    )
    return Summary(statuses, reasons, accounting, input_bytes, seconds)
