"""The STOMP receiving client's CPU without a broker: floor against segmented, same bytes in.

Why: through a real broker (``bench.brokerbench``) the client's CPU and the wall time swing with
the broker's JIT and garbage collector; this feeds the same client code a recorded-style stream
of MESSAGE frames (headers as ActiveMQ sends them), in reads of ``--read`` bytes as a socket
would give them, and times each consumer's whole loop: the parser, the deliveries, the
settlements (encoded and queued, not sent), and for the segmented case the ``BrokerReceiver`` (decode,
verify, assemble, hand over, accept). The floor takes unsegmented bodies of the same size and
accepts each. Medians of ``--rounds`` runs, CPU µs per message and minor page faults.

    python -m bench.stompclient --kib 64 1024
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from collections.abc import Callable, Iterator

from reassembly import Assembler, Limits
from reassembly.brokers.receiver import BrokerReceiver
from segmenter import Segmenter
from segmenter.brokers import Delivery
from segmenter.brokers.recycle import BufferPool
from segmenter.brokers.stomp_client import StompFrame, StompParser

PER_MESSAGE = 8


def _frame(i: int, body: bytes, group: str) -> bytes:
    head = (
        f"MESSAGE\ncontent-length:{len(body)}\nexpires:0\ndestination:/queue/bench\nsubscription:1\n"
        f"priority:4\nJMSXGroupID:{group}\nmessage-id:ID:host-12345-1700000000000-1:1:1:1:{i}\n"
        f"persistent:true\ntimestamp:1700000000000\nack:ID:host-12345-1700000000000-5:{i}\n\n"
    )
    return head.encode() + body + b"\x00"


class _Delivery:
    """A STOMP delivery whose settlement is encoded and queued as the real one is, never sent."""

    __slots__ = ("_ack", "_out", "redelivered", "view")

    def __init__(self, f: StompFrame, out: list[bytes]) -> None:
        self._ack, self._out, self.view, self.redelivered = f.headers["ack"].encode(), out, f.body, False

    @property
    def body(self) -> bytes:
        return bytes(self.view)

    def accept(self) -> None:
        self._out.append(b"ACK\nid:" + self._ack + b"\n\n\x00")

    def reject(self, reason: int, description: str) -> None:
        raise AssertionError(description)


class _Replay:
    """A Consumer over a wire recording: each fetch is one read of ``read`` bytes into the parser."""

    def __init__(self, wire: bytes, read: int) -> None:
        self.wire, self.read, self.at = memoryview(wire), read, 0
        self.parser = StompParser(pool=BufferPool())  # as the STOMP consumer's connection has
        self.settled: list[bytes] = []

    def fetch(self, timeout: float) -> list[Delivery]:
        frames: list[StompFrame] = []
        while not frames and self.at < len(self.wire):
            with self.parser.space() as room:
                n = min(len(room), self.read, len(self.wire) - self.at)
                room[:n] = self.wire[self.at : self.at + n]
            self.parser.wrote(n)
            self.at += n
            frames = self.parser.frames()
        if len(self.settled) > 64:
            b"".join(self.settled)  # the batched write's join, as the consumer does
            self.settled = []
        return [_Delivery(f, self.settled) for f in frames]

    def done(self) -> bool:
        return self.at >= len(self.wire)

    def close(self) -> None:
        pass


def _wires(size: int, messages: int) -> tuple[bytes, bytes]:
    """The floor's and the segmented case's recordings: as many frames of ``size``-byte bodies."""
    payload = os.urandom((size - 84) * PER_MESSAGE)
    segmented, floor = [], []
    body = os.urandom(size)
    for m in range(messages):
        group = os.urandom(24).hex()
        for j, s in enumerate(Segmenter(size).segment(payload)):
            segmented.append(_frame(m * PER_MESSAGE + j, s.encode(), group))
            floor.append(_frame(m * PER_MESSAGE + j, body, group))
    return b"".join(floor), b"".join(segmented)


def _floor(c: _Replay) -> None:
    while not c.done():
        for d in c.fetch(0):
            d.accept()


def _segmented(c: _Replay) -> None:
    rx = BrokerReceiver(c, lambda ev: None, Assembler(Limits(), join=False))
    while not c.done():
        rx.poll(0)
    assert rx.stats.held() == 0 and rx.stats.rejected == 0


def _measure(fn: Callable[[_Replay], None], wire: bytes, read: int) -> tuple[float, float]:
    c = _Replay(wire, read)
    faults, cpu = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.process_time()
    fn(c)
    return time.process_time() - cpu, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults


def run(size: int, mib: int, read: int, rounds: int) -> Iterator[str]:
    messages = max(1, (mib << 20) // (size * PER_MESSAGE))
    count = messages * PER_MESSAGE
    floor, segmented = _wires(size, messages)
    cases = {"floor": (_floor, floor), "segmented": (_segmented, segmented)}
    got: dict[str, list[tuple[float, float]]] = {k: [] for k in cases}
    for r in range(rounds + 1):
        for name, (fn, wire) in cases.items():
            x = _measure(fn, wire, read)
            if r:  # the first round warms up
                got[name].append(x)
    med = {k: (statistics.median(1e6 * v[0] / count for v in xs), statistics.median(v[1] / count for v in xs))
           for k, xs in got.items()}  # fmt: skip
    f, s = med["floor"], med["segmented"]
    yield (
        f"{size >> 10:5d} KiB  reads of {read >> 10} KiB  CPU µs per message: floor {f[0]:7.1f}  segmented "
        f"{s[0]:7.1f}  ratio {s[0] / f[0]:.2f}x   page faults per message: {f[1]:.1f} / {s[1]:.1f}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.stompclient", description=__doc__.split("\n\n")[0])
    p.add_argument("--kib", type=int, nargs="+", default=[64, 1024], help="segment (body) sizes in KiB")
    p.add_argument("--mib", type=int, default=64, help="MiB per case")
    p.add_argument("--read", type=int, default=64, help="KiB per socket read (default 64)")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    for kib in args.kib:
        for line in run(kib << 10, args.mib, args.read << 10, args.rounds):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
