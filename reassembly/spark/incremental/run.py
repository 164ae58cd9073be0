"""One incremental run: the new files and the carry reassembled into staged folders, the accounting
checked, then the commit (:func:`run_incremental`; the protocol is :mod:`reassembly.spark.incremental`'s)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reassembly._errors import JobError, counted, first_line
from reassembly._files import discard, write_json
from reassembly._processes import INTERRUPTED, deferred_interrupts
from reassembly.spark.batch.job import SkippedFile, count_rows, skip_settings, skipped_json, skipped_line, tidy_payloads
from reassembly.spark.batch.output import PAYLOADS
from reassembly.spark.batch.pipeline import ReassemblyOptions
from reassembly.spark.engine.session import SparkSettings, open_session, stop_spark
from reassembly.spark.incremental.carry import (
    CarryDecision,
    carried_facts,
    decide_carry,
    drop_carried,
    prune_bodies,
    read_parquet,
    report_lines,
    status_tables,
)
from reassembly.spark.incremental.commit import (
    bind,
    carry_staging,
    check_binding,
    check_paths,
    locked,
    publish,
    reached,
    recorded_runs,
    recover,
    staging_dir,
)
from reassembly.spark.incremental.discovery import landing_files, new_files, processed_files, restat
from reassembly.spark.incremental.model import (
    CARRY,
    FIRST_SEEN,
    FOLDERS,
    RECORDS,
    CarryAccounting,
    CarryFacts,
    IncrementalOptions,
    IncrementalReport,
    LandingFile,
)

log = logging.getLogger(__name__)


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
    summary: str | None = None,
) -> IncrementalReport:
    """One incremental run (module doc): the rows of the new files and of the carry reassembled, the
    run committed and published; or nothing at all when there is nothing to do (``run`` None).

    ``pattern``: the landing table (a Parquet file, directory or glob); ``output``: the directory the
    runs are published to (``run=N`` folders); ``options``: the checkpoint and the carry's bounds
    (:class:`IncrementalOptions`); ``settings``: the Spark session to start (master, partitions,
    ``--conf`` settings). ``raw_column``: the binary column of encoded segments.
    ``reassembly``: how to reassemble (its ``payload_dir`` is the run's own). ``encoded`` False: the
    landing rows hold segments as columns (:class:`~reassembly.spark.schema.ColumnNames`' defaults);
    they are encoded first, and carried encoded. Lineage (``reassembly.keep_columns``) works across
    runs: a carried row keeps every column it landed with, and ``keep_input_file`` takes each new
    row's file path when the file is read (column ``input_file``), so a carried row keeps its own.
    ``summary``: the file the caller writes the summary to, claimed with OUTPUT and the checkpoint
    before anything starts (:func:`~reassembly.spark.incremental.commit.check_paths`). Errors are one
    line: UsageError (nothing touched; an input that cannot hold segments too,
    :class:`~reassembly.spark.inputs.InputRefused`) or JobError.
    """
    from dataclasses import replace

    from reassembly.spark.batch.pipeline import INPUT_FILE

    reassembly = reassembly or ReassemblyOptions()
    if keep_input_file:
        reassembly = replace(reassembly, keep_columns=(*reassembly.keep_columns, INPUT_FILE))
    claimed = check_paths(pattern, output, options.checkpoint, summary)
    paths, out, ck = list(claimed.paths), claimed.out, claimed.place("checkpoint")
    column = raw_column if encoded else "segment"
    manifest = check_binding(out, ck, column, encoded)
    with locked(ck):
        bind(out, ck, manifest, column, encoded)
        last, record = recover(out, ck)
        fresh = new_files(landing_files(pattern, paths), processed_files(ck, recorded_runs(ck)))
        facts = carried_facts(record)
        now_ms = int(time.time() * 1000)
        if not fresh and not facts.due(now_ms, options):
            held = (
                f"; carrying {counted(facts.groups, 'incomplete group')} ({counted(facts.rows, 'row')})"
                if facts.rows
                else ""
            )
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
        df = read_parquet(spark, *(f.path for f in fresh))
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
    skipped: list[SkippedFile] = field(default_factory=list)  # new files Spark did not read whole

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
        staging, carry = staging_dir(self.out, self.run, attempt), carry_staging(self.ck, self.run, attempt)
        spark = open_session(settings)
        start = time.monotonic()
        try:
            segments, keep = SegmentInput(encoded, raw_column), reassembly.keep_columns
            new = _landing(spark, self.fresh, pattern, segments, keep, input_file) if self.fresh else None
            staging.mkdir()
            accounting, tables, decided = self._stage(spark, new, pattern, staging, carry, reassembly)
            if not accounting.holds:
                raise JobError(f"accounting identity broken, run {self.run} not committed: {accounting.line()}")
            moved = [f.path for f in self.fresh if restat(f) != f]
            if moved:
                raise JobError(f"landing file {moved[0]} changed while run {self.run} read it: run not committed")
            if INTERRUPTED.is_set():  # a Ctrl-C that pyspark swallowed: not committed either
                raise KeyboardInterrupt
            reached("staged")
        except BaseException as exc:
            with deferred_interrupts():
                # Spark's work stopped first: no task or worker may write into what is removed next
                discard((staging, carry, carry.with_name(carry.name + ".all")), lambda: stop_spark(spark))
            if isinstance(exc, Exception) and not isinstance(exc, JobError):
                raise JobError(f"job failed: {first_line(exc)}") from None
            raise
        lines = report_lines(self.run, self.fresh, tables, accounting, decided, time.monotonic() - start)
        if self.skipped:  # recorded as read like the others: named here, in the record, and for --fail-on
            lines.append(skipped_line(self.skipped, skip_settings(spark)))
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
            "skipped_files": skipped_json(self.skipped),
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
            write_json(self.ck / RECORDS / f"{self.run}.json", record)
            reached("recorded")
            publish(self.out, self.ck, record)
        shown = [str(self.out / n / f"run={self.run}") for n in FOLDERS if (self.out / n / f"run={self.run}").exists()]
        lines.append(f"output: {'  '.join(shown)}")
        lines.append(f"committed: run {self.run} (checkpoint {self.ck})")
        statuses = {r.status: r.n for r in by_status}
        return IncrementalReport(self.run, tuple(lines), accounting, self.out, self.ck, statuses, summary)

    def _stage(
        self, spark: Any, new: Any, pattern: str, staging: Path, carry: Path, reassembly: ReassemblyOptions
    ) -> tuple[CarryAccounting, tuple[list[Any], list[Any]], CarryDecision]:
        """Reassemble the new rows and the carried ones into ``staging``; carry what is still incomplete."""
        from dataclasses import replace

        from pyspark.sql import functions as F

        from reassembly.spark.batch.pipeline import reassemble
        from reassembly.spark.batch.quarantine import prune_unreferenced

        try:  # every file's footer: a damaged one fails here, or, where Spark skips it, is named
            new_rows, self.skipped = count_rows(spark, new) if new is not None else (0, [])
        except Exception as exc:
            raise JobError(f"cannot read {pattern}: {first_line(exc)}") from None
        previous = self.ck / CARRY / f"run={self.run - 1}"
        carried = read_parquet(spark, previous) if self.facts.rows else None
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
        decided = decide_carry(spark, rows, self.column, staging, carry, self.now_ms, self.options)
        if decided.facts.rows:
            drop_carried(spark, staging, carry, self.column)
        prune_unreferenced(staging / PAYLOADS, staging / "quarantine")  # files of discarded attempts, carried rows
        prune_bodies(staging / PAYLOADS, staging / "messages")
        tidy_payloads(staging / PAYLOADS)
        tables = status_tables(spark, staging)
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
