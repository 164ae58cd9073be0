"""What every subcommand of ``reassemble`` shares: exit codes, the parser class, argument types,
interrupts, logging and the progress bar.

The exit codes live here, not in ``main``: a subcommand returns one (``demo`` fails with
:data:`EXIT_FAILED`, ``--fail-on`` with :data:`EXIT_CONDITION`) and ``main`` maps errors to them, so
both import this module and neither imports the other. One type per kind of value
(:func:`at_least`, :func:`seconds`, :func:`master`, :func:`conf_pair`, :func:`conditions`) keeps one
wording for one mistake across subcommands. Ctrl-C and SIGTERM go through
:func:`reassembly._processes.on_interrupt` in every subcommand (:func:`stop_on_signals`), so the
command reports both as one ``reassemble: interrupted`` line and exit code 130. The library logs
through :mod:`logging` and never prints; :func:`configure_logging` decides what of it reaches
stderr. The progress bar (:class:`Progress`) is the command's: it draws on the terminal.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn

from reassembly._errors import counted
from reassembly._processes import INTERRUPTED, on_interrupt
from reassembly.spark.engine.session import SparkSettings, master_endpoints

if TYPE_CHECKING:
    from typing import TypeAlias

    from reassembly.cli.summary import Record

    Subparsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]

EXIT_OK = 0
"""The job ran to its end and no ``--fail-on`` condition held."""
EXIT_FAILED = 1
"""A runtime failure: missing or unreadable input, a failed Spark job, a broken accounting identity, a
``demo`` whose check failed. Nothing is left under OUTPUT."""
EXIT_USAGE = 2
"""A usage error, refused before anything is touched: an unknown option, a malformed value
(``--conf`` without ``=``, an unknown ``--fail-on`` condition), OUTPUT overlapping the input."""
EXIT_CONDITION = 3
"""The job ran to its end and wrote everything, and a ``--fail-on`` condition held."""
EXIT_INTERRUPTED = 130
"""Ctrl-C or SIGTERM: the job's Spark work is stopped and its hidden output removed first."""

EXIT_CODES: dict[int, str] = {
    EXIT_OK: "ok",
    EXIT_FAILED: "failed",
    EXIT_USAGE: "usage error",
    EXIT_CONDITION: "a --fail-on condition held",
    EXIT_INTERRUPTED: "interrupted",
}
"""Every exit code of the command, with what it means (docs/reference/command-line.md lists the same)."""

CONDITIONS = ("incomplete", "corrupt", "quarantine", "skipped")
"""What ``--fail-on`` can name: an incomplete message, a corrupt message, a quarantined segment, an
input file Spark skipped (``spark.sql.files.ignoreCorruptFiles`` or ``ignoreMissingFiles`` on)."""
_COUNTED_IN = {"quarantine": "segment", "skipped": "file"}


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


