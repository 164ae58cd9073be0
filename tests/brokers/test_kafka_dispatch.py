"""The group dispatcher over Kafka, against librdkafka's mock cluster.

In-process: the commit-metadata record of settled messages (written beside a commit held back by an
unsettled message, read back on assignment, the settled records skipped; a foreign record ignored),
pause/resume of fetching, and rebalances: a commit the coordinator refused made again with no
message settled since, and a partition that comes back to a member after another one committed it
never committed below that (nothing kept from the member's first assignment of it).

With real processes (``servers``): three ``reassemble consume`` processes in one group, a handler
that sleeps and fails at random and always fails poisoned messages, one process SIGKILLed
mid-run and restarted. Then, from the handler's log of start and end times, the commit log and the
dead letter folder: every message handled at least once, never two handlers of one group at once,
a group's messages in order, exactly the poisoned messages dead-lettered, every commit below every
message not yet settled when it was sent, the commits the cluster took never going back, and the
group's final offsets at the end of every partition. And the budget: a slow handler behind a fast
producer, the held bytes within the budget and the fetch paused.
"""

from __future__ import annotations

import json
import random
import re
import time
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("confluent_kafka")

from reassembly.brokers.kafka_dispatch import CommitNote, KafkaDispatchSource
from reassembly.dispatcher import Dispatcher, Ordering, Outcome, offsets
from reassembly.runtime.deadletter import read_dead_letters
from segmenter.brokers import KafkaSegmentProducer
from tests.support.kafka_cluster import (  # noqa: F401
    ClientProcess,
    ClientProcesses,
    MockCluster,
    kafka_clients_fixture,
    kafka_cluster_fixture,
)
from tests.support.logs import complete_lines

FAST_GROUP = {"session.timeout.ms": "3000", "heartbeat.interval.ms": "300"}
HANDLER = "tests.support.dispatch_handler"


