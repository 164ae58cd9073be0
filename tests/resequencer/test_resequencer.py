"""The sans-I/O resequencer: properties against a reference model, every mode, limits, snapshots."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reassembly.resequencer import Resequencer
from reassembly.resequencer.model import (
    CloseCause,
    EndAt,
    EndAuto,
    EndWhen,
    Event,
    Expired,
    Failed,
    GroupClosed,
    Missing,
    Released,
    ResequenceLimits,
    ResequenceOptions,
    SkipCause,
    Skipped,
    StartAt,
    StartAuto,
    StartWhen,
)
from segmenter.errors import Reason, SegmentationError
from tests.support.hostile_json import JSONV, replace_somewhere


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def terminal(ev: Event) -> str | None:
    return {Released: "out", Expired: "expire", Missing: "missing", Failed: "failure"}.get(type(ev))


def run(r: Resequencer, clock: Clock, arrivals: list[tuple[float, Any, int]]) -> list[Event]:
    """Offer each (time, group, seq) in order, ticking first; the item is the arrival's index."""
    out: list[Event] = []
    for i, (t, group, seq) in enumerate(arrivals):
        clock.now = t
        out += r.tick()
        out += r.offer(group, seq, i)
    return out


# ---------------------------------------------------------------- property: permutations
@given(st.integers(1, 60).flatmap(lambda n: st.permutations(range(-5, n - 5))), st.integers(1, 3))
def test_any_permutation_of_a_complete_sequence_releases_it_sorted(perm: list[int], groups: int) -> None:
    clock = Clock()
    r = Resequencer(ResequenceOptions(start=StartAt(-5), end=EndAt(max(perm))), clock=clock)
    arrivals = [(0.0, f"g{k}", s) for s in perm for k in range(groups)]
    events = run(r, clock, arrivals)
    for k in range(groups):
        mine = [e for e in events if e.group == f"g{k}"]
        assert [e.seq for e in mine if not isinstance(e, GroupClosed)] == sorted(perm)
        assert all(isinstance(e, Released) for e in mine[:-1])
        assert [e.position for e in mine[:-1] if isinstance(e, Released)] == list(range(len(perm)))
        assert mine[-1] == GroupClosed(f"g{k}", 1, CloseCause.COMPLETE, len(perm), 0, 0, 0, ())
    assert r.held_messages == 0 and r.open_groups == 0


# ---------------------------------------------------------------- property: gaps and a clock vs a model
def reference(arrivals: list[tuple[float, int]], start: int, timeout: float) -> dict[int, str]:
    """The resequencer's rules, as plainly as possible: one group, literal start, no end.

    Before a message at time t is looked at, every timeout due at or before t
    fires: the group waits for ``nxt`` from the moment it began waiting for it;
    when that wait reaches ``timeout`` it skips to the lowest held number, and
    from then on everything goes to Expire.
    """
    nxt, held, skipped, expiring, since = start, {}, set(), False, 0.0
    result: dict[int, str] = {}

    def drain(at: float) -> None:
        nonlocal nxt, since
        moved = False
        while nxt in held:
            result[held.pop(nxt)] = "expire" if expiring else "out"
            nxt += 1
            moved = True
        if moved:
            since = at

    for i, (t, seq) in enumerate(arrivals):
        while held and since + timeout <= t:
            at = since + timeout
            lowest = min(held)
            skipped |= set(range(nxt, lowest))
            nxt, expiring = lowest, True
            drain(at)
            since = at
        if seq < start:
            result[i] = "failure"
        elif seq < nxt:
            result[i] = "missing" if seq in skipped else "failure"
            skipped.discard(seq)
        elif seq in held:
            result[i] = "failure"
        else:
            if not held:
                since = t
            held[seq] = i
            drain(t)
    for i in held.values():
        result[i] = "expire"  # close(): what is still held goes to Expire
    return result


