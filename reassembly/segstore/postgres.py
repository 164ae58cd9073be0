"""The segment store in PostgreSQL (psycopg 3): for members on any number of hosts.

Every write locks the rows of the units it touches (``SELECT ... FOR UPDATE``) in one order
(GroupId, unit), so concurrent writers of one message serialise on it and never deadlock;
:meth:`~reassembly.segstore.store.SegmentStore.take_over` skips units another member has locked
(``FOR UPDATE SKIP LOCKED``). A commit returns once the server made it durable (with the
server's own ``fsync`` and ``synchronous_commit``: leave them on in production).
``pip install segment-reassembly[postgres]``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from reassembly.segstore.records import StoreOptions
from reassembly.segstore.store import SegmentStore
from segmenter.errors import Reason, SegmentationError

if TYPE_CHECKING:
    from typing_extensions import Unpack

_SCHEMA_LOCK = 0x5E65_7031  # pg_advisory_xact_lock key: members creating the schema at once take turns


def _connect(url: str) -> Any:
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - the extra is part of dev
        raise SegmentationError(
            "the PostgreSQL segment store needs psycopg: pip install segment-reassembly[postgres]",
            reason=Reason.STORAGE_ERROR,
        ) from exc
    try:
        return psycopg.connect(url, autocommit=True)
    except psycopg.Error as exc:
        raise SegmentationError(f"cannot connect to {url}: {exc}", reason=Reason.STORAGE_ERROR) from exc


class PostgresSegmentStore(SegmentStore):
    """A :class:`SegmentStore` in the PostgreSQL database at ``url`` (its tables created if absent)."""

    placeholder = "%s"
    for_update = " FOR UPDATE"
    skip_locked = " SKIP LOCKED"
    types: ClassVar[dict[str, str]] = {"blob": "BYTEA", "real": "DOUBLE PRECISION", "serial": "BIGSERIAL"}

    def __init__(
        self,
        url: str,
        **options: Unpack[StoreOptions],
    ) -> None:
        super().__init__(_connect(url), **options)

    def _schema_lock(self) -> None:
        self.conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))

    def _create(self) -> None:
        super()._create()
        # Segment bytes are checksummed, often compressed payloads: stored out of line without
        # PostgreSQL's own compression attempt (pglz over incompressible 64 KiB costs more than the
        # write). Changed once, by the member that finds it unset (under the schema lock).
        with self._tx():
            self._schema_lock()
            for table in ("seg_segments", "seg_quarantine"):
                storage = self.conn.execute(
                    "SELECT attstorage FROM pg_attribute WHERE attrelid = %s::regclass AND attname = 'raw'", (table,)
                ).fetchone()[0]
                if storage != "e":
                    self.conn.execute(f"ALTER TABLE {table} ALTER COLUMN raw SET STORAGE EXTERNAL")

    def _reclaim(self) -> None:
        self.conn.execute("VACUUM seg_segments")
        self.conn.execute("VACUUM seg_units")
        self.conn.execute("VACUUM seg_settled")
        self.conn.execute("VACUUM seg_used")
        self.conn.execute("VACUUM seg_quarantine")
