"""``reassemble stream INPUT OUTPUT --checkpoint DIR``: the streaming job over a landing directory.

Reads Parquet files as they land (event time: each file's modification time,
or ``--event-time COLUMN``), writes OUTPUT/messages, OUTPUT/quarantine and
OUTPUT/duplicates in committed ``batch=N`` folders (see
:class:`~reassembly.spark.stream.functions.BatchWriter`), prints one status line per
micro-batch, and on Ctrl-C stops at the next batch boundary. Errors are
:class:`~reassembly._plumbing.JobError` (one line, exit code 1) or
:class:`~reassembly._plumbing.UsageError` (exit code 2, checked before Spark starts):
the command's ``main`` reports them like every other job's.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from reassembly._plumbing import JobError, UsageError, first_line, hadoop_literal, linked_overlap, overlap
from reassembly.cli._common import seconds
from reassembly.spark.jobs import SparkSettings, master_endpoints, open_session

if TYPE_CHECKING:
    from reassembly.cli._common import Subparsers


def _trigger(text: str) -> str:
    if text == "available-now":
        return text
    return f"{int(seconds(text) * 1000)} milliseconds"


def add_parser(sub: Subparsers) -> argparse.ArgumentParser:
    """The ``stream`` subcommand."""
    p = sub.add_parser("stream", help="reassemble a landing directory as it fills")
    p.add_argument("input", help="directory that Parquet files of segments land in")
    p.add_argument("output", help="directory for messages/, quarantine/, duplicates/ (created; reused on restart)")
    p.add_argument("--checkpoint", required=True, help="Spark checkpoint directory (keep it to resume exactly once)")
    p.add_argument(
        "--trigger",
        type=_trigger,
        default="available-now",
        help="available-now (process what is there, then stop; default) or an interval such as 10s (run until Ctrl-C)",
    )
    p.add_argument("--expire-after", type=seconds, default=3600.0, help="incomplete this long after its first segment")
    p.add_argument("--watermark", type=seconds, default=600.0, help="allowed event-time lateness (default 10m)")
    p.add_argument("--tombstone", type=seconds, default=86400.0, help="how long finished groups are remembered")
    p.add_argument(
        "--max-held-bytes", type=int, default=256 << 20, help="segment bytes held per group (default 256 MiB)"
    )
    p.add_argument("--event-time", default=None, help="timestamp column (default: each file's modification time)")
    p.add_argument("--raw-column", default="segment", help="binary column holding encoded segments")
    p.add_argument("--max-files-per-trigger", type=int, default=None, help="files per micro-batch (default all)")
    p.add_argument("--master", default="local[2]", help="Spark master (default local[2]; spark://host:port)")
    p.add_argument(
        "--partitions",
        type=int,
        default=None,
        help="state partitions of a new checkpoint (default: Spark's cores; a resumed stream keeps its own)",
    )
    p.add_argument("--max-message-size", type=int, default=1 << 30, help="bytes; larger declared sizes: 2030")
    p.add_argument(
        "--payload-dir",
        default=None,
        help="directory for large messages' bodies (one every worker sees); held there, not in state, as they arrive",
    )
    p.add_argument(
        "--large-message-bytes", type=int, default=128 << 20, help="with --payload-dir: messages above this go there"
    )
    p.add_argument("--verbose", action="store_true", help="show Spark's own output")
    p.add_argument("--require-sha256", action="store_true", help="refuse messages without a SHA-256 digest (9035)")
    p.add_argument("--hmac-keyring", metavar="FILE", default=None, help="demand an HMAC tag (see `run --help`)")
    return p


def check_args(args: argparse.Namespace) -> Path:
    """The output to write, or a one-line error; touches nothing and starts no Spark.

    OUTPUT and --checkpoint must lie outside INPUT (and INPUT outside them), compared after
    resolving symlinks, ``..`` and relative paths: a stream would read its own output as new
    segments forever, or its checkpoint files as input. OUTPUT and --checkpoint must not overlap
    either (each is deleted to start over; neither writer expects the other's files), nor
    --payload-dir and --checkpoint (deleting a checkpoint to start over must not delete the bodies
    that delivered rows name).
    """
    try:
        master_endpoints(args.master)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not os.path.isdir(args.input):
        raise JobError(f"input not found (a directory): {args.input}")
    source, out, checkpoint = Path(args.input).resolve(), Path(args.output), Path(args.checkpoint).resolve()
    named = [("output", args.output), ("checkpoint", args.checkpoint)]
    for name, path in named + ([("payload dir", args.payload_dir)] if args.payload_dir else []):
        why = overlap(Path(path).resolve(), source)
        if why:
            raise UsageError(f"{name} {path} {why} {args.input}: choose a {name} outside the input")
        why = linked_overlap(Path(path).resolve(), args.input)  # the stream reads through links too
        if why:
            raise UsageError(f"{name} {path} {why}: choose a {name} outside the input")
    if overlap(out.resolve(), checkpoint):
        raise UsageError(f"output {args.output} and checkpoint {args.checkpoint} overlap: keep them apart")
    if args.payload_dir and overlap(Path(args.payload_dir).resolve(), checkpoint):
        raise UsageError(f"payload dir {args.payload_dir} and checkpoint {args.checkpoint} overlap: keep them apart")
    if out.exists() and any(out.iterdir()) and not (out / "_commits").is_dir():
        raise JobError(f"output exists and is not a stream output: {args.output}")
    if not out.parent.exists():
        raise JobError(f"output parent directory does not exist: {out.parent}")
    return out


def status_line(batch: int, counts: Counter[str], progress: Any) -> str:
    """One line per micro-batch: rows in, messages out by status, late, what state holds, watermark.

    ``held``: open groups, their held segments, the bytes of those segments in state and the
    data bytes kept in spool files instead (large messages); ``tombstones``: decided groups
    remembered for late segments, and the bytes of their values. Exact: summed from the batch's
    own ``state`` rows (:class:`~reassembly.spark.stream.core.Footprint`), not RocksDB's memory.
    ``store rows`` is Spark's count of every row in the state store (timers and state variables).
    """
    statuses = ", ".join(f"{k.split(':', 1)[1]} {v}" for k, v in sorted(counts.items()) if k.startswith("message:"))
    ops = progress.stateOperators if progress is not None else []
    rows_in = progress.numInputRows if progress is not None else 0
    wm = progress.eventTime.get("watermark", "-") if progress is not None else "-"
    dropped = sum(o.numRowsDroppedByWatermark for o in ops)
    if "state:groups" in counts:
        c = counts
        state = (
            f"held {c['state:groups']} groups, {c['state:segments']} segments, {c['state:held_bytes']} bytes in state,"
            f" {c['state:spooled_bytes']} bytes spooled; tombstones {c['state:tombstones']}"
            f" ({c['state:tombstone_bytes']} bytes)"
        )
    else:
        state = "held unknown (checkpoint begun by an older version)"
    return (
        f"batch {batch}: {rows_in} rows in; messages {statuses or 'none'}; quarantined {counts['quarantine']}"
        f" (late {counts['late']}); duplicates {counts['duplicate']}; {state};"
        f" store rows {sum(o.numRowsTotal for o in ops)}; watermark {wm}"
        + (f"; DROPPED by watermark {dropped}" if dropped else "")
    )


class _Lines:
    """Joins a batch's committed counts (its marker, written by the sink) with its progress (from Spark)."""

    def __init__(self, out: TextIO, output: Path) -> None:
        self.out = out
        self.output = output
        self.printed = -1
        self.idle = -1  # the batch an idle line was printed for (once)

    def flush(self, query: Any) -> None:
        from reassembly.spark.stream.functions import batch_counts

        for p in query.recentProgress:
            if p.batchId > self.printed:
                counts = batch_counts(self.output, p.batchId)
                if counts is None and not p.numInputRows:  # an idle trigger: that batch has not run (yet)
                    if p.batchId != self.idle:
                        self.idle = p.batchId
                        print(f"idle: no new input (batch {p.batchId} did not run)", file=self.out, flush=True)
                    continue
                self.printed = p.batchId
                print(status_line(p.batchId, counts or Counter(), p), file=self.out, flush=True)


def _quiet_stdout() -> TextIO:
    """Our own stdout, with file descriptor 1 sent to /dev/null for Spark's children.

    The JVM and its Python state workers inherit fd 1 and print several lines
    per batch; the status lines go to a duplicate of the original stdout.
    """
    sys.stdout.flush()
    ours = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    return ours


def run(args: argparse.Namespace) -> int:
    """The ``stream`` command: exit code 0, or JobError / UsageError for the command to report."""
    from reassembly._plumbing import digest_policy
    from reassembly.spark.pipeline import ReassemblyOptions
    from reassembly.spark.stream.functions import (
        CheckpointMismatch,
        StreamOptions,
        bind_checkpoint,
        configure,
        file_source,
        reassemble_stream,
        start,
    )

    out = check_args(args)
    digest = digest_policy(args.require_sha256, args.hmac_keyring)  # before Spark: a bad keyring fails at once
    options = StreamOptions(
        reassembly=ReassemblyOptions(
            max_message_size=args.max_message_size,
            digest=digest,
            payload_dir=args.payload_dir,
            large_message_bytes=args.large_message_bytes,
        ),
        expire_after=args.expire_after,
        watermark=args.watermark,
        tombstone=args.tombstone,
        max_held_bytes=args.max_held_bytes,
    )
    try:
        bind_checkpoint(args.checkpoint, options)  # before Spark starts: a checkpoint it would misread
    except CheckpointMismatch as exc:
        raise JobError(str(exc)) from None
    lines = _Lines(sys.stdout if args.verbose else _quiet_stdout(), out)
    spark = open_session(SparkSettings(args.master, args.partitions, verbose=args.verbose))
    configure(spark, args.partitions)  # session SQL confs, read when the query starts
    try:
        df = file_source(
            spark,
            hadoop_literal(args.input),  # the directory checked, not what Spark's glob would make of its name
            raw_column=args.raw_column,
            event_time=args.event_time,
            max_files=args.max_files_per_trigger,
        )
        rows = reassemble_stream(df, options=options)
        query = start(rows, out, args.checkpoint, args.trigger, options=options)
    except Exception as exc:  # a bad column name, an unusable checkpoint: one line, not a Java stack trace
        raise JobError(f"cannot start the stream: {first_line(exc)}") from None
    stop = threading.Event()
    # Ctrl-C waits for the batch boundary; before the query runs and after it stops, the command's
    # interrupt (an exit 130) applies again. SIGTERM keeps that interrupt throughout.
    previous = signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        while query.isActive:
            query.awaitTermination(0.5)
            lines.flush(query)
            if stop.is_set() and not query.status["isTriggerActive"]:
                query.stop()  # between batches: nothing half-written (and a replay would be skipped anyway)
        lines.flush(query)
        error = query.exception()
    finally:
        signal.signal(signal.SIGINT, previous)
    if error is not None:
        raise JobError(f"stream failed: {first_line(error)}")
    print(
        f"output: {out}/messages  {out}/quarantine  {out}/duplicates (committed batches: {out}/_commits)",
        file=lines.out,
    )
    return 0


__all__ = ["add_parser", "check_args", "run", "status_line"]
