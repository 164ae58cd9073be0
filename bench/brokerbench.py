"""Segments through a real broker against the floor: the same broker moving unsegmented messages
of the same size (the performance goal: within 1.2x of that floor).

Three cases per segment size, protocol and round, in an order that rotates from round to round
(a loaded machine hurts all alike): each sends over a queue (the clock stops when ``close()``
returned, i.e. once the broker confirmed every message: AMQP accepted, STOMP receipt), then
drains it (every delivery acknowledged).

* **floor**: ``bytes`` bodies of the segment size through ``Sender.send_bytes`` *with a broker
  group*, a new one every 8 messages, as the segmented case has (a 48-hex-char GroupId per
  8-segment message): the broker does the same message-group work (assign each new group to the
  consumer, route by it), so the only difference left is segmentation itself. Received by a bare
  consumer that accepts each delivery.
* **bare**: the same without a group, to show what groups cost.
* **segmented**: 8-segment payloads cut by the ``Segmenter`` (each encoded segment is exactly the
  size) sent with ``Sender.send``, received by the ``BrokerReceiver`` (decode, assemble, hand over,
  then acknowledge).

The table gives each case's median MiB/s over the rounds (min-max) and the ratio as the median
of the per-round ratios floor / segmented: a pair measured seconds apart shares the machine's
load, which a ratio of two medians taken from different rounds does not. Starts a throwaway
ActiveMQ (tests/support/activemq_server.py, AMQP frames of 1 MiB) unless ``--amqp``/``--stomp`` URLs are given.

    python -m bench.brokerbench --mib 64 --rounds 6
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any

from reassembly import Assembler, Limits
from reassembly.brokers.receiver import BrokerReceiver
from segmenter import Segmenter
from segmenter.brokers import open_consumer, open_sender
from segmenter.wire import COMPILED_DECODER

SIZES = {"64KiB": 64 << 10, "1MiB": 1 << 20}
PER_MESSAGE = 8  # segments per logical message


def _cpu() -> float:
    """CPU seconds of this process (every thread; user + system)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _pid_cpu(pid: int | None) -> float:
    """CPU seconds of another process (the broker's JVM) from /proc; 0 when unknown."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _timed(fn: Callable[[], int], broker_pid: int | None) -> tuple[float, float, float, int]:
    """Wall seconds, our CPU seconds, the broker's CPU seconds, and what ``fn`` returned."""
    wall, cpu, broker = time.perf_counter(), _cpu(), _pid_cpu(broker_pid)
    n = fn()
    return time.perf_counter() - wall, _cpu() - cpu, _pid_cpu(broker_pid) - broker, n


def _send_floor(url: str, queue: str, body: bytes, groups: list[str | None]) -> int:
    with open_sender(url, queue) as s:
        for g in groups:
            s.send_bytes(body, g)
    return len(groups)


def _send_segmented(url: str, queue: str, payload: bytes, messages: int, size: int) -> int:
    seg = Segmenter(max_segment_size=size)
    n = 0
    with open_sender(url, queue) as s:
        for _ in range(messages):
            for x in seg.segment(payload):
                s.send(x)
                n += 1
    return n


def _receive_floor(url: str, queue: str, count: int, prefetch: int) -> int:
    c = open_consumer(url, queue, prefetch=prefetch)
    got = 0
    try:
        while got < count:
            for d in c.fetch(10.0):
                d.accept()
                got += 1
    finally:
        c.close()
    return got


def _receive_segmented(url: str, queue: str, messages: int, prefetch: int) -> int:
    consumer = open_consumer(url, queue, prefetch=prefetch)
    rx = BrokerReceiver(consumer, lambda ev: None, Assembler(Limits(), join=False))
    try:
        while rx.stats.messages < messages:
            rx.poll(10.0)
    finally:
        rx.close()
    return rx.stats.received


CASES = ("floor", "bare", "segmented")