@st.composite
def gappy(draw: st.DrawFn) -> list[tuple[float, int]]:
    n = draw(st.integers(1, 30))
    seqs = draw(st.lists(st.integers(0, n), min_size=1, max_size=40))  # gaps, duplicates, late ones
    steps = draw(st.lists(st.sampled_from([0.0, 1.0, 3.0, 7.0, 20.0]), min_size=len(seqs), max_size=len(seqs)))
    t, out = 0.0, []
    for seq, dt in zip(seqs, steps, strict=True):
        t += dt
        out.append((t, seq))
    return out


TIMEOUTS = st.sampled_from([1.0, 5.0, 10.0])


@given(gappy(), TIMEOUTS)
def test_out_expire_missing_split_equals_the_reference_model(arrivals: list[tuple[float, int]], timeout: float) -> None:
    check_split(arrivals, timeout)


@pytest.mark.slow
@settings(max_examples=5000)
@given(gappy(), TIMEOUTS)
def test_split_equals_the_reference_model_many(arrivals: list[tuple[float, int]], timeout: float) -> None:
    check_split(arrivals, timeout)


def check_split(arrivals: list[tuple[float, int]], timeout: float) -> None:
    clock = Clock()
    r = Resequencer(ResequenceOptions(start=StartAt(0), end=None, missing_timeout=timeout), clock=clock)
    events = run(r, clock, [(t, "g", s) for t, s in arrivals]) + r.close()
    got = {e.item: terminal(e) for e in events if terminal(e)}
    assert got == reference(arrivals, 0, timeout)
    passed = [e for e in events if isinstance(e, (Released, Expired))]
    assert [e.seq for e in passed] == sorted(e.seq for e in passed)
    assert [e.position for e in passed] == list(range(len(passed)))


# ---------------------------------------------------------------- property: snapshot/restore anywhere
START = st.sampled_from([StartAt(0), StartWhen(lambda s, i: i % 3 == 0), StartAuto(2.0), StartAuto(0.0)])
END = st.sampled_from([None, EndAt(12), EndWhen(lambda s, i: i % 5 == 4), EndAuto(6.0)])
LIMITS = st.sampled_from([ResequenceLimits(), ResequenceLimits(max_group_messages=3, max_messages=5, max_groups=2)])
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("offer"), st.sampled_from(["a", "b", "c"]), st.integers(-1, 14)),
        st.tuples(st.just("tick"), st.sampled_from([0.5, 1.0, 4.0, 11.0]), st.just(0)),
    ),
    max_size=50,
)


def comparable(events: list[Event]) -> list[tuple[Any, ...]]:
    """Events as values (a SegmentationError compares by identity: its reason and numbers instead)."""
    return [
        (type(ev).__name__, *((f.reason, f.details) if isinstance(f, SegmentationError) else f for f in ev))
        for ev in events
    ]


def replay(opts: ResequenceOptions, ops: list[tuple[str, Any, int]], cut: int | None) -> list[list[tuple[Any, ...]]]:
    clock = Clock()
    r = Resequencer(opts, clock=clock)
    calls = []
    for i, (op, a, b) in enumerate(ops):
        if i == cut:
            blob = r.snapshot(encode=lambda item: str(item).encode())
            r = Resequencer.restore(blob, opts, clock=clock, decode=lambda raw: int(raw))
        if op == "offer":
            calls.append(comparable(r.offer(a, b, i, size=b % 4)))
        else:
            clock.now += a
            calls.append(comparable(r.tick()))
    calls.append(comparable(r.close()))
    return calls


@given(START, END, LIMITS, st.sampled_from([None, 3.0]), OPS, st.data())
@settings(max_examples=150)
def test_snapshot_restore_at_any_point_changes_nothing(
    start: Any, end: Any, limits: ResequenceLimits, timeout: float | None, ops: list[Any], data: st.DataObject
) -> None:
    check_snapshot(start, end, limits, timeout, ops, data)


