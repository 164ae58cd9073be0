"""The Kafka consumer loop against librdkafka's mock cluster, with real processes.

End to end: a producer process SIGKILLed halfway through a message and restarted (it sends the
whole message again: a copy the idempotent producer cannot remove), two reassembling consumers
in one group, SIGKILLed at drawn points (before or after the sink write, or wherever the loop is
after so many records) and restarted, so partitions move between them. The sink is a directory of
files named by message id, each written atomically. Then: every message byte-identical in the
sink, each message id once; no process handed a message out twice; every commit, checked against
the log read back with a plain consumer, covers only messages already in the sink; the group's
final offsets are the end of every partition.

In-process: seeks backwards and forwards over segmented messages.
"""

from __future__ import annotations

import json
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

pytest.importorskip("confluent_kafka")

from reassembly import Assembler, Cause, Limits, Unfinished
from reassembly.brokers.kafka import KafkaReassembler, Replay
from segmenter import segment
from segmenter.properties import kafka_key
from segmenter.wire import decode_header
from tests.support.kafka_cluster import (  # noqa: F401
    ClientProcesses,
    MockCluster,
    kafka_clients_fixture,
    kafka_cluster_fixture,
)
from tests.support.kafka_producer_proc import workload
from tests.support.logs import complete_lines

PRODUCER = "tests/support/kafka_producer_proc.py"
CONSUMER = "tests/support/kafka_consumer_proc.py"
NO_SHRINK = (Phase.explicit, Phase.generate)


# librdkafka's mock keeps about 5 MiB per partition (``mpart->max_size``, not configurable) and deletes
# the oldest records beyond it.
MOCK_PARTITION_BYTES = 5 << 20


def _fits_the_mock(items: list[Any], segment_size: int) -> bool:
    """Whether every record of ``items`` stays in the mock's log even if all land on one partition,
    with the message the restarted producer sends again (the largest) and room for the records'
    own framing: a workload over it would have records deleted before the log is read back."""
    sizes = [sum(len(s.encode()) for s in it.segments(segment_size)) for it in items]
    return sum(sizes) + max(sizes) <= MOCK_PARTITION_BYTES - (512 << 10)


