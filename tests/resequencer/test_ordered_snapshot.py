"""Snapshot/restore of OrderedGroups (and of an Assembler delivering message by message): a restart anywhere
changes nothing; a damaged snapshot is a STATE_ERROR and nothing else."""

from __future__ import annotations

import dataclasses
import json
import random
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reassembly import Assembler, Duplicate, Limits, MessageComplete
from reassembly.assembler.bodies import StoredBody
from reassembly.resequencer.model import GroupClosed, Released, ResequenceLimits
from reassembly.resequencer.ordered import OrderedGroups
from reassembly.resequencer.ordered_snapshot import decode_complete, encode, encode_complete
from reassembly.storage.filestore import FileBodyStore
from segmenter import segment, segment_group
from segmenter.errors import Reason, SegmentationError
from tests.support.collect_helpers import Clock
from tests.support.hostile_json import JSONV, replace_somewhere


def value(x: Any) -> Any:
    """An event as a plain value: errors by class, reason and numbers (they compare by identity), views as bytes."""
    if isinstance(x, SegmentationError):
        return (type(x).__name__, x.reason, value(x.details))
    if isinstance(x, memoryview):
        return bytes(x)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return (type(x).__name__, *(value(getattr(x, f.name)) for f in dataclasses.fields(x)))
    if isinstance(x, (tuple, list)):
        return (type(x).__name__, *(value(v) for v in x))
    if isinstance(x, dict):
        return {k: value(v) for k, v in x.items()}
    return x


def normal(events: list[Any]) -> list[Any]:
    """Comparable events, in their order (across groups too: the resequencer's timers that fall due
    at the same instant fire in the order they were armed, a restore included)."""
    return [value(e) for e in events]


def pool(seed: int) -> list[bytes]:
    """Segments to draw arrivals from: two MQ groups, a conflicting copy of one message of each (valid
    segments, other bytes), a message in no group, and one damaged segment."""
    rng = random.Random(seed)
    out: list[bytes] = []
    for tag, n in ((1, rng.randint(1, 4)), (2, rng.randint(1, 3))):
        gid = bytes([tag]) * 24
        payloads = [rng.randbytes(rng.randrange(1, 400)) for _ in range(n)]
        out += [s.encode() for s in segment_group(payloads, 200, group_id=gid)]
        k = rng.randrange(n)
        other = [*payloads[:k], rng.randbytes(len(payloads[k])), *payloads[k + 1 :]]
        out += [s.encode() for s in segment_group(other, 200, group_id=gid) if s.header.msg_seq_number == k + 1]
    out += [s.encode() for s in segment(rng.randbytes(300), 200, group_id=b"\x03" * 24)]
    damaged = bytearray(out[0])
    damaged[-1] ^= 1
    return [*out, bytes(damaged)]


Target = Assembler | OrderedGroups
OPS = st.lists(
    st.one_of(
        *[st.tuples(st.just("receive"), st.integers(0, 60))] * 4,
        st.tuples(st.just("tick"), st.sampled_from([0.5, 2.0, 7.0])),
    ),
    max_size=40,
)


def replay(
    segs: list[bytes],
    ops: list[tuple[str, Any]],
    make: Callable[[Clock], Target],
    reopen: Callable[[bytes, Clock], Target],
    cuts: set[int],
) -> list[list[Any]]:
    """The events of each call; at each op index in ``cuts`` the state goes through snapshot and restore."""
    clock = Clock()
    t = make(clock)
    calls = []
    for i, (op, arg) in enumerate([*ops, ("close", 0)]):
        if i in cuts:
            t = reopen(t.snapshot(), clock)
        if op == "receive":
            calls.append(normal(t.receive(segs[arg % len(segs)])))
        elif op == "tick":
            clock.now += arg
            calls.append(normal(t.tick() if isinstance(t, OrderedGroups) else t.expire()))
        else:
            calls.append(normal(t.close()))
    return calls


