"""The batch resequencer (Camel's batch resequencer): sorted windows of any totally ordered key.

Properties: any arrival order within a window releases the sorted sequence (reverse too), ties in
arrival order; every item offered ends exactly once (released, duplicate or invalid) whatever the
keys; the windows equal a plain reference model; snapshot and restore at any point change no event;
garbage keys and hostile snapshots give only our types.
"""

from __future__ import annotations

import json
import struct
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reassembly.resequencer import (
    BatchDuplicate,
    BatchInvalid,
    BatchOptions,
    BatchReleased,
    BatchResequencer,
    DuplicatePolicy,
    WindowCause,
    WindowClosed,
)
from reassembly.resequencer.batch_model import BatchEvent, sort_key
from segmenter.errors import Reason, SegmentationError
from tests.support.hostile_json import JSONV, replace_somewhere


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


ZONES = st.builds(lambda m: timezone(timedelta(minutes=m)), st.integers(-14 * 60, 14 * 60))
KINDS = [
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=6),
    st.binary(max_size=6),
    st.datetimes(),
    st.datetimes(timezones=ZONES),
    st.dates(),
    st.tuples(st.integers(-3, 3), st.text(max_size=2)),
]
KEYS = st.sampled_from(KINDS).flatmap(lambda kind: st.lists(kind, min_size=1, max_size=30))


def released(events: list[BatchEvent]) -> list[Any]:
    return [e.item for e in events if isinstance(e, BatchReleased)]


# ---------------------------------------------------------------- property: one window sorts
@given(KEYS, st.booleans(), st.randoms(use_true_random=False))
@settings(max_examples=300)
def test_any_arrival_order_within_a_window_releases_it_sorted(keys: list[Any], reverse: bool, rnd: Any) -> None:
    rnd.shuffle(keys)
    r = BatchResequencer(BatchOptions(batch_size=len(keys), batch_timeout=None, reverse=reverse), clock=Clock())
    events = [e for i, k in enumerate(keys) for e in r.offer("g", k, i)]
    # the items are arrival indices: sorted by key, equal keys in arrival order (stable, reverse too)
    assert released(events) == sorted(range(len(keys)), key=lambda i: keys[i], reverse=reverse)
    assert [e.position for e in events if isinstance(e, BatchReleased)] == list(range(len(keys)))
    assert events[-1] == WindowClosed("g", 1, WindowCause.SIZE, len(keys), 0, 0.0, 0.0)
    assert r.held_items == 0 and r.open_windows == 0


@given(st.lists(st.integers(0, 5), min_size=1, max_size=30), st.sampled_from(list(DuplicatePolicy)), st.booleans())
@settings(max_examples=200)
def test_duplicates_keep_drop_replace_and_nothing_is_lost(keys: list[int], policy: DuplicatePolicy, rev: bool) -> None:
    opts = BatchOptions(batch_size=None, batch_timeout=10.0, duplicates=policy, reverse=rev)
    r = BatchResequencer(opts, clock=Clock())
    events = [e for i, k in enumerate(keys) for e in r.offer("g", k, i)] + r.flush()
    out, dups = released(events), [e.item for e in events if isinstance(e, BatchDuplicate)]
    assert sorted(out + dups) == list(range(len(keys)))  # every item exactly once
    if policy is DuplicatePolicy.KEEP:
        assert sorted(keys[i] for i in out) == sorted(keys) and dups == []  # the multiset, all released
    else:
        first = {k: i for i, k in reversed(list(enumerate(keys)))}
        last = {k: i for i, k in enumerate(keys)}
        kept = first if policy is DuplicatePolicy.DROP else last
        assert out == [kept[k] for k in sorted(kept, reverse=rev)]
    closed = events[-1]
    assert isinstance(closed, WindowClosed) and closed.cause is WindowCause.FLUSH
    assert (closed.released, closed.duplicates) == (len(out), len(dups))


# ---------------------------------------------------------------- property: windows vs a reference model
Op = tuple[str, Any, Any]  # ("offer", group, key) | ("time", dt, None) | ("flush", group or ..., None)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("offer"), st.sampled_from("abc"), st.integers(0, 9)),
        st.tuples(st.just("time"), st.sampled_from([0.0, 0.5, 1.0, 2.5]), st.none()),
        st.tuples(st.just("flush"), st.sampled_from(["a", ...]), st.none()),
    ),
    max_size=40,
)


