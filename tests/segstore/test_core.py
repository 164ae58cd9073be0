"""The store's sans-I/O decisions (hypothesis): the readiness pre-check agrees with the assembler,
assembly from the store does not depend on the order rows are read, writes and late copies are
judged by fingerprint, and leases expire exactly at their end."""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reassembly.assembler.core import Assembler
from reassembly.assembler.events import GroupComplete, MessageComplete
from reassembly.assembler.model import Limits
from reassembly.segstore import core
from reassembly.segstore.core import Lease, Write
from segmenter import SegmentationError, segment, segment_group

LIMITS = Limits()


def _rows(raws: list[bytes], unit_of_work: bool = True) -> list[core.Row]:
    taken = [core.take(r, LIMITS, unit_of_work) for r in raws]
    return [t.row for t in taken if t.row is not None]


def _delivers(raws: list[bytes]) -> bool:
    a = Assembler(unit_of_work=True)
    events = a.receive_many(raws)
    return any(isinstance(e, MessageComplete | GroupComplete) for e in events)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=3),
    keep=st.lists(st.booleans(), min_size=30, max_size=30),
    seed=st.integers(0, 2**32 - 1),
)
def test_ready_agrees_with_the_assembler(sizes: list[int], keep: list[bool], seed: int) -> None:
    """Over any subset of the segments of a message (or a Unit-of-Work group), in any order: the
    headers say ready exactly when the assembler would deliver."""
    rnd = random.Random(seed)
    payloads = [rnd.randbytes(n) for n in sizes]
    segs = segment(payloads[0], 600) if len(payloads) == 1 else segment_group(payloads, 600)
    raws = [s.encode() for s, k in zip(segs, keep, strict=False) if k]
    rnd.shuffle(raws)
    assert core.ready(_rows(raws)) == _delivers(raws)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), copies=st.integers(0, 3))
def test_assembly_does_not_depend_on_row_order(seed: int, copies: int) -> None:
    """A variant at one position (a corrupted copy with valid segment checksums) and repeated rows:
    whatever order the store returns them in, the same message wins and the same rows lose."""
    rnd = random.Random(seed)
    payload = rnd.randbytes(2500)
    gid = os.urandom(24)
    good = [s.encode() for s in segment(payload, 600, group_id=gid)]
    forged = bytearray(payload)
    forged[700] ^= 1
    bad = [s.encode() for s in segment(bytes(forged), 600, group_id=gid)]
    raws = good + bad[1:2] * min(copies, 1)
    outcomes = set()
    for _ in range(4):
        order = raws[:]
        rnd.shuffle(order)
        result = core.assemble(order, LIMITS, True)
        assert result.decided
        delivered = [bytes(e.payload) for e in result.delivered if isinstance(e, MessageComplete)]
        lost = sorted(order[q.index] for q in result.quarantined)
        outcomes.add((tuple(delivered), tuple(lost)))
        assert len(result.used) + len(result.duplicates) + len(result.quarantined) == len(order)
    assert len(outcomes) == 1
    [(delivered, lost)] = outcomes
    assert delivered == (payload,)
    assert list(lost) == bad[1:2] * min(copies, 1)


def test_writes_and_late_copies_are_judged_by_fingerprint() -> None:
    [seg] = segment(b"x" * 100, 600)
    row = _rows([seg.encode()])[0]
    assert core.judge(row, []) is Write.STORED
    assert core.judge(row, [row.fp]) is Write.DUPLICATE
    assert core.judge(row, [b"other"]) is Write.VARIANT
    assert core.judge_late(row, row.fp) == (Write.DUPLICATE, None)
    outcome, err = core.judge_late(row, b"other")
    assert outcome is Write.QUARANTINED and err is not None and err.reason.name == "CONFLICTING_DUPLICATE"
    outcome, err = core.judge_late(row, None)
    assert outcome is Write.QUARANTINED and err is not None and err.reason.name == "LATE_SEGMENT"


def test_a_bad_segment_never_becomes_a_row() -> None:
    raw = bytearray(segment(b"y" * 100, 600)[0].encode())
    raw[-1] ^= 1
    taken = core.take(bytes(raw), LIMITS, True)
    assert taken.row is None and taken.error is not None and taken.error.reason.name == "DATA_CHECKSUM_ERROR"


@given(until=st.floats(0, 100), now=st.floats(0, 100))
def test_a_lease_is_live_strictly_before_its_end(until: float, now: float) -> None:
    lease = Lease("a", until, 3)
    assert lease.live(now) == (now < until)
    assert lease.expired(now) == (now >= until)
    if lease.live(now):
        with pytest.raises(SegmentationError):
            core.claim(lease, "b", now, 10)
    else:
        assert core.claim(lease, "b", now, 10) == Lease("b", now + 10, 4)
    assert not Lease(None, None, 0).live(now) and not Lease(None, None, 0).expired(now)
