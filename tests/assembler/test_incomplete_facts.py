"""What an incomplete (or failed) message's events and rows say is missing: last number, lengths, basis, detail."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from reassembly import Assembler, Cause, Limits, MessageFailed, Unfinished
from reassembly.spark.rows import reassemble_group
from segmenter import Codec, Reason, Segmenter

SEG = Segmenter(300)
ZSTD = Segmenter(300, codec=Codec.ZSTD)


def _payload(n: int, seed: int = 1) -> bytes:
    return random.Random(seed).randbytes(n)


def _group(sizes: tuple[int, ...]) -> list[bytes]:
    return [s.encode() for s in SEG.segment_group([_payload(n, i) for i, n in enumerate(sizes)])]


def _seq(raw: bytes) -> int:
    from segmenter.wire import decode_header

    return decode_header(raw).msg_seq_number


def _events(rows: list[bytes], **kw: Any) -> list[Any]:
    asm = Assembler(Limits(), batch=True, **kw)
    return asm.receive_many(rows) + asm.close()


def _messages(rows: Sequence[bytes | None]) -> dict[int, dict[str, Any]]:
    return {r["msg_seq_number"]: r for r in reassemble_group(rows) if r["kind"] == "message"}


def test_a_lone_message_missing_a_middle_segment_names_its_range_in_original_bytes() -> None:
    payload = _payload(2000)
    segs = [s.encode() for s in SEG.segment(payload)]
    (ev,) = [e for e in _events(segs[:2] + segs[3:]) if isinstance(e, Unfinished)]
    assert not ev.grouped and ev.last_seq_number is None
    (gap,) = ev.gaps
    assert gap.basis == "original" and gap.original_length == len(payload) == gap.stored_length
    (row,) = _messages(segs[:2] + segs[3:]).values()
    assert row["status"] == "incomplete" and row["reason"] == Reason.INCOMPLETE_MSG
    assert row["missing_ranges_basis"] == "original" and row["original_length"] == len(payload)
    assert row["detail"] == "message incomplete (closed: the input ended): 1 missing range of its original bytes"
    assert row["last_seq_number"] is None and row["missing_seq_numbers"] == []
    quarantined = [r for r in reassemble_group(segs[:2] + segs[3:]) if r["kind"] == "quarantine"]
    assert {r["detail"] for r in quarantined} == {"message incomplete (closed: the input ended)"}  # not "group"


def test_a_message_whose_last_segment_never_came_says_so() -> None:
    segs = [s.encode() for s in SEG.segment(_payload(2000))]
    (row,) = _messages(segs[:-1]).values()
    assert row["detail"].endswith("; its last segment never arrived")
    assert row["missing_ranges"][-1]["end"] is not None  # every header declared the stored length


def test_a_compressed_message_counts_its_missing_ranges_in_stored_bytes() -> None:
    payload = bytes(range(256)) * 40 + _payload(3000)
    segs = [s.encode() for s in ZSTD.segment(payload)]
    assert len(segs) > 2
    (row,) = _messages(segs[1:]).values()
    assert row["missing_ranges_basis"] == "stored" and "stored (compressed) bytes" in row["detail"]
    assert row["original_length"] == len(payload) and row["stored_length"] < len(payload)
    assert row["missing_ranges"][0] == {"start": 0, "end": row["missing_ranges"][0]["end"]}


def test_a_group_whose_last_message_never_arrived_says_its_last_number_is_unknown() -> None:
    rows = [r for r in _group((500, 400, 300)) if _seq(r) != 3]
    (ev,) = [e for e in _events(rows) if isinstance(e, Unfinished)]
    assert ev.grouped and ev.last_seq_number is None and ev.missing_seq_numbers == ()
    got = _messages(rows)
    assert sorted(got) == [1, 2]
    for row in got.values():
        assert row["status"] == "incomplete" and row["reason"] == Reason.INCOMPLETE_GROUP
        assert row["last_seq_number"] is None and row["missing_ranges"] == [] and row["missing_ranges_basis"] is None
        assert row["detail"].startswith("whole, but MQ group incomplete (closed: the input ended): its last message")
        assert "LAST_MSG_IN_GROUP" in row["detail"]
    quarantined = [r for r in reassemble_group(rows) if r["kind"] == "quarantine"]
    assert {r["detail"] for r in quarantined} == {"MQ group incomplete (closed: the input ended)"}


def test_a_group_missing_a_message_names_it_and_its_last_number() -> None:
    rows = [r for r in _group((500, 400, 300, 200)) if _seq(r) != 2]
    got = _messages(rows)
    assert sorted(got) == [1, 2, 3, 4]
    assert {r["last_seq_number"] for r in got.values()} == {4}
    assert {tuple(r["missing_seq_numbers"]) for r in got.values()} == {(2,)}
    assert got[2]["missing_ranges"] == [{"start": 0, "end": None}] and got[2]["missing_ranges_basis"] == "stored"
    assert got[2]["detail"] == "MQ group incomplete (closed: the input ended): nothing arrived of message 2"
    assert got[1]["detail"] == "whole, but " + got[2]["detail"]


def test_a_group_whose_last_message_is_incomplete_still_names_its_number() -> None:
    """A batch assembler admits a last number only from a complete message; the report says what the
    pieces held declare (the streaming assembler knows it as the flagged piece arrives)."""
    rows = _group((500, 400, 900))
    last = [r for r in rows if _seq(r) == 3]
    rows = [r for r in rows if r != last[0]]  # the last message's first piece is missing
    (ev,) = [e for e in _events(rows) if isinstance(e, Unfinished)]
    assert ev.last_seq_number == 3 and ev.grouped
    got = _messages(rows)
    assert {r["last_seq_number"] for r in got.values()} == {3}
    assert got[3]["detail"].startswith("message of an MQ group incomplete (closed: the input ended): 1 missing range")
    streaming = Assembler(Limits())
    for r in rows:
        streaming.receive(r)
    (pending,) = streaming.pending()
    assert pending.last_seq_number == 3 and pending.grouped


def test_a_complete_group_reports_its_last_number_and_lone_messages_none() -> None:
    got = _messages(_group((100, 200)))
    assert {r["status"] for r in got.values()} == {"complete"} and {r["last_seq_number"] for r in got.values()} == {2}
    assert {r["detail"] for r in got.values()} == {None}
    (lone,) = _messages([s.encode() for s in SEG.segment(_payload(900))]).values()
    assert lone["last_seq_number"] is None and lone["detail"] is None and lone["missing_ranges_basis"] is None


def test_a_corrupt_message_keeps_its_declared_lengths() -> None:
    payload = _payload(1200)
    segs = [s.encode() for s in SEG.segment(payload)]
    from tests.spark.test_differential import reseal

    segs[-1] = reseal(segs[-1], message_checksum=1)
    (failed,) = [e for e in _events(segs) if isinstance(e, MessageFailed)]
    assert (failed.stored_length, failed.original_length) == (len(payload), len(payload))
    (row,) = _messages(segs).values()
    assert row["status"] == "corrupt" and row["original_length"] == len(payload)
    assert row["detail"] == str(failed.error)


def test_an_expired_group_says_expired() -> None:
    now = [0.0]
    asm = Assembler(Limits(expiry_seconds=5), clock=lambda: now[0])
    rows = [r for r in _group((500, 400)) if _seq(r) == 1]
    for r in rows:
        asm.receive(r)
    now[0] = 10.0
    (ev,) = asm.expire()
    assert isinstance(ev, Unfinished) and ev.cause == Cause.EXPIRED and ev.grouped
    assert ev.last_seq_number is None  # the group's last message never came
