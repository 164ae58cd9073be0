"""Kafka share groups on librdkafka's mock cluster: three member processes, one shared segment store
on PostgreSQL, the segments of every message spread over the members.

The mock gives each partition to one member once its assignment settled, so each message's
segments go to partitions round robin (``partition=`` on the producer): they reach several members.
The group is primed first (a share group starts at the latest offset: a probe acknowledged on
every partition). The sink is a directory of files named by message id, written atomically.

The kill test SIGKILLs each member once at a point a hypothesis plan draws (after a store write
and before the acknowledgement, after a claim, during assembly) and restarts it; records the dead
member held come back from the mock after its share session times out (6 s here:
tests/support/kafka_cluster.py), so it is marked ``servers``. Checked: every message in the sink
byte-identical, once; the store empty; every segment used once or a duplicate.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

pytest.importorskip("confluent_kafka")

from tests.support.competing import (
    PROBE,
    Restarts,
    Sent,
    check_sink,
    check_store,
    in_sink,
    messages,
    spread,
    started,
    wait_for,
)
from tests.support.kafka_cluster import (  # noqa: F401
    ClientProcess,
    ClientProcesses,
    MockCluster,
    kafka_clients_fixture,
    kafka_cluster_fixture,
)
from tests.support.pg_server import fresh_database, pg_url

__all__ = ["pg_url"]  # the module-scoped server fixture

PARTITIONS = 4
MEMBER = ["-m", "tests.support.store_member_proc", "kafka"]
_topics = itertools.count()


def prime(bootstrap: str, topic: str, group: str) -> None:
    """Set the share group's start on every partition: one member acknowledges a probe on each, leaves."""
    from confluent_kafka import Producer, ShareConsumer

    c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, "share.acknowledgement.mode": "explicit",
                       "log_level": 3})  # fmt: skip
    p = Producer({"bootstrap.servers": bootstrap, "log_level": 3})
    c.subscribe([topic])
    seen: set[int] = set()
    for _ in range(120):
        for part in range(PARTITIONS):
            if part not in seen:
                p.produce(topic, PROBE, partition=part)
        p.flush(10)
        for m in c.poll(0.5) or []:
            got = m.partition()
            if m.error() is None and got is not None:
                seen.add(got)
                c.acknowledge(m)
        if len(seen) == PARTITIONS:
            break
    assert len(seen) == PARTITIONS, f"share group {group} not primed: {seen}"
    c.commit_sync()
    c.close()


