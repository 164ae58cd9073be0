"""The claim check's reference ledger in SQLite or PostgreSQL: its table and its SQL.

:class:`reassembly.claimcheck.Ledger` gives these rows their meaning (record, settle, sweep);
here they are kept. One table, created if missing when the ledger is opened::

  claim_ledger  store, object_key (the primary key together), message_id, stored_at, settled_at,
                deleted_at (seconds since the epoch, NULL: not yet)

The table is the ledger's alone: opening a ledger creates no other table, and the collector's
tables (:mod:`reassembly.storage.collector`) do not include it. A ledger may share the
collector's database (a file or server holding both table sets); a database that holds the
collector's tables and a ``claim_ledger`` table already opens as it is, its rows found where
they are (``tests/storage/test_ledger.py`` opens such a database).
"""

from __future__ import annotations

from typing import Any

from reassembly.storage.sql import Database, open_database

_SCHEMA = """
CREATE TABLE IF NOT EXISTS claim_ledger (
  store TEXT NOT NULL, object_key TEXT NOT NULL, message_id TEXT, stored_at DOUBLE PRECISION,
  settled_at DOUBLE PRECISION, deleted_at DOUBLE PRECISION, PRIMARY KEY (store, object_key))
"""


class LedgerTable:
    """The ledger's rows. Every method is one transaction (committed durably before it returns);
    each answers what it found as one word, which :class:`reassembly.claimcheck.Ledger` turns into
    its enums."""

    def __init__(self, db: Database) -> None:
        self._db = db
        with db.tx() as cur:
            cur.execute(_SCHEMA)

    @property
    def url(self) -> str:
        """The database, its password hidden."""
        return self._db.url

    def record(self, store: str, key: str, message_id: str | None, at: float) -> str:
        """Record that ``key`` in ``store`` holds a payload: what the row was, as one word.

        ``"new"`` (no row: inserted, live), ``"live"`` (the same message's live row: left as it
        was, so recording again is harmless), ``"replaced"`` (another message's live row: it
        names this message now, still live), ``"reopened"`` (a settled or deleted row the
        consumer of an earlier payload under this key closed: live again, so a new payload under
        a reused key is never swept on the old settlement), ``"late"`` (a row the consumer
        settled before any record: the record fills in the time and message, the row stays settled).
        """
        db = self._db
        with db.tx() as cur:
            row = db.run(
                cur,
                "SELECT message_id, stored_at, settled_at, deleted_at FROM claim_ledger "
                "WHERE store = ? AND object_key = ?",
                (store, key),
            ).fetchone()
            if row is not None and row[1] is None:
                db.run(
                    cur,
                    "UPDATE claim_ledger SET message_id = ?, stored_at = ? WHERE store = ? AND object_key = ?",
                    (message_id, at, store, key),
                )
                return "late"
            live = row is not None and row[2] is None and row[3] is None
            if live and row[0] == message_id:
                return "live"
            db.run(
                cur,
                "INSERT INTO claim_ledger (store, object_key, message_id, stored_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (store, object_key) DO UPDATE SET message_id = excluded.message_id, "
                "stored_at = excluded.stored_at, settled_at = NULL, deleted_at = NULL",
                (store, key, message_id, at),
            )
        return "new" if row is None else "replaced" if live else "reopened"

    def settle(self, store: str, key: str, at: float) -> str:
        """The consumer is done with ``key`` (its commit is durable): ``"settled"``, ``"already"``
        (settled before: unchanged), or ``"unknown"`` (no record: a settled row without a stored
        time is inserted, so the settlement is kept and shows as never recorded)."""
        db = self._db
        with db.tx() as cur:
            done = db.run(
                cur,
                "UPDATE claim_ledger SET settled_at = ? WHERE store = ? AND object_key = ? AND settled_at IS NULL",
                (at, store, key),
            )
            if done.rowcount == 1:
                return "settled"
            made = db.run(
                cur,
                "INSERT INTO claim_ledger (store, object_key, settled_at) VALUES (?, ?, ?) "
                "ON CONFLICT (store, object_key) DO NOTHING",
                (store, key, at),
            ).rowcount
        return "unknown" if made == 1 else "already"

    def mark_deleted(self, store: str, key: str, at: float) -> bool:
        """The settled object under ``key`` is gone from the store: mark its row (only a settled,
        unmarked row; a row recorded again meanwhile stays live). True if a row was marked."""
        db = self._db
        with db.tx() as cur:
            done = db.run(
                cur,
                "UPDATE claim_ledger SET deleted_at = ? "
                "WHERE store = ? AND object_key = ? AND settled_at IS NOT NULL AND deleted_at IS NULL",
                (at, store, key),
            ).rowcount
        return bool(done == 1)

    def rows(self, store: str, key: str | None = None) -> list[tuple[Any, ...]]:
        """The store's rows (or the one of ``key``) by key: (store, key, message_id, stored_at,
        settled_at, deleted_at), times in seconds since the epoch or None."""
        where, params = ("store = ?", (store,)) if key is None else ("store = ? AND object_key = ?", (store, key))
        db = self._db
        with db.tx() as cur:
            rows = db.run(
                cur,
                "SELECT store, object_key, message_id, stored_at, settled_at, deleted_at FROM claim_ledger "
                f"WHERE {where} ORDER BY object_key",
                params,
            ).fetchall()
        return [tuple(r) for r in rows]

    def stores(self) -> dict[str, int]:
        """Every store name the ledger has rows for, with how many."""
        db = self._db
        with db.tx() as cur:
            rows = db.run(cur, "SELECT store, count(*) FROM claim_ledger GROUP BY store ORDER BY store").fetchall()
        return {r[0]: int(r[1]) for r in rows}

    def close(self) -> None:
        self._db.close()


def open_ledger_table(url: str) -> LedgerTable:
    """The ledger in a SQLite file (created if missing) or at a ``postgresql://`` URL; a file that is
    not a SQLite database, or a server that refuses, raises :class:`~reassembly.storage.sql.StorageError`."""
    db = open_database(url)
    try:
        return LedgerTable(db)
    except BaseException:
        db.close()
        raise