@pytest.mark.slow
@given(START, END, LIMITS, st.sampled_from([None, 3.0]), OPS, st.data())
@settings(max_examples=5000)
def test_snapshot_restore_changes_nothing_many(
    start: Any, end: Any, limits: ResequenceLimits, timeout: float | None, ops: list[Any], data: st.DataObject
) -> None:
    check_snapshot(start, end, limits, timeout, ops, data)


def check_snapshot(
    start: Any, end: Any, limits: ResequenceLimits, timeout: float | None, ops: list[Any], data: st.DataObject
) -> None:
    opts = ResequenceOptions(start=start, end=end, missing_timeout=timeout, keep_closed=8.0, limits=limits)
    cut = data.draw(st.integers(0, len(ops)))
    straight = replay(opts, ops, None)
    assert replay(opts, ops, cut) == straight
    # every message offered ends in exactly one terminal
    offered = [i for i, op in enumerate(ops) if op[0] == "offer"]
    ends = [row[4] for call in straight for row in call if row[0] in ("Released", "Expired", "Missing", "Failed")]
    assert sorted(ends) == offered


def test_a_timer_moved_back_to_its_old_time_is_one_timer_and_round_trips() -> None:
    """Group a's idle timer is armed at 6, moved earlier by a held message (timeout, 3), and armed at 6
    again when that one pops: the entry from the first arming has the same time as the live one.

    The live one is the last armed, so b's timer (armed at 6 before it) fires first; a snapshot
    holds one timer per group (one repeated is refused as corrupt) and restores to the same events."""
    opts = ResequenceOptions(start=StartAt(0), end=EndAuto(6.0), missing_timeout=3.0)

    def until_four() -> tuple[Resequencer, Clock]:
        clock = Clock()
        r = Resequencer(opts, clock=clock)
        for group, seq in [("a", 0), ("b", 0), ("a", 2), ("a", 1)]:
            r.offer(group, seq, b"x")
        clock.now = 4.0
        assert r.tick() == []
        return r, clock

    r, clock = until_four()
    clock.now = 7.0
    straight = r.tick()
    assert [(e.group, type(e)) for e in straight] == [("b", GroupClosed), ("a", GroupClosed)]
    assert [e.cause for e in straight if isinstance(e, GroupClosed)] == [CloseCause.IDLE, CloseCause.IDLE]

    r, clock = until_four()
    blob = r.snapshot()
    (n,) = struct.unpack_from(">Q", blob, 5)
    assert json.loads(blob[13 : 13 + n])["timers"] == [["o", 1, 6.0], ["o", 0, 6.0]]  # b, then a
    clock.now = 7.0
    restored = Resequencer.restore(blob, opts, clock=clock)
    assert restored.next_deadline() == 6.0
    assert comparable(restored.tick()) == comparable(straight)


def test_a_snapshot_repeating_a_timer_is_refused() -> None:
    """One group's timer twice is not a state the resequencer can be in: a STATE_ERROR."""
    blob = _genuine()
    (n,) = struct.unpack_from(">Q", blob, 5)
    doc = json.loads(blob[13 : 13 + n])
    assert doc["timers"]
    doc["timers"].append(doc["timers"][0])
    raw = json.dumps(doc).encode()
    forged = blob[:5] + struct.pack(">Q", len(raw)) + raw + blob[13 + n :]
    with pytest.raises(SegmentationError) as err:
        Resequencer.restore(forged, ResequenceOptions(missing_timeout=5, end=EndAuto(9)), clock=Clock())
    assert err.value.reason == Reason.STATE_ERROR


# ---------------------------------------------------------------- hostile snapshots
def _genuine() -> bytes:
    clock = Clock()
    r = Resequencer(ResequenceOptions(missing_timeout=5, end=EndAuto(9)), clock=clock)
    for t, g, s in [(0, "a", 2), (1, "a", 0), (2, b"b", 5), (3, 7, 3), (10, "a", 1)]:
        clock.now = t
        r.tick()
        r.offer(g, s, b"item%d" % s, size=s)
    clock.now = 9
    r.tick()
    return r.snapshot()