def produce(bootstrap: str, topic: str, segments: list[bytes], first_partition: int = 0) -> None:
    """One message's segments over the partitions in turn."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "log_level": 3, "linger.ms": 0})
    for i, seg in enumerate(segments):
        p.produce(topic, seg, partition=(first_partition + i) % PARTITIONS)
    assert p.flush(30) == 0


def start_member(clients: ClientProcesses, cluster: MockCluster, topic: str, store: str, name: str,
                 tmp: Path, *extra: str) -> ClientProcess:  # fmt: skip
    return clients.start(
        [*MEMBER, cluster.bootstrap, topic, f"sg-{topic}", store, name, str(tmp / "sink"), str(tmp / "log"), *extra],
        name=name,
    )


def send_paced(cluster: MockCluster, topic: str, sent: Sent, sink: Path, ahead: int = 2) -> None:
    """Each message once at most ``ahead`` before it are still missing from the sink: the members'
    assignment settles while the first messages flow, and later ones spread as it says."""
    for i, segs in enumerate(sent.segments.values()):
        wait_for(f"message {i - ahead} in the sink", lambda: len(in_sink(sink)) >= i - ahead, 120)  # noqa: B023
        produce(cluster.bootstrap, topic, segs, first_partition=i)


@pytest.mark.servers
def test_three_members_share_every_message(kafka_cluster: MockCluster, kafka_clients: ClientProcesses,
                                           pg_url: str, tmp_path: Path) -> None:  # fmt: skip
    """Most messages have segments on more than one member; a message whose segments reached all
    three is delivered byte-identical; each message once in the sink; the store empty after."""
    topic = kafka_cluster.create_topic(f"share-{next(_topics)}", PARTITIONS)
    store = fresh_database(pg_url, f"share_{topic.replace('-', '_')}")
    (tmp_path / "sink").mkdir()
    prime(kafka_cluster.bootstrap, topic, f"sg-{topic}")
    names = ["m1", "m2", "m3"]
    for name in names:
        start_member(kafka_clients, kafka_cluster, topic, store, name, tmp_path)
    wait_for("three members started", lambda: started(tmp_path / "log", names, kafka_clients.started), 60)
    sent = messages(24, 40_000, 4096)  # 10 segments each
    send_paced(kafka_cluster, topic, sent, tmp_path / "sink")
    wait_for("every message in the sink", lambda: len(in_sink(tmp_path / "sink")) == len(sent.payloads), 120)
    for client in kafka_clients.started:
        assert client.terminate() == 0, client.errors()[-2000:]
    check_sink(tmp_path / "sink", sent)
    check_store(store, sent, tmp_path / "log")
    members = spread(tmp_path / "log")
    several = [g for g, m in members.items() if len(m) > 1]
    assert len(several) > len(sent.payloads) // 2, {g[:8]: sorted(m) for g, m in members.items()}
    three = [g for g, m in members.items() if len(m) == 3]
    assert three, "no message reached all three members"
    for gid in three:
        assert (tmp_path / "sink" / f"{gid}-1").read_bytes() == sent.payloads[bytes.fromhex(gid)]


POINTS = ("written", "claimed", "assembling")


@pytest.mark.servers
@pytest.mark.sweep
@settings(max_examples=1, deadline=None, phases=(Phase.explicit, Phase.generate),
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip
@given(plan=st.lists(st.tuples(st.sampled_from(POINTS), st.integers(1, 4)), min_size=3, max_size=3))
def test_members_killed_at_drawn_points_lose_nothing(kafka_cluster: MockCluster, kafka_clients: ClientProcesses,
                                                     pg_url: str, tmp_path_factory: pytest.TempPathFactory,
                                                     plan: list[tuple[str, int]]) -> None:  # fmt: skip
    """Each of three members SIGKILLed once at its drawn point (the Nth time it gets there) and
    restarted: every message in the sink byte-identical, once; every segment used once or a
    duplicate; nothing left in the store."""
    tmp = tmp_path_factory.mktemp("share-kill")
    topic = kafka_cluster.create_topic(f"share-kill-{next(_topics)}", PARTITIONS)
    store = fresh_database(pg_url, f"share_{topic.replace('-', '_')}")
    (tmp / "sink").mkdir()
    prime(kafka_cluster.bootstrap, topic, f"sg-{topic}")
    names = ["m1", "m2", "m3"]
    kill = {n: ("--kill-at", point, "--kill-after", str(after)) for n, (point, after) in zip(names, plan, strict=True)}
    members = {name: start_member(kafka_clients, kafka_cluster, topic, store, name, tmp, *kill[name]) for name in names}
    wait_for("three members started", lambda: started(tmp / "log", names, members.values()), 60)
    sent = messages(12, 30_000, 4096)
    restarts = Restarts(
        members, lambda name: start_member(kafka_clients, kafka_cluster, topic, store, name, tmp), tmp, sent
    )
    for i, segs in enumerate(sent.segments.values()):
        produce(kafka_cluster.bootstrap, topic, segs, first_partition=i)
        restarts()
    wait_for("every message in the sink", restarts, 150)
    restarts.check(store)


@pytest.mark.servers
def test_a_record_at_its_delivery_limit_is_quarantined_then_rejected(
    kafka_cluster: MockCluster, kafka_clients: ClientProcesses, tmp_path: Path
) -> None:
    """A member told the group's delivery limit is 1 treats every record as at its limit: each one's
    bytes land in the store's quarantine (9070) before it is rejected; nothing is stored or delivered."""
    from reassembly.segstore import open_store
    from segmenter import Reason

    topic = kafka_cluster.create_topic(f"share-limit-{next(_topics)}", PARTITIONS)
    store = f"sqlite://{tmp_path / 'segments.db'}"
    (tmp_path / "sink").mkdir()
    prime(kafka_cluster.bootstrap, topic, f"sg-{topic}")
    start_member(kafka_clients, kafka_cluster, topic, store, "m1", tmp_path, "--delivery-limit", "1")
    wait_for("the member started", lambda: started(tmp_path / "log", ["m1"], kafka_clients.started), 60)
    sent = messages(2, 10_000, 4096)
    for i, segs in enumerate(sent.segments.values()):
        produce(kafka_cluster.bootstrap, topic, segs, first_partition=i)

    def quarantined() -> list[bytes]:
        with open_store(store, member="checker") as s:
            return [q[5] for q in s.quarantined() if q[3] is Reason.DELIVERY_LIMIT and q[5] != PROBE]

    # At least once: a record whose rejection the broker had not taken when its acquisition lock ran
    # out (a loaded machine) comes again, one delivery more, and is quarantined again; each row names
    # its delivery count. Every record is there, and nothing else.
    every = {r for segs in sent.segments.values() for r in segs}
    wait_for("every record quarantined", lambda: set(quarantined()) >= every, 60)
    assert set(quarantined()) == every and len(every) == sent.total
    assert in_sink(tmp_path / "sink") == set()
    assert kafka_clients.started[0].terminate() == 0
    with open_store(store, member="checker") as s:
        assert s.stats().units == 0
