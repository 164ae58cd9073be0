"""``reassemble consume --share`` end to end: three processes of the command, one Kafka share group on
librdkafka's mock cluster and one SQLite segment store; one ActiveMQ queue over STOMP and a
PostgreSQL store.

Each message's segments go to the topic's partitions round robin, and the mock gives each partition
to one member, so a message's segments reach several processes; whichever completes it hands it to
its handler. The handler (``tests.support.dispatch_handler:digest``) appends the message's id and
SHA-256 to a log, and fails the first attempt of every third message: the retry waits 2.5 to 5 s in
the dispatcher, longer than the 2 s lease, which the source keeps renewing (a lost lease would
hand the message to a second member: the log would have it twice). A message's last segment is
sent once the others are in the store, so the member reading its partition completes it: the last
segments go to every partition in turn. Checked: every message handled exactly once over the three
processes, byte-identical, by more than one process; the summaries show most messages with segments
stored by several members and some by all three; the store is empty after.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path

import pytest

from reassembly.cli.summary import problems
from reassembly.segstore import open_store
from tests.brokers.test_share import PARTITIONS, prime, produce
from tests.support.activemq_server import ActiveMQ, available, broker_fixture  # noqa: F401
from tests.support.command import reassemble
from tests.support.competing import connected, messages, wait_for
from tests.support.logs import complete_lines
from tests.support.pg_server import fresh_database, pg_url

pytest.importorskip("confluent_kafka")

from tests.support.kafka_cluster import (  # noqa: F401
    ClientProcesses,
    MockCluster,
    kafka_clients_fixture,
    kafka_cluster_fixture,
)

__all__ = ["pg_url"]  # the module-scoped server fixture

HANDLER = "tests.support.dispatch_handler:digest"
_topics = itertools.count()


def handled(log: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in complete_lines(log)]


@pytest.mark.servers
def test_three_consume_processes_share_one_group(kafka_cluster: MockCluster, kafka_clients: ClientProcesses,
                                                  tmp_path: Path) -> None:  # fmt: skip
    topic = kafka_cluster.create_topic(f"consume-share-{next(_topics)}", PARTITIONS)
    group = f"sg-{topic}"
    store = f"sqlite://{tmp_path / 'segments.db'}"
    log = tmp_path / "handled.log"
    prime(kafka_cluster.bootstrap, topic, group)
    names = ["m1", "m2", "m3"]
    members = []
    for name in names:
        argv = ["-m", "reassembly", "consume", f"kafka://{kafka_cluster.bootstrap}", topic, "--group", group,
                "--share", "--store", store, "--member", name, "--lease", "2s", "--handler", HANDLER,
                "--workers", "4", "--retry-delay", "5s", "--summary-json", str(tmp_path / f"{name}.json"),
                "-X", "log_level=3"]  # fmt: skip
        members.append(kafka_clients.start(argv, name=name, env={"DISPATCH_LOG": str(log)}))
    ports = [int(b.rpartition(":")[2]) for b in kafka_cluster.bootstrap.split(",")]
    wait_for("three members connected", lambda: connected(members, ports), 60)  # then SIGTERM drains them
    sent = messages(24, 40_000, 4096)  # 10 segments each
    checker = open_store(store, member="checker", unit_of_work=False)  # as the members ask (no --unit-of-work)
    stored = 0
    for i, segs in enumerate(sent.segments.values()):
        # paced: the members' assignment settles while the first messages flow, later ones spread as it says
        wait_for(f"message {i - 2} handled", lambda: len(handled(log)) >= i - 2, 120)  # noqa: B023
        # the last segment once the others are in the store: its partition's member completes the
        # message, and the last segments go to every partition in turn
        produce(kafka_cluster.bootstrap, topic, segs[:-1], first_partition=i)
        stored += len(segs) - 1
        first = f"message {i}'s first segments stored"
        wait_for(first, lambda: checker.stats().counters.get("stored", 0) >= stored, 60)  # noqa: B023
        produce(kafka_cluster.bootstrap, topic, segs[-1:], first_partition=i + len(segs) - 1)
        stored += 1
    wait_for("every message handled", lambda: len(handled(log)) >= len(sent.payloads), 120)
    for m in members:
        assert m.terminate() == 0, m.errors()[-2000:]  # SIGTERM: a drain, exit 0

    lines = handled(log)
    seen = sorted((str(x["group"]), x["seq"]) for x in lines)
    assert seen == sorted((gid.hex(), 1) for gid in sent.payloads)  # each message exactly once
    for x in lines:
        assert x["sha256"] == hashlib.sha256(sent.payloads[bytes.fromhex(str(x["group"]))]).hexdigest()
    assert len({x["pid"] for x in lines}) >= 2, "one process completed every message"

    docs = [json.loads((tmp_path / f"{name}.json").read_text()) for name in names]
    spread: dict[str, int] = {}
    for doc in docs:
        assert problems(doc) == [] and doc["outcome"] == "completed", doc
        c = doc["consume"]
        assert c["share"] is True and c["stopped"] == "signal" and c["summary"]["unfinished"] == 0
        assert c["source"]["leases_lost"] == 0 and c["source"]["settlements_lost"] == 0
        for n, count in c["source"]["spread"].items():
            spread[n] = spread.get(n, 0) + count
    assert sum(d["consume"]["summary"]["done"] for d in docs) == len(sent.payloads)
    assert sum(d["consume"]["summary"]["retries"] for d in docs) >= 1
    assert sum(spread.values()) == len(sent.payloads)
    # segments on several members for most messages, on all three for some (each message once in the log above)
    assert sum(count for n, count in spread.items() if int(n) > 1) > len(sent.payloads) // 2, spread
    assert spread.get("3", 0) >= 1, spread
    assert sum(d["consume"]["source"]["renewals"] for d in docs) >= 1  # held claims outlived their 2 s lease
    with checker:
        st = checker.stats()
    assert (st.units, st.segments) == (0, 0), st
    assert st.counters.get("delivered") == len(sent.payloads) and st.counters.get("used") == sent.total, st.counters


@pytest.mark.servers
@pytest.mark.skipif(not available(), reason="ActiveMQ (Debian package activemq) or java missing")
def test_three_consume_processes_compete_on_a_stomp_queue(broker: ActiveMQ, kafka_clients: ClientProcesses,
                                                          pg_url: str, tmp_path: Path) -> None:  # fmt: skip
    """The same over STOMP with the store on PostgreSQL: a queue without message groups, its segments
    spread by the broker over three ``reassemble consume --share`` processes (prefetch 2); each
    message handled once, intact."""
    from segmenter.brokers import open_sender

    url, queue = broker.url("stomp"), "q.consume.share"
    store, log = fresh_database(pg_url, "consume_share_stomp"), tmp_path / "handled.log"
    names = ["c1", "c2", "c3"]
    members = []
    for name in names:
        argv = ["-m", "reassembly", "consume", url, queue, "--share", "--store", store, "--member", name,
                "--prefetch", "2", "--handler", HANDLER, "--workers", "4", "--retry-delay", "100ms",
                "--summary-json", str(tmp_path / f"{name}.json")]  # fmt: skip
        members.append(kafka_clients.start(argv, name=name, env={"DISPATCH_LOG": str(log)}))
    wait_for("three members connected", lambda: connected(members, [broker.ports["stomp"]]), 60)
    sent = messages(12, 40_000, 4096)
    with open_sender(url, queue) as sender:
        for i, segs in enumerate(sent.segments.values()):
            wait_for(f"message {i - 2} handled", lambda: len(handled(log)) >= i - 2, 60)  # noqa: B023
            for seg in segs:
                sender.send_bytes(seg)
            sender.flush()
    wait_for("every message handled", lambda: len(handled(log)) >= len(sent.payloads), 60)
    for m in members:
        assert m.terminate() == 0, m.errors()[-2000:]
    lines = handled(log)
    assert sorted(str(x["group"]) for x in lines) == sorted(gid.hex() for gid in sent.payloads)
    for x in lines:
        assert x["sha256"] == hashlib.sha256(sent.payloads[bytes.fromhex(str(x["group"]))]).hexdigest()
    docs = [json.loads((tmp_path / f"{name}.json").read_text())["consume"] for name in names]
    assert sum(d["summary"]["done"] for d in docs) == len(sent.payloads)
    several = sum(count for d in docs for n, count in d["source"]["spread"].items() if int(n) > 1)
    assert several >= 1, [d["source"]["spread"] for d in docs]
    with open_store(store, member="checker") as s:
        st = s.stats()
    assert (st.units, st.counters.get("delivered")) == (0, len(sent.payloads)), st


def test_share_needs_a_store() -> None:
    r = reassemble("consume", "kafka://127.0.0.1:9", "t", "--group", "g", "--share", "--handler", HANDLER)
    assert r.returncode == 2 and "--share needs --store" in r.stderr, r.stderr
    r = reassemble("consume", "kafka://127.0.0.1:9", "t", "--group", "g", "--store", "x.db", "--handler", HANDLER)
    assert r.returncode == 2 and "with --share only" in r.stderr, r.stderr