def conf_pair(text: str) -> tuple[str, str]:
    """An argument type: ``KEY=VALUE`` (a Spark setting; the value may hold ``=`` itself)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


def conf_option(q: argparse.ArgumentParser) -> None:
    """``--conf KEY=VALUE``, repeatable: Spark settings for the session the command starts."""
    q.add_argument(
        "--conf",
        type=conf_pair,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting for the session, over the library's defaults (repeatable; "
        "e.g. --conf spark.ui.enabled=false, --conf spark.executor.memory=8g)",
    )


def spark_conf(args: argparse.Namespace) -> dict[str, str]:
    """The ``--conf`` settings parsed, the last of a key winning (as with spark-submit)."""
    return dict(getattr(args, "conf", None) or [])


def conditions(text: str) -> list[str]:
    """An argument type: a comma-separated subset of :data:`CONDITIONS`."""
    names = [n.strip() for n in text.split(",")]
    unknown = [n for n in names if n not in CONDITIONS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown condition {unknown[0]!r} (choose from {', '.join(CONDITIONS)})")
    return names


def summary_file(text: str) -> str:
    """An argument type: a file to write whose directory exists (checked before anything runs)."""
    parent = Path(os.path.abspath(text)).parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"directory does not exist: {parent}")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"is a directory: {text}")
    return text


def orchestration_options(q: argparse.ArgumentParser) -> None:
    """What an orchestrator consumes (``run``, ``demo``, ``stream``): the summary as JSON, and exit code
    :data:`EXIT_CONDITION` for the conditions it names."""
    q.add_argument(
        "--summary-json",
        metavar="FILE",
        type=summary_file,
        default=None,
        help="also write the summary as JSON to FILE (replaced atomically; written on failure too; "
        "schema in docs/reference/command-line.md; default: none)",
    )
    q.add_argument(
        "--fail-on",
        type=conditions,
        action="extend",
        default=None,
        metavar="CONDITIONS",
        help=f"exit {EXIT_CONDITION} after writing everything if any of these held: comma list of "
        f"{', '.join(CONDITIONS)} (incomplete or corrupt messages, quarantined segments, input files Spark "
        "skipped; default: none)",
    )


def fail_on(record: Record, requested: Sequence[str] | None, counts: dict[str, int]) -> int:
    """The ``--fail-on`` verdict, recorded for ``--summary-json`` (``conditions``, ``fail_on``): exit
    :data:`EXIT_CONDITION` when a requested condition held (``counts``: condition -> how many
    messages, or segments for ``quarantine``), said in one line on stderr; else :data:`EXIT_OK`."""
    asked = [c for c in CONDITIONS if c in (requested or [])]
    held = [c for c in asked if counts.get(c, 0) > 0]
    record.fields.update(
        conditions={c: counts.get(c, 0) > 0 for c in CONDITIONS}, fail_on={"requested": asked, "held": held}
    )
    if not held:
        return EXIT_OK
    what = ", ".join(f"{c} ({counted(counts[c], _COUNTED_IN.get(c, 'message'))})" for c in held)
    print(f"reassemble: --fail-on: {what}", file=sys.stderr)
    return EXIT_CONDITION


def spark_options(q: argparse.ArgumentParser, *, streaming: bool = False) -> None:
    """The options of the Spark jobs (``run``, ``demo``, ``refmsg``; ``stream`` with ``streaming``: its
    partitions are the state's, fixed by the checkpoint, and its status lines replace the bar)."""
    q.add_argument(
        "--master", type=master, default="local[2]", help="Spark master (default local[2]; spark://host:port)"
    )
    q.add_argument(
        "--partitions",
        type=at_least(1),
        default=None,
        help="state partitions of a new checkpoint (default: Spark's cores; a resumed stream keeps its own)"
        if streaming
        else "shuffle partitions (default: Spark's)",
    )
    q.add_argument(
        "--max-message-size",
        type=at_least(1),
        default=1 << 30,
        help="bytes; larger declared sizes are quarantined as 2030 (default 1 GiB)",
    )
    conf_option(q)
    if not streaming:
        q.add_argument(
            "--progress",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="live progress bar on stderr (default: on at a terminal)",
        )
    q.add_argument("--verbose", action="store_true", help="show Spark's own output, INFO logs and Python tracebacks")


def segment_options(q: argparse.ArgumentParser) -> None:
    """Where the segments are (``run``, ``stream``), and what a message must carry to be delivered."""
    q.add_argument(
        "--input-format",
        choices=("encoded", "columns"),
        default="encoded",
        help="encoded: one binary column of encoded segments (--raw-column); columns: the header fields as "
        "columns group_id, msg_seq_number, offset, msg_flags, original_length, data_checksum, "
        "message_checksum and data (default encoded)",
    )
    q.add_argument("--raw-column", default="segment", help="binary column holding encoded segments (default segment)")
    q.add_argument("--require-sha256", action="store_true", help="refuse messages without a SHA-256 digest (9035)")
    q.add_argument(
        "--hmac-keyring",
        metavar="FILE",
        default=None,
        help='JSON {"current": ID, "keys": {ID: HEX}}: demand an HMAC-SHA-256 tag under one of these keys '
        "(default: none demanded)",
    )


def spark_settings(args: argparse.Namespace) -> SparkSettings:
    """The session settings :func:`spark_options` parsed."""
    return SparkSettings(args.master, args.partitions, args.verbose, spark_conf(args))


def progress_wanted(args: argparse.Namespace) -> bool:
    """``--progress`` / ``--no-progress``; by default on when stderr is a terminal."""
    chosen = getattr(args, "progress", None)
    return sys.stderr.isatty() if chosen is None else bool(chosen)


class Progress:
    """A live bar on stderr from the status tracker of the active Spark context (stages and tasks done).

    The command's, not the library's: it draws on the terminal. It waits for a context to exist (the
    session starts inside the job), so the command can wrap a whole job in it.
    """

    def __init__(self, enabled: bool) -> None:
        self._enabled = enabled
        self._drawn = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="progress", daemon=True)

    def __enter__(self) -> Progress:
        if self._enabled:
            self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        if self._enabled:
            self._thread.join()
            if self._drawn:
                sys.stderr.write("\r" + " " * 78 + "\r")
                sys.stderr.flush()

    @staticmethod
    def _context() -> Any:
        pyspark = sys.modules.get("pyspark")  # not imported: no session yet (never imported from here)
        return getattr(getattr(pyspark, "SparkContext", None), "_active_spark_context", None)

    def _loop(self) -> None:
        start = time.monotonic()
        while not self._stop.wait(0.5):
            sc = self._context()
            if sc is None:
                continue
            try:
                tracker = sc.statusTracker()
                done = total = 0
                stages = []
                for sid in tracker.getActiveStageIds():
                    info = tracker.getStageInfo(sid)
                    if info is not None:
                        done += info.numCompletedTasks
                        total += info.numTasks
                        stages.append(str(sid))
            except Exception:  # the session is stopping: nothing to draw
                continue
            frac = done / total if total else 0.0
            bar = "#" * int(30 * frac) + "-" * (30 - int(30 * frac))
            label = f"stage {','.join(stages)}" if stages else "planning"
            sys.stderr.write(f"\r[{bar}] {done}/{total} tasks  {label}  {time.monotonic() - start:5.1f}s ")
            sys.stderr.flush()
            self._drawn = True


