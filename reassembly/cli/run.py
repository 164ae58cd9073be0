"""``reassemble run INPUT OUTPUT`` and ``reassemble demo``: the segment job, on a landing table or on generated faults.

``run`` reassembles Parquet segments into OUTPUT/messages and OUTPUT/quarantine (and
OUTPUT/payloads/ for messages above --large-message-bytes); ``demo`` generates a landing table
with every fault, runs the same job on it and checks the result. Both print the summary with the
accounting identity; a broken identity is a failure. For an orchestrator, ``--summary-json FILE``
writes the same counts as JSON (:mod:`reassembly.cli.summary`) and ``--fail-on`` turns incomplete
or corrupt messages, or quarantined segments, into exit code 3 once everything is written.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reassembly._errors import JobError, first_line
from reassembly._files import claim_output, inputs
from reassembly._keyring import digest_policy
from reassembly.cli._common import (
    EXIT_FAILED,
    Progress,
    at_least,
    fail_on,
    lineage_options,
    orchestration_options,
    progress_wanted,
    segment_options,
    spark_options,
    spark_settings,
)
from reassembly.cli.summary import IDENTITY, IDENTITY_CARRIED, Record
from reassembly.spark.batch.job import (
    Job,
    Summary,
    open_job,
    read_rows,
    skip_settings,
    skipped_json,
    skipped_line,
    summarize,
    tidy_payloads,
)
from reassembly.spark.inputs import SegmentInput

if TYPE_CHECKING:
    from reassembly.cli._common import Subparsers
    from reassembly.spark.incremental import IncrementalReport


def _large(q: argparse.ArgumentParser) -> None:
    """run and demo write messages (refmsg writes objects): where the large ones go, where the rest is judged."""
    q.add_argument(
        "--large-message-bytes",
        type=at_least(1),
        default=128 << 20,
        help="messages above this (or of unknown size) are written to OUTPUT/payloads/ (default 128 MiB)",
    )
    q.add_argument(
        "--driver-judge-bytes",
        type=at_least(0),
        default=64 << 20,
        help="messages that need judging whose side files total at most this are judged in this process,"
        " with no Spark job; 0: always a Spark job (default 64 MiB)",
    )


def add_parser(sub: Subparsers) -> argparse.ArgumentParser:
    """The ``run`` subcommand."""
    p = sub.add_parser("run", help="reassemble a Parquet landing table")
    p.add_argument("input", help="Parquet file, directory or glob of segments")
    p.add_argument("output", help="directory to create with messages/ and quarantine/ (outside the input)")
    p.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists")
    segment_options(p)
    spark_options(p)
    _large(p)
    lineage_options(p)
    orchestration_options(p)
    _incremental_options(p)
    return p


def add_demo_parser(sub: Subparsers) -> argparse.ArgumentParser:
    """The ``demo`` subcommand."""
    p = sub.add_parser("demo", help="generate faulty data, reassemble it, check the result")
    p.add_argument("--messages", type=at_least(1), default=200, help="logical messages to generate (default 200)")
    p.add_argument("--segments-per-message", type=at_least(1), default=8, help="(default 8)")
    p.add_argument(
        "--segment-size", type=at_least(128), default=16 * 1024, help="bytes, header included (default 16384)"
    )
    p.add_argument("--keep", default=None, help="keep the data and output in this directory (default: removed)")
    spark_options(p)
    _large(p)
    orchestration_options(p)
    return p


def _record_summary(record: Record, job: Job, summary: Summary) -> None:
    """Put the summary's counts and paths into the record."""
    statuses = {"complete": 0, "incomplete": 0, "corrupt": 0} | {s.status: s.messages for s in summary.statuses}
    a = summary.accounting
    out = job.out
    record.fields.update(
        input={
            "pattern": job.pattern,
            "paths": len(job.paths),
            "bytes": summary.input_bytes,
            "skipped_files": skipped_json(job.skipped),
        },
        output={
            "directory": str(out),
            "messages": str(out / "messages"),
            "quarantine": str(out / "quarantine"),
            "payloads": str(out / "payloads") if (out / "payloads").exists() else None,
        },
        counts={
            "rows_in": a.rows_in,
            "messages": statuses,
            "message_bytes": dict.fromkeys(statuses, 0) | {s.status: s.bytes for s in summary.statuses},
            "quarantined": a.quarantined,
            "quarantined_by_reason": [
                {"reason": r.reason, "reason_name": r.reason_name, "segments": r.segments} for r in summary.reasons
            ],
            "duplicates": a.duplicates,
            "used": a.used,
        },
        accounting={
            "identity": IDENTITY,
            "rows_in": a.rows_in,
            "used": a.used,
            "quarantined": a.quarantined,
            "duplicates": a.duplicates,
            "holds": a.holds,
        },
        throughput_mib_per_second=round(summary.mib_per_second, 3),
    )


