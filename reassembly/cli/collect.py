"""``reassemble collect INPUT OUTPUT --rules DB``: batch a landing directory of messages by destination.

INPUT receives Parquet files of rows with a destination and a payload column (write each file
under a hidden or ``_`` name and rename it into place: a half-written file is only retried).
Batches are written as ``OUTPUT/<target>/<batch_id>.parquet`` (column ``segment``, one MQ
logical group each), which ``reassemble run`` reassembles with Unit-of-Work semantics. One line
per batch goes to stdout. Ctrl-C (or SIGTERM) stops cleanly: leases are given back, open
batches stay in the database for the next run. Errors are one line (exit 2 usage, 1 runtime).

A batch that cannot be written is tried again at every lease renewal; after its rule's
``max_attempts`` it goes to ``OUTPUT.dead-letter/<target>/`` with one line on stderr, and
``--list-dead`` lists the dead batches of a database (INPUT and OUTPUT are then not needed).

``--flush DEST`` asks the collector running on that database to close DEST's batch now: it
stores a request row and returns; the collector holding DEST's lease closes the batch (cause
``forced``) at its next poll.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from reassembly._errors import JobError, UsageError, counted, first_line
from reassembly._files import overlap
from reassembly.cli._common import seconds
from reassembly.collector.core import BatchReady
from reassembly.storage.collector import DeadBatch, open_storage
from reassembly.storage.durable import DurableCollector, collect_directory, dead_letter_dir
from reassembly.storage.sql import is_postgres
from segmenter.producer import DEFAULT_SEGMENT_SIZE, Segmenter

if TYPE_CHECKING:
    from reassembly.cli._common import Subparsers


def add_parser(sub: Subparsers) -> argparse.ArgumentParser:
    """The ``collect`` subcommand."""
    p = sub.add_parser("collect", help="batch messages by destination under database rules")
    p.add_argument("input", nargs="?", help="landing directory of Parquet files (destination and payload columns)")
    p.add_argument(
        "output", nargs="?", help="directory the batches are written under (OUTPUT/<target>/<batch>.parquet)"
    )
    p.add_argument("--rules", required=True, metavar="DB", help="SQLite file or postgresql:// URL (rules and state)")
    p.add_argument(
        "--once", action="store_true", help="collect what is there, close every batch, exit (1 if a file is unreadable)"
    )
    p.add_argument("--lease", type=seconds, default=30.0, help="how long a stopped collector keeps its destinations")
    p.add_argument("--rules-ttl", type=seconds, default=5.0, help="how long rules are cached (default 5s)")
    p.add_argument("--poll", type=seconds, default=0.5, help="how often INPUT is listed (default 0.5s)")
    p.add_argument("--segment-size", type=int, default=DEFAULT_SEGMENT_SIZE, help="bytes per segment, header included")
    p.add_argument("--destination-column", default="destination")
    p.add_argument("--payload-column", default="payload")
    p.add_argument("--owner", default=None, help="this collector's name in the lease table (default host:pid:random)")
    p.add_argument("--quiet", action="store_true", help="no line per batch")
    alone = p.add_mutually_exclusive_group()
    alone.add_argument(
        "--list-dead", action="store_true", help="list the dead batches of the --rules database and exit (no INPUT)"
    )
    alone.add_argument(
        "--flush",
        action="append",
        metavar="DEST",
        help="ask the running collector to close DEST's batch at its next poll, and exit (repeatable; no INPUT)",
    )
    return p


def _check(args: argparse.Namespace) -> tuple[Path, Path]:
    if args.input is None or args.output is None:
        raise UsageError("collect needs INPUT and OUTPUT (only --list-dead and --flush go without them)")
    landing, output = Path(args.input), Path(args.output)
    if not landing.is_dir():
        raise UsageError(f"input is not a directory: {args.input}")
    why = overlap(output.resolve(), landing.resolve())
    if why:
        raise UsageError(f"output {args.output} {why} {args.input}: choose an output outside the input")
    dead = dead_letter_dir(output).resolve()
    why = overlap(dead, landing.resolve()) or overlap(landing.resolve(), dead)
    if why:
        raise UsageError(f"the dead-letter directory {dead} overlaps the input {args.input}: choose another output")
    if not is_postgres(args.rules):
        # The SQLite file (and its -wal/-journal siblings) is written to: never inside the input, and
        # never over the output's batches.
        rules = Path(args.rules).resolve()
        for name, path in (("input", landing), ("output", output), ("dead-letter directory", dead)):
            why = overlap(rules, path.resolve())
            if why:
                raise UsageError(f"--rules {args.rules} {why.replace('input', name)} {path}: keep the database apart")
        if not rules.parent.is_dir():
            raise UsageError(f"--rules: directory does not exist: {Path(args.rules).parent}")
    if args.segment_size <= 200 or args.lease <= 0 or args.poll <= 0:
        raise UsageError("--segment-size must exceed 200 bytes; --lease and --poll must be positive")
    return landing, output


def run(args: argparse.Namespace) -> int:
    """Collect until interrupted (or, with --once, until INPUT is done); 0, or JobError naming skipped files.

    Ctrl-C and SIGTERM (the command's interrupt, exit 130) unwind through the ``finally`` below:
    the collector gives its leases back and open batches stay in the database for the next run.
    """
    if args.list_dead:
        return _list_dead(args)
    if args.flush:
        return _request_flush(args)
    landing, output = _check(args)
    storage = open_storage(args.rules)

    def line(batch: BatchReady, path: Path) -> None:
        if not args.quiet:
            n, cause = len(batch.messages), batch.cause.value
            print(f"batch {batch.batch_id} {batch.destination!r} {counted(n, 'message')} {cause} -> {path}")
            sys.stdout.flush()

    def dead(batch: DeadBatch) -> None:
        print(f"reassemble: error: {_dead_line(batch)}", file=sys.stderr)
        sys.stderr.flush()

    def warn(path: Path, exc: Exception) -> None:
        print(f"reassemble: warning: cannot read {path} yet: {first_line(exc)} (retried)", file=sys.stderr)

    def changed(path: Path) -> None:
        print(
            f"reassemble: warning: {path} changed after it was collected under this name; not collected again"
            " (land new content under a new name)",
            file=sys.stderr,
        )

    collector = DurableCollector(
        storage,
        output,
        segmenter=Segmenter(max_segment_size=args.segment_size),
        owner=args.owner,
        lease=args.lease,
        rules_ttl=args.rules_ttl,
        on_batch=line,
        on_dead=dead,
    )
    try:
        left = collect_directory(
            collector,
            landing,
            destination_column=args.destination_column,
            payload_column=args.payload_column,
            poll=args.poll,
            once=args.once,
            on_unreadable=warn,
            on_replaced=changed,
        )
    finally:
        try:
            collector.stop()
        finally:
            storage.close()
    print(f"collect: {counted(collector.emitted, 'batch', 'batches')} written under {output}")
    if left.unreadable:
        raise JobError(
            f"{counted(len(left.unreadable), 'input file')} could not be read, e.g. {left.unreadable[0]}"
            " (left in place)"
        )
    if collector.dead:
        raise JobError(
            f"{counted(len(collector.dead), 'batch', 'batches')} went to the dead letter after the last attempt, e.g."
            f" {collector.dead[0].batch_id} (reassemble collect --rules DB --list-dead lists them)"
        )
    if left.replaced:
        raise JobError(
            f"{counted(len(left.replaced), 'input file')} changed after they were collected under their name, e.g."
            f" {left.replaced[0]} (not collected again: land new content under a new name)"
        )
    return 0


def _dead_line(batch: DeadBatch) -> str:
    where = batch.path or "its messages kept in the database row (the dead-letter file could not be written)"
    return (
        f"batch {batch.batch_id} {batch.destination!r} {counted(batch.messages, 'message')} dead after"
        f" {counted(batch.attempts, 'attempt')}: {batch.reason} -> {where}"
    )


def _existing(args: argparse.Namespace) -> None:
    """--list-dead and --flush read a collector's database: never create an empty one by a typo."""
    if args.input is not None or args.output is not None:
        raise UsageError("--list-dead and --flush take no INPUT or OUTPUT, only --rules DB")
    if not is_postgres(args.rules) and not Path(args.rules).is_file():
        raise UsageError(f"--rules: no such database: {args.rules}")


def _request_flush(args: argparse.Namespace) -> int:
    """Store one flush request per DEST; say what each covers (or that nothing is held)."""
    _existing(args)
    storage = open_storage(args.rules)
    try:
        for destination in args.flush:
            n = storage.request_flush(destination)
            if n:
                said = counted(n, "message")
                print(f"flush {destination!r}: requested for {said}; the collector holding it closes the batch")
            else:
                print(f"flush {destination!r}: no message held, nothing requested")
    finally:
        storage.close()
    return 0


def _list_dead(args: argparse.Namespace) -> int:
    """One line per dead batch, oldest first (UTC time it died), then a count."""
    _existing(args)
    storage = open_storage(args.rules)
    try:
        batches = storage.dead_batches()
    finally:
        storage.close()
    for batch in batches:
        at = datetime.datetime.fromtimestamp(batch.dead_at or 0.0, datetime.timezone.utc).isoformat(timespec="seconds")
        print(f"dead {at} {_dead_line(batch)}")
    print(f"collect: {counted(len(batches), 'dead batch', 'dead batches')} in {storage.url}")
    return 0
