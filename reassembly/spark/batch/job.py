"""Plumbing shared by the Spark jobs of the ``reassemble`` command.

An opened job (its input and output claimed through :mod:`reassembly._files`, its session from
:func:`reassembly.spark.engine.session.open_session`), its Spark work stopped before its output is
removed, the split write and the summary. The jobs import this module; it imports no job and not the
command, so the command can import both without a circle. Nothing here prints: the summary is
returned as data and text for the command to show (the progress bar is the command's too).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from reassembly._errors import JobError, counted, first_line
from reassembly._files import Claim, atomic_dir, hadoop_literal
from reassembly._processes import INTERRUPTED
from reassembly.spark.engine.session import SparkSettings, jvm_pid, open_session, stop_spark
from reassembly.spark.footers import Footers, check_files, footer_rows
from reassembly.spark.inputs import InputRefused, SegmentInput, check_binary_column, check_input, check_schema

logger = logging.getLogger(__name__)

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
            if INTERRUPTED.is_set():  # a Ctrl-C that pyspark swallowed (see engine.bridge._loadable): not kept either
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
    claimed: Claim,
    *,
    column: str | None,
    settings: SparkSettings,
    segments: SegmentInput | None = None,
    phase: Callable[[str], AbstractContextManager[Any]] = lambda name: nullcontext(),
) -> Job:
    """Check the input's files, start Spark, read the input and refuse it (:class:`InputRefused`, a
    UsageError: exit code 2, nothing written) when it cannot be what was meant: with ``segments``,
    by :func:`~reassembly.spark.inputs.check_input` (the columns, their types, and whether the
    first values frame as segments); else a ``column`` that is missing or not binary. ``claimed``:
    the input's paths and the output, checked before (:func:`reassembly._files.claim_output`).
    ``phase(name)`` times each step (``footers``: the checks before Spark starts, ``spark_start``: the
    session, ``input``: the input read and checked; the command's ``--summary-json`` durations)."""
    paths, out = list(claimed.paths), claimed.out
    pattern = claimed.pattern if claimed.pattern is not None else ", ".join(paths)
    strict = not skipping(settings.conf)
    with phase("footers"):
        footers = check_files(paths, pattern, segments, column=column, strict=strict)  # before Spark starts
    with phase("spark_start"):
        spark = open_session(settings)
    with phase("input"):
        df = _checked_input(spark, pattern, paths, footers, column, segments)
    return Job(pattern, paths, out, spark, df, settings)


def _checked_input(
    spark: Any,
    pattern: str,
    paths: Sequence[str],
    footers: Footers | None,
    column: str | None,
    segments: SegmentInput | None,
) -> Any:
    """The input read by Spark and refused as :func:`open_job` says; Spark samples the first values only
    where the footers' check could not."""
    try:
        df = _read_parquet(spark, paths, footers)
    except Exception as exc:
        raise JobError(f"cannot read {pattern}: {first_line(exc)}") from None
    if segments is not None and footers is not None and footers.sampled:
        check_schema(df.schema, segments)  # the values were sampled from the files already: no Spark job
    elif segments is not None:
        try:
            check_input(df, segments)
        except InputRefused:
            raise
        except Exception:  # the first values could not be read (a damaged file): the job's read says why
            logger.debug("the input's first values could not be read", exc_info=True)
    elif column is not None:
        check_binary_column(df.schema, column)
    return df


def _read_parquet(spark: Any, paths: Sequence[str], footers: Footers | None) -> Any:
    """``paths`` read by Spark; with the schema the footers gave (the one Spark would infer), so that
    Spark's job inferring it is not run (a first job on a fresh JVM costs seconds). A schema Spark's
    DDL cannot say (nested names it would need quoted) is left to Spark to infer."""
    literal = list(map(hadoop_literal, paths))
    if footers is not None:
        try:
            return spark.read.schema(footers.ddl()).parquet(*literal)
        except Exception:
            logger.debug("the footers' schema was not taken; Spark infers it", exc_info=True)
    return spark.read.parquet(*literal)


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
    """The rows Spark reads from the job's input and the files it skipped (:func:`count_rows`)."""
    return count_rows(job.spark, job.df)


def _local(uri: str) -> str | None:
    """The local path a file URI names (None for another file system's)."""
    from urllib.parse import unquote, urlparse

    parsed = urlparse(uri)
    return unquote(parsed.path) if parsed.scheme in ("", "file") else None


def count_rows(spark: Any, df: Any) -> tuple[int, list[SkippedFile]]:
    """The rows Spark reads from ``df``'s files (a batch read of Parquet, projected but not filtered)
    and the files it skipped.

    Where the session skips unreadable or missing files (:data:`SKIP_SETTINGS`, by ``--conf`` or its
    own settings), a file skipped would vanish without a word: the rows are counted per file and
    every listed file that gave fewer rows than its footer holds (or none, without a readable
    footer) is named. Otherwise Spark fails on such a file, so its count is the sum of the files'
    footers: read here, with no Spark job, when every file is local and its footer readable (Spark's
    count reads the same footers), else counted by Spark (where an unreadable file fails the read)."""
    from pyspark.sql import functions as F

    files = sorted(df.inputFiles())
    if not skip_settings(spark):
        local = [_local(uri) for uri in files]
        footers = [footer_rows(p) if p is not None else None for p in local]
        if files and all(n is not None for n in footers):
            return sum(n for n in footers if n is not None), []
        return int(df.count()), []
    counted = df.select(F.input_file_name().alias("file")).groupBy("file").count().collect()
    read = {_local(str(r["file"])) or str(r["file"]): int(r["count"]) for r in counted}
    return sum(read.values()), short_files([_local(uri) or uri for uri in files], read)


def short_files(paths: Sequence[str], read: Mapping[str, int]) -> list[SkippedFile]:
    """The files of ``paths`` that gave fewer rows (``read``: path -> rows, absent: none) than their
    footers hold, or none without a readable footer (local files; another file system's: by rows only)."""
    skipped = []
    for path in paths:
        expected = footer_rows(path) if os.path.isabs(path) else None
        got = read.get(path, 0)
        if (expected is None and got == 0) or (expected is not None and got < expected):
            skipped.append(SkippedFile(path, expected, got))
    return skipped


def skipped_among(spark: Any, files: Sequence[str], rows_read: int) -> list[SkippedFile]:
    """The files of ``files`` (read together, ``rows_read`` rows: a stream's micro-batch) that Spark
    did not read whole: none when their footers add up to the rows read; those without a readable
    footer when the others add up; else also those a per-file count by Spark (:func:`count_rows`,
    one job, only then) finds short."""
    paths = [_local(f) or f for f in files]
    footers = {p: footer_rows(p) if os.path.isabs(p) else None for p in paths}
    whole = sum(n for n in footers.values() if n is not None)
    unreadable = [SkippedFile(p, None, 0) for p, n in footers.items() if n is None]
    if whole == rows_read:
        return unreadable
    readable = [hadoop_literal(p) for p, n in footers.items() if n is not None]
    return unreadable + count_rows(spark, spark.read.parquet(*readable))[1]


def skipped_line(skipped: Sequence[SkippedFile], settings: Sequence[str]) -> str:
    """The report's line naming every input file Spark did not read whole, and the settings that let it."""
    names = ", ".join(f.line() for f in skipped)
    return f"skipped: {counted(len(skipped), 'input file')} Spark did not read whole ({', '.join(settings)}): {names}"


def skipped_json(skipped: Sequence[SkippedFile]) -> list[dict[str, Any]]:
    """The summary JSON's ``input.skipped_files``."""
    return [{"path": f.path, "rows_expected": f.rows_expected, "rows_read": f.rows_read} for f in skipped]


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

    return messages.groupBy("status").agg(
        F.count("*").alias("n"),
        F.sum(F.when(F.col("status") == "complete", F.col("original_length"))).alias("bytes"),
        F.sum("segments_used").alias("used"),
        F.sum("duplicates").alias("duplicates"),
    )


# The summary's two tables are sorted here, not in the plan: they hold a row per status or per
# reason, and an orderBy costs each a sampling job and a sort stage: 4 Spark jobs per table where
# the aggregate alone is 2 (the event log of `reassemble run IN OUT --conf spark.eventLog.enabled=true
# --conf spark.eventLog.dir=DIR` lists them). Ties go by name: the printed order is the same every run.


def status_rows(messages: Any) -> list[Any]:
    """:func:`totals_by_status` of ``messages``, collected: most messages first."""
    return sorted(totals_by_status(messages).collect(), key=lambda r: (-r.n, r.status))


def reason_rows(quarantine: Any) -> list[Any]:
    """Quarantined rows by reason (``reason``, ``reason_name``, ``count``), collected: most rows first."""
    return sorted(quarantine.groupBy("reason", "reason_name").count().collect(), key=lambda r: (-r["count"], r.reason))


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
    msgs_dir, q_dir = out / "messages", out / "quarantine"
    by_status = status_rows(spark.read.parquet(str(msgs_dir))) if has_parquet(msgs_dir) else []
    by_reason = reason_rows(spark.read.parquet(str(q_dir))) if has_parquet(q_dir) else []
    statuses = tuple(StatusTotal(r.status, r.n, r.bytes or 0, r.used or 0, r.duplicates or 0) for r in by_status)
    reasons = tuple(ReasonTotal(r.reason, r.reason_name, r["count"]) for r in by_reason)
    accounting = Accounting(
        rows_in,
        sum(s.used for s in statuses),
        sum(r.segments for r in reasons),
        sum(s.duplicates for s in statuses),
    )
    return Summary(statuses, reasons, accounting, input_bytes, seconds)
