"""The streaming collector's stateful processor: reads and writes one destination's Spark state, asks the core.

:class:`Batcher` runs under ``transformWithState`` (Row API, event time). What closes a batch is
:class:`~reassembly.spark.collect.core.CollectCore`'s; the class turns state values into an
:class:`~reassembly.spark.collect.core.OpenBatch` and back, sets and deletes the timers the core
names, and reads the rules once per task. This module imports pyspark (the base class);
:func:`~reassembly.spark.collect.functions.collect_stream` imports it only when a stream is set up.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark.sql import Row
from pyspark.sql.streaming.stateful_processor import StatefulProcessor

from reassembly.spark.collect.core import CollectCore, OpenBatch, Step
from reassembly.storage.collector import RuleCache, open_storage

# The state variables (names and schemas are the checkpoint's: do not change them).
HELD = "payload binary, event_ms long"  # list state: the open batch's members
INFO = "first_ms long, held_bytes long, batch_no long, deadline_ms long"  # value state


def _rule_lookup(url: str) -> RuleCache:
    """Rules read once, now (the processor is made once per task: once per micro-batch per partition)."""
    storage = open_storage(url)
    try:
        rules = storage.read_rules()
    finally:
        storage.close()
    cache = RuleCache(lambda: rules, ttl=float("inf"))
    cache.refresh()
    return cache


class Batcher(StatefulProcessor):
    """One destination's open batch in Spark state; the rules database (``rules``: SQLite path or
    PostgreSQL URL, readable from every executor) is read at :meth:`init`, once per task, so a
    changed rule applies from the next micro-batch on. The instance is made on the driver and
    pickled to the workers: the constructor keeps only its arguments and the core.

    ``max_segment_size``: the largest segment a batch is cut into, in bytes.
    """

    def __init__(self, *, rules: str, max_segment_size: int) -> None:
        self.rules_url = rules
        self.core = CollectCore(max_segment_size)

    def init(self, handle: Any) -> None:
        """Open the destination's state variables through Spark's ``handle``, and read the rules."""
        self.handle = handle
        self.held = handle.getListState("held", HELD)
        self.info = handle.getValueState("info", INFO)
        self.rules = _rule_lookup(self.rules_url)

    def _state(self) -> OpenBatch | None:
        if not self.info.exists():
            return None
        _, _, batch_no, deadline = self.info.get()
        members = tuple((bytes(p), int(t)) for p, t in self.held.get())
        return OpenBatch(members, batch_no, deadline)

    def _write(self, step: Step) -> Iterator[Any]:
        """Write back the state the core decided, move the timer as it says; the rows to emit."""
        keep = step.keep
        self.held.clear()
        if step.cancel is not None:
            self.handle.deleteTimer(step.cancel)
        if keep.members:
            self.held.appendList(list(keep.members))
        if step.register is not None:
            self.handle.registerTimer(step.register)
        self.info.update((keep.first_ms, keep.held_bytes, keep.batch_no, keep.deadline))
        return iter([Row(**o._asdict()) for o in step.rows])

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        """Spark's call for one destination's new rows: ``key`` (the destination, as a one-field row), ``rows`` (the
        messages and their event times), ``timerValues`` (unused); yields the closed batches' rows."""
        destination = key[0]
        rule = self.rules(destination)
        new = [(bytes(r.payload), int(r.event_ms)) for r in rows]
        return self._write(self.core.take(destination, rule, self._state() or OpenBatch(), new))

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:
        """Spark's call when a destination's timer fires: ``key`` (the destination), ``timerValues`` (unused),
        ``expiredTimerInfo`` (the time the timer was set for): the open batch closes (timeout or idle)."""
        destination = key[0]
        state = self._state()
        step = self.core.expire(destination, self.rules(destination), state, expiredTimerInfo.getExpiryTimeInMs())
        return iter(()) if step is None else self._write(step)

    def close(self) -> None:
        pass


__all__ = ["Batcher"]
