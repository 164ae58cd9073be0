"""The shared segment store on SQLite and PostgreSQL: idempotent writes, the completing write's
claim, delivery with the assembler's rules, leases that expire and are taken over, expiry with
exact missing ranges, tombstones, and the counters."""

from __future__ import annotations

import os
import random
import tempfile
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reassembly.assembler.events import GroupComplete, MessageComplete
from reassembly.segstore import SegmentStore, Write, open_store
from segmenter import Reason, segment, segment_group
from segmenter.wire import Segment


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def raws(segments: list[Segment]) -> list[bytes]:
    return [s.encode() for s in segments]


def test_segments_split_between_members_complete_once(open_member: Callable[..., SegmentStore]) -> None:
    payload = os.urandom(10_000)
    segs = raws(segment(payload, 1200))
    a, b = open_member("a"), open_member("b")
    res_a, claims_a = a.write(segs[0::2])
    res_b, claims_b = b.write(segs[1::2])
    assert {r.outcome for r in res_a + res_b} == {Write.STORED}
    claims = claims_a + claims_b
    assert len(claims) == 1  # the write that completed it, whichever member made it
    owner = a if claims_a else b
    got: list[MessageComplete | GroupComplete] = []
    settled = owner.deliver(claims[0], got.append)
    assert settled.settled and settled.delivered == 1
    assert isinstance(got[0], MessageComplete) and bytes(got[0].payload) == payload
    stats = a.stats()
    assert (stats.units, stats.segments, stats.bytes) == (0, 0, 0)
    assert stats.counters["used"] == len(segs) and stats.counters["delivered"] == 1


def test_redelivery_is_a_duplicate_before_and_after_settlement(open_member: Callable[..., SegmentStore]) -> None:
    segs = raws(segment(os.urandom(5000), 1000))
    a, b = open_member("a"), open_member("b")
    a.write(segs[:2])
    res, _ = b.write(segs[:1])
    assert res[0].outcome is Write.DUPLICATE
    _, claims = b.write(segs[2:])
    b.deliver(claims[0], lambda m: None)
    res, claims = a.write(segs)  # every record redelivered after the claimant settled
    assert {r.outcome for r in res} == {Write.DUPLICATE} and claims == []
    assert a.stats().counters["duplicates"] == 1 + len(segs)
    assert a.stats().units == 0


def test_different_bytes_at_a_position_go_to_the_assembler(open_member: Callable[..., SegmentStore]) -> None:
    """A corrupt-but-checksummed copy at one position is kept as a variant; the assembler's
    arbitration keeps the copy whose message checksum verifies, the other is quarantined."""
    payload = os.urandom(3000)
    gid = os.urandom(24)
    good = segment(payload, 1000, group_id=gid)
    bad_payload = payload[:1000] + bytes(1000) + payload[2000:]
    bad = segment(bad_payload, 1000, group_id=gid)
    a = open_member("a")
    res, claims = a.write([good[0].encode(), bad[1].encode(), good[1].encode()])
    assert [r.outcome for r in res] == [Write.STORED, Write.STORED, Write.VARIANT]
    res, claims = a.write([s.encode() for s in good[2:]])
    got: list[MessageComplete | GroupComplete] = []
    a.deliver(claims[0], got.append)
    assert len(got) == 1 and isinstance(got[0], MessageComplete) and bytes(got[0].payload) == payload
    q = a.quarantined()
    assert [x[5] for x in q] == [bad[1].encode()]
    res, _ = a.write([bad[1].encode()])  # a late copy that lost: quarantined again, never delivered
    assert res[0].outcome is Write.QUARANTINED and res[0].reason is Reason.CONFLICTING_DUPLICATE


def test_corrupt_record_is_quarantined_with_its_bytes(open_member: Callable[..., SegmentStore]) -> None:
    seg = bytearray(segment(os.urandom(500), 1000)[0].encode())
    seg[-1] ^= 0xFF
    a = open_member("a")
    res, claims = a.write([bytes(seg), b"not a segment"])
    assert [r.outcome for r in res] == [Write.QUARANTINED, Write.QUARANTINED] and claims == []
    assert [r.reason for r in res] == [Reason.DATA_CHECKSUM_ERROR, Reason.BAD_MAGIC]
    assert sorted(x[5] for x in a.quarantined()) == sorted([bytes(seg), b"not a segment"])


