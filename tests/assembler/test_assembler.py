"""The assembler's rules, one named case each: what comes out for each kind of input."""

from __future__ import annotations

import json
import os
import random
import struct
from typing import Any

import pytest
import zstandard

from reassembly import (
    Assembler,
    Cause,
    ChecksumMismatch,
    ConflictingDuplicate,
    Duplicate,
    GroupComplete,
    GroupFailed,
    Late,
    Limits,
    MessageComplete,
    MessageFailed,
    Rejected,
    Unfinished,
    reassemble,
    reassemble_all,
)
from segmenter import (
    ChecksumAlgorithm,
    Codec,
    IncompleteError,
    MsgFlags,
    Reason,
    Segment,
    SegmentationError,
    Segmenter,
    segment,
    segment_group,
)
from segmenter.wire import UNKNOWN_LENGTH, make_header


class FakeClock:
    """An injected clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def encoded(payload: bytes, size: int = 200, **kw: object) -> list[bytes]:
    return [s.encode() for s in segment(payload, size, **kw)]  # type: ignore[arg-type]


def kinds(events: list[object]) -> list[str]:
    return [type(e).__name__ for e in events]


def rebuild(seg: Segment, **changes: object) -> Segment:
    """A segment whose header fields were changed by a (buggy or hostile) producer."""
    h = seg.header._replace(**changes)  # type: ignore[arg-type]
    return Segment(h, seg.data)


def test_in_order_and_reverse_and_shuffled_give_the_payload() -> None:
    payload = os.urandom(5000)
    segs = encoded(payload)
    for order in (segs, segs[::-1], random.Random(3).sample(segs, len(segs))):
        events = Assembler().receive_many(order)
        assert kinds(events) == ["MessageComplete"]
        assert events[0].payload == payload
        assert events[0].segments == len(segs)


def test_identical_duplicate_is_counted_and_ignored() -> None:
    segs = encoded(os.urandom(1000))
    asm = Assembler()
    events = asm.receive_many([segs[0], segs[0], *segs[1:]])
    assert kinds(events) == ["Duplicate", "MessageComplete"]
    assert isinstance(events[0], Duplicate) and events[0].offset == 0
    assert events[1].duplicates == 1


def test_conflicting_duplicate_keeps_the_first_copy() -> None:
    payload = os.urandom(1000)
    segs = segment(payload, 200)
    evil = Segment(make_header(**_fields(segs[1], data=b"x" * len(segs[1].data))), b"x" * len(segs[1].data))
    events = Assembler().receive_many([segs[1], evil, *[s for i, s in enumerate(segs) if i != 1]])
    assert isinstance(events[0], ConflictingDuplicate)
    assert events[0].reason == Reason.CONFLICTING_DUPLICATE
    assert events[0].raw == evil.encode()
    assert isinstance(events[-1], MessageComplete) and events[-1].payload == payload


def _fields(seg: Segment, **over: object) -> dict[str, object]:
    h = seg.header
    base: dict[str, object] = dict(
        group_id=h.group_id,
        msg_seq_number=h.msg_seq_number,
        offset=h.offset,
        data=seg.data,
        original_length=h.original_length,
        stored_length=h.stored_length,
        msg_flags=h.msg_flags,
        codec=h.codec,
        algorithm=h.algorithm,
        message_checksum=h.message_checksum,
    )
    base.update(over)
    return base


def test_gap_reports_exact_missing_byte_range() -> None:
    payload = os.urandom(1000)
    segs = segment(payload, 200)  # 116 data bytes per segment
    asm = Assembler()
    asm.receive_many([s for i, s in enumerate(segs) if i not in (2, 3)])
    (event,) = asm.close()
    assert isinstance(event, Unfinished) and event.cause == Cause.CLOSED
    assert event.reason == Reason.INCOMPLETE_MSG
    assert event.gaps[0].missing_ranges == ((232, 464),)
    assert len(event.segments) == len(segs) - 2


def test_missing_last_segment_with_unknown_length_reports_open_tail() -> None:
    w = Segmenter(200).message_writer()
    segs = w.write(os.urandom(1000)) + w.close()
    asm = Assembler()
    asm.receive_many(segs[:-1])
    (event,) = asm.close()
    ranges = event.gaps[0].missing_ranges
    assert ranges == ((segs[-1].header.offset, None),)
    assert event.gaps[0].last_segment_seen is False


def misfits(segs: list[Segment], odd: Segment) -> list[Rejected]:
    """A misfit is judged when its message is: rejected with its reason, the message still delivered."""
    events = Assembler().receive_many([segs[0], odd, *segs[1:]])
    assert kinds(events)[-1] == "MessageComplete"
    return [e for e in events if isinstance(e, Rejected)]


def test_overlap_is_rejected_with_offset_error() -> None:
    segs = segment(os.urandom(1000), 200)
    shifted = Segment(make_header(**_fields(segs[1], offset=segs[1].header.offset - 10)), segs[1].data)
    (rejected,) = misfits(segs, shifted)
    assert rejected.reason == Reason.OFFSET_ERROR and rejected.raw == shifted.encode()


def test_repeated_last_segment_flag_is_rejected() -> None:
    segs = segment(os.urandom(1000), 200)
    fake_last = Segment(
        make_header(**_fields(segs[1], msg_flags=MsgFlags.LAST_SEGMENT, stored_length=segs[1].header.end)),
        segs[1].data,
    )
    asm = Assembler()
    events = asm.receive_many([segs[-1], fake_last])
    assert events[-1].reason in (Reason.MSG_FLAGS_ERROR, Reason.ORIGINAL_LENGTH_ERROR)


def test_wrong_original_length_between_segments() -> None:
    segs = segment(os.urandom(1000), 200)
    liar = Segment(make_header(**_fields(segs[1], original_length=999, stored_length=999)), segs[1].data)
    (rejected,) = misfits(segs, liar)
    assert rejected.reason == Reason.ORIGINAL_LENGTH_ERROR


def test_data_bit_flip_is_a_checksum_mismatch_naming_the_segment() -> None:
    segs = encoded(os.urandom(1000))
    bad = bytearray(segs[3])
    bad[-5] ^= 0x10
    events = Assembler().receive(bytes(bad))
    assert isinstance(events[0], ChecksumMismatch)
    assert events[0].reason == Reason.DATA_CHECKSUM_ERROR
    assert events[0].error.details["offset"] == 3 * 116
    assert events[0].raw == bytes(bad)


def test_message_checksum_mismatch_fails_the_message() -> None:
    payload = os.urandom(1000)
    segs = segment(payload, 200)
    lied = [
        Segment(
            make_header(
                **_fields(
                    s, message_checksum=None if s.header.message_checksum is None else s.header.message_checksum ^ 1
                )
            ),
            s.data,
        )
        for s in segs
    ]
    events = Assembler().receive_many(lied)
    assert isinstance(events[-1], MessageFailed)
    assert events[-1].reason == Reason.MESSAGE_CHECKSUM_ERROR
    assert len(events[-1].segments) == len(segs)


def test_zero_length_middle_segment_is_2253() -> None:
    segs = segment(os.urandom(1000), 200)
    empty = Segment(make_header(**_fields(segs[1], data=b"")), b"")
    events = Assembler().receive(empty)
    assert events[0].reason == Reason.SEGMENT_LENGTH_ZERO


def test_declared_size_above_limit_is_2030_without_allocation() -> None:
    seg = segment(b"abc", 200)[0]
    huge = Segment(
        make_header(**_fields(seg, original_length=2**62, stored_length=2**62, msg_flags=MsgFlags.SEGMENT)), seg.data
    )
    events = Assembler(Limits(max_message_size=1 << 20)).receive(huge)
    assert events[0].reason == Reason.MSG_TOO_BIG


def test_zstd_bomb_is_bounded_by_original_length() -> None:
    bomb = zstandard.ZstdCompressor().compress(bytes(50_000_000))
    h = make_header(
        group_id=b"b" * 24,
        msg_seq_number=1,
        offset=0,
        data=bomb,
        original_length=4096,
        stored_length=len(bomb),
        msg_flags=0,
        codec=Codec.ZSTD,
        algorithm=ChecksumAlgorithm.CRC32,
        message_checksum=0,
    )
    (event,) = Assembler().receive(Segment(h, bomb))
    assert isinstance(event, MessageFailed) and event.reason == Reason.DECOMPRESSION_ERROR
    assert event.error.details["declared"] == 4096


def test_garbage_is_rejected_not_raised() -> None:
    for raw in (b"", b"SGMT", os.urandom(300), b"SGMT\x01" + bytes(200)):
        (event,) = Assembler().receive(raw)
        assert isinstance(event, Rejected) and event.raw == raw


def shapes(raw: bytes) -> list[memoryview]:
    """``raw`` as buffers whose items are not its bytes one after another: strided (read-only and
    writable), typed (4-byte items) and two-dimensional."""
    doubled = bytes(b for c in raw for b in (c, 0))
    out = [memoryview(doubled)[::2], memoryview(bytearray(doubled))[::2]]
    if len(raw) % 4 == 0:
        out += [memoryview(raw).cast("I"), memoryview(raw).cast("B", (4, len(raw) // 4))]
    return out


def test_any_buffer_shape_is_read_as_its_bytes() -> None:
    """A strided read-only view must not make the decoders raise BufferError (not our exception),
    nor a typed one be counted in items: every shape decodes, judges and fails as its bytes do."""
    from segmenter.wire import check_prefix, decode_header, decode_segment

    payload = os.urandom(400)
    raws = encoded(payload, 200)
    flipped = bytearray(raws[0])
    flipped[150] ^= 1
    assert len(raws[0]) % 4 == 0 and len(flipped) % 4 == 0
    for raw in [*raws, bytes(flipped), b"SGMT\x01" + bytes(95)]:
        for shaped in shapes(raw):
            for decode in (check_prefix, decode_header, lambda b: decode_segment(b).header):
                try:
                    expected: object = decode(raw)
                except SegmentationError as exc:
                    with pytest.raises(type(exc)):
                        decode(shaped)
                else:
                    assert decode(shaped) == expected
    for shaped in zip(*(shapes(r) for r in raws[:-1]), strict=True):
        asm = Assembler()
        events = [e for view in shaped for e in asm.receive(view)] + asm.receive(raws[-1])
        assert kinds(events) == ["MessageComplete"] and bytes(events[0].payload) == payload
    for shaped in shapes(bytes(flipped)):
        (bad,) = Assembler().receive(shaped)
        assert isinstance(bad, ChecksumMismatch) and bad.raw == bytes(flipped)


# ------------------------------------------------------------------ groups
def ibm_group() -> tuple[list[bytes], list[Segment]]:
    payloads = [os.urandom(300), os.urandom(200), os.urandom(50), os.urandom(300)]
    return payloads, segment_group(payloads, 200)


def test_unit_of_work_delivers_the_whole_group_in_order_only_at_the_end() -> None:
    payloads, segs = ibm_group()
    shuffled = random.Random(7).sample(segs, len(segs))
    asm = Assembler()
    events = asm.receive_many(shuffled)
    assert kinds(events) == ["GroupComplete"]
    group = events[0]
    assert isinstance(group, GroupComplete)
    assert [m.msg_seq_number for m in group.messages] == [1, 2, 3, 4]
    assert [bytes(m.payload) for m in group.messages] == payloads


def test_message_mode_delivers_each_message_as_it_completes() -> None:
    _payloads, segs = ibm_group()
    asm = Assembler(unit_of_work=False)
    events = asm.receive_many(segs)
    assert kinds(events) == ["MessageComplete"] * 4
    assert asm.open_groups == 0
    again = asm.receive(segs[0].encode())
    assert isinstance(again[0], Duplicate)  # identical to what was delivered: redelivery


def test_redelivery_after_completion_is_a_duplicate_and_a_changed_copy_a_conflict() -> None:
    payload = os.urandom(1000)
    segs = segment(payload, 200)
    asm = Assembler()
    assert isinstance(asm.receive_many(segs)[-1], MessageComplete)
    assert isinstance(asm.receive(segs[2])[0], Duplicate)
    changed = Segment(make_header(**_fields(segs[2], data=b"z" * len(segs[2].data))), b"z" * len(segs[2].data))
    assert isinstance(asm.receive(changed)[0], ConflictingDuplicate)
    restored = Assembler.restore(asm.snapshot())
    assert isinstance(restored.receive(segs[2])[0], Duplicate)


def test_missing_message_in_group_is_2241_with_its_number() -> None:
    _, segs = ibm_group()
    asm = Assembler()
    asm.receive_many([s for s in segs if s.header.msg_seq_number != 2])
    (event,) = asm.close()
    assert event.reason == Reason.INCOMPLETE_GROUP
    assert event.missing_seq_numbers == (2,)
    assert event.last_seq_number == 4


def test_incomplete_message_in_group_prefers_2242() -> None:
    _, segs = ibm_group()
    asm = Assembler()
    asm.receive_many(segs[1:])
    (event,) = asm.close()
    assert event.reason == Reason.INCOMPLETE_MSG
    assert event.gaps[0].msg_seq_number == 1 and event.gaps[0].missing_ranges == ((0, 116),)


def test_sequence_number_beyond_last_is_2250() -> None:
    _, segs = ibm_group()
    beyond = Segment(make_header(**_fields(segs[5], msg_seq_number=9)), segs[5].data)
    asm = Assembler()
    asm.receive_many(segs[6:])  # message 4 carries LAST_MSG_IN_GROUP
    (event,) = asm.receive(beyond)
    assert event.reason == Reason.MSG_SEQ_NUMBER_ERROR


def test_repeated_last_message_flag_is_2249() -> None:
    _, segs = ibm_group()
    other_last = Segment(make_header(**_fields(segs[5], msg_flags=MsgFlags.LAST_MSG_IN_GROUP)), segs[5].data)
    asm = Assembler()
    asm.receive_many(segs[6:])
    (event,) = asm.receive(other_last)
    assert event.reason in (Reason.MSG_FLAGS_ERROR, Reason.MSG_SEQ_NUMBER_ERROR)


def test_group_flags_disagreeing_is_rejected() -> None:
    _, segs = ibm_group()
    first = segs[0].header
    ungrouped = rebuild(segs[0], msg_flags=first.msg_flags & ~(MsgFlags.MSG_IN_GROUP | MsgFlags.LAST_MSG_IN_GROUP))
    asm = Assembler()
    asm.receive(segs[0])
    (event,) = asm.receive(ungrouped)
    assert event.reason == Reason.MSG_FLAGS_ERROR
    (event,) = asm.receive(rebuild(segs[5], msg_flags=MsgFlags.NONE))  # not in a group, yet not number 1
    assert event.reason == Reason.MSG_SEQ_NUMBER_ERROR


def test_failed_message_fails_the_whole_group() -> None:
    _, segs = ibm_group()
    lied = [
        Segment(make_header(**_fields(s, message_checksum=1)), s.data) if s.header.msg_seq_number == 3 else s
        for s in segs
    ]
    events = Assembler().receive_many(lied)
    assert kinds(events) == ["GroupFailed"]
    failed = events[0]
    assert isinstance(failed, GroupFailed) and failed.failed[0].msg_seq_number == 3
    assert len(failed.segments) + sum(len(f.segments) for f in failed.failed) == len(segs)


# ------------------------------------------------------------------ limits
def test_expiry_uses_the_injected_clock() -> None:
    clock = FakeClock()
    asm = Assembler(Limits(expiry_seconds=30), clock=clock)
    segs = encoded(os.urandom(1000))
    asm.receive_many(segs[:2])
    clock.now += 29
    assert asm.expire() == []
    clock.now += 2
    (event,) = asm.expire()
    assert isinstance(event, Unfinished) and event.cause == Cause.EXPIRED and len(event.segments) == 2
    late = asm.receive(segs[3])
    assert isinstance(late[0], Late)


def test_expiry_needs_a_clock() -> None:
    with pytest.raises(SegmentationError):
        Assembler(Limits(expiry_seconds=1))


def test_buffer_limit_evicts_oldest_group_and_returns_its_bytes() -> None:
    a, b = encoded(os.urandom(1000)), encoded(os.urandom(1000))
    asm = Assembler(Limits(max_buffered_bytes=700))
    asm.receive_many(a[:5])  # 580 bytes held
    events = asm.receive_many(b[:2])
    evicted = [e for e in events if isinstance(e, Unfinished)]
    assert len(evicted) == 1 and evicted[0].cause == Cause.EVICTED
    assert evicted[0].segments == tuple(a[:5])
    assert asm.buffered_bytes <= 700


def test_open_group_limit_evicts_oldest() -> None:
    msgs = [encoded(os.urandom(500)) for _ in range(3)]
    asm = Assembler(Limits(max_open_groups=2))
    events = asm.receive_many([m[0] for m in msgs])
    assert kinds(events) == ["Unfinished"] and events[0].cause == Cause.EVICTED
    assert asm.open_groups == 2


def test_a_group_whose_age_equals_the_expiry_is_kept() -> None:
    clock = FakeClock()
    asm = Assembler(Limits(expiry_seconds=30), clock=clock)
    a = encoded(os.urandom(500))
    asm.receive(a[0])
    clock.now += 30
    assert asm.expire() == [] and asm.open_groups == 1
    clock.now = clock.now + 1e-6
    (gone,) = asm.expire()
    assert isinstance(gone, Unfinished) and gone.cause == Cause.EXPIRED


def test_a_message_complete_in_its_own_call_never_evicts() -> None:
    a, b = encoded(os.urandom(500)), encoded(os.urandom(500))
    one = encoded(os.urandom(50))
    assert len(one) == 1
    asm = Assembler(Limits(max_open_groups=2))
    asm.receive_many([a[0], b[0]])  # exactly at the limit
    assert kinds(asm.receive(one[0])) == ["MessageComplete"]
    assert asm.open_groups == 2
    c = encoded(os.urandom(500))
    evicted = [e for e in asm.receive(c[0]) if isinstance(e, Unfinished)]
    assert [e.segments for e in evicted] == [(a[0],)]


def test_snapshot_restore_continues_where_it_stopped() -> None:
    clock = FakeClock()
    payload = os.urandom(3000)
    segs = encoded(payload)
    asm = Assembler(clock=clock)
    asm.receive_many([segs[0], segs[0], *segs[1:10]])
    restored = Assembler.restore(asm.snapshot(), clock=clock)
    events = restored.receive_many(segs[10:])
    assert isinstance(events[-1], MessageComplete)
    assert events[-1].payload == payload and events[-1].duplicates == 1


def test_corrupt_snapshot_is_a_library_error() -> None:
    with pytest.raises(SegmentationError):
        Assembler.restore(b"SGAS\x01" + bytes(20))


def _forged_snapshot(blob: bytes, change: Any) -> bytes:
    """The snapshot with its JSON document changed by ``change`` (the held segments kept)."""
    (n,) = struct.unpack_from(">Q", blob, 5)
    meta = json.loads(blob[13 : 13 + n])
    change(meta)
    doc = json.dumps(meta).encode()
    return blob[:5] + struct.pack(">Q", len(doc)) + doc + blob[13 + n :]


def test_a_forged_snapshot_document_is_refused_at_restore_never_later() -> None:
    """A segment count no blob could hold is refused before anything is sized by it (a list of 2^40
    entries would be a MemoryError; 2^63 an OverflowError); positions that could not have been written
    (a missing settled position, positions of one partition that do not compare) are refused at
    restore, not by a later receive."""
    segs = encoded(os.urandom(3000))
    asm = Assembler()
    asm.receive(segs[0], position=1, partition="p")
    blob = asm.snapshot()
    assert Assembler.restore(blob).open_groups == 1

    def count(n: int) -> Any:
        def change(meta: dict[str, Any]) -> None:
            meta["groups"][0]["segments"], meta["groups"][0]["origins"] = n, []

        return change

    def partition(floor: Any, settled: list[Any]) -> Any:
        def change(meta: dict[str, Any]) -> None:
            meta["partitions"][0][1], meta["partitions"][0][3] = floor, settled

        return change

    for change in (count(2**63), count(2**40), count(2), partition("zz", []), partition(None, [None]),
                   partition(None, "12"), partition(0, [1, "x"])):  # fmt: skip
        with pytest.raises(SegmentationError) as refused:
            Assembler.restore(_forged_snapshot(blob, change))
        assert refused.value.reason == Reason.STATE_ERROR


# --------------------------------------------------------------- one-shot
def test_one_shot_reassemble_and_errors() -> None:
    payload = os.urandom(2000)
    segs = encoded(payload, codec=Codec.ZSTD)
    assert reassemble(segs) == payload
    with pytest.raises(IncompleteError) as info:
        reassemble(segs[:-1])
    assert info.value.reason == Reason.INCOMPLETE_MSG
    payloads, group = ibm_group()
    assert reassemble_all(group) == payloads


def test_streamed_message_with_unknown_lengths_reassembles() -> None:
    for codec in (Codec.NONE, Codec.ZSTD):
        w = Segmenter(300, codec=codec).message_writer()
        payload = os.urandom(20_000)
        segs = [s for i in range(0, len(payload), 999) for s in w.write(payload[i : i + 999])] + w.close()
        assert segs[0].header.stored_length == UNKNOWN_LENGTH
        assert reassemble(random.Random(1).sample(segs, len(segs))) == payload


# --------------------------------------------------------------- file adapter
def test_file_round_trip_through_write_segments_and_read_events(tmp_path: object) -> None:
    from pathlib import Path

    from reassembly import read_events
    from segmenter import write_segments

    path = Path(str(tmp_path)) / "segments.bin"
    payloads = [os.urandom(n) for n in (0, 1, 5000, 70_000)]
    with path.open("wb") as f:
        for p in payloads:
            write_segments(f, Segmenter(4096, codec=Codec.ZSTD).segment(p))
        write_segments(f, segment_group(payloads, 1000))
    with path.open("rb") as f:
        events = list(read_events(f, chunk_size=777))
    singles = [bytes(e.payload) for e in events if isinstance(e, MessageComplete)]
    groups = [e for e in events if isinstance(e, GroupComplete)]
    assert singles == payloads
    assert [bytes(m.payload) for m in groups[0].messages] == payloads


def test_truncated_file_raises_library_error(tmp_path: object) -> None:
    from pathlib import Path

    from reassembly import read_events
    from segmenter import write_segments

    path = Path(str(tmp_path)) / "cut.bin"
    with path.open("wb") as f:
        write_segments(f, segment(os.urandom(3000), 1000))
    path.write_bytes(path.read_bytes()[:-10])
    with path.open("rb") as f, pytest.raises(SegmentationError):
        list(read_events(f))


def test_a_file_with_a_damaged_data_part_is_read_on_past_it() -> None:
    """A data checksum failure moves no boundary: the file reader frames the segment, the assembler
    reports it (ChecksumMismatch with its original bytes), and what follows is still read."""
    import io

    from reassembly import read_events

    a = [s.encode() for s in segment(b"A" * 300, 184)]
    b = bytearray(segment(b"B" * 300, 184)[0].encode())
    b[-1] ^= 1
    for chunk in (1, 7, 1 << 20):
        events = list(read_events(io.BytesIO(a[0] + bytes(b) + b"".join(a[1:])), chunk_size=chunk))
        assert kinds(events) == ["ChecksumMismatch", "MessageComplete"]
        assert events[0].raw == bytes(b) and events[1].payload == b"A" * 300


def test_conflict_arriving_first_loses_to_the_copy_the_message_checksum_accepts() -> None:
    payload = os.urandom(1000)
    segs = segment(payload, 200)
    evil = Segment(make_header(**_fields(segs[1], data=b"x" * len(segs[1].data))), b"x" * len(segs[1].data))
    orders = [[evil, *segs], [*segs[:1], evil, *segs[1:]], random.Random(5).sample([evil, *segs], len(segs) + 1)]
    for order in orders:
        asm = Assembler(batch=True)  # order-independent: judged at close()
        assert asm.receive_many(order) == []
        events = asm.close()
        assert kinds(events) == ["ConflictingDuplicate", "MessageComplete"]
        assert events[0].raw == evil.encode() and events[1].payload == payload
    streaming = Assembler().receive_many([*segs[:1], evil, *segs[1:]])  # good copy arrives before completion
    assert kinds(streaming) == ["ConflictingDuplicate", "MessageComplete"]


def test_conflict_with_no_good_copy_fails_with_every_copy_returned() -> None:
    payload = os.urandom(1000)
    segs = segment(payload, 200)
    evil = Segment(make_header(**_fields(segs[1], data=b"x" * len(segs[1].data))), b"x" * len(segs[1].data))
    events = Assembler().receive_many([evil, *segs[:1], *segs[2:]])
    assert isinstance(events[-1], MessageFailed) and events[-1].reason == Reason.MESSAGE_CHECKSUM_ERROR
    assert len(events[-1].segments) == len(segs)


def test_a_writer_that_does_not_know_the_length_marks_every_segment_length_deferred() -> None:
    payload = os.urandom(1000)
    writer = Segmenter(200).message_writer()
    segs = [s for chunk in (payload[:500], payload[500:]) for s in writer.write(chunk)] + writer.close()
    assert len(segs) > 2 and all(s.header.length_deferred for s in segs)
    assert {s.header.original_length for s in segs[:-1]} == {UNKNOWN_LENGTH}
    assert reassemble([s.encode() for s in segs]) == payload
    known = Segmenter(200).message_writer(original_length=len(payload))
    segs = known.write(payload) + known.close()
    assert not any(s.header.length_deferred for s in segs)  # declared up front: routable by size


def test_unknown_original_length_without_the_deferred_flag_is_2252() -> None:
    seg = segment(os.urandom(500), 200)[0]
    bad = rebuild(seg, original_length=UNKNOWN_LENGTH)
    events = Assembler().receive(bad.encode())
    assert kinds(events) == ["Rejected"] and events[0].reason == Reason.ORIGINAL_LENGTH_ERROR


def test_deferred_flag_disagreeing_within_a_message_is_a_header_mismatch() -> None:
    segs = segment(os.urandom(500), 200)
    odd = rebuild(segs[1], length_deferred=True)
    (rejected,) = misfits(segs, odd)
    assert type(rejected) is Rejected and rejected.reason == Reason.HEADER_MISMATCH


def test_a_snapshot_restored_under_lower_limits_is_refused_not_thinned() -> None:
    """Restore holds every saved segment again; limits that would evict some of them make restore
    fail loudly (thinned silently, the evicted groups' segments would go nowhere)."""
    asm = Assembler()
    for _ in range(3):
        asm.receive(encoded(os.urandom(3000))[0])
    blob = asm.snapshot()
    for limits in (Limits(max_open_groups=1), Limits(max_buffered_bytes=300)):
        with pytest.raises(SegmentationError, match="under its own limits") as refused:
            Assembler.restore(blob, limits)
        assert refused.value.reason == Reason.STATE_ERROR
    assert Assembler.restore(blob, Limits(max_open_groups=3)).open_groups == 3


def test_a_deferred_length_segment_ending_past_the_size_limit_is_refused_before_any_store(tmp_path: Any) -> None:
    """A segment whose message length was deferred declares no size, so its offset is the only
    claim: past ``max_message_size`` it is a 2030 rejection, never a write at 2**62 into a body
    file (an OSError out of ``receive`` and a file left behind)."""
    from reassembly.storage.filestore import FileBodyStore
    from segmenter.wire import UNKNOWN_LENGTH

    def deferred(offset: int) -> bytes:
        h = make_header(group_id=b"F" * 24, msg_seq_number=1, offset=offset, data=b"xx",
                        original_length=UNKNOWN_LENGTH, stored_length=UNKNOWN_LENGTH, msg_flags=MsgFlags.SEGMENT,
                        codec=Codec.NONE, algorithm=ChecksumAlgorithm.CRC32, message_checksum=None)  # fmt: skip
        return h._replace(length_deferred=True).pack() + b"xx"

    store = FileBodyStore(tmp_path, token="t", threshold=0)
    for offset in (1 << 62, 1 << 44, (1 << 20) - 1):
        (ev,) = Assembler(Limits(max_message_size=1 << 20), bodies=store).receive(deferred(offset))
        assert isinstance(ev, Rejected) and ev.reason == Reason.MSG_TOO_BIG and ev.raw == deferred(offset)
    assert Assembler(Limits(max_message_size=1 << 20), bodies=store).receive(deferred((1 << 20) - 2)) == []


@pytest.mark.parametrize("between", [[], [3], [3, 4], [0]])
def test_a_refused_segment_never_makes_a_group_forget_what_it_delivered(between: list[int]) -> None:
    """unit_of_work=False: message 2 (the group's last) delivered, message 1 still missing, then a
    segment the group refuses (3: beyond the last), then another copy of message 2 with other bytes.
    The refusal must not drop the group (it holds no message) with what it delivered, which would
    deliver the copy a second time; it is a conflict whatever came between."""
    gid, s = b"R" * 24, Segmenter(200)

    def msg(seq: int, data: bytes, last: bool = False) -> list[bytes]:
        flags = MsgFlags.LAST_MSG_IN_GROUP if last else MsgFlags.MSG_IN_GROUP
        return [x.encode() for x in s.segment(data, group_id=gid, msg_seq_number=max(seq, 1), group_flags=flags)]

    asm = Assembler(unit_of_work=False)
    events = asm.receive_many(msg(2, b"version-1", last=True))
    for seq in between:
        events += asm.receive_many(msg(seq, b"other") if seq else [b"garbage"])
    events += asm.receive_many(msg(2, b"VERSION-2!", last=True))
    delivered = [bytes(e.payload) for e in events if isinstance(e, MessageComplete)]
    assert delivered == [b"version-1"]
    assert isinstance(events[-1], ConflictingDuplicate)
    events += asm.receive_many(msg(1, b"first")) + asm.close()
    assert [bytes(e.payload) for e in events if isinstance(e, MessageComplete)] == [b"version-1", b"first"]


def test_a_batch_assembler_snapshot_restores_into_a_batch_assembler() -> None:
    """A batch assembler holding a whole message (judged only at close) is restored with
    ``restore(blob, batch=True)``; without it the restore is refused, naming ``batch=False``."""
    payload = os.urandom(3000)
    segs = [s.encode() for s in segment(payload, 1100)]
    asm = Assembler(batch=True)
    assert asm.receive_many(segs) == []
    blob = asm.snapshot()
    with pytest.raises(SegmentationError, match="batch=False"):
        Assembler.restore(blob)
    restored = Assembler.restore(blob, batch=True)
    assert [bytes(e.payload) for e in restored.close() if isinstance(e, MessageComplete)] == [payload]
