"""The ``reassemble`` command (also ``python -m reassembly``): arguments, the jobs, one-line errors.

Subcommands:
  run INPUT OUTPUT     reassemble Parquet segments into OUTPUT/messages and OUTPUT/quarantine
                       (and OUTPUT/payloads/ for messages above --large-message-bytes)
  demo                 generate a landing table with every fault, run the job on it, check it
  refmsg INPUT OUTPUT  rebuild objects from reference-message chunks (MQRMH rows)
  receive --root DIR   a crash-safe refmsg receiver fed framed messages on stdin
  collect INPUT OUTPUT --rules DB   batch messages by destination under database rules
  drain URL QUEUE DIR  land segments from a broker queue (AMQP or STOMP) as Parquet files in DIR

The jobs live in ``reassembly.spark`` and their plumbing in ``reassembly.spark.jobs``; this module
only parses arguments, calls them and turns every failure into one line and an exit code
(2 usage, 1 runtime, 130 Ctrl-C). Nothing imports it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO, NoReturn

from reassembly._plumbing import INTERRUPTED, JobError, UsageError, digest_policy, first_line, overlap
from reassembly.spark.jobs import Accounting, Job, SparkSettings, master_endpoints, open_job, summarize, tidy_payloads
from segmenter.errors import Reason, SegmentationError

EXIT_USAGE, EXIT_FAILED, EXIT_INTERRUPTED = 2, 1, 130


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """A usage error is one line too (argparse would print the whole usage first)."""
        self.exit(EXIT_USAGE, f"reassemble: error: {message} (see: {self.prog} --help)\n")


def _at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


_positive = _at_least(1)


def _master(text: str) -> str:
    try:
        master_endpoints(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="reassemble", description="Reassemble segmented messages with Spark.")
    sub = p.add_subparsers(dest="command", required=True)

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument(
            "--master", type=_master, default="local[2]", help="Spark master (default local[2]; spark://host:port)"
        )
        q.add_argument("--partitions", type=_positive, default=None, help="shuffle partitions (default: Spark's)")
        q.add_argument("--max-message-size", type=_positive, default=1 << 30, help="bytes; larger declared sizes: 2030")
        q.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None, help="live progress bar")
        q.add_argument("--verbose", action="store_true", help="show Spark's own output and Python tracebacks")

    def large(q: argparse.ArgumentParser) -> None:  # run and demo write messages; refmsg writes objects
        q.add_argument(
            "--large-message-bytes",
            type=_positive,
            default=128 << 20,
            help="messages above this (or of unknown size) are written to OUTPUT/payloads/ (default 128 MiB)",
        )

    run = sub.add_parser("run", help="reassemble a Parquet landing table")
    run.add_argument("input", help="Parquet file, directory or glob of segments")
    run.add_argument("output", help="directory to create with messages/ and quarantine/ (outside the input)")
    run.add_argument("--input-format", choices=("encoded", "columns"), default="encoded")
    run.add_argument("--raw-column", default="segment", help="binary column holding encoded segments")
    run.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists")
    run.add_argument("--require-sha256", action="store_true", help="refuse messages without a SHA-256 digest (9035)")
    run.add_argument(
        "--hmac-keyring",
        metavar="FILE",
        default=None,
        help='JSON {"current": ID, "keys": {ID: HEX}}: demand an HMAC-SHA-256 tag under one of these keys',
    )
    common(run)
    large(run)

    demo = sub.add_parser("demo", help="generate faulty data, reassemble it, check the result")
    demo.add_argument("--messages", type=_positive, default=200)
    demo.add_argument("--segments-per-message", type=_positive, default=8)
    demo.add_argument("--segment-size", type=_at_least(128), default=16 * 1024, help="bytes, header included")
    demo.add_argument("--keep", default=None, help="keep the data and output in this directory")
    common(demo)
    large(demo)

    ref = sub.add_parser("refmsg", help="rebuild objects from reference-message chunk rows")
    ref.add_argument("input", help="Parquet of encoded reference messages (binary column 'message')")
    ref.add_argument("output", help="directory to create with objects/ and quarantine/ (outside the input)")
    ref.add_argument("--message-column", default="message")
    ref.add_argument("--overwrite", action="store_true")
    common(ref)

    rx = sub.add_parser("receive", help="a refmsg receiver: framed reference messages on stdin, JSON lines out")
    rx.add_argument("--root", required=True, help="directory the objects are written under")
    rx.add_argument("--allow-plain", action="store_true", help="accept MQRMHs without the integrity block")

    from reassembly.cli.stream import add_stream_parser  # streaming job (issue 10): its own module

    add_stream_parser(sub)

    from reassembly.cli.collect import add_collect_parser  # collector (issue 12): its own module

    add_collect_parser(sub)

    from reassembly.brokers.drain import add_drain_parser  # the broker drain (issue 13): its own module

    add_drain_parser(sub)
    return p


def _settings(args: argparse.Namespace) -> SparkSettings:
    progress = sys.stderr.isatty() if args.progress is None else bool(args.progress)
    return SparkSettings(args.master, args.partitions, progress, args.verbose)


def _run(args: argparse.Namespace, pattern: str, output: str, overwrite: bool) -> tuple[Job, Accounting]:
    """The segment job: reassemble, write atomically, print the summary with the accounting identity."""
    encoded = getattr(args, "input_format", "encoded") == "encoded"
    raw_column = getattr(args, "raw_column", "segment")
    column = raw_column if encoded else None
    # Read the keyring before Spark starts: a bad file is a usage error, reported at once.
    digest = digest_policy(getattr(args, "require_sha256", False), getattr(args, "hmac_keyring", None))
    job = open_job(pattern, output, overwrite=overwrite, column=column, settings=_settings(args))
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


def _demo(args: argparse.Namespace) -> int:
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
        job, accounting = _run(args, str(landing), str(base / "out"), overwrite=True)
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


MAX_FRAME = 100 << 20  # MQ's largest MAXMSGL: a reference message is one MQ message


def _frame(stream: BinaryIO) -> bytes | None:
    """One frame (4-byte big-endian length, then the message); None at the end of input. Input that
    ends inside a frame, or a length over :data:`MAX_FRAME`, is an error: no later boundary can be
    trusted. The body is read a megabyte at a time, so a forged length sizes nothing."""
    prefix = stream.read(4)
    if not prefix:
        return None
    length = int.from_bytes(prefix, "big") if len(prefix) == 4 else -1
    if length > MAX_FRAME:
        raise JobError(f"frame of {length} bytes declared, the limit is {MAX_FRAME}")
    parts, got = [], 0
    while 0 <= got < length:
        part = stream.read(min(1 << 20, length - got))
        if not part:
            break
        parts.append(part)
        got += len(part)
    if got != length:
        what = f"{got} of {length} bytes" if length >= 0 else f"{len(prefix)} bytes of a length prefix"
        raise JobError(f"input ends inside a frame ({what})")
    return b"".join(parts)


def _stdin_inside(root: str) -> str | None:
    """The file stdin reads, when it lies under ``root`` (the receiver could replace it by an object)."""
    try:
        if not stat.S_ISREG(os.fstat(sys.stdin.fileno()).st_mode):
            return None
        path = Path(os.readlink("/proc/self/fd/0")).resolve()
    except (OSError, ValueError):
        return None
    return str(path) if overlap(path, Path(root).resolve()) else None


def _receive(args: argparse.Namespace) -> int:
    """A refmsg receiver as its own process, so it can be killed and restarted on the same root.

    For every frame one JSON line goes to stdout (flushed): the receipt, or the error's
    reason code, name and message. Exits 0 at the end of input.
    """
    from refmsg import Receiver

    inside = _stdin_inside(args.root)
    if inside is not None:
        raise UsageError(f"input {inside} is inside --root {args.root}: an object could replace it")
    with Receiver(args.root, require_integrity=not args.allow_plain) as receiver:
        while (frame := _frame(sys.stdin.buffer)) is not None:
            line: dict[str, Any]
            try:
                receipt = receiver.receive(frame)
                line = {
                    "outcome": receipt.outcome.value,
                    "name": receipt.name,
                    "offset": receipt.offset,
                    "length": receipt.length,
                    "written": receipt.written,
                }
            except SegmentationError as exc:
                line = {"error": int(exc.reason), "reason": exc.reason.name, "message": str(exc)}
            # this frame's files failed (no descriptor left, a link planted in the root): report, go on
            except OSError as exc:
                reason = Reason.STORE_ERROR
                line = {"error": int(reason), "reason": reason.name, "message": f"{type(exc).__name__}: {exc}"}
            sys.stdout.write(json.dumps(line) + "\n")
            sys.stdout.flush()
    return 0


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "run":
        _, accounting = _run(args, args.input, args.output, args.overwrite)
        if not accounting.holds:
            raise JobError(f"accounting identity broken: {accounting.line()}")
        return 0
    if args.command == "demo":
        return _demo(args)
    if args.command == "receive":
        return _receive(args)
    if args.command == "drain":
        from reassembly.brokers.drain import run_drain

        return run_drain(args)
    if args.command == "stream":
        from reassembly.cli.stream import run_stream

        return run_stream(args)
    if args.command == "collect":
        from reassembly.cli.collect import run_collect

        return run_collect(args)
    from reassembly.spark.objects import run_refmsg

    settings = _settings(args)
    print(run_refmsg(args.input, args.output, column=args.message_column, overwrite=args.overwrite, settings=settings))
    return 0


def _interrupted() -> int:
    print("reassemble: interrupted", file=sys.stderr)
    return EXIT_INTERRUPTED


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not getattr(args, "verbose", False):
        # py4j logs tracebacks through the root logger (on Ctrl-C, on a lost JVM): the one line replaces them
        root = logging.getLogger()
        root.addHandler(logging.NullHandler())
        root.setLevel(logging.CRITICAL + 1)
    try:
        return _dispatch(args)
    except KeyboardInterrupt:
        return _interrupted()
    except (JobError, SegmentationError) as exc:
        if INTERRUPTED.is_set():  # the JVM died of the same Ctrl-C first
            return _interrupted()
        print(f"reassemble: error: {exc}", file=sys.stderr)
        return EXIT_USAGE if isinstance(exc, UsageError) else EXIT_FAILED
    except Exception as exc:
        if INTERRUPTED.is_set():
            return _interrupted()
        if getattr(args, "verbose", False):
            raise
        print(f"reassemble: error: {type(exc).__name__}: {first_line(exc)} (--verbose shows more)", file=sys.stderr)
        return EXIT_FAILED
