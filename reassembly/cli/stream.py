"""``reassemble stream INPUT OUTPUT --checkpoint DIR``: the streaming job over a landing directory.

Reads Parquet files as they land (event time: each file's modification time,
or ``--event-time COLUMN``), writes OUTPUT/messages, OUTPUT/quarantine and
OUTPUT/duplicates in committed ``batch=N`` folders (see
:class:`~reassembly.spark.stream.functions.BatchWriter`) and prints one status line per
micro-batch (:func:`status_line`). Input that cannot be what was meant (the segment column
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
import json
import os
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from reassembly._errors import JobError, UsageError, counted, first_line
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
from reassembly.spark.batch.job import (
    SkippedFile,
    skip_settings,
    skipped_among,
    skipped_json,
    skipped_line,
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


def _epoch_ms(text: str | None) -> int | None:
    """Spark's ISO 8601 UTC time (``2026-01-02T03:04:05.678Z``) in epoch milliseconds; None for none or 1970."""
    if not text:
        return None
    ms = int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)
    return ms if ms > 0 else None


def age(ms: int) -> str:
    """A duration for a person: ``850ms``, ``42.0s``, ``12m05s``, ``3h07m``, ``2d04h``.

    ``ms``: the duration in milliseconds.
    """
    if ms < 1000:
        return f"{max(ms, 0)}ms"
    s = ms / 1000
    if s < 60:
        return f"{s:.1f}s"
    m, sec = divmod(int(s), 60)
    if m < 60:
        return f"{m}m{sec:02d}s"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


def event_time_now(progress: Any, lateness: float) -> int | None:
    """The stream's event time after a batch (epoch ms): the latest event time it has seen, i.e. the
    batch's newest row or, from earlier batches, the watermark plus the allowed lateness it trails by.

    ``progress``: Spark's progress of the batch (a StreamingQueryProgress). ``lateness``: the stream's watermark delay,
    in seconds.
    """
    if progress is None:
        return None
    newest = _epoch_ms(progress.eventTime.get("max"))
    watermark = _epoch_ms(progress.eventTime.get("watermark"))
    seen = [t for t in (newest, None if watermark is None else watermark + int(lateness * 1000)) if t is not None]
    return max(seen) if seen else None


def status_line(batch: int, counts: Counter[str], progress: Any, lateness: float = 0.0) -> str:
    """One line per micro-batch: when it started (UTC) and how long it took, rows in, messages out by
    status, quarantined and late, duplicates, what state holds and the age of its oldest held segment,
    Spark's store rows, the watermark.

    ``duplicates`` means what it means in ``run``: every identical copy of a segment, those counted in
    the messages they arrived for and, in parentheses, the ``late`` ones (copies of a message that had
    already left, written to ``duplicates/``).

    Rows in, the time, the duration and the watermark are Spark's progress for this batch (the
    trigger that ran it, never an idle one); every other count is the batch's own committed marker.
    ``held``: open groups, their held segments, the bytes of those segments in state and the
    data bytes kept in spool files instead (large messages); ``tombstones``: decided groups
    remembered for late segments, and the bytes of their values. Exact: summed from the batch's
    own ``state`` rows (:class:`~reassembly.spark.stream.core.Footprint`), not RocksDB's memory.
    ``oldest held``: event time now (the newest seen, see :func:`event_time_now`; ``lateness`` is the
    stream's ``--watermark``) minus the first event time of the oldest group still open.
    ``store rows`` is Spark's count of every row in the state store (timers and state variables).

    ``batch``: the micro-batch's id. ``counts``: its committed marker's counts, by kind and status. ``progress``:
    Spark's progress for the batch.
    """
    from reassembly.spark.stream.functions import OLDEST

    statuses = ", ".join(f"{k.split(':', 1)[1]} {v}" for k, v in sorted(counts.items()) if k.startswith("message:"))
    ops = progress.stateOperators if progress is not None else []
    rows_in = progress.numInputRows if progress is not None else "?"
    wm = progress.eventTime.get("watermark", "-") if progress is not None else "-"
    when = progress.timestamp if progress is not None else datetime.now(timezone.utc).isoformat(timespec="milliseconds")
    took = (progress.durationMs or {}).get("triggerExecution") if progress is not None else None
    dropped = sum(o.numRowsDroppedByWatermark for o in ops)
    if "state:groups" in counts:
        c = counts
        state = (
            f"held {counted(c['state:groups'], 'group')}, {counted(c['state:segments'], 'segment')},"
            f" {c['state:held_bytes']} bytes in state,"
            f" {c['state:spooled_bytes']} bytes spooled; tombstones {c['state:tombstones']}"
            f" ({c['state:tombstone_bytes']} bytes)"
        )
        now = event_time_now(progress, lateness)
        if not c["state:groups"]:
            oldest = "none"
        elif OLDEST in c and now is not None:
            oldest = age(now - c[OLDEST])
        else:
            oldest = "unknown"
        state += f"; oldest held {oldest}"
    else:
        state = "held unknown (checkpoint begun by an older version)"
    copies = counts["message_duplicates"] + counts["duplicate"]
    return (
        f"{when} batch {batch}" + (f" ({took / 1000:.1f}s)" if took is not None else "") + ":"
        f" {rows_in} rows in; messages {statuses or 'none'}; quarantined {counts['quarantine']}"
        f" (late {counts['late']}); duplicates {copies} (late {counts['duplicate']}); {state};"
        f" store rows {sum(o.numRowsTotal for o in ops)}; watermark {wm}"
        + (f"; DROPPED by watermark {dropped}" if dropped else "")
    )


