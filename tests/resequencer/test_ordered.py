"""MQ groups delivered message by message in MsgSeqNumber order, as early as the order allows."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from reassembly import MessageComplete, Unfinished
from reassembly.resequencer.model import CloseCause, Expired, GroupClosed, Missing, Released, SkipCause, Skipped
from reassembly.resequencer.ordered import OrderedGroups
from segmenter import Segment, segment_group
from segmenter.errors import Reason


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def group(n: int, seed: int) -> tuple[list[bytes], list[Segment]]:
    rng = random.Random(seed)
    payloads = [rng.randbytes(rng.randrange(1, 700)) for _ in range(n)]
    return payloads, segment_group(payloads, 200, group_id=rng.randbytes(24))


@given(st.integers(1, 6), st.randoms(use_true_random=False))
def test_each_message_is_delivered_in_order_the_moment_its_predecessors_are_whole(n: int, rnd: Any) -> None:
    payloads, segs = group(n, rnd.randrange(1000))
    rnd.shuffle(segs)
    og = OrderedGroups(clock=Clock())
    delivered: list[tuple[int, int, bytes]] = []  # (arrival index, seq, payload)
    for i, s in enumerate(segs):
        for ev in og.receive(s.encode()):
            if isinstance(ev, Released):
                delivered.append((i, ev.seq, bytes(ev.item.payload)))
            else:
                assert isinstance(ev, GroupClosed) and ev.cause is CloseCause.COMPLETE
    assert [(seq, p) for _, seq, p in delivered] == list(enumerate(payloads, 1))
    # the earliest moment: the arrival of the last segment of messages 1..k
    last_at = {k: max(i for i, s in enumerate(segs) if s.header.msg_seq_number == k) for k in range(1, n + 1)}
    assert [i for i, _, _ in delivered] == [max(last_at[j] for j in range(1, k + 1)) for k in range(1, n + 1)]
    assert og.close() == []


def test_a_late_message_waits_then_is_skipped_then_comes_as_missing() -> None:
    clock = Clock()
    payloads, segs = group(4, 3)
    second = [s for s in segs if s.header.msg_seq_number == 2]
    og = OrderedGroups(clock=clock, missing_timeout=10)
    events = [ev for s in segs if s not in second for ev in og.receive(s.encode())]
    assert [(type(e), e.seq) for e in events] == [(Released, 1)]  # 3 and 4 wait for 2
    clock.now = 11
    events = og.tick()
    assert isinstance(events[0], Skipped) and events[0].cause is SkipCause.TIMEOUT
    assert [(e.seq, bytes(e.item.payload)) for e in events if isinstance(e, Expired)] == [
        (3, payloads[2]),
        (4, payloads[3]),
    ]
    events = [ev for s in second for ev in og.receive(s.encode())]
    assert [(type(e), e.seq) for e in events] == [(Missing, 2)]
    assert isinstance(events[0].item, MessageComplete) and bytes(events[0].item.payload) == payloads[1]


def test_a_failed_group_closes_its_resequencer_group_nothing_is_lost() -> None:
    payloads, segs = group(3, 5)
    lying = []
    for s in segs:
        h = s.header
        if h.msg_seq_number == 2 and h.message_checksum is not None:
            h = h._replace(message_checksum=h.message_checksum ^ 0xFFFF)
        lying.append(Segment(h, s.data))
    og = OrderedGroups(clock=Clock())
    events = [ev for s in reversed(lying) for ev in og.receive(s.encode())]
    kinds = [type(e).__name__ for e in events]
    assert kinds[:4] == ["GroupFailed", "Skipped", "Expired", "GroupClosed"]  # message 3 was complete, held
    assert events[0].reason == Reason.MESSAGE_CHECKSUM_ERROR
    assert bytes(events[2].item.payload) == payloads[2] and events[3].cause is CloseCause.CLOSED
    assert set(kinds[4:]) == {"Late"}  # the assembler's verdict on the group's remaining segments


def test_an_unfinished_group_is_closed_in_the_resequencer_too() -> None:
    clock = Clock()
    _, segs = group(3, 8)
    og = OrderedGroups(clock=clock)
    events = [ev for s in segs if s.header.msg_seq_number != 1 for ev in og.receive(s.encode())]
    assert events == []
    events = og.close()
    assert [type(e) for e in events] == [Unfinished, Skipped, Expired, Expired, GroupClosed]
    assert events[-1].cause is CloseCause.CLOSED and events[-1].gaps == ((1, 2),)


def test_messages_not_in_a_group_pass_straight_through() -> None:
    from segmenter import segment

    og = OrderedGroups(clock=Clock())
    events = [ev for s in segment(b"lone" * 100, 200) for ev in og.receive(s.encode())]
    assert [type(e) for e in events] == [MessageComplete]
