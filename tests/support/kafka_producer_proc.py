"""A segmenting producer in a process of its own, for the Kafka end-to-end tests, and its workload.

``python tests/support/kafka_producer_proc.py BOOTSTRAP TOPIC SEED COUNT MAX_SIZE SEGMENT_SIZE
PROGRESS [DIE_AFTER]`` sends the messages of :func:`workload` (SEED, COUNT, MAX_SIZE) as segments of
at most SEGMENT_SIZE bytes through :class:`segmenter.brokers.KafkaSegmentProducer` (every segment of
a message keyed by its GroupId: one partition; the idempotent producer; the MQ fields as headers).
After each message is acknowledged whole it appends its index to the
PROGRESS file; a restarted producer starts at the first message not listed there and sends it
whole again (same GroupId, same bytes: the copy the idempotent producer cannot remove). With
DIE_AFTER it SIGKILLs itself once that many segments of this run were acknowledged (the kill
falls inside a message unless the count ends one).

The workload is deterministic (a seed): the test computes the same payloads to compare the sink
with.

Options after those (the soak's): ``--big-every N --big-size B`` makes every Nth item one message
of B bytes (:func:`workload`); ``--partitions P`` pins each item to partition
``GroupId[:2] % P`` (so that the producer knows where its records go); ``--placed FILE`` appends
``placed GID SEQ PARTITION OFFSET`` for every acknowledged segment (those of a message cut short by
DIE_AFTER too), for a check of commits that cannot read the log back; ``--gate FILE`` waits before
item i until FILE holds a number >= i (the test lets items through one at a time around a consumer
kill); ``--pace DIR --lag BYTES`` waits before each segment until the bytes this producer put on the
segment's partition beyond what the consumers have read (the ``read`` positions of the progress
files in DIR written in the last second: :mod:`tests.support.kafka_consumer_proc`'s
``--progress``) are at most BYTES; records of an earlier producer run count ``SEGMENT_SIZE``
each. The mock cluster keeps only the newest 5 MiB of a partition: a producer running ahead of
its reader would have records deleted before they are read.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from segmenter import Codec, Segment, Segmenter
from segmenter.digest import DigestPolicy


@dataclass(frozen=True)
class Item:
    """One unit of the workload: a message (one payload) or an MQ group (several), and how it is segmented."""

    group_id: bytes
    payloads: tuple[bytes, ...]
    grouped: bool
    zstd: bool
    sha256: bool

    def segments(self, segment_size: int) -> list[Segment]:
        s = Segmenter(
            max_segment_size=segment_size,
            codec=Codec.ZSTD if self.zstd else Codec.NONE,
            digest=DigestPolicy(sha256=self.sha256),
        )
        if self.grouped:
            return list(s.segment_group(self.payloads, group_id=self.group_id))
        return list(s.segment(self.payloads[0], group_id=self.group_id))

    def messages(self) -> dict[tuple[bytes, int], bytes]:
        return {(self.group_id, n): p for n, p in enumerate(self.payloads, 1)}


def workload(seed: int, count: int, max_size: int, big_every: int = 0, big_size: int = 0) -> list[Item]:
    """``count`` items, sizes 1 KB .. ``max_size`` (log-uniform), every fourth an MQ group of three,
    a third compressed with zstd (compressible payloads), a third with a SHA-256 digest. With
    ``big_every``, every ``big_every``-th item is instead one message of ``big_size`` bytes."""
    rng = random.Random(seed)
    items = []
    for i in range(count):
        big = big_every > 0 and i % big_every == big_every - 1

        def size(big: bool = big) -> int:
            return big_size if big else int(1000 * (max_size / 1000) ** rng.random())

        n = 3 if i % 4 == 3 and not big else 1
        zstd = i % 3 == 1
        payloads = tuple((rng.randbytes(64) * (size() // 64 + 1))[: size()] if zstd else rng.randbytes(size())
                         for _ in range(n))  # fmt: skip
        items.append(Item(rng.randbytes(24), payloads, n > 1, zstd, i % 3 == 2))
    return items


class Pacer:
    """Waits before a segment until the consumers have read to within ``lag`` bytes of it (``--pace``)."""

    def __init__(self, directory: Path, lag: int, bootstrap: str, topic: str, parts: int, segment_size: int) -> None:
        from confluent_kafka import Consumer, TopicPartition

        self.directory = directory
        self.lag = lag
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"pacer-{os.getpid()}"})
        try:  # the log end as this run starts: records of an earlier run count segment_size each
            marks = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in range(parts)}
        finally:
            c.close()
        self.sizes = {p: [(off, segment_size) for off in range(lo, hi)] for p, (lo, hi) in marks.items()}
        self.end = {p: hi for p, (_, hi) in marks.items()}

    def read(self, partition: int) -> int | None:
        best = None
        for f in self.directory.glob("*.progress"):
            try:
                state = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            if time.time() - state["time"] < 1.0 and partition in state["assigned"]:
                best = max(best or 0, state["read"][str(partition)])
        return best

    def wait(self, partition: int, size: int) -> None:
        sizes = self.sizes[partition]
        while True:
            read = self.read(partition)
            if read is not None:
                while sizes and sizes[0][0] < read:
                    sizes.pop(0)
                if sum(n for _, n in sizes) + size <= self.lag:
                    return
            time.sleep(0.005)

    def produced(self, partition: int, size: int) -> None:
        self.sizes[partition].append((self.end[partition], size))
        self.end[partition] += 1


def main(argv: list[str]) -> int:
    import argparse

    from segmenter.brokers import KafkaSegmentProducer

    bootstrap, topic, seed, count, max_size, segment_size, progress = argv[:7]
    rest = argv[7:]
    die_after = int(rest.pop(0)) if rest and not rest[0].startswith("--") else None
    ap = argparse.ArgumentParser()
    ap.add_argument("--big-every", type=int, default=0)
    ap.add_argument("--big-size", type=int, default=0)
    ap.add_argument("--partitions", type=int)
    ap.add_argument("--placed", type=Path)
    ap.add_argument("--gate", type=Path)
    ap.add_argument("--pace", type=Path)
    ap.add_argument("--lag", type=int, default=3 << 20)
    a = ap.parse_args(rest)
    items = workload(int(seed), int(count), int(max_size), a.big_every, a.big_size)
    path = Path(progress)
    done = {int(x) for x in path.read_text().split()} if path.exists() else set()
    producer = KafkaSegmentProducer(topic, {"bootstrap.servers": bootstrap, "linger.ms": 5},
                                    max_record_bytes=int(segment_size) + 4096, headers=True)  # fmt: skip
    pacer = None
    if a.pace is not None:
        assert a.partitions, "--pace needs --partitions"
        pacer = Pacer(a.pace, a.lag, bootstrap, topic, a.partitions, int(segment_size))
    placed = os.open(a.placed, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if a.placed else None
    produced = 0

    def gate() -> int:
        try:
            return int(a.gate.read_text())
        except (OSError, ValueError):
            return -1

    def record(send: Any) -> None:
        if placed is not None and send.records:
            os.write(placed, "".join(f"placed {send.group_id.hex()} {r.msg_seq_number} {r.partition} {r.kafka_offset}\n"
                                     for r in send.records).encode())  # fmt: skip

    def cut(item: Item, partition: int | None) -> Iterator[Segment]:
        """The item's segments; with DIE_AFTER, SIGKILL once that many were produced and acknowledged."""
        nonlocal produced
        for seg in item.segments(int(segment_size)):
            if die_after is not None and produced >= die_after:
                producer.client.flush(30)
                producer.poll(0)
                for send in list(producer._pending):  # the message cut short: its segments are in the log
                    record(send)
                os.kill(os.getpid(), signal.SIGKILL)
            if pacer is not None and partition is not None:
                pacer.wait(partition, len(seg))
                pacer.produced(partition, len(seg))
            yield seg
            produced += 1

    for i, item in enumerate(items):
        if i in done:
            continue
        while a.gate is not None and gate() < i:
            time.sleep(0.005)
        partition = None if a.partitions is None else int.from_bytes(item.group_id[:2], "big") % a.partitions
        send = producer.send_segments(cut(item, partition), partition=partition)
        send.wait(120)  # every segment acknowledged, or BrokerError
        record(send)
        with path.open("a") as f:
            f.write(f"{i}\n")
            f.flush()
            os.fsync(f.fileno())
    producer.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