def _reassemble(
    args: argparse.Namespace, record: Record, pattern: str, output: str, overwrite: bool
) -> tuple[Job, Summary]:
    """The segment job: reassemble, write atomically, read the summary back (the caller prints it)."""
    encoded = getattr(args, "input_format", "encoded") == "encoded"
    raw_column = getattr(args, "raw_column", "segment")
    column = raw_column if encoded else None
    # The keyring, then what the job may touch, before Spark starts: each mistake is refused at once.
    digest = digest_policy(getattr(args, "require_sha256", False), getattr(args, "hmac_keyring", None))
    summary = getattr(args, "summary_json", None)
    claimed = claim_output(output, inputs(pattern), pattern=pattern, may_exist=overwrite, summary=summary)
    job = open_job(
        claimed,
        column=column,
        settings=spark_settings(args),
        segments=SegmentInput(encoded, raw_column),  # refused (exit 2) when it cannot be what was meant
        phase=record.phase,
    )
    record.fields["spark"] = getattr(job.spark, "version", None)
    from reassembly.spark import ReassemblyOptions, reassemble
    from reassembly.spark.engine.bridge import reassembler

    with record.phase("jar"):
        reassembler(job.spark)  # the bundled jar into the session (the job takes the SQL path without it)
    from reassembly.spark.batch.pipeline import INPUT_FILE, check_keep_columns, keep_input_file

    keep = tuple(getattr(args, "keep_columns", ()))
    if getattr(args, "keep_input_file", False):  # lineage: refused (exit 2) before any Spark job runs
        job.df, keep = keep_input_file(job.df), (*keep, INPUT_FILE)
    check_keep_columns(job.df, keep, raw_column if encoded else "data")
    from reassembly.spark import schema as output_schema

    record.fields["schema_version"] = getattr(output_schema, "SCHEMA_VERSION", None)
    with record.phase("read"):
        try:
            rows_in, job.skipped = read_rows(job)  # every footer: an unreadable one fails here
        except Exception as exc:
            raise JobError(f"cannot read {pattern}: {first_line(exc)}") from None
    with record.phase("reassemble"), job.writing() as tmp:
        options = ReassemblyOptions(
            max_message_size=args.max_message_size,
            partitions=args.partitions,
            payload_dir=str(tmp / "payloads"),
            large_message_bytes=args.large_message_bytes,
            digest=digest,
            keep_columns=keep,
            driver_judge_bytes=args.driver_judge_bytes,
        )
        result = reassemble(job.df, encoded=encoded, raw_column=raw_column, options=options)
        saved = result.save(tmp)  # clean messages from the JVM; the rest judged in the driver or by a second job
        record.fields["scan_tasks"] = scan_tasks(saved.metrics)
        from reassembly.spark.batch.quarantine import prune_unreferenced

        prune_unreferenced(tmp / "payloads", tmp / "quarantine")  # files of attempts whose output was discarded
        tidy_payloads(tmp / "payloads")
    seconds = record.durations["reassemble"]
    with record.phase("summary"):
        summary = summarize(job.spark, job.out, rows_in, job.input_bytes(), seconds)
    return job, summary


def scan_tasks(metrics: Mapping[str, int]) -> dict[str, int] | None:
    """The summary's ``scan_tasks``: the staged plan's scan tasks by their choice (staged: they walked all
    their rows; passed through: nothing was confined in their first rows), or None where nothing was
    staged (no staged plan ran, or Spark gave no counts)."""
    staged, through = metrics.get("scan_tasks_staged", 0), metrics.get("scan_tasks_passed_through", 0)
    return {"staged": staged, "passed_through": through} if staged or through else None


def _print_summary(job: Job, summary: Summary, record: Record | None = None) -> None:
    """The summary table and the output's paths (once the progress bar has left the terminal)."""
    print(summary.report())
    tasks = None if record is None else record.fields.get("scan_tasks")
    if tasks:
        print(f"scan tasks: {tasks['staged']} staged, {tasks['passed_through']} passed their rows through")
    if job.skipped:  # the identity holds for the rows read: these files' rows were never read
        print(skipped_line(job.skipped, skip_settings(job.spark)))
    out = job.out
    payloads = " " + str(out / "payloads") if (out / "payloads").exists() else ""
    print(f"output: {out}/messages  {out}/quarantine{payloads}")