def _survives(blob: bytes) -> None:
    clock = Clock()
    try:
        r = Resequencer.restore(blob, ResequenceOptions(missing_timeout=5, end=EndAuto(9)), clock=clock)
    except SegmentationError as err:
        assert err.reason == Reason.STATE_ERROR
        return
    clock.now = 1e9
    r.offer("a", 99, b"x")
    r.tick()
    r.close()


@given(st.data())
def test_hostile_snapshot_bytes_give_our_error(data: st.DataObject) -> None:
    blob = bytearray(_genuine())
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(blob) - 1))
        blob[i] = data.draw(st.integers(0, 255))
    _survives(bytes(blob[: data.draw(st.integers(0, len(blob)))]))


@given(st.data(), JSONV)
def test_hostile_snapshot_fields_give_our_error(data: st.DataObject, value: Any) -> None:
    blob = _genuine()
    (n,) = struct.unpack_from(">Q", blob, 5)
    doc = replace_somewhere(json.loads(blob[13 : 13 + n]), data, value)
    raw = json.dumps(doc).encode()
    _survives(blob[:5] + struct.pack(">Q", len(raw)) + raw + blob[13 + n :])


def test_snapshot_version_and_magic_are_checked() -> None:
    blob = _genuine()
    with pytest.raises(SegmentationError, match="version"):
        Resequencer.restore(blob[:4] + b"\x04" + blob[5:], clock=Clock())
    with pytest.raises(SegmentationError, match="magic"):
        Resequencer.restore(b"XXXX" + blob[4:], clock=Clock())
    with pytest.raises(SegmentationError, match="encode"):
        r = Resequencer(clock=Clock())
        r.offer("g", 3, object())
        r.snapshot()


def _equal_deadlines(cut: bool, version: int = 2) -> list[tuple[Any, ...]]:
    """Group "a" opens first, "b" second; "b" starts waiting (its timer armed) first, both at t=1:
    their deadlines are equal, and "b"'s fires first."""
    clock = Clock()
    opts = ResequenceOptions(start=StartAt(0), missing_timeout=5.0)
    r = Resequencer(opts, clock=clock)
    r.offer("a", 0, b"a0")
    r.offer("b", 0, b"b0")
    clock.now = 1
    r.offer("b", 2, b"b2")
    r.offer("a", 2, b"a2")
    if cut:
        blob = r.snapshot()
        if version == 1:  # what version 1 wrote: no timers
            (n,) = struct.unpack_from(">Q", blob, 5)
            doc = json.loads(blob[13 : 13 + n])
            del doc["timers"]
            raw = json.dumps(doc).encode()
            blob = blob[:4] + b"\x01" + struct.pack(">Q", len(raw)) + raw + blob[13 + n :]
        r = Resequencer.restore(blob, opts, clock=clock)
    clock.now = 6
    return comparable(r.tick())


def test_timers_due_at_the_same_instant_fire_in_the_same_order_after_a_restore() -> None:
    """A restore arms every timer again in the order they were armed, not in group age order (under
    which "a" would fire before "b")."""
    straight = _equal_deadlines(cut=False)
    assert [row[1] for row in straight if row[0] == "Skipped"] == ["b", "a"]
    assert _equal_deadlines(cut=True) == straight
    old = _equal_deadlines(cut=True, version=1)  # an older snapshot still restores (age order)
    assert sorted(old) == sorted(straight)


# ---------------------------------------------------------------- each start and end mode
def seqs(events: list[Event], kind: type) -> list[int]:
    return [e.seq for e in events if isinstance(e, kind)]


