"""Dead letters: where a message goes after its last failed attempt, durably, before it is settled.

The runner writes a batch of :class:`~reassembly.runtime.DeadRecord` and settles them DEAD
only after :meth:`write` returned: the commit passes a dead message only once it is safe
elsewhere. A write that raises keeps the messages unsettled (the runner tries again).

* :class:`ParquetDeadLetter`: one Parquet file per batch in a folder, written like the drain's
  landing files and the quarantine's payload files: under a hidden temporary name, fsynced,
  renamed to ``part-<UTC time>-<id>.parquet``, the folder fsynced. One row per message (a
  unit-of-work group: one row per message of it, sharing the reason): the whole payload, the
  reason, attempts, GroupId, MsgSeqNumber and the positions of its segments (:data:`COLUMNS`).
* :class:`KafkaDeadLetter`: each message sent with the library's segmenting producer
  (:class:`~segmenter.brokers.KafkaSegmentProducer`) to a topic, with headers giving the reason,
  attempts, the original GroupId and MsgSeqNumber and the source positions; the GroupId of the
  dead-letter copy is derived from the original's (``group_id_for``), so writing it again after
  a crash produces the same segments, which a reassembling consumer counts as duplicates.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from collections.abc import Hashable, Iterator, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from reassembly._files import fsync_path
from reassembly.assembler import GroupComplete, MessageComplete, ScatteredPayload
from reassembly.assembler.bodies import StoredBody
from reassembly.runtime.base import DeadRecord
from segmenter.errors import Reason, SegmentationError

TMP_PREFIX = ".deadletter-"

# (name, Arrow type name, what it holds): built into a pyarrow schema when a file is written.
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("payload", "binary", "the whole message (NULL when it lives in a body store: see payload_location)"),
    ("payload_location", "string", "where a stored body lives (FileBodyStore), else NULL"),
    ("group_id", "binary", "GroupId"),
    ("msg_seq_number", "int32", "MsgSeqNumber"),
    ("msg_flags", "int32", "MsgFlags"),
    ("reason", "string", "the last failure: exception type and text"),
    ("error_type", "string", "the exception's type name"),
    ("attempts", "int32", "hand-outs that failed"),
    ("ordering_key", "string", "the group the dispatcher serialized it under (repr)"),
    ("positions", "string", "JSON list of [partition, offset] of every segment it was built from"),
    ("dead_at", "timestamp[us, UTC]", "when it was written here"),
)


def _payload(message: MessageComplete) -> tuple[bytes | None, str | None]:
    p = message.payload
    if isinstance(p, StoredBody):
        return None, p.location
    if isinstance(p, ScatteredPayload):
        return bytes(p), None
    return bytes(p), None


def _members(message: object) -> Iterator[MessageComplete | None]:
    if isinstance(message, GroupComplete):
        yield from message.messages
    elif isinstance(message, MessageComplete):
        yield message
    else:
        yield None


def positions_json(positions: Sequence[tuple[Hashable, int]]) -> str:
    """Positions as JSON: a Kafka ``(topic, partition)`` becomes ``["topic", partition]``."""

    def plain(x: Any) -> Any:
        if isinstance(x, tuple):
            return [plain(v) for v in x]
        return x if isinstance(x, str | int | float | bool) or x is None else repr(x)

    return json.dumps([[plain(p), o] for p, o in positions], separators=(",", ":"))


class ParquetDeadLetter:
    """Dead messages as Parquet files in ``folder`` (created if missing); :data:`COLUMNS`."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.files: list[Path] = []
        self.rows = 0

    def rows_of(self, records: Sequence[DeadRecord]) -> list[dict[str, Any]]:
        now = datetime.now(timezone.utc)
        rows = []
        for rec in records:
            for m in _members(rec.work.message):
                if m is None:  # not an assembler message (an Offered object of the caller's)
                    raw = rec.work.message
                    payload = bytes(raw) if isinstance(raw, bytes | bytearray | memoryview) else None
                    location, gid, seq, flags = None, None, None, None
                else:
                    (payload, location), gid, seq, flags = _payload(m), m.group_id, m.msg_seq_number, m.msg_flags
                rows.append(
                    {
                        "payload": payload,
                        "payload_location": location,
                        "group_id": gid,
                        "msg_seq_number": seq,
                        "msg_flags": flags,
                        "reason": str(rec.failure),
                        "error_type": rec.failure.kind,
                        "attempts": rec.attempts,
                        "ordering_key": repr(rec.work.group),
                        "positions": positions_json(rec.work.positions),
                        "dead_at": now,
                    }
                )
        return rows

    def write(self, records: Sequence[DeadRecord]) -> None:
        """One file for the batch, durable and visible when this returns.

        ``records``: the dead messages of the batch.
        """
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not records:
            return
        rows = self.rows_of(records)
        schema = pa.schema([(name, _arrow(kind)) for name, kind, _doc in COLUMNS])
        table = pa.Table.from_pylist(rows, schema=schema)
        tmp = self.folder / f"{TMP_PREFIX}{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:12]}.tmp"
        try:
            pq.write_table(table, str(tmp), compression="zstd")
            fsync_path(tmp)
            stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
            final = self.folder / f"part-{stamp}-{uuid.uuid4().hex[:12]}.parquet"
            os.rename(tmp, final)
            fsync_path(self.folder)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self.files.append(final)
        self.rows += len(rows)

    def close(self) -> None:
        """Nothing to flush: every batch is durable once written."""


