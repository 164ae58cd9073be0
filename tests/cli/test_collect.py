"""``reassemble collect`` as a real process: the dead letter reported and listed, a quiet batch
closed, a batch forced out by ``--flush`` from another process."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pyarrow.parquet as pq

from reassembly.collector import Rule
from reassembly.storage.collector import SQLiteStorage
from tests.support.collect_helpers import collect_cmd, land, read_batches, start
from tests.support.command import reassemble


def test_poison_batch_reported_listed_and_the_rest_written(tmp_path: Path) -> None:
    landing, out, db = tmp_path / "landing", tmp_path / "out", str(tmp_path / "c.db")
    landing.mkdir()
    storage = SQLiteStorage(db)
    storage.put_rule(Rule("poison", "blocked", max_messages=2, max_attempts=2))
    storage.put_rule(Rule("fine", "ftp-fine", max_messages=2))
    storage.close()
    out.mkdir()
    (out / "blocked").write_text("not a directory")  # every write of poison's batches fails
    land(landing, "a.parquet", [("poison", b"p1"), ("fine", b"f1"), ("poison", b"p2"), ("fine", b"f2")])
    run = reassemble("collect", str(landing), str(out), "--rules", db, "--once", "--lease", "0.3s", "--poll", "0.05s")
    assert run.returncode == 1, run.stderr
    lines = run.stderr.splitlines()
    attempts = [x for x in lines if "not written, attempt 1 of 2" in x]
    dead = [x for x in lines if "dead after 2 attempts" in x]
    assert len(attempts) == 1 and len(dead) == 1 and "FileExistsError" in dead[0], run.stderr
    assert "1 batch went to the dead letter after the last attempt" in lines[-1] and len(lines) == 3, run.stderr
    assert "'fine' 2 messages" in run.stdout  # the other destination was not held up
    assert sorted(m for ms in read_batches(out).values() for m in ms) == [b"f1", b"f2"]
    (dead_file,) = (tmp_path / "out.dead-letter" / "blocked").glob("*.parquet")
    assert str(dead_file) in dead[0]
    assert pq.read_table(dead_file).column("payload").to_pylist() == [b"p1", b"p2"]

    listed = reassemble("collect", "--rules", db, "--list-dead")
    assert listed.returncode == 0 and listed.stderr == "", listed.stderr
    (line, total) = listed.stdout.splitlines()
    assert line.startswith("dead 20") and "'poison' 2 messages dead after 2 attempts" in line and str(dead_file) in line
    assert total == f"collect: 1 dead batch in {db}"

    # Land the dead letter again once the cause is fixed: a new input name, collected as usual.
    (out / "blocked").unlink()
    dead_file.rename(landing / "replay-1.parquet")
    again = reassemble("collect", str(landing), str(out), "--rules", db, "--once", "--poll", "0.05s")
    assert again.returncode == 0, again.stderr
    assert sorted(m for ms in read_batches(out).values() for m in ms) == [b"f1", b"f2", b"p1", b"p2"]


def test_usage_errors_of_the_new_forms(tmp_path: Path) -> None:
    no_output = reassemble("collect", str(tmp_path), "--rules", str(tmp_path / "c.db"))
    assert no_output.returncode == 2 and "needs INPUT and OUTPUT" in no_output.stderr
    assert no_output.stderr.count("\n") == 1
    missing = reassemble("collect", "--rules", str(tmp_path / "none.db"), "--list-dead")
    assert missing.returncode == 2 and "no such database" in missing.stderr and not (tmp_path / "none.db").exists()
    (tmp_path / "in").mkdir()
    inside = reassemble(
        "collect", str(tmp_path / "in"), str(tmp_path / "x"), "--rules", str(tmp_path / "x.dead-letter")
    )
    assert inside.returncode == 2 and "dead-letter directory" in inside.stderr, inside.stderr
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database, " * 256)
    wrong = reassemble("collect", str(tmp_path / "in"), str(tmp_path / "y"), "--rules", str(garbage))
    assert wrong.returncode == 1 and wrong.stderr.count("\n") == 1, wrong.stderr
    assert "STORAGE_ERROR" in wrong.stderr and "file is not a database" in wrong.stderr
    assert not (tmp_path / "y").exists() and garbage.read_bytes() == b"not a database, " * 256


def test_idle_timeout_closes_a_quiet_batch_in_a_running_collector(tmp_path: Path) -> None:
    landing, out, db = tmp_path / "landing", tmp_path / "out", str(tmp_path / "c.db")
    landing.mkdir()
    storage = SQLiteStorage(db)
    storage.put_rule(Rule("acme", "ftp-acme", max_messages=100, max_wait=3600, idle_timeout=0.5))
    assert storage.read_rules()["acme"].idle_timeout == 0.5  # stored and read back
    proc = start(collect_cmd(landing, out, db, "--poll", "0.05s"))
    try:
        assert proc.stdout is not None
        land(landing, "a.parquet", [("acme", b"1"), ("acme", b"2")])
        line = proc.stdout.readline()  # half a second after the file's messages: one idle batch, not an hour
        assert "'acme' 2 messages idle ->" in line, line
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert sorted(m for ms in read_batches(out).values() for m in ms) == [b"1", b"2"]


def test_flush_dest_against_a_running_collector(tmp_path: Path) -> None:
    landing, out, db = tmp_path / "landing", tmp_path / "out", str(tmp_path / "c.db")
    landing.mkdir()
    storage = SQLiteStorage(db)
    storage.put_rule(Rule("acme", "ftp-acme", max_messages=100, max_wait=3600))
    proc = start(collect_cmd(landing, out, db, "--poll", "0.05s"))
    try:
        assert proc.stdout is not None
        land(landing, "a.parquet", [("acme", b"1"), ("acme", b"2"), ("acme", b"3"), ("globex", b"g")])
        deadline = time.monotonic() + 60
        while storage.counts()["held"] < 4:  # stored, held in the open batches (an hour's max_wait)
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        asked = reassemble("collect", "--rules", db, "--flush", "acme", "--flush", "initech")
        assert asked.returncode == 0 and asked.stderr == "", asked.stderr
        assert asked.stdout.splitlines() == [
            "flush 'acme': requested for 3 messages; the collector holding it closes the batch",
            "flush 'initech': no message held, nothing requested",
        ]
        line = proc.stdout.readline()
        assert "'acme' 3 messages forced ->" in line, line
        assert storage.counts()["held"] == 1  # globex's batch stays open
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert sorted(m for ms in read_batches(out).values() for m in ms) == [b"1", b"2", b"3"]
    both = reassemble("collect", str(landing), str(out), "--rules", db, "--flush", "acme")
    assert both.returncode == 2 and "take no INPUT or OUTPUT" in both.stderr
    exclusive = reassemble("collect", "--rules", db, "--flush", "acme", "--list-dead")
    assert exclusive.returncode == 2 and "not allowed with" in exclusive.stderr
