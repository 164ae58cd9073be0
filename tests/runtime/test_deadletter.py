"""Dead letters: the Parquet folder (atomic files) and a Kafka topic through the mock cluster."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from reassembly.assembler import Assembler, GroupComplete, MessageComplete
from reassembly.dispatcher import Work
from reassembly.runtime import DeadRecord, Failure, KafkaDeadLetter, ParquetDeadLetter, read_dead_letters
from tests.runtime.support import message
from tests.support.kafka_cluster import MockCluster, kafka_cluster_fixture  # noqa: F401


def _record(m: object, attempts: int = 5) -> DeadRecord:
    positions = tuple((("t", 0), 10 + i) for i in range(2))
    return DeadRecord(Work(7, "g", m, attempts, 100, positions), Failure("KeyError", "'x'"), attempts)


def test_parquet_rows_and_unit_of_work(tmp_path: Path) -> None:
    dl = ParquetDeadLetter(tmp_path / "dead")
    group = GroupComplete(bytes(24), (message(0, 1, size=10), message(0, 2, size=20, last=True)))
    dl.write([_record(message(5, 3, size=1000)), _record(group, 2)])
    dl.write([])
    rows = read_dead_letters(tmp_path / "dead")
    assert [(r["msg_seq_number"], len(r["payload"]), r["attempts"]) for r in rows] == [(3, 1000, 5), (1, 10, 2),
                                                                                         (2, 20, 2)]  # fmt: skip
    assert rows[0]["reason"] == "KeyError: 'x'" and rows[0]["positions"] == '[[["t",0],10],[["t",0],11]]'
    assert len(dl.files) == 1 and dl.rows == 3
    assert [p.name for p in (tmp_path / "dead").iterdir() if p.name.startswith(".")] == []


def test_kafka_dead_letter_is_segmented_with_headers(kafka_cluster: MockCluster) -> None:
    from confluent_kafka import Consumer

    topic = kafka_cluster.create_topic(f"dead-{uuid.uuid4().hex[:8]}", partitions=1)
    config = {"bootstrap.servers": kafka_cluster.bootstrap}
    dl = KafkaDeadLetter(config, topic, producer_options={"max_record_bytes": 4096})
    big = message(9, 4, size=20_000)
    try:
        dl.write([_record(big, 3)])
    finally:
        dl.close()
    c = Consumer({**config, "group.id": "read-dead", "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    asm, got, headers = Assembler(), [], []
    try:
        while not got:
            rec = c.poll(10)
            assert rec is not None and rec.error() is None
            headers.append(dict(rec.headers() or []))
            got += [e for e in asm.receive(rec.value()) if isinstance(e, MessageComplete)]
    finally:
        c.close()
    assert got[0].payload == big.payload and len(headers) > 4, "segmented into several records"
    h = headers[0]
    assert h["dead-reason"] == b"KeyError: 'x'" and h["dead-attempts"] == b"3"
    assert h["dead-group-id"] == big.group_id.hex().encode() and h["dead-msg-seq-number"] == b"4"
    assert json.loads(h["dead-positions"]) == [[["t", 0], 10], [["t", 0], 11]]