def _arrow(kind: str) -> Any:
    import pyarrow as pa

    if kind.startswith("timestamp"):
        return pa.timestamp("us", tz="UTC")
    return {"binary": pa.binary(), "string": pa.string(), "int32": pa.int32()}[kind]


def read_dead_letters(folder: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every row of a :class:`ParquetDeadLetter` folder, oldest file first (temporary files skipped).

    ``folder``: the dead-letter folder.
    """
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = []
    for f in sorted(Path(folder).glob("part-*.parquet")):
        rows.extend(pq.read_table(f).to_pylist())
    return rows


class KafkaDeadLetter:
    """Dead messages segmented into ``topic`` with the library's Kafka producer.

    ``config``: confluent-kafka producer settings (``bootstrap.servers``, security, ...);
    ``producer_options``: passed to :class:`~segmenter.brokers.KafkaSegmentProducer` (e.g.
    ``max_record_bytes``). Headers on every segment record: ``dead-reason``, ``dead-error-type``,
    ``dead-attempts``, ``dead-group-id`` (hex), ``dead-msg-seq-number``, ``dead-positions`` (JSON),
    ``dead-ordering-key``. ``timeout``: how long a batch may take to be acknowledged.
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        topic: str,
        *,
        timeout: float = 30.0,
        producer_options: Mapping[str, Any] | None = None,
    ) -> None:
        from segmenter.brokers.kafka import KafkaSegmentProducer

        self.topic = topic
        self.timeout = timeout
        self.producer = KafkaSegmentProducer(topic, config, **dict(producer_options or {}))
        self.sent = 0

    def write(self, records: Sequence[DeadRecord]) -> None:
        """Send every message of the batch; return once each segment is acknowledged (raise if not).

        ``records``: the dead messages of the batch.
        """
        from segmenter.brokers.kafka import group_id_for

        handles = []
        for rec in records:
            for m in _members(rec.work.message):
                if m is None:
                    raw = rec.work.message
                    if not isinstance(raw, bytes | bytearray | memoryview):
                        raise SegmentationError(
                            f"dead letter: {type(raw).__name__} is not a message the producer can send",
                            reason=Reason.ARGUMENT_ERROR,
                        )
                    payload: Any = bytes(raw)
                    gid, seq = b"", 0
                else:
                    body, location = _payload(m)
                    payload = Path(location) if body is None and location is not None else body
                    gid, seq = m.group_id, m.msg_seq_number
                headers = [
                    ("dead-reason", str(rec.failure)[:2000]),
                    ("dead-error-type", rec.failure.kind),
                    ("dead-attempts", str(rec.attempts)),
                    ("dead-group-id", gid.hex()),
                    ("dead-msg-seq-number", str(seq)),
                    ("dead-positions", positions_json(rec.work.positions)),
                    ("dead-ordering-key", repr(rec.work.group)[:500]),
                ]
                msg_id = f"dead:{gid.hex()}:{seq}:{positions_json(rec.work.positions)}"
                handles.append(self.producer.send(payload, group_id=group_id_for(msg_id), headers=headers))
        for h in handles:
            h.wait(self.timeout)
        self.sent += len(handles)

    def close(self) -> None:
        self.producer.close()
