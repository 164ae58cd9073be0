"""A SQLite file several processes share: processes that open a fresh file together all open it.

Switching a fresh file to WAL while another connection holds its write lock fails at once with
"database is locked" (SQLite does not call the busy handler there), which is what processes started
together hit. A connection holding the write lock stands in for the other process. Both SQLite
adapters open their file this way: the segment store's and the collector's and ledger's database.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import reassembly._sqlite
from reassembly.segstore import open_store
from reassembly.storage.sql import SQLiteDatabase, StorageError


def _segment_store(path: Path) -> Any:
    store = open_store(f"sqlite://{path}", member="m1")
    assert store.stats().units == 0
    return store


def _database(path: Path) -> Any:
    db = SQLiteDatabase(str(path))
    with db.tx() as cur:
        cur.execute("CREATE TABLE t (x INTEGER)")
    return db


OPENERS: dict[str, Callable[[Path], Any]] = {"segment store": _segment_store, "database": _database}


@pytest.fixture
def held(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    """A fresh file whose write lock another connection holds (released by the test or at the end)."""
    other = sqlite3.connect(tmp_path / "shared.db", isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    yield other
    if other.in_transaction:
        other.execute("ROLLBACK")
    other.close()


@pytest.mark.parametrize("opener", OPENERS.values(), ids=OPENERS.keys())
def test_the_wal_switch_waits_for_another_process_instead_of_failing(
    opener: Callable[[Path], Any], held: sqlite3.Connection, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first attempt meets the held lock; the other process commits during the back-off; the next
    attempt switches the file and it opens, in WAL mode."""
    pauses: list[float] = []

    def pause(seconds: float) -> None:
        pauses.append(seconds)
        if held.in_transaction:
            held.execute("COMMIT")

    monkeypatch.setattr(reassembly._sqlite.time, "sleep", pause)
    opener(tmp_path / "shared.db").close()
    assert len(pauses) == 1
    assert sqlite3.connect(tmp_path / "shared.db").execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_a_lock_held_past_the_busy_timeout_is_still_an_error(held: sqlite3.Connection, tmp_path: Path) -> None:
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        reassembly._sqlite.connect_wal(str(tmp_path / "shared.db"), busy_timeout=0.1)


def test_the_database_names_the_file_it_could_not_open(tmp_path: Path) -> None:
    """Not a database: the storage error (our type), naming the file."""
    (tmp_path / "shared.db").write_bytes(b"not a database" * 100)
    with pytest.raises(StorageError, match=r"shared\.db"):
        SQLiteDatabase(str(tmp_path / "shared.db"))
