"""Instance numbers that never repeat for a group id, and all-or-nothing release (``release_partial=False``).

An instance number is what downstream state keys on with the group id: forgetting a closed instance
(``keep_closed``, ``max_closed``) must not let the next one reuse its number, also across a snapshot
and a restore. All-or-nothing holds a group instance's messages until its whole sequence is there; a
sequence moved on without it leaves to Expire with its gap reported, never to Out.
"""

from __future__ import annotations

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
    GroupClosed,
    Released,
    ResequenceLimits,
    ResequenceOptions,
    SkipCause,
    Skipped,
    StartAt,
    StartAuto,
)
from segmenter.errors import Reason, SegmentationError
from tests.resequencer.test_resequencer import Clock, comparable


def kinds(events: list[Event]) -> list[tuple[str, Any]]:
    """Each event's kind and its number (``stop`` for a skip, the cause for a close)."""
    out: list[tuple[str, Any]] = []
    for e in events:
        if isinstance(e, Skipped):
            out.append(("skipped", (e.first, e.stop)))
        elif isinstance(e, GroupClosed):
            out.append(("closed", e.cause.value))
        else:
            out.append((type(e).__name__.lower(), e.seq))
    return out


# ---------------------------------------------------------------- instance numbers
OP = st.one_of(
    st.tuples(st.just("offer"), st.sampled_from(["a", "b", "c"]), st.integers(0, 2)),
    st.tuples(st.just("wait"), st.just(""), st.integers(1, 4)),
    st.tuples(st.just("snapshot"), st.just(""), st.just(0)),
)


@given(
    st.lists(OP, max_size=60),
    st.sampled_from([0.0, 1.0, 3.0, None]),
    st.integers(0, 2),
    st.booleans(),
)
@settings(max_examples=300, deadline=None)
def test_no_instance_id_repeats_across_opens_closes_expiries_and_restores(
    ops: list[tuple[str, str, int]], keep: float | None, max_closed: int, whole: bool
) -> None:
    """Every instance closes exactly once (``close()`` at the end closes the open ones), so the
    ``(group, instance)`` of every GroupClosed must be new; per group the numbers only go up."""
    opts = ResequenceOptions(
        start=StartAt(0),
        end=EndAt(2),
        missing_timeout=2.0,
        keep_closed=keep,
        limits=ResequenceLimits(max_closed=max_closed),
        release_partial=not whole,
    )
    clock = Clock()
    r = Resequencer(opts, clock=clock)
    events: list[Event] = []
    for op, group, n in ops:
        if op == "offer":
            events += r.offer(group, n, b"x")
        elif op == "wait":
            clock.now += n
            events += r.tick()
        else:
            r = Resequencer.restore(r.snapshot(), opts, clock=clock)
    events += r.close()
    closed = [(e.group, e.instance) for e in events if isinstance(e, GroupClosed)]
    assert len(closed) == len(set(closed))
    seen: dict[str, int] = {}
    for e in events:
        if e.instance is not None:
            assert e.instance >= seen.get(e.group, 0)
            seen[e.group] = e.instance


def test_a_group_id_back_after_keep_closed_gets_a_new_number_not_one() -> None:
    clock = Clock()
    r = Resequencer(ResequenceOptions(start=StartAt(0), end=EndAt(0), keep_closed=5.0), clock=clock)
    assert [e.instance for e in r.offer("g", 0, b"1")] == [1, 1]  # released, closed complete
    clock.now = 10
    assert r.tick() == [] and r.instance_floor == 1  # instance 1 forgotten
    assert [e.instance for e in r.offer("g", 0, b"2")] == [2, 2]
    assert [e.instance for e in r.offer("new", 0, b"3")] == [2, 2]  # above every forgotten number
    again = Resequencer.restore(r.snapshot(), r.options, clock=clock)
    assert again.instance_floor == 1 and r.snapshot()[:5] == b"RSEQ\x03"


def test_max_closed_zero_forgets_at_once_and_numbers_still_go_up() -> None:
    r = Resequencer(
        ResequenceOptions(start=StartAt(0), end=EndAt(0), limits=ResequenceLimits(max_closed=0)), clock=Clock()
    )
    assert [r.offer("g", 0, b"x")[0].instance for _ in range(3)] == [1, 2, 3]


