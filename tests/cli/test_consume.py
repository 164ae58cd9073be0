"""``reassemble consume``: its options, its one-line usage errors, and a run end to end against
librdkafka's mock cluster, stopped by ``--idle-exit`` and by SIGTERM (a drain: the handlers in
flight finish, the safe offsets are committed, exit 0)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from reassembly.cli.summary import problems
from tests.support.command import reassemble

HANDLER = "tests.support.dispatch_handler"


def test_help_lists_the_options() -> None:
    r = reassemble("consume", "--help")
    assert r.returncode == 0
    for option in ("--group", "--handler", "--workers", "--ordering", "--runner", "--max-attempts", "--dead-letter",
                   "--after-dead", "--budget-messages", "--budget-bytes", "--idle-exit", "--summary-json",
                   "--metrics-port", "--drain-timeout", "--kafka-config", "--share", "--store", "--lease"):  # fmt: skip
        assert option in r.stdout, option


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["ftp://h:1", "t", "--handler", "m:f"], "unknown URL scheme"),
        (["kafka://127.0.0.1:9", "t", "--handler", "m:f"], "--group is required"),
        (["kafka://127.0.0.1", "t", "--group", "g", "--handler", "m:f"], "not a Kafka URL"),
        (["kafka://127.0.0.1:9", "t", "--group", "g", "--handler", "nocolon"], "expected MODULE:FUNCTION"),
        (["kafka://127.0.0.1:9", "t", "--group", "g", "--handler", "no_such_module_x:f"], "cannot import"),
        (["kafka://127.0.0.1:9", "t", "--group", "g", "--handler", f"{HANDLER}:nothing"], "has no function"),
        (["stomp://127.0.0.1:9", "q", "--group", "g", "--handler", f"{HANDLER}:handle"], "for kafka:// URLs only"),
        (["kafka://127.0.0.1:9", "t", "--group", "g", "--handler", f"{HANDLER}:handle",
          "-X", "enable.auto.commit=true"], "would commit offsets past"),
        (["kafka://127.0.0.1:9", "t", "--group", "g", "--handler", f"{HANDLER}:handle", "--runner", "asyncio"],
         "needs an async def handler"),
        (["kafka://127.0.0.1:9", "t", "--group", "g", "--handler", "m:f", "--workers", "0"], "must be at least 1"),
        (["kafka://127.0.0.1:9", "t", "--group", "g", "--handler", "m:f", "--budget-bytes", "lots"], "not a size"),
    ],
)  # fmt: skip
def test_usage_errors_are_one_line_and_exit_2(args: list[str], says: str) -> None:
    r = reassemble("consume", *args)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("reassemble: error: ") and says in lines[0], r.stderr


# ---------------------------------------------------------------------------------- against the mock cluster
pytest.importorskip("confluent_kafka")

from tests.support.kafka_cluster import (  # noqa: E402, F401
    ClientProcesses,
    MockCluster,
    kafka_clients_fixture,
    kafka_cluster_fixture,
)


def _produce(bootstrap: str, topic: str, count: int) -> None:
    from segmenter.brokers import KafkaSegmentProducer

    producer = KafkaSegmentProducer(topic, {"bootstrap.servers": bootstrap}, max_record_bytes=2048)
    try:
        for i in range(count):
            producer.send(b"OK" + bytes([i]) * (500 + 100 * i)).wait(30)
    finally:
        producer.close()


def _committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        marks = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
        got = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return {tp.partition: marks[tp.partition] - tp.offset for tp in got}  # records not committed
    finally:
        c.close()


def _wait(what: str, ready: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)  # polls the condition


@pytest.mark.parametrize(("runner", "function"), [("threads", "handle"), ("asyncio", "handle_async"),
                                                  ("processes", "handle")])  # fmt: skip
def test_consume_to_idle_exit(kafka_cluster: MockCluster, tmp_path: Path, runner: str, function: str) -> None:
    topic = kafka_cluster.create_topic(f"t-idle-{uuid.uuid4().hex[:8]}", partitions=2)
    group = f"g-{uuid.uuid4().hex[:8]}"
    _produce(kafka_cluster.bootstrap, topic, 20)
    log, summary = tmp_path / "handled.log", tmp_path / "s.json"
    r = reassemble(
        "consume", f"kafka://{kafka_cluster.bootstrap}", topic, "--group", group, "--handler", f"{HANDLER}:{function}",
        "--runner", runner, "--workers", "4", "--idle-exit", "2s", "--summary-json", str(summary),
        "--retry-delay", "10ms", "--max-attempts", "20",
        env={"DISPATCH_LOG": str(log), "DISPATCH_FAIL_RATE": "0.2", "DISPATCH_SLEEP_MS": "5"}, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "consumed 20 messages: 20 handled, 0 dead-lettered" in r.stdout
    doc = json.loads(summary.read_text())
    assert problems(doc) == []
    assert doc["command"] == "consume" and doc["outcome"] == "completed"
    assert doc["consume"]["summary"]["done"] == 20 and doc["consume"]["stopped"] == "idle"
    assert _committed(kafka_cluster.bootstrap, group, topic, 2) == {0: 0, 1: 0}


def test_sigterm_drains_the_handlers_in_flight_and_exits_0(
    kafka_cluster: MockCluster, kafka_clients: ClientProcesses, tmp_path: Path
) -> None:
    topic = kafka_cluster.create_topic(f"t-term-{uuid.uuid4().hex[:8]}", partitions=1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    _produce(kafka_cluster.bootstrap, topic, 10)
    log, gate = tmp_path / "handled.log", tmp_path / "gate"
    proc = kafka_clients.start(
        ["-m", "reassembly", "consume", f"kafka://{kafka_cluster.bootstrap}", topic, "--group", group,
         "--handler", f"{HANDLER}:slow", "--workers", "3", "--ordering", "unordered", "--verbose",
         "--summary-json", str(tmp_path / "s.json")],
        env={"DISPATCH_LOG": str(log), "DISPATCH_GATE": str(gate)},
    )  # fmt: skip

    def started() -> int:
        return sum('"start"' in line for line in log.read_text().splitlines()) if log.exists() else 0

    _wait("three handlers running", lambda: started() == 3)
    proc.proc.terminate()  # SIGTERM: no new work; the three in flight finish
    _wait("the drain", lambda: "draining" in proc.errors())
    gate.touch()
    assert proc.wait(60) == 0, proc.errors()
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    # what was handed out (the three running and those queued behind them at their workers) finished
    starts, ends = ([e["kind"] for e in lines].count(k) for k in ("start", "end"))
    assert starts == ends >= 3
    doc = json.loads((tmp_path / "s.json").read_text())
    assert doc["consume"]["stopped"] == "signal" and doc["consume"]["summary"]["done"] == starts
    assert doc["consume"]["summary"]["unfinished"] == 0
    # committed: the end of the partition if every message was handed out before the signal, else
    # not past the first one that was not
    assert (_committed(kafka_cluster.bootstrap, group, topic, 1)[0] == 0) == (starts == 10)
