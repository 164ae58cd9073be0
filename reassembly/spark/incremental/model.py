"""What an incremental run is given and gives back: its options, the landing files it read, the carry's
facts and accounting, its report; and the names of the checkpoint's and the output's files."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from reassembly._errors import UsageError
from reassembly.spark.batch.output import PAYLOADS

log = logging.getLogger(__name__)


LAYOUT = 1  # of the checkpoint and of the output's incremental files (raise it when either changes meaning)
MANIFEST = "_incremental.json"  # in DIR and in OUTPUT
RECORDS = "runs"  # DIR/runs/N.json
CARRY = "carry"  # DIR/carry/run=N
LOCK = ".lock"
FIRST_SEEN = "_reassembly_first_seen_ms"  # carried rows: when a run first read the row (ms since the epoch)
FOLDERS = ("messages", "quarantine", PAYLOADS)  # a run's output folders, in publication order
DEFAULT_EXPIRE_AFTER = 7 * 86400.0
DEFAULT_CARRY_MAX_BYTES = 1 << 30
# Fault injection for the tests of the commit protocol: the process kills itself (SIGKILL) on
# reaching the named point (KILL_POINTS). Never set in production.
KILL_AT = "REASSEMBLY_INCREMENTAL_KILL_AT"
KILL_POINTS = ("staged", "recorded", "published-messages", "published")


@dataclass(frozen=True)
class IncrementalOptions:
    """What ``--incremental`` adds to a run: where its checkpoint is, and the carry's bounds."""

    checkpoint: str
    """The directory recording the files each run read and the rows carried over (keep it; outside
    the input and the output)."""
    expire_after: float = DEFAULT_EXPIRE_AFTER
    """Seconds since a run first read a carried group's first row after which the group is written as
    incomplete instead of carried again."""
    carry_max_bytes: int = DEFAULT_CARRY_MAX_BYTES
    """Segment bytes carried over at most; past it the oldest incomplete groups are written as
    incomplete."""

    @classmethod
    def from_flags(
        cls,
        incremental: bool,
        checkpoint: str | None,
        overwrite: bool,
        expire_after: float | None,
        carry_max_bytes: int | None,
    ) -> IncrementalOptions | None:
        """The options the command line's flags ask for, None for a plain run, or a UsageError.

        ``--overwrite`` is refused: an incremental output is appended to, run by run; replacing
        it would leave a checkpoint recording runs the output no longer holds. Starting over is
        removing OUTPUT and the checkpoint.

        ``incremental``: ``--incremental`` was given. ``checkpoint``: ``--checkpoint`` (None: not given). ``overwrite``:
        ``--overwrite`` was given. ``expire_after``: ``--expire-after`` in seconds (None: the default).
        ``carry_max_bytes``: ``--carry-max-bytes``, in bytes (None: the default).
        """
        if not incremental:
            named = [f for f, v in (("--checkpoint", checkpoint), ("--expire-after", expire_after),
                                    ("--carry-max-bytes", carry_max_bytes)) if v is not None]  # fmt: skip
            if named:
                raise UsageError(f"{named[0]} needs --incremental")
            return None
        if checkpoint is None:
            raise UsageError("--incremental needs --checkpoint DIR (what earlier runs processed and carried)")
        if overwrite:
            raise UsageError(
                "--overwrite with --incremental: an incremental output is appended to, run by run;"
                " to start over remove OUTPUT and the checkpoint"
            )
        return cls(
            checkpoint,
            DEFAULT_EXPIRE_AFTER if expire_after is None else expire_after,
            DEFAULT_CARRY_MAX_BYTES if carry_max_bytes is None else carry_max_bytes,
        )


@dataclass(frozen=True)
class LandingFile:
    """A landing file as the checkpoint knows it: real path, size, modification time (ns)."""

    path: str
    """The file's real path (symbolic links resolved)."""
    size: int
    """The file's size in bytes."""
    mtime_ns: int
    """The file's modification time, in nanoseconds since the epoch."""

    def as_json(self) -> list[Any]:
        return [self.path, self.size, self.mtime_ns]


class CarryAccounting(NamedTuple):
    """Every row a run read is accounted for: used, quarantined, a duplicate copy, or carried over."""

    new: int
    """Rows read from the landing files new to this run."""
    carried_in: int
    """Rows carried in from the run before (segments of groups it left incomplete)."""
    used: int
    """Rows used by the messages this run wrote, of every status."""
    quarantined: int
    """Rows written to the quarantine, of every reason."""
    duplicates: int
    """Rows that were identical copies of another row, counted and not written again."""
    carried_out: int
    """Rows carried over to the next run: segments of groups still incomplete and not yet due."""

    @property
    def rows_in(self) -> int:
        return self.new + self.carried_in

    @property
    def holds(self) -> bool:
        return self.rows_in == self.used + self.quarantined + self.duplicates + self.carried_out

    def line(self) -> str:
        return (
            f"segments: {self.rows_in} in ({self.new} new + {self.carried_in} carried in) = {self.used} used + "
            f"{self.quarantined} quarantined + {self.duplicates} duplicates + {self.carried_out} carried out: "
            f"{'holds' if self.holds else 'BROKEN'}"
        )


@dataclass(frozen=True)
class CarryFacts:
    """What a run carried over (in its record): rows, segment bytes, groups, the oldest first-seen time."""

    rows: int = 0
    """Segment rows carried over."""
    bytes: int = 0
    """Segment bytes carried over, counted against ``carry_max_bytes``."""
    groups: int = 0
    """Incomplete groups carried over."""
    oldest_ms: int | None = None
    """When the oldest carried row was first read (epoch milliseconds); None when nothing is carried."""

    def due(self, now_ms: int, options: IncrementalOptions) -> bool:
        """Would a run now write some carried group instead of carrying it (age or size)?

        ``now_ms``: the time now, in epoch milliseconds. ``options``: the run's ``expire_after`` and
        ``carry_max_bytes``.
        """
        if not self.rows:
            return False
        old = self.oldest_ms is not None and now_ms - self.oldest_ms >= options.expire_after * 1000
        return old or self.bytes > options.carry_max_bytes


@dataclass(frozen=True)
class IncrementalReport:
    """One call's outcome: the run committed (None: nothing to do), the lines to show, its accounting
    and the messages it wrote by status (expired groups' included)."""

    run: int | None
    """The number of the run committed; None when there was nothing to do (an idle call)."""
    lines: tuple[str, ...]
    """The lines to show, as the command prints them."""
    accounting: CarryAccounting | None
    """Every row the run read, accounted for; None for an idle call."""
    output: Path
    """The output directory the run wrote to."""
    checkpoint: Path
    """The checkpoint directory, which records the files processed and what each run carried."""
    statuses: Mapping[str, int] = field(default_factory=dict)
    """Messages the run wrote by status (``complete``, ``incomplete``, ...), expired groups' included."""
    summary: Mapping[str, Any] = field(default_factory=dict)
    """The run's counts as its record in the checkpoint and ``OUTPUT/_runs/N`` hold them; idle: only
    ``carried``, what the last run carried over and still is (its rows, groups, bytes, ``oldest_ms``)."""
