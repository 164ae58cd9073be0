"""The one snapshot framing (:mod:`reassembly._framing`) and the three snapshot codecs on it.

A frame reads back as it was written; a truncated, over-long or damaged frame is a ``Corrupt`` (a
STATE_ERROR out of a restore), never another exception, and no declared length is trusted. The
golden snapshots at the end are bytes the codecs wrote: they must keep restoring (a snapshot lives
in a checkpoint longer than the code that wrote it), and the codecs must keep writing exactly them
for the same state, so a layout change cannot slip in unnoticed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reassembly import Assembler, Duplicate, MessageComplete
from reassembly._checks import Corrupt, restoring
from reassembly._framing import HEAD_SIZE, LENGTH_SIZE, frame, unframe
from reassembly.resequencer import (
    Expired,
    OrderedGroups,
    Released,
    ResequenceOptions,
    Resequencer,
    Skipped,
    StartAt,
)
from segmenter import segment, segment_group
from segmenter.errors import Reason, SegmentationError

MAGICS = st.binary(min_size=4, max_size=4)
PARTS = st.lists(st.binary(max_size=40), max_size=5)


def read(blob: bytes, magic: bytes, version: int, count: int, tail: bool) -> tuple[int, list[bytes], bytes]:
    """Version, ``count`` parts and the tail (``tail=False``: there must be none)."""
    reader = unframe(blob, magic, {version})
    parts = [bytes(reader.part()) for _ in range(count)]
    if tail:
        return reader.version, parts, bytes(reader.rest())
    reader.end()
    return reader.version, parts, b""


# ---------------------------------------------------------------- the framing
@given(MAGICS, st.integers(0, 255), PARTS, st.binary(max_size=40))
def test_a_frame_reads_back_as_written(magic: bytes, version: int, parts: list[bytes], tail: bytes) -> None:
    blob = frame(magic, version, *parts, tail=tail)
    assert len(blob) == HEAD_SIZE + sum(LENGTH_SIZE + len(p) for p in parts) + len(tail)
    assert read(blob, magic, version, len(parts), tail=True) == (version, parts, tail)
    if not tail:
        assert read(blob, magic, version, len(parts), tail=False) == (version, parts, b"")


@given(MAGICS, st.integers(0, 255), PARTS, st.data())
def test_a_truncated_or_over_long_frame_is_corrupt(
    magic: bytes, version: int, parts: list[bytes], data: st.DataObject
) -> None:
    blob = frame(magic, version, *parts)
    cut = data.draw(st.integers(0, len(blob) - 1))
    with pytest.raises(Corrupt, match="truncated"):
        read(blob[:cut], magic, version, len(parts), tail=False)
    extra = data.draw(st.binary(min_size=1, max_size=20))
    with pytest.raises(Corrupt, match="trailing") as info:
        read(blob + extra, magic, version, len(parts), tail=False)
    assert info.value.details == {"trailing": len(extra)}


@given(MAGICS, st.integers(0, 255), PARTS, st.binary(max_size=10), st.data())
def test_a_damaged_frame_is_corrupt_or_reads_never_another_exception(
    magic: bytes, version: int, parts: list[bytes], tail: bytes, data: st.DataObject
) -> None:
    """A flipped bit in the magic or the version is always found; one in a length is found or moves
    the boundaries between parts (the codec's own checks judge what it then reads), never a crash."""
    raw = bytearray(frame(magic, version, *parts, tail=tail))
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] ^= 1 << data.draw(st.integers(0, 7))
    try:
        read(bytes(raw), magic, version, len(parts), tail=data.draw(st.booleans()))
    except Corrupt:
        return
    assert i >= HEAD_SIZE


@given(st.binary(max_size=60), st.integers(0, 4), st.booleans())
@settings(max_examples=300)
def test_any_bytes_are_corrupt_or_read(blob: bytes, count: int, tail: bool) -> None:
    with contextlib.suppress(Corrupt):
        read(blob, blob[:4].ljust(4, b"\0"), blob[4] if len(blob) > 4 else 0, count, tail)


