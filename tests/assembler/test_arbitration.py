"""Arbitration: the outcome for a multiset of segments never depends on their order (batch mode),
and two assemblies that both pass every check are a conflict, never a guess."""

from __future__ import annotations

import os
import struct
import tempfile
import zlib
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reassembly import (
    Assembler,
    ConflictingDuplicate,
    Duplicate,
    GroupComplete,
    GroupFailed,
    MessageComplete,
    MessageFailed,
    Rejected,
    Unfinished,
)
from reassembly.assembler import Limits
from reassembly.assembler.bodies import StoredBody
from reassembly.assembler.events import Event
from reassembly.assembler.model import MAX_MISSING_LISTED
from reassembly.spark.rows import reassemble_group
from reassembly.storage.filestore import FileBodyStore
from segmenter import ChecksumAlgorithm, Codec, MsgFlags, Reason, Segment, segment, segment_group
from segmenter.checksum import checksum
from segmenter.wire import HEADER_LENGTH
from tests.support.accounting import accounted

GID = bytes(range(24))


# ---------------------------------------------------------------- hostile pieces
def forge_same_crc(algorithm: ChecksumAlgorithm, data: bytes, target: int) -> bytes:
    """Different bytes of the same length and the same CRC: the last 4 bytes solve a linear system."""
    assert len(data) >= 4
    base = bytearray(data[:-4]) + b"\0\0\0\0"
    zero = checksum(algorithm, bytes(len(base)))
    columns = []  # the CRC change each bit of the last 4 bytes causes
    for bit in range(32):
        probe = bytearray(len(base))
        probe[-4 + bit // 8] = 1 << (bit % 8)
        columns.append(checksum(algorithm, bytes(probe)) ^ zero)
    want = checksum(algorithm, bytes(base)) ^ target
    # Gaussian elimination over GF(2): find bits whose columns XOR to ``want``.
    rows = [(columns[b], 1 << b) for b in range(32)]
    pivots: list[tuple[int, int]] = []
    for value, combo in rows:
        for pv, pc in pivots:
            if value ^ pv < value:
                value, combo = value ^ pv, combo ^ pc
        if value:
            pivots.append((value, combo))
            pivots.sort(reverse=True)
    solution = 0
    for pv, pc in pivots:
        if want ^ pv < want:
            want, solution = want ^ pv, solution ^ pc
    assert want == 0
    fix = solution.to_bytes(4, "little")
    out = bytes(base[:-4]) + fix
    assert checksum(algorithm, out) == target and out != data
    return out


def same_crc_copy(seg: Segment) -> Segment:
    """A copy indistinguishable by any CRC: same length, same segment CRC, other bytes."""
    data = bytes(seg.data)
    other = forge_same_crc(seg.header.algorithm, bytes(b ^ 0x5A for b in data), seg.header.data_checksum)
    return Segment(seg.header, other)


def recomputed_copy(seg: Segment, fill: int) -> Segment:
    """Different data of the same length with its segment CRC recomputed (header resealed)."""
    data = bytes([fill]) * seg.header.data_length
    return Segment(seg.header._replace(data_checksum=checksum(seg.header.algorithm, data)), data)


def resealed(seg: Segment, **changes: Any) -> Segment:
    """A forged header (valid data CRC, header CRC resealed by ``pack``)."""
    return Segment(seg.header._replace(**changes), seg.data)


def with_extension(raw: bytes, extension: bytes) -> bytes:
    """The same segment with header-extension bytes (header_length > 84), as docs/concepts/wire-format.md allows:
    ``extension`` as the value of a record readers skip (type 0xC5)."""
    extension = struct.pack(">BH", 0xC5, len(extension)) + extension
    fields = bytearray(raw[:80])
    struct.pack_into(">H", fields, 8, HEADER_LENGTH + len(extension))
    head = bytes(fields) + extension
    return head + struct.pack(">I", zlib.crc32(head)) + raw[HEADER_LENGTH:]


# ---------------------------------------------------------------- summaries
def summary(ev: Event, store: Path | None = None) -> Any:
    """Everything an event says, bytes included (payloads, also from a body store; original segments)."""
    if isinstance(ev, MessageComplete):
        body = (store / ev.payload.location).read_bytes() if isinstance(ev.payload, StoredBody) else ev.payload
        return ("complete", ev.group_id, ev.msg_seq_number, bytes(body), ev.msg_flags, ev.segments,
                ev.duplicates, ev.stored_length, ev.original_length, ev.checksum)  # fmt: skip
    if isinstance(ev, GroupComplete):
        return ("group", ev.group_id, tuple(summary(m, store) for m in ev.messages))
    if isinstance(ev, Rejected):
        return (type(ev).__name__, ev.reason, ev.raw, ev.header, str(ev.error))
    if isinstance(ev, MessageFailed):
        return ("failed", ev.group_id, ev.msg_seq_number, ev.reason, ev.segments, str(ev.error))
    if isinstance(ev, GroupFailed):
        return ("group_failed", ev.group_id, ev.reason, tuple(summary(f) for f in ev.failed), ev.segments)
    if isinstance(ev, Unfinished):
        return ("unfinished", ev.group_id, ev.cause, ev.reason, ev.gaps, ev.missing_seq_numbers,
                ev.last_seq_number, ev.segments)  # fmt: skip
    assert isinstance(ev, Duplicate)
    return ("duplicate", ev)


def judged(order: Iterable[bytes], *, unit_of_work: bool = True, stored: bool = False) -> Counter[Any]:
    """Batch events as a multiset; ``stored``: every body in a FileBodyStore (the Spark large path)."""
    with tempfile.TemporaryDirectory() as tmp:
        store = FileBodyStore(tmp, "t", threshold=0) if stored else None
        asm = Assembler(batch=True, unit_of_work=unit_of_work, bodies=store)
        events = asm.receive_many(order)
        events += asm.close()
        if store is not None:
            store.close()
        return Counter(summary(e, Path(tmp)) for e in events)


# ---------------------------------------------------------------- the property
@st.composite
def landings(draw: st.DrawFn) -> list[bytes]:
    """A multiset of segments of one group: a message or an MQ group, plus hostile copies."""
    algorithm = draw(st.sampled_from(list(ChecksumAlgorithm)))
    codec = draw(st.sampled_from(list(Codec)))
    size = draw(st.integers(HEADER_LENGTH + 8, HEADER_LENGTH + 120))
    if draw(st.booleans()):
        payloads = draw(st.lists(st.binary(min_size=4, max_size=300), min_size=1, max_size=3))
        segs = segment_group(payloads, size, codec=codec, algorithm=algorithm, group_id=GID)
        if draw(st.booleans()):  # the same group cut at another size: re-segmentations
            segs += segment_group(payloads, draw(st.integers(HEADER_LENGTH + 8, 400)), codec=codec,
                                  algorithm=algorithm, group_id=GID)  # fmt: skip
    else:
        payload = draw(st.binary(min_size=4, max_size=400))
        segs = segment(payload, size, codec=codec, algorithm=algorithm, group_id=GID)
        if draw(st.booleans()):
            segs += segment(payload, draw(st.integers(HEADER_LENGTH + 8, 500)), codec=codec, algorithm=algorithm,
                            group_id=GID)  # fmt: skip
    pick = st.sampled_from(segs)
    out = [s.encode() for s in segs]
    for _ in range(draw(st.integers(0, 4))):
        seg = draw(pick)
        kind = draw(st.sampled_from(["dup", "same_crc", "recomputed", "shift", "length", "last", "flags", "ext",
                                     "drop", "flip", "seq", "group"]))  # fmt: skip
        h = seg.header
        if kind == "dup":
            out.append(seg.encode())
        elif kind == "same_crc" and h.data_length >= 4:
            out.append(same_crc_copy(seg).encode())
        elif kind == "recomputed":
            out.append(recomputed_copy(seg, draw(st.integers(0, 255))).encode())
        elif kind == "shift" and h.offset > 0:
            out.append(resealed(seg, offset=h.offset - draw(st.integers(1, h.offset))).encode())
        elif kind == "length" and h.data_length > 1:  # a shorter copy with a valid CRC
            cut = draw(st.integers(1, h.data_length - 1))
            data = bytes(seg.data)[:cut]
            out.append(Segment(h._replace(data_length=cut, data_checksum=checksum(h.algorithm, data)), data).encode())
        elif kind == "last":  # a forged LAST_SEGMENT ending early
            flags = (h.msg_flags | MsgFlags.SEGMENT | MsgFlags.LAST_SEGMENT) & 0x1F
            mcrc = h.message_checksum if h.message_checksum is not None else 0
            out.append(resealed(seg, msg_flags=flags, stored_length=h.end, message_checksum=mcrc).encode())
        elif kind == "flags":  # group flags flipped
            out.append(resealed(seg, msg_flags=h.msg_flags ^ MsgFlags.LAST_MSG_IN_GROUP).encode())
        elif kind in ("seq", "group"):  # renumbered (past the last message too), or other group flags
            seq = draw(st.integers(1, 6)) if kind == "seq" else h.msg_seq_number
            group = draw(st.sampled_from([0, 0x08, 0x18]))  # none, MSG_IN_GROUP, LAST_MSG_IN_GROUP too
            flags = (h.msg_flags & ~0x18) | group if kind == "group" else h.msg_flags
            copy, raw = resealed(seg, msg_seq_number=seq, msg_flags=flags).encode(), seg.encode()
            out = [copy if o == raw else o for o in out] if draw(st.booleans()) else [*out, copy]
        elif kind == "ext":
            out.append(with_extension(seg.encode(), draw(st.binary(min_size=1, max_size=12))))
        elif kind == "drop" and len(out) > 1:
            out.pop(draw(st.integers(0, len(out) - 1)))
        elif kind == "flip":
            raw = bytearray(seg.encode())
            raw[draw(st.integers(0, len(raw) - 1))] ^= 1 << draw(st.integers(0, 7))
            out.append(bytes(raw))
    return out


def same_events_in_any_order(segments: list[bytes], rnd: Any, unit_of_work: bool) -> None:
    shuffled = rnd.sample(segments, len(segments))
    expected = judged(segments, unit_of_work=unit_of_work)
    assert judged(shuffled, unit_of_work=unit_of_work) == expected
    assert judged(segments[::-1], unit_of_work=unit_of_work) == expected
    in_store = judged(shuffled, unit_of_work=unit_of_work, stored=True)  # bodies in files: the same outcome
    assert in_store == expected
    asm = Assembler(batch=True, unit_of_work=unit_of_work)
    accounted(shuffled, asm.receive_many(shuffled) + asm.close())


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(landings(), st.randoms(use_true_random=False), st.booleans())
def test_any_permutation_gives_the_same_events(segments: list[bytes], rnd: Any, unit_of_work: bool) -> None:
    same_events_in_any_order(segments, rnd, unit_of_work)


@pytest.mark.slow
@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(landings(), st.randoms(use_true_random=False), st.booleans())
def test_any_permutation_gives_the_same_events_many(segments: list[bytes], rnd: Any, unit_of_work: bool) -> None:
    same_events_in_any_order(segments, rnd, unit_of_work)


# ---------------------------------------------------------------- named cases
def all_orders(segs: list[bytes]) -> list[list[bytes]]:
    return [segs, segs[::-1], segs[1:] + segs[:1], segs[len(segs) // 2 :] + segs[: len(segs) // 2]]


def conflict_in_every_order(landing: list[bytes], *, detail: str = "") -> None:
    """Nothing delivered, whatever the order: one MessageFailed (9012) holding every copy."""
    for order in all_orders(landing):
        asm = Assembler(batch=True)
        events = asm.receive_many(order) + asm.close()
        assert len(events) == 1 and isinstance(events[0], MessageFailed), events
        assert events[0].reason == Reason.CONFLICTING_DUPLICATE and detail in str(events[0].error)
        assert sorted(events[0].segments) == sorted(landing)


def test_a_copy_with_the_same_crc_and_length_is_a_conflict_in_any_order() -> None:
    payload = os.urandom(1000)
    for algorithm in ChecksumAlgorithm:
        segs = segment(payload, HEADER_LENGTH + 200, algorithm=algorithm, group_id=GID)
        forged = same_crc_copy(segs[2])
        assert forged.header == segs[2].header and bytes(forged.data) != bytes(segs[2].data)
        landing = [s.encode() for s in segs] + [forged.encode()]
        conflict_in_every_order(landing)
        streaming = Assembler().receive_many(landing[-1:] + landing[:-1])  # both there before it completes
        assert [type(e).__name__ for e in streaming] == ["MessageFailed"]


def test_a_recomputed_copy_with_its_own_message_checksum_is_a_conflict() -> None:
    """One segment, forged whole: valid segment CRC and a message checksum that matches it."""
    (seg,) = segment(b"pay me 100", 4096, group_id=GID)
    data = b"pay me 999"
    crc = checksum(seg.header.algorithm, data)
    forged = Segment(seg.header._replace(data_checksum=crc, message_checksum=crc), data)
    conflict_in_every_order([seg.encode(), forged.encode()])


def test_a_recomputed_copy_that_fails_the_message_checksum_loses_in_any_order() -> None:
    payload = os.urandom(1000)
    segs = segment(payload, HEADER_LENGTH + 200, group_id=GID)
    forged = recomputed_copy(segs[1], 7)
    for order in all_orders([s.encode() for s in segs] + [forged.encode()]):
        asm = Assembler(batch=True)
        events = asm.receive_many(order) + asm.close()
        assert [type(e).__name__ for e in events] == ["ConflictingDuplicate", "MessageComplete"]
        assert isinstance(events[0], ConflictingDuplicate) and events[0].raw == forged.encode()
        assert isinstance(events[1], MessageComplete) and events[1].payload == payload


def test_a_zstd_message_with_a_same_crc_copy_is_still_a_conflict() -> None:
    """CRCs are linear: a same-CRC change to literal bytes survives decompression with the same
    message CRC too, so compression is no protection either."""
    payload = os.urandom(200) * 20
    segs = segment(payload, HEADER_LENGTH + 64, codec=Codec.ZSTD, group_id=GID)
    conflict_in_every_order([same_crc_copy(segs[1]).encode(), *(s.encode() for s in segs)])


def test_a_re_segmentation_of_the_same_body_is_one_assembly() -> None:
    payload = os.urandom(900)
    a = [s.encode() for s in segment(payload, HEADER_LENGTH + 200, group_id=GID)]
    b = [s.encode() for s in segment(payload, HEADER_LENGTH + 300, group_id=GID)]
    for order in all_orders(a + b):
        asm = Assembler(batch=True)
        events = asm.receive_many(order) + asm.close()
        complete = [e for e in events if isinstance(e, MessageComplete)]
        assert len(complete) == 1 and complete[0].payload == payload
        assert complete[0].segments == 3  # fewest segments wins
        assert {type(e) for e in events} - {MessageComplete} <= {Rejected, ConflictingDuplicate}
        accounted(order, events)


def test_too_many_combinations_are_a_conflict_whatever_the_order() -> None:
    payload = os.urandom(20 * 16)
    segs = segment(payload, HEADER_LENGTH + 16, group_id=GID)
    landing = [s.encode() for s in segs] + [recomputed_copy(s, 9).encode() for s in segs]  # 2**20 chains
    conflict_in_every_order(landing, detail="more than")


def test_copies_that_differ_only_in_header_extension_are_one_assembly() -> None:
    payload = os.urandom(20 * 16)
    segs = segment(payload, HEADER_LENGTH + 16, group_id=GID)
    landing = [s.encode() for s in segs] + [with_extension(s.encode(), b"x") for s in segs]  # same bytes
    results = set()
    for order in all_orders(landing):
        asm = Assembler(batch=True)
        events = asm.receive_many(order) + asm.close()
        assert [e.payload for e in events if isinstance(e, MessageComplete)] == [payload]
        accounted(order, events)
        results.add(frozenset(Counter(summary(e) for e in events).items()))
    assert len(results) == 1


def test_group_flags_are_judged_in_msg_seq_number_order() -> None:
    segs = segment_group([b"one", b"two", b"three"], 4096, group_id=GID)
    early_last = resealed(segs[1], msg_flags=segs[1].header.msg_flags | MsgFlags.LAST_MSG_IN_GROUP)
    landing = [s.encode() for s in segs] + [early_last.encode()]
    results = {frozenset(judged(order).items()) for order in all_orders(landing)}
    assert len(results) == 1


def message_row_in_both_orders(first: bytes, second: bytes, limits: Limits) -> dict[str, Any]:
    """The one message row the row layer (every Spark path's) reports, the same for both arrival orders."""
    rows = [reassemble_group(order, limits) for order in ([first, second], [second, first])]
    messages = [[r for r in out if r["kind"] == "message"] for out in rows]
    assert messages[0] == messages[1] and len(messages[0]) == 1
    assert sorted(map(repr, rows[0])) == sorted(map(repr, rows[1]))
    return messages[0][0]


def test_a_message_whose_every_copy_is_rejected_has_one_reason_in_any_order() -> None:
    """Found by the differential property: the row named the first rejection to arrive (9005 or 9007)."""
    (seg,) = segment(bytes(range(41)), 1000, group_id=GID)
    flipped = bytearray(seg.encode())
    flipped[-1] ^= 1  # data checksum fails: 9005
    truncated = seg.encode()[: HEADER_LENGTH + 24]  # 24 of 41 data bytes: 9007
    row = message_row_in_both_orders(bytes(flipped), truncated, Limits())
    assert (row["status"], row["reason"], row["rejected"]) == ("invalid", Reason.DATA_CHECKSUM_ERROR, 2)


def test_a_declared_size_above_the_limit_makes_it_too_big_in_any_order() -> None:
    big = segment(bytes(4100), 5000, group_id=GID)[0].encode()  # above max_message_size: 2030
    truncated = segment(bytes(41), 1000, group_id=GID)[0].encode()[: HEADER_LENGTH + 24]  # same message: 9007
    row = message_row_in_both_orders(big, truncated, Limits(max_message_size=4000))
    assert (row["status"], row["reason"], row["rejected"]) == ("too_big", Reason.MSG_TOO_BIG, 2)


# ---------------------------------------------------------------- original bytes
@pytest.mark.parametrize("unit_of_work", [True, False])
def test_a_forged_last_msg_seq_number_lists_a_bounded_number_of_missing_messages(unit_of_work: bool) -> None:
    """A LAST message claiming MsgSeqNumber 999,999,999 must not make the report walk (and allocate)
    every number below it: the listing is the lowest MAX_MISSING_LISTED, in any order, rows bounded alike."""
    first, _ = segment_group([b"one", b"two"], 4096, group_id=GID)
    forged = resealed(segment_group([b"x"], 4096, group_id=GID)[0], msg_seq_number=999_999_999).encode()
    landing = [first.encode(), forged]
    for order in all_orders(landing):
        asm = Assembler(unit_of_work=unit_of_work)
        for raw in order:
            asm.receive(raw)
        (ev,) = [e for e in asm.close() if isinstance(e, Unfinished)]
        assert ev.last_seq_number == 999_999_999
        assert ev.missing_seq_numbers == tuple(range(2, MAX_MISSING_LISTED + 2))
        rows = reassemble_group(order, Limits())
        assert len(rows) <= MAX_MISSING_LISTED + 2 * len(landing)  # a message and a quarantine row each


def test_a_segment_with_a_header_extension_comes_back_byte_for_byte() -> None:
    payload = os.urandom(500)
    segs = segment(payload, HEADER_LENGTH + 200, group_id=GID)
    skippable = bytes([0xC5, 0, 10]) + b"EXTENSION!"  # a TLV record readers skip (docs/concepts/wire-format.md)
    extended = [with_extension(s.encode(), skippable) for s in segs]
    assert Assembler().receive_many(extended)[-1].payload == payload  # type: ignore[union-attr]
    incomplete = Assembler()
    incomplete.receive_many(extended[:-1])
    (unfinished,) = incomplete.close()
    assert isinstance(unfinished, Unfinished) and sorted(unfinished.segments) == sorted(extended[:-1])
    forged = with_extension(recomputed_copy(segs[0], 1).encode(), b"more")
    events = Assembler().receive_many([forged, *extended])
    assert isinstance(events[0], ConflictingDuplicate) and events[0].raw == forged


def test_a_snapshot_keeps_the_original_bytes() -> None:
    segs = segment(os.urandom(500), HEADER_LENGTH + 200, group_id=GID)
    extended = [with_extension(s.encode(), b"kept") for s in segs]
    asm = Assembler()
    asm.receive_many(extended[:-1])
    (unfinished,) = Assembler.restore(asm.snapshot()).close()
    assert isinstance(unfinished, Unfinished) and sorted(unfinished.segments) == sorted(extended[:-1])


def test_quarantined_copies_are_the_bytes_that_arrived_also_from_a_body_store(tmp_path: Any) -> None:
    payload = os.urandom(3000)
    segs = segment(payload, HEADER_LENGTH + 500, group_id=GID)
    forged = with_extension(recomputed_copy(segs[2], 3).encode(), b"ext")
    shifted = resealed(segs[3], offset=segs[3].header.offset - 100).encode()
    landing = [with_extension(s.encode(), b"e") for s in segs] + [forged, shifted]
    for order in all_orders(landing):
        store = FileBodyStore(tmp_path / "bodies", "t", threshold=0)
        asm = Assembler(batch=True, bodies=store)
        events = asm.receive_many(order) + asm.close()
        store.close()
        back = sorted(e.raw for e in events if isinstance(e, Rejected))
        assert back == sorted([forged, shifted])
        (complete,) = [e for e in events if isinstance(e, MessageComplete)]
        location = complete.payload.location  # type: ignore[union-attr]
        assert (tmp_path / "bodies" / location).read_bytes() == payload


# ------------------------------------------- messages the group refuses, without a winner
def _renumbered(seg: Segment, seq: int, flags: int | None = None) -> bytes:
    return resealed(seg, msg_seq_number=seq, msg_flags=seg.header.msg_flags if flags is None else flags).encode()


def test_a_message_the_group_refuses_is_rejected_even_without_a_winner() -> None:
    """Batch: a message no candidate completes (one segment of it, or one failing its message
    checksum) that the group's winners refuse (numbered past the last message; group flags on a
    message not in a group) is rejected segment by segment with the group's reason: concluding the
    group without it once dropped it unreported. In every order, both group modes."""
    group = segment_group([b"a" * 400, b"b" * 100, b"c" * 500], HEADER_LENGTH + 300, group_id=GID)
    lone = segment(b"hello world" * 30, HEADER_LENGTH + 100, group_id=GID)
    in_group, last = int(MsgFlags.MSG_IN_GROUP), int(MsgFlags.MSG_IN_GROUP | MsgFlags.LAST_MSG_IN_GROUP)
    lying = resealed(lone[0], msg_seq_number=2, msg_flags=in_group | MsgFlags.SEGMENT, message_checksum=12345)
    whole = [s.encode() for s in group]
    cases = {
        "past the last message": ([*whole, _renumbered(group[0], 4)], Reason.MSG_SEQ_NUMBER_ERROR),
        "far past it": ([*whole, _renumbered(group[0], 999_999_999)], Reason.MSG_SEQ_NUMBER_ERROR),
        "group flags beside a lone message": (
            [s.encode() for s in lone] + [_renumbered(lone[0], 2, in_group | MsgFlags.SEGMENT)],
            Reason.MSG_FLAGS_ERROR,
        ),
        "last-in-group beside a lone message": (
            [s.encode() for s in lone] + [_renumbered(lone[-1], 2, last | MsgFlags.LAST_SEGMENT)],
            Reason.MSG_FLAGS_ERROR,
        ),
        "a failing grouped copy beside a lone message": ([s.encode() for s in lone] + [lying.encode()], None),
    }
    for name, (landing, reason) in cases.items():
        for unit_of_work in (True, False):
            outcomes = set()
            for order in all_orders(landing):
                asm = Assembler(batch=True, unit_of_work=unit_of_work)
                events = asm.receive_many(order) + asm.close()
                accounted(order, events)
                rejected = [e for e in events if isinstance(e, Rejected)]
                assert len(rejected) == 1 and rejected[0].raw == landing[-1], name
                assert reason is None or rejected[0].reason == reason, (name, rejected[0].reason)
                assert not [e for e in events if isinstance(e, (Unfinished, MessageFailed, GroupFailed))], name
                outcomes.add(tuple(sorted(map(repr, map(summary, events)))))
            assert len(outcomes) == 1, name


# ------------------------------------------------------------ snapshots of streaming state
def _streamed(asm: Assembler, order: list[bytes]) -> list[Any]:
    return [summary(e) for e in asm.receive_many(order)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(landings(), st.randoms(use_true_random=False), st.booleans(), st.data())
def test_a_snapshot_of_any_streaming_state_restores_and_continues_alike(
    segments: list[bytes], rnd: Any, unit_of_work: bool, data: st.DataObject
) -> None:
    """Whatever hostile segments a streaming assembler holds, its snapshot restores (the held
    segments are admitted again whatever order they arrived in) and the restored assembler then
    gives the same events as the original for the rest of the input."""
    order = rnd.sample(segments, len(segments))
    cut = data.draw(st.integers(0, len(order)))
    original = Assembler(unit_of_work=unit_of_work)
    original.receive_many(order[:cut])
    restored = Assembler.restore(original.snapshot(), unit_of_work=unit_of_work)
    assert [summary(e) for e in restored.pending()] == [summary(e) for e in original.pending()]
    assert _streamed(restored, order[cut:]) == _streamed(original, order[cut:])
    assert [summary(e) for e in restored.close()] == [summary(e) for e in original.close()]


def test_held_segments_of_the_last_message_restore_whatever_order_they_arrived_in() -> None:
    """Streaming admits a segment of message 3 without LAST_MSG_IN_GROUP before one with it (and
    would refuse it after): restore feeds the flagged segments last, so what was held is held again."""
    from segmenter.wire import make_header

    def seg(offset: int, data: bytes, flags: int, mcrc: int | None) -> bytes:
        h = make_header(group_id=GID, msg_seq_number=3, offset=offset, data=data, original_length=6,
                        stored_length=6, msg_flags=flags, codec=Codec.NONE, algorithm=ChecksumAlgorithm.CRC32,
                        message_checksum=mcrc)  # fmt: skip
        return h.pack() + data

    tail = seg(3, b"def", MsgFlags.MSG_IN_GROUP | MsgFlags.SEGMENT | MsgFlags.LAST_SEGMENT, zlib.crc32(b"abcdef"))
    head = seg(0, b"abc", MsgFlags.LAST_MSG_IN_GROUP | MsgFlags.MSG_IN_GROUP | MsgFlags.SEGMENT, None)
    for unit_of_work in (True, False):
        asm = Assembler(unit_of_work=unit_of_work)
        assert asm.receive_many([encoded_other := segment(b"xyz" * 9, HEADER_LENGTH + 9)[0].encode(), tail, head]) == []
        restored = Assembler.restore(asm.snapshot(), unit_of_work=unit_of_work)
        assert [summary(e) for e in restored.close()] == [summary(e) for e in asm.close()]
        assert encoded_other
