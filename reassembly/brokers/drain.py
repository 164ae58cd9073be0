"""The drain: segments from a broker queue into the landing table ``reassemble run`` reads.

Each file is written under a hidden temporary name in the landing directory, closed, fsynced,
renamed to ``part-<UTC time>-<id>.parquet`` and the directory fsynced; only then are the
batch's deliveries acknowledged. A crash at any point loses nothing: before the rename the
segments are unacknowledged (the broker redelivers them, the orphaned temporary file is removed
by the next drain), between the rename and the acknowledgement they are redelivered *and* already
landed, which ``reassemble run`` counts as duplicates. Files roll by size, by age and by segment
count (STOMP's prefetch caps unacknowledged messages, so a file must never need more).

Landing schema (what ``reassemble run`` reads; extra columns are ignored by it):
``segment`` binary (the broker message body: one encoded segment, as sent), ``redelivered``
bool (the broker's flag), ``landed_at`` timestamp[us, UTC] (when the drain received it). A
Kafka source (:class:`reassembly.brokers.kafka.KafkaSource`) lands ``segment`` (the record value)
with ``key``, ``topic``, ``partition``, ``offset``, ``timestamp``, ``headers`` and ``landed_at``
instead (:data:`KAFKA_LANDING`), and "acknowledging" a file commits the offsets after its records.

The drain does not assemble anything: it lands every body, even garbage, so ``reassemble run``
judges and quarantines it with the original bytes.
"""

from __future__ import annotations

import os
import re
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from reassembly.brokers.kafka_source import landing_fields, landing_values
from segmenter.brokers import Consumer, Delivery, body_view

_TMP_PREFIX = ".drain-"


@dataclass(frozen=True)
class Rolling:
    """When the current file is closed and published."""

    max_bytes: int = 128 << 20
    """Segment bytes in one file: reaching it closes and publishes the file."""
    max_seconds: float = 60.0
    """Seconds after the file's first segment at which the file is closed and published."""
    max_segments: int = 10_000
    """Segments in one file; keep it at most the consumer's prefetch (STOMP caps unacknowledged
    deliveries at it, and none is acknowledged before its file is published)."""
    row_group_bytes: int = 16 << 20
    """Segment bytes buffered in memory before they are written to the open file as a row group."""


def _broker_fields() -> list[tuple[str, Any]]:
    import pyarrow as pa

    return [("redelivered", pa.bool_()), ("landed_at", pa.timestamp("us", tz="UTC"))]


@dataclass(frozen=True)
class Landing:
    """The columns a drain lands after ``segment``: their pyarrow fields (built when a file opens,
    so importing this module needs no pyarrow) and each delivery's values, given the landing time."""

    fields: Callable[[], list[tuple[str, Any]]]
    """Builds the extra columns' pyarrow fields, as ``(name, type)`` pairs, when a file opens."""
    values: Callable[[Any, datetime], tuple[Any, ...]]
    """Each delivery's values for those columns, given the delivery and the landing time (UTC)."""


BROKER_LANDING = Landing(_broker_fields, lambda d, now: (d.redelivered, now))
"""AMQP and STOMP: ``redelivered`` (the broker's flag) and ``landed_at``."""
KAFKA_LANDING = Landing(landing_fields, landing_values)
"""Kafka: ``key``, ``topic``, ``partition``, ``offset``, ``timestamp`` (the record's, ms), ``headers``
(list of ``{key: string, value: binary}``, as Spark's Kafka source gives them) and ``landed_at``."""


@dataclass
class DrainStats:
    """What a drain has landed so far."""

    segments: int = 0
    """Segments landed in published files and acknowledged to the broker."""
    redelivered: int = 0
    """Segments the broker flagged as redelivered (landed like the others: the reassembly counts copies)."""
    files: int = 0
    """Parquet files published (renamed into the landing directory)."""
    bytes: int = 0
    """Bytes of segments (broker message bodies) landed in published files."""


