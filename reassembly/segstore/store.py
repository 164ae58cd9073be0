"""The shared segment store over SQL: one implementation, two databases (SQLite on one host,
PostgreSQL across hosts), the decisions of :mod:`reassembly.segstore.core` run in transactions.

The contract a member (a share-group consumer, a competing queue consumer, an SQS-like
receive/delete loop) relies on:

* :meth:`SegmentStore.write` returns only once its segments are committed (or judged duplicates,
  or quarantined with their bytes): acknowledge the records then, never before.
* The write that completes a unit (a message, or a Unit-of-Work group) claims it under a lease in
  the same transaction and returns a :class:`Claim`; whoever holds the claim calls
  :meth:`SegmentStore.deliver`, which assembles the unit from the store with the assembler's rules,
  hands each :class:`~reassembly.assembler.events.MessageComplete` (or ``GroupComplete``) to the
  callback, and deletes the unit's segments only after the callback returned. If the callback
  raises, the lease is released and another member (or this one) retries.
* A claimant that dies leaves its lease to run out; :meth:`SegmentStore.take_over` (every member
  calls it now and then) claims units whose lease expired, and units ready but unclaimed.
* A settled unit leaves a tombstone (the fingerprint of every segment used): a redelivered copy is
  a duplicate, a different one is quarantined, until :meth:`SegmentStore.vacuum` drops tombstones
  older than the retention given.

Delivery is at least once (a claimant that dies after its callback returned and before it settled
is repeated by another member), so the sink must be idempotent on (GroupId, MsgSeqNumber), which
every delivered message carries.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ClassVar

from reassembly.assembler.events import GroupComplete
from reassembly.assembler.model import Limits
from reassembly.segstore import core
from reassembly.segstore.core import Delivered, Incoming, Lease, Row, StoreStats, UnitReport, Write
from reassembly.segstore.records import Claim, OnMessage, Opened, Settled, Vacuumed, Written
from segmenter.errors import Reason, SegmentationError

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS seg_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS seg_units (
    group_id {blob} NOT NULL, unit INTEGER NOT NULL, first_seen {real} NOT NULL, updated {real} NOT NULL,
    segments INTEGER NOT NULL DEFAULT 0, bytes BIGINT NOT NULL DEFAULT 0, ready INTEGER NOT NULL DEFAULT 0,
    claimant TEXT, lease_until {real}, token BIGINT NOT NULL DEFAULT 0, attempts INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (group_id, unit));
CREATE TABLE IF NOT EXISTS seg_segments (
    group_id {blob} NOT NULL, unit INTEGER NOT NULL, seq INTEGER NOT NULL, off BIGINT NOT NULL, fp {blob} NOT NULL,
    length BIGINT NOT NULL, flags INTEGER NOT NULL, member TEXT NOT NULL, at {real} NOT NULL, raw {blob} NOT NULL,
    PRIMARY KEY (group_id, seq, off, fp));
CREATE INDEX IF NOT EXISTS seg_segments_unit ON seg_segments (group_id, unit);
CREATE TABLE IF NOT EXISTS seg_settled (
    group_id {blob} NOT NULL, unit INTEGER NOT NULL, state TEXT NOT NULL, at {real} NOT NULL,
    PRIMARY KEY (group_id, unit));
CREATE TABLE IF NOT EXISTS seg_used (
    group_id {blob} NOT NULL, seq INTEGER NOT NULL, off BIGINT NOT NULL, fp {blob} NOT NULL, at {real} NOT NULL,
    PRIMARY KEY (group_id, seq, off));
CREATE TABLE IF NOT EXISTS seg_quarantine (
    id {serial} PRIMARY KEY, group_id {blob}, seq INTEGER, off BIGINT, reason INTEGER NOT NULL, detail TEXT NOT NULL,
    member TEXT NOT NULL, at {real} NOT NULL, raw {blob} NOT NULL);
CREATE TABLE IF NOT EXISTS seg_counters (
    member TEXT NOT NULL, name TEXT NOT NULL, value BIGINT NOT NULL, PRIMARY KEY (member, name));
"""


