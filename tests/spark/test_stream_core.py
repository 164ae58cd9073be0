"""The streaming job's per-key decisions, without Spark: same rows as the batch job, expiry, late segments."""

from __future__ import annotations

import json
import random
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from reassembly.assembler import Limits
from reassembly.assembler.events import Cause
from reassembly.spark.rows import reassemble_group
from reassembly.spark.stream.core import (
    KIND_DUPLICATE,
    Footprint,
    Partial,
    Summary,
    Verdict,
    judge,
    late_rows,
    reject_now,
    take,
    undecodable,
)
from reassembly.spark.stream.spool import IN_BODY, IN_STATE, SPOOL, HeldRows, Spool, SpoolState
from reassembly.spark.testdata import _conflicting_copy
from reassembly.storage.filestore import FileBodyStore
from segmenter import Reason
from segmenter.producer import Segmenter, new_group_id
from segmenter.wire import decode_header

LIMITS = Limits()
SEG = Segmenter(300)


def _message(size: int = 1000, seed: int = 1) -> tuple[bytes, list[bytes]]:
    payload = random.Random(seed).randbytes(size)
    return payload, [s.encode() for s in SEG.segment(payload)]


def _summary(raws: list[bytes]) -> Summary:
    summary = Summary()
    summary.add(decode_header(r) for r in raws)
    return summary


def test_undecided_until_complete_then_the_batch_rows() -> None:
    _, segs = _message()
    assert judge(segs[:-1], LIMITS, True) is None
    verdict = judge(segs, LIMITS, True)
    assert isinstance(verdict, Verdict) and verdict.state == "complete"
    assert verdict.rows == reassemble_group(segs, LIMITS)


def test_expiry_reports_exact_missing_ranges_and_returns_held_bytes() -> None:
    _, segs = _message()
    held = [segs[0], segs[2]]
    verdict = judge(held, LIMITS, True, Cause.EXPIRED)
    assert isinstance(verdict, Verdict) and verdict.state == "expired"
    (msg,) = [r for r in verdict.rows if r["kind"] == "message"]
    assert msg["status"] == "incomplete" and msg["reason"] == Reason.INCOMPLETE_MSG
    assert msg["missing_ranges"] == [{"start": 216, "end": 432}, {"start": 648, "end": 1000}]
    assert sorted(r["raw"] for r in verdict.rows if r["kind"] == "quarantine") == sorted(held)


def test_the_byte_bound_evicts_before_storing() -> None:
    _, segs = _message()
    held = segs[:2]
    bound = sum(map(len, segs[:3]))
    assert take(lambda: held, segs[2:3], sum(map(len, held)), _summary(held), bound, LIMITS, True) is None
    verdict = take(lambda: held, segs[2:4], sum(map(len, held)), _summary(held), bound, LIMITS, True)
    assert isinstance(verdict, Verdict) and verdict.state == "evicted"
    q = [r for r in verdict.rows if r["kind"] == "quarantine"]
    assert len(q) == 4 and all("evicted" in r["detail"] for r in q)


def test_failure_waits_for_a_good_copy() -> None:
    """A conflicting copy with a valid checksum must not decide the message before the right one arrives."""
    _, segs = _message()
    bad = _conflicting_copy(segs[1], random.Random(3))
    early = [segs[0], bad, *segs[2:]]
    assert judge(early, LIMITS, True) is None  # covered, but the message checksum fails: wait
    verdict = judge([*early, segs[1]], LIMITS, True)
    assert isinstance(verdict, Verdict) and verdict.state == "complete"
    assert verdict.rows == reassemble_group([*early, segs[1]], LIMITS)
    corrupt = judge(early, LIMITS, True, Cause.EXPIRED)
    assert isinstance(corrupt, Verdict) and corrupt.state == "failed"
    assert [r["status"] for r in corrupt.rows if r["kind"] == "message"] == ["corrupt"]


def test_after_the_end_duplicate_conflict_late() -> None:
    _, segs = _message()
    done = judge(segs, LIMITS, True)
    assert isinstance(done, Verdict)
    rows = late_rows(done.tombstone, done.state, [segs[1], _conflicting_copy(segs[2], random.Random(5))], LIMITS, True)
    assert [r["kind"] for r in rows] == [KIND_DUPLICATE, "quarantine"]
    assert rows[1]["reason"] == Reason.CONFLICTING_DUPLICATE
    expired = judge(segs[:2], LIMITS, True, Cause.EXPIRED)
    assert isinstance(expired, Verdict)
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
    assert isinstance(verdict, Verdict)
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
            assert isinstance(verdict, Verdict)
            assert verdict.rows == reassemble_group(held, LIMITS)
            break
    else:
        raise AssertionError("never decided with every segment held")


