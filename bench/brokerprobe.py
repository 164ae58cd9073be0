"""Where the 64 KiB STOMP receive loses against its floor: the floor's bare consumer
and the ``BrokerReceiver`` next to consumers that do one part of the ``BrokerReceiver``'s work each, over
queues filled the same way, in rotating order; the ratio is the median of the per-round ratios
floor / case (as in :mod:`bench.brokerbench`).

* **seg-bare**: the segmented queue drained by the floor's bare consumer (the broker's part);
* **seg-hold8**: the same, accepting deliveries 8 at a time (the acknowledgements held as the
  ``BrokerReceiver`` holds them, no decoding);
* **seg-decode**: each segment decoded and verified (header, data CRC), then accepted (the
  ``BrokerReceiver``'s decode without its assembly).

    python -m bench.brokerprobe --rounds 16 [--prefetch 64] [--mib 256]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

from segmenter.brokers import Delivery, body_view, open_consumer
from segmenter.wire import decode_segment

from .brokerbench import PER_MESSAGE, _receive_floor, _receive_segmented, _send_floor, _send_segmented, _timed

SIZE = 64 << 10


def _drain(url: str, queue: str, count: int, prefetch: int, each: Callable[[list[Delivery]], None], hold: int) -> int:
    """Accept ``count`` deliveries ``hold`` at a time, after ``each`` saw them."""
    c = open_consumer(url, queue, prefetch=prefetch)
    got, held = 0, []
    try:
        while got < count:
            for d in c.fetch(10.0):
                held.append(d)
                got += 1
                if len(held) == hold:
                    each(held)
                    for x in held:
                        x.accept()
                    held = []
    finally:
        c.close()
    return got


def _nothing(held: list[Delivery]) -> None:
    pass


def _decode(held: list[Delivery]) -> None:
    for d in held:
        decode_segment(body_view(d))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.brokerprobe", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=16)
    p.add_argument("--prefetch", type=int, default=64)
    p.add_argument("--mib", type=int, default=256, help="MiB per case and round")
    args = p.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from tests.support.activemq_server import activemq

    payload = os.urandom((SIZE - 84) * PER_MESSAGE)
    messages = (args.mib << 20) // (SIZE * PER_MESSAGE)
    count = messages * PER_MESSAGE
    body = os.urandom(SIZE)
    rates: dict[str, list[tuple[float, float, float]]] = {}
    with activemq(heap="1g", amqp_frame_size=1 << 20) as broker:
        url, pid, pre = broker.stomp_url, broker.proc.pid, args.prefetch
        for r in range(args.rounds):
            q = f"probe.{r}"
            groups: list[str | None] = [os.urandom(24).hex() for _ in range(messages) for _ in range(PER_MESSAGE)]
            fill = partial(_send_segmented, url, payload=payload, messages=messages, size=SIZE)
            drain = partial(_drain, url, count=count, prefetch=pre)
            cases = {
                "floor": (partial(_send_floor, url, q + ".f", body, groups),
                          partial(_receive_floor, url, q + ".f", count, pre)),
                "segmented": (partial(fill, queue=q + ".s"), partial(_receive_segmented, url, q + ".s", messages, pre)),
                "seg-bare": (partial(fill, queue=q + ".b"), partial(drain, q + ".b", each=_nothing, hold=1)),
                "seg-hold8": (partial(fill, queue=q + ".h"), partial(drain, q + ".h", each=_nothing, hold=8)),
                "seg-decode": (partial(fill, queue=q + ".d"), partial(drain, q + ".d", each=_decode, hold=1)),
            }  # fmt: skip
            names = list(cases)
            for name in names[r % len(names) :] + names[: r % len(names)]:
                send, receive = cases[name]
                _timed(send, pid)
                wall, cpu, broker_cpu, _ = _timed(receive, pid)
                rates.setdefault(name, []).append(
                    (count * SIZE / (1 << 20) / wall, 1e6 * cpu / count, 1e6 * broker_cpu / count)
                )
                print(f"r{r} {name:10} {rates[name][-1][0]:7.1f} MiB/s", flush=True)
    floor = [x[0] for x in rates["floor"]]
    print("| case | receive MiB/s (median) | ratio floor / case (median of rounds) | client / broker CPU us per msg |")
    print("|---|---:|---:|---|")
    for name, v in rates.items():
        ratio = statistics.median(f / x[0] for f, x in zip(floor, v, strict=True))
        cpu = f"{statistics.median(x[1] for x in v):.0f} / {statistics.median(x[2] for x in v):.0f}"
        print(f"| {name} | {statistics.median(x[0] for x in v):.0f} | {ratio:.2f}x | {cpu} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
