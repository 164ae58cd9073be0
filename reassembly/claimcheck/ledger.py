"""The reference ledger: which claim-check objects a producer stored, and which the consumer is done with.

A store alone cannot tell an orphan (a payload whose message was never sent, or was consumed
long ago) from a payload still on its way; the ledger can. The offloading producer records each
object it stored (:meth:`Ledger.record`, or :func:`offload_recorded` around
:func:`refmsg.offload`), after the put and before it sends the message; the consumer settles
the object (:meth:`Ledger.settle`, :meth:`Ledger.settle_claim`) after its own commit, when it
will never read the payload again. The sweep (:mod:`reassembly.claimcheck.sweep`) then deletes
what is settled and what no row names, and never what a live (recorded, unsettled) row names.

One row per (store name, key), in the ledger's own table ``claim_ledger``
(:mod:`reassembly.storage.ledger`: a SQLite file or PostgreSQL, created when it is opened; it
may share the collector's database). Times are UTC (``datetime`` with a timezone;
seconds since the epoch in the table). A message id is text: bytes (an MQ MsgId, a Kafka key)
are kept as their lowercase hex. Every method is one committed transaction.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from enum import Enum
from types import TracebackType
from typing import Any, NamedTuple

from reassembly.storage.ledger import LedgerTable, open_ledger_table
from refmsg import Message, ObjectStore, is_claim_check, offload, read_claim
from segmenter.sources import argument_error

log = logging.getLogger(__name__)

Buffer = bytes | bytearray | memoryview
MessageId = str | bytes | None
StoreRef = str | ObjectStore  # a store's name (what references carry as SrcEnv), or the store itself


class Recorded(str, Enum):
    """What :meth:`Ledger.record` found under the key."""

    NEW = "new"  # no row: recorded, live
    ALREADY = "live"  # this message's live row: unchanged (recording twice is harmless)
    REPLACED = "replaced"  # another message's live row: it names this message now, still live (logged)
    REOPENED = "reopened"  # a settled or swept row: the key holds a new payload, live again (logged)
    LATE = "late"  # settled before it was recorded: the row gets its time and message, stays settled


class Settled(str, Enum):
    """What :meth:`Ledger.settle` found under the key."""

    SETTLED = "settled"  # a live row: settled now
    ALREADY = "already"  # settled before: unchanged (settling twice is harmless)
    UNKNOWN = "unknown"  # no row: a settled, never-recorded row is kept, and a warning logged


class LedgerEntry(NamedTuple):
    """One ledger row. ``stored_at`` is None for an object settled but never recorded."""

    store: str
    """The name of the store holding the object (what references carry as SrcEnv)."""
    key: str
    """The object's key in that store."""
    message_id: str | None
    """The message that references the object, as text (bytes ids in hex); None: not given."""
    stored_at: datetime | None
    settled_at: datetime | None
    """None: nobody is done with it yet."""
    deleted_at: datetime | None
    """Set by the sweep once the settled object is gone from the store."""

    @property
    def live(self) -> bool:
        """Recorded and unsettled: the sweep never deletes the object it names."""
        return self.settled_at is None and self.deleted_at is None

    @property
    def settled(self) -> bool:
        """Settled and not yet swept: the sweep deletes its object."""
        return self.settled_at is not None and self.deleted_at is None


def _name(store: StoreRef) -> str:
    name = store if isinstance(store, str) else getattr(store, "name", None)
    if not isinstance(name, str) or not name:
        raise argument_error(f"a store's name must be non-empty text, not {name!r}")
    return name


def _key(key: object) -> str:
    if not isinstance(key, str) or not key:
        raise argument_error(f"an object key must be non-empty text, not {key!r}")
    return key


def _seconds(at: datetime | None) -> float:
    """``at`` (now if None) as seconds since the epoch; a naive datetime is refused (whose zone?)."""
    if at is None:
        return datetime.now(timezone.utc).timestamp()
    if not isinstance(at, datetime) or at.tzinfo is None or at.utcoffset() is None:
        raise argument_error(f"a ledger time must be a timezone-aware datetime, not {at!r}")
    return at.timestamp()


def _message_id(message_id: MessageId) -> str | None:
    if message_id is None or isinstance(message_id, str):
        return message_id
    if isinstance(message_id, (bytes, bytearray, memoryview)):
        return bytes(message_id).hex()
    raise argument_error(f"a message id is text or bytes, not {type(message_id).__name__}")


def _utc(value: Any) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(float(value), timezone.utc)


