"""Where the collector keeps its rules, the messages it holds and its leases: SQLite or PostgreSQL.

One small interface (:class:`Storage`), plain SQL, no ORM. SQLite (standard library) is the
embedded default, one file, several processes on one machine; PostgreSQL (psycopg 3, extra
``[postgres]``) is the shared deployment. The SQL is written once with ``?`` placeholders; the
two dialects differ only in types, id allocation and the bulk statements (:class:`_Dialect`).

Tables (created if missing):
  destination_rules  destination, target, max_messages, max_bytes, max_wait, stranded_after, enabled,
                     max_attempts (NULL: the default), idle_timeout (NULL: none)
  collect_inputs     one row per input file stored, written in the transaction that stores its rows
  collect_messages   messages stored and in no batch yet: id, destination, payload, received_at
  collect_batches    closed batches: batch_id, destination, target, cause, count, closed_at/by, emitted_at,
                     members (the batch's messages, packed, until the batch file is in place),
                     attempts and last_error (failed writes), dead_at and dead_path (the dead letter)
  collect_leases     destination, owner, expires_at: who may close that destination's batches
  collect_flush_requests  destination, upto_id, requested_at: close the batch holding the destination's
                     messages up to that id now (see :meth:`Storage.request_flush`)
  claim_ledger       store, object_key, message_id, stored_at, settled_at, deleted_at: the claim check's
                     reference ledger, one row per offloaded object (``reassembly.claimcheck``); a ledger
                     may share the collector's database or have its own

A database made before a column existed gets it when it is opened (``ALTER TABLE ... ADD
COLUMN``, in the opening transaction): existing rows read as the column's default.

Why leases per destination and not ``SELECT ... FOR UPDATE SKIP LOCKED`` over messages: a
batch is a destination's messages in arrival order up to ``max_messages``; SKIP LOCKED would
let two collectors take interleaved slices of one destination and close small, reordered
batches. A lease gives a destination one filler at a time; the claim that closes a batch
re-checks the lease and moves the member rows out of ``collect_messages`` into the batch row
(a delete whose row count must equal the batch size) in one transaction, so even a collector
that resumes after its lease expired (a long pause) cannot put a message into a second batch:
its claim fails and it drops that batch.
"""

from __future__ import annotations

import json
import sqlite3
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from reassembly.collector.core import DEFAULT_DESTINATION, DEFAULT_RULE, BatchReady, Held, Rule
from segmenter.errors import Reason, SegmentationError

_T = TypeVar("_T")
_ATTEMPTS = 5


class StorageError(SegmentationError):
    """The collection database refused or failed an operation."""

    default_reason = Reason.STORAGE_ERROR


class BatchRecord(NamedTuple):
    """A closed batch as the database knows it (re-emitted from here after a crash)."""

    batch_id: str
    destination: str
    target: str
    cause: str


class DeadBatch(NamedTuple):
    """A batch whose writes failed: dead (``dead_at`` set, moved to ``path``) or still being retried."""

    batch_id: str
    destination: str
    target: str
    messages: int
    attempts: int
    reason: str  # the last failure, one line
    dead_at: float | None  # None: not dead yet, tried again
    path: str | None  # the dead-letter file (None: not dead, or the file could not be written)


@dataclass(frozen=True)
class _Dialect:
    blob: str
    placeholder: str
    insert_messages: str  # rows (id, destination, payload, received_at)
    take: str  # (the member ids as one parameter): deletes the rows still there


