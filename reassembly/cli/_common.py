"""What every subcommand of ``reassemble`` shares: exit codes, the parser class, argument types, interrupts.

The exit codes live here, not in ``main``: a subcommand returns one (``demo`` fails with
:data:`EXIT_FAILED`) and ``main`` maps errors to them, so both import this module and neither
imports the other. One type per kind of value (:func:`at_least`, :func:`seconds`, :func:`master`)
keeps one wording for one mistake across subcommands. Ctrl-C and SIGTERM go through
:func:`reassembly._plumbing.on_interrupt` in every subcommand (:func:`stop_on_signals`), so the
command reports both as one ``reassemble: interrupted`` line and exit code 130.
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

from reassembly._plumbing import on_interrupt
from reassembly.spark.jobs import SparkSettings, master_endpoints

if TYPE_CHECKING:
    from typing import TypeAlias

    Subparsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]

EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130


class Parser(argparse.ArgumentParser):
    """The command's parser; its subparsers are of this class too (argparse makes them of the parent's)."""

    def error(self, message: str) -> NoReturn:
        """A usage error is one line too (argparse would print the whole usage first)."""
        self.exit(EXIT_USAGE, f"reassemble: error: {message} (see: {self.prog} --help)\n")


def at_least(minimum: int) -> Callable[[str], int]:
    """An argument type: an integer no smaller than ``minimum``, or a message naming what is wrong."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_WORDS = {"millisecond": "ms", "second": "s", "minute": "m", "hour": "h", "day": "d"}


def seconds(text: str) -> float:
    """``90``, ``30s``, ``10m``, ``1h``, ``2d``, ``500ms`` or ``10 minutes`` -> seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", text.lower())
    if m is None:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 30s, 10m, 1h, 2d)")
    unit = m.group(2).rstrip("s") if len(m.group(2)) > 2 else m.group(2)
    unit = _WORDS.get(unit, unit) or "s"
    if unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"unknown unit in {text!r} (ms, s, m, h, d)")
    return float(m.group(1)) * _UNITS[unit]


def master(text: str) -> str:
    """An argument type: a Spark master URL, refused at parse time when malformed (nothing started yet)."""
    try:
        master_endpoints(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def spark_options(q: argparse.ArgumentParser) -> None:
    """The options of the batch Spark jobs (``run``, ``demo``, ``refmsg``)."""
    q.add_argument(
        "--master", type=master, default="local[2]", help="Spark master (default local[2]; spark://host:port)"
    )
    q.add_argument("--partitions", type=at_least(1), default=None, help="shuffle partitions (default: Spark's)")
    q.add_argument("--max-message-size", type=at_least(1), default=1 << 30, help="bytes; larger declared sizes: 2030")
    q.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None, help="live progress bar")
    q.add_argument("--verbose", action="store_true", help="show Spark's own output and Python tracebacks")


def spark_settings(args: argparse.Namespace) -> SparkSettings:
    """The session settings :func:`spark_options` parsed; the progress bar defaults to on at a terminal."""
    progress = sys.stderr.isatty() if args.progress is None else bool(args.progress)
    return SparkSettings(args.master, args.partitions, progress, args.verbose)


def stop_on_signals() -> None:
    """Ctrl-C and SIGTERM (a service manager's stop) raise KeyboardInterrupt and set ``INTERRUPTED``.

    One behaviour for every subcommand: the hidden output of a Spark job is removed, the collector
    gives its leases back, and ``main`` reports one line with exit code 130. The flag is what tells
    ``main`` that an error surfacing afterwards (py4j's, once the same Ctrl-C killed the JVM) is the
    interruption. ``stream`` and ``drain`` replace the handlers while they can stop between files or
    batches, and put them back. Only the main thread may install handlers.
    """
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, on_interrupt)


def interrupted() -> int:
    """The one line an interruption prints, and its exit code."""
    print("reassemble: interrupted", file=sys.stderr)
    return EXIT_INTERRUPTED