# ---------------------------------------------------------------- the assembler alone (a group holding nothing)
def test_a_group_delivering_one_by_one_restores_with_nothing_held() -> None:
    """unit_of_work=False: message 3 (the last) delivered, nothing held. The restore rebuilds the group
    from more than its segments: without its delivered fingerprints and last number a copy of a
    delivered segment would come back Late and the group would never complete."""
    clock = Clock()
    segs = segment_group([b"a" * 300, b"b" * 300, b"c" * 300], 200, group_id=b"g" * 24)
    by_seq = {k: [s.encode() for s in segs if s.header.msg_seq_number == k] for k in (1, 2, 3)}
    rest = [by_seq[3][0], *by_seq[1], *by_seq[2], by_seq[2][0]]

    def run(cut: bool) -> list[Any]:
        asm = Assembler(clock=clock, unit_of_work=False)
        first = asm.receive_many(by_seq[3])
        if cut:
            asm = Assembler.restore(asm.snapshot(), clock=clock, unit_of_work=False)
        events = first + asm.receive_many(rest) + asm.close()
        assert asm.open_groups == 0
        return events

    events = run(cut=True)
    assert [(type(e).__name__, getattr(e, "msg_seq_number", None)) for e in events] == [
        ("MessageComplete", 3),
        ("Duplicate", 3),  # not Late: the delivered fingerprints survived
        ("MessageComplete", 1),
        ("MessageComplete", 2),  # the group completes: its last number survived
        ("Duplicate", 2),  # from the closed record
    ]
    assert normal(events) == normal(run(cut=False))


@given(st.integers(0, 1 << 16), OPS, st.sets(st.integers(0, 41), max_size=2), st.booleans(), st.data())
@settings(max_examples=60)
def test_assembler_restore_anywhere_changes_nothing(
    seed: int, ops: list[Any], cuts: set[int], unit_of_work: bool, data: st.DataObject
) -> None:
    limits = data.draw(st.sampled_from([Limits(), Limits(expiry_seconds=6.0), Limits(max_open_groups=1)]))

    def make(clock: Clock) -> Assembler:
        return Assembler(limits, clock=clock, unit_of_work=unit_of_work)

    def reopen(blob: bytes, clock: Clock) -> Assembler:
        return Assembler.restore(blob, limits, clock=clock, unit_of_work=unit_of_work)

    segs = pool(seed)
    assert replay(segs, ops, make, reopen, cuts) == replay(segs, ops, make, reopen, set())


# ---------------------------------------------------------------- OrderedGroups: restore anywhere
OPTIONS = st.fixed_dictionaries(
    {
        "limits": st.sampled_from([Limits(), Limits(expiry_seconds=6.0), Limits(max_open_groups=1)]),
        "missing_timeout": st.sampled_from([None, 3.0]),
        "keep_closed": st.sampled_from([None, 8.0]),
        "resequence_limits": st.sampled_from(
            [None, ResequenceLimits(max_group_messages=1, max_messages=2, max_groups=1)]
        ),
    }
)


def check_ordered(seed: int, ops: list[Any], cuts: set[int], options: dict[str, Any]) -> None:
    def make(clock: Clock) -> OrderedGroups:
        return OrderedGroups(clock=clock, **options)

    def reopen(blob: bytes, clock: Clock) -> OrderedGroups:
        return OrderedGroups.restore(blob, clock=clock, **options)

    segs = pool(seed)
    assert replay(segs, ops, make, reopen, cuts) == replay(segs, ops, make, reopen, set())


def ordered_property(examples: int, most_cuts: int) -> Callable[..., None]:
    """The property, with ``examples`` cases of up to ``most_cuts`` restarts."""

    @given(st.integers(0, 1 << 16), OPS, st.sets(st.integers(0, 41), min_size=1, max_size=most_cuts), OPTIONS)
    @settings(max_examples=examples)
    def prop(seed: int, ops: list[Any], cuts: set[int], options: dict[str, Any]) -> None:
        check_ordered(seed, ops, cuts, options)

    return prop


test_ordered_groups_restore_anywhere_changes_nothing = ordered_property(100, 2)
test_ordered_groups_restore_anywhere_changes_nothing_many = pytest.mark.slow(ordered_property(3000, 4))


def test_waiting_messages_in_a_body_store_are_kept_by_reference(tmp_path: Path) -> None:
    """Bodies in a FileBodyStore: a whole message waiting for an earlier one is kept as its StoredBody (the
    file stays where it is), a message still arriving goes back into the new store."""
    payloads = [bytes([k]) * 500 for k in range(1, 4)]
    segs = segment_group(payloads, 200, group_id=b"s" * 24)
    first = [s.encode() for s in segs if s.header.msg_seq_number == 3]
    first += [s.encode() for s in segs if s.header.msg_seq_number == 1][:1]
    rest = [s.encode() for s in segs if s.encode() not in first]

    clock = Clock()
    og = OrderedGroups(clock=clock, bodies=FileBodyStore(tmp_path, "before", threshold=0))
    assert [e for s in first for e in og.receive(s)] == []  # 3 whole (waits for 1), 1 begun
    blob = og.snapshot()  # the process dies here: its store's files of work in progress stay behind
    og = OrderedGroups.restore(blob, clock=clock, bodies=FileBodyStore(tmp_path, "after", threshold=0))
    events = [e for s in rest for e in og.receive(s)]
    released = [e for e in events if isinstance(e, Released)]
    assert [e.seq for e in released] == [1, 2, 3] and isinstance(events[-1], GroupClosed)
    for e, p in zip(released, payloads, strict=True):
        assert isinstance(e.item.payload, StoredBody)
        assert (tmp_path / e.item.payload.location).read_bytes() == p


