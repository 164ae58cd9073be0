"""Segments through a real ActiveMQ Classic broker, over AMQP 1.0 and STOMP.

One broker per module (tests/support/activemq_server.py), a queue per test. Competing consumers are
real processes (tests/support/broker_consumer.py); one is SIGKILLed while it holds half a message.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("proton")

from reassembly import Assembler, Limits, Unfinished
from reassembly.brokers.receiver import BrokerReceiver, Delivered, Quarantined
from segmenter import Segment, segment, segment_group
from segmenter.brokers import AMQP_FRAME_SIZE, BrokerError, open_consumer, open_sender, segment_size_for
from segmenter.brokers.amqp import _amqp_data_section, _amqp_envelope
from segmenter.errors import Reason, SegmentationError
from tests.support.activemq_server import ActiveMQ, activemq, available, free_env
from tests.support.logs import complete_lines

pytestmark = pytest.mark.skipif(not available(), reason="ActiveMQ (Debian package activemq) or java missing")
SCHEMES = ["amqp", "stomp"]
HERE = Path(__file__).resolve().parent
CONSUMER = HERE.parent / "support" / "broker_consumer.py"


@pytest.fixture(scope="module")
def broker() -> Iterator[ActiveMQ]:
    with activemq(amqp_frame_size=1 << 20) as b:  # the 1 MiB-limited broker below keeps the default 128 KiB
        yield b


def _queue(request: pytest.FixtureRequest) -> str:
    return "q." + "".join(c if c.isalnum() else "." for c in request.node.name)


def _drain(url: str, queue: str, wait: float = 1.0) -> list[bytes]:
    """Everything left on ``queue`` (accepted, so it is gone)."""
    c = open_consumer(url, queue, prefetch=100)
    got: list[bytes] = []
    try:
        while batch := c.fetch(wait):
            for d in batch:
                got.append(bytes(d.body))
                d.accept()
    finally:
        c.close()
    return got


def _until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


# ------------------------------------------------------------------------------ in-process
def test_amqp_envelope_and_frame_size(broker: ActiveMQ, request: pytest.FixtureRequest) -> None:
    """The hand-encoded AMQP message is what proton decodes (durable, group-id, the body as one data
    section), and the connection runs with the 1 MiB frames both sides offer."""
    from proton import Message

    for group in (None, "ab" * 24):
        m = Message()
        m.decode(_amqp_envelope(group) + _amqp_data_section(70_000) + b"x" * 70_000)
        assert m.durable and m.group_id == group and bytes(m.body) == b"x" * 70_000
    with pytest.raises(BrokerError):
        _amqp_envelope("g" * 201)
    q = _queue(request)
    with open_sender(broker.amqp_url, q) as tx:
        t: Any = tx._t
        transport = t.p.connection.transport
        assert (transport.max_frame_size, transport.remote_max_frame_size) == (AMQP_FRAME_SIZE, 1 << 20)
        tx.send_bytes(b"y" * 300_000, "g")
    assert _drain(broker.amqp_url, q) == [b"y" * 300_000]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_segment_is_sent_as_its_encoding_whatever_view_holds_its_data(
    broker: ActiveMQ, scheme: str, request: pytest.FixtureRequest
) -> None:
    """The sender joins header and data only in the frame: the body is ``Segment.encode()`` for
    data held as bytes, a byte view, a view of 4-byte items and a strided (non-contiguous) view."""
    url, queue = broker.url(scheme), _queue(request)
    segs = segment(os.urandom(4000), max_segment_size=1108)  # 1024 data bytes per segment
    spread = bytearray(2 * len(segs[1].data))
    spread[::2] = segs[1].data
    views = [
        segs[0],
        Segment(segs[1].header, memoryview(spread)[::2]),
        Segment(segs[2].header, memoryview(bytes(segs[2].data)).cast("I")),
        Segment(segs[3].header, bytes(segs[3].data)),
    ]
    with open_sender(url, queue) as s:
        for x in views:
            s.send(x)
    assert sorted(_drain(url, queue)) == sorted(x.encode() for x in segs)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_ack_after_handler_duplicates_and_dead_letters(
    broker: ActiveMQ, scheme: str, request: pytest.FixtureRequest
) -> None:
    """Used segments are acked only after the handler returned; a handler that raises leaves them
    on the queue; copies of a delivered message are acked as duplicates; garbage and the held
    segments of an expired group are dead-lettered with their reason, never accepted; so are a
    segment cut short and one whose data fails its CRC (their headers decode, the segments do not)."""
    url, queue = broker.url(scheme), _queue(request)
    payload = os.urandom(20_000)
    segs = segment(payload, max_segment_size=4096)
    half = segment(os.urandom(10_000), max_segment_size=4096)[:2]  # never completes
    cut_short = segment(os.urandom(3000), max_segment_size=4096)[0].encode()[:-10]
    whole = segment(os.urandom(3000), max_segment_size=4096)[0].encode()
    flipped = whole[:-1] + bytes([whole[-1] ^ 1])
    with open_sender(url, queue) as s:
        for x in segs:
            s.send(x)
    now = [0.0]
    asm = Assembler(Limits(expiry_seconds=10), clock=lambda: now[0])

    def boom(ev: Delivered) -> None:
        raise RuntimeError("application failed")

    rx = BrokerReceiver(open_consumer(url, queue), boom, asm)
    with pytest.raises(RuntimeError, match="application failed"):
        for _ in range(100):
            rx.poll(0.2)
    assert rx.stats.used == 0
    rx.close()  # nothing was acked: the broker redelivers everything

    got: list[bytes] = []
    quarantined: list[Quarantined] = []
    asm = Assembler(Limits(expiry_seconds=10), clock=lambda: now[0])
    keep = quarantined.append
    rx = BrokerReceiver(open_consumer(url, queue), lambda ev: got.append(bytes(ev.payload)), asm, on_quarantine=keep)  # type: ignore[union-attr]
    _until(lambda: rx.poll(0.2) >= 0 and len(got) == 1, 30, "the message")
    assert got == [payload] and rx.stats.used == len(segs) and rx.stats.redelivered == len(segs)
    with open_sender(url, queue) as s:
        for x in segs[:2]:  # a producer retry: duplicates of a delivered message
            s.send(x)
        for x in half:
            s.send(x)
        s.send_bytes(b"not a segment at all", "garbage")
        s.send_bytes(cut_short, "cut")
        s.send_bytes(flipped, "flipped")
    _until(lambda: rx.poll(0.2) >= 0 and rx.stats.received == len(segs) + 7, 30, "the rest")
    assert rx.stats.duplicates == 2 and rx.stats.rejected == 3 and rx.stats.held() == 2
    now[0] = 11.0  # the half message expires: its held segments are dead-lettered, not accepted
    rx.poll(0.1)
    assert rx.stats.rejected == 5 and rx.stats.held() == 0
    assert rx.stats.by_reason == {
        int(Reason.BAD_MAGIC): 1,
        int(Reason.TRUNCATED): 1,
        int(Reason.DATA_CHECKSUM_ERROR): 1,
        int(Reason.INCOMPLETE_MSG): 2,
    }
    assert isinstance(quarantined[-1], Unfinished) and quarantined[-1].cause.value == "expired"
    s = rx.stats
    assert s.received == s.used + s.duplicates + s.rejected + s.held()
    rx.close()
    assert _drain(url, queue) == []
    dlq = _drain(url, "ActiveMQ.DLQ")
    assert sorted(dlq) == sorted([b"not a segment at all", cut_short, flipped, *(x.encode() for x in half)])


# ------------------------------------------------------------------- competing consumers
def _traffic(rng: random.Random, units: int) -> tuple[list[list[Segment]], dict[tuple[str, int], str]]:
    """Units (one message or one MQ group each) as segment lists, and the expected sink rows."""
    out: list[list[Segment]] = []
    expected: dict[tuple[str, int], str] = {}
    for _ in range(units):
        kind = rng.random()
        if kind < 0.6:
            payload = rng.randbytes(rng.randint(0, 9000))
            segs = segment(payload, max_segment_size=2048)
            expected[(segs[0].header.group_id.hex(), 1)] = hashlib.sha256(payload).hexdigest()
        else:
            payloads = [rng.randbytes(rng.randint(1, 5000)) for _ in range(rng.randint(2, 4))]
            segs = list(segment_group(payloads, max_segment_size=2048))
            for i, p in enumerate(payloads, 1):
                expected[(segs[0].header.group_id.hex(), i)] = hashlib.sha256(p).hexdigest()
        out.append(segs)
    return out, expected


def _interleave(rng: random.Random, units: list[list[Segment]]) -> list[Segment]:
    queues = [list(u) for u in units]
    out: list[Segment] = []
    while queues:
        q = rng.choice(queues)
        out.append(q.pop(0))
        if not q:
            queues.remove(q)
    return out


def _holding_intervals(log: Path, end: float) -> dict[str, list[tuple[float, float]]]:
    """Per group: the times this consumer held unsettled segments of it (open ones end at ``end``)."""
    held: dict[str, int] = defaultdict(int)
    start: dict[str, float] = {}
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for line in log.read_text().splitlines():
        kind, gid, t = line.split()[:3]
        if kind == "F":  # a fetch: marks what was written, holds nothing
            continue
        if kind == "R":
            if held[gid] == 0:
                start[gid] = float(t)
            held[gid] += 1
        else:
            held[gid] -= 1
            if held[gid] == 0:
                out[gid].append((start[gid], float(t)))
    for gid, n in held.items():
        if n:
            out[gid].append((start[gid], end))
    return out


@pytest.mark.parametrize("scheme", SCHEMES)
def test_competing_consumers_groups_and_a_killed_consumer(
    broker: ActiveMQ, scheme: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url, queue = broker.url(scheme), _queue(request)
    rng = random.Random(13)
    units, expected = _traffic(rng, 240)
    big = segment(rng.randbytes(16_000), max_segment_size=2048)  # 8 segments, half sent first
    expected[(big[0].header.group_id.hex(), 1)] = hashlib.sha256(b"".join(bytes(s.data) for s in big)).hexdigest()
    sink = tmp_path / "sink.sqlite"
    names = ["c1", "c2", "c3"]
    procs = {
        n: subprocess.Popen(
            [
                sys.executable,
                str(CONSUMER),
                url,
                queue,
                n,
                str(sink),
                str(tmp_path / f"{n}.log"),
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=free_env(),
        )
        for n in names
    }
    try:
        for p in procs.values():
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        time.sleep(1.0)  # groups stick to the consumers attached when their first message arrives
        traffic = _interleave(rng, units)
        with open_sender(url, queue) as s:
            for x in big[:4]:
                s.send(x)
            for x in traffic:
                s.send(x)
        sent = len(traffic) + len(big)
        big_gid = big[0].header.group_id.hex()

        def rows() -> int:
            if not sink.exists():
                return 0
            with sqlite3.connect(sink, timeout=30) as db:
                return int(db.execute("select count(*) from msgs").fetchone()[0])

        _until(lambda: rows() == len(expected) - 1, 120, "every message but the half one")
        holder = next(n for n in names if big_gid in (tmp_path / f"{n}.log").read_text())

        def holds_only_big() -> bool:
            # A message is in the sink before its segments are acknowledged: a kill between the
            # two would leave a redelivered fragment of a delivered message held by a survivor.
            spans = _holding_intervals(tmp_path / f"{holder}.log", math.inf)
            return {g for g, s in spans.items() if s and s[-1][1] == math.inf} == {big_gid}

        def settlements_written() -> bool:
            # accept() queues a settlement; the next fetch writes it (one write per batch). A kill
            # before that write would get every segment of an already delivered message redelivered.
            lines = complete_lines(tmp_path / f"{holder}.log")
            last = max((i for i, line in enumerate(lines) if line[0] in "AJ"), default=-1)
            return any(line[0] == "F" for line in lines[last + 1 :])

        _until(lambda: holds_only_big() and settlements_written(), 60, "the holder settled all but the half message")
        # Its holding ends when the signal is sent: the broker may redeliver to a survivor (which
        # logs the receipt) before wait() returns here, so a time taken after wait() can be late.
        killed_at = time.monotonic()
        procs[holder].send_signal(signal.SIGKILL)  # it holds 4 of 8 segments, unacknowledged
        procs[holder].wait()
        with open_sender(url, queue) as s:
            for x in big[4:]:
                s.send(x)
        _until(lambda: rows() == len(expected), 60, "the half message, completed by a survivor")
        stats = {}
        for n, p in procs.items():
            if n != holder:
                p.send_signal(signal.SIGTERM)
                out, _ = p.communicate(timeout=60)
                assert p.returncode == 0
                stats[n] = __import__("json").loads(out.strip().splitlines()[-1])
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()

    # Exactly once by content: every message, the right bytes; the sink deduplicated any redelivery.
    with sqlite3.connect(sink) as db:
        got = {(g, s): sha for g, s, sha in db.execute("select gid, seq, sha from msgs")}
        dups = db.execute("select gid, seq, sha from dups").fetchall()
    assert got == expected
    assert all(expected[(g, s)] == sha for g, s, sha in dups)

    # One consumer at a time per group: no two consumers' holding intervals of a group overlap.
    intervals = {n: _holding_intervals(tmp_path / f"{n}.log", killed_at if n == holder else 1e18) for n in names}
    for gid in {g for per in intervals.values() for g in per}:
        spans = sorted((a, b, n) for n in names for a, b in intervals[n].get(gid, []))
        for (_, b1, n1), (a2, _, n2) in itertools.pairwise(spans):
            assert n1 == n2 or b1 <= a2, f"group {gid} held by {n1} and {n2} at once"
    survivors = [n for n in names if n != holder]
    assert any(big_gid in intervals[n] for n in survivors)  # the group moved with its redelivery
    assert sum(s["redelivered"] for s in stats.values()) >= 4
    assert all(sum(1 for v in intervals[n].values() if v) for n in names)  # every consumer did work

    # Accounting: each receiver's identity, and every message the broker held settled exactly once.
    for s in stats.values():
        assert s["held"] == 0 and s["rejected"] == 0
        assert s["received"] == s["used"] + s["duplicates"] + s["rejected"]
    settled = sum(1 for n in names for line in (tmp_path / f"{n}.log").read_text().splitlines() if line[0] in "AJ")
    assert settled == sent
    assert _drain(url, queue) == [] and _drain(url, "ActiveMQ.DLQ", 0.3) == []


# ------------------------------------------------------------------------------ size limits
LIMIT = 1 << 20


@pytest.fixture(scope="module")
def limited() -> Iterator[ActiveMQ]:
    """A second broker whose AMQP and STOMP connectors refuse messages above 1 MiB."""
    with activemq(max_frame_size=LIMIT) as b:
        yield b


@pytest.mark.parametrize("scheme", SCHEMES)
def test_50_mib_through_a_1_mib_broker_limit(limited: ActiveMQ, scheme: str) -> None:
    limit = LIMIT
    url = limited.url(scheme)
    payload = os.urandom(50 << 20)
    size = segment_size_for(limit)
    segs = segment(payload, max_segment_size=size)
    assert len(segs) == 51 and max(len(s.encode()) for s in segs) <= size
    with open_sender(url, f"big.{scheme}", max_message_size=limit) as s:
        with pytest.raises(SegmentationError) as too_big:  # refused here, before the broker sees it
            s.send_bytes(bytes(limit))
        assert too_big.value.reason == Reason.MSG_TOO_BIG_FOR_CHANNEL
        for x in segs:
            s.send(x)
    got: list[bytes] = []
    rx = BrokerReceiver(open_consumer(url, f"big.{scheme}", prefetch=100), lambda ev: got.append(bytes(ev.payload)))  # type: ignore[union-attr,arg-type]
    _until(lambda: rx.poll(0.5) >= 0 and bool(got), 120, "the 50 MiB message")
    rx.close()
    assert got == [payload] and rx.stats.used == len(segs)
    # the broker itself drops a connection that sends more
    with pytest.raises(BrokerError), open_sender(url, f"big.{scheme}") as s:
        s.send_bytes(bytes(limit + 1))


def test_the_broker_benchmark_runs_one_size_and_records_the_decoder(broker: ActiveMQ, tmp_path: Path) -> None:
    """``python -m bench.brokerbench`` against this broker, one round of 1 MiB per case at 64 KiB:
    every case moved every message both ways, and each row says which segment decoder received."""
    import json

    from bench import brokerbench
    from segmenter.wire import COMPILED_DECODER

    out = tmp_path / "broker.json"
    argv = ["--stomp", broker.stomp_url, "--broker-pid", str(broker.proc.pid), "--mib", "1", "--rounds", "1"]
    assert brokerbench.main([*argv, "--sizes", "64KiB", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert sorted(r["case"] for r in rows) == ["bare", "floor", "segmented"]
    assert {(r["segment"], r["protocol"], r["messages"]) for r in rows} == {("64KiB", "stomp", 16)}
    assert {r["decoder"] for r in rows} == {"python" if COMPILED_DECODER is None else "compiled"}