def test_a_declared_length_is_checked_before_anything_is_sized_by_it() -> None:
    blob = b"TEST\x01" + (2**64 - 1).to_bytes(LENGTH_SIZE, "big") + b"abc"
    reader = unframe(blob, b"TEST", {1})
    with pytest.raises(Corrupt, match="truncated") as info:
        reader.part("document")
    assert info.value.details == {"length": 2**64 - 1, "left": 3}
    with pytest.raises(Corrupt, match="truncated") as info:
        unframe(blob, b"TEST", {1}).take(12)  # a length the codec's own document declares
    assert info.value.details == {"length": 12, "left": 11}


def test_magic_and_version_are_checked_first() -> None:
    blob = frame(b"TEST", 2, b"doc")
    with pytest.raises(Corrupt, match="magic"):
        unframe(blob, b"TSET", {2})
    with pytest.raises(Corrupt, match="version") as info:
        unframe(blob, b"TEST", {1, 3})
    assert info.value.details == {"version": 2}
    for short in (b"", b"TES", b"TEST"):
        with pytest.raises(Corrupt, match="truncated"):
            unframe(short, b"TEST", {2})
    for magic, version in ((b"TES", 1), (b"TESTS", 1), (b"TEST", 256), (b"TEST", -1)):
        with pytest.raises(ValueError):
            frame(magic, version)


def test_damage_inside_a_restore_is_a_state_error_with_its_details() -> None:
    refused = pytest.raises(SegmentationError, match="corrupt thing snapshot: bad magic")
    with refused as info, restoring("thing snapshot"):
        unframe(b"XXXX\x01", b"TEST", {1})
    assert info.value.reason == Reason.STATE_ERROR
    with pytest.raises(SegmentationError) as info, restoring("thing snapshot"):
        unframe(b"TEST\x07", b"TEST", {1})
    assert info.value.details == {"version": 7}
    with pytest.raises(SegmentationError, match="corrupt thing snapshot"), restoring("thing snapshot"):
        {}["missing"]
    ours = SegmentationError("as it is", reason=Reason.BUFFER_LIMIT)
    with pytest.raises(SegmentationError) as info, restoring("thing snapshot"):
        raise ours
    assert info.value is ours


# ---------------------------------------------------------------- the codecs on it
class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def held_and_done() -> tuple[list[bytes], list[bytes]]:
    """A message of five segments and one of a single segment."""
    held = [s.encode() for s in segment(b"held-" * 12, 96, group_id=b"h" * 24)]
    done = [s.encode() for s in segment(b"done", 96, group_id=b"d" * 24)]
    return held, done


def assembler_state() -> bytes:
    """One segment held (read at position 7 of partition "p0"), one message delivered."""
    clock = Clock(100.0)
    asm = Assembler(clock=clock)
    held, done = held_and_done()
    asm.receive(held[0], position=7, partition="p0")
    clock.now = 101.5
    asm.receive_many(done)
    return asm.snapshot()


RESEQUENCE = ResequenceOptions(start=StartAt(0), missing_timeout=5.0)


def resequencer(clock: Clock) -> Resequencer:
    """Three groups waiting for a number; "b" began waiting first, "a" at the same instant."""
    r = Resequencer(RESEQUENCE, clock=clock)
    r.offer("a", 0, b"a0")
    r.offer(b"b", 0, b"b0", size=2)
    clock.now = 1
    r.offer(b"b", 2, b"b2", size=2)
    r.offer("a", 2, b"a2")
    r.offer(7, 1, b"71")
    return r


def ordered_segments(seq: int | None = None) -> list[bytes]:
    """The segments of a three-message MQ group (those of message ``seq`` only, when given)."""
    segs = segment_group([b"a1" * 40, b"a2" * 40, b"a3" * 40], 96, group_id=b"a" * 24)
    return [s.encode() for s in segs if seq is None or s.header.msg_seq_number == seq]


def ordered_state() -> bytes:
    """Message 3 whole and waiting for 1 and 2, message 2 begun, after a tick."""
    clock = Clock(0)
    og = OrderedGroups(clock=clock, missing_timeout=5)
    for raw in [*ordered_segments(3), ordered_segments(2)[0]]:
        og.receive(raw)
    clock.now = 1
    og.tick()
    return og.snapshot()


def restore_assembler(blob: bytes) -> Any:
    return Assembler.restore(blob)


def restore_resequencer(blob: bytes) -> Any:
    return Resequencer.restore(blob, RESEQUENCE, clock=Clock(1))


def restore_ordered(blob: bytes) -> Any:
    return OrderedGroups.restore(blob, clock=Clock(1), missing_timeout=5)