# What the previous codec (version 2) wrote for: options end=EndAt(2), missing_timeout=5, keep_closed=10;
# "a" offered 0, 1, 2 (closed complete, instance 1 kept), then "b" offered 2 (held), all at time 0.
OLD_SNAPSHOT = bytes.fromhex(
    "525345510200000000000001107b2267726f757073223a5b7b226b6579223a5b2273222c2262225d2c22696e7374616e6365223a"
    "312c227068617365223a2272756e6e696e67222c227374617274223a302c22656e64223a322c226e657874223a302c2265787069"
    "72696e67223a66616c73652c22706f736974696f6e223a302c22636f756e7473223a5b302c302c302c305d2c2267617073223a5b"
    "5d2c22666c6f6f72223a6e756c6c2c22646561646c696e65223a352e302c2268656c64223a5b5b322c302c345d5d7d5d2c227761"
    "6974696e67223a5b305d2c22636c6f736564223a5b5b5b2273222c2261225d2c312c31302e305d5d2c2274696d657273223a5b5b"
    "226f222c302c352e305d2c5b2263222c302c31302e305d5d7d68656c64"
)
OLD_OPTIONS = ResequenceOptions(end=EndAt(2), missing_timeout=5.0, keep_closed=10.0)


def test_a_snapshot_in_the_previous_format_restores_and_goes_on() -> None:
    clock = Clock()
    r = Resequencer.restore(OLD_SNAPSHOT, OLD_OPTIONS, clock=clock)
    assert r.instance_floor == 0 and (r.open_groups, r.held_messages) == (1, 1)
    assert r.snapshot() == OLD_SNAPSHOT  # nothing forgotten yet: the same bytes, version 2
    events = r.offer("b", 0, b"b0") + r.offer("b", 1, b"b1")
    assert [(type(e), e.seq) for e in events if not isinstance(e, GroupClosed)] == [(Released, n) for n in range(3)]
    clock.now = 10
    r.tick()  # "a"'s instance 1 is forgotten
    assert r.instance_floor == 1 and r.offer("a", 0, b"a0")[0].instance == 2
    blob = r.snapshot()
    assert blob[:5] == b"RSEQ\x03" and Resequencer.restore(blob, OLD_OPTIONS, clock=clock).instance_floor == 1


@pytest.mark.parametrize("doc", ['"floor":0', '"floor":-1', '"floor":1.5', f'"floor":{1 << 62}'])
def test_a_bad_floor_is_a_corrupt_snapshot(doc: str) -> None:
    clock = Clock()
    r = Resequencer(ResequenceOptions(start=StartAt(0), end=EndAt(0), keep_closed=0.0), clock=clock)
    r.offer("g", 0, b"x")
    r.tick()
    blob = r.snapshot()
    assert b'"floor":1' in blob
    bad = blob.replace(b'"floor":1', doc.encode())
    bad = bad[:5] + (len(bad) - 13).to_bytes(8, "big") + bad[13:]
    with pytest.raises(SegmentationError, match="floor") as info:
        Resequencer.restore(bad, r.options, clock=clock)
    assert info.value.reason == Reason.STATE_ERROR


# ---------------------------------------------------------------- all-or-nothing
WHOLE = ResequenceOptions(start=StartAt(0), end=EndAt(4), missing_timeout=5.0, release_partial=False)


@given(st.permutations(range(5)))
def test_all_or_nothing_releases_only_the_whole_sequence_whatever_the_order(perm: list[int]) -> None:
    r = Resequencer(WHOLE, clock=Clock())
    for n in perm[:-1]:
        assert r.offer("g", n, n) == []  # an in-order prefix is held too
    last = r.offer("g", perm[-1], perm[-1])
    assert kinds(last) == [*(("released", n) for n in range(5)), ("closed", "complete")]
    assert [e.position for e in last if isinstance(e, Released)] == list(range(5))


def test_all_or_nothing_timeout_sends_what_is_held_to_expire_with_the_gap() -> None:
    clock = Clock()
    r = Resequencer(WHOLE, clock=clock)
    for n in (0, 1, 3):
        r.offer("g", n, n)
    clock.now = 5
    fired = r.tick()
    assert kinds(fired) == [("expired", 0), ("expired", 1), ("skipped", (2, 3)), ("expired", 3)]
    assert next(e for e in fired if isinstance(e, Skipped)).cause is SkipCause.TIMEOUT
    assert kinds(r.offer("g", 2, 2)) == [("missing", 2)]
    assert kinds(r.offer("g", 4, 4)) == [("expired", 4), ("closed", "complete")]
    assert r.offer("g", 0, "again") == [] and r.open_groups == 1  # a new instance, all-or-nothing again


