"""A shared segment store for competing consumers: any member may receive any segment, the one
whose write completes a message claims it, assembles it with the assembler's rules and hands it on.

:func:`open_store` opens one from a URL (``sqlite:///path``, a plain path, or ``postgresql://``).
The decisions live in :mod:`.core` (sans-I/O); :mod:`.store` runs them in SQL transactions and
:mod:`.records` holds what its operations take and return;
:mod:`.sqlite` and :mod:`.postgres` are the databases. How to use it: docs/how-to/competing-consumers.md.
"""

from __future__ import annotations

from typing import Any

from reassembly.segstore.core import GapReport, StoreStats, UnitReport, Write
from reassembly.segstore.member import MemberReceiver, MemberStats, StoreMember
from reassembly.segstore.records import Claim, OnMessage, Settled, Vacuumed, Written
from reassembly.segstore.store import SegmentStore


def open_store(url: str, *, member: str, **options: Any) -> SegmentStore:
    """The store a URL names: ``postgresql://...`` (or ``postgres://``) on a server, else a SQLite file
    (``sqlite:///abs/path``, ``sqlite://rel/path`` or a plain path). ``options`` go to the store.

    ``url``: the database. ``member``: this process's name in claims and counters (the store's ``member``).
    """
    if url.startswith(("postgresql://", "postgres://")):
        from reassembly.segstore.postgres import PostgresSegmentStore

        return PostgresSegmentStore(url, member=member, **options)
    from reassembly.segstore.sqlite import SqliteSegmentStore

    path = url.removeprefix("sqlite://") if url.startswith("sqlite://") else url
    return SqliteSegmentStore(path, member=member, **options)


__all__ = [
    "Claim",
    "GapReport",
    "MemberReceiver",
    "MemberStats",
    "OnMessage",
    "SegmentStore",
    "Settled",
    "StoreMember",
    "StoreStats",
    "UnitReport",
    "Vacuumed",
    "Write",
    "Written",
    "open_store",
]