# ---------------------------------------------------------------- damaged snapshots
def _genuine() -> tuple[bytes, list[bytes], int]:
    """A state with something in every part: a message half arrived, a whole one waiting for an earlier
    one, a group with nothing held between deliveries, closed groups on both sides."""
    clock = Clock()
    og = OrderedGroups(clock=clock, missing_timeout=5)
    a = segment_group([b"a1" * 150, b"a2" * 150, b"a3" * 150], 200, group_id=b"a" * 24)
    b = segment_group([b"b1" * 150, b"b2" * 150], 200, group_id=b"b" * 24)
    c = segment_group([b"c1" * 50], 200, group_id=b"c" * 24)
    seq = lambda s: s.header.msg_seq_number  # noqa: E731
    arrivals = [s for s in a if seq(s) in (1, 3)] + [s for s in a if seq(s) == 2][:1]
    arrivals += [s for s in b if seq(s) == 1] + c
    for s in arrivals:
        og.receive(s.encode())
    clock.now = 1
    og.tick()
    return og.snapshot(), [s.encode() for s in (*a, *b, *c)], len(arrivals)


def _survives(blob: bytes, segs: list[bytes]) -> None:
    """Restored: it goes on without raising. Refused: a STATE_ERROR, nothing else."""
    clock = Clock()
    try:
        og = OrderedGroups.restore(blob, clock=clock, missing_timeout=5)
    except SegmentationError as err:
        assert err.reason == Reason.STATE_ERROR
        return
    for s in segs:
        og.receive(s)
    clock.now = 1e9
    og.tick()
    og.close()


def test_genuine_snapshot_goes_on() -> None:
    blob, segs, received = _genuine()
    clock = Clock()
    og = OrderedGroups.restore(blob, clock=clock, missing_timeout=5)
    events = [e for s in segs for e in og.receive(s)]
    out = [(e.group, e.seq) for e in events if isinstance(e, Released)]
    assert out == [(b"a" * 24, 2), (b"a" * 24, 3), (b"b" * 24, 2)]
    assert sum(isinstance(e, Duplicate) for e in events) == received  # held or delivered: all known again
    with pytest.raises(SegmentationError, match="version") as info:
        OrderedGroups.restore(blob[:4] + b"\x02" + blob[5:], clock=clock)
    assert info.value.reason == Reason.STATE_ERROR


@given(st.data())
@settings(max_examples=150)
def test_damaged_snapshot_bytes_are_a_state_error_or_harmless(data: st.DataObject) -> None:
    blob, segs, _ = _genuine()
    raw = bytearray(blob)
    for _ in range(data.draw(st.integers(0, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    _survives(bytes(raw[: data.draw(st.integers(0, len(raw)))]), segs)


@given(st.data(), JSONV)
@settings(max_examples=150)
def test_hostile_assembler_fields_are_a_state_error_or_harmless(data: st.DataObject, new: Any) -> None:
    blob, segs, _ = _genuine()
    (m,) = struct.unpack_from(">Q", blob, 5)
    asm, rest = blob[13 : 13 + m], blob[13 + m :]
    (n,) = struct.unpack_from(">Q", asm, 5)
    doc = json.dumps(replace_somewhere(json.loads(asm[13 : 13 + n]), data, new)).encode()
    asm = asm[:5] + struct.pack(">Q", len(doc)) + doc + asm[13 + n :]
    _survives(blob[:5] + struct.pack(">Q", len(asm)) + asm + rest, segs)


@given(st.data(), JSONV)
@settings(max_examples=100)
def test_hostile_waiting_message_fields_are_a_state_error_or_harmless(data: st.DataObject, new: Any) -> None:
    held = MessageComplete(b"a" * 24, 3, b"payload", 0x14, 2, 0, 7, 7, 12345)
    raw = encode_complete(held)
    assert decode_complete(raw) == held
    (n,) = struct.unpack_from(">I", raw)
    doc = json.dumps(replace_somewhere(json.loads(raw[4 : 4 + n]), data, new)).encode()
    og = OrderedGroups(clock=Clock())
    og.resequencer.offer(held.group_id, 3, held)
    hostile = struct.pack(">I", len(doc)) + doc + raw[4 + n :]
    _survives(encode(og.assembler.snapshot(), og.resequencer.snapshot(lambda _: hostile)), _genuine()[1])
