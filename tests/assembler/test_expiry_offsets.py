"""``Limits.expiry_offsets``: a group held too many positions behind its partition's newest expires.

The peer is li-kafka's ``expiration.offset.gap``: on a busy partition a message whose segments lie
more than N offsets behind the newest is given up, whatever the clock says. Here it is handed back
as a time expiry hands it back (``Unfinished(cause=expired)``, its segments and positions), so the
partition's safe position moves past it.
"""

from __future__ import annotations

import os
from collections.abc import Hashable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reassembly import Assembler, Cause, Limits, MessageComplete, Unfinished
from reassembly.assembler.events import Event, Rejected
from reassembly.assembler.positions import Checkpoint, Origin
from segmenter import segment, segment_group
from segmenter.errors import SegmentationError
from segmenter.wire import HEADER_LENGTH
from tests.support.accounting import accounted


def encoded(payload: bytes, size: int = 200) -> list[bytes]:
    return [s.encode() for s in segment(payload, size)]


def unfinished(events: list[Event]) -> list[Unfinished]:
    return [e for e in events if isinstance(e, Unfinished)]


def test_a_group_more_than_n_positions_behind_expires_and_its_position_settles() -> None:
    slow, busy = encoded(os.urandom(500)), [encoded(os.urandom(100))[0] for _ in range(12)]
    asm = Assembler(Limits(expiry_offsets=10))
    assert asm.receive(slow[0], position=0, partition="p") == []
    for i, raw in enumerate(busy[:10], 1):  # positions 1..10: the slow group is 10 behind, kept
        assert [type(e) for e in asm.receive(raw, position=i, partition="p")] == [MessageComplete]
    assert asm.checkpoint("p") == Checkpoint("p", None, 0, 10)
    events = asm.receive(busy[10], position=11, partition="p")  # 11 behind: expired, before the segment
    assert [type(e) for e in events] == [Unfinished, MessageComplete]
    (expired,) = unfinished(events)
    assert expired.cause == Cause.EXPIRED and expired.segments == (slow[0],)
    assert expired.positions == (Origin("p", 0),) and expired.gaps  # the same gap report as a time expiry
    assert asm.checkpoint("p") == Checkpoint("p", 11, None, 11)
    assert asm.open_groups == 0
    (late,) = asm.receive(slow[1], position=12, partition="p")  # as after a time expiry: Late
    assert late.positions == (Origin("p", 12),) and type(late).__name__ == "Late"


def test_positions_count_per_partition_and_a_spanning_group_expires_on_any() -> None:
    a = encoded(os.urandom(700))
    asm = Assembler(Limits(expiry_offsets=5))
    asm.receive(a[0], position=100, partition="p")
    asm.receive(a[1], position=0, partition="q")
    assert asm.receive(b"x", position=500, partition="other") != []  # rejected; another partition counts nothing
    assert asm.open_groups == 1
    asm.receive(b"y", position=105, partition="p")  # 5 behind on p: kept
    assert asm.open_groups == 1
    (expired, _) = asm.receive(b"z", position=6, partition="q")  # 6 behind on q: the whole group expires
    assert isinstance(expired, Unfinished) and expired.cause == Cause.EXPIRED
    assert set(expired.positions) == {Origin("p", 100), Origin("q", 0)}
    assert asm.checkpoint("p").restart is None and asm.checkpoint("q").restart is None


def test_without_int_positions_the_option_does_nothing() -> None:
    a, b = encoded(os.urandom(500)), encoded(os.urandom(100))
    asm = Assembler(Limits(expiry_offsets=0))
    asm.receive(a[0])  # no position
    asm.receive(a[1], position=(0, 3), partition="p")  # (epoch, offset): ordered, but no distance
    assert asm.receive(b[0], position=(9, 9), partition="p")[0].__class__ is MessageComplete
    assert asm.open_groups == 1


def test_a_segment_read_again_far_behind_is_not_held() -> None:
    a = encoded(os.urandom(500))
    asm = Assembler(Limits(expiry_offsets=3))
    asm.receive(b"x", position=50, partition="p")
    (expired,) = asm.receive(a[0], position=10, partition="p")  # a rewound consumer, 40 behind
    assert isinstance(expired, Unfinished) and expired.segments == (a[0],) and asm.open_groups == 0