_RULE_COLUMNS = (
    "destination, target, max_messages, max_bytes, max_wait, stranded_after, enabled, max_attempts, idle_timeout"
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS destination_rules (
  destination TEXT PRIMARY KEY, target TEXT NOT NULL, max_messages INTEGER NOT NULL, max_bytes BIGINT NOT NULL,
  max_wait DOUBLE PRECISION NOT NULL, stranded_after DOUBLE PRECISION NOT NULL, enabled BOOLEAN NOT NULL DEFAULT TRUE,
  max_attempts BIGINT, idle_timeout DOUBLE PRECISION);
CREATE TABLE IF NOT EXISTS collect_inputs (
  name TEXT PRIMARY KEY, messages INTEGER NOT NULL, stored_at DOUBLE PRECISION NOT NULL);
CREATE TABLE IF NOT EXISTS collect_messages (
  id BIGINT PRIMARY KEY, destination TEXT NOT NULL, payload {blob} NOT NULL, received_at DOUBLE PRECISION NOT NULL);
CREATE INDEX IF NOT EXISTS collect_messages_destination ON collect_messages (destination, id);
CREATE TABLE IF NOT EXISTS collect_batches (
  batch_id TEXT PRIMARY KEY, destination TEXT NOT NULL, target TEXT NOT NULL, cause TEXT NOT NULL,
  messages INTEGER NOT NULL, closed_at DOUBLE PRECISION NOT NULL, closed_by TEXT NOT NULL,
  emitted_at DOUBLE PRECISION, members {blob}, attempts INTEGER NOT NULL DEFAULT 0, last_error TEXT,
  dead_at DOUBLE PRECISION, dead_path TEXT);
CREATE TABLE IF NOT EXISTS collect_leases (
  destination TEXT PRIMARY KEY, owner TEXT NOT NULL, expires_at DOUBLE PRECISION NOT NULL);
CREATE TABLE IF NOT EXISTS collect_flush_requests (
  destination TEXT PRIMARY KEY, upto_id BIGINT NOT NULL, requested_at DOUBLE PRECISION NOT NULL);
CREATE TABLE IF NOT EXISTS claim_ledger (
  store TEXT NOT NULL, object_key TEXT NOT NULL, message_id TEXT, stored_at DOUBLE PRECISION,
  settled_at DOUBLE PRECISION, deleted_at DOUBLE PRECISION, PRIMARY KEY (store, object_key));
"""

# Columns added after their table was first released: (table, column, its definition). A database
# made without them gets them when it is opened.
_ADDED_COLUMNS = (
    ("destination_rules", "max_attempts", "BIGINT"),
    ("destination_rules", "idle_timeout", "DOUBLE PRECISION"),
    ("collect_batches", "attempts", "INTEGER NOT NULL DEFAULT 0"),
    ("collect_batches", "last_error", "TEXT"),
    ("collect_batches", "dead_at", "DOUBLE PRECISION"),
    ("collect_batches", "dead_path", "TEXT"),
)

_SQLITE = _Dialect(
    blob="BLOB",
    placeholder="?",
    insert_messages="INSERT INTO collect_messages (id, destination, payload, received_at) VALUES (?, ?, ?, ?)",
    take="DELETE FROM collect_messages WHERE id IN (SELECT value FROM json_each(?))",
)
_POSTGRES = _Dialect(
    blob="BYTEA",
    placeholder="%s",
    insert_messages=(
        "INSERT INTO collect_messages (id, destination, payload, received_at) "
        "SELECT * FROM unnest(?::bigint[], ?::text[], ?::bytea[], ?::float8[])"
    ),
    take="DELETE FROM collect_messages WHERE id = ANY(?::bigint[])",
)


class Storage:
    """The collector's database. Every method is one transaction (committed durably before it returns).

    Per message: its row, inserted with the rest of its input in one transaction (the
    acknowledgement), deleted when its batch is claimed. Per batch: its row, inserted by the
    claim and updated by the mark; the claims of the batches closed together share one commit,
    and the marks ride on the next claim's commit.
    """

    def __init__(self, conn: Any, dialect: _Dialect, url: str) -> None:
        self._conn = conn
        self._d = dialect
        self.url = url
        self.invalid_rules: list[SegmentationError] = []
        with self._tx() as cur:
            for statement in _SCHEMA.format(blob=dialect.blob).split(";"):
                if statement.strip():
                    cur.execute(statement)
            self._migrate(cur)
            self._setup(cur)

    def _migrate(self, cur: Any) -> None:
        """Add the columns a database made before them lacks (the transaction that opens it, so two
        collectors opening one old database do not both add them)."""
        for table, column, definition in _ADDED_COLUMNS:
            cur.execute(f"SELECT * FROM {table} WHERE 1 = 0")
            if column not in {d[0] for d in cur.description}:
                cur.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")

    # --- dialect hooks ------------------------------------------------------------------------
    def _setup(self, cur: Any) -> None:
        """Anything the id allocation needs."""

    def _allocate(self, cur: Any, n: int) -> list[int]:
        raise NotImplementedError

    def _insert(self, cur: Any, rows: list[tuple[int, str, bytes, float]]) -> None:
        raise NotImplementedError

    def _id_list(self, ids: list[int]) -> Any:
        """The member ids as one statement parameter (one UPDATE per batch, not one per member)."""
        return ids

    @contextmanager
    def _tx(self) -> Iterator[Any]:
        raise NotImplementedError
        yield

    def _sql(self, text: str) -> str:
        return text if self._d.placeholder == "?" else text.replace("?", self._d.placeholder)

    def _run(self, cur: Any, text: str, params: Sequence[Any] = ()) -> Any:
        cur.execute(self._sql(text), params)
        return cur

    # --- rules --------------------------------------------------------------------------------
    def read_rules(self) -> dict[str, Rule]:
        """Every valid row; a row with impossible limits is left out (its destination gets the default
        rule) and kept in ``invalid_rules``: a typo in the table must not stop a running collector."""
        with self._tx() as cur:
            rows = self._run(cur, f"SELECT {_RULE_COLUMNS} FROM destination_rules").fetchall()
        rules, self.invalid_rules = {}, []
        for r in rows:
            try:
                attempts = DEFAULT_RULE.max_attempts if r[7] is None else r[7]
                idle = None if r[8] is None else float(r[8])
                rules[r[0]] = Rule(r[0], r[1], r[2], r[3], float(r[4]), float(r[5]), _enabled(r[6]), attempts, idle)
            except SegmentationError as exc:
                self.invalid_rules.append(exc)
            except (TypeError, ValueError, OverflowError) as exc:  # text where a number belongs: the row, not the run
                self.invalid_rules.append(
                    SegmentationError(f"rule for {r[0]!r}: {exc}", reason=Reason.RULE_ERROR, destination=str(r[0]))
                )
        return rules

    def put_rule(self, rule: Rule) -> None:
        """Insert or replace one rule (the collectors pick it up within their cache time)."""
        with self._tx() as cur:
            self._run(
                cur,
                f"INSERT INTO destination_rules ({_RULE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (destination) DO UPDATE SET target = excluded.target, "
                "max_messages = excluded.max_messages, max_bytes = excluded.max_bytes, "
                "max_wait = excluded.max_wait, stranded_after = excluded.stranded_after, enabled = excluded.enabled, "
                "max_attempts = excluded.max_attempts, idle_timeout = excluded.idle_timeout",
                (
                    rule.destination,
                    rule.target,
                    rule.max_messages,
                    rule.max_bytes,
                    rule.max_wait,
                    rule.stranded_after,
                    rule.enabled,
                    rule.max_attempts,
                    rule.idle_timeout,
                ),
            )

    # --- messages -----------------------------------------------------------------------------
    def store(self, name: str, messages: Sequence[tuple[str, bytes]], now: float) -> list[int] | None:
        """Store one input's messages in one transaction; their ids, or None if ``name`` was stored before.

        The input's name is written in the same transaction, so an input read twice (a restart
        after a crash, two collectors on one landing directory) is stored once.
        """
        with self._tx() as cur:
            done = self._run(
                cur,
                "INSERT INTO collect_inputs (name, messages, stored_at) VALUES (?, ?, ?) ON CONFLICT (name) DO NOTHING",
                (name, len(messages), now),
            )
            if done.rowcount != 1:
                return None
            ids = self._allocate(cur, len(messages))
            self._insert(cur, [(i, d, p, now) for i, (d, p) in zip(ids, messages, strict=True)])
        return ids

    def stored_inputs(self) -> set[str]:
        with self._tx() as cur:
            return {r[0] for r in self._run(cur, "SELECT name FROM collect_inputs").fetchall()}

    def open_messages(self, destination: str, known: set[int]) -> list[Held]:
        """The destination's messages in no batch and not in ``known`` (held already), oldest first.

        Ids first, payloads only for the ones not known: a collector re-syncing a destination
        it is filling reads only what others stored since.
        """
        with self._tx() as cur:
            rows = self._run(
                cur,
                "SELECT id FROM collect_messages WHERE destination = ? ORDER BY id",
                (destination,),
            ).fetchall()
            wanted = [int(r[0]) for r in rows if int(r[0]) not in known]
            out = []
            for start in range(0, len(wanted), 500):
                chunk = wanted[start : start + 500]
                marks = ", ".join("?" * len(chunk))
                found = self._run(
                    cur,
                    f"SELECT id, payload, received_at FROM collect_messages WHERE id IN ({marks})",
                    chunk,
                ).fetchall()
                out += [Held(int(r[0]), bytes(r[1]), float(r[2])) for r in found]
        return sorted(out)

    # --- leases -------------------------------------------------------------------------------
    def _retried(self, work: Callable[[], _T]) -> _T:
        """Run a transaction again when the server chose it as a deadlock victim (collectors renewing
        and taking leases lock lease rows in different orders; the loser simply tries again)."""
        for attempt in range(1, _ATTEMPTS + 1):
            try:
                return work()
            except StorageError as exc:
                if not exc.details.get("retryable") or attempt == _ATTEMPTS:
                    raise
                time.sleep(0.01 * attempt)
        raise AssertionError("unreachable")

    def acquire(self, owner: str, now: float, lease: float) -> set[str]:
        """Renew this owner's leases, take free or expired ones that have work; the destinations held."""
        return self._retried(lambda: self._acquire(owner, now, lease))

    def _acquire(self, owner: str, now: float, lease: float) -> set[str]:
        expires = now + lease
        with self._tx() as cur:
            self._run(
                cur,
                "UPDATE collect_leases SET expires_at = ? WHERE owner = ? AND expires_at >= ?",
                (expires, owner, now),
            )
            self._run(
                cur,
                "INSERT INTO collect_leases (destination, owner, expires_at) "
                "SELECT destination, ?, ? FROM ("
                "  SELECT destination FROM collect_messages"
                "  UNION SELECT destination FROM collect_batches WHERE emitted_at IS NULL AND dead_at IS NULL) AS work "
                "WHERE true ORDER BY destination "
                "ON CONFLICT (destination) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at "
                "WHERE collect_leases.expires_at < ?",
                (owner, expires, now),
            )
            rows = self._run(
                cur, "SELECT destination FROM collect_leases WHERE owner = ? AND expires_at >= ?", (owner, now)
            ).fetchall()
        return {r[0] for r in rows}

    def release(self, owner: str) -> None:
        """Give up every lease (a clean stop): another collector may take over at once."""
        with self._tx() as cur:
            self._run(cur, "DELETE FROM collect_leases WHERE owner = ?", (owner,))

    # --- batches ------------------------------------------------------------------------------
    def claim(
        self, batches: Sequence[BatchReady], owner: str, now: float, lease: float, emitted: Sequence[str] = ()
    ) -> list[bool]:
        """Move each closed batch's messages into its batch row, if ``owner`` still holds its lease.

        One transaction for all (one commit per call, not per batch); each batch all or nothing
        (a savepoint): a member already taken by another batch (its row is gone) or a lost lease
        undoes that batch only. Moving instead of marking costs one row write per message, not
        two. ``emitted`` batches (files in place since the last call) are marked in the same commit.
        """
        return self._retried(lambda: self._claim(batches, owner, now, lease, emitted))

    def _claim(
        self, batches: Sequence[BatchReady], owner: str, now: float, lease: float, emitted: Sequence[str]
    ) -> list[bool]:
        done = []
        with self._tx() as cur:
            self._mark(cur, emitted, now)
            for batch in batches:
                self._run(cur, "SAVEPOINT claim")
                if self._claim_one(cur, batch, owner, now, lease):
                    done.append(True)
                else:
                    self._run(cur, "ROLLBACK TO SAVEPOINT claim")
                    done.append(False)
                self._run(cur, "RELEASE SAVEPOINT claim")
        return done

    def _claim_one(self, cur: Any, batch: BatchReady, owner: str, now: float, lease: float) -> bool:
        ids = [m.id for m in batch.messages]
        held = self._run(
            cur,
            "UPDATE collect_leases SET expires_at = ? WHERE destination = ? AND owner = ? AND expires_at >= ?",
            (now + lease, batch.destination, owner, now),
        )
        if held.rowcount != 1 or self._run(cur, self._d.take, (self._id_list(ids),)).rowcount != len(ids):
            return False
        self._run(
            cur,
            "INSERT INTO collect_batches (batch_id, destination, target, cause, messages, closed_at, "
            "closed_by, members) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                batch.batch_id,
                batch.destination,
                batch.rule.target,
                batch.cause.value,
                len(ids),
                now,
                owner,
                _pack(batch.messages),
            ),
        )
        return True

    def unemitted(self, destinations: set[str]) -> list[BatchRecord]:
        """Closed batches of these destinations whose files may not exist yet (to emit again)."""
        with self._tx() as cur:
            rows = self._run(
                cur,
                "SELECT batch_id, destination, target, cause FROM collect_batches "
                "WHERE emitted_at IS NULL AND dead_at IS NULL ORDER BY closed_at",
            ).fetchall()
        return [BatchRecord(*r) for r in rows if r[1] in destinations]

    def members(self, batch_id: str) -> list[Held]:
        """A claimed, unemitted batch's messages, in their batch order."""
        with self._tx() as cur:
            row = self._run(cur, "SELECT members FROM collect_batches WHERE batch_id = ?", (batch_id,)).fetchone()
        return _unpack(bytes(row[0])) if row and row[0] is not None else []

    def mark_emitted(self, batch_ids: Sequence[str], now: float) -> None:
        """The batch files are in place (and their directories synced): drop the packed members."""
        with self._tx() as cur:
            self._mark(cur, batch_ids, now)

    def _mark(self, cur: Any, batch_ids: Sequence[str], now: float) -> None:
        for batch_id in batch_ids:
            self._run(
                cur, "UPDATE collect_batches SET emitted_at = ?, members = NULL WHERE batch_id = ?", (now, batch_id)
            )

    def record_failure(self, batch_id: str, reason: str) -> int:
        """One failed write of a claimed batch: its attempt count, now (kept across restarts)."""
        with self._tx() as cur:
            row = self._run(
                cur,
                "UPDATE collect_batches SET attempts = attempts + 1, last_error = ? WHERE batch_id = ? "
                "RETURNING attempts",
                (reason, batch_id),
            ).fetchone()
        return int(row[0]) if row else 0

    def mark_dead(self, batch_id: str, reason: str, path: str | None, now: float) -> None:
        """The batch's last attempt failed: it is dead, its messages in the dead-letter file ``path``
        (then the packed members are dropped) or, if that could not be written either, kept in the row."""
        with self._tx() as cur:
            self._run(
                cur,
                "UPDATE collect_batches SET dead_at = ?, dead_path = ?, last_error = ?, "
                "members = CASE WHEN ? THEN NULL ELSE members END WHERE batch_id = ?",
                (now, path, reason, path is not None, batch_id),
            )

    def dead_batches(self, *, failing: bool = False) -> list[DeadBatch]:
        """The dead batches, oldest first; with ``failing``, the batches still retried after a failed write."""
        state = "dead_at IS NULL AND emitted_at IS NULL AND attempts > 0" if failing else "dead_at IS NOT NULL"
        with self._tx() as cur:
            rows = self._run(
                cur,
                "SELECT batch_id, destination, target, messages, attempts, last_error, dead_at, dead_path "
                f"FROM collect_batches WHERE {state} ORDER BY coalesce(dead_at, closed_at), batch_id",
            ).fetchall()
        return [
            DeadBatch(r[0], r[1], r[2], int(r[3]), int(r[4]), r[5] or "", None if r[6] is None else float(r[6]), r[7])
            for r in rows
        ]

    # --- flush requests -------------------------------------------------------------------------
    def request_flush(self, destination: str, now: float | None = None) -> int:
        """Ask whichever collector holds ``destination`` to close its batch now (at its next poll).

        The request covers the destination's messages stored so far (up to the newest id, not a
        time: collectors' clocks may differ): the lease holder loads any of them it does not hold
        yet and closes its open batch as ``forced``; messages stored later are batched as usual.
        Returns how many messages it covers; 0 (and no request) if none is held. A request is
        gone once none of the messages it covers is left unbatched.
        """
        with self._tx() as cur:
            n, upto = self._run(
                cur, "SELECT count(*), max(id) FROM collect_messages WHERE destination = ?", (destination,)
            ).fetchone()
            if not n:
                return 0
            self._run(
                cur,
                "INSERT INTO collect_flush_requests (destination, upto_id, requested_at) VALUES (?, ?, ?) "
                "ON CONFLICT (destination) DO UPDATE SET upto_id = excluded.upto_id, "
                "requested_at = excluded.requested_at",
                (destination, int(upto), time.time() if now is None else now),
            )
        return int(n)

    def flush_requests(self) -> dict[str, int]:
        """The pending requests (destination: the newest message id covered), after dropping the
        ones none of whose messages is left unbatched."""
        with self._tx() as cur:
            self._run(
                cur,
                "DELETE FROM collect_flush_requests WHERE NOT EXISTS (SELECT 1 FROM collect_messages AS m "
                "WHERE m.destination = collect_flush_requests.destination AND m.id <= collect_flush_requests.upto_id)",
            )
            rows = self._run(cur, "SELECT destination, upto_id FROM collect_flush_requests").fetchall()
        return {r[0]: int(r[1]) for r in rows}

    # --- the claim check's reference ledger (reassembly.claimcheck.Ledger wraps these) ----------
    def ledger_record(self, store: str, key: str, message_id: str | None, at: float) -> str:
        """Record that ``key`` in ``store`` holds a payload: what the row was, as one word.

        ``"new"`` (no row: inserted, live), ``"live"`` (the same message's live row: left as it
        was, so recording again is harmless), ``"replaced"`` (another message's live row: it
        names this message now, still live), ``"reopened"`` (a settled or deleted row the
        consumer of an earlier payload under this key closed: live again, so a new payload under
        a reused key is never swept on the old settlement), ``"late"`` (a row the consumer
        settled before any record: the record fills in the time and message, the row stays settled).
        """
        with self._tx() as cur:
            row = self._run(
                cur,
                "SELECT message_id, stored_at, settled_at, deleted_at FROM claim_ledger "
                "WHERE store = ? AND object_key = ?",
                (store, key),
            ).fetchone()
            if row is not None and row[1] is None:
                self._run(
                    cur,
                    "UPDATE claim_ledger SET message_id = ?, stored_at = ? WHERE store = ? AND object_key = ?",
                    (message_id, at, store, key),
                )
                return "late"
            live = row is not None and row[2] is None and row[3] is None
            if live and row[0] == message_id:
                return "live"
            self._run(
                cur,
                "INSERT INTO claim_ledger (store, object_key, message_id, stored_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (store, object_key) DO UPDATE SET message_id = excluded.message_id, "
                "stored_at = excluded.stored_at, settled_at = NULL, deleted_at = NULL",
                (store, key, message_id, at),
            )
        return "new" if row is None else "replaced" if live else "reopened"

    def ledger_settle(self, store: str, key: str, at: float) -> str:
        """The consumer is done with ``key`` (its commit is durable): ``"settled"``, ``"already"``
        (settled before: unchanged), or ``"unknown"`` (no record: a settled row without a stored
        time is inserted, so the settlement is kept and shows as never recorded)."""
        with self._tx() as cur:
            done = self._run(
                cur,
                "UPDATE claim_ledger SET settled_at = ? WHERE store = ? AND object_key = ? AND settled_at IS NULL",
                (at, store, key),
            )
            if done.rowcount == 1:
                return "settled"
            made = self._run(
                cur,
                "INSERT INTO claim_ledger (store, object_key, settled_at) VALUES (?, ?, ?) "
                "ON CONFLICT (store, object_key) DO NOTHING",
                (store, key, at),
            ).rowcount
        return "unknown" if made == 1 else "already"

    def ledger_mark_deleted(self, store: str, key: str, at: float) -> bool:
        """The settled object under ``key`` is gone from the store: mark its row (only a settled,
        unmarked row; a row recorded again meanwhile stays live). True if a row was marked."""
        with self._tx() as cur:
            done = self._run(
                cur,
                "UPDATE claim_ledger SET deleted_at = ? "
                "WHERE store = ? AND object_key = ? AND settled_at IS NOT NULL AND deleted_at IS NULL",
                (at, store, key),
            ).rowcount
        return bool(done == 1)

    def ledger_rows(self, store: str, key: str | None = None) -> list[tuple[Any, ...]]:
        """The store's rows (or the one of ``key``) by key: (store, key, message_id, stored_at,
        settled_at, deleted_at), times in seconds since the epoch or None."""
        where, params = ("store = ?", (store,)) if key is None else ("store = ? AND object_key = ?", (store, key))
        with self._tx() as cur:
            rows = self._run(
                cur,
                "SELECT store, object_key, message_id, stored_at, settled_at, deleted_at FROM claim_ledger "
                f"WHERE {where} ORDER BY object_key",
                params,
            ).fetchall()
        return [tuple(r) for r in rows]

    def ledger_stores(self) -> dict[str, int]:
        """Every store name the ledger has rows for, with how many."""
        with self._tx() as cur:
            rows = self._run(cur, "SELECT store, count(*) FROM claim_ledger GROUP BY store ORDER BY store").fetchall()
        return {r[0]: int(r[1]) for r in rows}

    def counts(self) -> dict[str, int]:
        """Messages held, batches closed, emitted and dead (for status lines and tests)."""
        with self._tx() as cur:
            held = self._run(cur, "SELECT count(*) FROM collect_messages").fetchone()[0]
            closed, emitted, dead = self._run(
                cur, "SELECT count(*), count(emitted_at), count(dead_at) FROM collect_batches"
            ).fetchone()
        return {"held": int(held), "closed": int(closed), "emitted": int(emitted), "dead": int(dead)}

    def close(self) -> None:
        self._conn.close()


