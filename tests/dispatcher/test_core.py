"""The dispatcher case by case: each ordering mode, holds, revocations, worker loss, commit floors
and settled ranges, counters; each rule shown on the smallest example that needs it."""

from __future__ import annotations

import random
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reassembly import GroupComplete, MessageComplete
from reassembly.assembler.positions import Origin
from reassembly.dispatcher import AfterDead, Alone, Dispatcher, Fenced, Ordering, Outcome, Settled, Work
from reassembly.dispatcher.core import MAX_SETTLED_RANGES
from segmenter import MsgFlags, SegmentationError
from segmenter.errors import Reason

IN_GROUP = int(MsgFlags.MSG_IN_GROUP)
LAST_IN_GROUP = int(MsgFlags.LAST_MSG_IN_GROUP)


def mc(group: bytes, seq: int, flags: int = IN_GROUP, *offsets: int, length: int = 10) -> MessageComplete:
    positions = tuple(Origin("p", o) for o in offsets)
    return MessageComplete(group, seq, b"x" * length, flags, len(offsets), 0, length, length, None, positions)


def take(d: Dispatcher, worker: str, now: float = 0.0) -> Work:
    work = d.take(worker, now)
    assert work is not None
    return work


def done(d: Dispatcher, work: Work, now: float = 0.0) -> Settled:
    answer = d.settle(work.ticket, Outcome.DONE, now=now)
    assert isinstance(answer, Settled)
    return answer


# ---------------------------------------------------------------------------- ordering modes


def test_group_mode_serializes_an_mq_group_and_runs_groups_in_parallel() -> None:
    d = Dispatcher()
    d.offer(mc(b"A", 1, IN_GROUP, 0), now=0)
    d.offer(mc(b"A", 2, LAST_IN_GROUP, 1), now=0)
    d.offer(mc(b"B", 1, IN_GROUP, 2), now=0)
    a1, b1 = take(d, "w1"), take(d, "w2")
    assert (a1.group, b1.group) == (b"A", b"B")
    assert d.take("w3", 0) is None  # A's second message waits for its first
    done(d, a1)
    a2 = take(d, "w3")  # any free worker takes a free group
    assert (a2.group, a2.message.msg_seq_number) == (b"A", 2)  # type: ignore[attr-defined]


def test_group_mode_hands_out_the_lowest_sequence_number_queued() -> None:
    """The assembler delivers a group's messages as they complete: the dispatcher puts the queued
    ones back in sequence, and does not wait for a number that has not come."""
    d = Dispatcher()
    d.offer(mc(b"A", 3, IN_GROUP, 0), now=0)
    d.offer(mc(b"A", 1, IN_GROUP, 1), now=0)
    d.offer(mc(b"A", 2, IN_GROUP, 2), now=0)
    seqs = []
    while (work := d.take("w", 0)) is not None:
        seqs.append(work.message.msg_seq_number)  # type: ignore[attr-defined]
        done(d, work)
    assert seqs == [1, 2, 3]
    d.offer(mc(b"A", 5, IN_GROUP, 3), now=0)
    five = take(d, "w")
    d.offer(mc(b"A", 4, IN_GROUP, 4), now=0)  # after a higher one went out: goes out when it may
    assert d.take("x", 0) is None
    done(d, five)
    assert take(d, "x").message.msg_seq_number == 4  # type: ignore[attr-defined]


def test_group_mode_a_message_outside_a_group_is_alone_and_a_unit_of_work_is_its_group() -> None:
    d = Dispatcher()
    d.offer(mc(b"A", 1, 0, 0), now=0)  # not in a group: keyed by its own ids
    d.offer(mc(b"C", 1, 0, 1), now=0)
    d.offer(mc(b"A", 1, 0, 2), now=0)  # the same message again (a redelivery) waits for the first
    unit = GroupComplete(b"B", (mc(b"B", 1, IN_GROUP, 3), mc(b"B", 2, LAST_IN_GROUP, 4)))
    d.offer(unit, now=0)
    works = [take(d, w) for w in ("w1", "w2", "w3")]
    assert [w.group for w in works] == [(b"A", 1), (b"C", 1), b"B"]
    assert works[2].message is unit and works[2].size == 20 and works[2].positions == (("p", 3), ("p", 4))
    assert d.take("w4", 0) is None


