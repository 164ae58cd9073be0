"""Opening a SQLite file that several processes share: the one way both SQLite adapters open one.

WAL journal (readers never wait for the writer), the busy timeout (a process waits for another's
transaction instead of failing) and ``synchronous`` (``FULL``: a commit is on disk when it returns).
Switching a new file to WAL needs the file alone, and SQLite answers "database is locked" at once
there, without calling the busy handler, while another connection holds it: processes started
together on a fresh file would fail on their first line. So the switch is retried with a short
back-off until the busy timeout, as any write waits. The mode is stored in the file: once one
process has switched it, the others find it switched and take no lock for it.
"""

from __future__ import annotations

import sqlite3
import time


def connect_wal(path: str, busy_timeout: float, synchronous: str = "FULL") -> sqlite3.Connection:
    """A connection to ``path`` in WAL mode, autocommit (transactions are the caller's ``BEGIN``),
    usable from any thread; ``sqlite3.OperationalError`` if another process held the file for
    longer than ``busy_timeout`` seconds."""
    conn = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None, check_same_thread=False)
    try:
        conn.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
        deadline = time.monotonic() + busy_timeout
        pause = 0.002
        while True:
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() >= deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
        conn.execute(f"PRAGMA synchronous={synchronous}")
    except BaseException:
        conn.close()
        raise
    return conn