def test_literal_start_holds_until_it_arrives_and_refuses_lower() -> None:
    clock = Clock()
    r = Resequencer(ResequenceOptions(start=StartAt(1), end=None), clock=clock)
    ev = run(r, clock, [(0, "g", 3), (0, "g", 2), (0, "g", 0), (0, "g", 1)])
    assert seqs(ev, Released) == [1, 2, 3]
    (fail,) = [e for e in ev if isinstance(e, Failed)]
    assert fail.seq == 0 and fail.reason == Reason.RESEQ_BEFORE_START and fail.instance == 1


def test_predicate_start_must_be_lowest_and_fixes_the_start() -> None:
    clock = Clock()
    first = StartWhen(lambda seq, item: item == "first")
    r = Resequencer(ResequenceOptions(start=first, end=None), clock=clock)
    ev = r.offer("g", 11, "x") + r.offer("g", 12, "first") + r.offer("g", 10, "first") + r.offer("g", 9, "y")
    assert seqs(ev, Released) == [10, 11]
    assert [(e.seq, e.reason) for e in ev if isinstance(e, Failed)] == [
        (12, Reason.RESEQ_START_NOT_LOWEST),
        (9, Reason.RESEQ_BEFORE_START),
    ]


def test_predicate_start_that_never_comes_times_out_to_expire() -> None:
    clock = Clock()
    r = Resequencer(ResequenceOptions(start=StartWhen(lambda s, i: False), missing_timeout=5, end=None), clock=clock)
    ev = run(r, clock, [(0, "g", 4), (1, "g", 6), (9, "g", 5)])
    assert Skipped("g", 1, None, 4, SkipCause.TIMEOUT) in ev
    assert seqs(ev, Expired) == [4, 5, 6]


def test_automatic_start_gathers_then_starts_from_the_lowest() -> None:
    clock = Clock()
    r = Resequencer(ResequenceOptions(start=StartAuto(gather=2), end=None), clock=clock)
    ev = run(r, clock, [(0, "g", 7), (1, "g", 5), (3, "g", 6), (4, "g", 4)])
    assert seqs(ev, Released) == [5, 6, 7]  # started at 5 when the gather time passed (t=2)
    assert [(e.seq, e.reason) for e in ev if isinstance(e, Failed)] == [(4, Reason.RESEQ_BEFORE_START)]


def test_literal_end_closes_at_once_when_nothing_was_skipped_then_a_new_instance() -> None:
    clock = Clock()
    r = Resequencer(ResequenceOptions(start=StartAt(1), end=EndAt(3)), clock=clock)
    ev = run(r, clock, [(0, "g", 2), (0, "g", 4), (0, "g", 3), (0, "g", 1), (0, "g", 1)])
    assert seqs(ev, Released) == [1, 2, 3, 1]
    assert [e.reason for e in ev if isinstance(e, Failed)] == [Reason.RESEQ_AFTER_END]
    closed = [e for e in ev if isinstance(e, GroupClosed)]
    assert closed == [GroupClosed("g", 1, CloseCause.COMPLETE, 3, 0, 0, 1, ())]
    assert [e.instance for e in ev if isinstance(e, Released)] == [1, 1, 1, 2]


def test_end_with_a_skipped_gap_stays_open_for_missing_messages() -> None:
    clock = Clock()
    r = Resequencer(ResequenceOptions(start=StartAt(1), end=EndAt(4), missing_timeout=5), clock=clock)
    ev = run(r, clock, [(0, "g", 1), (0, "g", 3), (0, "g", 4), (6, "g", 2), (7, "g", 2), (20, "g", 2)]) + r.close()
    assert seqs(ev, Released) == [1]
    assert seqs(ev, Expired) == [3, 4, 2]  # the last: instance 2 (after the close), forced on by close()
    assert seqs(ev, Missing) == [2]
    assert [e.reason for e in ev if isinstance(e, Failed)] == [Reason.RESEQ_DUPLICATE]
    assert GroupClosed("g", 1, CloseCause.ENDED, 1, 2, 1, 1, ()) in ev
    assert [e.instance for e in ev if isinstance(e, Expired)] == [1, 1, 2]


