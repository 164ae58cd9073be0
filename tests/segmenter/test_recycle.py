"""Pooled receive buffers (segmenter.brokers.recycle) and messages handed over as views (ScatteredPayload).

The pool's one promise: a buffer is lent again only when nothing can see it, so no body anybody
still holds ever changes. Tested from every kind of holder: the view itself, a slice of it, a
memoryview or numpy-free cast of a slice, a payload built from it, an exception's raw bytes, a
parser frame.
"""

from __future__ import annotations

import gc
import io
import os
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from reassembly import Assembler, Limits, MessageComplete, ScatteredPayload
from reassembly.brokers.receiver import BrokerReceiver
from segmenter import Codec, Segmenter
from segmenter.brokers import body_view
from segmenter.brokers.recycle import MIN_SIZE, BufferPool
from segmenter.brokers.stomp import _StompDelivery
from segmenter.brokers.stomp_client import StompFrame, StompParser

KiB = 1 << 10


def _body(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def test_a_copy_is_read_only_and_equal() -> None:
    pool = BufferPool()
    data = _body(40 * KiB, 1)
    got = pool.copy(memoryview(data))
    assert isinstance(got, memoryview) and got.readonly and got == data and len(got) == len(data)
    assert pool.kept == 40 * KiB  # 40 KiB is a multiple of its size class's step (8 KiB)
    big = BufferPool().copy(_body(33 * KiB + 1, 2))
    assert isinstance(big, memoryview) and len(big.obj) == 40 * KiB  # type: ignore[arg-type]  # steps of 8 KiB


def test_small_bodies_are_plain_bytes_and_cost_the_pool_nothing() -> None:
    pool = BufferPool()
    for n in (0, 1, MIN_SIZE - 1):
        got = pool.copy(_body(n, n))
        assert type(got) is bytes and got == _body(n, n)
    assert pool.kept == 0
    every = BufferPool(min_size=0)  # the size classes hold from 0 bytes up
    held = [every.copy(_body(n, n)) for n in range(0, 40)]
    assert [bytes(h) for h in held] == [_body(n, n) for n in range(0, 40)]


def test_a_buffer_is_reused_only_after_every_reference_is_gone() -> None:
    pool = BufferPool()
    first = pool.copy(_body(20 * KiB, 1))
    holders = {
        "the view": lambda v: v,
        "a slice": lambda v: v[5:100],
        "a slice's cast": lambda v: v[8:1000].cast("B"),
        "a view of a slice": lambda v: memoryview(v[10:]),
        "a payload of it": lambda v: ScatteredPayload((v[:10], v[10:])),
        "a list holding a slice": lambda v: [v[1:2]],
    }
    del first
    for name, hold in holders.items():
        body = _body(20 * KiB, hash(name) & 0xFFFF)
        view = pool.copy(body)
        kept = hold(view)
        del view
        for i in range(20):  # many more copies of the same size: none may land in the held buffer
            pool.copy(_body(20 * KiB, i))
        whole = bytes(kept) if not isinstance(kept, list) else bytes(kept[0])
        expect = {
            "the view": body,
            "a slice": body[5:100],
            "a slice's cast": body[8:1000],
            "a view of a slice": body[10:],
            "a payload of it": body,
            "a list holding a slice": body[1:2],
        }[name]
        assert whole == expect, name
        del kept
        gc.collect()
    before = pool.reused
    pool.copy(_body(20 * KiB, 99))
    assert pool.reused == before + 1  # released: lent again


def test_the_pool_never_keeps_more_than_its_bound() -> None:
    pool = BufferPool(max_bytes=256 * KiB)
    held = [pool.copy(_body(60 * KiB, i)) for i in range(10)]  # 64 KiB buffers (steps of 8): 4 fit
    assert pool.kept == 256 * KiB
    assert [type(h) for h in held].count(bytes) == 6  # the rest: plain copies, still correct
    assert all(bytes(h) == _body(60 * KiB, i) for i, h in enumerate(held))


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.integers(MIN_SIZE, 200 * KiB), st.integers(0, 5), st.booleans()), min_size=1, max_size=60
    ),
    cap=st.sampled_from([0, 128 * KiB, 1 << 20, 64 << 20]),
)
def test_no_held_body_ever_changes_whatever_the_order_of_copies_and_releases(
    ops: list[tuple[int, int, bool]], cap: int
) -> None:
    pool = BufferPool(max_bytes=cap)
    live: list[tuple[memoryview | bytes, bytes]] = []
    for i, (size, drop, slice_it) in enumerate(ops):
        body = os.urandom(size)
        got = pool.copy(body)
        live.append((got[1:] if slice_it else got, body[1:] if slice_it else body))
        del got
        for _ in range(min(drop, len(live))):  # release some, oldest or newest
            live.pop(0 if i % 2 else -1)
        for view, want in live:
            assert bytes(view) == want
        assert pool.kept <= cap


def _frame(body: bytes, i: int) -> bytes:
    return b"MESSAGE\nack:%d\ncontent-length:%d\n\n%s\x00" % (i, len(body), body)