def test_a_group_completed_in_time_and_delivered_messages_leave_no_trace() -> None:
    segs = [s.encode() for s in segment_group([os.urandom(300), os.urandom(300)], 200)]
    asm = Assembler(Limits(expiry_offsets=2), unit_of_work=False)
    events = [e for i, raw in enumerate(segs) for e in asm.receive(raw, position=i, partition=0)]
    assert [type(e) for e in events] == [MessageComplete, MessageComplete]
    assert asm.receive(b"x", position=100, partition=0)[0].__class__ is Rejected  # nothing left to expire


def test_snapshots_keep_watching_the_distance() -> None:
    a = encoded(os.urandom(500))
    limits = Limits(expiry_offsets=4)
    asm = Assembler(limits)
    asm.receive(a[0], position=7, partition="p")
    restored = Assembler.restore(asm.snapshot(), limits)
    assert restored.receive(b"x", position=11, partition="p")[0].__class__ is Rejected
    events = restored.receive(b"y", position=12, partition="p")
    (expired,) = unfinished(events)
    assert expired.cause == Cause.EXPIRED and expired.segments == (a[0],)


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_a_gap_that_is_not_a_count_is_refused(bad: object) -> None:
    with pytest.raises(SegmentationError, match="expiry_offsets"):
        Assembler(Limits(expiry_offsets=bad))  # type: ignore[arg-type]


@st.composite
def arrivals(draw: st.DrawFn) -> list[tuple[bytes, Hashable, int]]:
    """Segments of several messages and MQ groups, copies included, in any order, each read at a
    partition and a position (positions mostly rising per partition, sometimes read again lower)."""
    segs: list[bytes] = []
    size = draw(st.integers(HEADER_LENGTH + 8, HEADER_LENGTH + 80))
    for _ in range(draw(st.integers(1, 5))):
        if draw(st.booleans()):
            payloads = draw(st.lists(st.binary(min_size=1, max_size=150), min_size=1, max_size=3))
            segs += [s.encode() for s in segment_group(payloads, size)]
        else:
            segs += [s.encode() for s in segment(draw(st.binary(min_size=1, max_size=200)), size)]
    segs += draw(st.lists(st.sampled_from(segs), max_size=3))  # copies
    order = draw(st.permutations(segs))
    partitions = draw(st.lists(st.integers(0, 2), min_size=len(order), max_size=len(order)))
    steps = draw(st.lists(st.integers(-3, 4), min_size=len(order), max_size=len(order)))
    at = dict.fromkeys(range(3), 0)
    out = []
    for raw, part, step in zip(order, partitions, steps, strict=True):
        at[part] = max(0, at[part] + step)
        out.append((raw, part, at[part]))
    return out


@settings(max_examples=150, deadline=None)
@given(arrivals(), st.integers(0, 6), st.booleans(), st.booleans())
def test_no_group_is_held_too_far_behind_and_every_segment_is_accounted(
    arrived: list[tuple[bytes, Hashable, int]], gap: int, unit_of_work: bool, snapshots: bool
) -> None:
    limits = Limits(expiry_offsets=gap)
    asm = Assembler(limits, unit_of_work=unit_of_work)
    events: list[Event] = []
    for i, (raw, part, position) in enumerate(arrived):
        events += asm.receive(raw, position=position, partition=part)
        for cp in asm.checkpoints().values():  # restart: the lowest held position; high: the newest
            assert cp.restart is None or cp.high - cp.restart <= gap
        if snapshots and i % 4 == 3:
            asm = Assembler.restore(asm.snapshot(), limits, unit_of_work=unit_of_work)
    events += asm.close()
    accounted([raw for raw, _, _ in arrived], events)
    for ev in unfinished(events):
        assert ev.segments and len(ev.positions) == len(ev.segments)


def test_with_a_large_gap_the_entries_of_completed_groups_do_not_pile_up() -> None:
    """Entries are dropped lazily; completed groups' entries are compacted away, so memory follows
    what is held, not the gap."""
    asm = Assembler(Limits(expiry_offsets=10**9))
    held = encoded(os.urandom(500))
    asm.receive(held[0], position=0, partition="p")
    for i in range(1, 5001):
        asm.receive(encoded(i.to_bytes(4, "big"))[0], position=i, partition="p")
    assert asm.open_groups == 1 and len(asm._behind["p"]) <= 1025
    asm.receive(b"x", position=10**9 + 1, partition="p")
    assert asm.open_groups == 0
