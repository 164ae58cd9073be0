"""What ``reassemble stream`` says of its batches: one status line per micro-batch
(:func:`status_line`: its time, duration, own rows in, what state holds and the oldest held age),
the accounting identity over the batches (:class:`Accounting`), and the lines' keeper that reads
each batch's commit marker (:class:`StatusLines`) and writes the run's ``--summary-json`` record.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from reassembly._errors import counted
from reassembly.spark.batch.job import SkippedFile, skip_settings, skipped_among, skipped_json, skipped_line

if TYPE_CHECKING:
    from reassembly.cli.summary import Record

_STATE = ("state:groups", "state:segments", "state:held_bytes", "state:spooled_bytes", "state:tombstones")


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


class StatusLines:
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
            earlier = batch_ids(self.output / "_commits")
            if earlier:
                state = batch_counts(self.output, earlier[-1]) or state
            elif self.checkpoint is None or not begun(self.checkpoint):
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


# What the checkpoint says of its batches: files only (the Ctrl-C handler asks, and must not call the JVM).


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


def batch_ids(directory: Path) -> list[int]:
    try:
        return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())
    except OSError:
        return []


def running_batch(checkpoint: str) -> int | None:
    """The batch Spark is running on ``checkpoint`` (logged in ``offsets/``, not yet in ``commits/``), or None.
    Files only: it is asked from the Ctrl-C handler, which must not call into the JVM."""
    offsets, commits = batch_ids(Path(checkpoint) / "offsets"), batch_ids(Path(checkpoint) / "commits")
    if offsets and (not commits or offsets[-1] > commits[-1]):
        return offsets[-1]
    return None


def begun(checkpoint: str) -> bool:
    """Whether Spark has logged a batch in this checkpoint (a stream that has started before)."""
    return bool(batch_ids(Path(checkpoint) / "offsets"))