class _OpenFile:
    """One landing file being written: a ParquetWriter on a hidden temporary path."""

    def __init__(self, landing: Path, opened: float, columns: Landing) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.schema = pa.schema([("segment", pa.binary()), *columns.fields()])
        self.columns = columns
        self.tmp = landing / f"{_TMP_PREFIX}{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:12]}.tmp"
        self.writer = pq.ParquetWriter(str(self.tmp), self.schema, compression="none")
        self.opened = opened
        self.deliveries: list[Delivery] = []
        self.bodies: list[bytes | memoryview] = []
        self.rows: list[tuple[Any, ...]] = []
        self.buffered = 0
        self.bytes = 0

    def add(self, d: Delivery, rolling: Rolling) -> None:
        self.deliveries.append(d)
        body = body_view(d)
        self.bodies.append(body)
        self.rows.append(self.columns.values(d, datetime.now(timezone.utc)))
        self.buffered += len(body)
        self.bytes += len(body)
        if self.buffered >= rolling.row_group_bytes:
            self._write()

    def _write(self) -> None:
        import pyarrow as pa

        if self.bodies:
            cols = [self.bodies, *(list(c) for c in zip(*self.rows, strict=True))]
            arrays = [pa.array(c, type=f.type) for c, f in zip(cols, self.schema, strict=True)]
            self.writer.write_table(pa.Table.from_arrays(arrays, schema=self.schema))
            self.bodies, self.rows, self.buffered = [], [], 0

    def publish(self, landing: Path) -> Path:
        """Close, fsync, rename into place, fsync the directory: the file is durable and visible."""
        self._write()
        self.writer.close()
        fd = os.open(self.tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
        final = landing / f"part-{stamp}-{uuid.uuid4().hex[:12]}.parquet"
        os.rename(self.tmp, final)
        dfd = os.open(landing, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        return final


def remove_orphans(landing: Path) -> int:
    """Delete temporary files of drains on this host that are no longer running (their segments
    were never acknowledged, so the broker redelivers them); another live drain's files stay.

    ``landing``: the landing directory.
    """
    host, removed = socket.gethostname(), 0
    # Exactly the names a drain writes: another host whose name starts with ours ("vm" and "vm-7")
    # or a stray file is left alone (a bad pid in a name stopped the drain from starting).
    ours = re.compile(rf"{re.escape(_TMP_PREFIX + host)}-([1-9][0-9]{{0,8}})-[0-9a-f]{{12}}\.tmp")
    for p in landing.glob(f"{_TMP_PREFIX}{host}-*.tmp"):
        match = ours.fullmatch(p.name)
        if match is None:
            continue
        pid = int(match[1])
        try:
            os.kill(pid, 0)
            continue  # alive (ours or another drain's)
        except ProcessLookupError:
            p.unlink(missing_ok=True)
            removed += 1
        except PermissionError:
            continue
    return removed


class Drain:
    """Moves deliveries from ``consumer`` into Parquet files under ``landing``.

    ``on_file(path, segments)`` is called once a file is durable and visible, before its batch
    is acknowledged (to notify a downstream job; if it raises, the batch is not acknowledged).
    ``columns``: what lands beside ``segment`` (:data:`BROKER_LANDING`, :data:`KAFKA_LANDING`).

    ``consumer``: the queue's consumer the deliveries come from. ``landing``: the directory the files are written to.
    ``rolling``: when a file is closed and a new one begun (None: the defaults of :class:`Rolling`). ``clock``: seconds,
    for the file's age limit.
    """

    def __init__(
        self,
        consumer: Consumer,
        landing: Path,
        rolling: Rolling | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_file: Callable[[Path, int], None] | None = None,
        columns: Landing = BROKER_LANDING,
    ) -> None:
        self.consumer = consumer
        self.columns = columns
        self.landing = landing
        self.rolling = rolling or Rolling()
        self.clock = clock
        self.on_file = on_file
        self.stats = DrainStats()
        self._file: _OpenFile | None = None
        landing.mkdir(parents=True, exist_ok=True)
        remove_orphans(landing)

    def run(self, stop: Callable[[], bool], *, idle_exit: float | None = None) -> DrainStats:
        """Drain until ``stop()`` (or ``idle_exit`` seconds without a delivery); the current file is
        finished and published before returning."""
        idle_since = self.clock()
        while not stop():
            f = self._file
            wait = 0.2 if f is None else max(0.0, min(0.2, f.opened + self.rolling.max_seconds - self.clock()))
            got = self.consumer.fetch(wait)
            now = self.clock()
            for d in got:
                self._add(d, now)
            if got:
                idle_since = now
            elif idle_exit is not None and now - idle_since >= idle_exit:
                break
            f = self._file
            if f is not None and now - f.opened >= self.rolling.max_seconds:
                self._publish()
        if self._file is not None:
            self._publish()
        return self.stats

    def _add(self, d: Delivery, now: float) -> None:
        r = self.rolling
        if self._file is None:
            self._file = _OpenFile(self.landing, now, self.columns)
        f = self._file
        f.add(d, r)
        self.stats.redelivered += d.redelivered
        if f.bytes >= r.max_bytes or len(f.deliveries) >= r.max_segments:
            self._publish()

    def publish(self) -> None:
        """Finish and publish the open file now, if there is one (a Kafka rebalance is about to
        take partitions away: what was read of them lands and is committed first)."""
        if self._file is not None:
            self._publish()

    def _publish(self) -> None:
        f, self._file = self._file, None
        assert f is not None
        path = f.publish(self.landing)
        if self.on_file is not None:
            self.on_file(path, len(f.deliveries))
        for d in f.deliveries:
            d.accept()
        self.stats.files += 1
        self.stats.segments += len(f.deliveries)
        self.stats.bytes += f.bytes

    def close(self) -> None:
        self.consumer.close()