def test_group_mode_anything_else_goes_by_its_key_or_alone() -> None:
    d = Dispatcher()
    first = d.offer(b"one", now=0, key="k")
    d.offer(b"two", now=0, key="k")
    d.offer(b"three", now=0)
    assert [take(d, w).ticket for w in ("w1", "w2")] == [first, first + 2]
    assert d.take("w3", 0) is None


def test_key_mode_serializes_by_the_callers_key_and_a_message_without_one_is_alone() -> None:
    d = Dispatcher(Ordering.KEY)
    t1 = d.offer(mc(b"A", 1, IN_GROUP), now=0, key=b"user-1")
    t2 = d.offer(mc(b"A", 2, IN_GROUP), now=0, key=b"user-2")  # one MQ group, two keys: parallel
    t3 = d.offer(mc(b"A", 3, IN_GROUP), now=0, key=b"user-1")
    t4 = d.offer(b"no key", now=0)
    t5 = d.offer(b"no key either", now=0)
    works = [take(d, w) for w in ("w1", "w2", "w3", "w4")]
    assert [w.ticket for w in works] == [t1, t2, t4, t5]
    assert works[2].group == Alone(t4) and works[3].group == Alone(t5)
    assert d.take("w5", 0) is None
    done(d, works[0])
    assert take(d, "w5").ticket == t3


def test_partition_mode_keeps_the_plain_consumers_order() -> None:
    d = Dispatcher(Ordering.PARTITION)
    t1 = d.offer(b"a", now=0, positions=[("p0", 0)])
    d.offer(b"b", now=0, positions=[("p0", 1)])
    t3 = d.offer(b"c", now=0, positions=[("p1", 0), ("p0", 2)])  # its first segment's partition
    t4 = d.offer(b"d", now=0)  # no positions: alone
    assert [take(d, w).ticket for w in ("w1", "w2", "w3")] == [t1, t3, t4]
    assert d.take("w4", 0) is None


def test_unordered_mode_hands_out_everything_at_once_oldest_first() -> None:
    d = Dispatcher(Ordering.UNORDERED)
    tickets = [d.offer(mc(b"A", i, IN_GROUP, i), now=0, key="same") for i in range(1, 5)]
    assert [take(d, f"w{i}").ticket for i in range(4)] == tickets


def test_the_oldest_free_group_goes_first_and_a_retry_keeps_its_place() -> None:
    d = Dispatcher(Ordering.KEY)
    a1 = d.offer(b"a1", now=0, key="a")
    b1 = d.offer(b"b1", now=1, key="b")
    a2 = d.offer(b"a2", now=2, key="a")
    work = take(d, "w")
    assert work.ticket == a1
    answer = d.settle(a1, Outcome.RETRY, now=3)  # at once: still the oldest head
    assert isinstance(answer, Settled) and answer.group_free and answer.attempt == 1
    again = take(d, "w")
    assert (again.ticket, again.attempt) == (a1, 2)
    done(d, again)
    assert [take(d, w).ticket for w in ("x", "y")] == [b1, a2]


def test_a_retry_waits_for_its_time_and_holds_its_group_but_no_other() -> None:
    d = Dispatcher(Ordering.KEY)
    a1 = d.offer(b"a1", now=0, key="a")
    d.offer(b"a2", now=0, key="a")
    b1 = d.offer(b"b1", now=0, key="b")
    d.settle(take(d, "w").ticket, Outcome.RETRY, now=0, retry_at=10)
    assert take(d, "w", 1).ticket == b1  # a's head is not due: a2 must not pass it
    assert d.take("w2", 1) is None
    assert d.next_wakeup() == 10
    assert d.take("w2", 9.9) is None
    work = take(d, "w2", 10)
    assert (work.ticket, work.attempt) == (a1, 2)
    assert d.next_wakeup() is None