def test_a_failing_handler_releases_the_lease(open_member: Callable[..., SegmentStore]) -> None:
    payload = os.urandom(2000)
    a, b = open_member("a"), open_member("b")
    _, claims = a.write(raws(segment(payload, 1000)))

    def fail(m: object) -> None:
        raise RuntimeError("sink down")

    with pytest.raises(RuntimeError):
        a.deliver(claims[0], fail)
    again = b.take_over()
    got: list[MessageComplete | GroupComplete] = []
    assert len(again) == 1 and b.deliver(again[0], got.append).settled
    assert isinstance(got[0], MessageComplete) and bytes(got[0].payload) == payload


def test_an_opened_unit_keeps_its_lease_while_renewed_and_settles_later(
    open_member: Callable[..., SegmentStore],
) -> None:
    """open() assembles without settling; renew() keeps the claim past its lease; settle() ends it.
    A claim not renewed is taken over: the late renew and settle are refused."""
    clock = Clock()
    payload = os.urandom(3000)
    a = open_member("a", clock=clock, lease_seconds=10)
    b = open_member("b", clock=clock, lease_seconds=10)
    segs = raws(segment(payload, 1000))
    _, claims = a.write(segs[:2])
    assert claims == []
    _, claims = b.write(segs[2:])  # b completes it: b holds the claim
    opened = b.open(claims[0])
    assert opened is not None and opened.members == frozenset({"a", "b"})
    assert isinstance(opened.delivered[0], MessageComplete) and bytes(opened.delivered[0].payload) == payload
    clock.now += 8
    renewed = b.renew(opened.claim)
    assert renewed is not None and renewed.until == clock.now + 10
    clock.now += 8  # past the first lease, within the renewed one
    assert a.take_over() == []
    assert b.settle(opened).settled and b.stats().units == 0
    _, claims = a.write(raws(segment(os.urandom(1500), 1000)))
    late = a.open(claims[0])
    assert late is not None
    clock.now += 10
    assert len(b.take_over()) == 1  # a's lease ran out: b has the unit now
    assert a.renew(late.claim) is None
    assert not a.settle(late).settled
    assert a.stats().counters["renewals_lost"] == 1 and a.stats().counters["settlements_lost"] == 1


def test_a_dead_claimants_lease_expires_and_another_member_takes_over(
    open_member: Callable[..., SegmentStore],
) -> None:
    clock = Clock()
    payload = os.urandom(2000)
    a = open_member("a", clock=clock, lease_seconds=10)
    b = open_member("b", clock=clock, lease_seconds=10)
    _, claims = a.write(raws(segment(payload, 1000)))
    assert claims and b.take_over() == []  # a holds a live lease
    assert b.stats().leases_held == 1
    clock.now += 10
    assert b.stats().leases_expired == 1
    taken = b.take_over()
    assert len(taken) == 1 and taken[0].token == claims[0].token + 1
    got: list[MessageComplete | GroupComplete] = []
    assert b.deliver(taken[0], got.append).settled
    late = a.deliver(claims[0], got.append)  # the old claimant wakes up: its claim is gone
    assert not late.settled
    assert [bytes(m.payload) for m in got if isinstance(m, MessageComplete)] == [payload]
    assert b.stats().counters["leases_expired"] == 1 and b.stats().counters["claims_lost"] == 1


def test_unit_of_work_group_across_members(open_member: Callable[..., SegmentStore]) -> None:
    payloads = [os.urandom(1500), os.urandom(10), os.urandom(2500)]
    segs = raws(segment_group(payloads, 1000))
    a, b, c = open_member("a"), open_member("b"), open_member("c")
    claims = []
    for i, s in enumerate(segs):
        member = [a, b, c][i % 3]
        claims += [(member, claim) for claim in member.write([s])[1]]
    assert len(claims) == 1
    got: list[MessageComplete | GroupComplete] = []
    owner, claim = claims[0]
    owner.deliver(claim, got.append)
    assert len(got) == 1 and isinstance(got[0], GroupComplete)
    assert [bytes(m.payload) for m in got[0].messages] == payloads


def test_expiry_reports_exact_missing_ranges(open_member: Callable[..., SegmentStore]) -> None:
    clock = Clock()
    payload = os.urandom(5000)
    segs = raws(segment(payload, 1084))  # 1000 data bytes each
    a = open_member("a", clock=clock)
    a.write([segs[0], segs[2], segs[4]])
    clock.now += 60
    [rep] = a.expire(30, dry_run=True)
    assert rep.segments == 3
    ranges = rep.gaps[0].missing_ranges
    assert ranges == ((1000, 2000), (3000, 4000))
    assert a.stats().units == 1  # the dry run changed nothing
    [done] = a.expire(30)
    assert done.gaps[0].missing_ranges == ranges
    assert a.stats().units == 0 and len(a.quarantined()) == 3
    assert {q[3] for q in a.quarantined()} == {Reason.INCOMPLETE_MSG}
    res, claims = a.write([segs[1], segs[3]])  # stragglers of an expired message: quarantined, not a new unit
    assert {r.outcome for r in res} == {Write.QUARANTINED} and claims == [] and a.stats().units == 0