def _ran(progress: Any) -> bool:
    """Whether a progress report is of a trigger that ran its batch (an idle one only looked for input)."""
    return "addBatch" in (getattr(progress, "durationMs", None) or {})


@dataclass(frozen=True)
class Accounting:
    """A stream's accounting over one batch or several in a row: every row in, and every segment
    state held before them, is used in a message, quarantined, a duplicate copy (in a message or
    late), dropped by the watermark, or still held in state after them (:data:`IDENTITY_STREAM
    <reassembly.cli.summary.IDENTITY_STREAM>`)."""

    rows_in: int
    held_before: int
    used: int
    quarantined: int
    duplicates: int
    dropped_by_watermark: int
    held_after: int

    @property
    def holds(self) -> bool:
        return self.rows_in + self.held_before == (
            self.used + self.quarantined + self.duplicates + self.dropped_by_watermark + self.held_after
        )

    def then(self, later: Accounting) -> Accounting:
        """This batch (or run of batches) followed by ``later``: what was held before the first of
        them, what is held after the last, the rest summed."""
        return Accounting(
            self.rows_in + later.rows_in,
            self.held_before,
            self.used + later.used,
            self.quarantined + later.quarantined,
            self.duplicates + later.duplicates,
            self.dropped_by_watermark + later.dropped_by_watermark,
            later.held_after,
        )

    def line(self) -> str:
        return (
            f"segments: {self.rows_in} in + {self.held_before} held before = {self.used} used +"
            f" {self.quarantined} quarantined + {self.duplicates} duplicates + {self.dropped_by_watermark}"
            f" dropped by watermark + {self.held_after} held after: {'holds' if self.holds else 'BROKEN'}"
        )

    def as_json(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "holds": self.holds}


def batch_accounting(
    counts: Counter[str], before: Counter[str] | None, rows_in: int, dropped: int
) -> Accounting | None:
    """One batch's :class:`Accounting` from its marker (``counts``), the marker of the batch before it
    (``before``; None for the first batch of a checkpoint) and Spark's rows in and dropped; None where a
    marker lacks a term (a checkpoint begun by an older version)."""
    held_before = 0 if before is None else before.get("state:segments")
    if held_before is None or "used" not in counts or "state:segments" not in counts:
        return None
    return Accounting(
        rows_in,
        held_before,
        counts["used"],
        counts["quarantine"],
        counts["message_duplicates"] + counts["duplicate"],
        dropped,
        counts["state:segments"],
    )


