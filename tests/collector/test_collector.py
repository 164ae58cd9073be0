"""The collector core (sans-I/O): batching rules, causes, the logical-group round trip, the rule cache."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reassembly import Assembler, GroupComplete
from reassembly.collector import (
    DEFAULT_RULE,
    BatchReady,
    Cause,
    Collector,
    Held,
    Rule,
    batch_segments,
    group_id_for,
)
from reassembly.storage.collector import RuleCache
from segmenter.errors import Reason, SegmentationError
from segmenter.flags import MsgFlags
from segmenter.producer import Segmenter
from tests.support.collect_helpers import Clock


def _ids() -> itertools.count[int]:
    return itertools.count(1)


def make(rules: dict[str, Rule], clock: Clock) -> Collector:
    counter = itertools.count(1)
    return Collector(lambda d: rules.get(d, DEFAULT_RULE), clock, new_batch_id=lambda: f"b{next(counter)}")


def test_full_by_count_and_by_bytes() -> None:
    clock = Clock(1000.0)
    c = make({"a": Rule("a", "ta", max_messages=3), "b": Rule("b", "tb", max_bytes=10)}, clock)
    out = [b for i in range(7) for b in c.add("a", i, b"x")]
    assert [len(b.messages) for b in out] == [3, 3] and {b.cause for b in out} == {Cause.FULL}
    assert c.add("b", 10, b"123456") == []
    (full,) = c.add("b", 11, b"123456")  # would pass 10 bytes: the open batch closes first, without it
    assert [m.id for m in full.messages] == [10] and full.cause is Cause.FULL
    before, big = c.add("b", 12, b"x" * 50)  # alone above max_bytes: a batch of one, at once
    assert [m.id for m in before.messages] == [11] and [m.id for m in big.messages] == [12]
    assert c.held_ids("b") == set()


def test_timeout_and_shutdown() -> None:
    clock = Clock(1000.0)
    c = make({"a": Rule("a", "ta", max_wait=5.0)}, clock)
    c.add("a", 1, b"x")
    clock.now += 3
    c.add("a", 2, b"y")
    assert c.next_deadline() == 1005.0
    clock.now += 1.9
    assert c.tick() == []
    clock.now += 0.1
    (batch,) = c.tick()
    assert batch.cause is Cause.TIMEOUT and [m.id for m in batch.messages] == [1, 2]
    c.add("a", 3, b"z")
    c.add("other", 4, b"w")
    assert {(b.destination, b.cause) for b in c.close()} == {("a", Cause.SHUTDOWN), ("other", Cause.SHUTDOWN)}
    assert len(c) == 0 and c.next_deadline() is None


def test_idle_timeout_restarts_with_every_message_and_max_wait_still_bounds() -> None:
    """Camel's completionTimeout: the batch closes once no message was added for idle_timeout."""
    clock = Clock(1000.0)
    c = make({"a": Rule("a", "ta", max_wait=10.0, idle_timeout=2.0), "b": Rule("b", "tb", max_wait=10.0)}, clock)
    c.add("a", 1, b"x")
    c.add("b", 2, b"y")
    assert c.next_deadline() == 1002.0
    clock.now += 1.5
    c.add("a", 3, b"z")  # restarts the quiet period
    assert c.tick() == [] and c.next_deadline() == 1003.5
    clock.now += 1.5
    assert c.tick() == []
    clock.now += 0.5
    (idle,) = c.tick()
    assert idle.cause is Cause.IDLE and [m.id for m in idle.messages] == [1, 3] and c.held_ids("b") == {2}
    closed = []
    for i in range(7):  # a steady trickle never leaves the batch quiet: max_wait closes it
        c.add("a", 20 + i, b"t")
        clock.now += 1.9
        closed += [(b.destination, b.cause, len(b.messages)) for b in c.tick()]
    assert closed == [("b", Cause.TIMEOUT, 1), ("a", Cause.TIMEOUT, 6)]  # a: first at 1004.0, closed at 1015.4
    assert Rule("a", "t").idle_timeout is None