CODECS: list[tuple[str, Callable[[bytes], Any], Callable[[], bytes]]] = [
    ("assembler", restore_assembler, lambda: ASSEMBLER),
    ("resequencer", restore_resequencer, lambda: RESEQUENCER_2),
    ("ordered", restore_ordered, lambda: ORDERED),
]


def test_the_codecs_write_the_golden_bytes() -> None:
    assert assembler_state() == ASSEMBLER
    assert resequencer(Clock(0)).snapshot() == RESEQUENCER_2
    assert ordered_state() == ORDERED
    assert [b[:5] for b in (ASSEMBLER, RESEQUENCER_2, RESEQUENCER_1, ORDERED)] == [
        b"SGAS\x01", b"RSEQ\x02", b"RSEQ\x01", b"SGOG\x01"
    ]  # fmt: skip


def test_a_golden_assembler_snapshot_restores_and_goes_on() -> None:
    asm = Assembler.restore(ASSEMBLER, clock=Clock(102.0))
    assert asm.open_groups == 1 and asm.checkpoint("p0").restart == 7
    assert asm.snapshot() == ASSEMBLER
    held, done = held_and_done()
    (whole,) = asm.receive_many(held[1:])
    assert isinstance(whole, MessageComplete) and whole.payload == b"held-" * 12
    assert [type(e) for e in asm.receive(done[0])] == [Duplicate]  # the closed record came back


def test_golden_resequencer_snapshots_restore_and_go_on() -> None:
    """Version 2 keeps the order of timers due at the same instant ("b" then "a"); version 1 has no
    timers and arms them in age order ("a" then "b")."""

    def timeouts(r: Resequencer, clock: Clock) -> list[tuple[str, Any, int]]:
        clock.now = 6
        return [(type(e).__name__, e.group, e.stop if isinstance(e, Skipped) else e.seq) for e in r.tick()]

    live_clock = Clock(0)
    live = timeouts(resequencer(live_clock), live_clock)
    assert [(k, g) for k, g, _ in live if k == "Skipped"] == [("Skipped", b"b"), ("Skipped", "a"), ("Skipped", 7)]
    for blob, order in ((RESEQUENCER_2, [b"b", "a", 7]), (RESEQUENCER_1, ["a", b"b", 7])):
        clock = Clock(1)
        r = Resequencer.restore(blob, RESEQUENCE, clock=clock)
        assert (r.held_messages, r.held_bytes) == (3, 2)
        events = timeouts(r, clock)
        assert sorted(events, key=repr) == sorted(live, key=repr)
        assert [g for k, g, _ in events if k == "Skipped"] == order
        assert {(g, s) for k, g, s in events if k == Expired.__name__} == {(b"b", 2), ("a", 2), (7, 1)}


def test_a_golden_ordered_groups_snapshot_restores_and_goes_on() -> None:
    og = OrderedGroups.restore(ORDERED, clock=Clock(1), missing_timeout=5)
    events = [e for raw in ordered_segments() for e in og.receive(raw)]
    assert [e.seq for e in events if isinstance(e, Released)] == [1, 2, 3]
    assert sum(isinstance(e, Duplicate) for e in events) == len(ordered_segments(3)) + 1  # all held, known again


@pytest.mark.parametrize(("name", "restore", "golden"), CODECS, ids=[c[0] for c in CODECS])
def test_each_codec_refuses_the_others_and_other_versions(
    name: str, restore: Callable[[bytes], Any], golden: Callable[[], bytes]
) -> None:
    for other in (ASSEMBLER, RESEQUENCER_2, ORDERED):
        if other is not golden():
            with pytest.raises(SegmentationError, match="magic") as info:
                restore(other)
            assert info.value.reason == Reason.STATE_ERROR
    with pytest.raises(SegmentationError, match="version") as info:
        restore(golden()[:4] + b"\x63" + golden()[5:])
    assert info.value.reason == Reason.STATE_ERROR and info.value.details == {"version": 0x63}


@pytest.mark.parametrize(("name", "restore", "golden"), CODECS, ids=[c[0] for c in CODECS])
@given(data=st.data())
@settings(max_examples=60)
def test_a_truncated_or_extended_snapshot_is_a_state_error(
    name: str, restore: Callable[[bytes], Any], golden: Callable[[], bytes], data: st.DataObject
) -> None:
    blob = golden()
    cut = data.draw(st.integers(0, len(blob) - 1))
    for damaged in (blob[:cut], blob + data.draw(st.binary(min_size=1, max_size=9))):
        with pytest.raises(SegmentationError) as info:
            restore(damaged)
        assert info.value.reason == Reason.STATE_ERROR


