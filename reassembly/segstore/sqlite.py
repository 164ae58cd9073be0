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
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={synchronous}")
        conn.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
        super().__init__(conn, **options)

    def _begin(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")
