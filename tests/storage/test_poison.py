"""Poison batches: attempts counted in the database, the dead letter after ``max_attempts``, the other
destinations never blocked; and a database made by the schema before these columns, migrated on open."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reassembly.collector import Rule
from reassembly.storage.collector import DeadBatch, SQLiteStorage
from reassembly.storage.durable import DurableCollector, dead_letter_dir
from tests.support.collect_helpers import Clock, assert_exactly_once, read_batches

OLD_DATABASE = Path(__file__).parent / "data" / "collector-schema-1.sqlite"


def _block(out: Path, target: str) -> None:
    """A regular file where the target's directory belongs: every write of its batches fails (also as root)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / target).write_text("not a directory")


def _dead_letter_messages(path: str) -> list[bytes]:
    return [bytes(p) for p in pq.read_table(path).column("payload").to_pylist()]


def test_poison_batch_goes_to_the_dead_letter_after_max_attempts(tmp_path: Path) -> None:
    clock = Clock()
    out = tmp_path / "out"
    storage = SQLiteStorage(str(tmp_path / "c.db"))
    storage.put_rule(Rule("poison", "blocked", max_messages=2, max_attempts=3))
    storage.put_rule(Rule("fine", "ftp-fine", max_messages=2))
    _block(out, "blocked")
    dead: list[DeadBatch] = []
    c = DurableCollector(storage, out, owner="A", lease=9, clock=clock, on_dead=dead.append)
    c.sync()
    c.ingest("in-1", [("poison", b"p1"), ("fine", b"f1"), ("poison", b"p2"), ("fine", b"f2")])
    c.settle()
    (failing,) = storage.dead_batches(failing=True)
    assert failing.attempts == 1 and failing.dead_at is None and "FileExistsError" in failing.reason
    assert c.emitted == 1 and storage.counts()["emitted"] == 1  # the other destination is not held up
    clock.now += 3  # the next lease renewal: attempt 2
    c.tick()
    assert [b.attempts for b in storage.dead_batches(failing=True)] == [2] and dead == []
    c.ingest("in-2", [("fine", b"f3"), ("fine", b"f4")])  # still flowing while the poison batch is retried
    assert c.emitted == 2
    clock.now += 3
    c.tick()  # attempt 3, the last: dead
    assert storage.dead_batches(failing=True) == []
    (row,) = storage.dead_batches()
    assert dead == [row] and row.attempts == 3 and row.messages == 2 and row.destination == "poison"
    assert row.dead_at == clock.now and "FileExistsError" in row.reason
    assert row.path is not None and Path(row.path).parent == dead_letter_dir(out) / "blocked"
    assert _dead_letter_messages(row.path) == [b"p1", b"p2"]
    assert storage.members(row.batch_id) == []  # the dead-letter file holds them now
    assert storage.counts() == {"held": 0, "closed": 3, "emitted": 2, "dead": 1}
    clock.now += 3
    c.tick()  # never tried again
    assert storage.dead_batches()[0].attempts == 3 and storage.acquire("B", clock.now + 100, 9) == set()
    assert sorted(m for ms in read_batches(out).values() for m in ms) == [b"f1", b"f2", b"f3", b"f4"]


def test_attempts_survive_a_restart_and_the_rule_in_force_counts(tmp_path: Path) -> None:
    clock = Clock()
    out, db = tmp_path / "out", str(tmp_path / "c.db")
    storage = SQLiteStorage(db)
    storage.put_rule(Rule("poison", "blocked", max_messages=1, max_attempts=5))
    _block(out, "blocked")
    a = DurableCollector(storage, out, owner="A", lease=9, clock=clock)
    a.sync()
    a.ingest("in-1", [("poison", b"p")])
    a.stop()  # attempt 1 failed; the claimed batch stays in the database
    assert storage.dead_batches(failing=True)[0].attempts == 1
    storage.put_rule(Rule("poison", "blocked", max_messages=1, max_attempts=2))  # lowered in the database
    b = DurableCollector(SQLiteStorage(db), out, owner="B", lease=9, clock=clock, rules_ttl=0)
    b.sync()  # B re-emits A's claimed batch: attempt 2 of 2
    (row,) = storage.dead_batches()
    assert row.attempts == 2 and b.dead == [row] and storage.dead_batches(failing=True) == []