@pytest.mark.parametrize(("name", "restore", "golden"), CODECS, ids=[c[0] for c in CODECS])
@given(data=st.data())
@settings(max_examples=60)
def test_a_flipped_bit_in_a_snapshot_is_a_state_error_or_harmless(
    name: str, restore: Callable[[bytes], Any], golden: Callable[[], bytes], data: st.DataObject
) -> None:
    raw = bytearray(golden())
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] ^= 1 << data.draw(st.integers(0, 7))
    try:
        restore(bytes(raw))
    except SegmentationError as err:
        assert err.reason == Reason.STATE_ERROR


# ---------------------------------------------------------------- golden snapshots
# What the codecs write for assembler_state(), resequencer() and ordered_state(); RESEQUENCER_1 is
# RESEQUENCER_2 in version 1 (the same document without "timers").
ASSEMBLER = bytes.fromhex(
    "534741530100000000000001727b2267726f757073223a205b7b226964223a202236383638363836383638363836383638363836"
    "3836383638363836383638363836383638363836383638363836383638222c202266697273745f7365656e223a203130302e302c"
    "20226475706c696361746573223a207b2231223a20307d2c202264656c697665726564223a205b5d2c202266696e676572707269"
    "6e7473223a205b5d2c20226c6173745f736571223a206e756c6c2c20227365676d656e7473223a20312c20226f726967696e7322"
    "3a205b5b227030222c20375d5d7d5d2c2022636c6f736564223a205b5b2236343634363436343634363436343634363436343634"
    "3634363436343634363436343634363436343634363436343634222c2022636f6d706c657465222c205b5b312c20302c20342c20"
    "3237313434323039312c20305d5d2c206e756c6c2c2066616c73655d5d2c2022706172746974696f6e73223a205b5b227030222c"
    "206e756c6c2c20372c205b5d2c205b5d5d5d7d000000000000006053474d54010100000054000000000002686868686868686868"
    "686868686868686868686868686868000000010000000c0000000000000000000000000000003c000000000000003c74a0628a00"
    "0000004190177f68656c642d68656c642d6865"
)

RESEQUENCER_2 = bytes.fromhex(
    "5253455102000000000000027d7b2267726f757073223a5b7b226b6579223a5b2273222c2261225d2c22696e7374616e6365223a"
    "312c227068617365223a2272756e6e696e67222c227374617274223a302c22656e64223a6e756c6c2c226e657874223a312c2265"
    "78706972696e67223a66616c73652c22706f736974696f6e223a312c22636f756e7473223a5b312c302c302c305d2c2267617073"
    "223a5b5d2c22666c6f6f72223a6e756c6c2c22646561646c696e65223a362e302c2268656c64223a5b5b322c302c325d5d7d2c7b"
    "226b6579223a5b2262222c223632225d2c22696e7374616e6365223a312c227068617365223a2272756e6e696e67222c22737461"
    "7274223a302c22656e64223a6e756c6c2c226e657874223a312c226578706972696e67223a66616c73652c22706f736974696f6e"
    "223a312c22636f756e7473223a5b312c302c302c305d2c2267617073223a5b5d2c22666c6f6f72223a6e756c6c2c22646561646c"
    "696e65223a362e302c2268656c64223a5b5b322c322c325d5d7d2c7b226b6579223a5b2269222c375d2c22696e7374616e636522"
    "3a312c227068617365223a2272756e6e696e67222c227374617274223a302c22656e64223a6e756c6c2c226e657874223a302c22"
    "6578706972696e67223a66616c73652c22706f736974696f6e223a302c22636f756e7473223a5b302c302c302c305d2c22676170"
    "73223a5b5d2c22666c6f6f72223a6e756c6c2c22646561646c696e65223a362e302c2268656c64223a5b5b312c302c325d5d7d5d"
    "2c2277616974696e67223a5b312c302c325d2c22636c6f736564223a5b5d2c2274696d657273223a5b5b226f222c312c362e305d"
    "2c5b226f222c302c362e305d2c5b226f222c322c362e305d5d7d613262323731"
)

