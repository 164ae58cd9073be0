"""Segments through Kafka against the floor: plain records of the segment size, same client settings.

For each segment size (1 MiB and 64 KiB) two cases, **segmented** and **floor**, each in a fresh
process (``--case``) with a fresh librdkafka mock cluster (tests/support/kafka_cluster.py: a
holder process on loopback, as a real cluster is another process), over ``--mib`` MiB:

* **segmented**: payloads of about 4 MiB (``4 MiB / size`` segments of exactly ``size`` bytes each,
  header included: ``(size - 84) * 4 MiB / size`` bytes of payload) sent by
  :class:`~segmenter.brokers.KafkaSegmentProducer` (the clock stops when ``flush()`` returned: every
  segment acknowledged), then consumed by a plain confluent-kafka ``Consumer`` assigned to every
  partition and reassembled by the in-process :class:`~reassembly.Assembler` (each record given
  with its offset and partition, as a committing consumer loop does); the receive clock stops
  when every message was complete.
* **floor**: the same number of records of exactly ``size`` bytes, each with a 48-byte key (a new
  one per 4 MiB, as a message's GroupId key), produced by a bare ``Producer`` with the very
  configuration the segmented producer built (idempotent, ``message.max.bytes``, ``batch.size``),
  consumed by the same consumer with no decoding.

Both put message i (or its 4 MiB of floor records) on partition i of a topic with one partition per
message: the mock cluster keeps only the newest 5 MiB of each partition, so nothing is dropped
before it is read, and both cases have the same layout. Both warm up untimed (a record produced; a
record of :data:`WARM` consumed and the bench topic's metadata fetched), and both consumers fetch up
to 8 MiB per partition. Each row also records each side's CPU seconds, of the client process and
of the mock cluster's process (``--table`` prints their medians). Rounds are interleaved (round r starts with
the r-th case), ``--warmup-rounds`` whole rounds run first and are not counted (kept in the JSON);
the table gives each case's median MiB/s (min-max) over the rounds and the median of the per-round
ratios segmented / floor of the wall times (goal: at most 1.2x).

    python -m bench.kafkabench --mib 256 --rounds 5 --json bench/results/DATE-kafka.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SIZES = {"64KiB": 64 << 10, "1MiB": 1 << 20}
MESSAGE = 4 << 20  # bytes on the wire per message (segments, headers included)
CASES = ("floor", "segmented")
WARM = "warm-up"  # a topic of one record each side reads first, untimed (connections, metadata, producer id)
# max.partition.fetch.bytes above a message's 4 MiB: one fetch brings a partition's message whole
# (librdkafka's default, 1 MiB, interleaves every partition's messages 1 MiB at a time).
CONSUMER = {"group.id": "bench", "enable.auto.commit": False, "fetch.wait.max.ms": 10,
            "max.partition.fetch.bytes": 8 << 20}  # fmt: skip


def _consume(bootstrap: str, topic: str, partitions: int, count: int, on_record: Any, started: Any) -> int:
    """Read ``count`` records of ``topic``; ``started()`` is called when the consumer is connected
    (the warm-up record of :data:`WARM` read, untimed) just before the bench topic is assigned."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, **CONSUMER})
    try:
        c.assign([TopicPartition(WARM, 0, OFFSET_BEGINNING)])
        while (m := c.poll(1.0)) is None or m.error() is not None:
            pass
        c.list_topics(topic, timeout=30)  # its partitions' leaders known before the clock starts
        started()
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got = 0
        deadline = time.monotonic() + 600
        while got < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{got} of {count} records in 600 s")
            m = c.poll(1.0)  # returns as soon as a record is there (consume(n, t) waits for n or t)
            if m is None:
                continue
            if m.error() is not None:
                raise RuntimeError(str(m.error()))
            on_record(m)
            got += 1
        return got
    finally:
        c.close()