_MEMBER = struct.Struct(">qdI")  # id, received_at, payload length; then the payload


def _pack(messages: Sequence[Held]) -> bytes:
    return b"".join(_MEMBER.pack(m.id, m.received_at, len(m.payload)) + m.payload for m in messages)


def _unpack(blob: bytes) -> list[Held]:
    out, at = [], 0
    while at < len(blob):
        msg_id, received_at, n = _MEMBER.unpack_from(blob, at)
        at += _MEMBER.size
        out.append(Held(msg_id, blob[at : at + n], received_at))
        at += n
    return out


def _enabled(value: object) -> bool:
    """A stored ``enabled``: a boolean, or SQLite's 0 / 1; anything else (the text 'false') is a bad row."""
    if value in (0, 1) and not isinstance(value, (str, float)):
        return bool(value)
    raise ValueError(f"enabled must be true or false, not {value!r}")


class SQLiteStorage(Storage):
    """SQLite in WAL mode with ``synchronous=FULL``: a commit is on disk when it returns."""

    def __init__(self, path: str) -> None:
        try:  # a file that is not a database fails here, at its first read: our error, not sqlite3's
            conn = sqlite3.connect(path, isolation_level=None, timeout=60.0, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA wal_autocheckpoint=16384")
            conn.execute("PRAGMA cache_size=-65536")
        except sqlite3.Error as exc:
            raise StorageError(f"SQLite {path}: {exc}", url=path) from exc
        super().__init__(conn, _SQLITE, path)

    def _setup(self, cur: Any) -> None:
        cur.execute("CREATE TABLE IF NOT EXISTS collect_ids (next INTEGER NOT NULL)")
        cur.execute("INSERT INTO collect_ids SELECT 1 WHERE NOT EXISTS (SELECT 1 FROM collect_ids)")

    def _allocate(self, cur: Any, n: int) -> list[int]:
        end = cur.execute("UPDATE collect_ids SET next = next + ? RETURNING next", (n,)).fetchone()[0]
        return list(range(end - n, end))

    def _insert(self, cur: Any, rows: list[tuple[int, str, bytes, float]]) -> None:
        cur.executemany(self._d.insert_messages, rows)

    def _id_list(self, ids: list[int]) -> Any:
        return json.dumps(ids)

    @contextmanager
    def _tx(self) -> Iterator[Any]:
        cur = self._conn.cursor()
        try:
            cur.execute("BEGIN IMMEDIATE")  # take the write lock now: no upgrade deadlock between processes
            yield cur
            cur.execute("COMMIT")
        except sqlite3.Error as exc:
            if self._conn.in_transaction:
                cur.execute("ROLLBACK")
            raise StorageError(f"SQLite {self.url}: {exc}", url=self.url) from exc
        except BaseException:
            if self._conn.in_transaction:
                cur.execute("ROLLBACK")
            raise
        finally:
            cur.close()


class PostgresStorage(Storage):
    """PostgreSQL through psycopg 3; transactions at READ COMMITTED, ids from a sequence."""

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
            raise StorageError(f"cannot connect to {_redact(url)}: {_one_line(exc)}", url=_redact(url)) from None
        super().__init__(conn, _POSTGRES, _redact(url))

    def _setup(self, cur: Any) -> None:
        cur.execute("CREATE SEQUENCE IF NOT EXISTS collect_ids")

    def _allocate(self, cur: Any, n: int) -> list[int]:
        cur.execute("SELECT nextval('collect_ids') FROM generate_series(1, %s)", (n,))
        return [int(r[0]) for r in cur.fetchall()]

    def _insert(self, cur: Any, rows: list[tuple[int, str, bytes, float]]) -> None:
        ids, destinations, payloads, times = (list(c) for c in zip(*rows, strict=True)) if rows else ([], [], [], [])
        self._run(cur, self._d.insert_messages, (ids, destinations, payloads, times))

    @contextmanager
    def _tx(self) -> Iterator[Any]:
        psycopg = self._psycopg
        try:
            with self._conn.transaction(), self._conn.cursor() as cur:
                yield cur
        except psycopg.Error as exc:
            retryable = isinstance(exc, (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure))
            raise StorageError(f"PostgreSQL {self.url}: {_one_line(exc)}", url=self.url, retryable=retryable) from exc


def _one_line(exc: BaseException) -> str:
    """psycopg's messages span lines (hints, tabs): errors here are one line."""
    return " ".join(str(exc).split())


def _redact(url: str) -> str:
    """The URL without its password (it goes into error messages)."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, host = rest.rpartition("@")
    if not sep or not at or ":" not in userinfo:
        return url
    return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{host}"


def is_postgres(url: str) -> bool:
    return url.startswith(("postgresql://", "postgres://"))


def open_storage(url: str) -> Storage:
    """A SQLite file path, or a ``postgresql://`` URL."""
    return PostgresStorage(url) if is_postgres(url) else SQLiteStorage(url)


class RuleCache:
    """Rules read from the database at most every ``ttl`` seconds: a changed row applies within ``ttl``.

    Lookup: the destination's enabled rule, else the enabled ``*`` row, else :data:`DEFAULT_RULE`.
    A disabled rule counts as missing (its destination is collected under the default rule), so
    disabling never strands a message.
    """

    def __init__(self, read: Callable[[], dict[str, Rule]], ttl: float, clock: Callable[[], float] = time.monotonic):
        self._read = read
        self._ttl = ttl
        self._clock = clock
        self._rules: dict[str, Rule] = {}
        self._loaded: float | None = None

    def refresh(self) -> None:
        self._rules = self._read()
        self._loaded = self._clock()

    def __call__(self, destination: str) -> Rule:
        if self._loaded is None or self._clock() - self._loaded >= self._ttl:
            self.refresh()
        for key in (destination, DEFAULT_DESTINATION):
            rule = self._rules.get(key)
            if rule is not None and rule.enabled:
                return rule
        return DEFAULT_RULE
