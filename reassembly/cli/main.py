"""The ``reassemble`` command (also ``python -m reassembly``): the parser, the table of subcommands, exit codes.

Subcommands, one module each in this package (:data:`COMMANDS` holds them in the order ``--help`` lists them):
  run INPUT OUTPUT     (run.py) reassemble Parquet segments into OUTPUT/messages and OUTPUT/quarantine
                       (and OUTPUT/payloads/ for messages above --large-message-bytes)
  demo                 (run.py) generate a landing table with every fault, run the job on it, check it
  refmsg INPUT OUTPUT  (objects.py) rebuild objects from reference-message chunks (MQRMH rows)
  receive --root DIR   (receive.py) a crash-safe refmsg receiver fed framed messages on stdin
  stream INPUT OUTPUT --checkpoint DIR   (stream.py) reassemble a landing directory as it fills
  collect INPUT OUTPUT --rules DB        (collect.py) batch messages by destination under database rules
  drain URL QUEUE DIR  (drain.py) land segments from a broker queue (AMQP or STOMP) as Parquet files in DIR
  consume URL TOPIC --handler MODULE:FUNCTION   (consume.py) whole messages to parallel handlers
  claimcheck sweep STORE --ledger DB --older-than D   (claimcheck.py) delete orphaned claim-check payloads
  store list|expire|vacuum --store URL   (store.py) look after the segment store competing consumers share

The jobs live in the library (``reassembly.spark``, ``reassembly.collector``, ``reassembly.brokers``,
``refmsg``); the command parses arguments, configures logging, calls them and turns every failure
into one line and an exit code (:data:`~reassembly.cli._common.EXIT_CODES`: 0 ok, 1 runtime, 2 usage,
3 a ``--fail-on`` condition held, 130 Ctrl-C or SIGTERM). With ``--summary-json FILE`` it writes the
run's record whatever the outcome but a usage error. Nothing imports it but ``reassembly.__main__``.
"""

from __future__ import annotations

import argparse
import platform
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from reassembly._errors import JobError, UsageError, first_line
from reassembly._processes import INTERRUPTED
from reassembly.cli import claimcheck, collect, consume, drain, objects, receive, run, store, stream
from reassembly.cli._common import (
    EXIT_CONDITION,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    Parser,
    configure_logging,
    end_spark,
    ended,
    interrupted,
    spark_jvm,
    stop_on_signals,
)
from reassembly.cli.summary import Record, library_version, process_age, pyspark_version
from segmenter.errors import SegmentationError

if TYPE_CHECKING:
    from typing import TypeAlias

    from reassembly.cli._common import Subparsers

    AddParser: TypeAlias = Callable[[Subparsers], argparse.ArgumentParser]
    Run: TypeAlias = Callable[[argparse.Namespace], int]

COMMANDS: dict[str, tuple[AddParser, Run]] = {
    "run": (run.add_parser, run.run),
    "demo": (run.add_demo_parser, run.demo),
    "refmsg": (objects.add_parser, objects.run),
    "receive": (receive.add_parser, receive.run),
    "stream": (stream.add_parser, stream.run),
    "collect": (collect.add_parser, collect.run),
    "drain": (drain.add_parser, drain.run),
    "consume": (consume.add_parser, consume.run),
    "claimcheck": (claimcheck.add_parser, claimcheck.run),
    "store": (store.add_parser, store.run),
}
"""Subcommand name -> (adds its parser to the subparsers, runs it and returns the exit code)."""


def version_line() -> str:
    """What ``--version`` prints: this library's version, the Spark its pyspark bundles, Python's."""
    return f"reassemble {library_version()} (Spark {pyspark_version()}, Python {platform.python_version()})"


class _Version(argparse.Action):
    """``--version``: print :func:`version_line` and exit 0 (pyspark is imported, no JVM started)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(version_line())
        parser.exit(EXIT_OK)


def parser() -> argparse.ArgumentParser:
    """The ``reassemble`` parser with every subcommand of :data:`COMMANDS`, in its order."""
    p = Parser(prog="reassemble", description="Reassemble segmented messages with Spark.")
    p.add_argument("--version", action=_Version, help="print the versions of reassemble, Spark and Python, and exit")
    # Subparsers of our Parser class (one-line usage errors), typed as plain ArgumentParser ones: argparse's
    # generic is invariant, and the subcommand modules use nothing of Parser's own.
    sub = cast("Subparsers", p.add_subparsers(dest="command", required=True))
    for add_parser, _ in COMMANDS.values():
        add_parser(sub)
    return p


def _outcome(code: int) -> str:
    if code == EXIT_INTERRUPTED:
        return "interrupted"
    return "completed" if code in (EXIT_OK, EXIT_CONDITION) else "failed"


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, run the subcommand, map what it raises to one line on stderr and an exit code, and write
    the ``--summary-json`` record (every outcome has one)."""
    started = process_age() if argv is None else None  # a process of its own: its start-up is the command's
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    verbose = getattr(args, "verbose", False)
    configure_logging(verbose)
    args.record = Record(args.command, argv)
    if started is not None:
        args.record.durations["python_start"] = started
    stop_on_signals()
    jvm_before = spark_jvm()  # a JVM this process had before the command (a caller's session) is not the command's
    try:
        code, error = _run(args, verbose)
    except Exception as exc:  # --verbose: the traceback is shown, the record still written
        _write_record(args, EXIT_FAILED, f"{type(exc).__name__}: {first_line(exc)}")
        raise
    finally:
        ended()  # the exit code stands: a late Ctrl-C must not turn the record's writing into a traceback
        if spark_jvm() is not jvm_before:
            end_spark()
    return _write_record(args, code, error)


def _write_record(args: argparse.Namespace, code: int, error: str | None) -> int:
    """Write the ``--summary-json`` record if asked; the exit code (1 if it could not be written). A
    usage error writes none: it touches nothing (FILE itself may be what was refused)."""
    path = getattr(args, "summary_json", None)
    if path and code != EXIT_USAGE:
        try:
            args.record.write(path, code, _outcome(code), error)
        except OSError as exc:
            print(f"reassemble: error: cannot write --summary-json {path}: {first_line(exc)}", file=sys.stderr)
            return code if code != EXIT_OK else EXIT_FAILED
    return code


def _run(args: argparse.Namespace, verbose: bool) -> tuple[int, str | None]:
    """The subcommand's exit code, and the one line reported for a failure."""
    try:
        return COMMANDS[args.command][1](args), None
    except KeyboardInterrupt:
        return interrupted(), "interrupted"
    except (JobError, SegmentationError) as exc:
        if INTERRUPTED.is_set():  # the JVM died of the same Ctrl-C first
            return interrupted(), "interrupted"
        print(f"reassemble: error: {exc}", file=sys.stderr)
        return (EXIT_USAGE if isinstance(exc, UsageError) else EXIT_FAILED), str(exc)
    except Exception as exc:
        if INTERRUPTED.is_set():
            return interrupted(), "interrupted"
        if verbose:
            raise
        line = f"{type(exc).__name__}: {first_line(exc)}"
        print(f"reassemble: error: {line} (--verbose shows more)", file=sys.stderr)
        return EXIT_FAILED, line