def test_restored_messages_are_recycled_once_stranded() -> None:
    clock = Clock(1000.0)
    c = make({"a": Rule("a", "ta", max_wait=600.0, stranded_after=60.0)}, clock)
    old = [Held(1, b"x", clock.now - 100), Held(2, b"y", clock.now - 10)]
    (batch,) = c.restore("a", old)  # the oldest was held 100 s > 60 s
    assert batch.cause is Cause.RECYCLED and [m.id for m in batch.messages] == [1, 2]
    assert c.restore("a", [Held(3, b"z", clock.now - 10)]) == []
    clock.now += 50
    assert c.tick()[0].cause is Cause.RECYCLED


def test_lowered_rule_applies_to_an_open_batch() -> None:
    clock = Clock(1000.0)
    rules = {"a": Rule("a", "ta", max_messages=100)}
    c = make(rules, clock)
    for i in range(7):
        c.add("a", i, b"x")
    rules["a"] = Rule("a", "ta", max_messages=3)
    out = c.tick()
    assert [len(b.messages) for b in out] == [3, 3] and c.held_ids("a") == {6}


@pytest.mark.parametrize("cause", [Cause.TIMEOUT, Cause.RECYCLED, Cause.SHUTDOWN])
def test_a_batch_closed_under_a_lowered_rule_is_cut_to_its_limits(cause: Cause) -> None:
    """The rule is lowered while a batch is open and the batch is closed for another cause before a
    tick splits it (the timeout checks come first; a shutdown does not tick): whatever the cause,
    the batch leaves cut to the new limits, never as one batch of 7 over the new max_messages."""
    clock = Clock(1000.0)
    rules = {"a": Rule("a", "ta", max_messages=100, max_wait=50.0, stranded_after=80.0)}
    c = make(rules, clock)
    held = [Held(i, b"x" * (i + 1), clock.now) for i in range(7)]
    if cause is Cause.RECYCLED:
        c.restore("a", held)
    else:
        for m in held:
            c.add("a", m.id, m.payload)
    rules["a"] = Rule("a", "ta", max_messages=3, max_bytes=9, max_wait=50.0, stranded_after=80.0)
    clock.now += 90
    out = c.close() if cause is Cause.SHUTDOWN else c.tick()
    assert [[m.id for m in b.messages] for b in out] == [[0, 1, 2], [3, 4], [5], [6]]
    assert {b.cause for b in out} == {cause} and len({b.batch_id for b in out}) == 4
    assert len(c) == 0


def test_rule_validation() -> None:
    for bad in (
        {"max_messages": 0},
        {"max_bytes": float("inf")},  # if accepted, the stored row could not be read back
        {"max_bytes": 10**30},  # beyond a BIGINT
        {"max_bytes": 1.5},
        {"max_messages": True},
        {"max_wait": float("nan")},
        {"stranded_after": float("inf")},
        {"enabled": "false"},
        {"idle_timeout": 0},
        {"idle_timeout": float("inf")},
        {"max_attempts": 0},
        {"max_attempts": 2.0},
    ):
        with pytest.raises(SegmentationError) as err:
            Rule("a", "t", **bad)  # type: ignore[arg-type]
        assert err.value.reason is Reason.RULE_ERROR, bad


