"""The collector against a real PostgreSQL server: two collectors sharing it, rules changed mid-run."""

from __future__ import annotations

from pathlib import Path

from reassembly.collector import Cause, Rule
from reassembly.storage.collector import PostgresStorage
from reassembly.storage.durable import DurableCollector
from tests.storage.test_poison import OLD_DATABASE
from tests.support.collect_helpers import (
    Clock,
    assert_exactly_once,
    collect_cmd,
    kill_9_then_restart,
    land,
    messages_for,
    read_batches,
    start,
)
from tests.support.pg_server import fresh_database, load_sqlite, pg_url

__all__ = ["pg_url"]  # the module-scoped server fixture


def test_two_collectors_never_emit_the_same_message(pg_url: str, tmp_path: Path) -> None:
    url = fresh_database(pg_url, "two")
    storage = PostgresStorage(url)
    for name, size in (("acme", 7), ("globex", 13), ("initech", 5), ("umbrella", 50)):
        storage.put_rule(Rule(name, f"t-{name}", max_messages=size, max_wait=0.5, stranded_after=60))
    storage.close()
    out = tmp_path / "out"
    sent = []
    # Two input channels, one database, one output: some destinations only one channel carries,
    # some both, so each collector leases its own and contends for the shared ones.
    channels = {"A": ["acme", "globex", "unknown-1", "shared"], "B": ["initech", "umbrella", "unknown-2", "shared"]}
    for who, destinations in channels.items():
        (tmp_path / who).mkdir()
        for i in range(8):
            rows = messages_for(f"{who}{i}", destinations, 75)
            land(tmp_path / who, f"part-{i:03d}.parquet", rows)
            sent += rows
    args = ("--lease", "2s", "--poll", "0.05s", "--rules-ttl", "1s", "--once")
    both = [start(collect_cmd(tmp_path / who, out, url, *args, "--owner", who)) for who in channels]
    for proc in both:
        _, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
    assert_exactly_once(out, sent)
    import psycopg

    with psycopg.connect(url) as conn:
        owners = dict(conn.execute("SELECT closed_by, count(*) FROM collect_batches GROUP BY closed_by").fetchall())
        stored_by_both = conn.execute("SELECT count(*) FROM collect_inputs").fetchone()
    # Both stored their inputs in the one database. Which of them closes a destination's batches is
    # whoever leases it first (on an idle machine one collector sometimes wins them all): the claim
    # here is exactly once, not a share of the work.
    assert stored_by_both == (16,) and owners and set(owners) <= {"A", "B"}
    check = PostgresStorage(url)
    counts = check.counts()
    assert counts["held"] == 0 and counts["closed"] == counts["emitted"] == len(list(out.rglob("*.parquet")))
    check.close()


def test_kill_9_mid_filling_then_restart(pg_url: str, tmp_path: Path) -> None:
    kill_9_then_restart(tmp_path, fresh_database(pg_url, "kill"))


def test_rule_change_applies_within_the_cache_time(pg_url: str, tmp_path: Path) -> None:
    url = fresh_database(pg_url, "rules")
    clock = Clock()
    storage = PostgresStorage(url)
    storage.put_rule(Rule("acme", "ftp-acme", max_messages=1000, max_wait=3600, stranded_after=7200))
    sizes: list[tuple[int, Cause]] = []
    c = DurableCollector(
        storage,
        tmp_path / "out",
        lease=60,
        rules_ttl=5.0,
        clock=clock,
        on_batch=lambda b, p: sizes.append((len(b.messages), b.cause)),
    )
    c.sync()
    c.ingest("in-0", [("acme", b"%d" % i) for i in range(10)])
    c.sync()
    assert sizes == []
    PostgresStorage(url).put_rule(Rule("acme", "ftp-acme", max_messages=4, max_wait=3600, stranded_after=7200))
    clock.now += 4.9  # still inside the cache time: the old rule
    c.ingest("in-1", [("acme", b"x")])
    c.tick()
    assert sizes == []
    clock.now += 0.1  # cache time over: the new rule, applied to the open batch too
    c.tick()
    assert sizes == [(4, Cause.FULL), (4, Cause.FULL)] and len(c.core.held_ids("acme")) == 3
    c.ingest("in-2", [("acme", b"y"), ("acme", b"z")])
    assert sizes[2:] == [(4, Cause.FULL)] and len(c.core.held_ids("acme")) == 1
    PostgresStorage(url).put_rule(Rule("acme", "ftp-acme", max_messages=4, max_wait=2, stranded_after=7200))
    clock.now += 5
    c.tick()
    assert sizes[-1] == (1, Cause.TIMEOUT)


