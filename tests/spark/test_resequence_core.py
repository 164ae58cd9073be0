"""The Spark resequencer's core without Spark: what each call emits, holds, keeps and sets as its timer.

:class:`ResequenceCore` is what the Spark processor asks on every call; here a dictionary plays the
state store (per key: the snapshot, the held rows by number, the one timer) and timers fire the way
Spark fires event-time timers: after a micro-batch's rows, those at or before its watermark, and
once more in the batch without data that follows a run. Fed the Spark test's data set in micro-batches,
it must give exactly the rows of the operator's in-process specification (``reference`` there).
"""

from __future__ import annotations

import pickle
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest

from reassembly.resequencer.model import EndAt, EndWhen, ResequenceLimits, ResequenceOptions, StartAt
from reassembly.spark.resequence.core import HELD, Decision, Item, ResequenceCore
from tests.spark.test_resequence import OPTIONS, Row, dataset, flush, freeze, reference

T0 = 1_700_000_000_000


@dataclass
class KeyState:
    """What Spark's state store holds for one key."""

    snapshot: bytes | None = None
    held: dict[int | None, Row] = field(default_factory=dict)
    timer: int | None = None


class Store:
    """The processor's part, with a dictionary for Spark's state: apply each decision as it does."""

    def __init__(self, options: ResequenceOptions) -> None:
        self.core = ResequenceCore(options)
        self.keys: dict[str, KeyState] = {}
        self.out: Counter[tuple[Any, ...]] = Counter()

    def _apply(self, key: str, d: Decision, rows: list[Row]) -> None:
        state = self.keys[key]
        for o in d.rows:
            if o.at is None:
                head: tuple[Any, ...] = (key, None, None)
            elif o.at == HELD:
                head = state.held.pop(o.seq)[:3]
            else:
                head = rows[o.at][:3]
            self.out[(*head, *(freeze(v) for v in o.extra))] += 1
        for i in d.hold:
            state.held[rows[i][1]] = rows[i]
        state.snapshot, state.timer = d.snapshot, d.deadline

    def batch(self, rows: list[Row], watermark: int) -> None:
        for key in dict.fromkeys(r[0] for r in rows):
            mine = [r for r in rows if r[0] == key]
            items = [Item(r[4], r[1], 2 if r[3] else 0, 0) for r in mine]
            state = self.keys.setdefault(key, KeyState())
            self._apply(key, self.core.offer(state.snapshot, watermark, key, items), mine)
        for key, state in self.keys.items():  # after the rows: the timers the watermark has passed
            if state.timer is not None and state.timer <= watermark:
                self._apply(key, self.core.fire(state.snapshot, watermark, state.timer), [])


def run(batches: list[list[Row]], options: ResequenceOptions) -> Store:
    store, watermark = Store(options), 0
    for rows in batches:
        store.batch(rows, watermark)
        watermark = max([watermark, *(r[4] for r in rows)])
    store.batch([], watermark)  # the batch without data that the advanced watermark brings
    return store


@pytest.mark.parametrize("seed", [3, 9, 17])
def test_the_core_fed_in_micro_batches_equals_the_specification(seed: int) -> None:
    batches = dataset(seed=seed) + flush(3)
    store = run(batches, OPTIONS)
    assert store.out == reference(batches, OPTIONS)
    messages = sum(n for k, n in store.out.items() if k[4] not in ("skipped", "group_closed"))
    assert messages == sum(len(b) for b in batches)  # every row exactly once
    assert all(not s.held for s in store.keys.values())  # and none left behind in state


def test_the_order_spark_hands_rows_over_in_does_not_matter() -> None:
    batches = dataset(seed=5) + flush(3)
    shuffled = [random.Random(i).sample(rows, len(rows)) for i, rows in enumerate(batches)]
    assert run(shuffled, OPTIONS).out == run(batches, OPTIONS).out