def test_a_bad_rules_row_is_reported_and_skipped_never_fatal(tmp_path: Any) -> None:
    """Typos in the rules table (text in a number column, 'false' as text, infinity) leave that row
    out, listed in ``invalid_rules``; the other rows apply (a running collector must not stop)."""
    import sqlite3

    from reassembly.storage.collector import SQLiteStorage

    storage = SQLiteStorage(str(tmp_path / "r.db"))
    storage.put_rule(Rule("good", "tg", max_messages=3))
    for name in ("count", "wait", "enabled", "inf"):
        storage.put_rule(Rule(name, "t-" + name))
    db = sqlite3.connect(str(tmp_path / "r.db"))
    db.execute("UPDATE destination_rules SET max_messages = 'ten' WHERE destination = 'count'")
    db.execute("UPDATE destination_rules SET max_wait = 'soon' WHERE destination = 'wait'")
    db.execute("UPDATE destination_rules SET enabled = 'false' WHERE destination = 'enabled'")
    db.execute("UPDATE destination_rules SET max_bytes = 1e999 WHERE destination = 'inf'")
    db.commit()
    db.close()
    rules = storage.read_rules()
    assert set(rules) == {"good"} and rules["good"].max_messages == 3
    assert len(storage.invalid_rules) == 4
    assert all(e.reason is Reason.RULE_ERROR for e in storage.invalid_rules)


def test_target_names_stay_short_distinct_and_inside_the_output(tmp_path: Any) -> None:
    """A target over 200 bytes once encoded (255 is the usual file-name limit: one such rule blocked
    every batch) gets a shortened name ending in a hash; names stay distinct and one path component."""
    from reassembly.storage.durable import batch_path, safe_name

    names = ["x" * 256, "x" * 257, "é" * 43, "漢" * 29, "x" * 150 + "%%" + "0" * 40, "..", "", "a/b"]
    safe = [safe_name(n) for n in names]
    assert len(set(safe)) == len(names) and all(0 < len(n.encode()) <= 200 and "/" not in n for n in safe)
    assert all(n not in (".", "..") for n in safe)
    for n in names:
        path = batch_path(tmp_path, n, "b1")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
        assert path.parent.parent == tmp_path


def test_round_trip_as_a_logical_group_through_the_assembler() -> None:
    clock = Clock(1000.0)
    c = make({"a": Rule("a", "ta", max_messages=4)}, clock)
    payloads = [b"small", bytes(range(256)) * 3, b"", b"last one"]  # the second is segmented at 200 bytes
    (batch,) = [b for i, p in enumerate(payloads) for b in c.add("a", i, p)]
    segments = list(batch_segments(batch, Segmenter(max_segment_size=200)))
    assert len(segments) > len(payloads)
    assert {s.header.group_id for s in segments} == {group_id_for(batch.batch_id)}
    last = [s for s in segments if s.header.msg_seq_number == 4]
    assert all(MsgFlags.LAST_MSG_IN_GROUP & s.header.msg_flags for s in last)
    asm = Assembler(unit_of_work=True)
    events = [e for s in reversed(segments) for e in asm.receive(s.encode())]  # any order
    (group,) = [e for e in events if isinstance(e, GroupComplete)]
    assert [bytes(m.payload) for m in group.messages] == payloads  # type: ignore[arg-type]
    assert [m.msg_seq_number for m in group.messages] == [1, 2, 3, 4]
    # Missing one member: Unit-of-Work delivers nothing.
    asm = Assembler(unit_of_work=True)
    partial = [e for s in segments if s.header.msg_seq_number != 2 for e in asm.receive(s.encode())]
    assert not any(isinstance(e, GroupComplete) for e in partial)


def test_rule_cache_default_disabled_and_ttl() -> None:
    clock = Clock(1000.0)
    table = {"a": Rule("a", "ta", max_messages=5), "off": Rule("off", "t-off", enabled=False)}
    reads = Counter[str]()

    def read() -> dict[str, Rule]:
        reads["n"] += 1
        return dict(table)

    cache = RuleCache(read, ttl=10.0, clock=clock)
    assert cache("a").max_messages == 5 and cache("unknown") is DEFAULT_RULE and cache("off") is DEFAULT_RULE
    table["*"] = Rule("*", "fallback", max_messages=7)
    table["a"] = Rule("a", "ta", max_messages=9)
    assert cache("a").max_messages == 5 and reads["n"] == 1  # cached
    clock.now += 10
    assert cache("a").max_messages == 9 and cache("unknown").target == "fallback" and reads["n"] == 2


# --- property: any message sequence and clock ---------------------------------------------------