def test_vacuum_drops_old_tombstones(open_member: Callable[..., SegmentStore]) -> None:
    clock = Clock()
    segs = raws(segment(os.urandom(2000), 1000))
    a = open_member("a", clock=clock)
    _, claims = a.write(segs)
    a.deliver(claims[0], lambda m: None)
    clock.now += 100
    assert a.vacuum(50, dry_run=True).tombstones == 1
    assert a.vacuum(500).tombstones == 0
    assert a.vacuum(50).tombstones == 1
    res, claims = a.write(segs)  # no tombstone left: taken as a new message
    assert {r.outcome for r in res} == {Write.STORED} and len(claims) == 1


def test_members_must_agree_on_unit_of_work(open_member: Callable[..., SegmentStore]) -> None:
    open_member("a", unit_of_work=True)
    with pytest.raises(Exception, match="unit_of_work"):
        open_member("b", unit_of_work=False)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), batch=st.integers(1, 6), redeliver=st.floats(0, 0.5))
def test_any_interleaving_over_three_members_delivers_each_message_once(
    seed: int, batch: int, redeliver: float
) -> None:
    """Segments of several messages and a Unit-of-Work group, shuffled, some delivered twice, dealt
    to three members in batches (SQLite): each message handed on once, byte-identical; every
    segment used once, the rest duplicates; nothing left."""
    rnd = random.Random(seed)
    payloads = {os.urandom(24): rnd.randbytes(rnd.randrange(0, 4000)) for _ in range(4)}
    records = [s.encode() for gid, p in payloads.items() for s in segment(p, 700, group_id=gid)]
    group = [rnd.randbytes(900), rnd.randbytes(10)]
    ggid = os.urandom(24)
    records += [s.encode() for s in segment_group(group, 700, group_id=ggid)]
    unique = len(records)
    records += [r for r in records if rnd.random() < redeliver]
    rnd.shuffle(records)
    with tempfile.TemporaryDirectory() as d:
        members = [open_store(f"{d}/s.db", member=f"m{i}") for i in range(3)]
        got: list[MessageComplete | GroupComplete] = []
        for start in range(0, len(records), batch):
            member = rnd.choice(members)
            _, claims = member.write(records[start : start + batch])
            for claim in claims:
                member.deliver(claim, got.append)
        stats = members[0].stats()
        for m in members:
            m.close()
    singles = {e.group_id: bytes(e.payload) for e in got if isinstance(e, MessageComplete)}
    groups = [e for e in got if isinstance(e, GroupComplete)]
    assert singles == payloads and len(got) == len(payloads) + 1
    assert [bytes(m.payload) for m in groups[0].messages] == group
    assert (stats.units, stats.segments) == (0, 0)
    assert stats.counters["used"] == unique
    assert stats.counters.get("duplicates", 0) == len(records) - unique


def test_messages_of_a_group_without_unit_of_work_are_claimed_one_by_one(
    open_member: Callable[..., SegmentStore],
) -> None:
    """A store made with ``unit_of_work=False``: each message of an MQ group is its own claim, handed
    on as a MessageComplete by whichever member completes it, in any order."""
    payloads = [os.urandom(1200), os.urandom(300), os.urandom(2000)]
    segs = segment_group(payloads, 700)
    a = open_member("a", unit_of_work=False)
    b = open_member("b")  # takes the store's setting
    assert not b.unit_of_work
    by_seq: dict[int, list[bytes]] = {}
    for s in segs:
        by_seq.setdefault(s.header.msg_seq_number, []).append(s.encode())
    got: list[MessageComplete | GroupComplete] = []
    for seq in (3, 1, 2):
        first, *rest = by_seq[seq]
        _, claims_a = a.write([first])
        _, claims_b = b.write(rest)
        for claim in claims_a:
            a.deliver(claim, got.append)
        for claim in claims_b:
            b.deliver(claim, got.append)
    assert [(e.msg_seq_number, bytes(e.payload)) for e in got if isinstance(e, MessageComplete)] == [
        (3, payloads[2]),
        (1, payloads[0]),
        (2, payloads[1]),
    ]
    assert a.stats().units == 0
