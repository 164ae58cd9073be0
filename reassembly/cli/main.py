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

The jobs live in the library (``reassembly.spark``, ``reassembly.collector``, ``reassembly.brokers``,
``refmsg``); the command parses arguments, calls them and turns every failure into one line and an
exit code (2 usage, 1 runtime, 130 Ctrl-C or SIGTERM). Nothing imports it but ``reassembly.__main__``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, cast

from reassembly._plumbing import INTERRUPTED, JobError, UsageError, first_line
from reassembly.cli import collect, drain, objects, receive, run, stream
from reassembly.cli._common import EXIT_FAILED, EXIT_USAGE, Parser, interrupted, stop_on_signals
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
}
"""Subcommand name -> (adds its parser to the subparsers, runs it and returns the exit code)."""


def parser() -> argparse.ArgumentParser:
    """The ``reassemble`` parser with every subcommand of :data:`COMMANDS`, in its order."""
    p = Parser(prog="reassemble", description="Reassemble segmented messages with Spark.")
    # Subparsers of our Parser class (one-line usage errors), typed as plain ArgumentParser ones: argparse's
    # generic is invariant, and the subcommand modules use nothing of Parser's own.
    sub = cast("Subparsers", p.add_subparsers(dest="command", required=True))
    for add_parser, _ in COMMANDS.values():
        add_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, run the subcommand, and map what it raises to one line on stderr and an exit code."""
    args = parser().parse_args(argv)
    verbose = getattr(args, "verbose", False)
    if not verbose:
        # py4j logs tracebacks through the root logger (on Ctrl-C, on a lost JVM): the one line replaces them
        root = logging.getLogger()
        root.addHandler(logging.NullHandler())
        root.setLevel(logging.CRITICAL + 1)
    stop_on_signals()
    try:
        return COMMANDS[args.command][1](args)
    except KeyboardInterrupt:
        return interrupted()
    except (JobError, SegmentationError) as exc:
        if INTERRUPTED.is_set():  # the JVM died of the same Ctrl-C first
            return interrupted()
        print(f"reassemble: error: {exc}", file=sys.stderr)
        return EXIT_USAGE if isinstance(exc, UsageError) else EXIT_FAILED
    except Exception as exc:
        if INTERRUPTED.is_set():
            return interrupted()
        if verbose:
            raise
        print(f"reassemble: error: {type(exc).__name__}: {first_line(exc)} (--verbose shows more)", file=sys.stderr)
        return EXIT_FAILED