RESEQUENCER_1 = bytes.fromhex(
    "5253455101000000000000024e7b2267726f757073223a5b7b226b6579223a5b2273222c2261225d2c22696e7374616e6365223a"
    "312c227068617365223a2272756e6e696e67222c227374617274223a302c22656e64223a6e756c6c2c226e657874223a312c2265"
    "78706972696e67223a66616c73652c22706f736974696f6e223a312c22636f756e7473223a5b312c302c302c305d2c2267617073"
    "223a5b5d2c22666c6f6f72223a6e756c6c2c22646561646c696e65223a362e302c2268656c64223a5b5b322c302c325d5d7d2c7b"
    "226b6579223a5b2262222c223632225d2c22696e7374616e6365223a312c227068617365223a2272756e6e696e67222c22737461"
    "7274223a302c22656e64223a6e756c6c2c226e657874223a312c226578706972696e67223a66616c73652c22706f736974696f6e"
    "223a312c22636f756e7473223a5b312c302c302c305d2c2267617073223a5b5d2c22666c6f6f72223a6e756c6c2c22646561646c"
    "696e65223a362e302c2268656c64223a5b5b322c322c325d5d7d2c7b226b6579223a5b2269222c375d2c22696e7374616e636522"
    "3a312c227068617365223a2272756e6e696e67222c227374617274223a302c22656e64223a6e756c6c2c226e657874223a302c22"
    "6578706972696e67223a66616c73652c22706f736974696f6e223a302c22636f756e7473223a5b302c302c302c305d2c22676170"
    "73223a5b5d2c22666c6f6f72223a6e756c6c2c22646561646c696e65223a362e302c2268656c64223a5b5b312c302c325d5d7d5d"
    "2c2277616974696e67223a5b312c302c325d2c22636c6f736564223a5b5d7d613262323731"
)

ORDERED = bytes.fromhex(
    "53474f47010000000000000220534741530100000000000001ab7b2267726f757073223a205b7b226964223a2022363136313631"
    "363136313631363136313631363136313631363136313631363136313631363136313631363136313631222c202266697273745f"
    "7365656e223a20302c20226475706c696361746573223a207b2232223a20307d2c202264656c697665726564223a205b335d2c20"
    "2266696e6765727072696e7473223a205b5b332c20302c2031322c20323532313933343136302c2031385d2c205b332c2031322c"
    "2031322c20323532313933343136302c2031385d2c205b332c2032342c2031322c20323532313933343136302c2031385d2c205b"
    "332c2033362c2031322c20323532313933343136302c2031385d2c205b332c2034382c2031322c20323532313933343136302c20"
    "31385d2c205b332c2036302c2031322c20323532313933343136302c2031385d2c205b332c2037322c20382c2032373338383932"
    "3430352c2032305d5d2c20226c6173745f736571223a20332c20227365676d656e7473223a20312c20226f726967696e73223a20"
    "5b5d7d5d2c2022636c6f736564223a205b5d2c2022706172746974696f6e73223a205b5d7d000000000000006053474d54010100"
    "00005400000000000a616161616161616161616161616161616161616161616161000000020000000c0000000000000000000000"
    "00000000500000000000000050ad761a76000000008b59bcd26132613261326132613261325253455102000000000000011f7b22"
    "67726f757073223a5b7b226b6579223a5b2262222c22363136313631363136313631363136313631363136313631363136313631"
    "363136313631363136313631363136313631225d2c22696e7374616e6365223a312c227068617365223a2272756e6e696e67222c"
    "227374617274223a312c22656e64223a332c226e657874223a312c226578706972696e67223a66616c73652c22706f736974696f"
    "6e223a302c22636f756e7473223a5b302c302c302c305d2c2267617073223a5b5d2c22666c6f6f72223a6e756c6c2c2264656164"
    "6c696e65223a352c2268656c64223a5b5b332c38302c3137305d5d7d5d2c2277616974696e67223a5b305d2c22636c6f73656422"
    "3a5b5d2c2274696d657273223a5b5b226f222c302c355d5d7d000000565b22363136313631363136313631363136313631363136"
    "313631363136313631363136313631363136313631363136313631222c332c32302c372c302c38302c38302c3432363935303634"
    "34392c5b5d2c6e756c6c5d6133613361336133613361336133613361336133613361336133613361336133613361336133613361"
    "336133613361336133613361336133613361336133613361336133613361336133613361336133"
)
