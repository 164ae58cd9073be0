"""``reassemble drain kafka://...``: a topic -> landing Parquet files -> ``reassemble run``.

Against librdkafka's mock cluster, with real processes: a drain SIGKILLed after its first file
became durable but before its offsets were committed (its records are read and landed again),
then the command SIGKILLed mid-file (its temporary file is orphaned, its records never
committed), then restarted until idle. The landing table holds every record at least once, with
its coordinates; ``reassemble run`` on it, with no extra option, reports every message once and
counts the records landed twice as duplicates.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, NamedTuple

import pytest

pytest.importorskip("confluent_kafka")

from tests.support.command import reassemble
from tests.support.kafka_cluster import MockCluster, client_env, kafka_cluster_fixture  # noqa: F401
from tests.support.kafka_producer_proc import workload

FAST = ["--kafka-option", "session.timeout.ms=2000", "--kafka-option", "heartbeat.interval.ms=300"]

# A drain that SIGKILLs itself right after its first file became durable, before committing it.
_KILL_AFTER_FIRST_FILE = """
import os, signal, sys
from pathlib import Path
from reassembly.brokers.drain import KAFKA_LANDING, Drain, Rolling
from reassembly.brokers.kafka import KafkaSource
bootstrap, topic, group, landing = sys.argv[1:5]
source = KafkaSource({"bootstrap.servers": bootstrap, "group.id": group, "session.timeout.ms": 2000,
                      "heartbeat.interval.ms": 300}, topic)
drain = Drain(source, Path(landing), Rolling(max_bytes=64 << 10), columns=KAFKA_LANDING,
              on_file=lambda path, n: (print(n, flush=True), os.kill(os.getpid(), signal.SIGKILL)))