def test_the_owner_takes_more_of_its_group_when_the_limit_allows() -> None:
    d = Dispatcher(Ordering.KEY, max_in_flight_per_group=2)
    a = [d.offer(f"a{i}".encode(), now=0, key="a") for i in range(3)]
    b1 = d.offer(b"b1", now=0, key="b")
    assert take(d, "w1").ticket == a[0]
    assert take(d, "w1").ticket == a[1]  # its own group first
    assert take(d, "w1").ticket == b1  # the group is full: the oldest free one
    assert d.take("w2", 0) is None  # a is owned by w1, b too
    answer = done(d, Work(a[0], "a", None, 1, 0, ()))
    assert not answer.group_free  # a[1] is still in flight: still w1's
    assert d.take("w2", 0) is None
    assert take(d, "w1").ticket == a[2]


# ---------------------------------------------------------------------------- settlement and failures


def test_settling_what_is_not_in_flight_is_refused() -> None:
    d = Dispatcher()
    ticket = d.offer(b"x", now=0)
    for bad in (ticket, 999):  # queued, unknown
        with pytest.raises(SegmentationError) as caught:
            d.settle(bad, Outcome.DONE, now=0)
        assert caught.value.reason is Reason.STATE_ERROR
    done(d, take(d, "w"))
    with pytest.raises(SegmentationError, match="already settled"):
        d.settle(ticket, Outcome.DEAD, now=0)  # settled twice: never
    with pytest.raises(SegmentationError):
        Dispatcher(max_in_flight_per_group=0)
    with pytest.raises(SegmentationError):
        d.offer(b"x", now=0, size=-1)


def test_after_dead_continue_lets_the_group_go_on() -> None:
    d = Dispatcher(Ordering.KEY)
    d.offer(b"poison", now=0, key="a")
    t2 = d.offer(b"next", now=0, key="a")
    answer = d.settle(take(d, "w").ticket, Outcome.DEAD, now=0)
    assert isinstance(answer, Settled) and not answer.on_hold
    assert take(d, "w").ticket == t2
    assert d.stats.dead == 1


def test_after_dead_hold_keeps_the_group_until_released() -> None:
    d = Dispatcher(Ordering.KEY, after_dead=AfterDead.HOLD)
    d.offer(b"poison", now=0, key="a")
    t2 = d.offer(b"next", now=1, key="a")
    b1 = d.offer(b"other", now=2, key="b")
    answer = d.settle(take(d, "w").ticket, Outcome.DEAD, now=0)
    assert isinstance(answer, Settled) and answer.on_hold
    assert take(d, "w").ticket == b1  # a poison message blocks only its group
    assert d.take("w", 0) is None
    [view] = [v for v in d.groups() if v.group == "a"]
    assert (view.queued, view.owner, view.acquired, view.on_hold, view.oldest_offer) == (1, None, 0, True, 1)
    assert d.stats.groups_on_hold == 1
    assert d.floor("p") is None and d.held_messages() == 2
    assert d.release("b") == 0 and d.release("nobody") == 0
    assert d.release("a") == 1
    assert take(d, "w").ticket == t2


def test_a_held_group_stays_held_when_it_is_empty() -> None:
    d = Dispatcher(Ordering.KEY, after_dead=AfterDead.HOLD)
    d.offer(b"poison", now=0, key="a")
    d.settle(take(d, "w").ticket, Outcome.DEAD, now=0)
    later = d.offer(b"later", now=5, key="a")
    assert d.take("w", 5) is None
    assert d.release("a") == 1
    assert take(d, "w", 5).ticket == later
    done(d, Work(later, "a", None, 1, 0, ()))
    assert d.groups() == [] and d.held_messages() == 0


