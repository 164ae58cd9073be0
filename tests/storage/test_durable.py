"""The durable collector on SQLite: crashes at every step, kill -9 of a real process, the command's errors."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from reassembly.collector import Cause, Rule
from reassembly.storage.collector import SQLiteStorage
from reassembly.storage.durable import DurableCollector, batch_path, write_batch
from segmenter.producer import Segmenter
from tests.support.collect_helpers import (
    Clock,
    assert_exactly_once,
    collect_cmd,
    kill_9_then_restart,
    land,
    messages_for,
    put_rules,
    read_batches,
    start,
)


def test_crash_after_claim_or_after_write_is_emitted_once(tmp_path: Path) -> None:
    clock = Clock()
    db = str(tmp_path / "c.db")
    out = tmp_path / "out"
    storage = SQLiteStorage(db)
    put_rules(storage)
    a = DurableCollector(storage, out, owner="A", lease=10, clock=clock)
    sent = messages_for("m", ["acme", "globex", "unknown"], 30)
    ids = storage.store("in-1", sent, clock.now)
    assert ids is not None and storage.acquire("A", clock.now, 10) == {"acme", "globex", "unknown"}
    # A's core closes batches; A "crashes" after claiming the first two, one of them after its file was written.
    ready = [b for i, (d, p) in zip(ids, sent, strict=True) for b in a.core.add(d, i, p)]
    assert len(ready) >= 2
    assert storage.claim(ready[:2], "A", clock.now, 10) == [True, True]
    kept = write_batch(out, ready[1], Segmenter())
    kept_bytes = kept.read_bytes()
    assert storage.store("in-1", sent, clock.now) is None  # re-read input: stored once

    clock.now += 5  # A's lease still runs: B takes nothing
    b = DurableCollector(SQLiteStorage(db), out, owner="B", lease=10, clock=clock)
    b.sync()
    assert b.leased == set() and b.emitted == 0
    clock.now += 6  # expired: B re-emits the claimed batches and takes over the open messages
    b.sync()
    # the two claimed batches again, and globex's 10 open messages as one full batch
    assert b.leased == {"acme", "globex", "unknown"} and b.emitted == 3
    assert kept.read_bytes() == kept_bytes  # the file already in place is kept, not rewritten
    assert batch_path(out, "ftp-acme", ready[0].batch_id).exists()
    clock.now += 200  # held past stranded_after: recycled
    b.tick()
    causes = {c for c in storage.counts()}
    assert causes and b.storage.counts() == {
        "held": 0,
        "closed": b.storage.counts()["closed"],
        "emitted": b.storage.counts()["closed"],
        "dead": 0,
    }
    assert_exactly_once(out, sent)
    # A wakes up (a long pause) and tries to claim with its stale core: refused, nothing emitted twice.
    a.flush()
    assert_exactly_once(out, sent)


def test_recycled_cause_after_restart(tmp_path: Path) -> None:
    clock = Clock()
    storage = SQLiteStorage(str(tmp_path / "c.db"))
    put_rules(storage)
    batches = []
    a = DurableCollector(storage, tmp_path / "out", owner="A", lease=10, clock=clock)
    a.sync()
    a.ingest("in-1", [("acme", b"1"), ("acme", b"2")])
    a.stop()  # a clean stop: leases given back, the two messages stay in the database
    clock.now += 130
    b = DurableCollector(
        storage, tmp_path / "out", owner="B", lease=10, clock=clock, on_batch=lambda bt, p: batches.append(bt)
    )
    b.sync()
    assert [(bt.cause, len(bt.messages)) for bt in batches] == [(Cause.RECYCLED, 2)]


def test_kill_9_mid_filling_then_restart(tmp_path: Path) -> None:
    kill_9_then_restart(tmp_path, str(tmp_path / "c.db"))


def test_command_errors_are_one_line(tmp_path: Path) -> None:
    missing = subprocess.run(
        collect_cmd(tmp_path / "nope", tmp_path / "out", str(tmp_path / "c.db")), capture_output=True, text=True
    )
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "not a directory" in missing.stderr
    (tmp_path / "in").mkdir()
    inside = subprocess.run(
        collect_cmd(tmp_path / "in", tmp_path / "in" / "out", str(tmp_path / "c.db")), capture_output=True, text=True
    )
    assert inside.returncode == 2 and "inside the input" in inside.stderr
    # The rules database is written to: never into the input (directly or through ..), nor the output.
    (tmp_path / "out").mkdir()
    for db, where in (
        (tmp_path / "in" / "c.db", "inside the input"),
        (tmp_path / "out" / ".." / "in" / "deeper" / ".." / "c.db", "inside the input"),
        (tmp_path / "in", "is the input"),
        (tmp_path / "out" / "c.db", "inside the output"),
    ):
        refused_db = subprocess.run(
            collect_cmd(tmp_path / "in", tmp_path / "out", str(db), "--once"), capture_output=True, text=True
        )
        assert refused_db.returncode == 2 and where in refused_db.stderr, (db, refused_db.stderr)
        assert refused_db.stderr.count("\n") == 1
    assert list((tmp_path / "in").iterdir()) == [] and list((tmp_path / "out").iterdir()) == []
    bad_url = "postgresql://nobody:secret@127.0.0.1:1/none"
    refused = subprocess.run(
        collect_cmd(tmp_path / "in", tmp_path / "out", bad_url, "--once"), capture_output=True, text=True
    )
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1 and "secret" not in refused.stderr


def test_unreadable_input_is_reported_not_skipped(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    landing, out, db = tmp_path / "landing", tmp_path / "out", str(tmp_path / "c.db")
    landing.mkdir()
    (landing / "garbage.parquet").write_bytes(b"not parquet at all")
    pq.write_table(pa.table({"destination": [7, None], "payload": ["text", None]}), landing / "odd.parquet")
    run = subprocess.run(collect_cmd(landing, out, db, "--once", "--poll", "0.05s"), capture_output=True, text=True)
    assert run.returncode == 1 and "garbage.parquet" in run.stderr and "1 input file could not be read" in run.stderr
    assert run.stderr.count("cannot read") == 1  # reported once, retried at every poll
    assert sorted(m for ms in read_batches(out).values() for m in ms) == [b"", b"text"]  # "7" and "" (default)
    assert (landing / "garbage.parquet").exists()


def test_ctrl_c_is_a_clean_stop(tmp_path: Path) -> None:
    landing, out, db = tmp_path / "landing", tmp_path / "out", str(tmp_path / "c.db")
    landing.mkdir()
    land(landing, "a.parquet", messages_for("x", ["acme"], 3))
    proc = start(collect_cmd(landing, out, db, "--poll", "0.05s"))
    storage = SQLiteStorage(db)
    while storage.counts()["held"] < 3:  # stored (acknowledged), batch not full yet
        assert proc.poll() is None
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err.strip() == "reassemble: interrupted"
    assert storage.counts()["held"] == 3  # the open batch stays in the database for the next run
    assert storage.acquire("next", 0.0, 10) == {"acme"}  # and its lease was given back


def test_a_file_replaced_under_a_collected_name_is_reported_once(tmp_path: Path) -> None:
    """The input key is the file's name: a new file renamed over a stored one is not collected (the
    same messages landed again would be collected twice), but reported once, never ignored without a
    word (its messages never collected)."""
    import time

    landing, out, db = tmp_path / "landing", tmp_path / "out", str(tmp_path / "c.db")
    landing.mkdir()
    land(landing, "a.parquet", messages_for("x", ["acme"], 3))
    errors = tmp_path / "stderr.txt"
    with errors.open("w") as err_file:
        proc = subprocess.Popen(collect_cmd(landing, out, db, "--poll", "0.05s"), stdout=subprocess.PIPE,
                                stderr=err_file, text=True)  # fmt: skip
        storage = SQLiteStorage(db)
        deadline = time.monotonic() + 60
        while storage.counts()["held"] < 3:
            assert proc.poll() is None and time.monotonic() < deadline
        land(landing, "a.parquet", messages_for("y", ["acme"], 2))  # other content, same name
        while "changed after it was collected" not in errors.read_text():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.3)  # several more polls: still one line
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    text = errors.read_text()
    assert proc.returncode == 130 and text.count("a.parquet changed after it was collected") == 1, text
    assert storage.counts()["held"] == 3  # the replacement was not stored


@pytest.mark.spark
def test_batches_reassemble_in_the_spark_job(spark: Any, tmp_path: Path) -> None:
    """What `reassemble run` does with a target directory: every batch one complete group, members in order."""
    from reassembly.spark import reassemble

    storage = SQLiteStorage(str(tmp_path / "c.db"))
    storage.put_rule(Rule("acme", "ftp-acme", max_messages=5))
    c = DurableCollector(storage, tmp_path / "out", segmenter=Segmenter(max_segment_size=120))
    c.sync()
    sent = [("acme", bytes([i]) * (i * 7)) for i in range(12)]  # some members span several segments
    c.ingest("in", sent)
    c.flush()
    groups = reassemble(spark.read.parquet(str(tmp_path / "out" / "ftp-acme"))).groups.collect()
    assert all(g.complete for g in groups)
    got = sorted([bytes(m.payload) for m in g.messages] for g in groups)
    assert got == sorted([p for _, p in sent[i : i + 5]] for i in range(0, 12, 5))