def test_predicate_end_below_a_received_number_is_a_failure() -> None:
    clock = Clock()
    last = EndWhen(lambda seq, item: item == "last")
    r = Resequencer(ResequenceOptions(start=StartAt(0), end=last), clock=clock)
    ev = r.offer("g", 5, "x") + r.offer("g", 3, "last") + r.offer("g", 6, "last") + r.offer("g", 7, "y")
    assert [(e.seq, e.reason) for e in ev if isinstance(e, Failed)] == [
        (3, Reason.RESEQ_END_BELOW_RECEIVED),
        (7, Reason.RESEQ_AFTER_END),
    ]
    ev = [e for s in (0, 1, 2, 4) for e in r.offer("g", s, "x")]
    assert seqs(ev, Released) == [0, 1, 2]
    ev += r.offer("g", 3, "x")
    assert seqs(ev, Released) == [0, 1, 2, 3, 4, 5, 6]
    assert isinstance(ev[-1], GroupClosed) and ev[-1].cause is CloseCause.COMPLETE


def test_automatic_end_closes_after_idle_time() -> None:
    clock = Clock()
    r = Resequencer(ResequenceOptions(start=StartAt(0), end=EndAuto(idle=10)), clock=clock)
    ev = run(r, clock, [(0, "g", 0), (5, "g", 1), (14, "g", 2), (30, "g", 0)])
    assert [e.instance for e in ev if isinstance(e, Released)] == [1, 1, 1, 2]
    assert GroupClosed("g", 1, CloseCause.IDLE, 3, 0, 0, 0, ()) in ev
    assert r.next_deadline() == 40


def test_bad_numbers_are_failures_and_open_nothing() -> None:
    r = Resequencer(clock=Clock())
    ev = r.offer("g", None, 1) + r.offer("g", "3", 2) + r.offer("g", 1.0, 3) + r.offer("g", True, 4)
    assert [e.reason for e in ev] == [Reason.RESEQ_BAD_NUMBER] * 4
    assert r.open_groups == 0


# ---------------------------------------------------------------- limits: forced on, reported, nothing dropped
def test_group_and_total_limits_force_the_group_on_as_expire() -> None:
    clock = Clock()
    lim = ResequenceLimits(max_group_messages=2, max_messages=2, max_group_bytes=100, max_bytes=150)
    r = Resequencer(ResequenceOptions(limits=lim, end=None), clock=clock)
    ev = r.offer("a", 2, "a2") + r.offer("a", 3, "a3") + r.offer("a", 5, "a5")
    assert Skipped("a", 1, 0, 2, SkipCause.EVICTED) in ev and seqs(ev, Expired) == [2, 3]
    ev = r.offer("b", 4, "b4") + r.offer("b", 6, "b6")  # totals: a holds 5, b 4 and 6 -> a (waiting longest) moves
    assert Skipped("a", 1, 4, 5, SkipCause.EVICTED) in ev and seqs(ev, Expired) == [5]
    ev = r.offer("c", 9, "big", size=120)  # over the group's bytes on its own: passed on at once
    assert seqs(ev, Expired) == [9] and r.held_bytes == 0
    assert r.held_messages == 2


def test_max_gaps_forgets_the_oldest_gap_and_says_so() -> None:
    clock = Clock()
    r = Resequencer(ResequenceOptions(end=None, missing_timeout=1, limits=ResequenceLimits(max_gaps=1)), clock=clock)
    ev = run(r, clock, [(0, "g", 2), (2, "g", 4), (4, "g", 0), (4, "g", 3)])
    assert [(e.seq, e.reason) for e in ev if isinstance(e, Failed)] == [(0, Reason.RESEQ_FORGOTTEN)]
    assert seqs(ev, Missing) == [3]