def test_dead_letter_not_writable_keeps_the_messages_in_the_row(tmp_path: Path) -> None:
    clock = Clock()
    out = tmp_path / "out"
    storage = SQLiteStorage(str(tmp_path / "c.db"))
    storage.put_rule(Rule("poison", "blocked", max_messages=1, max_attempts=1))
    _block(out, "blocked")
    _block(dead_letter_dir(out), "blocked")
    c = DurableCollector(storage, out, owner="A", lease=9, clock=clock)
    c.sync()
    c.ingest("in-1", [("poison", b"kept")])
    (row,) = storage.dead_batches()
    assert row.path is None and "dead-letter file not written" in row.reason
    assert [m.payload for m in storage.members(row.batch_id)] == [b"kept"]  # nothing lost


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    poison=st.sets(st.sampled_from("abcde"), min_size=1, max_size=3),
    fine=st.sets(st.sampled_from("vwxyz"), min_size=1, max_size=3),
    max_attempts=st.integers(1, 4),
    sizes=st.lists(st.integers(1, 4), min_size=1, max_size=4),
    messages=st.integers(1, 30),
)
def test_property_poison_dead_after_exactly_max_attempts_others_all_emitted(
    poison: set[str], fine: set[str], max_attempts: int, sizes: list[int], messages: int
) -> None:
    destinations = sorted(poison | fine)
    sent = [(destinations[i % len(destinations)], f"m{i}".encode()) for i in range(messages)]
    with tempfile.TemporaryDirectory() as tmp:
        out, clock = Path(tmp) / "out", Clock()
        storage = SQLiteStorage(str(Path(tmp) / "c.db"))
        for i, d in enumerate(destinations):
            storage.put_rule(Rule(d, f"t-{d}", max_messages=sizes[i % len(sizes)], max_attempts=max_attempts))
            if d in poison:
                _block(out, f"t-{d}")
        c = DurableCollector(storage, out, owner="A", lease=9, clock=clock)
        c.sync()
        for start in range(0, len(sent), 7):
            c.ingest(f"in-{start}", sent[start : start + 7])
        c.flush()
        for _ in range(max_attempts + 1):
            for row in storage.dead_batches(failing=True):  # never more than max_attempts before it is dead
                assert row.attempts < max_attempts
            clock.now += 3
            c.tick()
        dead = storage.dead_batches()
        assert storage.dead_batches(failing=True) == [] and all(r.attempts == max_attempts for r in dead)
        assert {r.destination for r in dead} == poison & {d for d, _ in sent}
        buried = sorted(m for r in dead if r.path for m in _dead_letter_messages(r.path))
        assert buried == sorted(p for d, p in sent if d in poison)
        emitted = [(d, p) for d, p in sent if d in fine]
        if emitted:
            assert_exactly_once(out, emitted)
        counts = storage.counts()
        assert counts["held"] == 0 and counts["closed"] == counts["emitted"] + counts["dead"]
        storage.close()


def test_a_database_of_the_first_schema_is_migrated_on_open(tmp_path: Path) -> None:
    """The fixture was made by the collector before attempts, the dead letter and the newer rule
    columns: two rules, two held messages of an input, one batch emitted, one claimed and not emitted."""
    db = tmp_path / "old.sqlite"
    shutil.copy(OLD_DATABASE, db)
    storage = SQLiteStorage(str(db))
    rules = storage.read_rules()
    assert rules["acme"] == Rule("acme", "ftp-acme", max_messages=3, max_wait=60, stranded_after=120)
    assert storage.invalid_rules == [] and storage.counts() == {"held": 2, "closed": 2, "emitted": 1, "dead": 0}
    assert storage.stored_inputs() == {"in-1", "in-2"}
    storage.close()
    clock = Clock(1_000_500.0)
    c = DurableCollector(SQLiteStorage(str(db)), tmp_path / "out", owner="new", lease=9, clock=clock)
    c.sync()  # the claimed batch emitted again, the held messages recycled (stranded)
    c.flush()
    batches = read_batches(tmp_path / "out")
    assert sorted(sorted(ms) for ms in batches.values()) == [[b"a4"], [b"a5", b"a6", b"a7"], [b"g1"]]
    reopened = SQLiteStorage(str(db))  # a second open finds nothing to add
    assert reopened.counts() == {"held": 0, "closed": 4, "emitted": 4, "dead": 0}
    reopened.put_rule(Rule("acme", "ftp-acme", max_attempts=2, idle_timeout=1.5))
    assert reopened.read_rules()["acme"] == Rule("acme", "ftp-acme", max_attempts=2, idle_timeout=1.5)
    assert reopened.store("in-3", [("acme", b"a8")], clock.now) is not None
    assert reopened.request_flush("acme") == 1 and reopened.flush_requests() != {}  # the table made on open