def _verdict(record: Record, job: Job, summary: Summary, requested: list[str] | None) -> int:
    """JobError for a broken identity; else EXIT_CONDITION when a --fail-on condition held (said on stderr)."""
    _record_summary(record, job, summary)
    counts = {
        "incomplete": summary.messages("incomplete"),
        "corrupt": summary.messages("corrupt"),
        "quarantine": summary.accounting.quarantined,
        "skipped": len(job.skipped),
    }
    code = fail_on(record, requested, counts)
    if not summary.accounting.holds:
        raise JobError(f"accounting identity broken: {summary.accounting.line()}")
    return code


def run(args: argparse.Namespace) -> int:
    """``run``: 0; 3 when a --fail-on condition held; JobError when a segment is unaccounted for
    (rows in != used + quarantined + duplicates)."""
    incremental = _incremental(args)  # --incremental: its own job (None: a plain run)
    if incremental is not None:
        return incremental
    record: Record = args.record
    with Progress(progress_wanted(args)):
        job, summary = _reassemble(args, record, args.input, args.output, args.overwrite)
    _print_summary(job, summary, record)
    return _verdict(record, job, summary, args.fail_on)


def demo(args: argparse.Namespace) -> int:
    """``demo``: 0 when every generated message came out as expected and every segment is accounted for
    (then 3 if a --fail-on condition held, as the demo's faults make them)."""
    from reassembly.spark.testdata import generate, write_parquet

    record: Record = args.record
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="reassemble-demo-"))
    try:
        base.mkdir(parents=True, exist_ok=True)
        with record.phase("generate"):
            ds = generate(args.messages, args.segments_per_message, args.segment_size)
            landing = write_parquet(ds, base / "landing", files=8)
        print(
            f"demo: {len(ds.expected)} logical messages ({ds.payload_bytes / (1 << 20):.1f} MiB) as {len(ds.rows)} "
            f"segment rows in {landing}, with duplicates, conflicting copies, dropped segments, bit flips in "
            "data and headers, truncated rows, a zstd bomb, garbage rows and an incomplete MQ group"
        )
        with Progress(progress_wanted(args)):
            job, summary = _reassemble(args, record, str(landing), str(base / "out"), overwrite=True)
            with record.phase("check"):
                out = job.out
                rows = job.spark.read.parquet(str(out / "messages")).collect()
        _print_summary(job, summary, record)
        got = {(bytes(r.group_id), r.msg_seq_number): r for r in rows}

        def payload(row: Any) -> bytes:
            return (out / "payloads" / row.payload_path).read_bytes() if row.payload_path else bytes(row.payload)

        wrong = [
            k
            for k, e in ds.expected.items()
            if k not in got or got[k].status != e.status or (e.payload is not None and payload(got[k]) != e.payload)
        ]
        all_read = summary.accounting.rows_in == len(ds.rows)
        passed = not wrong and all_read and summary.accounting.holds
        record.fields["demo"] = {
            "messages_expected": len(ds.expected),
            "messages_as_expected": len(ds.expected) - len(wrong),
            "segments_generated": len(ds.rows),
            "check_passed": passed,
            "kept": bool(args.keep),
        }
        print(
            f"check: {len(ds.expected) - len(wrong)}/{len(ds.expected)} messages as expected "
            f"(complete ones byte-identical); all {len(ds.rows)} generated segments accounted for: "
            f"{'yes' if all_read and summary.accounting.holds else 'NO'}"
        )
        code = _verdict(record, job, summary, args.fail_on)
        return code if passed else EXIT_FAILED
    finally:
        if not args.keep:  # the paths printed above are gone once it ends: said, with how to keep them
            shutil.rmtree(base, ignore_errors=True)
            print(f"demo: removed {base} (--keep DIR keeps the landing table and the output)")


def _incremental_options(q: argparse.ArgumentParser) -> None:
    """``run --incremental``: a schedule's run over what landed since the last (docs/how-to/scheduling.md)."""
    from reassembly.cli._common import seconds

    g = q.add_argument_group("incremental batch (docs/how-to/scheduling.md)")
    g.add_argument(
        "--incremental",
        action="store_true",
        help="read only the input files no earlier run read (needs --checkpoint); OUTPUT is appended to, "
        "one run=N folder per run; incomplete messages carry over to the next run",
    )
    g.add_argument(
        "--checkpoint",
        metavar="DIR",
        default=None,
        help="with --incremental: the files read and the rows carried over (keep it; outside the input and OUTPUT)",
    )
    g.add_argument(
        "--expire-after",
        type=seconds,
        default=None,
        metavar="DURATION",
        help="with --incremental: an incomplete message is carried over this long at most after a run first "
        "read one of its segments, then written as incomplete (e.g. 12h, 7d; default 7d)",
    )
    g.add_argument(
        "--carry-max-bytes",
        type=at_least(0),
        default=None,
        metavar="BYTES",
        help="with --incremental: segment bytes carried over at most; past it the oldest incomplete groups "
        "are written as incomplete (default 1073741824, 1 GiB)",
    )


