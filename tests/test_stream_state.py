"""The streaming job's per-key decisions, without Spark: same rows as the batch job, expiry, late segments."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from reassembly.assembler import Limits
from reassembly.events import Cause
from reassembly.spark.rows import reassemble_group
from reassembly.spark.stream_state import KIND_DUPLICATE, judge, late_rows, reject_now, take, undecodable
from reassembly.spark.testdata import _conflicting_copy
from segmenter import Reason
from segmenter.producer import Segmenter, new_group_id

LIMITS = Limits()
SEG = Segmenter(300)


def _message(size: int = 1000, seed: int = 1) -> tuple[bytes, list[bytes]]:
    payload = random.Random(seed).randbytes(size)
    return payload, [s.encode() for s in SEG.segment(payload)]


def test_undecided_until_complete_then_the_batch_rows() -> None:
    _, segs = _message()
    assert judge(segs[:-1], LIMITS, True) is None
    verdict = judge(segs, LIMITS, True)
    assert verdict is not None and verdict.state == "complete"
    assert verdict.rows == reassemble_group(segs, LIMITS)


def test_expiry_reports_exact_missing_ranges_and_returns_held_bytes() -> None:
    _, segs = _message()
    held = [segs[0], segs[2]]
    verdict = judge(held, LIMITS, True, Cause.EXPIRED)
    assert verdict is not None and verdict.state == "expired"
    (msg,) = [r for r in verdict.rows if r["kind"] == "message"]
    assert msg["status"] == "incomplete" and msg["reason"] == Reason.INCOMPLETE_MSG
    assert msg["missing_ranges"] == [{"start": 216, "end": 432}, {"start": 648, "end": 1000}]
    assert sorted(r["raw"] for r in verdict.rows if r["kind"] == "quarantine") == sorted(held)


def test_the_byte_bound_evicts_before_storing() -> None:
    _, segs = _message()
    held = segs[:2]
    bound = sum(map(len, segs[:3]))
    assert take(held, segs[2:3], sum(map(len, held)), bound, LIMITS, True) is None
    verdict = take(held, segs[2:4], sum(map(len, held)), bound, LIMITS, True)
    assert verdict is not None and verdict.state == "evicted"
    q = [r for r in verdict.rows if r["kind"] == "quarantine"]
    assert len(q) == 4 and all("evicted" in r["detail"] for r in q)


def test_failure_waits_for_a_good_copy() -> None:
    """A conflicting copy with a valid checksum must not decide the message before the right one arrives."""
    _, segs = _message()
    bad = _conflicting_copy(segs[1], random.Random(3))
    early = [segs[0], bad, *segs[2:]]
    assert judge(early, LIMITS, True) is None  # covered, but the message checksum fails: wait
    verdict = judge([*early, segs[1]], LIMITS, True)
    assert verdict is not None and verdict.state == "complete"
    assert verdict.rows == reassemble_group([*early, segs[1]], LIMITS)
    corrupt = judge(early, LIMITS, True, Cause.EXPIRED)
    assert corrupt is not None and corrupt.state == "failed"
    assert [r["status"] for r in corrupt.rows if r["kind"] == "message"] == ["corrupt"]


def test_after_the_end_duplicate_conflict_late() -> None:
    _, segs = _message()
    done = judge(segs, LIMITS, True)
    assert done is not None
    rows = late_rows(done.tombstone, done.state, [segs[1], _conflicting_copy(segs[2], random.Random(5))], LIMITS, True)
    assert [r["kind"] for r in rows] == [KIND_DUPLICATE, "quarantine"]
    assert rows[1]["reason"] == Reason.CONFLICTING_DUPLICATE
    expired = judge(segs[:2], LIMITS, True, Cause.EXPIRED)
    assert expired is not None
    (late,) = late_rows(expired.tombstone, expired.state, [segs[3]], LIMITS, True)
    assert late["reason"] == Reason.LATE_SEGMENT and late["raw"] == segs[3] and "expired" in late["detail"]


def test_unreadable_rows_are_quarantined_at_once() -> None:
    garbage = [b"", b"SGMT" + bytes(100), b"\x00" * 200]
    assert all(undecodable(g) for g in garbage)
    rows = reject_now(garbage, LIMITS)
    assert sorted(r["raw"] for r in rows) == sorted(garbage) and all(r["kind"] == "quarantine" for r in rows)


def test_unit_of_work_group_leaves_whole() -> None:
    gid = new_group_id()
    segs = [s.encode() for s in SEG.segment_group([b"a" * 500, b"b" * 10, b"c" * 700], group_id=gid)]
    last_msg = [s for s in segs if s[40:44] == (3).to_bytes(4, "big")]
    assert judge([s for s in segs if s not in last_msg], LIMITS, True) is None
    verdict = judge(segs, LIMITS, True)
    assert verdict is not None
    assert [r["msg_seq_number"] for r in verdict.rows if r["kind"] == "message"] == [1, 2, 3]


@settings(max_examples=25)
@given(st.randoms(use_true_random=False), st.integers(1, 5))
def test_cuts_never_change_the_final_rows(rng: random.Random, cuts: int) -> None:
    """Fed in any number of cumulative batches, the first verdict is the batch job's rows for what was held."""
    _, segs = _message(seed=rng.randrange(1000))
    rows = [*segs, segs[0], _conflicting_copy(segs[1], rng)]
    rng.shuffle(rows)
    held: list[bytes] = []
    at = [*sorted(rng.sample(range(1, len(rows)), min(cuts, len(rows) - 1))), len(rows)]
    start = 0
    for end in at:
        held += rows[start:end]
        start = end
        verdict = judge(held, LIMITS, True)
        if verdict is not None:
            assert verdict.rows == reassemble_group(held, LIMITS)
            break
    else:
        raise AssertionError("never decided with every segment held")