def model(ops: list[Op], size: int | None, timeout: float | None) -> list[tuple[Any, ...]]:
    """The window rules as plainly as possible (duplicates kept, no bounds): per released window, the
    group, its number, its keys sorted, the cause and the time; ticking before each offer."""
    now, counter = 0.0, 1
    open_: dict[Any, list[Any]] = {}  # group -> [number, opened, keys]
    out: list[tuple[Any, ...]] = []

    def release(g: Any, cause: str, at: float) -> None:
        number, _, keys = open_.pop(g)
        out.append((g, number, sorted(keys), cause, at))

    def tick() -> None:
        if timeout is not None:
            for g in sorted((g for g in open_ if open_[g][1] + timeout <= now), key=lambda g: open_[g][0]):
                release(g, "timeout", open_[g][1] + timeout)

    for op, a, b in ops:
        tick()
        if op == "time":
            now += a
        elif op == "flush":
            for g in list(open_) if a is ... else [a] if a in open_ else []:
                release(g, "flush", now)
        else:
            if a not in open_:
                open_[a] = [counter, now, []]
                counter += 1
            open_[a][2].append(b)
            if size is not None and len(open_[a][2]) >= size:
                release(a, "size", now)
    tick()
    return out


def drive(r: BatchResequencer, clock: Clock, ops: list[Op], restore_at: set[int] | None = None) -> list[BatchEvent]:
    """The ops, ticking before each (an item's size is its key mod 4); with ``restore_at``, snapshot and
    restore before those ops."""
    events: list[BatchEvent] = []
    for n, (op, a, b) in enumerate(ops):
        if restore_at is not None and n in restore_at:
            r = BatchResequencer.restore(r.snapshot(encode=pack), r.options, clock=clock, decode=unpack)
        events += r.tick()
        if op == "time":
            clock.now += a
        elif op == "flush":
            events += r.flush(a)
        else:
            events += r.offer(a, b, (n, b), size=b % 4)
    return events + r.tick()


def pack(item: Any) -> bytes:
    return json.dumps(item).encode()


def unpack(raw: bytes) -> Any:
    return tuple(json.loads(raw))


def windows(events: list[BatchEvent]) -> list[tuple[Any, ...]]:
    keys: dict[int, list[Any]] = {}
    out = []
    for e in events:
        if isinstance(e, BatchReleased):
            keys.setdefault(e.window, []).append(e.key)
        elif isinstance(e, WindowClosed):
            out.append((e.group, e.window, keys.pop(e.window, []), e.cause.value, e.at))
    return out


SIZES = st.sampled_from([None, 1, 3])
TIMEOUTS = st.sampled_from([None, 0.0, 1.0, 3.0])


@given(OPS, SIZES, TIMEOUTS)
@settings(max_examples=300)
def test_windows_equal_the_reference_model(ops: list[Op], size: int | None, timeout: float | None) -> None:
    if size is None and timeout is None:
        size = 2
    clock = Clock()
    events = drive(BatchResequencer(BatchOptions(batch_size=size, batch_timeout=timeout), clock=clock), clock, ops)
    assert windows(events) == model(ops, size, timeout)


@given(OPS, SIZES, TIMEOUTS, st.sampled_from(list(DuplicatePolicy)), st.booleans(), st.data())
@settings(max_examples=300)
def test_snapshot_and_restore_at_any_point_change_no_event(
    ops: list[Op], size: int | None, timeout: float | None, dups: DuplicatePolicy, rev: bool, data: st.DataObject
) -> None:
    if size is None and timeout is None:
        timeout = 1.0
    bounds = {"max_window_items": 5, "max_window_bytes": 4, "max_items": 7, "max_bytes": 6}
    opts = BatchOptions(batch_size=size, batch_timeout=timeout, duplicates=dups, reverse=rev, **bounds)
    every = set(range(len(ops)))
    at = data.draw(st.just(every) | st.sets(st.sampled_from(sorted(every))) if ops else st.just(every))
    straight, c1 = Clock(), Clock()
    want = drive(BatchResequencer(opts, clock=straight), straight, ops)
    got = drive(BatchResequencer(opts, clock=c1), c1, ops, restore_at=at)
    assert got == want


