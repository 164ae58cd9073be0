"""Segmenter and in-process assembler throughput, as ratios to physical floors measured in the same run."""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from reassembly import Assembler, Limits
from segmenter import Codec, Segmenter
from segmenter.checksum import DEFAULT_ALGORITHM, checksum

KiB, MiB = 1 << 10, 1 << 20


def timed(fn: Callable[[], Any], repeat: int) -> float:
    """Median wall time of ``repeat`` runs (after one warm-up)."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _result(payload: int, segment: int, seconds: float, floor: float) -> dict[str, Any]:
    return {
        "payload": payload,
        "segment": segment,
        "seconds": seconds,
        "gbps": payload / seconds / 1e9,
        "floor_gbps": payload / floor / 1e9,
        "ratio_to_floor": floor / seconds,
    }


def _payload(size: int, codec: Codec) -> bytes:
    # Half random, half text-like: zstd has something to do, as with real documents.
    if codec == Codec.NONE:
        return os.urandom(size)
    text = (b"<record id='%d'>lorem ipsum dolor sit amet</record>\n" * (size // 40 + 1))[: size // 2]
    return text + os.urandom(size - len(text))


def segmenter_cases(quick: bool) -> list[dict[str, Any]]:
    """GB/s of cutting (slices, checksums, headers packed) vs one checksum pass over the payload."""
    payloads = [1 * MiB, 64 * MiB] if quick else [1 * MiB, 64 * MiB, 256 * MiB, 1024 * MiB]
    sizes = [4 * KiB, 64 * KiB, 4 * MiB] if quick else [4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB]
    out = []
    for codec in (Codec.NONE, Codec.ZSTD):
        for psize in payloads:
            if codec == Codec.ZSTD and psize > 256 * MiB:
                continue  # zstd level 3 is ~0.3 GB/s here: 1 GiB would take minutes per size
            payload = _payload(psize, codec)
            repeat = 3 if psize <= 64 * MiB else 1
            floor = timed(lambda p=payload: checksum(DEFAULT_ALGORITHM, p), repeat)
            for ssize in sizes:
                seg = Segmenter(ssize, codec=codec)

                def run(seg: Segmenter = seg, payload: bytes = payload) -> None:
                    for s in seg.segment(payload):
                        s.header.pack()

                out.append({"codec": codec.name.lower(), **_result(psize, ssize, timed(run, repeat), floor)})
        del payload
    return out


def assembler_cases(quick: bool) -> list[dict[str, Any]]:
    """GB/s of reassembly (decode, verify, place, check message) vs one memcpy + one checksum pass."""
    psize = 64 * MiB if quick else 256 * MiB
    out = []
    for ssize in (64 * KiB, 1 * MiB):
        payload = os.urandom(psize)
        segs = [s.encode() for s in Segmenter(ssize).segment(payload)]

        def floor_run(segs: list[bytes] = segs, n: int = psize) -> None:
            buf = bytearray(n)
            view, pos = memoryview(buf), 0
            for raw in segs:
                data = memoryview(raw)[84:]
                view[pos : pos + len(data)] = data
                pos += len(data)
            checksum(DEFAULT_ALGORITHM, buf)

        floor = timed(floor_run, 3)
        rng = random.Random(1)
        orders = {
            "in_order": segs,
            "shuffled": rng.sample(segs, len(segs)),
            "dup_1pct": rng.sample(
                segs + rng.sample(segs, max(1, len(segs) // 100)), len(segs) + max(1, len(segs) // 100)
            ),
        }
        for name, order in orders.items():
            limits = Limits(max_message_size=psize)

            def run(order: list[bytes] = order, limits: Limits = limits) -> None:
                Assembler(limits).receive_many(order)

            out.append({"order": name, **_result(psize, ssize, timed(run, 3), floor)})
    return out


class _Delivery:
    """A broker delivery without a broker: the bytes, and settlements that cost nothing."""

    __slots__ = ("body", "redelivered")

    def __init__(self, body: bytes) -> None:
        self.body, self.redelivered = body, False

    def accept(self) -> None:
        pass

    def reject(self, reason: int, description: str) -> None:
        raise AssertionError(description)


class _Deliveries:
    """A Consumer handing out a prepared list of deliveries in one fetch."""

    def __init__(self, items: list[_Delivery]) -> None:
        self.items = items

    def fetch(self, timeout: float) -> list[Any]:
        out, self.items = self.items, []
        return out

    def close(self) -> None:
        pass


def receiver_steps(size: int, messages: int, rounds: int = 5) -> dict[str, float]:
    """CPU µs per segment of each step of a broker receive, without the broker: 8-segment
    messages of ``size``-byte encoded segments, in order, through ``decode_header``, the data CRC,
    ``decode_segment``, the join of a message, ``Assembler.receive`` (the 7 waiting segments, the
    8th that completes the message) and the whole ``BrokerReceiver``; medians of ``rounds``."""
    from reassembly.brokers.receiver import BrokerReceiver
    from segmenter.wire import decode_header, decode_segment

    payload = os.urandom((size - 84) * 8)
    bodies = [s.encode() for _ in range(messages) for s in Segmenter(size).segment(payload)]
    views = [memoryview(b)[84:] for b in bodies]
    clock = time.process_time

    def once() -> dict[str, float]:
        t: dict[str, float] = {}
        start = clock()
        for b in bodies:
            decode_header(b)
        t["header decode"] = clock() - start
        start = clock()
        for v in views:
            checksum(DEFAULT_ALGORITHM, v)
        t["data CRC"] = clock() - start
        start = clock()
        for b in bodies:
            decode_segment(b)
        t["decode_segment (header, CRC, framing)"] = clock() - start
        start = clock()
        for i in range(0, len(views), 8):
            b"".join(views[i : i + 8])
        t["join of the message"] = clock() - start
        asm, waiting, completing = Assembler(Limits()), 0.0, 0.0
        for i, b in enumerate(bodies):
            start = clock()
            asm.receive(b)
            if i % 8 == 7:
                completing += clock() - start
            else:
                waiting += clock() - start
        t["Assembler.receive: segments 1-7 (waiting)"] = waiting
        t["Assembler.receive: segment 8 (judged, built, delivered)"] = completing
        t["Assembler.receive: all"] = waiting + completing
        # As a broker receiver builds it: the message handed over as views of its segments (no join).
        rx = BrokerReceiver(
            _Deliveries([_Delivery(b) for b in bodies]), lambda ev: None, Assembler(Limits(), join=False)
        )
        start = clock()
        rx.poll(0)
        t["BrokerReceiver (message as views, join=False): all"] = clock() - start
        assert rx.stats.used == len(bodies)
        return t

    once()
    runs = [once() for _ in range(rounds)]
    return {k: 1e6 * statistics.median(r[k] for r in runs) / len(bodies) for k in runs[0]}


if __name__ == "__main__":
    import sys

    kib = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    for step, us in receiver_steps(kib << 10, max(1, (64 << 10) // (8 * kib))).items():
        print(f"{step:55s} {us:8.1f} µs per segment (share of all segments)")
    print(f"load average {os.getloadavg()[0]:.1f}")