def test_a_gone_worker_gives_back_its_messages_without_counting_an_attempt() -> None:
    d = Dispatcher(Ordering.KEY)
    a1 = d.offer(b"a1", now=0, key="a")
    d.offer(b"a2", now=0, key="a")
    b1 = d.offer(b"b1", now=0, key="b")
    take(d, "w1"), take(d, "w2")
    assert d.worker_gone("w1") == [a1]
    assert d.worker_gone("w1") == []
    work = take(d, "w3")
    assert (work.ticket, work.attempt) == (a1, 1)
    assert d.stats.returned == 1
    assert {v.group: v.owner for v in d.groups()} == {"a": "w3", "b": "w2"}
    done(d, Work(b1, "b", None, 1, 0, ()))


# ---------------------------------------------------------------------------- revocation


def test_revoke_drops_queued_messages_and_fences_those_in_flight() -> None:
    d = Dispatcher(Ordering.KEY)
    a1 = d.offer(b"a1", now=0, key="a", positions=[("p0", 0)])
    a2 = d.offer(b"a2", now=0, key="a", positions=[("p0", 1)])
    b1 = d.offer(b"b1", now=0, key="b", positions=[("p1", 0)])
    c1 = d.offer(b"c1", now=0, key="c", positions=[("p0", 2), ("p1", 1)])  # spans both
    assert take(d, "w1").ticket == a1
    revoked = d.revoke("p0")
    assert (revoked.dropped, revoked.fenced, revoked.dropped_bytes) == ((a2, c1), (a1,), 4)
    assert d.floor("p0") is None and d.floor("p1") == 0  # c1 no longer holds p1 down: it is gone
    assert d.take("w2", 0).ticket == b1  # type: ignore[union-attr]
    assert d.take("w3", 0) is None  # a is still w1's until its fenced message returns
    answer = d.settle(a1, Outcome.DONE, now=0)
    assert isinstance(answer, Fenced) and answer.group == "a"
    assert d.settled_above("p0", 0) == [] and d.stats.fenced == 1 and d.stats.dropped == 2
    assert d.revoke("p0").dropped == ()  # nothing left there
    assert [v.group for v in d.groups()] == ["b"]


def test_a_partition_given_back_keeps_nothing_of_its_previous_assignment() -> None:
    """An eager rebalance revokes a partition and may give it straight back, read again from the
    group's commit (here 20, made meanwhile by another member): the floor, the settled ranges and
    the fenced work of the first assignment play no part in the second one's commits."""
    d = Dispatcher(Ordering.UNORDERED)
    old = d.offer(b"old", now=0, positions=[("p", 5)])
    settled = d.offer(b"settled", now=0, positions=[("p", 6)])
    take(d, "w1"), take(d, "w2")
    d.settle(settled, Outcome.DONE, now=0)
    assert d.floor("p") == 5 and d.settled_above("p", 5) == [(6, 6)]
    assert d.revoke("p").fenced == (old,)
    new = d.offer(b"new", now=1, positions=[("p", 20)])  # the second assignment
    assert d.floor("p") == 20 and d.settled_above("p", 20) == [] and d.commit_offset("p", 21) == 20
    assert isinstance(d.settle(old, Outcome.DONE, now=1), Fenced)  # its result arrives late
    assert d.floor("p") == 20 and d.settled_above("p", 20) == []
    w = take(d, "w1")
    assert w.ticket == new
    d.settle(new, Outcome.DONE, now=1)
    assert d.floor("p") is None and d.commit_offset("p", 21) == 21 and d.settled_above("p", 21) == []


def test_a_fenced_message_of_a_gone_worker_is_forgotten() -> None:
    d = Dispatcher()
    ticket = d.offer(b"x", now=0, positions=[("p", 5)])
    take(d, "w")
    assert d.revoke("p").fenced == (ticket,)
    assert d.worker_gone("w") == []
    assert d.held_messages() == 0 and d.groups() == []


# ---------------------------------------------------------------------------- commits