def test_max_groups_closes_the_oldest() -> None:
    r = Resequencer(ResequenceOptions(end=None, limits=ResequenceLimits(max_groups=1)), clock=Clock())
    ev = r.offer("a", 1, "a1") + r.offer("b", 0, "b0")
    assert ev == [
        Skipped("a", 1, 0, 1, SkipCause.EVICTED),
        Expired("a", 1, 1, "a1", 0),
        GroupClosed("a", 1, CloseCause.EVICTED, 0, 1, 0, 0, ((0, 1),)),
        Released("b", 1, 0, "b0", 0),
    ]


def test_options_are_checked() -> None:
    with pytest.raises(SegmentationError):
        ResequenceOptions(start=StartAt(5), end=EndAt(4))
    with pytest.raises(SegmentationError, match="callable"):
        Resequencer(ResequenceOptions(start=StartWhen("flag")), clock=Clock())


def test_offer_never_fires_a_timeout_tick_does_at_the_deadline_time() -> None:
    def make() -> tuple[Resequencer, Clock]:
        clock = Clock()
        return Resequencer(ResequenceOptions(end=None, missing_timeout=5), clock=clock), clock

    r, clock = make()
    r.offer("g", 1, "x")
    clock.now = 100
    assert r.offer("g", 0, "y") == [Released("g", 1, 0, "y", 0), Released("g", 1, 1, "x", 1)]
    r, clock = make()
    r.offer("g", 1, "x")
    clock.now = 7
    r.offer("g", 3, "z")
    clock.now = 100
    ev = r.tick()  # the first timeout at 5 skips 0; waiting for 2 since 5: the second at 10
    assert ev == [
        Skipped("g", 1, 0, 1, SkipCause.TIMEOUT),
        Expired("g", 1, 1, "x", 0),
        Skipped("g", 1, 2, 3, SkipCause.TIMEOUT),
        Expired("g", 1, 3, "z", 1),
    ]


# ---------------------------------------------------------------- property: the batch entry point
BATCHES = st.lists(
    st.one_of(
        st.tuples(
            st.just("batch"),
            st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(-1, 14), st.integers(0, 3)), max_size=12),
        ),
        st.tuples(st.just("tick"), st.sampled_from([0.5, 1.0, 4.0, 11.0])),
    ),
    max_size=20,
)


def feed(opts: ResequenceOptions, ops: list[Any], many: bool) -> list[Event]:
    """Each batch at one clock reading: one ``offer_many`` call, or ``offer`` per message."""
    clock = Clock()
    r = Resequencer(opts, clock=clock)
    events: list[Event] = []
    n = 0
    for op, arg in ops:
        if op == "tick":
            clock.now += arg
            events += r.tick()
            continue
        msgs = [(g, s, n + i, size) if size else (g, s, n + i) for i, (g, s, size) in enumerate(arg)]
        n += len(msgs)
        if many:
            events += r.offer_many(msgs, now=clock.now) if n % 2 else r.offer_many(iter(msgs))
        else:
            for m in msgs:
                events += r.offer(*m)
    return events + r.close()


@given(START, END, LIMITS, st.sampled_from([None, 3.0]), BATCHES)
@settings(max_examples=150)
def test_offer_many_equals_offer_one_by_one_at_the_same_clock(
    start: Any, end: Any, limits: ResequenceLimits, timeout: float | None, ops: list[Any]
) -> None:
    opts = ResequenceOptions(start=start, end=end, missing_timeout=timeout, keep_closed=8.0, limits=limits)
    one = feed(opts, ops, many=False)
    assert comparable(feed(opts, ops, many=True)) == comparable(one)
    ends = sorted(e.item for e in one if terminal(e))
    assert ends == list(range(len(ends)))  # every message ends in exactly one terminal


