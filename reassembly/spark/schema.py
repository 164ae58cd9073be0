"""Output schemas of the Spark functions, in Spark DDL and in Arrow (they must match exactly)."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

_RANGE = pa.struct([("start", pa.int64()), ("end", pa.int64())])

# One combined schema: ``kind`` is "message" or "quarantine". The pipeline computes
# both kinds in one pass; ``messages`` and ``quarantine`` are projections of it.
OUTPUT_FIELDS: tuple[tuple[str, str, pa.DataType], ...] = (
    ("kind", "string", pa.string()),
    ("group_id", "binary", pa.binary()),
    ("msg_seq_number", "int", pa.int32()),
    ("status", "string", pa.string()),
    ("reason", "int", pa.int32()),
    ("reason_name", "string", pa.string()),
    ("payload", "binary", pa.binary()),
    ("payload_path", "string", pa.string()),
    ("stored_length", "bigint", pa.int64()),
    ("original_length", "bigint", pa.int64()),
    ("message_checksum", "bigint", pa.int64()),
    ("missing_ranges", "array<struct<start:bigint,end:bigint>>", pa.list_(_RANGE)),
    ("missing_seq_numbers", "array<int>", pa.list_(pa.int32())),
    ("segments_used", "int", pa.int32()),
    ("duplicates", "int", pa.int32()),
    ("rejected", "int", pa.int32()),
    ("offset", "bigint", pa.int64()),
    ("detail", "string", pa.string()),
    ("raw", "binary", pa.binary()),
    # A quarantined segment left by reference (``raw`` NULL): its original bytes are the
    # ``raw_length`` bytes at ``raw_offset`` of the file ``raw_path`` (relative to payload_dir).
    ("raw_path", "string", pa.string()),
    ("raw_offset", "bigint", pa.int64()),
    ("raw_length", "bigint", pa.int64()),
)
OUTPUT_DDL = ", ".join(f"{name} {ddl}" for name, ddl, _ in OUTPUT_FIELDS)
OUTPUT_ARROW = pa.schema([(name, arrow) for name, _, arrow in OUTPUT_FIELDS])

MESSAGE_COLUMNS = (
    "group_id",
    "msg_seq_number",
    "status",
    "reason",
    "reason_name",
    "payload",
    "payload_path",
    "stored_length",
    "original_length",
    "message_checksum",
    "missing_ranges",
    "missing_seq_numbers",
    "segments_used",
    "duplicates",
    "rejected",
)

QUARANTINE_COLUMNS = (
    "raw",
    "group_id",
    "msg_seq_number",
    "offset",
    "reason",
    "reason_name",
    "detail",
    "raw_path",
    "raw_offset",
    "raw_length",
)


@dataclass(frozen=True)
class ColumnNames:
    """Names of the input columns when segments arrive as columns instead of encoded bytes."""

    group_id: str = "group_id"
    msg_seq_number: str = "msg_seq_number"
    offset: str = "offset"
    msg_flags: str = "msg_flags"
    original_length: str = "original_length"
    stored_length: str | None = None  # None: equal to original_length (no codec)
    data_checksum: str = "data_checksum"
    message_checksum: str = "message_checksum"
    data: str = "data"
    codec: str | None = None  # None: no codec
    algorithm: str | None = None  # None: CRC-32/IEEE
