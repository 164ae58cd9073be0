"""The ledger's own table: opening a ledger makes no collector table and the collector makes no
ledger table; a database holding both table sets, as the collector's ``Storage`` wrote them when
it created the ledger's table among its own (``data/collector-with-ledger.sqlite``), opens as it
is on SQLite and on a real PostgreSQL server, its ledger rows found and its collector rows intact."""

from __future__ import annotations

import shutil
import sqlite3
from datetime import datetime, timedelta, timezone
from pathlib import Path

from reassembly.claimcheck import Ledger, LedgerEntry, Recorded, Settled
from reassembly.collector import Rule
from reassembly.storage.collector import PostgresStorage, SQLiteStorage, Storage
from reassembly.storage.ledger import LedgerTable, open_ledger_table
from reassembly.storage.sql import SQLiteDatabase
from tests.support.pg_server import fresh_database, load_sqlite, pg_url

__all__ = ["pg_url"]  # the module-scoped server fixture

# Made by the collector's Storage and the Ledger over it: a rule for "acme", input "in-1" with two
# held messages, and four ledger rows (live, settled, swept, settled but never recorded).
BOTH = Path(__file__).parent / "data" / "collector-with-ledger.sqlite"
T0 = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)
ROWS = {
    "payloads": [
        LedgerEntry("payloads", "orders/live", "order-1", T0, None, None),
        LedgerEntry("payloads", "orders/settled", "order-2", T0, T0 + timedelta(minutes=1), None),
        LedgerEntry("payloads", "orders/swept", "order-3", T0, T0 + timedelta(minutes=1), T0 + timedelta(hours=1)),
    ],
    "other": [LedgerEntry("other", "never-recorded", None, None, T0, None)],
}


def _tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as conn:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def test_each_table_set_creates_only_its_own_tables(tmp_path: Path) -> None:
    open_ledger_table(str(tmp_path / "ledger.db")).close()
    assert _tables(tmp_path / "ledger.db") == {"claim_ledger"}
    SQLiteStorage(str(tmp_path / "rules.db")).close()
    assert "claim_ledger" not in _tables(tmp_path / "rules.db")
    assert {"destination_rules", "collect_messages", "collect_batches"} <= _tables(tmp_path / "rules.db")


def test_a_ledger_and_a_collector_share_one_database_file(tmp_path: Path) -> None:
    path = str(tmp_path / "shared.db")
    storage, ledger = SQLiteStorage(path), Ledger.open(path)
    try:
        storage.put_rule(Rule("d", "t"))
        assert ledger.record("s", "k", "m", T0) is Recorded.NEW
        assert storage.store("in", [("d", b"x")], 1.0) == [1]
        assert ledger.entries("s") == [LedgerEntry("s", "k", "m", T0, None, None)]
        assert "d" in storage.read_rules() and storage.counts()["held"] == 1
    finally:
        storage.close()
        ledger.close()
    assert {"claim_ledger", "destination_rules"} <= _tables(tmp_path / "shared.db")


def _check_both(ledger: Ledger, storage: Storage) -> None:
    """The fixture's rows, read through the ledger and the collector; then both still write."""
    assert ledger.stores() == {"other": 1, "payloads": 3}
    assert {store: ledger.entries(store) for store in ROWS} == ROWS
    assert storage.read_rules()["acme"] == Rule("acme", "ftp-acme", max_messages=3)
    assert storage.stored_inputs() == {"in-1"} and storage.counts()["held"] == 2
    assert ledger.settle("payloads", "orders/live", T0 + timedelta(minutes=2)) is Settled.SETTLED
    assert ledger.record("payloads", "orders/swept", "order-4", T0 + timedelta(minutes=3)) is Recorded.REOPENED
    assert ledger.settle("other", "never-recorded", T0) is Settled.ALREADY
    assert [e.live for e in ledger.entries("payloads")] == [False, False, True]


def test_a_database_holding_both_table_sets_opens_as_it_is_on_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "both.db"
    shutil.copy(BOTH, path)
    before = _tables(path)
    with Ledger.open(str(path)) as ledger:
        storage = SQLiteStorage(str(path))
        try:
            _check_both(ledger, storage)
        finally:
            storage.close()
    assert _tables(path) == before  # nothing added, nothing dropped
    with Ledger(LedgerTable(SQLiteDatabase(str(path)))) as reopened:  # the rows written above stay
        assert reopened.entry("payloads", "orders/swept") == LedgerEntry(
            "payloads", "orders/swept", "order-4", T0 + timedelta(minutes=3), None, None
        )


def test_a_database_holding_both_table_sets_opens_as_it_is_on_postgres(pg_url: str) -> None:
    url = fresh_database(pg_url, "both")
    load_sqlite(url, BOTH)
    storage = PostgresStorage(url)
    try:
        with Ledger.open(url) as ledger:
            _check_both(ledger, storage)
    finally:
        storage.close()