def _group(sizes: tuple[int, ...], seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [s.encode() for s in SEG.segment_group([rng.randbytes(n) for n in sizes], group_id=new_group_id())]


def _seq(raw: bytes) -> int:
    return decode_header(raw).msg_seq_number


@settings(max_examples=40)
@given(st.randoms(use_true_random=False), st.booleans(), st.booleans(), st.integers(1, 6))
def test_the_summary_skips_only_judgments_that_decide_nothing(
    rng: random.Random, grouped: bool, unit_of_work: bool, cuts: int
) -> None:
    """Whenever the summary says "not ready", judging every segment held would have been undecided:
    skipping it cannot change a decision (shuffled arrivals, lost segments, conflicting copies)."""
    segs = _group((700, 10, 900), rng.randrange(1000)) if grouped else _message(seed=rng.randrange(1000))[1]
    rows = [s for s in segs if rng.random() > 0.15] + [_conflicting_copy(rng.choice(segs), rng)]
    rng.shuffle(rows)
    at = [*sorted(rng.sample(range(1, len(rows)), min(cuts, len(rows) - 1))), len(rows)]
    summary, start = Summary(), 0
    for end in at:
        summary.add(decode_header(r) for r in rows[start:end])
        start = end
        if not summary.ready(unit_of_work):
            assert judge(rows[:end], LIMITS, unit_of_work) is None


def test_a_message_straddling_many_batches_is_judged_once() -> None:
    """Held segments are read back (and judged) only when the new ones could complete the message."""
    _, segs = _message(size=3000)
    reads = 0

    def held() -> list[bytes]:
        nonlocal reads
        reads += 1
        return kept

    kept: list[bytes] = []
    summary = Summary()
    for i, seg in enumerate(segs):
        verdict = take(held, [seg], sum(map(len, kept)), summary, 1 << 30, LIMITS, True)
        if i < len(segs) - 1:
            assert verdict is None
            kept.append(seg)
    assert reads == 1 and isinstance(verdict, Verdict) and verdict.rows == reassemble_group(segs, LIMITS)
    assert Summary.load(summary.dump()).dump() == summary.dump()


def test_without_unit_of_work_messages_of_a_group_leave_one_by_one() -> None:
    segs = _group((500, 10, 700), 3)
    first, second, third = ([s for s in segs if _seq(s) == n] for n in (1, 2, 3))
    summary = Summary()
    held = [*first, *second[:-1], *third]
    summary.add(decode_header(r) for r in held)
    step = judge(held, LIMITS, False, summary=summary)
    assert isinstance(step, Partial)
    assert [r["msg_seq_number"] for r in step.rows if r["kind"] == "message"] == [1, 3]
    assert step.left == {1, 3} and summary.left == {1, 3} and summary.last_left == 3
    whole = reassemble_group(segs, LIMITS, unit_of_work=False)
    assert step.rows == [r for r in whole if r["msg_seq_number"] in (1, 3)]
    # a copy of a message that left is judged against what left; the last piece of 2 decides the group
    (dup,) = late_rows(summary.tombstone(first[0][16:40]), "complete", first[:1], LIMITS, False)
    assert dup["kind"] == KIND_DUPLICATE
    summary.add([decode_header(second[-1])])
    done = judge(second, LIMITS, False, summary=summary)
    assert isinstance(done, Verdict) and done.state == "complete"
    assert done.rows == [r for r in whole if r["msg_seq_number"] == 2]
    late = late_rows(
        done.tombstone, done.state, [third[0], _conflicting_copy(second[0], random.Random(1))], LIMITS, False
    )
    assert [r["kind"] for r in late] == [KIND_DUPLICATE, "quarantine"]
    assert late[1]["reason"] == Reason.CONFLICTING_DUPLICATE


def test_without_unit_of_work_expiry_reports_only_what_did_not_leave() -> None:
    segs = _group((500, 10, 700, 20), 4)
    gid = segs[0][16:40]
    first, third = [s for s in segs if _seq(s) == 1], [s for s in segs if _seq(s) == 3]
    summary = Summary()
    held = [*first, *third[:1]]
    summary.add(decode_header(r) for r in held)
    step = judge(held, LIMITS, False, summary=summary)
    assert isinstance(step, Partial) and summary.left == {1}
    expired = judge(third[:1], LIMITS, False, Cause.EXPIRED, summary, gid)
    assert isinstance(expired, Verdict) and expired.state == "expired"
    msgs = {r["msg_seq_number"]: r for r in expired.rows if r["kind"] == "message"}
    assert sorted(msgs) == [2, 3]  # 1 left already; 2 never arrived; 3 is partial; 4 unknown (no last seen)
    assert msgs[2]["status"] == "incomplete" and msgs[2]["reason"] == Reason.INCOMPLETE_GROUP
    assert msgs[3]["missing_ranges"] and all(m["missing_seq_numbers"] == [2] for m in msgs.values())
    assert [r["raw"] for r in expired.rows if r["kind"] == "quarantine"] == third[:1]
    # nothing held at all when the group expires: what is missing is still reported
    empty = Summary(left={1}, delivered=dict(summary.delivered))
    gone = judge([], LIMITS, False, Cause.EXPIRED, empty, gid)
    assert isinstance(gone, Verdict)
    assert [(r["msg_seq_number"], r["status"]) for r in gone.rows] == []  # no last seen: nothing known missing


def test_large_messages_are_held_on_disk_and_a_replay_leaves_the_body_intact(tmp_path: Path) -> None:
    """A large message's data goes to its body file at its offsets (a copy over written bytes: aside);
    state holds headers only. Replaying a batch from the last committed state rewrites the same places."""
    payload, segs = _message(size=3000, seed=6)
    spool = Spool(str(tmp_path), 1000, 1 << 20)
    copy = _conflicting_copy(segs[2], random.Random(2))
    committed = SpoolState()
    held = [spool.put(r, decode_header(r), committed) for r in segs[:2]]
    assert all(at == IN_BODY and len(head) < 100 for head, at in held)
    snap = json.dumps(committed.dump())
    attempt = SpoolState.load(json.loads(snap))
    first = [spool.put(r, decode_header(r), attempt) for r in (segs[2], copy)]  # then the process dies
    replay = SpoolState.load(json.loads(snap))
    again = [spool.put(r, decode_header(r), replay) for r in (copy, segs[2])]  # other order, same state
    assert [at for _, at in first] == [IN_BODY, 0] and [at for _, at in again] == [IN_BODY, 0]
    rows = [(h, at, decode_header(h)) for h, at in [*held, *again]]
    assert list(HeldRows(rows, spool)) == [*segs[:2], copy, segs[2]]
    # judged from disk into the body store: the batch job's rows (payload_path) and the same body bytes
    summary = Summary()
    summary.add(decode_header(r) for r in [*segs[:2], copy, segs[2]])
    store = FileBodyStore(tmp_path / "bodies", "t", 1000)
    verdict = take(lambda: HeldRows(rows, spool), segs[3:], 0, summary, 1 << 30, LIMITS, True, store)
    assert isinstance(verdict, Verdict)
    want = reassemble_group([*segs[:2], copy, *segs[2:]], LIMITS, bodies=FileBodyStore(tmp_path / "b2", "u", 1000))
    assert verdict.rows == want
    (msg,) = [r for r in verdict.rows if r["kind"] == "message"]
    assert msg["status"] == "complete" and (tmp_path / "bodies" / msg["payload_path"]).read_bytes() == payload
    assert [r["raw"] for r in verdict.rows if r["kind"] == "quarantine"] == [copy]
    spool.drop(segs[0][16:40], 1)
    assert not list((tmp_path / SPOOL).iterdir())
    # anything that does not fit what its message declares stays in state (and is rejected when judged)
    h = decode_header(segs[0])
    assert spool.wants(segs[0], h)
    assert not spool.wants(segs[0], h._replace(offset=1 << 40)) and not Spool(str(tmp_path), 5000, 1 << 20).wants(
        segs[0], h
    )
    assert not spool.wants(segs[0] + b"x", h) and not spool.wants(segs[0][:-1], h)  # not exactly one segment


def test_sync_covers_every_spool_file_written_since_the_last_one(tmp_path: Path) -> None:
    """What sync() fsyncs: the body and aside files put() wrote, and the directory that was created
    for them; nothing twice (a second sync with nothing written does nothing)."""
    _, segs = _message(size=3000, seed=7)
    spool = Spool(str(tmp_path / "bodies"), 1000, 1 << 20)
    state = SpoolState()
    for raw in [*segs[:2], segs[0]]:  # the copy of segs[0] goes to the aside file
        spool.put(raw, decode_header(raw), state)
    names = {p.name.rsplit(".", 1)[-1] for p in spool.unsynced}
    assert names == {"body", "aside", "bodies"}  # the payload dir holds the new .stream directory's name
    spool.sync()
    assert spool.unsynced == set()
    spool.sync()
    h = decode_header(segs[2])
    head, at = spool.put(segs[2], h, state)
    # a footprint counts the spooled segment's header in state and its data as spooled
    assert Footprint.of([(head, at, h)]) == Footprint(
        segments=1, held_bytes=h.header_length, spooled_bytes=h.data_length
    )
    assert Footprint.of([(segs[0], IN_STATE, decode_header(segs[0]))]).held_bytes == len(segs[0])