def _read_log(bootstrap: str, topic: str, partitions: int) -> list[tuple[int, int, bytes]]:
    """Every record of ``topic`` as (partition, offset, value), read with a plain consumer. The
    workloads whose log is read back fit the mock (:func:`_fits_the_mock`); a deleted start says so here."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4().hex}",
                  "enable.auto.commit": False})  # fmt: skip
    try:
        marks = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in range(partitions)}
        assert all(lo == 0 for lo, _ in marks.values()), f"the mock deleted records (5 MiB per partition): {marks}"
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        out: list[tuple[int, int, bytes]] = []
        deadline = time.monotonic() + 60
        while len(out) < sum(hi for _, hi in marks.values()):
            assert time.monotonic() < deadline, "the log could not be read back"
            for m in c.consume(500, 1.0):
                if m.error() is None:
                    out.append((m.partition(), m.offset(), m.value()))
        return out
    finally:
        c.close()


def _committed(bootstrap: str, topic: str, group: str, partitions: int) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        return {tp.partition: tp.offset for tp in c.committed([TopicPartition(topic, p) for p in range(partitions)],
                                                              timeout=10)}  # fmt: skip
    finally:
        c.close()


def _wait_started(log: Path, c: Any, timeout: float = 60.0) -> None:
    """Until the consumer wrote its ``start`` line (its SIGTERM handler is set, its loop built), or exited."""
    deadline = time.monotonic() + timeout
    while c.returncode is None and time.monotonic() < deadline:
        if any(line.startswith("start") for line in complete_lines(log)):
            return
        time.sleep(0.05)


def _scenario(cluster: MockCluster, tmp: Path, *, count: int, max_size: int, segment_size: int,
              producer_dies_after: int, c1_kill: int | None, c1_before_sink: bool, c2_kill_records: int | None,
              deadline_s: float = 90.0, parts: int = 4, check_log: bool = True,
              seed: int | None = None) -> dict[str, Any]:  # fmt: skip
    topic = cluster.create_topic(f"e2e-{uuid.uuid4().hex[:10]}", parts)
    group = f"g-{uuid.uuid4().hex[:10]}"
    sink = tmp / "sink"
    sink.mkdir()
    seed = int(uuid.uuid4().int % 1000) if seed is None else seed
    items = workload(seed, count, max_size)
    while check_log and not _fits_the_mock(items, segment_size):  # the next seed: about one in three is over
        seed += 1
        items = workload(seed, count, max_size)
    expected = {k: v for it in items for k, v in it.messages().items()}
    logs: list[Path] = []
    clients = ClientProcesses(tmp)

    log_of: dict[str, Path] = {}

    def consumer(name: str, *extra: str) -> Any:
        log = tmp / f"{name}-{len(logs)}.log"
        logs.append(log)
        log_of[name] = log
        return clients.start([CONSUMER, cluster.bootstrap, topic, group, str(sink), str(log), *extra],
                             name=f"{name}-{len(logs)}")  # fmt: skip

    producer_args = [PRODUCER, cluster.bootstrap, topic, str(seed), str(count), str(max_size), str(segment_size),
                     str(tmp / "progress")]  # fmt: skip
    try:
        kill1 = ["--kill-after-messages", str(c1_kill)] if c1_kill else []
        c1 = consumer("c1", *kill1, *(["--kill-before-sink"] if c1_before_sink else []))
        time.sleep(0.3)
        c2 = consumer("c2", *(["--kill-after-records", str(c2_kill_records)] if c2_kill_records else []))
        p1 = clients.start([*producer_args, str(producer_dies_after)], name="p1")
        p2 = None
        restarted = {"c1": False, "c2": False}
        kills = 0
        end = time.monotonic() + deadline_s
        while True:
            assert time.monotonic() < end, f"not done: {len(list(sink.glob('*-*')))}/{len(expected)} in the sink"
            if p2 is None and p1.returncode is not None:
                assert p1.returncode in (-9, 0), p1.errors()
                p2 = clients.start(producer_args, name="p2")
            for name in ("c1", "c2"):
                c = c1 if name == "c1" else c2
                if c.returncode is not None and not restarted[name]:
                    assert c.returncode == -9, c.errors()
                    kills += 1
                    restarted[name] = True
                    if name == "c1":
                        c1 = consumer("c1")
                    else:
                        c2 = consumer("c2")
            if p2 is not None and p2.returncode is not None:
                assert p2.returncode == 0, p2.errors()
                if len([p for p in sink.iterdir() if not p.name.startswith(".")]) == len(expected):
                    break
            time.sleep(0.05)
        for name, c in (("c1", c1), ("c2", c2)):
            _wait_started(log_of[name], c)  # a SIGTERM before its handler is set would kill it (-15)
            assert c.terminate(30) == 0, c.errors()
        # The last member leaving a group can always commit; one that leaves while another is still in
        # it may be refused (the mock answers REBALANCE_IN_PROGRESS): a last consumer, alone, reads
        # from the committed offsets to the end (handing out again what was not committed) and commits.
        last = consumer("c3", "--idle-exit", "2")
        assert last.wait(60) == 0, last.errors()
    finally:
        clients.close()

    # The sink: every message, byte-identical, once.
    files = {p.name: p for p in sink.iterdir() if not p.name.startswith(".")}
    assert sorted(files) == sorted(f"{g.hex()}-{s}" for g, s in expected)
    for (g, s), payload in expected.items():
        assert files[f"{g.hex()}-{s}"].read_bytes() == payload

    if not check_log:
        return {"messages": len(expected), "bytes": sum(map(len, expected.values())), "logs": len(logs)}
    # The log read back: where every message's segments lie.
    records = _read_log(cluster.bootstrap, topic, parts)
    where: dict[tuple[int, int], tuple[bytes, int]] = {}
    for p, off, value in records:
        h = decode_header(value)
        where[(p, off)] = (h.group_id, h.msg_seq_number)
    copies = len(records) - sum(len(it.segments(segment_size)) for it in items)
    assert copies >= 0

    # Every process: each message handed out at most once; every commit after its messages' sink lines.
    sunk: dict[tuple[bytes, int], float] = {}
    commits: list[tuple[float, int, int]] = []
    for log in logs:
        seen: set[tuple[bytes, int]] = set()
        for line in log.read_text().splitlines():
            w = line.split()
            if w[0] in ("sink", "again"):
                key = (bytes.fromhex(w[2]), int(w[3]))
                assert key not in seen, f"{log.name}: {line}: handed out twice by one loop"
                seen.add(key)
                sunk[key] = min(sunk.get(key, float("inf")), float(w[1]))
            elif w[0] == "commit":
                assert w[2] == topic
                commits.append((float(w[1]), int(w[3]), int(w[4])))
    assert commits
    below: dict[int, list[tuple[int, tuple[bytes, int]]]] = defaultdict(list)
    for (p, off), key in where.items():
        below[p].append((off, key))
    for t, p, o in commits:
        for off, key in below[p]:
            if off < o:  # committed past this segment: its message must already be in the sink
                assert sunk.get(key, float("inf")) <= t, f"commit {p}@{o} passes {key[0].hex()}-{key[1]} (offset {off})"
    ends = defaultdict(int)
    for p, off, _ in records:
        ends[p] = max(ends[p], off + 1)
    assert _committed(cluster.bootstrap, topic, group, parts) == {p: ends.get(p, -1001) for p in range(parts)}
    return {"messages": len(expected), "records": len(records), "copies": copies, "kills": kills,
            "bytes": sum(map(len, expected.values()))}  # fmt: skip


def _total_segments(seed_items: Any, segment_size: int) -> int:
    return sum(len(it.segments(segment_size)) for it in seed_items)


# No shrinking: each example is a cluster run of seconds; a failure prints its kill points.
@pytest.mark.sweep
@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck), phases=NO_SHRINK)
@given(
    producer_dies_after=st.integers(2, 60),
    c1_kill=st.integers(1, 8),
    c1_before_sink=st.booleans(),
    c2_kill_records=st.none() | st.integers(1, 120),
    seed=st.integers(0, 10**6),
)
def test_end_to_end_under_kills_and_rebalances(
    kafka_cluster: MockCluster, producer_dies_after: int, c1_kill: int, c1_before_sink: bool,
    c2_kill_records: int | None, seed: int,
) -> None:  # fmt: skip
    """Mixed workload (1 KB .. 2 MB, zstd, MQ groups, SHA-256 digests; its seed drawn, the first from
    there that fits the mock) in segments of 128 KiB; kills drawn by hypothesis. Nothing lost, nothing
    twice in the sink, no commit past an incomplete message."""
    with tempfile.TemporaryDirectory(prefix="kafka-e2e-") as d:
        _scenario(kafka_cluster, Path(d), count=10, max_size=2_000_000, segment_size=128 << 10,
                  producer_dies_after=producer_dies_after, c1_kill=c1_kill, c1_before_sink=c1_before_sink,
                  c2_kill_records=c2_kill_records, seed=seed)  # fmt: skip


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), phases=NO_SHRINK)
@given(
    producer_dies_after=st.integers(2, 200),
    c1_kill=st.integers(1, 20),
    c1_before_sink=st.booleans(),
    c2_kill_records=st.none() | st.integers(1, 400),
    seed=st.integers(0, 10**6),
)
def test_end_to_end_under_kills_many_points(
    kafka_cluster: MockCluster, producer_dies_after: int, c1_kill: int, c1_before_sink: bool,
    c2_kill_records: int | None, seed: int,
) -> None:  # fmt: skip
    """The property over more kill points (``-m slow``)."""
    with tempfile.TemporaryDirectory(prefix="kafka-e2e-") as d:
        _scenario(kafka_cluster, Path(d), count=10, max_size=2_000_000, segment_size=64 << 10,
                  producer_dies_after=producer_dies_after, c1_kill=c1_kill, c1_before_sink=c1_before_sink,
                  c2_kill_records=c2_kill_records, seed=seed)  # fmt: skip


@pytest.mark.slow
def test_soak_50_mb_messages(kafka_cluster: MockCluster, tmp_path: Path) -> None:
    """The soak (``-m slow``; ``-s`` prints its figures): 24 items in 1 MiB segments on 4 partitions,
    every sixth one message of 50 MB, the others 1 KB .. 2 MB (zstd, MQ groups, SHA-256 digests), two
    consumers reading while the producer sends; a consumer SIGKILLed (and restarted: two rebalances)
    during a small or medium message five times, the producer SIGKILLed inside the first 50 MB
    message and restarted (it sends the whole 50 MB again). Checked as the default run: every
    message byte-identical in the sink, each id once, no loop handing a message out twice, no commit
    past a message not yet in the sink, the group's final offsets the end of every partition.

    Within the mock cluster's limit: it keeps only the newest 5 MiB of a partition (hard-coded in
    librdkafka), so a 50 MB message can only be read while it is produced, never re-read from a
    committed offset below it. The producer therefore paces itself to the consumers' *read*
    positions (their progress files; not their commits): it sends a segment only when its partition
    holds at most 3 MiB beyond what is read. Consumer kills and rebalances happen only while no
    50 MB message is in flight (the producer is let through one small item at a time around a kill,
    and the kill waits until every item sent is in the sink), since a 50 MB message cut by a
    rebalance would be read again from its first segment, which the mock has deleted; on a real
    cluster, whose retention holds the message, that case is the default run's. The commit check
    uses the producer's record of where every acknowledged segment went (``placed``), since the
    log cannot be read back whole."""
    import random

    from confluent_kafka import Consumer, TopicPartition

    started = time.monotonic()
    parts, segment_size, count, big_every, big_size = 4, 1 << 20, 24, 6, 50_000_000
    topic = kafka_cluster.create_topic(f"soak-{uuid.uuid4().hex[:8]}", parts)
    group = f"soak-{uuid.uuid4().hex[:8]}"
    seed = int(uuid.uuid4().int % 1000)
    rng = random.Random(seed)
    items = workload(seed, count, 2_000_000, big_every, big_size)
    expected = {k: v for it in items for k, v in it.messages().items()}
    names = [[f"{g.hex()}-{q}" for g, q in it.messages()] for it in items]
    big = [i for i in range(count) if i % big_every == big_every - 1]
    sink, pace, gate, placed = tmp_path / "sink", tmp_path / "pace", tmp_path / "gate", tmp_path / "placed"
    sink.mkdir()
    pace.mkdir()
    done_file = tmp_path / "produced"

    def gate_to(i: int) -> None:
        (tmp_path / "gate.tmp").write_text(str(i))
        (tmp_path / "gate.tmp").replace(gate)

    gate_to(-1)
    clients = ClientProcesses(tmp_path)
    logs: list[Path] = []
    progress: dict[str, Path] = {}

    def consumer(name: str, *extra: str) -> Any:
        log = tmp_path / f"{name}-{len(logs)}.log"
        progress[name] = pace / f"{name}-{len(logs)}.progress"
        logs.append(log)
        return clients.start([CONSUMER, kafka_cluster.bootstrap, topic, group, str(sink), str(log), "--progress",
                              str(progress[name]), "--poll-timeout", "0.05", "--commit-every", "5", *extra],
                             name=log.stem)  # fmt: skip

    first_big_segments = sum(len(it.segments(segment_size)) for it in items[: big[0]])
    producer_args = [PRODUCER, kafka_cluster.bootstrap, topic, str(seed), str(count), "2000000", str(segment_size),
                     str(done_file)]  # fmt: skip
    options = ["--big-every", str(big_every), "--big-size", str(big_size), "--partitions", str(parts), "--placed",
               str(placed), "--gate", str(gate), "--pace", str(pace), "--lag", str(3 << 20)]  # fmt: skip
    state: dict[str, Any] = {"producer": None, "restarted": False}
    consumers: dict[str, Any] = {}
    deadline = time.monotonic() + 1200

    def done() -> set[int]:
        return {int(x) for x in done_file.read_text().split()} if done_file.exists() else set()

    def tick() -> None:
        assert time.monotonic() < deadline, f"soak not done: produced {sorted(done())}"
        p = state["producer"]
        if p.returncode is not None and p.returncode != 0:
            assert p.returncode == -9 and not state["restarted"], p.errors()
            state["restarted"] = True
            state["producer"] = clients.start([*producer_args, *options], name="p2")
        for c in consumers.values():
            assert c.returncode is None, c.errors()
        time.sleep(0.02)

    def in_sink(i: int) -> bool:
        return all((sink / n).exists() for n in names[i])

    settled: dict[str, Any] = {"layout": None, "since": 0.0}

    def stable() -> bool:
        """Both consumers report fresh positions, between them every partition once, and that
        layout held for 3 s (more than a session timeout: a dead member is out of the group and
        the rebalances after a kill are over)."""
        layout: list[tuple[int, ...]] = []
        for name in sorted(consumers):
            try:
                st_ = json.loads(progress[name].read_text())
            except (OSError, ValueError):
                return False
            if time.time() - st_["time"] > 1.0 or not st_["assigned"]:
                return False
            layout.append(tuple(st_["assigned"]))
        if sorted(p for ps in layout for p in ps) != list(range(parts)):
            settled["layout"] = None
            return False
        if layout != settled["layout"]:
            settled.update(layout=layout, since=time.monotonic())
        return time.monotonic() - settled["since"] >= 3.0

    try:
        consumers["a"] = consumer("a")
        consumers["b"] = consumer("b")
        state["producer"] = clients.start([*producer_args, str(first_big_segments + 10), *options], name="p1")
        # The kills fall in the small or medium items of the most records (2 MB: two segments; MQ groups).
        small = sorted((i for i in range(1, count) if i not in big), key=lambda i: -len(items[i].segments(1 << 20)))
        victims = sorted(small[:5])
        kills = 0

        def quiet(upto: int) -> None:
            """Items up to ``upto`` sent and in the sink (nothing in flight), the group settled."""
            while not (set(range(upto + 1)) <= done() and all(in_sink(i) for i in range(upto + 1)) and stable()):
                tick()

        for k in victims:
            gate_to(k - 1)
            quiet(k - 1)
            gate_to(k)  # item k only, a small or medium one: a consumer dies while it is read
            time.sleep(rng.uniform(0.0, 0.15))
            victim = rng.choice(sorted(consumers))
            consumers[victim].kill()
            kills += 1
            consumers[victim] = consumer(victim)
            quiet(k)  # the rebalances over before anything else, a 50 MB message above all, is sent
        gate_to(count)
        while not (len(done()) == count and all(in_sink(i) for i in range(count))):
            tick()
        assert state["producer"].wait(60) == 0, state["producer"].errors()
        c = Consumer({"bootstrap.servers": kafka_cluster.bootstrap, "group.id": f"marks-{uuid.uuid4().hex}"})
        try:
            ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(parts)}
        finally:
            c.close()
        # One consumer leaves, the other takes every partition and commits their ends when idle, then
        # leaves alone. (A last run reading from an older commit could meet the tail of the resent
        # 50 MB message without its head, which the mock has deleted: held, never complete.)
        assert consumers.pop("b").terminate(30) == 0
        end = time.monotonic() + 60
        while _committed(kafka_cluster.bootstrap, topic, group, parts) != ends:
            assert time.monotonic() < end, "the last consumer did not commit the end of every partition"
            assert consumers["a"].returncode is None, consumers["a"].errors()
            time.sleep(0.5)
        assert consumers.pop("a").terminate(30) == 0
    finally:
        clients.close()
    wall = time.monotonic() - started

    # The sink: every message, byte-identical, once.
    files = sorted(p.name for p in sink.iterdir() if not p.name.startswith("."))
    assert files == sorted(f"{g.hex()}-{q}" for g, q in expected)
    for (g, q), payload in expected.items():
        assert (sink / f"{g.hex()}-{q}").read_bytes() == payload, f"{g.hex()}-{q}"

    # Every loop: each message handed out at most once; every commit after its messages' sink lines.
    sunk: dict[tuple[str, int], float] = {}
    commits: list[tuple[float, int, int]] = []
    assignments = records_read = again = 0
    for log in logs:
        seen: set[tuple[str, int]] = set()
        for w in _log_lines(log):
            if w[0] in ("sink", "again"):
                key = (w[2], int(w[3]))
                assert key not in seen, f"{log.name}: {' '.join(w)}: handed out twice by one loop"
                seen.add(key)
                sunk[key] = min(sunk.get(key, float("inf")), float(w[1]))
                again += w[0] == "again"
            elif w[0] == "commit":
                commits.append((float(w[1]), int(w[3]), int(w[4])))
            elif w[0] == "assigned":
                assignments += 1
        stop = [w for w in _log_lines(log) if w[0] == "stop"]
        prog = pace / f"{log.stem}.progress"  # a killed loop's last report (one batch short at most)
        records_read += int(stop[0][2]) if stop else json.loads(prog.read_text())["records"] if prog.exists() else 0
    where: dict[int, dict[int, tuple[str, int]]] = defaultdict(dict)
    for w in _log_lines(placed):
        where[int(w[3])][int(w[4])] = (w[1], int(w[2]))
    for p in range(parts):
        assert sorted(where[p]) == list(range(ends[p])), f"partition {p}: not every record placed"
    # Per partition, the latest sink time among the messages below each offset.
    reached = {p: [0.0] for p in range(parts)}
    for p in range(parts):
        for off in range(ends[p]):
            reached[p].append(max(reached[p][-1], sunk[where[p][off]]))
    assert commits
    for t, p, o in commits:
        assert reached[p][o] <= t, f"commit {p}@{o} at {t} passes a message not yet in the sink"
    assert _committed(kafka_cluster.bootstrap, topic, group, parts) == ends
    figures = {"messages": len(expected), "mb": round(sum(map(len, expected.values())) / 1e6, 1),
               "fifty_mb_messages": len(big), "records": sum(ends.values()), "consumer_kills": kills,
               "producer_kills": 1, "assignment_changes": assignments, "records_read": records_read,
               "re_reads": records_read - sum(ends.values()), "handed_out_again": again,
               "seconds": round(wall, 1)}  # fmt: skip
    print("soak:", figures)


# ------------------------------------------------------------------------------ seek
def _produce(bootstrap: str, topic: str, values: list[tuple[bytes, bytes]]) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for key, value in values:
        p.produce(topic, key=key, value=value)
    assert p.flush(30) == 0


def test_seek_backwards_and_forwards_over_segmented_messages(kafka_cluster: MockCluster) -> None:
    """One partition: A (offsets 0-3), B and C interleaved (4-11), D (12-15). A seek to B's second
    segment starts at B's first (4) and hands B, C, D out again, not A; a seek into A starts at 0.
    A forward seek past the first segments of B and C cannot replay them: the Replay says so
    (exact False) and B and C are handed back as Unfinished (expired by offset distance), never lost
    silently; the commit then passes them."""
    topic = kafka_cluster.create_topic(f"seek-{uuid.uuid4().hex[:8]}", 1)
    msgs = {name: segment(name.encode() * 4000, max_segment_size=84 + 1000) for name in "ABCD"}  # 4 segments each
    order = [*msgs["A"], *(s for pair in zip(msgs["B"], msgs["C"], strict=True) for s in pair), *msgs["D"]]
    _produce(kafka_cluster.bootstrap, topic, [(kafka_key(s.header), s.encode()) for s in order])
    name_of = {s[0].header.group_id: n for n, s in msgs.items()}
    conf = {"bootstrap.servers": kafka_cluster.bootstrap, "group.id": f"seek-{uuid.uuid4().hex[:8]}",
            "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000}  # fmt: skip

    got: list[str] = []
    events: list[Any] = []
    r = KafkaReassembler(conf, [topic], on_message=lambda m: got.append(name_of[m.group_id]), on_event=events.append)
    try:
        def until(n: int) -> None:
            deadline = time.monotonic() + 30
            while len(got) < n:
                assert time.monotonic() < deadline, got
                r.poll(0.5)

        until(4)
        assert got == ["A", "B", "C", "D"]
        replay = r.seek(topic, 0, 6)  # B's second segment
        assert replay == Replay(topic, 0, 6, 4, replay.messages, True)
        assert {name_of[g] for g, _ in replay.messages} == {"B", "C", "D"}
        until(7)
        assert got[4:] == ["B", "C", "D"]  # read whole again, A not
        replay = r.seek(topic, 0, 2)  # inside A
        assert (replay.offset, replay.exact) == (0, True)
        until(11)
        assert got[7:] == ["A", "B", "C", "D"]
        r.commit()
        assert r.assembler.checkpoint((topic, 0)).safe == 15
    finally:
        r.close()
    assert _committed(kafka_cluster.bootstrap, topic, conf["group.id"], 1) == {0: 16}  # type: ignore[arg-type]

    # A forward seek from a fresh group: after A, jump to offset 9 (C's third segment).
    conf["group.id"] = f"seek-{uuid.uuid4().hex[:8]}"
    got.clear()
    events.clear()
    replays: list[Replay] = []

    def on_message(m: Any) -> None:
        got.append(name_of[m.group_id])
        if got == ["A"]:
            replays.append(r2.seek(topic, 0, 9))

    r2 = KafkaReassembler(conf, [topic], assembler=Assembler(Limits(expiry_offsets=3)), on_message=on_message,
                          on_event=events.append)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while "D" not in got:
            assert time.monotonic() < deadline, got
            r2.poll(0.5)
        r2.commit()
    finally:
        r2.close()
    assert got == ["A", "D"]
    assert replays == [Replay(topic, 0, 9, 9, (), False)]
    gone = [e for e in events if isinstance(e, Unfinished)]
    assert sorted(name_of[e.group_id] for e in gone) == ["B", "C"] and {e.cause for e in gone} == {Cause.EXPIRED}
    assert _committed(kafka_cluster.bootstrap, topic, conf["group.id"], 1) == {0: 16}  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ snapshot and resume
def test_a_tail_whose_head_was_committed_expires_instead_of_pinning_the_commit(kafka_cluster: MockCluster) -> None:
    """Message M (offsets 0-3), then a resend of its last two segments (4-5), committed at 4 by the
    loop that delivered M. A fresh loop of the group reads only the tail: nothing can complete it and
    no newer record comes, so offset distance never frees it. Time does: it is handed back as
    Unfinished(expired) and the commit reaches the end of the log. The default loop expires by time."""
    from confluent_kafka import Consumer, TopicPartition

    from reassembly.brokers.kafka import DEFAULT_EXPIRY_SECONDS

    topic = kafka_cluster.create_topic(f"tail-{uuid.uuid4().hex[:8]}", 1)
    m = segment(b"M" * 4000, max_segment_size=84 + 1000)  # 4 segments
    _produce(kafka_cluster.bootstrap, topic, [(kafka_key(s.header), s.encode()) for s in (*m, *m[2:])])
    conf = {"bootstrap.servers": kafka_cluster.bootstrap, "group.id": f"tail-{uuid.uuid4().hex[:8]}",
            "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000}  # fmt: skip
    c = Consumer(conf)
    try:
        c.commit(offsets=[TopicPartition(topic, 0, 4)], asynchronous=False)
    finally:
        c.close()

    now = [0.0]
    events: list[Any] = []
    got: list[Any] = []
    asm = Assembler(Limits(expiry_offsets=10_000, expiry_seconds=30.0), clock=lambda: now[0])
    r = KafkaReassembler(conf, [topic], assembler=asm, on_message=got.append, on_event=events.append,
                         clock=lambda: now[0])  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while r.stats.records < 2:
            assert time.monotonic() < deadline, r.stats
            r.poll(0.5)
        r.poll(0.2)
        assert r.assembler.checkpoint((topic, 0)).safe is None or r.assembler.checkpoint((topic, 0)).safe < 4
        now[0] = 31.0  # half a minute on the loop's clock, nothing newer on the partition
        while not any(isinstance(e, Unfinished) for e in events):
            assert time.monotonic() < deadline, events
            r.poll(0.2)
        r.commit()
    finally:
        r.close()
    (tail,) = [e for e in events if isinstance(e, Unfinished)]
    assert tail.cause == Cause.EXPIRED and got == []
    assert _committed(kafka_cluster.bootstrap, topic, conf["group.id"], 1) == {0: 6}  # type: ignore[arg-type]

    default = KafkaReassembler(conf, [topic])
    try:
        assert default.assembler.limits.expiry_seconds == DEFAULT_EXPIRY_SECONDS
    finally:
        default.close()


def _log_lines(path: Path) -> list[list[str]]:
    return [line.split() for line in complete_lines(path)]


def _wait_for(what: str, ok: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_snapshot_and_resume_across_a_restart(kafka_cluster: MockCluster, kafka_clients: ClientProcesses,
                                              tmp_path: Path) -> None:  # fmt: skip
    """A consumer process holds 3 of M's 8 segments (A, before it, is delivered) and is stopped cleanly:
    it commits A's end (M's first segment pins it) and saves its snapshot. Restarted with the snapshot
    and ``resume=True`` it reads from after what the snapshot holds: M's last 5 segments only (not
    one record read again), M handed out once, whole; no commit passes M's first segment before M is
    in the sink. Then the refusals: the same (now stale) snapshot, older than the committed offset,
    is dropped for that partition (read from the committed offset: nothing again); a snapshot of
    another topic is refused."""
    from confluent_kafka import TopicPartition

    from segmenter import SegmentationError

    topic = kafka_cluster.create_topic(f"resume-{uuid.uuid4().hex[:8]}", 1)
    group = f"resume-{uuid.uuid4().hex[:8]}"
    a = segment(b"A" * 4000, max_segment_size=84 + 1000)  # 4 segments: offsets 0-3
    m_payload = bytes(range(256)) * 31
    m = segment(m_payload, max_segment_size=84 + 1000)  # 8 segments: offsets 4-11
    assert (len(a), len(m)) == (4, 8)
    _produce(kafka_cluster.bootstrap, topic, [(kafka_key(x.header), x.encode()) for x in [*a, *m[:3]]])
    sink, snap, progress = tmp_path / "sink", tmp_path / "snapshot", tmp_path / "progress"
    sink.mkdir()
    m_name = f"{m[0].header.group_id.hex()}-1"

    def consumer(name: str, *extra: str) -> Any:
        return kafka_clients.start([CONSUMER, kafka_cluster.bootstrap, topic, group, str(sink), str(tmp_path / name),
                                    "--snapshot", str(snap), "--progress", str(progress), "--commit-every", "1",
                                    *extra], name=name)  # fmt: skip

    def read_to() -> int:
        try:
            return int(json.loads(progress.read_text())["read"].get("0", -1))
        except (OSError, ValueError):
            return -1

    c1 = consumer("c1.log")
    _wait_for("the first consumer to read 7 records", lambda: read_to() == 7)
    assert c1.terminate(30) == 0, c1.errors()
    assert _committed(kafka_cluster.bootstrap, topic, group, 1) == {0: 4}  # M's first segment pins it
    held = Assembler.restore(snap.read_bytes())
    assert held.checkpoint((topic, 0))[1:] == (3, 4, 6)  # safe, restart, high: M's 3 segments held
    stale = snap.read_bytes()

    _produce(kafka_cluster.bootstrap, topic, [(kafka_key(x.header), x.encode()) for x in m[3:]])
    c2 = consumer("c2.log", "--resume")
    _wait_for("M in the sink", lambda: (sink / m_name).exists())
    assert c2.terminate(30) == 0, c2.errors()
    assert (sink / m_name).read_bytes() == m_payload
    assert sorted(p.name for p in sink.iterdir()) == sorted([f"{a[0].header.group_id.hex()}-1", m_name])
    lines1, lines2 = _log_lines(tmp_path / "c1.log"), _log_lines(tmp_path / "c2.log")
    assert [w[2:] for w in lines2 if w[0] in ("sink", "again")] == [[m[0].header.group_id.hex(), "1"]]
    stop = next(w for w in lines2 if w[0] == "stop")
    assert stop[2:] == ["5", "1", "0"]  # records read, messages handed out, duplicates: nothing read twice
    sunk = next(float(w[1]) for w in lines2 if w[0] == "sink")
    commits = [(float(w[1]), int(w[4])) for w in lines1 + lines2 if w[0] == "commit"]
    assert commits and all(o <= 4 or t > sunk for t, o in commits), commits
    assert _committed(kafka_cluster.bootstrap, topic, group, 1) == {0: 12}

    # The first snapshot again: the group committed 12 since, past the 4 it would resume from.
    events: list[Any] = []
    got: list[Any] = []
    conf = {"bootstrap.servers": kafka_cluster.bootstrap, "group.id": group, "session.timeout.ms": 6000}
    r = KafkaReassembler(conf, [topic], assembler=Assembler.restore(stale), on_message=got.append,
                         on_event=events.append, resume=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while not r.assigned or r.stats.stale == 0:
            assert time.monotonic() < deadline, "no assignment"
            r.poll(0.2)
        r.poll(0.5)
        assert r.consumer.position([TopicPartition(topic, 0)])[0].offset in (12, -1001)
    finally:
        r.close()
    assert (got, r.stats.records, r.stats.stale) == ([], 0, 1)
    assert [(type(e).__name__, e.cause) for e in events] == [("Unfinished", Cause.REVOKED)]  # M's stale hold
    assert _committed(kafka_cluster.bootstrap, topic, group, 1) == {0: 12}

    # A snapshot of another topic: refused before anything is touched.
    with pytest.raises(SegmentationError, match=r"resume=True with a snapshot of partitions this loop does not read"):
        KafkaReassembler(conf, ["another-topic"], assembler=Assembler.restore(stale), resume=True)


def test_missing_client_names_the_extra() -> None:
    """Without confluent-kafka the loop says which extra to install (one line, our error type)."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['confluent_kafka'] = None\n"
        "from reassembly.brokers.kafka import KafkaReassembler\n"
        "try:\n    KafkaReassembler({}, ['t'])\n"
        "except Exception as e:\n    print(type(e).__name__, e)\n"
    )
    from segmenter.brokers.kafka import INSTALL

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    needs = f"Kafka needs the confluent-kafka client: {INSTALL}"
    assert f"BrokerError [9060 ENVIRONMENT_ERROR] {needs}" in out.stdout, out


def test_auto_commit_is_refused(kafka_cluster: MockCluster) -> None:
    from segmenter import SegmentationError

    with pytest.raises(SegmentationError, match=r"enable\.auto\.commit=true would commit offsets past incomplete"):
        KafkaReassembler({"bootstrap.servers": kafka_cluster.bootstrap, "group.id": "x", "enable.auto.commit": True},
                         ["t"])  # fmt: skip