def test_spark_refuses_in_all_limits_it_cannot_enforce_across_keys() -> None:
    from reassembly.spark.resequence.core import core_options

    core_options(ResequenceOptions(limits=ResequenceLimits(max_group_messages=5, max_messages=5)))  # per key: fine
    with pytest.raises(ValueError, match="in all"):
        core_options(ResequenceOptions(limits=ResequenceLimits(max_messages=1000)))
    with pytest.raises(ValueError, match="in all"):
        core_options(ResequenceOptions(limits=ResequenceLimits(max_bytes=1 << 20)))


def test_sizes_and_numbers_no_snapshot_could_hold_are_failures_and_limits_are_checked() -> None:
    """A size that is not a whole number >= 0 (a negative one would lift the byte limits; NaN, True
    or text would make a snapshot its own restore refuses) and a number beyond 64 bits (json.dumps
    would refuse the snapshot with a ValueError) are Failed events; impossible limits are refused
    when made (max_groups=0 would raise StopIteration at the first offer)."""
    clock = Clock()
    limits = ResequenceLimits(max_bytes=1000, max_group_bytes=1000)
    r = Resequencer(ResequenceOptions(start=StartAt(1), missing_timeout=1.0, limits=limits), clock=clock)
    bad: list[tuple[Any, Any]] = [(5, -(10**9)), (6, float("nan")), (7, True), (8, "1"), (9, 1.5), (10**5000, 0)]
    for seq, size in bad:
        (ev,) = r.offer("g", seq, b"x", size)
        assert isinstance(ev, Failed), (seq, size)
        assert ev.reason in (Reason.RESEQ_BAD_SIZE, Reason.RESEQ_BAD_NUMBER)
    assert r.offer("g", 3, b"x", 600) == [] and r.held_bytes == 600
    assert Resequencer.restore(r.snapshot(), r.options, clock=clock).held_bytes == 600
    for field in ("max_groups", "max_messages", "max_gaps", "max_bytes"):
        for value in (0, -1, 1.5, True):
            with pytest.raises(SegmentationError):
                ResequenceLimits(**{field: value})


def test_missing_numbers_splitting_a_skipped_range_keep_the_gap_bound() -> None:
    """Each Missing inside a skipped range splits it in two: ``max_gaps`` applies there too (else 200,000
    Missing would make 200,000 ranges, and a snapshot its own restore refuses)."""
    clock = Clock()
    limits = ResequenceLimits(max_gaps=2)
    options = ResequenceOptions(start=StartAt(0), end=None, missing_timeout=1, limits=limits)
    r = Resequencer(options, clock=clock)
    r.offer("g", 100, b"x")
    clock.now = 2
    r.tick()  # skipped [0, 100)
    events = [e for s in (10, 20, 30, 40) for e in r.offer("g", s, b"m")]
    assert [type(e) for e in events] == [Missing] * 4
    (late,) = r.offer("g", 5, b"m")  # below the ranges still remembered
    assert isinstance(late, Failed) and late.reason == Reason.RESEQ_FORGOTTEN
    restored = Resequencer.restore(r.snapshot(), options, clock=clock)
    assert restored.offer("g", 45, b"m")[0].__class__ is Missing


def test_a_timer_later_than_its_deadline_is_a_corrupt_snapshot() -> None:
    """A forged timer (armed at 1e300 for a deadline of 6) is refused at restore: accepted, the
    timeout would never fire."""
    clock = Clock()
    opts = ResequenceOptions(start=StartAt(0), missing_timeout=5.0)
    r = Resequencer(opts, clock=clock)
    r.offer("a", 0, b"a0")
    clock.now = 1
    r.offer("a", 2, b"a2")
    blob = r.snapshot()
    (n,) = struct.unpack_from(">Q", blob, 5)
    doc = json.loads(blob[13 : 13 + n])
    doc["timers"][0][2] = 1e300
    raw = json.dumps(doc).encode()
    with pytest.raises(SegmentationError) as err:
        Resequencer.restore(blob[:5] + struct.pack(">Q", len(raw)) + raw + blob[13 + n :], opts, clock=clock)
    assert err.value.reason == Reason.STATE_ERROR