@given(KEYS, st.integers(0, 30))
@settings(max_examples=200)
def test_every_key_kind_survives_a_snapshot_equal_and_of_its_kind(keys: list[Any], cut: int) -> None:
    clock = Clock()
    opts = BatchOptions(batch_size=None, batch_timeout=5.0)
    r = BatchResequencer(opts, clock=clock)
    for i, k in enumerate(keys[:cut]):
        assert r.offer("g", k, i.to_bytes(2, "big")) == []
    r2 = BatchResequencer.restore(r.snapshot(), opts, clock=clock, decode=lambda b: int.from_bytes(b, "big"))
    events = [e for i, k in enumerate(keys[cut:], cut) for e in r2.offer("g", k, i)] + r2.flush()
    out = [e for e in events if isinstance(e, BatchReleased)]
    assert [e.item for e in out] == sorted(range(len(keys)), key=lambda i: keys[i])
    assert all(e.key == keys[e.item] and sort_key(e.key)[0] == sort_key(keys[e.item])[0] for e in out)


# ---------------------------------------------------------------- property: garbage keys
class Weird:
    def __lt__(self, other: Any) -> bool:
        raise RuntimeError("no order")


GARBAGE = st.one_of(
    *KINDS,
    st.none(),
    st.booleans(),
    st.floats(),
    st.integers(-(2**70), 2**70),
    st.decimals(allow_nan=True),
    st.complex_numbers(),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
    st.tuples(st.none(), st.integers()),
    st.tuples(st.floats(), st.text(max_size=1)),
    st.builds(Weird),
    st.just(bytearray(b"ba")),
    st.just(memoryview(b"mv")),
    st.just(Decimal("1.5")),
    st.recursive(st.integers(), lambda c: st.tuples(c), max_leaves=8),
)


@given(st.lists(st.tuples(st.sampled_from("ab"), GARBAGE, st.integers(-2, 3)), max_size=30), st.booleans())
@settings(max_examples=300)
def test_garbage_keys_give_only_our_events_and_every_item_ends_once(
    offers: list[tuple[str, Any, int]], drop: bool
) -> None:
    clock = Clock()
    policy = DuplicatePolicy.DROP if drop else DuplicatePolicy.KEEP
    opts = BatchOptions(batch_size=4, batch_timeout=1.0, duplicates=policy, max_window_bytes=5)
    r = BatchResequencer(opts, clock=clock)
    events: list[BatchEvent] = []
    for i, (group, key, size) in enumerate(offers):
        events += r.offer(group, key, i, size=size)
        if i == len(offers) // 2:
            r = BatchResequencer.restore(r.snapshot(encode=pack), opts, clock=clock, decode=json.loads)
    events += r.flush()
    ends = [e.item for e in events if not isinstance(e, WindowClosed)]
    assert sorted(ends) == list(range(len(offers)))
    for e in events:
        if isinstance(e, BatchInvalid):
            assert e.reason in (Reason.RESEQ_BAD_NUMBER, Reason.RESEQ_BAD_SIZE)
            assert isinstance(e.error, SegmentationError) and str(e.error)
    for w in {e.window for e in events if isinstance(e, BatchReleased)}:
        keys = [e.key for e in events if isinstance(e, BatchReleased) and e.window == w]
        assert keys == sorted(keys)


# ---------------------------------------------------------------- examples
def test_aware_and_naive_datetimes_are_refused_together_with_a_clear_reason() -> None:
    r = BatchResequencer(BatchOptions(batch_size=3), clock=Clock())
    t = datetime(2026, 1, 1, 12, 0)
    assert r.offer("g", t.replace(tzinfo=timezone.utc), "aware") == []
    (bad,) = r.offer("g", t, "naive")
    assert isinstance(bad, BatchInvalid) and bad.reason == Reason.RESEQ_BAD_NUMBER and bad.item == "naive"
    assert "datetime (naive) key cannot be ordered with this window's datetime (timezone-aware) keys" in str(bad.error)
    assert bad.error.details == {"window": 1}
    (mixed,) = r.offer("g", 5, "int")
    assert "number key cannot be ordered" in str(mixed.error)


