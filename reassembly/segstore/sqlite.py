"""The segment store in one SQLite file: for members that are processes on one host.

Opened as :func:`reassembly._sqlite.connect_wal` opens a shared file (WAL journal, a busy timeout,
members started together on a fresh file all open it), ``BEGIN IMMEDIATE`` for every write
transaction (the write lock is taken first, so two members never deadlock upgrading a read), and
``synchronous=FULL``: a commit is on disk when :meth:`~reassembly.segstore.store.SegmentStore.write`
returns, which is what makes acknowledging the records then safe. Processes on several hosts need
:mod:`reassembly.segstore.postgres` (SQLite's locking is not meant for network file systems).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from reassembly._sqlite import connect_wal
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
        super().__init__(connect_wal(str(path), busy_timeout, synchronous), **options)

    def _begin(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")

