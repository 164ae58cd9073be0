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
from collections.abc import Callable
from pathlib import Path

from reassembly.assembler.model import Limits
from reassembly.segstore.store import SegmentStore


class SqliteSegmentStore(SegmentStore):
    """A :class:`SegmentStore` in the SQLite database at ``path`` (created with its schema if absent)."""

    def __init__(
        self,
        path: str | Path,
        *,
        member: str,
        lease_seconds: float = 30.0,
        limits: Limits | None = None,
        unit_of_work: bool | None = None,
        busy_timeout: float = 30.0,
        synchronous: str = "FULL",
        clock: Callable[[], float] | None = None,
    ) -> None:
        conn = sqlite3.connect(str(path), timeout=busy_timeout, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={synchronous}")
        conn.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
        kwargs = {} if clock is None else {"clock": clock}
        super().__init__(
            conn, member=member, lease_seconds=lease_seconds, limits=limits, unit_of_work=unit_of_work, **kwargs
        )

    def _begin(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")