@pytest.mark.parametrize(
    ("key", "why"),
    [
        (None, "no key (None)"),
        (True, "type bool"),
        (float("nan"), "NaN"),
        (2**63, "beyond 64 bits"),
        (Decimal(1), "type Decimal"),
        ([1], "type list"),
        ((1, None), "no key (None)"),
        ((((((1,),),),),), "deeper than 4"),
    ],
)
def test_keys_that_are_not_ordered_are_invalid_events_never_dropped(key: Any, why: str) -> None:
    r = BatchResequencer(BatchOptions(batch_size=2), clock=Clock())
    (ev,) = r.offer("g", key, "item")
    assert isinstance(ev, BatchInvalid) and ev.item == "item" and ev.reason == Reason.RESEQ_BAD_NUMBER
    assert why in str(ev.error)
    assert r.open_windows == 0 and r.next_window == 1  # a refused item opens nothing


def test_a_size_that_is_not_a_whole_number_is_invalid() -> None:
    r = BatchResequencer(BatchOptions(batch_size=2), clock=Clock())
    (ev,) = r.offer("g", 1, "item", size=-1)
    assert isinstance(ev, BatchInvalid) and ev.reason == Reason.RESEQ_BAD_SIZE


def test_a_key_function_and_one_that_raises() -> None:
    r = BatchResequencer(BatchOptions(batch_size=2, key=lambda m: m["ts"]), clock=Clock())
    assert r.offer_item("g", {"ts": 2}) == []
    (bad,) = r.offer_item("g", {})
    assert isinstance(bad, BatchInvalid) and "key function raised KeyError" in str(bad.error)
    assert released(r.offer_item("g", {"ts": 1})) == [{"ts": 1}, {"ts": 2}]
    with pytest.raises(SegmentationError, match="needs BatchOptions"):
        BatchResequencer(BatchOptions(), clock=Clock()).offer_item("g", 1)


def test_a_timeout_releases_at_its_own_time_and_offers_never_fire_it() -> None:
    clock = Clock()
    r = BatchResequencer(BatchOptions(batch_size=None, batch_timeout=2.0), clock=clock)
    r.offer("a", 2, "a2")
    clock.now = 1
    r.offer("b", 1, "b1")
    clock.now = 10
    assert r.offer("a", 1, "a1") == []  # late, but the window is only released in tick()
    assert r.next_deadline() == 2.0
    events = r.tick()
    assert [(e.group, e.window, e.at) for e in events if isinstance(e, WindowClosed)] == [("a", 1, 2.0), ("b", 2, 3.0)]
    assert released(events) == ["a1", "a2", "b1"]
    assert r.next_deadline() is None


def test_flush_one_group_or_all() -> None:
    clock = Clock()
    r = BatchResequencer(BatchOptions(batch_size=10), clock=clock)
    r.offer_many([("a", 2, "a2"), ("b", 1, "b1"), ("a", 1, "a1")])
    assert released(r.flush("a")) == ["a1", "a2"] and r.flush("zz") == []
    (b1, closed) = r.flush()
    assert b1.item == "b1" and closed == WindowClosed("b", 2, WindowCause.FLUSH, 1, 0, 0.0, 0.0)


def test_bounds_release_early_never_drop() -> None:
    clock = Clock()
    r = BatchResequencer(BatchOptions(batch_size=None, batch_timeout=9.0, max_window_bytes=10), clock=clock)
    assert r.offer("g", 3, "x", size=6) == []
    *out, closed = r.offer("g", 1, "y", size=6)  # 12 bytes > 10: released at once
    assert released(out) == ["y", "x"] and closed.cause is WindowCause.LIMIT
    r = BatchResequencer(BatchOptions(batch_size=None, batch_timeout=9.0, max_window_items=3, max_items=4), clock=clock)
    r.offer_many([("a", 1, "a1"), ("b", 1, "b1"), ("a", 0, "a0"), ("b", 0, "b0")])
    events = r.offer("c", 0, "c0")  # 5 held > 4 in all: the oldest window ("a") goes
    assert released(events) == ["a0", "a1"] and events[-1].cause is WindowCause.LIMIT
    assert r.held_items == 3
    events = r.offer("b", 2, "b2") + r.offer("b", 3, "b3")  # 4 in b's window > 3
    assert released(events) == ["b0", "b1", "b2", "b3"]