def test_all_or_nothing_timeout_counts_from_the_first_message_held() -> None:
    clock = Clock()
    r = Resequencer(WHOLE, clock=clock)
    r.offer("g", 0, 0)
    clock.now = 4
    assert r.offer("g", 1, 1) == [] and r.tick() == []
    clock.now = 5
    assert kinds(r.tick()) == [("expired", 0), ("expired", 1)]  # nothing after them to skip to


def test_all_or_nothing_close_and_limits_never_release_a_partial_sequence() -> None:
    r = Resequencer(WHOLE, clock=Clock())
    for n in (0, 2):
        r.offer("g", n, n)
    events = r.close()
    assert kinds(events) == [("expired", 0), ("skipped", (1, 2)), ("expired", 2), ("closed", "closed")]
    assert next(e for e in events if isinstance(e, GroupClosed)).gaps == ((1, 2),)
    small = ResequenceOptions(
        start=StartAt(0), end=EndAt(9), release_partial=False, limits=ResequenceLimits(max_group_messages=2)
    )
    r = Resequencer(small, clock=Clock())
    events = r.offer("g", 0, 0) + r.offer("g", 1, 1) + r.offer("g", 3, 3)
    assert kinds(events) == [("expired", 0), ("expired", 1), ("skipped", (2, 3)), ("expired", 3)]
    assert not any(isinstance(e, Released) for e in events)


def test_all_or_nothing_with_a_predicate_end_and_an_automatic_start() -> None:
    clock = Clock()
    opts = ResequenceOptions(start=StartAuto(1.0), end=EndWhen(lambda seq, item: item == "last"), release_partial=False)
    r = Resequencer(opts, clock=clock)
    assert r.offer("g", 12, "last") + r.offer("g", 10, "x") == []
    clock.now = 1
    assert r.tick() == []  # started at 10; 11 is not there
    events = r.offer("g", 11, "y")
    assert kinds(events) == [("released", 10), ("released", 11), ("released", 12), ("closed", "complete")]


def test_all_or_nothing_needs_a_known_end_and_a_bool() -> None:
    for end in (EndAuto(1.0), None):
        with pytest.raises(SegmentationError, match="known"):
            ResequenceOptions(end=end, release_partial=False)
    with pytest.raises(SegmentationError, match="True or False"):
        ResequenceOptions(end=EndAt(1), release_partial=0)  # type: ignore[arg-type]


def test_all_or_nothing_snapshot_holds_next_and_restores_only_into_the_same_mode() -> None:
    clock = Clock()
    r = Resequencer(WHOLE, clock=clock)
    for n in (0, 1, 3):
        r.offer("g", n, b"%d" % n)
    blob = r.snapshot()
    again = Resequencer.restore(blob, WHOLE, clock=clock)
    assert again.snapshot() == blob
    clock.now = 5
    assert comparable(again.tick()) == comparable(r.tick())
    partial = ResequenceOptions(start=StartAt(0), end=EndAt(4), missing_timeout=5.0)
    with pytest.raises(SegmentationError, match="held number") as info:
        Resequencer.restore(blob, partial, clock=clock)  # partial mode never holds its next number
    assert info.value.reason == Reason.STATE_ERROR


def test_all_or_nothing_missing_after_the_end_closes_ended() -> None:
    clock = Clock()
    r = Resequencer(WHOLE, clock=clock)
    for n in (0, 1, 3, 4):
        r.offer("g", n, n)
    clock.now = 5
    fired = r.tick()
    assert kinds(fired)[:4] == [("expired", 0), ("expired", 1), ("skipped", (2, 3)), ("expired", 3)]
    assert kinds(r.offer("g", 2, 2)) == [("missing", 2)]
    clock.now = 10
    (closed,) = r.tick()
    assert isinstance(closed, GroupClosed) and closed.cause is CloseCause.ENDED
    assert (closed.released, closed.expired, closed.missing) == (0, 4, 1)