def test_parser_bodies_held_across_later_frames_keep_their_bytes() -> None:
    bodies = [_body(random.Random(i).randint(MIN_SIZE, 300 * KiB), i) for i in range(40)]
    wire = b"".join(_frame(b, i) for i, b in enumerate(bodies))
    parser = StompParser(pool=BufferPool())
    got = []
    for at in range(0, len(wire), 70_001):  # reads that split frames anywhere
        got += parser.feed(wire[at : at + 70_001])
        if len(got) > 8:
            got[: len(got) - 8] = [f._replace(body=bytes(f.body)) for f in got[: len(got) - 8]]
    assert [bytes(f.body) for f in got] == bodies
    assert parser.pool is not None and parser.pool.reused > 0  # the released ones were lent again


# ------------------------------------------------------------- ScatteredPayload
def _segments(payload: bytes, size: int, codec: Codec = Codec.NONE) -> list[bytes]:
    return [s.encode() for s in Segmenter(size, codec=codec).segment(payload)]


def test_join_false_hands_over_views_of_the_segments_in_order() -> None:
    payload = _body(10_000, 7)
    segs = _segments(payload, 1000)
    (done,) = [e for e in Assembler(join=False).receive_many(segs) if isinstance(e, MessageComplete)]
    p = done.payload
    assert isinstance(p, ScatteredPayload) and len(p.parts) == len(segs)
    assert bytes(p) == payload and p == payload and payload == p and len(p) == len(payload)
    assert p == memoryview(payload) and p == bytearray(payload) and p == ScatteredPayload((payload,))
    assert p != payload[:-1] and p != payload[:-1] + b"\0" and p != "text"
    assert all(isinstance(x, memoryview) and x.readonly for x in p)
    out = io.BytesIO()
    out.writelines(p)
    assert out.getvalue() == payload
    assert "parts" in repr(p)


def test_join_false_keeps_one_buffer_where_there_is_nothing_to_join() -> None:
    payload = _body(3000, 8)
    one = [e for e in Assembler(join=False).receive_many(_segments(payload, 5000)) if isinstance(e, MessageComplete)]
    assert not isinstance(one[0].payload, ScatteredPayload) and one[0].payload == payload
    text = b"lorem ipsum " * 2000  # compressed: decoded into one buffer whatever join says
    events = Assembler(join=False).receive_many(_segments(text, 600, Codec.ZSTD))
    z = [e for e in events if isinstance(e, MessageComplete)]
    assert not isinstance(z[0].payload, ScatteredPayload) and z[0].payload == text


def test_join_false_delivers_the_same_events_as_join_true_on_hostile_input() -> None:
    rng = random.Random(3)
    payloads = [_body(rng.randint(1, 9000), i) for i in range(12)]
    arrivals = [s for p in payloads for s in _segments(p, rng.randint(200, 3000))]
    arrivals += rng.sample(arrivals, 10)  # duplicates
    bad = bytearray(arrivals[5])
    bad[-1] ^= 1
    arrivals[5:6] = [bytes(bad), arrivals[5]]  # a damaged copy, then the good one
    rng.shuffle(arrivals)

    def run(join: bool) -> list[object]:
        asm = Assembler(Limits(), join=join)
        evs = asm.receive_many(arrivals) + asm.close()
        return [(type(e).__name__, bytes(e.payload) if isinstance(e, MessageComplete) else None) for e in evs]

    assert run(False) == run(True)


class _Delivery:
    def __init__(self, body: bytes) -> None:
        self.body, self.redelivered, self.settled = body, False, ""

    def accept(self) -> None:
        self.settled = "accepted"

    def reject(self, reason: int, description: str) -> None:
        self.settled = "rejected"


class _Consumer:
    def __init__(self, items: list[_Delivery]) -> None:
        self.items = items

    def fetch(self, timeout: float) -> list[_Delivery]:
        out, self.items = self.items, []
        return out

    def close(self) -> None:
        pass


def test_a_receiver_hands_over_views_when_its_assembler_does_not_join() -> None:
    payload = _body(50_000, 9)
    for join in (False, True):
        deliveries = [_Delivery(s) for s in _segments(payload, 4096)]
        got: list[object] = []
        rx = BrokerReceiver(_Consumer(list(deliveries)), got.append, Assembler(Limits(), join=join))
        rx.poll(0)
        (ev,) = got
        assert isinstance(ev, MessageComplete) and isinstance(ev.payload, ScatteredPayload) is not join
        assert bytes(ev.payload) == payload and all(d.settled == "accepted" for d in deliveries)
    assert BrokerReceiver(_Consumer([]), got.append).assembler.join  # the default: one buffer


def test_a_stomp_delivery_keeps_bytes_in_body_and_the_pooled_view_beside_it() -> None:
    pool = BufferPool()
    data = _body(70_000, 10)
    view = pool.copy(data)
    d = _StompDelivery(None, StompFrame("MESSAGE", {"ack": "ID:1"}, view))  # type: ignore[arg-type]
    assert type(d.body) is bytes and d.body == data  # what callers that keep bytes get
    assert body_view(d) is view  # what the BrokerReceiver and the drain read: no copy
    small = _StompDelivery(None, StompFrame("MESSAGE", {"ack": "ID:2"}, b"xy"))  # type: ignore[arg-type]
    assert small.body is body_view(small)  # plain bytes: nothing to copy
    plain = _Delivery(b"abc")  # a delivery without a view (AMQP, a test double): its body
    assert body_view(plain) is plain.body
