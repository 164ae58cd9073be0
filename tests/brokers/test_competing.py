"""Competing consumers on ActiveMQ (AMQP and STOMP): one queue without message groups, three consumer
processes, one shared segment store (PostgreSQL or SQLite), the segments of every message spread
over the consumers by the broker.

The kill test SIGKILLs each consumer once at a point a hypothesis plan draws (after a store write
and before the settlement, after a claim, during assembly) and restarts it: the broker redelivers a
dead consumer's unsettled deliveries to the others at once, a claim's lease runs out and another
consumer takes the message over. Checked: every message in the sink byte-identical, once; the
store empty; every segment used once or a duplicate.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from segmenter.brokers import open_sender
from tests.support.activemq_server import ActiveMQ, available, broker_fixture  # noqa: F401
from tests.support.competing import (
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
from tests.support.kafka_cluster import ClientProcess, ClientProcesses, kafka_clients_fixture  # noqa: F401
from tests.support.pg_server import fresh_database, pg_url

__all__ = ["pg_url"]  # the module-scoped server fixture

pytestmark = [
    pytest.mark.skipif(not available(), reason="ActiveMQ (Debian package activemq) or java missing"),
    pytest.mark.servers,
]
MEMBER = ["-m", "tests.support.store_member_proc", "queue"]
_queues = itertools.count()


def store_for(kind: str, pg_url: str, tmp: Path, name: str) -> str:
    return fresh_database(pg_url, name) if kind == "postgres" else f"sqlite://{tmp / 'segments.db'}"


def send(url: str, queue: str, sent: Sent) -> None:
    """Every segment as its own message, without a group: the broker spreads them over the consumers."""
    with open_sender(url, queue) as sender:
        for segs in sent.segments.values():
            for seg in segs:
                sender.send_bytes(seg)
        sender.flush()


def start(clients: ClientProcesses, url: str, queue: str, store: str, name: str, tmp: Path,
          *extra: str) -> ClientProcess:  # fmt: skip
    return clients.start(
        [*MEMBER, url, queue, "-", store, name, str(tmp / "sink"), str(tmp / "log"), "--prefetch", "2", *extra],
        name=name,
    )


@pytest.mark.parametrize("scheme", ["amqp", "stomp"])
def test_three_consumers_share_every_message(broker: ActiveMQ, kafka_clients: ClientProcesses, pg_url: str,
                                             tmp_path: Path, scheme: str) -> None:  # fmt: skip
    """Most messages have segments on more than one consumer, one on all three; each message once,
    byte-identical; the store (PostgreSQL) empty after."""
    queue = f"q.competing.{next(_queues)}"
    store = store_for("postgres", pg_url, tmp_path, queue.replace(".", "_"))
    (tmp_path / "sink").mkdir()
    names = ["c1", "c2", "c3"]
    for name in names:
        start(kafka_clients, broker.url(scheme), queue, store, name, tmp_path)
    wait_for("three consumers started", lambda: started(tmp_path / "log", names, kafka_clients.started), 60)
    sent = messages(20, 40_000, 4096)
    send(broker.url(scheme), queue, sent)
    wait_for("every message in the sink", lambda: len(in_sink(tmp_path / "sink")) == len(sent.payloads), 60)
    for client in kafka_clients.started:
        assert client.terminate() == 0, client.errors()[-2000:]
    check_sink(tmp_path / "sink", sent)
    check_store(store, sent, tmp_path / "log")
    members = spread(tmp_path / "log")
    assert len([g for g, m in members.items() if len(m) > 1]) > len(sent.payloads) // 2
    three = [g for g, m in members.items() if len(m) == 3]
    assert three
    for gid in three:
        assert (tmp_path / "sink" / f"{gid}-1").read_bytes() == sent.payloads[bytes.fromhex(gid)]


POINTS = ("written", "claimed", "assembling")


@pytest.mark.sweep
@pytest.mark.parametrize(("scheme", "kind"), [("amqp", "postgres"), ("stomp", "sqlite")])
@settings(max_examples=2, deadline=None, phases=(Phase.explicit, Phase.generate),
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip
@given(plan=st.lists(st.tuples(st.sampled_from(POINTS), st.integers(1, 4)), min_size=3, max_size=3))
def test_consumers_killed_at_drawn_points_lose_nothing(broker: ActiveMQ, kafka_clients: ClientProcesses, pg_url: str,
                                                       tmp_path_factory: pytest.TempPathFactory, scheme: str,
                                                       kind: str, plan: list[tuple[str, int]]) -> None:  # fmt: skip
    """Each consumer SIGKILLed once at its drawn point and restarted: every message in the sink
    byte-identical, once; every segment used once or a duplicate; nothing left in the store."""
    tmp = tmp_path_factory.mktemp("competing-kill")
    queue = f"q.competing.kill.{next(_queues)}"
    store = store_for(kind, pg_url, tmp, queue.replace(".", "_"))
    (tmp / "sink").mkdir()
    url = broker.url(scheme)
    names = ["c1", "c2", "c3"]
    kill = {n: ("--kill-at", point, "--kill-after", str(after)) for n, (point, after) in zip(names, plan, strict=True)}
    members = {name: start(kafka_clients, url, queue, store, name, tmp, *kill[name]) for name in names}
    wait_for("three consumers started", lambda: started(tmp / "log", names, members.values()), 60)
    sent = messages(12, 30_000, 4096)
    restarts = Restarts(members, lambda name: start(kafka_clients, url, queue, store, name, tmp), tmp, sent)
    send(url, queue, sent)
    wait_for("every message in the sink", restarts, 90)
    restarts.check(store)
