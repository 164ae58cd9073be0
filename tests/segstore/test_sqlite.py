"""The SQLite store's start: members that open a fresh file together all open it.

Switching a fresh file to WAL while another connection holds its write lock fails at once with
"database is locked" (SQLite does not call the busy handler there), which is what members started
together hit. A connection holding the write lock stands in for the other member.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

import reassembly.segstore.sqlite as sqlite_store
from reassembly.segstore import open_store


@pytest.fixture
def held(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    """A fresh file whose write lock another connection holds (released by the test or at the end)."""
    other = sqlite3.connect(tmp_path / "segments.db", isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    yield other
    if other.in_transaction:
        other.execute("ROLLBACK")
    other.close()


def test_the_wal_switch_waits_for_another_member_instead_of_failing(
    held: sqlite3.Connection, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first attempt meets the held lock; the other member commits during the back-off; the
    next attempt switches the file and the store opens, in WAL mode."""
    pauses: list[float] = []

    def pause(seconds: float) -> None:
        pauses.append(seconds)
        if held.in_transaction:
            held.execute("COMMIT")

    monkeypatch.setattr(sqlite_store.time, "sleep", pause)
    with open_store(f"sqlite://{tmp_path / 'segments.db'}", member="m1") as store:
        assert store.stats().units == 0
    assert len(pauses) == 1
    assert sqlite3.connect(tmp_path / "segments.db").execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_a_lock_held_past_the_busy_timeout_is_still_an_error(held: sqlite3.Connection, tmp_path: Path) -> None:
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        sqlite_store.SqliteSegmentStore(tmp_path / "segments.db", member="m1", busy_timeout=0.1)