class _Lines:
    """Joins each batch's committed counts (its marker, written by the sink) with the progress of the
    trigger that ran it (Spark reports idle triggers too, under the id of the batch still to run)."""

    def __init__(self, out: TextIO, output: Path, lateness: float = 0.0, checkpoint: str | None = None) -> None:
        self.out = out
        self.output = output
        self.lateness = lateness
        self.checkpoint = checkpoint  # where the file source logs each batch's files (for skipped files)
        self.spark: Any = None  # the session, once there is one: it says whether files may be skipped
        self.printed = -1  # the last batch a status line was printed for
        self.idle = -1  # the batch an idle line was printed for (once)
        self.batches: list[int] = []  # the batches this invocation ran, in order
        self.totals: Counter[str] = Counter()  # their committed counts summed (``state:*`` not: see last)
        self.last: Counter[str] = Counter()  # the last one's counts (``state:*``: what state holds now)
        self.rows_in = 0  # Spark's input rows of those batches
        self.dropped = 0  # rows Spark's watermark dropped in them
        self.accounting: list[tuple[int, Accounting | None]] = []  # each batch's, None where not known
        self.skipped: list[SkippedFile] = []  # input files Spark did not read whole, over the batches

    def flush(self, query: Any) -> None:
        from reassembly.spark.stream.functions import batch_counts

        reports = list(query.recentProgress)
        for p in reports:
            if p.batchId <= self.printed:
                continue
            if _ran(p):
                counts = batch_counts(self.output, p.batchId)
                if counts is None:  # not committed by the sink (cannot follow a finished trigger): later
                    return
                self.printed = p.batchId
                skipped = self._add(p, counts)
                print(status_line(p.batchId, counts, p, self.lateness), file=self.out, flush=True)
                if skipped:
                    print(skipped_line(skipped, skip_settings(self.spark)), file=self.out, flush=True)
            elif p is reports[-1] and p.batchId != self.idle:  # waiting for input now
                self.idle = p.batchId
                print(f"idle: no new input (batch {p.batchId} did not run)", file=self.out, flush=True)

    def _add(self, progress: Any, counts: Counter[str]) -> list[SkippedFile]:
        """Count a committed batch in; the input files Spark skipped in it."""
        from reassembly.spark.stream.functions import batch_counts

        batch, rows_in = progress.batchId, int(progress.numInputRows or 0)
        dropped = sum(int(o.numRowsDroppedByWatermark) for o in progress.stateOperators)
        self.batches.append(batch)
        self.totals.update({k: v for k, v in counts.items() if not k.startswith("state:")})
        self.last = counts
        self.rows_in += rows_in
        self.dropped += dropped
        before = None if batch == 0 else batch_counts(self.output, batch - 1) or Counter()
        self.accounting.append((batch, batch_accounting(counts, before, rows_in, dropped)))
        skipped = self._skipped(batch, rows_in)
        self.skipped += skipped
        return skipped

    def _skipped(self, batch: int, rows_in: int) -> list[SkippedFile]:
        """The files of ``batch`` Spark did not read whole, where the session lets it skip files."""
        if self.spark is None or self.checkpoint is None or not skip_settings(self.spark):
            return []
        files = batch_files(self.checkpoint, batch)
        return skipped_among(self.spark, files, rows_in) if files else []

    def total(self) -> Accounting | None:
        """The invocation's accounting over its batches (None when one of them is not known); with no
        batch, what state held throughout (None if that is not known)."""
        if not self.accounting:
            held = self.state().get("state:segments")
            return None if held is None else Accounting(0, held, 0, 0, 0, 0, held)
        known = [a for _, a in self.accounting if a is not None]
        if len(known) != len(self.accounting):
            return None
        total = known[0]
        for a in known[1:]:
            total = total.then(a)
        return total

    def state(self) -> Counter[str]:
        """What state holds now: after this invocation's last batch, else (no batch ran: nothing new)
        after the last batch the output committed before it; nothing held for a stream that never ran
        one; unknown (no ``state:*`` entry) only for a checkpoint begun by an older version."""
        from reassembly.spark.stream.functions import batch_counts

        state = self.last
        if "state:groups" not in state:
            earlier = _batch_ids(self.output / "_commits")
            if earlier:
                state = batch_counts(self.output, earlier[-1]) or state
            elif self.checkpoint is None or not _begun(self.checkpoint):
                state = Counter(dict.fromkeys(_STATE, 0))
        return state

    def condition_counts(self) -> dict[str, int]:
        """What ``--fail-on`` judges: the batches this invocation ran."""
        t = self.totals
        return {
            "incomplete": t["message:incomplete"],
            "corrupt": t["message:corrupt"],
            "quarantine": t["quarantine"],
            "skipped": len(self.skipped),
        }

    def record(self, record: Record, args: argparse.Namespace, out: Path, stopped: str) -> None:
        """The ``--summary-json`` fields: counts summed over the batches this invocation ran (a resumed
        stream's earlier batches are in their own markers), what state holds after the last."""
        from reassembly.cli.summary import IDENTITY_STREAM
        from reassembly.spark.schema import SCHEMA_VERSION

        t = self.totals
        state = self.state()
        total = self.total()
        copies = t["message_duplicates"] + t["duplicate"]
        statuses = {"complete": 0, "incomplete": 0, "corrupt": 0} | {
            k.split(":", 1)[1]: v for k, v in sorted(t.items()) if k.startswith("message:")
        }
        record.fields.update(
            schema_version=SCHEMA_VERSION,
            input={"pattern": args.input, "paths": None, "bytes": None, "skipped_files": skipped_json(self.skipped)},
            output={
                "directory": str(out),
                "messages": str(out / "messages"),
                "quarantine": str(out / "quarantine"),
                "payloads": args.payload_dir,
            },
            counts={
                "rows_in": self.rows_in,
                "messages": statuses,
                "quarantined": t["quarantine"],
                "duplicates": copies,
                "used": t["used"],
            },
            accounting=None if total is None else {"identity": IDENTITY_STREAM, **total.as_json()},
            stream={
                "checkpoint": str(Path(args.checkpoint).resolve()),
                "trigger": args.trigger,
                "batches": list(self.batches),
                "late": t["late"],
                "late_duplicates": t["duplicate"],
                "dropped_by_watermark": self.dropped,
                "accounting_by_batch": [{"batch": b, **a.as_json()} for b, a in self.accounting if a is not None],
                "held": None
                if "state:groups" not in state
                else {k: state[f"state:{k}"] for k in ("groups", "segments", "held_bytes", "spooled_bytes")},
                "tombstones": None if "state:groups" not in state else state["state:tombstones"],
                "stopped": stopped,
            },
        )


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