def _incremental(args: argparse.Namespace) -> int | None:
    """``run --incremental`` (the job is :mod:`reassembly.spark.incremental`'s): its exit code, or None
    for a plain run. The accounting identity was checked before the run committed."""
    from reassembly.spark.batch.pipeline import ReassemblyOptions
    from reassembly.spark.incremental import IncrementalOptions, run_incremental

    options = IncrementalOptions.from_flags(
        args.incremental, args.checkpoint, args.overwrite, args.expire_after, args.carry_max_bytes
    )
    if options is None:
        return None
    digest = digest_policy(args.require_sha256, args.hmac_keyring)  # before Spark: a bad keyring fails at once
    reassembly = ReassemblyOptions(
        max_message_size=args.max_message_size,
        partitions=args.partitions,
        large_message_bytes=args.large_message_bytes,
        digest=digest,
        keep_columns=tuple(args.keep_columns),  # carried rows keep every column they landed with
        driver_judge_bytes=args.driver_judge_bytes,
    )
    with Progress(progress_wanted(args)):
        report = run_incremental(
            args.input,
            args.output,
            options,
            settings=spark_settings(args),
            raw_column=args.raw_column,
            encoded=args.input_format == "encoded",
            reassembly=reassembly,
            keep_input_file=args.keep_input_file,
            summary=args.summary_json,  # claimed with the output and the checkpoint, before anything starts
        )
    print("\n".join(report.lines))
    record: Record = args.record
    _record_incremental(record, args, report)
    counts = {
        "incomplete": report.statuses.get("incomplete", 0),
        "corrupt": report.statuses.get("corrupt", 0),
        "quarantine": report.accounting.quarantined if report.accounting else 0,
        "skipped": len(report.summary.get("skipped_files", [])),
    }
    return fail_on(record, args.fail_on, counts)


def _record_incremental(record: Record, args: argparse.Namespace, report: IncrementalReport) -> None:
    """The ``--summary-json`` fields of an incremental run (an idle one: its ``incremental`` block only)."""
    from reassembly.spark.schema import SCHEMA_VERSION

    s, a, run = report.summary, report.accounting, report.run
    record.fields["schema_version"] = SCHEMA_VERSION
    carried = s.get("carried", {})
    record.fields["incremental"] = {
        "run": run,
        "checkpoint": str(report.checkpoint),
        "new_files": s.get("files", 0),
        "carried_in": a.carried_in if a else 0,
        "carried_out": {
            "rows": carried.get("rows", 0),
            "groups": carried.get("groups", 0),
            "bytes": carried.get("bytes", 0),
            "oldest_first_read_ms": carried.get("oldest_ms"),
        },
        "expired_groups": s.get("expired_groups", {"age": 0, "size": 0}),
    }
    if run is None or a is None:
        return
    out = report.output
    record.fields.update(
        input={
            "pattern": args.input,
            "paths": s["files"],
            "bytes": s["input_bytes"],
            "skipped_files": list(s.get("skipped_files", [])),
        },
        output={
            "directory": str(out),
            "messages": str(out / "messages" / f"run={run}"),
            "quarantine": str(out / "quarantine" / f"run={run}"),
            "payloads": str(out / "payloads" / f"run={run}") if (out / "payloads" / f"run={run}").exists() else None,
        },
        counts={
            "rows_in": a.rows_in,
            "messages": {"complete": 0, "incomplete": 0, "corrupt": 0} | dict(s["messages"]),
            "message_bytes": {"complete": 0, "incomplete": 0, "corrupt": 0} | dict(s["message_bytes"]),
            "quarantined": a.quarantined,
            "quarantined_by_reason": list(s["quarantined_by_reason"]),
            "duplicates": a.duplicates,
            "used": a.used,
        },
        accounting={
            "identity": IDENTITY_CARRIED,
            "rows_in": a.rows_in,
            "used": a.used,
            "quarantined": a.quarantined,
            "duplicates": a.duplicates,
            "carried_in": a.carried_in,
            "carried_out": a.carried_out,
            "holds": a.holds,
        },
        throughput_mib_per_second=round(s["input_bytes"] / (1 << 20) / max(s["seconds"], 1e-9), 3),
    )
    record.durations["reassemble"] = s["seconds"]