def _cpu_of(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far, every thread (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_case(case: str, label: str, mib: int) -> dict[str, Any]:
    """One case in this process, against a mock cluster of its own; wall seconds of each side."""
    from confluent_kafka import Producer

    from reassembly import Assembler, GroupComplete, Limits, MessageComplete
    from segmenter.brokers import KafkaSegmentProducer
    from tests.support.kafka_cluster import mock_cluster

    size = SIZES[label]
    per_message = MESSAGE // size
    messages = max(1, (mib << 20) // MESSAGE)
    count = messages * per_message
    payloads = [os.urandom((size - 84) * per_message) for _ in range(4)]
    keys = [os.urandom(24).hex().encode() for _ in range(messages)]
    with mock_cluster(1) as cluster:
        topic = cluster.create_topic("bench", messages)
        cluster.create_topic(WARM, 1)
        producer = KafkaSegmentProducer(
            topic, {"bootstrap.servers": cluster.bootstrap}, max_record_bytes=size + 4096, max_segment_size=size
        )
        bodies = [os.urandom(size) for _ in range(4)]
        # A record first, untimed: connected, metadata known, producer id assigned (and one in WARM
        # for the consumer's own warm-up).
        if case == "floor":
            plain = Producer(producer.config)
            plain.produce(WARM, b"warm-up")
            plain.produce(topic, b"warm-up", partition=0)
            plain.flush(30)
        else:
            producer.client.produce(WARM, b"warm-up")
            producer.send(b"warm-up", partition=0).wait(30)
        broker = cluster.proc.pid
        cpu0, broker0 = time.process_time(), _cpu_of(broker)
        start = time.perf_counter()
        if case == "segmented":
            for i in range(messages):
                producer.send(payloads[i % 4], partition=i)
            producer.flush(600)
        else:
            for i in range(messages):
                for j in range(per_message):
                    while True:
                        try:
                            plain.produce(topic, bodies[j % 4], keys[i], partition=i)
                            break
                        except BufferError:
                            plain.poll(0.05)
                    plain.poll(0)
            if plain.flush(600):
                raise RuntimeError("floor records not acknowledged in 600 s")
        send_s = time.perf_counter() - start
        cpu1, broker1 = time.process_time(), _cpu_of(broker)
        done = {"messages": 0, "bytes": 0}
        if case == "segmented":
            asm = Assembler(Limits(), join=False)

            def on_record(m: Any) -> None:
                value = m.value()
                done["bytes"] += len(value)
                for ev in asm.receive(value, m.offset(), m.partition()):
                    if isinstance(ev, (MessageComplete, GroupComplete)):
                        done["messages"] += 1
        else:

            def on_record(m: Any) -> None:
                done["bytes"] += len(m.value())

        clock: dict[str, float] = {}

        def started() -> None:
            clock.update(cpu=time.process_time(), broker=_cpu_of(broker), wall=time.perf_counter())

        _consume(cluster.bootstrap, topic, messages, count + 1, on_record, started)  # and the warm-up record
        recv_s = time.perf_counter() - clock["wall"]
        cpu2, broker2 = time.process_time(), _cpu_of(broker)
    if case == "segmented" and done["messages"] != messages + 1:  # the warm-up message too
        raise RuntimeError(f"{done['messages']} messages reassembled, {messages + 1} sent")
    mb = count * size / (1 << 20)
    return {
        "case": case,
        "segment": label,
        "records": count,
        "mib": mb,
        "send_s": send_s,
        "recv_s": recv_s,
        "total_s": send_s + recv_s,
        "send_mib_s": mb / send_s,
        "recv_mib_s": mb / recv_s,
        "total_mib_s": mb / (send_s + recv_s),
        # CPU seconds of each side: the client process (Python and librdkafka's threads) and the
        # mock cluster's holder process (the brokers); /proc counts in clock ticks (10 ms).
        "send_cpu_s": cpu1 - cpu0,
        "recv_cpu_s": cpu2 - clock["cpu"],
        "send_broker_cpu_s": broker1 - broker0,
        "recv_broker_cpu_s": broker2 - clock["broker"],
        "load1": os.getloadavg()[0],
    }


def _child(case: str, label: str, mib: int) -> dict[str, Any]:
    """:func:`run_case` in a fresh process."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run(
        [sys.executable, "-m", "bench.kafkabench", "--case", case, "--sizes", label, "--mib", str(mib)],
        cwd=HERE.parent,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"kafka bench case {case} {label} failed:\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def run(mib: int, rounds: int, warmup_rounds: int, sizes: list[str], log: Any = print) -> dict[str, Any]:
    """Every case in a fresh process, rounds interleaved, warm-up rounds first (kept, not counted)."""
    from .host import machine

    started = time.monotonic()
    load = os.getloadavg()
    rows: list[dict[str, Any]] = []
    for r in range(-warmup_rounds, rounds):
        for label in sizes:
            for case in CASES[r % 2 :] + CASES[: r % 2]:
                row = {**_child(case, label, mib), "round": r, "warmup": r < 0}
                rows.append(row)
                log(
                    f"kafka {label:>5} r{r} {case:9} send {row['send_mib_s']:7.1f} MiB/s  receive"
                    f" {row['recv_mib_s']:7.1f} MiB/s  total {row['total_s']:.2f} s  load {row['load1']:.1f}"
                )
    return {
        "machine": machine(),
        "command": f"python -m bench.kafkabench --mib {mib} --rounds {rounds} --warmup-rounds {warmup_rounds}",
        "mib": mib,
        "rounds": rounds,
        "warmup_rounds": warmup_rounds,
        "load_before": load,
        "load_after": os.getloadavg(),
        "seconds_total": time.monotonic() - started,
        "runs": [row for row in rows if not row["warmup"]],
        "warmup_runs": [row for row in rows if row["warmup"]],
    }


def table(results: dict[str, Any]) -> str:
    """Median MiB/s (min-max) per case and side, and the median of per-round ratios segmented / floor
    of the wall times (min-max)."""
    runs = results["runs"]
    by: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for row in runs:
        by.setdefault((row["segment"], row["case"]), {})[row["round"]] = row

    def cell(label: str, case: str, side: str) -> str:
        v = [row[f"{side}_mib_s"] for row in by[(label, case)].values()]
        return f"{statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})"

    def ratio(label: str, side: str) -> str:
        f, s = by[(label, "floor")], by[(label, "segmented")]
        v = [s[r][f"{side}_s"] / f[r][f"{side}_s"] for r in f.keys() & s.keys()]
        return f"{statistics.median(v):.2f}x ({min(v):.2f}-{max(v):.2f})"

    lines = [
        "| segment | side | floor MiB/s (min-max) | segmented MiB/s (min-max) "
        "| time ratio segmented / floor (min-max) |",
        "|---|---|---|---|---|",
    ]
    for label in sorted({k[0] for k in by}, key=lambda s: SIZES[s]):
        for side in ("send", "recv", "total"):
            lines.append(
                f"| {label} | {side} | {cell(label, 'floor', side)} | {cell(label, 'segmented', side)}"
                f" | {ratio(label, side)} |"
            )
    if all("send_cpu_s" in row for row in runs):
        lines += ["", anatomy(results)]
    return "\n".join(lines)


def anatomy(results: dict[str, Any]) -> str:
    """Median seconds per case and side: wall, CPU of the client process (Python and librdkafka's
    threads) and CPU of the mock cluster's process."""
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in results["runs"]:
        by.setdefault((row["segment"], row["case"]), []).append(row)

    def med(rows: list[dict[str, Any]], key: str) -> str:
        return f"{statistics.median(r[key] for r in rows):.3f}"

    lines = [
        "| segment | side | case | wall s | client CPU s | mock cluster CPU s |",
        "|---|---|---|---|---|---|",
    ]
    for label in sorted({k[0] for k in by}, key=lambda s: SIZES[s]):
        for side in ("send", "recv"):
            for case in CASES:
                rows = by[(label, case)]
                lines.append(
                    f"| {label} | {side} | {case} | {med(rows, f'{side}_s')} | {med(rows, f'{side}_cpu_s')}"
                    f" | {med(rows, f'{side}_broker_cpu_s')} |"
                )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.kafkabench", description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=256, help="MiB per case and round (default 256)")
    p.add_argument("--rounds", type=int, default=5, help="counted rounds (default 5)")
    p.add_argument("--warmup-rounds", type=int, default=1, help="whole rounds first, not counted (default 1)")
    p.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES), help="segment sizes (default both)")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)  # one case, in this process (the parent's child)
    p.add_argument("--table", metavar="JSON", help="only print the table of an earlier run's results")
    args = p.parse_args(argv)
    if args.table:
        print(table(json.loads(Path(args.table).read_text())))
        return 0
    if args.case:
        print(json.dumps(run_case(args.case, args.sizes[0], args.mib)))
        return 0
    results = run(args.mib, args.rounds, args.warmup_rounds, args.sizes)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    print(table(results))
    print(f"done in {results['seconds_total']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