def test_a_gap_holds_the_rows_after_it_until_its_timer_fires() -> None:
    core = ResequenceCore(ResequenceOptions(start=StartAt(0), missing_timeout=30.0, keep_closed=100.0))
    items = [Item(T0 + 2, 2, 0, 0), Item(T0, 0, 0, 0), Item(T0 + 3, 3, 0, 0)]  # 1 never comes
    first = core.offer(None, 0, "g", items)
    assert [(o.at, o.extra[1]) for o in first.rows] == [(1, "out")]  # row 1 (number 0) leaves
    assert first.hold == [0, 2] and first.snapshot is not None  # numbers 2 and 3, in the order offered
    assert first.deadline is not None and first.deadline >= T0 + 30_000
    fired = core.fire(first.snapshot, first.deadline, first.deadline)
    terminals = [(o.at, o.seq, o.extra[1]) for o in fired.rows]
    assert (None, None, "skipped") in terminals  # over the gap
    assert [(at, seq) for at, seq, t in terminals if t == "expire"] == [(HELD, 2), (HELD, 3)]
    assert fired.hold == [] and fired.snapshot is not None  # the group stays until keep_closed
    assert fired.deadline is not None and fired.deadline > first.deadline


def test_options_spark_cannot_honour_are_refused_when_the_core_is_made() -> None:
    with pytest.raises(ValueError, match="in all"):
        ResequenceCore(ResequenceOptions(limits=ResequenceLimits(max_messages=1000)))


def test_the_core_pickles_with_its_predicates() -> None:
    """The processor carries its core to the workers: the SQL predicates became picklable readers of the
    flags computed in the JVM."""
    core = ResequenceCore(ResequenceOptions(start=StartAt(0), end=EndWhen("is_last")))
    copy = pickle.loads(pickle.dumps(core))
    items = [Item(T0, 1, 0, 0), Item(T0 + 1, 0, 0, 0), Item(T0 + 2, 2, 2, 0)]  # 2 is flagged last
    assert copy.offer(None, 0, "g", items) == core.offer(None, 0, "g", items)
    assert {o.extra[1] for o in core.offer(None, 0, "g", items).rows} >= {"out", "group_closed"}


def test_a_key_keeps_its_forgotten_instance_number_in_state() -> None:
    """Once the closed instance is forgotten the key's snapshot stays (the floor alone), so the next
    instance of the key is numbered 2, not 1 again."""
    core = ResequenceCore(ResequenceOptions(start=StartAt(0), end=EndAt(0), keep_closed=1.0))
    first = core.offer(None, 0, "g", [Item(T0, 0, 0, 0)])
    assert [(o.extra[0], o.extra[1]) for o in first.rows] == [(1, "out"), (1, "group_closed")]
    assert first.deadline == T0 + 1000
    forgotten = core.fire(first.snapshot, first.deadline, first.deadline)
    assert forgotten.rows == [] and forgotten.deadline is None and forgotten.snapshot is not None
    again = core.offer(forgotten.snapshot, T0 + 2000, "g", [Item(T0 + 3000, 0, 0, 0)])
    assert [o.extra[0] for o in again.rows] == [2, 2]


def test_all_or_nothing_holds_the_rows_in_state_until_the_sequence_is_whole() -> None:
    core = ResequenceCore(ResequenceOptions(start=StartAt(0), end=EndAt(2), release_partial=False))
    first = core.offer(None, 0, "g", [Item(T0 + 1, 1, 0, 0), Item(T0, 0, 0, 0)])
    assert first.rows == [] and first.hold == [1, 0]  # number 0 is held too: the sequence is not whole
    last = core.offer(first.snapshot, 0, "g", [Item(T0 + 2, 2, 0, 0)])
    assert [(o.at, o.seq, o.extra[1]) for o in last.rows] == [
        (HELD, 0, "out"), (HELD, 1, "out"), (0, 2, "out"), (None, None, "group_closed")
    ]  # fmt: skip
    assert last.hold == []
