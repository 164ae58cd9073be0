"""``reassemble run INPUT OUTPUT`` and ``reassemble demo``: the segment job, on a landing table or on generated faults.

``run`` reassembles Parquet segments into OUTPUT/messages and OUTPUT/quarantine (and
OUTPUT/payloads/ for messages above --large-message-bytes); ``demo`` generates a landing table
with every fault, runs the same job on it and checks the result. Both print the summary with the
accounting identity; a broken identity is a failure.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reassembly._plumbing import JobError, digest_policy, first_line
from reassembly.cli._common import EXIT_FAILED, at_least, spark_options, spark_settings
from reassembly.spark.jobs import Accounting, Job, open_job, summarize, tidy_payloads

if TYPE_CHECKING:
    from reassembly.cli._common import Subparsers


def _large(q: argparse.ArgumentParser) -> None:
    """run and demo write messages (refmsg writes objects): where the large ones go."""
    q.add_argument(
        "--large-message-bytes",
        type=at_least(1),
        default=128 << 20,
        help="messages above this (or of unknown size) are written to OUTPUT/payloads/ (default 128 MiB)",
    )


def add_parser(sub: Subparsers) -> argparse.ArgumentParser:
    """The ``run`` subcommand."""
    p = sub.add_parser("run", help="reassemble a Parquet landing table")
    p.add_argument("input", help="Parquet file, directory or glob of segments")
    p.add_argument("output", help="directory to create with messages/ and quarantine/ (outside the input)")
    p.add_argument("--input-format", choices=("encoded", "columns"), default="encoded")
    p.add_argument("--raw-column", default="segment", help="binary column holding encoded segments")
    p.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists")
    p.add_argument("--require-sha256", action="store_true", help="refuse messages without a SHA-256 digest (9035)")
    p.add_argument(
        "--hmac-keyring",
        metavar="FILE",
        default=None,
        help='JSON {"current": ID, "keys": {ID: HEX}}: demand an HMAC-SHA-256 tag under one of these keys',
    )
    spark_options(p)
    _large(p)
    return p


def add_demo_parser(sub: Subparsers) -> argparse.ArgumentParser:
    """The ``demo`` subcommand."""
    p = sub.add_parser("demo", help="generate faulty data, reassemble it, check the result")
    p.add_argument("--messages", type=at_least(1), default=200)
    p.add_argument("--segments-per-message", type=at_least(1), default=8)
    p.add_argument("--segment-size", type=at_least(128), default=16 * 1024, help="bytes, header included")
    p.add_argument("--keep", default=None, help="keep the data and output in this directory")
    spark_options(p)
    _large(p)
    return p


def _reassemble(args: argparse.Namespace, pattern: str, output: str, overwrite: bool) -> tuple[Job, Accounting]:
    """The segment job: reassemble, write atomically, print the summary with the accounting identity."""
    encoded = getattr(args, "input_format", "encoded") == "encoded"
    raw_column = getattr(args, "raw_column", "segment")
    column = raw_column if encoded else None
    # Read the keyring before Spark starts: a bad file is a usage error, reported at once.
    digest = digest_policy(getattr(args, "require_sha256", False), getattr(args, "hmac_keyring", None))
    job = open_job(pattern, output, overwrite=overwrite, column=column, settings=spark_settings(args))
    from reassembly.spark import ReassemblyOptions, reassemble

    try:
        rows_in = job.df.count()  # the first read of every file: a damaged one fails here
    except Exception as exc:
        raise JobError(f"cannot read {pattern}: {first_line(exc)}") from None
    start = time.monotonic()
    with job.writing() as tmp:
        options = ReassemblyOptions(
            max_message_size=args.max_message_size,
            partitions=args.partitions,
            payload_dir=str(tmp / "payloads"),
            large_message_bytes=args.large_message_bytes,
            digest=digest,
        )
        result = reassemble(job.df, encoded=encoded, raw_column=raw_column, options=options)
        result.save(tmp)  # clean messages from the JVM; the rest judged by a second job, if any
        from reassembly.spark.quarantine import prune_unreferenced

        prune_unreferenced(tmp / "payloads", tmp / "quarantine")  # files of attempts whose output was discarded
        tidy_payloads(tmp / "payloads")
    report, accounting = summarize(job.spark, job.out, rows_in, job.input_bytes(), time.monotonic() - start)
    print(report)
    out = job.out
    payloads = " " + str(out / "payloads") if (out / "payloads").exists() else ""
    print(f"output: {out}/messages  {out}/quarantine{payloads}")
    return job, accounting


def run(args: argparse.Namespace) -> int:
    """``run``: 0, or JobError when a segment is unaccounted for (rows in != used + quarantined + duplicates)."""
    _, accounting = _reassemble(args, args.input, args.output, args.overwrite)
    if not accounting.holds:
        raise JobError(f"accounting identity broken: {accounting.line()}")
    return 0


def demo(args: argparse.Namespace) -> int:
    """``demo``: 0 when every generated message came out as expected and every segment is accounted for."""
    from reassembly.spark.testdata import generate, write_parquet

    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="reassemble-demo-"))
    try:
        base.mkdir(parents=True, exist_ok=True)
        ds = generate(args.messages, args.segments_per_message, args.segment_size)
        landing = write_parquet(ds, base / "landing", files=8)
        print(
            f"demo: {len(ds.expected)} logical messages ({ds.payload_bytes / (1 << 20):.1f} MiB) as {len(ds.rows)} "
            f"segment rows in {landing}, with duplicates, conflicting copies, dropped segments, bit flips in "
            "data and headers, truncated rows, a zstd bomb, garbage rows and an incomplete MQ group"
        )
        job, accounting = _reassemble(args, str(landing), str(base / "out"), overwrite=True)
        out = job.out
        rows = job.spark.read.parquet(str(out / "messages")).collect()
        got = {(bytes(r.group_id), r.msg_seq_number): r for r in rows}

        def payload(row: Any) -> bytes:
            return (out / "payloads" / row.payload_path).read_bytes() if row.payload_path else bytes(row.payload)

        wrong = [
            k
            for k, e in ds.expected.items()
            if k not in got or got[k].status != e.status or (e.payload is not None and payload(got[k]) != e.payload)
        ]
        all_read = accounting.rows_in == len(ds.rows)
        print(
            f"check: {len(ds.expected) - len(wrong)}/{len(ds.expected)} messages as expected "
            f"(complete ones byte-identical); all {len(ds.rows)} generated segments accounted for: "
            f"{'yes' if all_read and accounting.holds else 'NO'}"
        )
        return 0 if not wrong and all_read and accounting.holds else EXIT_FAILED
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
