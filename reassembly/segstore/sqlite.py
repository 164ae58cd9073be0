"""The segment store in one SQLite file: for members that are processes on one host.

WAL journal (readers never wait for the writer), ``BEGIN IMMEDIATE`` for every write
transaction (the write lock is taken first, so two members never deadlock upgrading a read), a
busy timeout (a member waits for another's transaction instead of failing), and
``synchronous=FULL``: a commit is on disk when :meth:`~reassembly.segstore.store.SegmentStore.write`
returns, which is what makes acknowledging the records then safe. Processes on several hosts need
:mod:`reassembly.segstore.postgres` (SQLite's locking is not meant for network file systems).
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import TYPE_CHECKING

from reassembly.segstore.records import StoreOptions
from reassembly.segstore.store import SegmentStore

if TYPE_CHECKING:
    from typing_extensions import Unpack


class SqliteSegmentStore(SegmentStore):
    """A :class:`SegmentStore` in the SQLite database at ``path`` (created with its schema if absent)."""

    def __init__(
        self,
        path: str | Path,
        *,
        busy_timeout: float = 30.0,
        synchronous: str = "FULL",
        **options: Unpack[StoreOptions],
    ) -> None:
        conn = sqlite3.connect(str(path), timeout=busy_timeout, isolation_level=None, check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
        _journal_wal(conn, busy_timeout)
        conn.execute(f"PRAGMA synchronous={synchronous}")
        super().__init__(conn, **options)

    def _begin(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")


def _journal_wal(conn: sqlite3.Connection, busy_timeout: float) -> None:
    """Put the file in WAL mode, waiting up to ``busy_timeout`` for the other members.

    Switching a new file's journal mode needs it alone, and SQLite answers "database is locked"
    at once instead of calling the busy handler while another connection holds it: members
    started together on a fresh file would fail there. So the switch is retried with a short
    back-off until the busy timeout, as a write would wait. The mode is stored in the file, so
    once one member has switched it the others read "wal" and take no lock for it.
    """
    deadline = time.monotonic() + busy_timeout
    pause = 0.002
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