drain.run(lambda: False)
"""


def _landed(landing: Path) -> list[dict[str, object]]:
    import pyarrow.parquet as pq

    return [row for f in sorted(landing.glob("*.parquet")) for row in pq.read_table(f).to_pylist()]


class Drained(NamedTuple):
    landing: Path
    sent: int
    twice: int  # records landed twice (read again after the drain published them)
    payloads: dict[tuple[bytes, int], bytes]


@pytest.fixture(scope="module")
def drained(kafka_cluster: MockCluster, tmp_path_factory: pytest.TempPathFactory) -> Drained:
    """Mixed traffic through a drain killed twice (after a publish, mid-file), then restarted: the
    landing table holds every record at least once, with its coordinates, and every offset is committed."""
    from confluent_kafka import Producer

    tmp_path = tmp_path_factory.mktemp("kafka-drain")

    topic = kafka_cluster.create_topic(f"drain-{uuid.uuid4().hex[:8]}", 3)
    group = f"drain-{uuid.uuid4().hex[:8]}"
    url = "kafka://" + kafka_cluster.bootstrap
    landing = tmp_path / "landing"
    items = workload(11, 24, 200_000)
    p = Producer({"bootstrap.servers": kafka_cluster.bootstrap, "enable.idempotence": True})
    sent = 0
    for item in items:
        for s in item.segments(16 << 10):
            key = s.header.group_id.hex().encode()
            p.produce(topic, key=key, value=s.encode(), headers=[("n", str(sent).encode())])
            sent += 1
    assert p.flush(30) == 0
    env = client_env()

    # 1. Killed between publishing its first file and committing it.
    first = subprocess.run([sys.executable, "-c", _KILL_AFTER_FIRST_FILE, kafka_cluster.bootstrap, topic, group,
                            str(landing)], capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert first.returncode == -signal.SIGKILL, first.stderr
    in_first_file = int(first.stdout.split()[0])
    assert len(_landed(landing)) == in_first_file > 0

    # 2. The command, SIGKILLed while writing a file.
    cmd = [sys.executable, "-m", "reassembly", "drain", url, topic, str(landing), "--group", group,
           "--max-file-bytes", str(48 << 10), "--prefetch", "20", *FAST]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    published = 0
    for line in proc.stderr:
        published += " segments" in line
        if published == 3:
            break
    deadline = time.monotonic() + 60
    while True:  # stop it, look, kill only once a temporary file exists
        proc.send_signal(signal.SIGSTOP)
        if list(landing.glob(".drain-*.tmp")) or time.monotonic() > deadline:
            break
        proc.send_signal(signal.SIGCONT)
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert list(landing.glob(".drain-*.tmp")), "not killed mid-file"

    # 3. Restarted; it removes the orphan, drains the rest and exits when idle.
    done = subprocess.run([*cmd, "--idle-exit", "4"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert not list(landing.glob(".drain-*.tmp"))
    rows = _landed(landing)
    by_coord = {(r["partition"], r["offset"]): r for r in rows}
    assert len(by_coord) == sent  # every record at least once
    values = {bytes(s.encode()) for it in items for s in it.segments(16 << 10)}
    assert {bytes(r["segment"]) for r in rows} == values  # type: ignore[arg-type]
    assert {r["topic"] for r in rows} == {topic}
    assert all(r["headers"] and r["headers"][0]["key"] == "n" for r in rows)  # type: ignore[index]
    assert all(r["timestamp"] is not None and r["key"] for r in rows)
    twice = len(rows) - sent
    assert twice >= in_first_file  # the first file's records were landed again

    # Every offset committed: the group has nothing left to read.
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": kafka_cluster.bootstrap, "group.id": group})
    try:
        tps = c.committed([TopicPartition(topic, n) for n in range(3)], timeout=10)
        committed = {tp.partition: tp.offset for tp in tps}
    finally:
        c.close()
    ends: dict[int, int] = {}
    for r in rows:
        ends[r["partition"]] = max(ends.get(r["partition"], 0), r["offset"] + 1)  # type: ignore[arg-type, operator]
    assert committed == {n: ends.get(n, -1001) for n in range(3)}

    expected = {k: v for it in items for k, v in it.messages().items()}
    return Drained(landing, sent, twice, expected)


def _check_messages(msgs: list[dict[str, Any]], d: Drained) -> None:
    assert {r["status"] for r in msgs} == {"complete"}
    assert len(msgs) == len(d.payloads)
    assert {(bytes(r["group_id"]), r["msg_seq_number"]): bytes(r["payload"]) for r in msgs} == d.payloads


def test_the_job_reads_the_kafka_landing_table(spark: Any, drained: Drained) -> None:
    """The Spark job (shared session) on the drained table, no option: every message once, the
    records landed twice counted as duplicates, nothing quarantined."""
    from reassembly.spark import reassemble as reassemble_df

    out = reassemble_df(spark.read.parquet(str(drained.landing))).combined.collect()
    msgs = [r.asDict() for r in out if r.kind == "message"]
    _check_messages(msgs, drained)
    assert [r for r in out if r.kind == "quarantine"] == []
    assert sum(r["segments_used"] for r in msgs) == drained.sent
    assert sum(r["duplicates"] for r in msgs) == drained.twice


@pytest.mark.slow
def test_reassemble_run_command_on_the_kafka_landing_directory(drained: Drained, tmp_path: Path) -> None:
    """The same through ``reassemble run LANDING OUT`` as a process (its own Spark), no extra option."""
    out = tmp_path / "out"
    run = reassemble("run", str(drained.landing), str(out), "--no-progress", timeout=900)
    assert run.returncode == 0, run.stderr
    m = re.search(r"segments: (\d+) in = (\d+) used \+ (\d+) quarantined \+ (\d+) duplicates: holds", run.stdout)
    assert m, run.stdout
    d = drained
    assert [int(x) for x in m.groups()] == [d.sent + d.twice, d.sent, 0, d.twice]
    import pyarrow.parquet as pq

    _check_messages(pq.read_table(out / "messages").to_pylist(), d)


def test_kafka_options_are_refused_for_broker_urls_and_auto_commit(tmp_path: Path) -> None:
    """Usage errors, exit 2, before anything is touched."""
    bad = reassemble("drain", "stomp://127.0.0.1:1", "q", str(tmp_path / "l"), "--group", "g")
    assert bad.returncode == 2 and "--group and --kafka-option are for kafka:// URLs" in bad.stderr
    auto = reassemble("drain", "kafka://127.0.0.1:1", "t", str(tmp_path / "l"), "--kafka-option",
                      "enable.auto.commit=true")  # fmt: skip
    assert auto.returncode == 2 and "would commit records before their file is durable" in auto.stderr
    url = reassemble("drain", "kafka://nohost", "t", str(tmp_path / "l"))
    assert url.returncode == 2 and "not a Kafka URL" in url.stderr
    assert not (tmp_path / "l").exists()