def test_rules_mid_run_in_a_real_process(pg_url: str, tmp_path: Path) -> None:
    """The same through the command: a running collector picks up a lowered max_messages."""
    url = fresh_database(pg_url, "live")
    storage = PostgresStorage(url)
    storage.put_rule(Rule("acme", "ftp-acme", max_messages=1000, max_wait=3600))
    landing, out = tmp_path / "landing", tmp_path / "out"
    landing.mkdir()
    land(landing, "a.parquet", messages_for("a", ["acme"], 30))
    proc = start(collect_cmd(landing, out, url, "--poll", "0.05s", "--rules-ttl", "0.5s"))
    try:
        while storage.counts()["held"] < 30:
            assert proc.poll() is None
        storage.put_rule(Rule("acme", "ftp-acme", max_messages=10, max_wait=3600))
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(3)]
        assert all(" 10 messages full " in line for line in lines), lines
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
    assert proc.returncode == 130
    storage.close()


def test_a_database_of_the_first_schema_is_migrated_on_open(pg_url: str, tmp_path: Path) -> None:
    """The first schema's tables (the SQLite fixture's own statements, with PostgreSQL's types) and rows
    as that collector wrote them: opening adds the columns; rules, held messages and batches carry on."""
    import psycopg

    url = fresh_database(pg_url, "schema1")
    load_sqlite(url, OLD_DATABASE)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE SEQUENCE collect_ids START 100")
    storage = PostgresStorage(url)
    assert storage.read_rules()["acme"] == Rule("acme", "ftp-acme", max_messages=3, max_wait=60, stranded_after=120)
    assert storage.counts() == {"held": 2, "closed": 2, "emitted": 1, "dead": 0}
    c = DurableCollector(storage, tmp_path / "out", owner="new", lease=9, clock=Clock(1_000_500.0))
    c.sync()
    c.flush()
    batches = read_batches(tmp_path / "out")
    assert sorted(sorted(ms) for ms in batches.values()) == [[b"a4"], [b"a5", b"a6", b"a7"], [b"g1"]]
    assert PostgresStorage(url).counts() == {"held": 0, "closed": 4, "emitted": 4, "dead": 0}


def test_poison_batch_dead_letter_on_postgres(pg_url: str, tmp_path: Path) -> None:
    url = fresh_database(pg_url, "poison")
    clock, out = Clock(), tmp_path / "out"
    storage = PostgresStorage(url)
    storage.put_rule(Rule("poison", "blocked", max_messages=1, max_attempts=2))
    out.mkdir()
    (out / "blocked").write_text("not a directory")
    c = DurableCollector(storage, out, owner="A", lease=9, clock=clock)
    c.sync()
    c.ingest("in-1", [("poison", b"p"), ("fine", b"f")])
    c.flush()
    assert [r.attempts for r in storage.dead_batches(failing=True)] == [1] and c.emitted == 1
    clock.now += 3
    c.tick()
    (row,) = storage.dead_batches()
    assert row.attempts == 2 and row.path is not None and Path(row.path).exists() and "FileExistsError" in row.reason
    assert storage.counts() == {"held": 0, "closed": 2, "emitted": 1, "dead": 1}


def test_flush_request_on_postgres(pg_url: str, tmp_path: Path) -> None:
    url = fresh_database(pg_url, "flush")
    clock = Clock()
    causes: list[Cause] = []
    c = DurableCollector(PostgresStorage(url), tmp_path / "out", owner="A", lease=9, clock=clock,
                         on_batch=lambda b, p: causes.append(b.cause))  # fmt: skip
    c.sync()
    c.ingest("in-1", [("acme", b"1"), ("acme", b"2")])
    requester = PostgresStorage(url)
    assert requester.request_flush("acme") == 2 and requester.request_flush("none") == 0
    assert requester.flush_requests() == {"acme": min(c.core.held_ids("acme")) + 1}
    c.tick()
    assert causes == [Cause.FORCED] and requester.flush_requests() == {}
