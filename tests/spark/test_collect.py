"""The streaming collector on Spark: full batches, an event-time timeout, a rule changed between micro-batches."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reassembly.collector import Rule
from reassembly.collector.storage import SQLiteStorage
from reassembly.spark.collect import SparkCollectOptions, collect_stream, message_source, start
from tests.support.collect_helpers import read_batches

pytestmark = pytest.mark.spark
T0 = time.time() - 100_000


def land(landing: Path, name: str, rows: list[tuple[str, bytes]], at: float) -> None:
    tmp = landing.parent / f".{name}"
    table = pa.table({"destination": [d for d, _ in rows], "payload": pa.array([p for _, p in rows], pa.binary())})
    pq.write_table(table, tmp)
    os.utime(tmp, (at, at))
    tmp.rename(landing / name)


def run(spark: Any, base: Path, rules: str) -> None:
    opts = SparkCollectOptions(rules=rules, max_segment_size=150, watermark=0)
    query = start(collect_stream(message_source(spark, str(base / "landing")), opts), base / "out", str(base / "ckpt"))
    assert query.awaitTermination(600) and query.exception() is None


def batches(out: Path) -> list[list[bytes]]:
    return sorted(read_batches(out).values())


def test_streaming_collector(stream_spark: Any, tmp_path: Path) -> None:
    (tmp_path / "landing").mkdir()
    rules = str(tmp_path / "rules.db")
    storage = SQLiteStorage(rules)
    storage.put_rule(Rule("acme", "ftp-acme", max_messages=3, max_wait=60))
    long = b"z" * 400  # segmented at 150 bytes; within one event time members are ordered by bytes
    land(tmp_path / "landing", "f0.parquet", [("acme", b"a%d" % i) for i in range(4)] + [("acme", long)], T0)
    run(stream_spark, tmp_path, rules)
    assert batches(tmp_path / "out") == [[b"a0", b"a1", b"a2"]]  # one full batch; two held in the state
    storage.put_rule(Rule("acme", "ftp-acme", max_messages=2, max_wait=60))  # read at the next micro-batch
    land(tmp_path / "landing", "f1.parquet", [("acme", b"b0"), ("other", b"o0")], T0 + 10)
    run(stream_spark, tmp_path, rules)
    got = batches(tmp_path / "out")
    assert [b"a3", long] in got and [b"b0"] not in got  # the new limit split the held batch
    land(tmp_path / "landing", "f2.parquet", [("other", b"o1")], T0 + 1000)  # the watermark passes every timer
    run(stream_spark, tmp_path, rules)
    got = batches(tmp_path / "out")
    assert [b"b0"] in got and [b"o0"] in got  # closed by their event-time timers (o1 waits for its own)
    assert [b"o1"] not in got
    seen = [p for b in got for p in b]
    assert len(seen) == len(set(seen)) == 7  # 8 sent, o1 still held in the state