class SegmentStore:
    """The store's operations; a subclass supplies the connection and the database's dialect.

    ``member`` names this process in claims and counters (unique per live process: a restarted
    member may reuse its name, its old leases are then its own again). ``lease_seconds`` bounds how
    long a claimant may take from its claim to its settlement before another member takes over.
    ``unit_of_work`` (recorded in the store by the first member, True unless it says otherwise; a
    member giving ``None`` takes the store's, one giving another value is refused) makes an
    MQ group one claim, delivered as one ``GroupComplete`` once every message 1..last is complete.

    ``conn``: the open DB-API connection to the store's database (SQLite or PostgreSQL, as the subclass says).
    ``limits``: the bounds segments and messages are checked against (None: the defaults of :class:`Limits`). ``clock``:
    seconds since the epoch, for leases and ages (None: ``time.time``).
    """

    placeholder = "?"
    for_update = ""
    skip_locked = ""
    types: ClassVar[dict[str, str]] = {"blob": "BLOB", "real": "REAL", "serial": "INTEGER"}

    def __init__(
        self,
        conn: Any,
        *,
        member: str,
        lease_seconds: float = 30.0,
        limits: Limits | None = None,
        unit_of_work: bool | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.conn = conn
        self.member = member
        self.lease_seconds = lease_seconds
        self.limits = limits or Limits()
        self.clock = clock if clock is not None else time.time
        self._pending: dict[str, int] = {}  # counters of the open transaction
        self._create()
        self.unit_of_work = (
            self._agree("unit_of_work", None if unit_of_work is None else "1" if unit_of_work else "0") == "1"
        )

    # ---------------------------------------------------------------- dialect
    def _begin(self) -> None:
        self.conn.execute("BEGIN")

    def _q(self, sql: str) -> str:
        return sql if self.placeholder == "?" else sql.replace("?", self.placeholder)

    def _x(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self.conn.execute(self._q(sql), tuple(params))

    @contextmanager
    def _tx(self) -> Iterator[None]:
        self._pending = {}
        try:
            self._begin()
            yield
            for name, n in self._pending.items():  # one upsert per counter and transaction
                self._x(
                    "INSERT INTO seg_counters (member, name, value) VALUES (?, ?, ?) ON CONFLICT (member, name) "
                    "DO UPDATE SET value = seg_counters.value + excluded.value",
                    (self.member, name, n),
                )
        except BaseException:
            self._pending = {}
            self.conn.execute("ROLLBACK")
            raise
        self._pending = {}
        self.conn.execute("COMMIT")

    def _schema_lock(self) -> None:
        """Serialise schema creation between members starting together (PostgreSQL)."""

    def _create(self) -> None:
        with self._tx():
            self._schema_lock()
            for stmt in SCHEMA.format(**self.types).split(";"):
                if stmt.strip():
                    self.conn.execute(stmt)

    def _agree(self, name: str, value: str | None, default: str = "1") -> str:
        """A store-wide setting: the first member records it; ``value`` None takes the store's."""
        with self._tx():
            self._x(
                "INSERT INTO seg_meta (name, value) VALUES (?, ?) ON CONFLICT (name) DO NOTHING",
                (name, default if value is None else value),
            )
            held = str(self._x("SELECT value FROM seg_meta WHERE name = ?", (name,)).fetchone()[0])
        if value is not None and held != value:
            raise SegmentationError(
                f"the store was created with {name}={held}; this member asks for {value}",
                reason=Reason.STATE_ERROR,
                setting=name,
            )
        return held

    def _count(self, name: str, n: int = 1) -> None:
        """Add to this member's counter, written with the transaction that counts (inside ``_tx``)."""
        if n:
            self._pending[name] = self._pending.get(name, 0) + n

    def _quarantine(self, inc: Incoming | None, raw: bytes, reason: Reason, detail: str, now: float) -> None:
        h = None if inc is None else inc.header
        self._x(
            "INSERT INTO seg_quarantine (group_id, seq, off, reason, detail, member, at, raw) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                None if h is None else h.group_id,
                None if h is None else h.msg_seq_number,
                None if h is None else h.offset,
                int(reason),
                detail,
                self.member,
                now,
                raw,
            ),
        )
        self._count("quarantined")

    # ---------------------------------------------------------------- writes
    def write(self, raws: Sequence[bytes | memoryview]) -> tuple[list[Written], list[Claim]]:
        """Store a batch of encoded segments in one transaction; per segment what happened, and the
        units this write completed (claimed by this member, to :meth:`deliver`). Acknowledge the
        records once this returned: every one of them is then durable, a duplicate or quarantined.

        ``raws``: the encoded segments (header and data), as received.
        """
        now = self.clock()
        taken = [core.take(bytes(r), self.limits, self.unit_of_work) for r in raws]
        order = sorted(range(len(taken)), key=lambda i: _lock_key(taken[i]))  # one lock order: no deadlock
        results: list[Written | None] = [None] * len(taken)
        claims: list[Claim] = []
        with self._tx():
            touched: dict[tuple[bytes, int], bool] = {}
            for i in order:
                inc = taken[i]
                if inc.row is None:
                    err = inc.error or SegmentationError("not a segment", reason=Reason.BAD_MAGIC)
                    self._quarantine(inc, inc.raw, err.reason, str(err), now)
                    results[i] = Written(
                        Write.QUARANTINED, None if inc.header is None else inc.header.group_id, err.reason
                    )
                    continue
                results[i] = self._write_one(inc, inc.row, now, touched)
            for (gid, unit), inserted in touched.items():
                if inserted:
                    c = self._maybe_claim(gid, unit, now)
                    if c is not None:
                        claims.append(c)
        return [r for r in results if r is not None], claims

    def _write_one(self, inc: Incoming, row: Row, now: float, touched: dict[tuple[bytes, int], bool]) -> Written:
        key = (row.group_id, row.unit)
        if key not in touched:
            self._x(
                "INSERT INTO seg_units (group_id, unit, first_seen, updated) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (group_id, unit) DO NOTHING",
                (row.group_id, row.unit, now, now),
            )
            self._x(f"SELECT token FROM seg_units WHERE group_id = ? AND unit = ?{self.for_update}", key).fetchone()
            touched[key] = False
        state = self._x("SELECT state FROM seg_settled WHERE group_id = ? AND unit = ?", key).fetchone()
        if state is not None:
            return self._late(inc, row, now)
        held = [
            bytes(r[0])
            for r in self._x(
                "SELECT fp FROM seg_segments WHERE group_id = ? AND seq = ? AND off = ?",
                (row.group_id, row.seq, row.offset),
            )
        ]
        outcome = core.judge(row, held)
        if outcome is Write.DUPLICATE:
            self._count("duplicates")
            return Written(outcome, row.group_id)
        self._x(
            "INSERT INTO seg_segments (group_id, unit, seq, off, fp, length, flags, member, at, raw) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (row.group_id, row.unit, row.seq, row.offset, row.fp, row.length, row.msg_flags, self.member, now, inc.raw),
        )
        self._x(
            "UPDATE seg_units SET segments = segments + 1, bytes = bytes + ?, updated = ? "
            "WHERE group_id = ? AND unit = ?",
            (len(inc.raw), now, row.group_id, row.unit),
        )
        self._count("stored")
        if outcome is Write.VARIANT:
            self._count("variants")
        touched[key] = True
        return Written(outcome, row.group_id)

    def _late(self, inc: Incoming, row: Row, now: float) -> Written:
        """A segment of a settled or expired unit: a duplicate of what was used, or quarantined."""
        self._x(
            "DELETE FROM seg_units WHERE group_id = ? AND unit = ? AND segments = 0", (row.group_id, row.unit)
        )  # the row this write's lock created
        used = self._x(
            "SELECT fp FROM seg_used WHERE group_id = ? AND seq = ? AND off = ?", (row.group_id, row.seq, row.offset)
        ).fetchone()
        outcome, err = core.judge_late(row, None if used is None else bytes(used[0]))
        if err is None:
            self._count("duplicates")
            return Written(outcome, row.group_id)
        self._quarantine(inc, inc.raw, err.reason, str(err), now)
        if err.reason is Reason.CONFLICTING_DUPLICATE:
            self._count("conflicts")
        return Written(outcome, row.group_id, err.reason)

    def _rows(self, gid: bytes, unit: int) -> list[Row]:
        return [
            Row(gid, unit, int(seq), int(off), bytes(fp), int(length), int(flags))
            for seq, off, fp, length, flags in self._x(
                "SELECT seq, off, fp, length, flags FROM seg_segments WHERE group_id = ? AND unit = ?", (gid, unit)
            )
        ]

    def _lease(self, gid: bytes, unit: int) -> Lease | None:
        r = self._x(
            "SELECT claimant, lease_until, token FROM seg_units WHERE group_id = ? AND unit = ?", (gid, unit)
        ).fetchone()
        return None if r is None else Lease(r[0], r[1], int(r[2]))

    def _maybe_claim(self, gid: bytes, unit: int, now: float) -> Claim | None:
        lease = self._lease(gid, unit)
        if lease is None or lease.live(now) or not core.ready(self._rows(gid, unit)):
            return None
        return self._claim(gid, unit, lease, now)

    def _claim(self, gid: bytes, unit: int, lease: Lease, now: float) -> Claim:
        if lease.expired(now):
            self._count("leases_expired")
        new = core.claim(lease, self.member, now, self.lease_seconds)
        self._x(
            "UPDATE seg_units SET ready = 1, claimant = ?, lease_until = ?, token = ? WHERE group_id = ? AND unit = ?",
            (new.claimant, new.until, new.token, gid, unit),
        )
        self._count("claims")
        assert new.until is not None
        return Claim(gid, unit, new.token, new.until)

    def take_over(self, limit: int = 16) -> list[Claim]:
        """Claim units that are ready but unclaimed, or whose claimant's lease ran out (oldest first).

        ``limit``: the most units claimed by one call.
        """
        now = self.clock()
        claims: list[Claim] = []
        with self._tx():
            found = self._x(
                "SELECT group_id, unit, claimant, lease_until, token FROM seg_units "
                "WHERE ready = 1 AND (claimant IS NULL OR lease_until <= ?) ORDER BY first_seen LIMIT ?"
                f"{self.for_update}{self.skip_locked}",
                (now, limit),
            ).fetchall()
            for gid, unit, claimant, until, token in found:
                claims.append(self._claim(bytes(gid), int(unit), Lease(claimant, until, int(token)), now))
        return claims

    def quarantine(self, raw: bytes | memoryview, reason: Reason, detail: str) -> None:
        """Keep a record's bytes aside (a record at its delivery limit, anything refused before the
        store saw it as a segment), committed when this returns.

        ``raw``: the record's bytes, kept as they came. ``reason``: why it is kept aside. ``detail``: what happened, in
        words.
        """
        data = bytes(raw)
        taken = core.take(data, self.limits, self.unit_of_work)
        with self._tx():
            self._quarantine(taken, data, reason, detail, self.clock())

    # ---------------------------------------------------------------- delivery
    def deliver(self, claim: Claim, on_message: OnMessage) -> Settled:
        """Assemble a claimed unit from the store, hand it on, then settle it (segments deleted,
        tombstones written, losers quarantined). ``on_message`` raising: the lease is released (so
        any member retries) and the exception propagates.

        ``claim``: the unit this member claimed (from :meth:`write` or :meth:`take_over`). ``on_message``: called with
        each event of the unit before it is settled.
        """
        opened = self.open(claim)
        if opened is None:
            return Settled()
        try:
            for event in opened.delivered:
                on_message(event)
        except BaseException:
            self.release(claim)
            raise
        return self.settle(opened)

    def open(self, claim: Claim) -> Opened | None:
        """Assemble a claimed unit from the store without settling it: for a claimant that hands
        the unit's messages on and settles later (:meth:`settle`, or :meth:`release` to give it
        back), keeping the lease alive meanwhile (:meth:`renew`). None when the claim was lost
        (settled or taken over since) or the unit is not decided yet (the claim is then released
        and the unit waits for more segments or its expiry).

        ``claim``: the unit this member claimed (from :meth:`write` or :meth:`take_over`).
        """
        gid, unit = claim.group_id, claim.unit
        lease = self._lease(gid, unit)
        if lease is None or lease.token != claim.token or lease.claimant != self.member:
            with self._tx():
                self._count("claims_lost")  # settled or taken over by another member since the claim
            return None
        stored = self._x(
            "SELECT seq, off, fp, raw, member FROM seg_segments WHERE group_id = ? AND unit = ? ORDER BY seq, off, fp",
            (gid, unit),
        ).fetchall()
        raws = [bytes(r[3]) for r in stored]
        keys = [(int(r[0]), int(r[1]), bytes(r[2])) for r in stored]
        result = core.assemble(raws, self.limits, self.unit_of_work)
        if not result.decided:
            self._release(claim, ready=False)
            return None
        return Opened(claim, result, keys, raws, frozenset(str(r[4]) for r in stored))

    def settle(self, opened: Opened) -> Settled:
        """Settle an opened unit once its messages are safe: its segments deleted, tombstones
        written, losers quarantined. ``settled`` False when the lease was lost meanwhile (another
        member took the unit over and delivers it again: at least once).

        ``opened``: what :meth:`open` returned for the unit.
        """
        return self._settle(opened.claim, opened.result, opened.keys, opened.raws)

    def release(self, claim: Claim) -> None:
        """Give a claimed unit back, not settled: any member (this one too) claims it again.

        ``claim``: the unit given back.
        """
        self._release(claim, ready=True)

    def renew(self, claim: Claim) -> Claim | None:
        """Extend the lease of a unit this member still holds (the same token) to ``lease_seconds``
        from now; None when it was taken over or settled since (its next settle is then lost).

        ``claim``: the unit whose lease is extended.
        """
        until = self.clock() + self.lease_seconds
        with self._tx():
            n = self._x(
                "UPDATE seg_units SET lease_until = ? WHERE group_id = ? AND unit = ? AND token = ? AND claimant = ?",
                (until, claim.group_id, claim.unit, claim.token, self.member),
            ).rowcount
            if n != 1:
                self._count("renewals_lost")
        return None if n != 1 else Claim(claim.group_id, claim.unit, claim.token, until)

    def _release(self, claim: Claim, *, ready: bool) -> None:
        with self._tx():
            self._x(
                "UPDATE seg_units SET claimant = NULL, lease_until = NULL, ready = ?, attempts = attempts + ? "
                "WHERE group_id = ? AND unit = ? AND token = ?",
                (1 if ready else 0, 1 if ready else 0, claim.group_id, claim.unit, claim.token),
            )
            self._count("released")

    def _settle(
        self, claim: Claim, result: core.Assembly, keys: list[tuple[int, int, bytes]], raws: list[bytes]
    ) -> Settled:
        gid, unit = claim.group_id, claim.unit
        now = self.clock()
        with self._tx():
            held = self._x(
                f"SELECT token FROM seg_units WHERE group_id = ? AND unit = ?{self.for_update}", (gid, unit)
            ).fetchone()
            if held is None or int(held[0]) != claim.token:
                self._count("settlements_lost")  # the lease ran out and another member took the unit over
                return Settled(len(result.delivered))
            self._x(
                "INSERT INTO seg_settled (group_id, unit, state, at) VALUES (?, ?, 'delivered', ?)", (gid, unit, now)
            )
            for i in sorted(result.used):
                seq, off, fp = keys[i]
                self._x(
                    "INSERT INTO seg_used (group_id, seq, off, fp, at) VALUES (?, ?, ?, ?, ?) "
                    "ON CONFLICT (group_id, seq, off) DO NOTHING",
                    (gid, seq, off, fp, now),
                )
            for q in result.quarantined:
                seq, off, _ = keys[q.index]
                self._x(
                    "INSERT INTO seg_quarantine (group_id, seq, off, reason, detail, member, at, raw) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (gid, seq, off, int(q.reason), q.detail, self.member, now, raws[q.index]),
                )
                if q.reason is Reason.CONFLICTING_DUPLICATE:
                    self._count("conflicts")
            self._count("quarantined", len(result.quarantined))
            self._count("used", len(result.used))
            self._count("duplicates", len(result.duplicates))
            assembled = set(keys)
            newer = [
                k
                for k in (
                    (int(seq), int(off), bytes(fp))
                    for seq, off, fp in self._x(
                        "SELECT seq, off, fp FROM seg_segments WHERE group_id = ? AND unit = ?", (gid, unit)
                    )
                )
                if k not in assembled
            ]
            left = [
                (
                    seq,
                    off,
                    fp,
                    bytes(
                        self._x(
                            "SELECT raw FROM seg_segments WHERE group_id = ? AND seq = ? AND off = ? AND fp = ?",
                            (gid, seq, off, fp),
                        ).fetchone()[0]
                    ),
                )
                for seq, off, fp in newer
            ]
            self._x("DELETE FROM seg_segments WHERE group_id = ? AND unit = ?", (gid, unit))
            self._x("DELETE FROM seg_units WHERE group_id = ? AND unit = ?", (gid, unit))
            late = 0
            for seq, off, fp, raw in left:  # written while the unit was being assembled
                row = Row(gid, unit, seq, off, fp, 0, 0)
                used = fp if (seq, off, fp) in {keys[i] for i in result.used} else self._used_fp(gid, seq, off)
                _, err = core.judge_late(row, used)
                if err is None:
                    self._count("duplicates")
                else:
                    late += 1
                    self._quarantine(core.take(raw, self.limits, self.unit_of_work), raw, err.reason, str(err), now)
            self._count("delivered", sum(_messages(e) for e in result.delivered))
        return Settled(len(result.delivered), len(result.quarantined) + late, True)

    def _used_fp(self, gid: bytes, seq: int, off: int) -> bytes | None:
        r = self._x("SELECT fp FROM seg_used WHERE group_id = ? AND seq = ? AND off = ?", (gid, seq, off)).fetchone()
        return None if r is None else bytes(r[0])

    # ---------------------------------------------------------------- maintenance
    def incomplete(self, older_than: float = 0.0) -> list[UnitReport]:
        """Held units not complete (a complete one awaits its claimant or a take-over) whose first
        segment is older than ``older_than`` seconds, each with its exact missing ranges (the
        assembler's report of its stored segments)."""
        now = self.clock()
        found = self._x(
            "SELECT group_id, unit, first_seen, segments, bytes FROM seg_units "
            "WHERE first_seen <= ? AND ready = 0 AND NOT (claimant IS NOT NULL AND lease_until > ?) "
            "ORDER BY first_seen",
            (now - older_than, now),
        ).fetchall()
        reports = []
        for gid, unit, first, segments, size in found:
            raws = [
                bytes(r[0])
                for r in self._x(
                    "SELECT raw FROM seg_segments WHERE group_id = ? AND unit = ? ORDER BY seq, off", (bytes(gid), unit)
                )
            ]
            gaps, missing, last = core.gaps(raws, self.limits, self.unit_of_work)
            reports.append(
                UnitReport(bytes(gid), int(unit), float(first), int(segments), int(size), gaps, missing, last)
            )
        return reports

    def expire(self, older_than: float, *, dry_run: bool = False) -> list[UnitReport]:
        """Quarantine every segment of the units :meth:`incomplete` lists (reason 2242 with the
        missing ranges, 2241 when only whole messages of a group are missing) and remember the units
        as expired, so their late segments are quarantined too. A dry run reports and changes nothing.

        ``older_than``: the age in seconds of a unit's first segment past which an incomplete unit is expired.
        ``dry_run``: True reports the units and changes nothing.
        """
        reports = self.incomplete(older_than)
        if dry_run:
            return reports
        now = self.clock()
        done = []
        for rep in reports:
            with self._tx():
                lease = self._x(
                    "SELECT claimant, lease_until, token FROM seg_units WHERE group_id = ? AND unit = ?"
                    f"{self.for_update}",
                    (rep.group_id, rep.unit),
                ).fetchone()
                if lease is None or Lease(lease[0], lease[1], int(lease[2])).live(now):
                    continue  # settled or claimed meanwhile
                reason = Reason.INCOMPLETE_MSG if rep.gaps else Reason.INCOMPLETE_GROUP
                detail = _gap_text(rep)
                self._x(
                    "INSERT INTO seg_quarantine (group_id, seq, off, reason, detail, member, at, raw) "
                    "SELECT group_id, seq, off, ?, ?, ?, ?, raw FROM seg_segments WHERE group_id = ? AND unit = ?",
                    (int(reason), detail, self.member, now, rep.group_id, rep.unit),
                )
                n = self._x(
                    "DELETE FROM seg_segments WHERE group_id = ? AND unit = ?", (rep.group_id, rep.unit)
                ).rowcount
                self._x("DELETE FROM seg_units WHERE group_id = ? AND unit = ?", (rep.group_id, rep.unit))
                self._x(
                    "INSERT INTO seg_settled (group_id, unit, state, at) VALUES (?, ?, 'expired', ?) "
                    "ON CONFLICT (group_id, unit) DO NOTHING",
                    (rep.group_id, rep.unit, now),
                )
                self._count("quarantined", n)
                self._count("expired")
            done.append(rep)
        return done

    def vacuum(self, retention: float, *, dry_run: bool = False, quarantine_too: bool = False) -> Vacuumed:
        """Drop tombstones of units settled or expired more than ``retention`` seconds ago (a copy
        redelivered after that is taken as new), and with ``quarantine_too`` quarantined segments as
        old; then let the database reclaim the space. A dry run counts and changes nothing.

        ``dry_run``: True counts what would go and changes nothing.
        """
        cut = self.clock() - retention
        if dry_run:
            t = self._x("SELECT count(*) FROM seg_settled WHERE at < ?", (cut,)).fetchone()[0]
            q = (
                self._x("SELECT count(*) FROM seg_quarantine WHERE at < ?", (cut,)).fetchone()[0]
                if quarantine_too
                else 0
            )
            return Vacuumed(int(t), int(q))
        with self._tx():
            t = self._x("DELETE FROM seg_settled WHERE at < ?", (cut,)).rowcount
            self._x("DELETE FROM seg_used WHERE at < ?", (cut,))
            q = self._x("DELETE FROM seg_quarantine WHERE at < ?", (cut,)).rowcount if quarantine_too else 0
        self._reclaim()
        return Vacuumed(int(t), int(q))

    def _reclaim(self) -> None:
        self.conn.execute("VACUUM")

    def stats(self) -> StoreStats:
        """What the store holds now and its counters (summed over members)."""
        now = self.clock()
        units, segs, size, oldest = self._x(
            "SELECT count(*), coalesce(sum(segments), 0), coalesce(sum(bytes), 0), min(first_seen) FROM seg_units"
        ).fetchone()
        held = self._x(
            "SELECT count(*) FROM seg_units WHERE claimant IS NOT NULL AND lease_until > ?", (now,)
        ).fetchone()[0]
        expired = self._x(
            "SELECT count(*) FROM seg_units WHERE claimant IS NOT NULL AND lease_until <= ?", (now,)
        ).fetchone()[0]
        quarantined = self._x("SELECT count(*) FROM seg_quarantine").fetchone()[0]
        counters = {
            str(name): int(value)
            for name, value in self._x("SELECT name, sum(value) FROM seg_counters GROUP BY name").fetchall()
        }
        return StoreStats(
            int(units),
            int(segs),
            int(size),
            None if oldest is None else float(oldest),
            int(held),
            int(expired),
            int(quarantined),
            counters,
        )

    def quarantined(self) -> list[tuple[bytes | None, int | None, int | None, Reason, str, bytes]]:
        """Every segment kept aside: (GroupId, MsgSeqNumber, Offset, reason, detail, bytes), oldest first."""
        rows = self._x("SELECT group_id, seq, off, reason, detail, raw FROM seg_quarantine ORDER BY id").fetchall()
        return [
            (None if g is None else bytes(g), s, o, Reason(int(r)), str(d), bytes(raw)) for g, s, o, r, d, raw in rows
        ]

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> SegmentStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _lock_key(inc: Incoming) -> tuple[bytes, int]:
    return (b"", -1) if inc.row is None else (inc.row.group_id, inc.row.unit)


def _messages(e: Delivered) -> int:
    return len(e.messages) if isinstance(e, GroupComplete) else 1


def _gap_text(rep: UnitReport) -> str:
    parts = [
        f"message {g.msg_seq_number} missing "
        + ", ".join(f"[{a}, {'?' if b is None else b})" for a, b in g.missing_ranges)
        for g in rep.gaps
    ]
    if rep.missing_seq_numbers:
        parts.append("messages missing: " + ", ".join(map(str, rep.missing_seq_numbers)))
    return "; ".join(parts) or "incomplete"
