"""``reassemble stream INPUT OUTPUT --checkpoint DIR``: the streaming job over a landing directory.

Reads Parquet files as they land (event time: each file's modification time,
or ``--event-time COLUMN``), writes OUTPUT/messages, OUTPUT/quarantine and
OUTPUT/duplicates in committed ``batch=N`` folders (see
:class:`~reassembly.spark.stream.functions.BatchWriter`) and prints one status line per
micro-batch (:func:`status_line`, :mod:`.stream_status`). Input that cannot be what was meant (the segment column
missing, of another type, or holding no segments) is refused before the query starts, so
nothing is consumed and the checkpoint does not move (:mod:`reassembly.spark.inputs`); a stream
begun on an empty directory waits for the first file before it starts, so that file is checked
too. Ctrl-C stops after the batch in flight, says so at once, and exits 130 once that batch has
committed; a second Ctrl-C aborts at once (the batch in flight is read again at the next start).
Errors are :class:`~reassembly._errors.JobError` (one line, exit code 1) or
:class:`~reassembly._errors.UsageError` (exit code 2, nothing consumed): the command's ``main``
reports them like every other job's. docs/how-to/streaming.md describes the command.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from reassembly._errors import JobError, UsageError, first_line
from reassembly._files import claim_output, hadoop_literal
from reassembly._processes import on_interrupt
from reassembly.cli._common import (
    EXIT_INTERRUPTED,
    at_least,
    fail_on,
    lineage_options,
    orchestration_options,
    seconds,
    segment_options,
    spark_conf,
    spark_options,
)
from reassembly.cli.stream_status import (
    StatusLines,
    age,
    batch_ids,
    begun,
    event_time_now,
    running_batch,
    status_line,
)
from reassembly.spark.batch.job import (
    skipping,
)
from reassembly.spark.engine.session import SparkSettings, master_endpoints, open_session

if TYPE_CHECKING:
    from reassembly.cli._common import Subparsers
    from reassembly.cli.summary import Record
    from reassembly.spark.stream.functions import Halt


def _trigger(text: str) -> str:
    if text == "available-now":
        return text
    return f"{int(seconds(text) * 1000)} milliseconds"


def add_parser(sub: Subparsers) -> argparse.ArgumentParser:
    """The ``stream`` subcommand. Every option's help shows its default (durations as given, e.g. ``1h``).

    ``sub``: the ``reassemble`` command's subparsers the subcommand is added to.
    """
    p = sub.add_parser("stream", help="reassemble a landing directory as it fills")
    p.add_argument("input", help="directory that Parquet files of segments land in")
    p.add_argument("output", help="directory for messages/, quarantine/, duplicates/ (created; reused on restart)")
    p.add_argument("--checkpoint", required=True, help="Spark checkpoint directory (keep it to resume exactly once)")
    p.add_argument(
        "--trigger",
        type=_trigger,
        default="available-now",
        help="available-now: process what has landed, then stop; or an interval such as 10s: run until Ctrl-C "
        "(default %(default)s)",
    )
    segment_options(p)
    p.add_argument(
        "--event-time",
        default=None,
        metavar="COLUMN",
        help="timestamp column giving each row's event time (default: each file's modification time)",
    )
    p.add_argument(
        "--expire-after",
        type=seconds,
        default="1h",
        help="event time after its first segment at which an undecided message leaves as incomplete "
        "(default %(default)s)",
    )
    p.add_argument(
        "--watermark",
        type=seconds,
        default="10m",
        help="how far event time may run behind the newest seen; older rows are dropped (default %(default)s)",
    )
    p.add_argument(
        "--tombstone",
        type=seconds,
        default="1d",
        help="how long a decided group is remembered, to judge late copies of its segments (default %(default)s)",
    )
    p.add_argument(
        "--max-held-bytes",
        type=at_least(1),
        default=256 << 20,
        help="segment bytes held per group; a group that would hold more is evicted (default %(default)s = 256 MiB)",
    )
    p.add_argument(
        "--max-files-per-trigger",
        type=at_least(1),
        default=None,
        help="files per micro-batch (default: every file that has landed)",
    )
    spark_options(p, streaming=True)
    p.add_argument(
        "--payload-dir",
        default=None,
        help="directory for large messages' bodies, one every worker sees; held there, not in state, "
        "as they arrive (default: none, every message in its row)",
    )
    p.add_argument(
        "--large-message-bytes",
        type=at_least(1),
        default=128 << 20,
        help="with --payload-dir: messages above this go there (default %(default)s = 128 MiB)",
    )
    lineage_options(p)
    orchestration_options(p)
    return p


def check_args(args: argparse.Namespace) -> Path:
    """The output to write, or a one-line error; touches nothing and starts no Spark.

    OUTPUT and --checkpoint must lie outside INPUT (and INPUT outside them), compared after
    resolving symlinks, ``..`` and relative paths: a stream would read its own output as new
    segments forever, or its checkpoint files as input. OUTPUT and --checkpoint must not overlap
    either (each is deleted to start over; neither writer expects the other's files), nor
    --payload-dir and --checkpoint (deleting a checkpoint to start over must not delete the bodies
    that delivered rows name). Nor may --summary-json land in any of them
    (:func:`reassembly._files.claim_output`).

    ``args``: the parsed command line.
    """
    try:
        master_endpoints(args.master)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not os.path.isdir(args.input):
        raise JobError(f"input not found (a directory): {args.input}")
    claim_output(  # the stream reads INPUT as it is named (not a glob), and through its links
        args.output,
        [args.input],
        may_exist=True,
        apart=[("checkpoint", args.checkpoint)],
        beside=[("payload dir", args.payload_dir)] if args.payload_dir else (),
        summary=getattr(args, "summary_json", None),
    )
    out = Path(args.output)
    if out.exists() and any(out.iterdir()) and not (out / "_commits").is_dir():
        raise JobError(f"output exists and is not a stream output: {args.output}")
    return out


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


def landed(directory: str) -> bool:
    """Whether a file the stream would read is in ``directory`` (Spark skips names starting ``.`` or ``_``)."""
    for _, dirs, files in os.walk(directory, followlinks=True):
        dirs[:] = [d for d in dirs if not d.startswith((".", "_"))]
        if any(not f.startswith((".", "_")) for f in files):
            return True
    return False


def _wait_for_first_file(args: argparse.Namespace) -> None:
    """Until a file lands in the input (polled at the trigger's interval, at most every second)."""
    pause = min(1.0, int(args.trigger.split()[0]) / 1000)
    while not landed(args.input):  # Ctrl-C: the command's interrupt (exit 130); nothing runs yet
        time.sleep(pause)


def _stopping_line(after: int | None) -> bytes:
    said = f"after batch {after}" if after is not None else "now (no batch running)"
    return f"reassemble: stopping {said} (Ctrl-C again to abort)\n".encode()


def _watch(query: Any, lines: StatusLines, halt: Halt, checkpoint: str) -> Any:
    """Print status lines until the query ends; on Ctrl-C stop it once the batch in flight committed.
    Returns the query's exception, if it failed."""

    def ctrl_c(signum: int, frame: Any) -> None:
        if halt.requested.is_set():
            on_interrupt(signum, frame)  # the second: abort now (the command's interrupt, exit 130)
        halt.request(running_batch(checkpoint))
        os.write(2, _stopping_line(halt.after))  # at once, whatever the batch still takes

    # Ctrl-C waits for the batch boundary; before the query runs and after it stops, the command's
    # interrupt (an exit 130) applies again. SIGTERM keeps that interrupt throughout.
    previous = signal.signal(signal.SIGINT, ctrl_c)
    committed_at: float | None = None
    try:
        while query.isActive:
            query.awaitTermination(0.1 if halt.requested.is_set() else 0.5)
            lines.flush(query)
            if not halt.requested.is_set():
                continue
            after = halt.after
            if after is not None and (Path(checkpoint) / "commits" / str(after)).exists():
                committed_at = committed_at or time.monotonic()
            # Stop once the batch named has committed and its line is printed (its progress comes just after
            # the commit); the sink holds any batch Spark begins meanwhile, unwritten (see Halt).
            if after is None or lines.printed >= after or (committed_at and time.monotonic() - committed_at > 3):
                halt.stopping.set()
                query.stop()
        lines.flush(query)
        return query.exception()
    finally:
        signal.signal(signal.SIGINT, previous)


def _said_output(out: Path, to: TextIO) -> None:
    print(f"output: {out}/messages  {out}/quarantine  {out}/duplicates (committed batches: {out}/_commits)", file=to)


def run(args: argparse.Namespace) -> int:
    """The ``stream`` command: exit code 0 (130 when Ctrl-C stopped it), or JobError / UsageError.

    ``args``: the parsed command line.
    """
    from reassembly._keyring import digest_policy
    from reassembly.spark.batch.pipeline import ReassemblyOptions
    from reassembly.spark.footers import check_files
    from reassembly.spark.inputs import InputRefused, SegmentInput
    from reassembly.spark.schema import ColumnNames
    from reassembly.spark.stream.functions import (
        BatchWriter,
        CheckpointMismatch,
        Halt,
        StreamOptions,
        bind_checkpoint,
        configure,
        file_source,
        reassemble_stream,
        start,
    )

    out = check_args(args)
    record: Record = args.record
    digest = digest_policy(args.require_sha256, args.hmac_keyring)  # before Spark: a bad keyring fails at once
    options = StreamOptions(
        reassembly=ReassemblyOptions(
            max_message_size=args.max_message_size,
            digest=digest,
            payload_dir=args.payload_dir,
            large_message_bytes=args.large_message_bytes,
            keep_columns=(*args.keep_columns, *(["input_file"] if args.keep_input_file else [])),
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
    lines = StatusLines(sys.stdout if args.verbose else _quiet_stdout(), out, args.watermark, args.checkpoint)
    encoded = args.input_format == "encoded"
    # A new stream on an empty directory starts its query once the first file has landed, so that the
    # file is checked as any other input is (nothing else to check the columns against until then).
    waiting = not begun(args.checkpoint) and not landed(args.input)
    if waiting:
        print(f"idle: nothing has landed in {args.input} yet", file=lines.out, flush=True)
        if args.trigger == "available-now":  # nothing to do, and no Spark to start for it
            BatchWriter(out)  # the output's folders, as a run that found nothing new leaves them
            _said_output(out, lines.out)
            lines.record(record, args, out, "no input")
            return fail_on(record, args.fail_on, lines.condition_counts())
    footers = None  # what the footers told (a stream waiting for its first file has none to read)
    if not waiting:  # from the files' footers and first values, before Spark starts
        what = SegmentInput(encoded, args.raw_column, ColumnNames())
        strict = not skipping(spark_conf(args))  # a file Spark is told to skip is named once skipped
        footers = check_files([args.input], args.input, what, event_time=args.event_time, strict=strict)
    with record.phase("spark_start"):
        spark = open_session(SparkSettings(args.master, args.partitions, verbose=args.verbose, conf=spark_conf(args)))
    record.fields["spark"] = getattr(spark, "version", None)
    lines.spark = spark
    configure(spark, args.partitions)  # session SQL confs, read when the query starts
    if waiting:
        _wait_for_first_file(args)
    halt = Halt()
    try:
        df = file_source(
            spark,
            hadoop_literal(args.input),  # the directory checked, not what Spark's glob would make of its name
            raw_column=args.raw_column,
            event_time=args.event_time,
            max_files=args.max_files_per_trigger,
            encoded=encoded,
            keep=args.keep_columns,
            input_file="input_file" if args.keep_input_file else None,
            footers=footers,  # no Spark job infers or samples what the footers told
        )
        rows = reassemble_stream(df, encoded=encoded, columns=ColumnNames(), options=options)
        query = start(rows, out, args.checkpoint, args.trigger, options=options, halt=halt)
    except (InputRefused, UsageError):
        raise  # exit 2: the query never started, nothing consumed
    except Exception as exc:  # an unusable checkpoint, an unreadable file: one line, not a Java stack trace
        raise JobError(f"cannot start the stream: {first_line(exc)}") from None
    try:
        with record.phase("stream"):
            error = _watch(query, lines, halt, args.checkpoint)
    finally:  # a failed or aborted stream's record says what its committed batches did
        lines.record(record, args, out, "ctrl-c" if halt.requested.is_set() else "end of input")
    if error is not None:
        raise JobError(f"stream failed: {first_line(error)}")
    total = lines.total()
    if total is not None:
        print(total.line(), file=lines.out)
    _said_output(out, lines.out)
    if total is not None and not total.holds:
        raise JobError(f"accounting identity broken: {total.line()}")
    if halt.requested.is_set():
        last = batch_ids(out / "_commits")
        said = f"after batch {last[-1]}" if last else "before any batch"
        print(f"reassemble: stopped {said} (the same command resumes from there)", file=sys.stderr)
        return EXIT_INTERRUPTED
    return fail_on(record, args.fail_on, lines.condition_counts())


__all__ = ["add_parser", "age", "check_args", "event_time_now", "landed", "run", "running_batch", "status_line"]