class _Lowercase(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        record.level = record.levelname.lower()
        return super().format(record)


def _not_py4j(record: logging.LogRecord) -> bool:
    """py4j logs tracebacks (on Ctrl-C, on a lost JVM), some through the root logger: the command's
    one line replaces them."""
    return not record.name.startswith("py4j") and f"{os.sep}py4j{os.sep}" not in record.pathname


def configure_logging(verbose: bool) -> None:
    """What of the library's logging reaches stderr: WARNING and above, INFO with ``--verbose``.

    Lines read ``reassemble: warning: reassembly._files: ...``. py4j's own records are shown
    only with ``--verbose`` (and then from WARNING up).
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Lowercase("reassemble: %(level)s: %(name)s: %(message)s"))
    if not verbose:
        handler.addFilter(_not_py4j)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO if verbose else logging.WARNING)
    logging.getLogger("py4j").setLevel(logging.WARNING)


def stop_on_signals() -> None:
    """Ctrl-C and SIGTERM (a service manager's stop) raise KeyboardInterrupt and set ``INTERRUPTED``.

    One behaviour for every subcommand: a Spark job's work is stopped and its hidden output
    removed, the collector gives its leases back, and ``main`` reports one line with exit code 130.
    The flag is what tells ``main`` that an error surfacing afterwards (py4j's, once the same Ctrl-C
    killed the JVM) is the interruption. ``stream`` and ``drain`` replace the handlers while they
    can stop between files or batches, and put them back. Only the main thread may install handlers.
    """
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, on_interrupt)


def ended() -> None:
    """The job is over and its exit code decided: Ctrl-C and SIGTERM from now on only set the flag
    (the process ends in a moment anyway, with the code and record the job earned)."""
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: INTERRUPTED.set())


def spark_jvm() -> object | None:
    """The JVM process PySpark launched in this process, if any (pyspark is not imported for it)."""
    context = getattr(sys.modules.get("pyspark.core.context"), "SparkContext", None)
    proc: object | None = getattr(getattr(context, "_gateway", None), "proc", None)
    return proc


def end_spark() -> None:
    """End the Spark JVM the command launched, and its Python workers, before the command exits
    (:func:`reassembly.spark.engine.session.end_jvm`): nothing the command started outlives it."""
    if "pyspark.core.context" in sys.modules:  # a command that never started Spark does not import it
        from reassembly.spark.engine.session import end_jvm

        left = end_jvm()
        if left:
            logging.getLogger(__name__).warning("Spark processes still running after SIGKILL: %s", left)


def interrupted() -> int:
    """The one line an interruption prints, and its exit code."""
    print("reassemble: interrupted", file=sys.stderr)
    return EXIT_INTERRUPTED


def lineage_options(q: argparse.ArgumentParser) -> None:
    """``--keep-columns`` and ``--keep-input-file`` (``run``, ``stream``): input columns carried to every
    output row unchanged (docs/reference/output-schema.md, "Lineage")."""
    q.add_argument(
        "--keep-columns",
        type=column_list,
        default=(),
        metavar="A,B,C",
        help="input columns to carry unchanged into every output row: a quarantine row's source, a "
        "message's sources (one per segment used, in offset order) (default: none)",
    )
    q.add_argument(
        "--keep-input-file",
        action="store_true",
        help="keep each row's input file path too, as the kept column input_file (default: off)",
    )


def column_list(text: str) -> tuple[str, ...]:
    """``A,B,C`` as column names (none empty)."""
    names = tuple(n.strip() for n in text.split(","))
    if any(not n for n in names):
        raise argparse.ArgumentTypeError(f"an empty column name in {text!r} (names separated by commas)")
    return names
