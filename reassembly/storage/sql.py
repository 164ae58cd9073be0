"""The database under the adapters' tables: a SQLite file or a PostgreSQL server, plain SQL, no ORM.

SQLite (standard library) is the embedded default, one file, several processes on one machine;
PostgreSQL (psycopg 3, extra ``[postgres]``) is the shared deployment. A :class:`Database` is
one connection and the two things every table set needs from it: a transaction that is durable
when it returns (:meth:`Database.tx`) and one spelling of the SQL (written with ``?``
placeholders, :meth:`Database.run`). Each table set (the collector's, the claim check's ledger)
takes a :class:`Database` and creates its own tables: two of them may share one database file or
server, each opening its own connection.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from reassembly._sqlite import connect_wal
from segmenter.errors import Reason, SegmentationError

_T = TypeVar("_T")
_ATTEMPTS = 5


class StorageError(SegmentationError):
    """The database refused or failed an operation."""

    default_reason = Reason.STORAGE_ERROR


class Database:
    """One connection; every :meth:`tx` is one transaction, committed durably before it returns."""

    blob = "BLOB"  # the type of a byte column
    placeholder = "?"

    def __init__(self, conn: Any, url: str) -> None:
        self.conn = conn
        self.url = url  # its password hidden: it goes into error messages

    @contextmanager
    def tx(self) -> Iterator[Any]:
        """A cursor inside one transaction: committed when the block ends, rolled back if it raises."""
        raise NotImplementedError
        yield

    def sql(self, text: str) -> str:
        """``text`` (written with ``?``) in this database's placeholders."""
        return text if self.placeholder == "?" else text.replace("?", self.placeholder)

    def run(self, cur: Any, text: str, params: Sequence[Any] = ()) -> Any:
        cur.execute(self.sql(text), params)
        return cur

    def retried(self, work: Callable[[], _T]) -> _T:
        """Run a transaction again when the server chose it as a deadlock victim (transactions that
        lock rows in different orders; the loser simply tries again)."""
        for attempt in range(1, _ATTEMPTS + 1):
            try:
                return work()
            except StorageError as exc:
                if not exc.details.get("retryable") or attempt == _ATTEMPTS:
                    raise
                time.sleep(0.01 * attempt)
        raise AssertionError("unreachable")

    @staticmethod
    def columns(cur: Any, table: str) -> set[str]:
        """The columns ``table`` has (a database made before a column existed lacks it)."""
        cur.execute(f"SELECT * FROM {table} WHERE 1 = 0")
        return {d[0] for d in cur.description}

    def close(self) -> None:
        self.conn.close()


class SQLiteDatabase(Database):
    """SQLite in WAL mode with ``synchronous=FULL``: a commit is on disk when it returns."""

    def __init__(self, path: str) -> None:
        try:  # a file that is not a database fails here, at its first read: our error, not sqlite3's
            conn = connect_wal(path, busy_timeout=60.0)  # processes opening a fresh file together all open it
            conn.execute("PRAGMA wal_autocheckpoint=16384")
            conn.execute("PRAGMA cache_size=-65536")
        except sqlite3.Error as exc:
            raise StorageError(f"SQLite {path}: {exc}", url=path) from exc
        super().__init__(conn, path)

    @contextmanager
    def tx(self) -> Iterator[Any]:
        try:
            cur = self.conn.cursor()
        except sqlite3.Error as exc:
            raise StorageError(f"SQLite {self.url}: {exc}", url=self.url) from exc
        try:
            cur.execute("BEGIN IMMEDIATE")  # take the write lock now: no upgrade deadlock between processes
            yield cur
            cur.execute("COMMIT")
        except sqlite3.Error as exc:
            if self.conn.in_transaction:
                cur.execute("ROLLBACK")
            raise StorageError(f"SQLite {self.url}: {exc}", url=self.url) from exc
        except BaseException:
            if self.conn.in_transaction:
                cur.execute("ROLLBACK")
            raise
        finally:
            cur.close()


class PostgresDatabase(Database):
    """PostgreSQL through psycopg 3; transactions at READ COMMITTED."""

    blob = "BYTEA"
    placeholder = "%s"

    def __init__(self, url: str) -> None:
        try:
            import psycopg
        except ImportError:
            needs = "PostgreSQL needs psycopg 3: pip install 'psycopg[binary]' (the extra postgres)"
            raise StorageError(needs, url=url) from None
        self._psycopg = psycopg
        try:
            conn = psycopg.connect(url, autocommit=True)
        except psycopg.Error as exc:
            raise StorageError(f"cannot connect to {redact(url)}: {one_line(exc)}", url=redact(url)) from None
        super().__init__(conn, redact(url))

    @contextmanager
    def tx(self) -> Iterator[Any]:
        psycopg = self._psycopg
        try:
            with self.conn.transaction(), self.conn.cursor() as cur:
                yield cur
        except psycopg.Error as exc:
            retryable = isinstance(exc, (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure))
            raise StorageError(f"PostgreSQL {self.url}: {one_line(exc)}", url=self.url, retryable=retryable) from exc


def one_line(exc: BaseException) -> str:
    """psycopg's messages span lines (hints, tabs): errors here are one line."""
    return " ".join(str(exc).split())


def redact(url: str) -> str:
    """The URL without its password (it goes into error messages)."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, host = rest.rpartition("@")
    if not sep or not at or ":" not in userinfo:
        return url
    return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{host}"


def is_postgres(url: str) -> bool:
    return url.startswith(("postgresql://", "postgres://"))


def open_database(url: str) -> Database:
    """A SQLite file path (created if missing), or a ``postgresql://`` URL."""
    return PostgresDatabase(url) if is_postgres(url) else SQLiteDatabase(url)