class Ledger:
    """The reference ledger over its table (:class:`~reassembly.storage.ledger.LedgerTable`, see the module).

    ``Ledger.open("ledger.db")`` or ``Ledger.open("postgresql://...")``; a ledger may share
    the collector's database. Close it (or use it as a context manager) when done.

    ``table``: the ledger table over its database connection (:meth:`open` makes one from a path or URL).
    """

    def __init__(self, table: LedgerTable) -> None:
        self.table = table

    @classmethod
    def open(cls, url: str) -> Ledger:
        """A SQLite file path (created if missing) or a ``postgresql://`` URL; a file that is not a
        SQLite database, or a server that refuses, raises :class:`~reassembly.storage.sql.StorageError`.

        ``url``: a SQLite file path or a ``postgresql://`` URL.
        """
        return cls(open_ledger_table(url))

    @property
    def url(self) -> str:
        """The database, its password hidden."""
        return self.table.url

    def record(
        self, store: StoreRef, key: str, message_id: MessageId = None, at: datetime | None = None
    ) -> Recorded:
        """The producer stored an object under ``key`` in ``store`` at ``at`` (default now) for ``message_id``.

        Call it after the put and before the message is sent: an object put but never
        recorded (the producer died in between) is one no row names, swept once older than
        the sweep's ``older_than``; a message sent before its record could be settled first
        (:attr:`Recorded.LATE`, still correct). Idempotent for one message.
        """
        name, key, mid = _name(store), _key(key), _message_id(message_id)
        found = Recorded(self.table.record(name, key, mid, _seconds(at)))
        if found in (Recorded.REPLACED, Recorded.REOPENED):
            log.warning("key %r in store %r recorded again (%s): live for message %s", key, name, found.value, mid)
        return found

    def settle(self, store: StoreRef, key: str, at: datetime | None = None) -> Settled:
        """The consumer is done with the object (call it after its commit): the sweep may delete it.

        Idempotent. A key the ledger never recorded is kept as settled-never-recorded
        (:attr:`Settled.UNKNOWN`, logged as a warning): never dropped in silence.

        ``store``: the store, or its name as references carry it. ``key``: the object's key. ``at``: when (None: now).
        """
        name, key = _name(store), _key(key)
        found = Settled(self.table.settle(name, key, _seconds(at)))
        if found is Settled.UNKNOWN:
            log.warning("settled key %r in store %r, which the ledger has no record of (kept as settled)", key, name)
        return found

    def settle_claim(self, message: Message | Buffer, at: datetime | None = None) -> Settled | None:
        """:meth:`settle` the object a claim-check reference names; None for a message that carries
        its payload inline (nothing stored). A damaged reference raises, as :func:`refmsg.read_claim` does.

        ``message``: the reference message, or its body bytes. ``at``: when (None: now).
        """
        if isinstance(message, Message):
            if not message.is_reference:
                return None
            body: Buffer = message.body
        else:
            body = message
            if not is_claim_check(body):
                return None
        claim = read_claim(body)
        return self.settle(claim.store, claim.key, at)

    def entries(self, store: StoreRef) -> list[LedgerEntry]:
        """Every row of ``store``, by key (swept ones included: :attr:`LedgerEntry.deleted_at`)."""
        return [self._entry(r) for r in self.table.rows(_name(store))]

    def entry(self, store: StoreRef, key: str) -> LedgerEntry | None:
        """The row of ``key`` in ``store``, or None."""
        rows = self.table.rows(_name(store), _key(key))
        return self._entry(rows[0]) if rows else None

    def stores(self) -> dict[str, int]:
        """Every store name the ledger has rows for, with how many."""
        return self.table.stores()

    def mark_deleted(self, store: StoreRef, key: str, at: datetime | None = None) -> bool:
        """The settled object is gone from the store (the sweep calls it after the delete); False if
        the row is not settled (recorded again meanwhile: it stays live) or was marked before.

        ``store``: the store, or its name. ``key``: the object's key. ``at``: when it was deleted (None: now).
        """
        return self.table.mark_deleted(_name(store), _key(key), _seconds(at))

    @staticmethod
    def _entry(row: tuple[Any, ...]) -> LedgerEntry:
        return LedgerEntry(row[0], row[1], row[2], _utc(row[3]), _utc(row[4]), _utc(row[5]))

    def close(self) -> None:
        self.table.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def offload_recorded(
    payload: Buffer,
    store: ObjectStore,
    ledger: Ledger,
    *,
    message_id: MessageId = None,
    at: datetime | None = None,
    **options: Any,
) -> Message:
    """:func:`refmsg.offload` (``options`` go to it), then :meth:`Ledger.record` of the stored object.

    The put comes first, the record second, and the message is returned only after both:
    send it after this returns. A payload small enough to travel inline is not stored and
    not recorded. If the record fails, the object is in the store with no row naming it:
    the sweep deletes it once it is older than ``older_than``.

    ``payload``: the message's bytes. ``store``: where a payload over the threshold is put. ``ledger``: where the stored
    object is recorded. ``message_id``: the message's id, kept in the ledger row to trace the object back (None: none).
    ``at``: the time recorded (None: now).
    """
    message = offload(payload, store, **options)
    if message.is_reference:
        claim = read_claim(message.body)
        ledger.record(claim.store, claim.key, message_id, at)
    return message