def test_the_floor_is_the_oldest_unsettled_segment_and_the_commit_never_passes_it() -> None:
    d = Dispatcher(Ordering.UNORDERED)
    first = d.offer(mc(b"A", 1, 0, 10, 12), now=0)  # segments at 10 and 12, another message's at 11
    d.offer(mc(b"B", 1, 0, 11), now=0)
    d.offer(mc(b"C", 1, 0, 13, 14), now=0)
    assert d.floor("p") == 10 and d.floor("elsewhere") is None
    w1, w2, w3 = (take(d, w) for w in ("w1", "w2", "w3"))
    assert w1.ticket == first and w1.positions == (("p", 10), ("p", 12))
    done(d, w2), done(d, w3)
    assert d.floor("p") == 10
    assert d.commit_offset("p", 15) == 10
    assert d.commit_offset("p", 8) == 8  # the assembler holds an older segment: its position wins
    assert d.settled_above("p", 10) == [(11, 11), (13, 14)]
    d.settle(w1.ticket, Outcome.RETRY, now=0)
    assert d.floor("p") == 10  # a retry still holds the commit
    done(d, take(d, "w1"))
    assert d.floor("p") is None
    assert d.commit_offset("p", 15) == 15 and d.commit_offset("p", None) is None
    assert d.settled_above("p", 15) == []


def test_settled_ranges_are_merged_trimmed_and_bounded() -> None:
    d = Dispatcher(Ordering.UNORDERED)
    hold = d.offer(b"", now=0, positions=[("p", 0)])
    take(d, "holder")
    offsets = [*range(1, 3 * MAX_SETTLED_RANGES, 2), 2, 4]  # every other offset, then two gaps filled
    random.Random(7).shuffle(offsets)
    for offset in offsets:
        d.offer(b"", now=0, positions=[("p", offset)])
        done(d, take(d, "w"))
    ranges = d.settled_above("p", 0)
    assert ranges[0] == (1, 5) and len(ranges) <= MAX_SETTLED_RANGES
    assert all(lo <= hi and hi + 1 < next_lo for (lo, hi), (next_lo, _) in pairwise(ranges))
    assert d.settled_above("p", 3) == [(4, 5), *ranges[1:]]  # forgotten at or below the commit
    assert d.settled_above("p", 0) == [(4, 5), *ranges[1:]]
    d.settle(hold, Outcome.DONE, now=0)


@given(st.lists(st.integers(0, 60), unique=True), st.lists(st.integers(-1, 60)))
def test_settled_ranges_are_the_settled_offsets_above_the_commit(offsets: list[int], commits: list[int]) -> None:
    """In any settle order, with commits in between: the ranges are exactly the settled offsets
    above the highest commit so far, merged."""
    d = Dispatcher(Ordering.UNORDERED)
    settled: set[int] = set()
    commit = -1
    for i, offset in enumerate(offsets):
        d.offer(b"", now=0, positions=[("p", offset)])
        done(d, take(d, "w"))
        settled.add(offset)
        if i < len(commits):
            commit = max(commit, commits[i])
            expected = []
            for o in sorted(x for x in settled if x > commit):
                if expected and expected[-1][1] == o - 1:
                    expected[-1] = (expected[-1][0], o)
                else:
                    expected.append((o, o))
            assert d.settled_above("p", commit) == expected


# ---------------------------------------------------------------------------- what is held


def test_sizes_positions_and_counters() -> None:
    d = Dispatcher()
    message = mc(b"A", 1, IN_GROUP, 3, 4, length=1000)
    ticket = d.offer(message, now=5)
    d.offer(b"raw bytes", now=6, size=7, positions=[("q", 1)])
    assert d.held_bytes() == 1007 and d.held_messages() == 2 and d.oldest_offer() == 5
    work = take(d, "w", 7)
    assert (work.size, work.positions, work.message) == (1000, (("p", 3), ("p", 4)), message)
    stats = d.stats
    assert (stats.held_messages, stats.queued, stats.in_flight, stats.groups, stats.groups_owned) == (2, 1, 1, 2, 1)
    d.settle(ticket, Outcome.DONE, now=8)
    assert d.oldest_offer() == 6 and d.held_bytes() == 7
    assert d.stats.offered == 2 and d.stats.done == 1
