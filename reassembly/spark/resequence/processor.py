"""The Spark resequencer's stateful processor: reads and writes one group key's Spark state, asks the core.

:class:`ResequenceProcessor` runs under ``transformWithState`` (Row API, event time). What leaves,
what is held and which timer is set is :class:`~reassembly.spark.resequence.core.ResequenceCore`'s;
the class reads the resequencer's snapshot and the held rows from state, builds the output rows and
writes back what the core decided. This module imports pyspark (the base class);
:func:`~reassembly.spark.resequence.functions.resequence_stream` imports it only when a stream is set up.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark.sql import Row
from pyspark.sql.streaming.stateful_processor import StatefulProcessor

from reassembly.resequencer.model import ResequenceOptions
from reassembly.spark.resequence.core import EXTRA_FIELDS, SEQ_COLUMN, Decision, Item, ResequenceCore, group_of

# The state variables (names and schemas are the checkpoint's: do not change them): the resequencer's
# snapshot (value state) and the held rows by sequence number (map state, the input row's own schema).
CORE = "blob binary"
HELD_KEY = "seq bigint"


class ResequenceProcessor(StatefulProcessor):
    """One group key's resequencer in Spark state. Made on the driver from the user's options (refused
    there if Spark cannot honour them), the input's columns, its schema (the held rows' state schema) and
    the group column; pickled to the workers with them."""

    def __init__(self, *, options: ResequenceOptions, columns: list[str], value_schema: Any, group_column: str) -> None:
        self.core = ResequenceCore(options)
        self.columns = columns
        self.value_schema = value_schema
        self.group_column = group_column
        self.names = [*columns, *(n for n, _ in EXTRA_FIELDS)]

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.snapshot = handle.getValueState("core", CORE)
        self.held = handle.getMapState("held", HELD_KEY, self.value_schema)

    def _blob(self) -> bytes | None:
        return bytes(self.snapshot.get()[0]) if self.snapshot.exists() else None

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        batch = list(rows)
        items = [Item.of(row) for row in batch]
        blob = self._blob()
        decided = self.core.offer(blob, timerValues.getCurrentWatermarkInMs(), group_of(key), items)
        return self._write(decided, batch, key[0])

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:
        blob = self._blob()
        decided = self.core.fire(blob, timerValues.getCurrentWatermarkInMs(), expiredTimerInfo.getExpiryTimeInMs())
        return self._write(decided, [], key[0])

    def _write(self, decided: Decision, batch: list[Any], key_value: Any) -> Iterator[Any]:
        """The output rows (held ones read from state and removed), the rows to hold stored, the snapshot
        kept or cleared, the key's one timer set."""
        out = []
        for o in decided.rows:
            if o.at is None:  # skipped, group_closed: only the group column of the input is set
                values = tuple(key_value if c == self.group_column else None for c in self.columns)
            elif o.at >= 0:
                values = tuple(batch[o.at][c] for c in self.columns)
            else:
                values = tuple(self.held.getValue((o.seq,)))
                self.held.removeKey((o.seq,))
            out.append(Row(**dict(zip(self.names, (*values, *o.extra), strict=True))))
        for i in decided.hold:
            row = batch[i]
            self.held.updateValue((row[SEQ_COLUMN],), tuple(row[c] for c in self.columns))
        if decided.snapshot is None:
            self.snapshot.clear()
        else:
            self.snapshot.update((decided.snapshot,))
        for t in list(self.handle.listTimers()):
            self.handle.deleteTimer(t)
        if decided.deadline is not None:
            self.handle.registerTimer(decided.deadline)
        return iter(out)

    def close(self) -> None:
        pass


__all__ = ["ResequenceProcessor"]
