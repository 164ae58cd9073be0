"""A new message's in-order segments are collected as a run and filed (or delivered) at once
(``Assembler._collect``): the events, the state and what ``seen`` hears must be exactly those of
filing every segment as it comes, for any stream: interleaved messages and groups, copies,
damaged and forged segments, junk, limits that evict, expiry, snapshots and the other calls that
read or change the state in between."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reassembly import Assembler, Limits
from reassembly.assembler.events import GroupComplete, MessageComplete, Unfinished
from segmenter import Codec, Segment, segment, segment_group
from segmenter.checksum import ChecksumAlgorithm, checksum
from segmenter.wire import SegmentHeader, decode_segment
from tests.spark.test_judge_shortcuts import comparable

Step = tuple[str, object]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.reads = 0  # segments received: the position of the next one read at a position

    def __call__(self) -> float:
        return self.now


def forged(raw: bytes) -> bytes:
    """The segment with other data of its length and every checksum made to match (a CRC is no
    protection): only the message checksum can tell."""
    seg = decode_segment(raw)
    data = bytes((b + 1) % 256 for b in seg.data)
    return Segment(seg.header._replace(data_checksum=checksum(seg.header.algorithm, data)), data).encode()


@st.composite
def streams(draw: st.DrawFn) -> list[Step]:
    """Messages (some in MQ groups, some compressed, GroupIds sometimes reused) interleaved, then
    copies, drops, swaps, bit flips, forgeries, junk and calls mixed in."""
    queues: list[list[bytes]] = []
    for _ in range(draw(st.integers(1, 5))):
        gid = bytes([draw(st.integers(0, 5))]) * 24
        size = draw(st.integers(90, 260))
        least = draw(st.sampled_from([0, 300, 600]))  # most messages several segments long
        codec = draw(st.sampled_from([Codec.NONE, Codec.NONE, Codec.ZSTD]))
        if draw(st.integers(0, 4)) == 0:
            payloads = draw(st.lists(st.binary(min_size=least // 3, max_size=300), min_size=1, max_size=3))
            segs = segment_group(payloads, size, group_id=gid, codec=codec)
        else:
            segs = segment(draw(st.binary(min_size=least, max_size=700)), size, group_id=gid, codec=codec)
        queues.append([s.encode() for s in segs])
    items: list[Step] = []
    q = queues[0]
    while any(queues):  # an interleaving that keeps each message's order, mostly message by message
        if not q or draw(st.integers(0, 3)) == 0:
            q = draw(st.sampled_from([q for q in queues if q]))
        items.append(("segment", q.pop(0)))
    raws = [x for _, x in items]
    for _ in range(draw(st.integers(0, 10))):
        i = draw(st.integers(0, len(items)))
        kinds = ["copy", "drop", "swap", "flip", "forge", "junk", "call", "call", "other input"]
        kind = draw(st.sampled_from(kinds))
        # A damaged or forged segment takes the place of one (often the next of a run) or comes besides.
        here = i < len(items) and items[i][0] == "segment" and draw(st.booleans())
        original = items[i][1] if here else draw(st.sampled_from(raws))
        assert isinstance(original, bytes)
        if kind == "copy":
            items.insert(i, ("segment", original))
        elif kind == "drop" and i < len(items):
            del items[i]
        elif kind == "swap" and i + 1 < len(items):
            items[i], items[i + 1] = items[i + 1], items[i]
        elif kind in ("flip", "forge") and original:
            raw = bytearray(original)
            raw[draw(st.integers(0, len(raw) - 1))] ^= 1 << draw(st.integers(0, 7))
            if kind == "forge" and original not in raws:  # forge only a segment that decodes
                original = draw(st.sampled_from(raws))
            items[i : i + here] = [("segment", bytes(raw) if kind == "flip" else forged(original))]
        elif kind == "other input" and here and original in raws:  # a Segment, or bytes read at a position
            items[i] = (draw(st.sampled_from(["object", "at"])), original)
        elif kind == "junk":
            items.insert(i, ("segment", draw(st.binary(max_size=120))))
        elif kind == "call":
            call = draw(st.sampled_from(["tick", "tick", "expire", "snapshot", "pending", "forget"]))
            items.insert(i, (call, draw(st.integers(0, 5))))
    return items


LIMITS = st.sampled_from(
    [
        Limits(),
        Limits(max_buffered_bytes=400),
        Limits(max_buffered_bytes=1200),
        Limits(max_open_groups=1),
        Limits(max_open_groups=2, remember_closed=1),
        Limits(expiry_seconds=5.0),
        Limits(expiry_seconds=5.0, max_open_groups=2),
    ]
)


def apply(asm: Assembler, clock: Clock, step: Step, heard: list[SegmentHeader]) -> list[object]:
    kind, arg = step
    if kind in ("segment", "object", "at"):
        assert isinstance(arg, bytes)
        if kind == "object":
            return [comparable(e) for e in asm.receive(decode_segment(arg), seen=heard.append)]
        position = None if kind == "segment" else clock.reads
        clock.reads += 1
        return [comparable(e) for e in asm.receive(arg, position, seen=heard.append)]
    assert isinstance(arg, int)
    if kind == "tick":
        clock.now += 3 * arg
        return []
    if kind == "expire":
        return [comparable(e) for e in asm.expire()]
    if kind == "snapshot":
        return [asm.snapshot()]
    if kind == "pending":
        return [comparable(e) for e in asm.pending()]
    return [asm.forget(bytes([arg]) * 24, 1)]


@settings(max_examples=400, deadline=None)
@given(streams(), LIMITS, st.booleans(), st.booleans())
def test_runs_change_no_event_and_no_state(steps: list[Step], limits: Limits, unit_of_work: bool, join: bool) -> None:
    clocks = Clock(), Clock()
    fast = Assembler(limits, clock=clocks[0], unit_of_work=unit_of_work, join=join)
    plain = Assembler(limits, clock=clocks[1], unit_of_work=unit_of_work, join=join)
    plain._runs = False
    heard: tuple[list[SegmentHeader], list[SegmentHeader]] = ([], [])
    for step in steps:
        assert apply(fast, clocks[0], step, heard[0]) == apply(plain, clocks[1], step, heard[1]), step
        assert heard[0] == heard[1]
        assert (fast.buffered_bytes, fast.open_groups) == (plain.buffered_bytes, plain.open_groups)
    assert fast.snapshot() == plain.snapshot()
    assert [comparable(e) for e in fast.close()] == [comparable(e) for e in plain.close()]


def test_a_run_is_filed_before_anything_reads_the_state() -> None:
    """Half a message held as a run: it counts, it is pending, a snapshot holds it, it expires."""
    raws = [s.encode() for s in segment(bytes(range(256)) * 4, 200, group_id=b"r" * 24)]
    clock = Clock()
    asm = Assembler(Limits(expiry_seconds=5.0), clock=clock)
    for raw in raws[:3]:
        assert asm.receive(raw) == []
    assert asm._run is not None  # the segments wait unfiled
    assert (asm.buffered_bytes, asm.open_groups) == (3 * (200 - 84), 1)
    again = Assembler.restore(asm.snapshot(), Limits(expiry_seconds=5.0), clock=clock)
    assert [g.gaps[0].missing_ranges for g in again.pending()] == [((348, 1024),)]
    clock.now += 6
    (expired,) = asm.expire()
    assert isinstance(expired, Unfinished) and expired.gaps[0].received_bytes == 348
    assert asm.buffered_bytes == 0


def test_a_complete_run_is_delivered_and_remembered() -> None:
    payload = bytes(range(256)) * 4
    raws = [s.encode() for s in segment(payload, 200, group_id=b"d" * 24)]
    asm = Assembler(join=False)
    events = [e for raw in raws for e in asm.receive(raw)]
    (done,) = events
    assert isinstance(done, MessageComplete) and done.payload == payload and done.segments == len(raws)
    assert asm._groups == {} and asm._run is None
    assert [type(e).__name__ for e in asm.receive(raws[2])] == ["Duplicate"]  # the record was kept
    assert [type(e).__name__ for e in asm.receive(forged(raws[2]))] == ["ConflictingDuplicate"]


def test_groups_and_interleaved_messages_are_filed_as_before() -> None:
    group = [s.encode() for s in segment_group([b"a" * 300, b"b" * 300], 150, group_id=b"g" * 24)]
    lone = [s.encode() for s in segment(b"c" * 300, 150, group_id=b"m" * 24)]
    asm = Assembler()
    order = [group[0], lone[0], group[1], lone[1], *lone[2:], *group[2:]]
    events = [e for raw in order for e in asm.receive(raw)]
    assert [type(e) for e in events] == [MessageComplete, GroupComplete]
    assert bytes(events[0].payload) == b"c" * 300


def pair(limits: Limits, clock: Clock) -> tuple[Assembler, Assembler]:
    fast, plain = Assembler(limits, clock=clock), Assembler(limits, clock=clock)
    plain._runs = False
    return fast, plain


@pytest.mark.parametrize("broken", [math.nan, math.inf])
def test_a_clock_reading_nan_expires_a_run_as_it_expires_a_group(broken: float) -> None:
    """The loop over groups expires one unless its age is within the expiry; the run is judged by
    the same test, not by "age above the expiry", under which a NaN age would keep it forever."""
    raws = [s.encode() for s in segment(bytes(600), 200, group_id=b"n" * 24)]
    clock = Clock()
    clock.now = broken
    for asm in pair(Limits(expiry_seconds=5.0), clock):
        assert asm.receive(raws[0]) == []
        (gone,) = asm.expire()
        assert isinstance(gone, Unfinished) and asm.open_groups == 0
        assert [type(e).__name__ for e in asm.receive(raws[1])] == ["Late"]


def test_limits_lowered_while_a_run_is_collected_evict_as_filing_does() -> None:
    older = [s.encode() for s in segment(bytes(600), 200, group_id=b"o" * 24)]
    newer = [s.encode() for s in segment(bytes(600), 200, group_id=b"p" * 24)]
    outcomes = []
    for asm in pair(Limits(), Clock()):
        asm.receive(older[0])
        asm.receive(older[0])  # a copy: the older message is filed (a group)
        asm.receive(newer[0])  # the fast one collects this one as a run
        asm.limits = Limits(max_open_groups=1)
        outcomes.append(([comparable(e) for e in asm.receive(newer[1])], asm.open_groups))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][1] == 1 and outcomes[0][0][0][0] == "Unfinished"  # the older group was evicted


@pytest.mark.parametrize("change", ["codec", "algorithm"])
def test_a_last_segment_that_disagrees_with_a_run_is_not_delivered_with_the_runs_facts(change: str) -> None:
    """Every segment carries the message checksum and lengths, so the run's facts could pass for the
    message's: a LAST segment that says otherwise (its header and data checksums valid) must be
    judged as filing judges it, never delivered under the facts of the segments before it."""
    payload = bytes(range(256)) * 3
    segs = segment(payload, 200, group_id=b"f" * 24)
    last = segs[-1].header
    facts = {"message_checksum": last.message_checksum, "stored_length": last.stored_length}
    raws = [Segment(s.header._replace(**facts), s.data).encode() for s in segs[:-1]]
    if change == "codec":
        other = last._replace(codec=Codec.ZSTD)
    else:
        other = last._replace(algorithm=ChecksumAlgorithm.CRC32C)
        other = other._replace(data_checksum=checksum(other.algorithm, segs[-1].data))
    raws.append(Segment(other, segs[-1].data).encode())
    outcomes = []
    for asm in pair(Limits(), Clock()):
        events = [comparable(e) for raw in raws for e in asm.receive(raw)]
        outcomes.append((events, [comparable(e) for e in asm.close()]))
    assert outcomes[0] == outcomes[1]
    assert not any(e[0] == "MessageComplete" for e in outcomes[0][0])
