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

from reassembly.resequencer.batch_model import BatchOptions
from reassembly.resequencer.model import ResequenceOptions
from reassembly.spark.resequence.batch_core import BATCH_EXTRA_FIELDS, BatchCore, BatchDecision, BatchItem
from reassembly.spark.resequence.core import EXTRA_FIELDS, SEQ_COLUMN, Decision, Item, ResequenceCore, group_of

# The state variables (names and schemas are the checkpoint's: do not change them): the resequencer's
# snapshot (value state) and the held rows by sequence number (map state, the input row's own schema).
CORE = "blob binary"
HELD_KEY = "seq bigint"
SERIAL_KEY = "serial bigint"  # the batch mode's held rows, by serial number (equal keys may be held together)


class _HeldRows(StatefulProcessor):
    """The one shape of both modes' processors: the core's snapshot in a value state, the rows it holds
    in a map state (the input row's own schema), the key's one timer. A mode names its state
    variables, its core, its extra output columns, how a row becomes the core's item and under which
    key a held row is stored; everything else, reading and writing the state, is here once."""

    STATE: tuple[str, str, str]  # (snapshot value state, held-rows map state, the map's key schema)

    def __init__(
        self, core: Any, extra_fields: Any, *, columns: list[str], value_schema: Any, group_column: str
    ) -> None:
        self.core = core
        self.columns = columns
        self.value_schema = value_schema
        self.group_column = group_column
        self.names = [*columns, *(n for n, _ in extra_fields)]

    def item(self, row: Any) -> Any:
        raise NotImplementedError

    def holds(self, decided: Any, batch: list[Any]) -> Iterator[tuple[Any, Any]]:
        """(row, its key in the held-rows map) for each row the core decided to hold."""
        raise NotImplementedError

    def init(self, handle: Any) -> None:
        self.handle = handle
        snapshot, held, held_key = self.STATE
        self.snapshot = handle.getValueState(snapshot, CORE)
        self.held = handle.getMapState(held, held_key, self.value_schema)

    def _blob(self) -> bytes | None:
        return bytes(self.snapshot.get()[0]) if self.snapshot.exists() else None

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        batch = list(rows)
        items = [self.item(row) for row in batch]
        decided = self.core.offer(self._blob(), timerValues.getCurrentWatermarkInMs(), group_of(key), items)
        return self._write(decided, batch, key[0])

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:
        at = expiredTimerInfo.getExpiryTimeInMs()
        decided = self.core.fire(self._blob(), timerValues.getCurrentWatermarkInMs(), at)
        return self._write(decided, [], key[0])

    def _write(self, decided: Any, batch: list[Any], key_value: Any) -> Iterator[Any]:
        """The output rows (held ones read from state and removed), the rows to hold stored, the snapshot
        kept or cleared, the key's one timer set."""
        out = []
        for o in decided.rows:
            if o.at is None:  # skipped, group_closed, window_closed: only the group column is set
                values = tuple(key_value if c == self.group_column else None for c in self.columns)
            elif o.at >= 0:
                values = tuple(batch[o.at][c] for c in self.columns)
            else:
                values = tuple(self.held.getValue((o.seq,)))
                self.held.removeKey((o.seq,))
            out.append(Row(**dict(zip(self.names, (*values, *o.extra), strict=True))))
        for row, held_key in self.holds(decided, batch):
            self.held.updateValue((held_key,), tuple(row[c] for c in self.columns))
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


class ResequenceProcessor(_HeldRows):
    """One group key's resequencer in Spark state: its snapshot (value state ``core``) and the held rows
    by sequence number (map state ``held``). Made on the driver from the user's options (refused there
    if Spark cannot honour them), the input's columns, its schema (the held rows' state schema) and
    the group column; pickled to the workers with them.

    ``options``: the user's resequencing options. ``columns``: the input's column names, in order. ``value_schema``: the
    input's Spark schema, the schema of the held rows' state. ``group_column``: the column whose value is the group key.
    """

    STATE = ("core", "held", HELD_KEY)

    def __init__(self, *, options: ResequenceOptions, columns: list[str], value_schema: Any, group_column: str) -> None:
        super().__init__(
            ResequenceCore(options), EXTRA_FIELDS, columns=columns, value_schema=value_schema, group_column=group_column
        )

    def item(self, row: Any) -> Any:
        return Item.of(row)

    def holds(self, decided: Decision, batch: list[Any]) -> Iterator[tuple[Any, Any]]:
        """The rows ``decided`` holds, taken from ``batch`` (the key's rows of this call), each with its sequence
        number."""
        return ((batch[i], batch[i][SEQ_COLUMN]) for i in decided.hold)


class BatchResequenceProcessor(_HeldRows):
    """One group key's batch resequencer in Spark state: its snapshot (value state ``batch``) and the
    held rows by serial number (map state ``batch_held``: equal keys may be held together), the timer
    of the key's open window. Made on the driver as :class:`ResequenceProcessor` is.

    ``options``: the user's batch resequencing options. ``columns``, ``value_schema``, ``group_column``: as for
    :class:`ResequenceProcessor`.
    """

    STATE = ("batch", "batch_held", SERIAL_KEY)

    def __init__(self, *, options: BatchOptions, columns: list[str], value_schema: Any, group_column: str) -> None:
        core, extra = BatchCore(options), BATCH_EXTRA_FIELDS
        super().__init__(core, extra, columns=columns, value_schema=value_schema, group_column=group_column)

    def item(self, row: Any) -> Any:
        return BatchItem.of(row)

    def holds(self, decided: BatchDecision, batch: list[Any]) -> Iterator[tuple[Any, Any]]:
        """The rows ``decided`` holds, taken from ``batch`` (the key's rows of this call), each with its serial
        number."""
        return ((batch[i], serial) for i, serial in decided.hold)


__all__ = ["BatchResequenceProcessor", "ResequenceProcessor"]