def _wait(what: str, ready: Callable[[], bool], timeout: float = 60.0, poll: float = 0.02) -> None:
    """Wait until ``ready()`` (a file, a process's output, a consumer's state) or fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(poll)  # polls a condition; the wait ends on the condition, not on the time


def _ends(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"marks-{uuid.uuid4().hex}"})
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
    finally:
        c.close()


def _committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, tuple[int, str | None]]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        got = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return {tp.partition: (tp.offset, tp.metadata) for tp in got}
    finally:
        c.close()


def _produce(bootstrap: str, topic: str, payloads: list[bytes], partition: int | None = 0) -> None:
    producer = KafkaSegmentProducer(topic, {"bootstrap.servers": bootstrap}, max_record_bytes=2048)
    try:
        for p in payloads:
            producer.send(p, partition=partition).wait(30)
    finally:
        producer.close()


def _source(cluster: MockCluster, topic: str, group: str, notes: list[CommitNote] | None = None) -> KafkaDispatchSource:
    config = {"bootstrap.servers": cluster.bootstrap, "group.id": group, **FAST_GROUP}
    return KafkaDispatchSource(config, [topic], on_commit=None if notes is None else notes.append)


def _fetch_until(source: KafkaDispatchSource, d: Dispatcher, count: int) -> list[int]:
    """Offer what the source fetches until ``count`` messages were offered; their tickets."""
    tickets: list[int] = []

    def more() -> bool:
        tickets.extend(d.offer(o.message, now=0.0, key=o.key) for o in source.fetch(0.2))
        return len(tickets) >= count

    _wait(f"{count} messages", more)
    return tickets


# ---------------------------------------------------------------------------------- in-process
def test_settled_ranges_ride_on_the_commit_and_are_skipped_after_a_restart(kafka_cluster: MockCluster) -> None:
    topic = kafka_cluster.create_topic(f"t-meta-{uuid.uuid4().hex[:8]}", partitions=1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    _produce(kafka_cluster.bootstrap, topic, [bytes([i]) * 3000 for i in range(6)])  # several records each
    end = _ends(kafka_cluster.bootstrap, topic, 1)[0]
    notes: list[CommitNote] = []
    source = _source(kafka_cluster, topic, group, notes)
    d = Dispatcher(Ordering.UNORDERED)
    source.bind(d)
    try:
        _fetch_until(source, d, 6)
        works = [w for w in (d.take(i, 0.0) for i in range(6)) if w is not None]
        assert len(works) == 6
        works.sort(key=lambda w: w.positions[0][1])
        first = works[0]
        for w in works[1:]:
            d.settle(w.ticket, Outcome.DONE, now=0.0)
        source.commit(d, force=True)
        # held at the unsettled first message; the five settled ones above it in the record
        assert notes and notes[-1].offset == 0 and notes[-1].ranges == 1 and notes[-1].metadata_bytes > 0
    finally:
        source.close()
    offset, meta = _committed(kafka_cluster.bootstrap, group, topic, 1)[0]
    above = max(o for _, o in first.positions) + 1
    assert offset == 0
    assert offsets.decode(meta, 0, end) == ([(above, end - 1)], None)

    again = _source(kafka_cluster, topic, group)
    d2 = Dispatcher(Ordering.UNORDERED)
    again.bind(d2)
    try:
        _fetch_until(again, d2, 1)
        assert again.stats.metadata_loaded == 1
        w = d2.take(0, 0.0)
        assert w is not None and w.positions == first.positions
        late: list[Any] = []  # the other five are never offered again: their records are skipped
        _wait("the settled records skipped", lambda: late.extend(again.fetch(0.1)) or again.loop.stats.skipped
              == end - above)  # fmt: skip
        assert not late
        d2.settle(w.ticket, Outcome.DONE, now=0.0)
        again.commit(d2, force=True)
    finally:
        again.close()
    # past the first message, and past the settled range after it too: the end of the partition
    assert _committed(kafka_cluster.bootstrap, group, topic, 1)[0] == (end, None)


def test_a_foreign_commit_metadata_is_ignored(kafka_cluster: MockCluster) -> None:
    from confluent_kafka import Consumer, TopicPartition

    topic = kafka_cluster.create_topic(f"t-foreign-{uuid.uuid4().hex[:8]}", partitions=1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    _produce(kafka_cluster.bootstrap, topic, [b"a" * 100, b"b" * 100])
    other = Consumer({"bootstrap.servers": kafka_cluster.bootstrap, "group.id": group, "enable.auto.commit": False})
    other.commit(offsets=[TopicPartition(topic, 0, 0, metadata="written by another tool")], asynchronous=False)
    other.close()
    source = _source(kafka_cluster, topic, group)
    d = Dispatcher(Ordering.UNORDERED)
    source.bind(d)
    try:
        _fetch_until(source, d, 2)  # both messages: the record is not trusted
        assert source.stats.metadata_ignored == 1 and source.loop.stats.skipped == 0
    finally:
        source.close()


def test_pause_stops_fetching_and_resume_fetches_the_rest(kafka_cluster: MockCluster) -> None:
    topic = kafka_cluster.create_topic(f"t-pause-{uuid.uuid4().hex[:8]}", partitions=1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    _produce(kafka_cluster.bootstrap, topic, [b"x" * 100])
    source = _source(kafka_cluster, topic, group)
    d = Dispatcher(Ordering.UNORDERED)
    source.bind(d)
    try:
        _fetch_until(source, d, 1)
        source.pause()
        _produce(kafka_cluster.bootstrap, topic, [b"y" * 100, b"z" * 100])
        assert _ends(kafka_cluster.bootstrap, topic, 1)[0] == 3
        assert not [o for _ in range(10) for o in source.fetch(0.1)]  # ten fetches while paused: nothing
        source.resume()
        assert len(_fetch_until(source, d, 2)) == 2
        assert (source.stats.pauses, source.stats.resumes) == (1, 1)
    finally:
        source.close()


def test_a_revocation_commits_below_the_work_in_flight_then_fences_it(kafka_cluster: MockCluster) -> None:
    from reassembly.dispatcher import Fenced

    topic = kafka_cluster.create_topic(f"t-revoke-{uuid.uuid4().hex[:8]}", partitions=2)
    group = f"g-{uuid.uuid4().hex[:8]}"
    for part in (0, 1):
        _produce(kafka_cluster.bootstrap, topic, [bytes([part]) * 3000] * 3, partition=part)
    a = _source(kafka_cluster, topic, group)
    da = Dispatcher(Ordering.UNORDERED)
    a.bind(da)
    b: KafkaDispatchSource | None = None
    try:
        _fetch_until(a, da, 6)
        works = [w for w in (da.take(i, 0.0) for i in range(6)) if w is not None]
        assert len(works) == 6  # all in flight, none settled
        b = _source(kafka_cluster, topic, group)  # joins: the group rebalances, a's partitions are revoked
        db = Dispatcher(Ordering.UNORDERED)
        b.bind(db)
        again: list[Any] = []
        taken: list[Any] = []

        def rebalanced() -> bool:
            again.extend(a.fetch(0.1))
            assert b is not None
            taken.extend(b.fetch(0.1))
            return a.stats.revoked > 0 and bool(a.loop.assigned) and bool(b.loop.assigned)

        _wait("the rebalance", rebalanced)
        # the revocation's commit stayed below every message in flight: nothing was committed past 0
        assert {p: off for p, (off, _) in _committed(kafka_cluster.bootstrap, group, topic, 2).items()} in (
            {0: 0, 1: 0}, {0: -1001, 1: 0}, {0: 0, 1: -1001}, {0: -1001, 1: -1001})
        # then the work was fenced: its results commit nothing
        assert all(isinstance(da.settle(w.ticket, Outcome.DONE, now=0.0), Fenced) for w in works)
        # the partition a kept is read again from the commit, its unsettled messages made anew
        kept = {p for _, p in a.loop.assigned}
        _wait("a's messages again", lambda: bool(again.extend(a.fetch(0.1))) or len(again) >= 3 * len(kept))
        assert {o.message.positions[0].partition[1] for o in again} == kept
    finally:
        a.close()
        if b is not None:
            b.close()


# ---------------------------------------------------------------------------------- rebalances
_OFFSET_COMMIT, _REBALANCE_IN_PROGRESS = 8, 27  # Kafka's API key and error code


def test_a_refused_commit_is_made_again_with_no_message_settled_since(kafka_cluster: MockCluster) -> None:
    """The coordinator refuses every commit while it is told to (as it does while a group
    rebalances); the runner's commit that reached the end of the partition is refused after the
    last message settled. Once commits are taken again, the runner makes it again at its next
    interval, though nothing settles any more: the group's offset reaches the end while the
    consumer runs, not only when it stops."""
    import threading

    from reassembly.runtime import ThreadRunner

    topic = kafka_cluster.create_topic(f"t-refused-{uuid.uuid4().hex[:8]}", partitions=1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    _produce(kafka_cluster.bootstrap, topic, [bytes([i]) * 3000 for i in range(5)])
    end = _ends(kafka_cluster.bootstrap, topic, 1)[0]
    notes: list[CommitNote] = []
    source = _source(kafka_cluster, topic, group, notes)
    runner = ThreadRunner(source, lambda message: None, workers=2, ordering=Ordering.UNORDERED,
                          commit_every=1_000_000, commit_interval=0.2)  # fmt: skip
    kafka_cluster.fail_requests(_OFFSET_COMMIT, _REBALANCE_IN_PROGRESS, 100_000)
    thread = threading.Thread(target=runner.run, name="runner")
    thread.start()
    try:
        _wait("a commit at the end, refused", lambda: any(n.offset == end and n.refused for n in list(notes)))
        kafka_cluster.clear_request_errors(_OFFSET_COMMIT)
        assert runner.summary.done == 5
        _wait("the group's offset at the end", lambda: _committed(kafka_cluster.bootstrap, group, topic, 1)[0][0]
              == end, timeout=15)  # fmt: skip
        assert runner.summary.done == 5  # made again with nothing settled since
    finally:
        kafka_cluster.clear_request_errors(_OFFSET_COMMIT)
        runner.stop()
        thread.join(60)
        source.close()
    assert not thread.is_alive()
    sent = [n for n in notes if n.refused is None]
    assert sent[-1].offset == end and [n.offset for n in sent] == sorted(n.offset for n in sent)


def test_a_partition_back_from_another_member_is_never_committed_below_its_commit(kafka_cluster: MockCluster) -> None:
    """Member A holds both partitions of a topic, with work in flight on each (its commits held at
    the first message) and the rest settled; B joins and takes one of them, handles it and commits
    its end; more is produced there; B leaves and the partition comes back to A, whose work of it
    from before is still in flight. A keeps nothing of the partition from before: no commit of it
    below B's (what B committed is A's floor for the new assignment), its old work fenced (its
    results commit nothing), nothing committed of a partition A did not hold at the time, and
    its commits of each partition never go back."""
    from reassembly.dispatcher import Fenced

    topic = kafka_cluster.create_topic(f"t-back-{uuid.uuid4().hex[:8]}", partitions=2)
    group = f"g-{uuid.uuid4().hex[:8]}"
    for part in (0, 1):
        _produce(kafka_cluster.bootstrap, topic, [bytes([part, i]) * 1500 for i in range(4)], partition=part)
    phase = ["alone"]
    notes_a: list[tuple[str, frozenset[Any], CommitNote]] = []  # (phase, A's partitions then, note)

    def note_a(note: CommitNote) -> None:
        notes_a.append((phase[0], frozenset(a.loop.assigned), note))

    a = KafkaDispatchSource({"bootstrap.servers": kafka_cluster.bootstrap, "group.id": group, **FAST_GROUP},
                            [topic], on_commit=note_a)  # fmt: skip
    da = Dispatcher(Ordering.UNORDERED)
    a.bind(da)

    def pump_a() -> list[Any]:
        """A's fetch, its messages offered to A's dispatcher at once (as the runner does)."""
        got = a.fetch(0.1)
        for o in got:
            da.offer(o.message, now=0.0)
        return got

    others: list[KafkaDispatchSource] = []
    try:
        _fetch_until(a, da, 8)
        works = [w for w in (da.take(i, 0.0) for i in range(8)) if w is not None]
        assert len(works) == 8
        first: dict[Any, Any] = {}  # per partition, its first message: left in flight
        for w in sorted(works, key=lambda w: w.positions[0][1]):
            first.setdefault(w.positions[0][0], w)
        for w in works:
            if w not in first.values():
                da.settle(w.ticket, Outcome.DONE, now=0.0)
        a.commit(da)
        assert {n.offset for _, _, n in notes_a} == {0}  # held by the first messages, both partitions
        assert {p: c for p, (c, _) in _committed(kafka_cluster.bootstrap, group, topic, 2).items()} == {0: 0, 1: 0}

        phase[0] = "shared"
        b = _source(kafka_cluster, topic, group)  # joins: the group rebalances
        others.append(b)
        db = Dispatcher(Ordering.UNORDERED)
        b.bind(db)
        offered_b: list[Any] = []

        def split() -> bool:
            pump_a()
            offered_b.extend(b.fetch(0.1))
            return len(a.loop.assigned) == 1 and len(b.loop.assigned) == 1

        _wait("B's share of the partitions", split)
        (moved,) = b.loop.assigned
        p_moved = moved[1]
        # B reads from A's commit and skips what A settled (the commit's record of it): only the
        # message A left in flight comes to B
        _wait("B's message", lambda: bool(offered_b.extend(b.fetch(0.1))) or len(offered_b) >= 1)
        assert [o.message.positions[0].partition for o in offered_b] == [moved]
        db.offer(offered_b[0].message, now=0.0)
        w = db.take(0, 0.0)
        assert w is not None
        db.settle(w.ticket, Outcome.DONE, now=0.0)
        b.commit(db)
        end_b = _ends(kafka_cluster.bootstrap, topic, 2)[p_moved]
        assert _committed(kafka_cluster.bootstrap, group, topic, 2)[p_moved][0] == end_b

        _produce(kafka_cluster.bootstrap, topic, [bytes([9, i]) * 1500 for i in range(2)], partition=p_moved)
        phase[0] = "back"
        b.close()  # leaves: the partition comes back to A
        _wait("the partition back at A", lambda: bool(pump_a()) or len(a.loop.assigned) == 2)
        # A's work of the moved partition from before its revocation: fenced, commits nothing
        assert isinstance(da.settle(first[moved].ticket, Outcome.DONE, now=0.0), Fenced)
        a.commit(da)
        ends = _ends(kafka_cluster.bootstrap, topic, 2)

        def all_done() -> bool:
            pump_a()
            for w in [w for w in (da.take(i, 0.0) for i in range(20)) if w is not None]:
                # nothing B settled comes to A again
                assert not [o for p, o in w.positions if p == moved and o < end_b], w.positions
                da.settle(w.ticket, Outcome.DONE, now=0.0)
            a.commit(da)
            return {p: c for p, (c, _) in _committed(kafka_cluster.bootstrap, group, topic, 2).items()} == ends

        _wait("both partitions committed at their ends", all_done)
    finally:
        a.close()
        for other in others:
            other.close()  # once only: a second close does nothing
    by_part: dict[int, list[int]] = defaultdict(list)
    for when, held, n in notes_a:
        assert (n.topic, n.partition) in held, f"A committed {n} while it held {sorted(held)}"
        if n.refused is None:
            by_part[n.partition].append(n.offset)
            if when == "back" and n.partition == p_moved:
                assert n.offset >= end_b, (n, end_b)
    assert all(offs == sorted(offs) for offs in by_part.values()), by_part


# ---------------------------------------------------------------------------------- processes
def _read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in complete_lines(path)]


def _consume(clients: ClientProcesses, cluster: MockCluster, topic: str, group: str, tmp: Path, name: str,
             *extra: str, env: dict[str, str] | None = None) -> ClientProcess:  # fmt: skip
    x = [a for k, v in FAST_GROUP.items() for a in ("-X", f"{k}={v}")]
    return clients.start(
        ["-m", "reassembly", "consume", f"kafka://{cluster.bootstrap}", topic, "--group", group, "--verbose",
         "--commit-log", str(tmp / "commits.log"), "--summary-json", str(tmp / f"{name}.json"), *x, *extra],
        name=name,
        env={"DISPATCH_LOG": str(tmp / "handled.log"), **(env or {})},
    )  # fmt: skip


@pytest.mark.servers
@pytest.mark.sweep
def test_three_consumers_one_killed_and_restarted(
    kafka_cluster: MockCluster, kafka_clients: ClientProcesses, tmp_path: Path
) -> None:
    parts, attempts = 6, 8
    topic = kafka_cluster.create_topic(f"t-kill-{uuid.uuid4().hex[:8]}", partitions=parts)
    group = f"g-{uuid.uuid4().hex[:8]}"
    rng = random.Random(47)
    # 120 units: every fourth an MQ group of 3 messages; every 13th message poisoned; 200 B .. 5 KB
    # each, in records of at most 2 KiB, so most messages span several records
    units: list[list[bytes]] = []
    n = 0
    for i in range(120):
        unit = []
        for _ in range(3 if i % 4 == 3 else 1):
            n += 1
            body = rng.randbytes(rng.randint(200, 8000))
            unit.append(b"POISON" + body if n % 13 == 0 else b"OK" + body)
        units.append(unit)
    dead_dir = tmp_path / "dead"
    common = ["--handler", f"{HANDLER}:handle", "--workers", "4", "--max-attempts", str(attempts),
              "--retry-delay", "20ms", "--retry-max-delay", "200ms", "--dead-letter", str(dead_dir),
              "--commit-interval", "300ms", "--drain-timeout", "20s"]  # fmt: skip
    env = {"DISPATCH_SLEEP_MS": "20", "DISPATCH_FAIL_RATE": "0.1"}
    procs = {name: _consume(kafka_clients, kafka_cluster, topic, group, tmp_path, name, *common, env=env)
             for name in ("c1", "c2", "c3")}  # fmt: skip
    for name, proc in procs.items():
        _wait(f"{name}'s assignment", lambda proc=proc: "assigned [" in proc.errors())  # type: ignore[misc]

    producer = KafkaSegmentProducer(topic, {"bootstrap.servers": kafka_cluster.bootstrap}, max_record_bytes=2048)
    expected: dict[tuple[str, int], bool] = {}  # (GroupId hex, MsgSeqNumber) -> poisoned

    def send(batch: list[list[bytes]]) -> None:
        for unit in batch:
            s = producer.send(unit[0]) if len(unit) == 1 else producer.send_group(unit)
            s.wait(30)
            for seq, body in enumerate(unit, 1):
                expected[(s.group_id.hex(), seq)] = body.startswith(b"POISON")

    log_path = tmp_path / "handled.log"
    send(units[:60])
    c2 = procs["c2"]

    def handled_by(pid: int) -> int:
        return sum(1 for e in _read_lines(log_path) if e["kind"] == "end" and e["pid"] == pid and e["ok"])

    _wait("c2 handling messages", lambda: handled_by(c2.pid) >= 10)
    c2.kill()
    killed_at = time.time()
    send(units[60:])
    producer.close()
    procs["c2b"] = _consume(kafka_clients, kafka_cluster, topic, group, tmp_path, "c2b", *common, env=env)

    def all_settled() -> bool:
        ok = {(e["group"], e["seq"]) for e in _read_lines(log_path) if e["kind"] == "end" and e["ok"]}
        dead = {(r["group_id"].hex(), r["msg_seq_number"]) for r in read_dead_letters(dead_dir)} if dead_dir.exists() \
            else set()  # fmt: skip
        return all((k in dead) if p else (k in ok) for k, p in expected.items())

    _wait("every message handled or dead-lettered", all_settled, timeout=90, poll=0.2)
    ends = _ends(kafka_cluster.bootstrap, topic, parts)

    def at_end() -> bool:  # the group's offsets, not the commit log: the cluster may refuse a commit
        final = _committed(kafka_cluster.bootstrap, group, topic, parts)
        return all(final[p][0] == ends[p] for p in range(parts) if ends[p])

    _wait("the group's offsets at the end of every partition", at_end, timeout=60, poll=0.3)
    for name in ("c1", "c3", "c2b"):
        assert procs[name].terminate(30) == 0, procs[name].errors()[-3000:]
        assert "consumed " in procs[name].output()

    events = _read_lines(log_path)
    commits = _read_lines(tmp_path / "commits.log")
    dead_rows = read_dead_letters(dead_dir)
    where: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for e in events:
        where[(e["group"], e["seq"])] = [tuple(x) for x in e["positions"]]  # type: ignore[misc]

    # every message handled at least once (poisoned: every attempt failed), exactly the poisoned dead-lettered
    ok = {(e["group"], e["seq"]) for e in events if e["kind"] == "end" and e["ok"]}
    assert {k for k, p in expected.items() if not p} <= ok
    assert not {k for k, p in expected.items() if p} & ok
    dead = {(r["group_id"].hex(), r["msg_seq_number"]) for r in dead_rows}
    assert dead == {k for k, p in expected.items() if p}

    # never two handlers of one group at once: intervals per GroupId, a start without its end (the
    # killed process) lasting until the kill
    open_at: dict[tuple[int, str, int], float] = {}
    spans: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    for e in events:
        k = (e["pid"], e["group"], e["seq"])
        if e["kind"] == "start":
            open_at[k] = e["time"]
        else:
            spans[e["group"]].append((open_at.pop(k), e["time"], e["pid"]))
    for (pid, g, _seq), t in open_at.items():
        assert pid == c2.pid, f"a handler of process {pid} never ended"
        spans[g].append((t, killed_at, pid))
    for g, ss in spans.items():
        ss.sort()
        busy_until, holder = float("-inf"), 0
        for start, end, pid in ss:
            assert start >= busy_until, f"group {g}: handlers in processes {holder} and {pid} at once"
            busy_until, holder = max(busy_until, end), pid

    # a group's messages in order: every attempt of message k starts after message k-1 settled
    settled_at: dict[tuple[str, int], float] = {}
    failures: dict[tuple[str, int], list[float]] = defaultdict(list)
    for e in events:
        k = (e["group"], e["seq"])
        if e["kind"] == "end" and e["ok"]:
            settled_at.setdefault(k, e["time"])
        elif e["kind"] == "end":
            failures[k].append(e["time"])
    for k in expected:
        if expected[k]:
            settled_at[k] = sorted(failures[k])[attempts - 1]  # the last attempt before the dead letter
    for e in events:
        if e["kind"] == "start" and e["seq"] > 1:
            before = (e["group"], e["seq"] - 1)
            assert settled_at[before] <= e["time"], f"{before} not settled when its successor started"

    # every commit below every message not settled when it was sent
    for c in commits:
        for k, pos in where.items():
            below = [o for p, o in pos if p == c["partition"] and o < c["offset"]]
            if below:
                assert settled_at[k] <= c["time"], f"commit {c} passed {k} (segments at {pos}) before it settled"
    first_dead: dict[tuple[str, int], float] = {}  # a message read again after a rebalance may die twice
    for r in dead_rows:
        k = (r["group_id"].hex(), r["msg_seq_number"])
        stamp = r["dead_at"].timestamp() if isinstance(r["dead_at"], datetime) else r["dead_at"]
        first_dead[k] = min(first_dead.get(k, stamp), stamp)
    for k, stamp in first_dead.items():
        for c in commits:
            if c["time"] < stamp - 1.0:  # a second of clock slack between pyarrow's stamp and time.time()
                assert not [o for p, o in where[k] if p == c["partition"] and o < c["offset"]], (c, k)

    # the commits the cluster took never go back: a refused commit is logged a second time with its
    # error; a commit sent by the killed process may have died with it (its last one per partition
    # is left out)
    taken: list[dict[str, Any]] = []
    for c in commits:
        if c.get("refused"):
            sent = [i for i, t in enumerate(taken) if (t["pid"], t["partition"], t["offset"]) ==
                    (c["pid"], c["partition"], c["offset"])]  # fmt: skip
            del taken[sent[-1]]
        else:
            taken.append(c)
    last_killed = {c["partition"]: i for i, c in enumerate(taken) if c["pid"] == c2.pid}
    high: dict[int, tuple[int, dict[str, Any]]] = {}
    for i, c in enumerate(taken):
        if last_killed.get(c["partition"]) == i:
            continue
        before = high.get(c["partition"])
        assert before is None or c["offset"] >= before[0], f"commit {c} after {before[1]}"
        high[c["partition"]] = (c["offset"], c)

    # the group's final offsets: the end of every partition
    final = _committed(kafka_cluster.bootstrap, group, topic, parts)
    assert {p: final[p][0] for p in range(parts) if ends[p]} == {p: ends[p] for p in range(parts) if ends[p]}
    assert max(c["metadata_bytes"] for c in commits) <= 4000


@pytest.mark.servers
def test_the_budget_pauses_fetching_and_bounds_what_is_held(
    kafka_cluster: MockCluster, kafka_clients: ClientProcesses, tmp_path: Path
) -> None:
    topic = kafka_cluster.create_topic(f"t-budget-{uuid.uuid4().hex[:8]}", partitions=2)
    group = f"g-{uuid.uuid4().hex[:8]}"
    gate = tmp_path / "gate"
    budget = 64 << 10
    rng = random.Random(1)
    payloads = [rng.randbytes(4000) for _ in range(100)]  # 400 KB: six budgets
    # every record is waiting before the consumer starts: its first fetch, before it has seen a
    # record's size, reads one record, not a batch of them
    _produce(kafka_cluster.bootstrap, topic, payloads, partition=None)
    proc = _consume(kafka_clients, kafka_cluster, topic, group, tmp_path, "slow", "--handler", f"{HANDLER}:slow",
                    "--workers", "2", "--budget-bytes", str(budget), "--budget-messages", "1000",
                    "--idle-exit", "2s", "--metrics-port", "0", env={"DISPATCH_GATE": str(gate)})  # fmt: skip
    _wait("the fetch paused", lambda: "fetch paused" in proc.errors())
    port = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", proc.errors())
    assert port is not None, proc.errors()
    metrics: dict[str, float] = {}

    def scrape() -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{port.group(1)}/metrics", timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("reassembly_dispatch_"):
                    name, _, value = line.rpartition(" ")
                    metrics[name] = float(value)
        return metrics.get("reassembly_dispatch_fetch_paused") == 1.0  # published once a second

    _wait("the metrics saying the fetch paused", scrape)
    assert 0 < metrics["reassembly_dispatch_held_bytes"] <= budget + 2048, metrics
    gate.touch()  # the handlers go on: the budget empties, fetching resumes
    assert proc.wait(120) == 0, proc.errors()[-3000:]
    doc = json.loads((tmp_path / "slow.json").read_text())
    summary = doc["consume"]["summary"]
    assert summary["done"] == 100
    assert summary["pauses"] >= 1 and summary["resumes"] >= 1
    # held: segments in assembly, messages waiting and in flight; within the budget plus one record
    # (a fetch reads no more records than fit in what is left of the budget; a record completing a
    # message moves its bytes from the assembler to the dispatcher, it adds none)
    assert budget <= summary["peak_held_bytes"] <= budget + 2048, summary
    assert doc["consume"]["source"]["pauses"] >= 1