def test_window_numbers_never_repeat_across_groups_and_restores() -> None:
    clock = Clock()
    opts = BatchOptions(batch_size=1)
    r = BatchResequencer(opts, clock=clock)
    seen = [e.window for g in "abab" for e in r.offer(g, 0, b"x") if isinstance(e, WindowClosed)]
    r = BatchResequencer.restore(r.snapshot(), opts, clock=clock)
    seen += [e.window for e in r.offer("a", 0, b"x") if isinstance(e, WindowClosed)]
    assert seen == [1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_size": None, "batch_timeout": None}, "needs batch_size, batch_timeout or both"),
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": True}, "batch_size"),
        ({"batch_timeout": -1}, "batch_timeout"),
        ({"batch_timeout": float("inf")}, "batch_timeout"),
        ({"reverse": 1}, "reverse"),
        ({"duplicates": "last"}, "duplicates"),
        ({"key": "ts"}, "key must be a function"),
        ({"max_items": 0}, "max_items"),
        ({"batch_size": 10, "max_window_items": 5}, "above max_window_items"),
    ],
)
def test_options_are_checked_when_made(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(SegmentationError, match=match) as info:
        BatchOptions(**kwargs)
    assert info.value.reason == Reason.STATE_ERROR
    assert BatchOptions(duplicates="drop").duplicates is DuplicatePolicy.DROP  # type: ignore[arg-type]


# ---------------------------------------------------------------- snapshots
def state() -> BatchResequencer:
    """Two windows: "a" (window 1, three int keys, one duplicate dropped), b"b" (window 2, a tuple key)."""
    clock = Clock()
    r = BatchResequencer(BatchOptions(batch_size=5, batch_timeout=30.0, duplicates="drop"), clock=clock)  # type: ignore[arg-type]
    r.offer_many([("a", 3, b"a3"), ("a", 1, b"a1", 2), ("a", 3, b"again")])
    clock.now = 1.5
    r.offer(b"b", (datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=2))), "x"), b"b")
    r.offer("a", date(2026, 1, 1), b"refused: another kind")
    return r


GOLDEN = bytes.fromhex(
    "525351420100000000000000f57b226e657874223a332c2277696e646f7773223a5b7b2267726f7570223a5b2273222c2261225d"
    "2c2277696e646f77223a312c226f70656e6564223a302e302c226475706c696361746573223a312c2268656c64223a5b5b5b2269"
    "222c335d2c302c325d2c5b5b2269222c315d2c322c325d5d7d2c7b2267726f7570223a5b2262222c223632225d2c2277696e646f"
    "77223a322c226f70656e6564223a312e352c226475706c696361746573223a302c2268656c64223a5b5b5b2275222c5b5b227422"
    "2c22323032362d30312d30315430303a30303a30302b30323a3030225d2c5b2273222c2278225d5d5d2c302c315d5d7d5d7d6133"
    "613162"
)
OPTS = BatchOptions(batch_size=5, batch_timeout=30.0, duplicates=DuplicatePolicy.DROP)


def test_the_codec_writes_the_golden_bytes_and_they_restore() -> None:
    assert state().snapshot() == GOLDEN
    r = BatchResequencer.restore(GOLDEN, OPTS, clock=Clock())
    assert (r.held_items, r.held_bytes, r.open_windows, r.next_window, r.next_deadline()) == (3, 2, 2, 3, 30.0)
    assert r.snapshot() == GOLDEN
    events = r.offer("a", 1, b"dup") + r.flush()
    assert [type(e).__name__ for e in events][:1] == ["BatchDuplicate"]
    assert released(events) == [b"a1", b"a3", b"b"]
    assert [(e.window, e.duplicates) for e in events if isinstance(e, WindowClosed)] == [(1, 2), (2, 0)]


