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