_RULES = {
    "a": Rule("a", "ta", max_messages=3, max_bytes=40, max_wait=5.0, stranded_after=8.0),
    "b": Rule("b", "tb", max_messages=50, max_bytes=10_000, max_wait=2.0, stranded_after=30.0, idle_timeout=0.5),
}
_op = st.one_of(
    st.tuples(st.just("add"), st.sampled_from(["a", "b", "c"]), st.integers(0, 30)),
    st.tuples(st.just("restore"), st.sampled_from(["a", "b", "c"]), st.integers(0, 20)),
    st.tuples(st.just("wait"), st.floats(0, 10), st.just(0)),
    st.tuples(st.just("tick"), st.just(""), st.just(0)),
    st.tuples(st.just("rule"), st.sampled_from(["a", "b"]), st.integers(1, 60)),  # changed in the database
)


def _check_limits(batch: BatchReady) -> None:
    rule = batch.rule  # the rule in force when it closed
    assert 1 <= len(batch.messages) <= rule.max_messages
    assert len(batch.messages) == 1 or batch.size <= rule.max_bytes


@given(st.lists(_op, max_size=80))
def test_every_message_in_exactly_one_batch(ops: list[tuple[str, object, int]]) -> None:
    clock = Clock(1000.0)
    rules = dict(_RULES)
    c = make(rules, clock)
    sent: dict[int, str] = {}
    out: list[BatchReady] = []
    ids = _ids()
    for kind, arg, n in ops:
        if kind == "add":
            i = next(ids)
            sent[i] = str(arg)
            out += c.add(str(arg), i, b"p" * n)
        elif kind == "restore":
            i = next(ids)
            sent[i] = str(arg)
            out += c.restore(str(arg), [Held(i, b"r" * n, clock.now - n)])
        elif kind == "wait":
            clock.now += float(arg)  # type: ignore[arg-type]
        elif kind == "rule":  # lowered or raised under an open batch: every batch keeps the new limits
            idle = (None, 0.5, 1.5)[n % 3]
            rules[str(arg)] = Rule(str(arg), "t", max_messages=1 + n % 4, max_bytes=n, max_wait=3.0, idle_timeout=idle)
        else:
            ticked = c.tick()
            for d in {b.destination for b in ticked if b.cause is Cause.TIMEOUT}:  # flushed together, cut to limits
                timed_out = [b for b in ticked if b.destination == d]
                oldest = min(m.received_at for b in timed_out for m in b.messages)
                assert clock.now - oldest >= timed_out[0].rule.max_wait
            for d in {b.destination for b in ticked if b.cause is Cause.IDLE}:  # quiet for idle_timeout
                quiet = [b for b in ticked if b.destination == d]
                newest = max(m.received_at for b in quiet for m in b.messages)
                idle_timeout = quiet[0].rule.idle_timeout
                assert idle_timeout is not None and clock.now - newest >= idle_timeout
            out += ticked
    out += c.close()
    seen = Counter(m.id for b in out for m in b.messages)
    assert set(seen) == set(sent) and set(seen.values()) <= {1}
    for b in out:
        _check_limits(b)
        assert {sent[m.id] for m in b.messages} == {b.destination}
    assert len({b.batch_id for b in out}) == len(out)


@pytest.mark.slow
@settings(max_examples=5000)
@given(st.lists(_op, max_size=300))
def test_every_message_in_exactly_one_batch_many(ops: list[tuple[str, object, int]]) -> None:
    test_every_message_in_exactly_one_batch.hypothesis.inner_test(ops)  # type: ignore[attr-defined]


def test_a_payload_that_is_not_binary_is_its_text_never_zero_bytes_sized_by_it() -> None:
    from reassembly.storage.durable import _body

    assert _body(3) == b"3" and _body(2**33) == b"8589934592"  # not bytes(3): three zero bytes
    assert _body("é") == "é".encode() and _body(b"\x00\x01") == b"\x00\x01" and _body(None) == b""