_STATE = ("state:groups", "state:segments", "state:held_bytes", "state:spooled_bytes", "state:tombstones")


def batch_files(checkpoint: str, batch: int) -> list[str]:
    """The files the file source read in ``batch``, from its log in the checkpoint (``sources/0/N``, or
    the compacted ``N.compact`` that lists every batch's files up to N with their batch ids)."""
    log = Path(checkpoint) / "sources" / "0"
    for name in (str(batch), f"{batch}.compact"):
        try:
            text = (log / name).read_text(encoding="utf-8")
        except FileNotFoundError:
            continue
        entries = [json.loads(line) for line in text.splitlines()[1:] if line.strip()]  # after the version line
        return [str(e["path"]) for e in entries if e.get("batchId", batch) == batch]
    return []


def _batch_ids(directory: Path) -> list[int]:
    try:
        return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())
    except OSError:
        return []


def running_batch(checkpoint: str) -> int | None:
    """The batch Spark is running on ``checkpoint`` (logged in ``offsets/``, not yet in ``commits/``), or None.
    Files only: it is asked from the Ctrl-C handler, which must not call into the JVM."""
    offsets, commits = _batch_ids(Path(checkpoint) / "offsets"), _batch_ids(Path(checkpoint) / "commits")
    if offsets and (not commits or offsets[-1] > commits[-1]):
        return offsets[-1]
    return None


def _begun(checkpoint: str) -> bool:
    """Whether Spark has logged a batch in this checkpoint (a stream that has started before)."""
    return bool(_batch_ids(Path(checkpoint) / "offsets"))


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


def _watch(query: Any, lines: _Lines, halt: Halt, checkpoint: str) -> Any:
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
    lines = _Lines(sys.stdout if args.verbose else _quiet_stdout(), out, args.watermark, args.checkpoint)
    encoded = args.input_format == "encoded"
    # A new stream on an empty directory starts its query once the first file has landed, so that the
    # file is checked as any other input is (nothing else to check the columns against until then).
    waiting = not _begun(args.checkpoint) and not landed(args.input)
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
        last = _batch_ids(out / "_commits")
        said = f"after batch {last[-1]}" if last else "before any batch"
        print(f"reassemble: stopped {said} (the same command resumes from there)", file=sys.stderr)
        return EXIT_INTERRUPTED
    return fail_on(record, args.fail_on, lines.condition_counts())


__all__ = ["add_parser", "age", "check_args", "event_time_now", "landed", "run", "running_batch", "status_line"]
