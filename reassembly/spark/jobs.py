"""Plumbing shared by the Spark jobs of the ``reassemble`` command.

A Spark session that fails fast and quietly, an opened job (inputs read, output claimed
through :mod:`reassembly._plumbing`), a progress bar, the split write and the summary. The
jobs import this module; it imports no job and not the command, so the command can import both
without a circle.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from reassembly._plumbing import (
    INTERRUPTED,
    JobError,
    atomic_dir,
    claim_output,
    first_line,
    hadoop_literal,
    inputs,
    on_interrupt,
)

# A master that does not answer within this many seconds is reported at once (Spark itself
# retries for about a minute and then prints hundreds of lines of Java).
CONNECT_TIMEOUT = 5.0

_LOCAL = re.compile(r"local(\[(\*|\d+)(,\d+)?\])?|local-cluster\[\d+,\d+,\d+\]")
_SPARK_CONNECT_PORT = 15002


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
    from reassembly.spark.session import get_session

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
        signal.signal(signal.SIGINT, on_interrupt)
    return spark


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
