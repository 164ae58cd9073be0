"""Forcing one destination's batch out now: the core's ``force``, a collector's own, and a request row
that the collector holding the destination's lease picks up at its next tick."""

from __future__ import annotations

import itertools
from pathlib import Path

from reassembly.collector import DEFAULT_RULE, BatchReady, Cause, Collector, Rule
from reassembly.storage.collector import SQLiteStorage
from reassembly.storage.durable import DurableCollector
from tests.support.collect_helpers import Clock


def test_core_force_closes_one_destination_within_its_limits() -> None:
    clock = Clock()
    rules = {"a": Rule("a", "ta", max_messages=5), "b": Rule("b", "tb")}
    counter = itertools.count(1)
    c = Collector(lambda d: rules.get(d, DEFAULT_RULE), clock, new_batch_id=lambda: f"b{next(counter)}")
    assert c.force("a") == []
    for i in range(4):
        c.add("a", i, b"x")
    c.add("b", 9, b"y")
    rules["a"] = Rule("a", "ta", max_messages=3)  # lowered under the open batch: the forced ones keep it
    out = c.force("a")
    assert [(b.cause, [m.id for m in b.messages]) for b in out] == [(Cause.FORCED, [0, 1, 2]), (Cause.FORCED, [3])]
    assert c.held_ids("a") == set() and c.held_ids("b") == {9}


def test_a_flush_request_is_picked_up_by_the_lease_holder(tmp_path: Path) -> None:
    clock, db, out = Clock(), str(tmp_path / "c.db"), tmp_path / "out"
    storage = SQLiteStorage(db)
    storage.put_rule(Rule("acme", "ftp-acme", max_messages=100, max_wait=3600))
    batches: list[tuple[str, Cause, list[bytes]]] = []

    def seen(batch: BatchReady, path: Path) -> None:
        batches.append((batch.destination, batch.cause, [m.payload for m in batch.messages]))

    a = DurableCollector(storage, out, owner="A", lease=9, clock=clock, on_batch=seen)
    a.sync()
    a.ingest("in-1", [("acme", b"1"), ("acme", b"2"), ("other", b"o")])
    other = SQLiteStorage(db)  # another collector's input, stored but not loaded by A yet
    assert other.store("in-2", [("acme", b"3")], clock.now) is not None
    assert other.request_flush("nobody") == 0 and other.flush_requests() == {}  # nothing held: no request
    assert other.request_flush("acme") == 3
    a.ingest("in-3", [("acme", b"4")])  # after the request: the open batch goes whole
    a.tick()
    assert batches == [("acme", Cause.FORCED, [b"1", b"2", b"3", b"4"])]
    assert storage.flush_requests() == {}  # done: none of its messages is left unbatched
    a.ingest("in-4", [("acme", b"5")])
    a.tick()
    assert len(batches) == 1 and a.core.held_ids("acme")  # not forced again
    assert a.force("other") == 1 and batches[-1] == ("other", Cause.FORCED, [b"o"])  # in-process
    assert a.force("not-leased") == 0


def test_a_request_for_a_destination_another_collector_holds_waits_for_it(tmp_path: Path) -> None:
    clock, db = Clock(), str(tmp_path / "c.db")
    a = DurableCollector(SQLiteStorage(db), tmp_path / "out", owner="A", lease=9, clock=clock)
    b = DurableCollector(SQLiteStorage(db), tmp_path / "out", owner="B", lease=9, clock=clock)
    a.sync()
    a.ingest("in-1", [("acme", b"1")])
    b.sync()
    assert b.storage.request_flush("acme") == 1
    b.tick()  # not B's destination: left to A
    assert b.storage.flush_requests() == {"acme": 1} and b.emitted == 0
    a.tick()
    assert a.emitted == 1 and a.storage.flush_requests() == {}