def _doc(blob: bytes) -> tuple[dict[str, Any], bytes]:
    (n,) = struct.unpack_from(">Q", blob, 5)
    return json.loads(blob[13 : 13 + n]), blob[13 + n :]


def _reframe(doc: Any, tail: bytes) -> bytes:
    body = json.dumps(doc).encode()
    return b"RSQB\x01" + struct.pack(">Q", len(body)) + body + tail


@pytest.mark.parametrize(
    ("path", "value", "options"),
    [
        (("next",), 2, OPTS),  # window 2 is not below next
        (("windows", 1, "window"), 1, OPTS),  # numbers not ascending
        (("windows", 1, "group"), ["s", "a"], OPTS),  # one group twice
        (("windows", 0, "held", 1, 0), ["i", 3], OPTS),  # equal keys where duplicates are dropped
        (("windows", 0, "held", 1, 0), ["s", "3"], OPTS),  # two kinds in a window
        (("windows", 0, "held", 1, 0), ["f", "nan"], OPTS),  # NaN
        (("windows", 0, "held", 1, 0), ["x", 1], OPTS),  # an unknown tag
        (("windows", 0, "held"), [], OPTS),  # an empty window
        (("windows", 0, "opened"), 1e400, OPTS),  # not finite (JSON Infinity)
        ((), None, BatchOptions(batch_size=2, batch_timeout=30.0)),  # a window of batch_size items
        ((), None, BatchOptions(batch_size=None, batch_timeout=1.0, max_window_bytes=1)),
        ((), None, BatchOptions(batch_size=None, batch_timeout=1.0, max_items=2, max_window_items=1)),
    ],
)
def test_a_snapshot_that_is_inconsistent_or_beyond_the_options_is_refused(
    path: tuple[Any, ...], value: Any, options: BatchOptions
) -> None:
    doc, tail = _doc(GOLDEN)
    node = doc
    for k in path[:-1]:
        node = node[k]
    if path:
        node[path[-1]] = value
    with pytest.raises(SegmentationError, match="corrupt batch resequencer snapshot") as info:
        BatchResequencer.restore(_reframe(doc, tail), options, clock=Clock())
    assert info.value.reason == Reason.STATE_ERROR


@given(st.data(), JSONV)
@settings(max_examples=200)
def test_any_json_value_anywhere_in_a_snapshot_is_a_state_error_or_harmless(data: st.DataObject, value: Any) -> None:
    doc, tail = _doc(GOLDEN)
    blob = _reframe(replace_somewhere(doc, data, value), tail)
    try:
        BatchResequencer.restore(blob, OPTS, clock=Clock()).flush()
    except SegmentationError as err:
        assert err.reason == Reason.STATE_ERROR


@given(st.data())
@settings(max_examples=100)
def test_a_truncated_extended_or_flipped_snapshot_is_a_state_error_or_harmless(data: st.DataObject) -> None:
    cut = data.draw(st.integers(0, len(GOLDEN) - 1))
    for damaged in (GOLDEN[:cut], GOLDEN + b"x"):
        with pytest.raises(SegmentationError) as info:
            BatchResequencer.restore(damaged, OPTS, clock=Clock())
        assert info.value.reason == Reason.STATE_ERROR
    raw = bytearray(GOLDEN)
    raw[cut] ^= 1 << data.draw(st.integers(0, 7))
    try:
        BatchResequencer.restore(bytes(raw), OPTS, clock=Clock()).flush()
    except SegmentationError as err:
        assert err.reason == Reason.STATE_ERROR


def test_group_ids_and_items_that_cannot_be_written_are_refused_at_snapshot() -> None:
    r = BatchResequencer(BatchOptions(batch_size=3), clock=Clock())
    r.offer(("tuple", "group"), 1, b"x")
    with pytest.raises(SegmentationError, match="group ids must be"):
        r.snapshot()
    r = BatchResequencer(BatchOptions(batch_size=3), clock=Clock())
    r.offer("g", 1, "not bytes")
    with pytest.raises(SegmentationError, match="give snapshot\\(\\) an encode function"):
        r.snapshot()
    with pytest.raises(SegmentationError, match="magic"):
        BatchResequencer.restore(state().snapshot()[:3] + b"Q" + state().snapshot()[4:], OPTS, clock=Clock())