def run(
    urls: dict[str, str],
    mib: int,
    rounds: int,
    broker_pid: int | None = None,
    prefetch: int = 64,
    sizes: Iterable[str] = tuple(SIZES),
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for label in sizes:
        size = SIZES[label]
        data = size - 84  # segment data per segment: an encoded segment is exactly `size` bytes
        payload = os.urandom(data * PER_MESSAGE)
        messages = max(1, (mib << 20) // (size * PER_MESSAGE))
        count = messages * PER_MESSAGE
        body = os.urandom(size)
        for proto, url in urls.items():
            for r in range(rounds):
                queue = f"bench.{label}.{proto}.{r}"
                grouped: list[str | None] = [os.urandom(24).hex() for _ in range(messages) for _ in range(PER_MESSAGE)]
                work: dict[str, tuple[Callable[[], int], Callable[[], int]]] = {
                    "floor": (partial(_send_floor, url, queue + ".f", body, grouped),
                              partial(_receive_floor, url, queue + ".f", count, prefetch)),
                    "bare": (partial(_send_floor, url, queue + ".b", body, [None] * count),
                             partial(_receive_floor, url, queue + ".b", count, prefetch)),
                    "segmented": (partial(_send_segmented, url, queue + ".s", payload, messages, size),
                                  partial(_receive_segmented, url, queue + ".s", messages, prefetch)),
                }  # fmt: skip
                for kind in CASES[r % 3 :] + CASES[: r % 3]:  # each case first, second, third in turn
                    send, receive = work[kind]
                    ts, cs, bs, n = _timed(send, broker_pid)
                    tr, cr, br, _ = _timed(receive, broker_pid)
                    mb = n * size / (1 << 20)
                    row = {"segment": label, "protocol": proto, "round": r, "case": kind, "messages": n,
                           "prefetch": prefetch,
                           "send_s": ts, "recv_s": tr, "send_mib_s": mb / ts, "recv_mib_s": mb / tr,
                           "send_seg_s": n / ts, "recv_seg_s": n / tr,
                           "send_cpu_us": 1e6 * cs / n, "recv_cpu_us": 1e6 * cr / n,
                           "broker_send_cpu_us": 1e6 * bs / n, "broker_recv_cpu_us": 1e6 * br / n,
                           "decoder": "python" if COMPILED_DECODER is None else "compiled",
                           "load1": os.getloadavg()[0]}  # fmt: skip
                    rows.append(row)
                    print(
                        f"{label:>5} {proto:5} r{r} {kind:9} {n:5d} msgs  send {mb / ts:7.1f} MiB/s "
                        f"{n / ts:8.0f}/s   receive {mb / tr:7.1f} MiB/s {n / tr:8.0f}/s   cpu us/msg "
                        f"{row['send_cpu_us']:.0f}/{row['recv_cpu_us']:.0f} (broker {row['broker_send_cpu_us']:.0f}/"
                        f"{row['broker_recv_cpu_us']:.0f})  load {row['load1']:.1f}",
                        flush=True,
                    )
    return rows


def _rows(keys: Iterable[tuple[str, str, str, str]]) -> list[tuple[str, str, str]]:
    """The table rows (segment size, protocol, side) present in ``keys``, smaller segments first."""
    pairs = sorted({(k[0], k[1]) for k in keys}, key=lambda k: (SIZES[k[0]], k[1]))
    return [(seg, proto, side) for seg, proto in pairs for side in ("send", "recv")]


def table(rows: list[dict[str, Any]]) -> str:
    """Median MiB/s of the rounds (min-max), segments/s, and the median of the per-round ratios
    floor / segmented and bare / segmented (min-max)."""
    rates: dict[tuple[str, str, str, str], dict[int, float]] = {}
    for r in rows:
        for side in ("send", "recv"):
            rates.setdefault((r["segment"], r["protocol"], r["case"], side), {})[r["round"]] = r[f"{side}_mib_s"]

    def cell(k: tuple[str, str, str, str]) -> str:
        v = list(rates[k].values())
        med = statistics.median(v)
        return f"{med:.1f} ({min(v):.1f}-{max(v):.1f}; {med * (1 << 20) / SIZES[k[0]]:.0f}/s)"

    def ratio(num: tuple[str, str, str, str], den: tuple[str, str, str, str]) -> str:
        v = [rates[num][i] / rates[den][i] for i in rates[num].keys() & rates[den].keys()]
        return f"{statistics.median(v):.2f}x ({min(v):.2f}-{max(v):.2f})"

    lines = [
        "| segment | protocol | side | floor MiB/s (min-max; seg/s) | segmented MiB/s (min-max; seg/s) "
        "| ratio (min-max) | bare floor MiB/s | ratio to bare |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for seg, proto, side in _rows(rates):
        f, b, s = ((seg, proto, case, side) for case in CASES)
        lines.append(
            f"| {seg} | {proto} | {side} | {cell(f)} | {cell(s)} | {ratio(f, s)} | {cell(b)} | {ratio(b, s)} |"
        )
    if all("recv_cpu_us" in r for r in rows):
        lines += ["", cpu_table(rows)]
    return "\n".join(lines)


def cpu_table(rows: list[dict[str, Any]]) -> str:
    """CPU time per message, medians over the rounds: this process (sender or receiver, every
    thread) and the broker's JVM while it ran, and the median of the per-round ratios of the
    client's CPU, segmented / floor. CPU time does not grow when other processes take the cores
    (as wall time does), so this ratio is the load-insensitive one."""
    us: dict[tuple[str, str, str, str], dict[int, tuple[float, float]]] = {}
    for r in rows:
        for side in ("send", "recv"):
            key = (r["segment"], r["protocol"], r["case"], side)
            us.setdefault(key, {})[r["round"]] = (r[f"{side}_cpu_us"], r[f"broker_{side}_cpu_us"])

    def med(k: tuple[str, str, str, str], i: int) -> float:
        return statistics.median(v[i] for v in us[k].values())

    lines = [
        "| segment | protocol | side | floor: client / broker CPU us per msg | segmented: client / broker "
        "| client CPU ratio segmented / floor (min-max) |",
        "|---|---|---|---|---|---|",
    ]
    for seg, proto, side in _rows(us):
        f, s = (seg, proto, "floor", side), (seg, proto, "segmented", side)
        v = [us[s][i][0] / us[f][i][0] for i in us[f].keys() & us[s].keys()]
        lines.append(
            f"| {seg} | {proto} | {side} | {med(f, 0):.0f} / {med(f, 1):.0f} | {med(s, 0):.0f} / {med(s, 1):.0f} "
            f"| {statistics.median(v):.2f}x ({min(v):.2f}-{max(v):.2f}) |"
        )
    return "\n".join(lines)


def pooled(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The rows of several runs as one run: rounds renumbered after each other (pairs stay pairs)."""
    out: list[dict[str, Any]] = []
    for rows in runs:
        base = 1 + max((r["round"] for r in out), default=-1)
        out += [{**r, "round": base + r["round"]} for r in rows]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.brokerbench", description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=64, help="MiB per case (default 64)")
    p.add_argument(
        "--rounds", type=int, default=6, help="rounds (default 6: each case runs first, second and third twice)"
    )
    p.add_argument("--amqp", default=None, help="an AMQP broker URL to use instead of a throwaway ActiveMQ")
    p.add_argument("--stomp", default=None, help="a STOMP broker URL to use instead of a throwaway ActiveMQ")
    p.add_argument(
        "--protocols", nargs="+", default=["amqp", "stomp"], choices=["amqp", "stomp"], help="throwaway broker: which"
    )
    p.add_argument("--broker-pid", type=int, default=None, help="with --amqp/--stomp: the broker pid (its CPU time)")
    p.add_argument(
        "--prefetch",
        type=int,
        default=64,
        help="every consumer's prefetch (default 64, the tables' setting; open_consumer's own default is 1000)",
    )
    p.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES), help="segment sizes (default both)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "broker.json"))
    p.add_argument("--table", nargs="+", metavar="JSON", help="only print the table of earlier runs' results, pooled")
    args = p.parse_args(argv)
    if args.table:
        print(table(pooled([json.loads(Path(f).read_text()) for f in args.table])))
        return 0
    start = os.getloadavg()
    if args.amqp or args.stomp:
        urls = {k: v for k, v in (("amqp", args.amqp), ("stomp", args.stomp)) if v}
        rows = run(urls, args.mib, args.rounds, args.broker_pid, args.prefetch, args.sizes)
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from tests.support.activemq_server import activemq

        with activemq(heap="1g", amqp_frame_size=1 << 20) as broker:
            urls = {"amqp": broker.amqp_url, "stomp": broker.stomp_url}
            chosen = {k: v for k, v in urls.items() if k in args.protocols}
            rows = run(chosen, args.mib, args.rounds, broker.proc.pid, args.prefetch, args.sizes)
    print(table(rows))
    load = ", ".join(f"{a:.1f}/{b:.1f}" for a, b in zip(start, os.getloadavg(), strict=True))
    print(f"load average (1, 5, 15 min) at start/end: {load}")
    Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
