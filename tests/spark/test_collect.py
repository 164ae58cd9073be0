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
from reassembly.spark.collect import SparkCollectOptions, collect_stream, message_source, start
from reassembly.spark.collect.core import Out
from reassembly.storage.collector import SQLiteStorage
from tests.spark.test_collect_core import batches as segment_batches
from tests.spark.test_collect_core import by_destination, in_process
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


def test_the_spark_collector_closes_what_the_in_process_collector_closes(stream_spark: Any, tmp_path: Path) -> None:
    """Differential, with quiet gaps: three files, one micro-batch each (the watermark is the newest event
    time of the one before), then the no-data micro-batch of the final watermark, against the in-process
    collector ticked as a running one is. Batches close ``idle`` found by a later member (acme@25) or by
    the timer (initech), ``timeout`` found by a member (globex@35) or by the timer after a trickle that
    never went quiet (acme) or in the next micro-batch (globex@38), ``full``; ``other`` (default rule)
    stays open. No deadline equals a watermark (Spark fires a timer the watermark passed)."""
    storage = SQLiteStorage(str(tmp_path / "rules.db"))
    rules = {
        "acme": Rule("acme", "ftp-acme", max_messages=10, max_wait=60, idle_timeout=10),
        "globex": Rule("globex", "ftp-globex", max_messages=3, max_wait=30),
        "initech": Rule("initech", "ftp-initech", max_wait=60, idle_timeout=10),
    }
    for rule in rules.values():
        storage.put_rule(rule)
    acme_trickle = [("acme", s) for s in range(25, 82, 8)]  # every 8 s from 25 to 81: due at 25 + 60
    files = [  # (destination, second)
        [("acme", 0), ("acme", 3), ("acme", 8), ("globex", 0)],
        [*acme_trickle, *[("globex", s) for s in range(35, 39)], ("initech", 80), ("initech", 85)],
        [("other", 100)],
    ]
    t0 = 1_700_000_000_000
    landing = tmp_path / "landing"
    landing.mkdir()
    messages = []
    for n, file in enumerate(files):
        sent = [(d, b"%s@%03d" % (d.encode(), s), t0 + s * 1000) for d, s in file]
        table = pa.table(
            {
                "destination": [d for d, _, _ in sent],
                "payload": pa.array([p for _, p, _ in sent]),
                "event_time": pa.array([t for _, _, t in sent], pa.timestamp("ms", tz="UTC")),
            }
        )
        tmp = tmp_path / f".f{n}.parquet"
        pq.write_table(table, tmp)
        os.utime(tmp, (T0 + n, T0 + n))  # the file source takes them oldest first
        tmp.rename(landing / f"f{n}.parquet")
        messages += sent
    source = (
        stream_spark.readStream.schema("destination string, payload binary, event_time timestamp")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(landing))
    )
    opts = SparkCollectOptions(rules=str(tmp_path / "rules.db"), watermark=0)
    query = start(collect_stream(source, opts), tmp_path / "out", str(tmp_path / "ckpt"))
    assert query.awaitTermination(600) and query.exception() is None
    rows = [
        Out(target=path.parent.name.removeprefix("target="), **r)
        for path in sorted((tmp_path / "out").glob("batch=*/target=*/*.parquet"))
        for r in pq.read_table(path).to_pylist()
    ]
    got = sorted(segment_batches(rows).items(), key=lambda kv: (kv[0].split("#")[0], int(kv[0].split("#")[1])))
    want = in_process(rules, sorted(messages, key=lambda m: (m[2], m[1])), end=t0 + 100_000)
    for destination in ("acme", "globex", "initech", "other"):
        mine = [(cause, members) for b, (_, cause, members) in got if b.startswith(destination + "#")]
        assert mine == by_destination(want, destination), destination
    assert [cause for _, (_, cause, _) in got] == ["idle", "timeout", "timeout", "full", "timeout", "idle"]


def test_the_state_variables_are_those_earlier_checkpoints_hold() -> None:
    """idle_timeout needs no state of its own (the members' event times are held): a checkpoint whose open
    batches were timed by max_wait alone loads as it is; its timer, oldest + max_wait, is replaced at the
    next member, or names the deadline that passed first if it fires (tests/spark/test_collect_core.py)."""
    from reassembly.spark.collect.processor import HELD, INFO

    assert HELD == "payload binary, event_ms long"
    assert INFO == "first_ms long, held_bytes long, batch_no long, deadline_ms long"
