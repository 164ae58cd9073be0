"""The output schema of every Spark job of ours: the one place it is defined, versioned.

``messages`` (:data:`MESSAGE_SCHEMA`) and ``quarantine`` (:data:`QUARANTINE_SCHEMA`) are what
``result.messages``, ``result.quarantine``, the folders ``reassemble run`` and
:meth:`~reassembly.spark.batch.pipeline.ReassemblyResult.save` write, and the streaming job's committed
``messages`` / ``quarantine`` batches hold: exactly these columns, in this order, plus ``sources``
(messages) / ``source`` (quarantine) when input columns are kept (lineage: see
:func:`lineage_fields`). Each column carries a one-line description: ``docs/reference/output-schema.md``
is generated from them (:func:`markdown_tables`; a test checks the page lists exactly these
columns in this order).

:data:`SCHEMA_VERSION` changes whenever a column is added, removed, renamed, retyped, reordered or
changes meaning; ``save()`` records it in ``OUTPUT/_reassembly.json`` (:data:`MANIFEST`), beside
the folders, so a reader knows the layout without reading a row.

Inside the jobs, both kinds travel as one combined row (:data:`OUTPUT_FIELDS`, ``kind`` saying
which); nothing written or returned to a user has the combined columns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

SCHEMA_VERSION = 2
MANIFEST = "_reassembly.json"  # beside OUTPUT/messages and OUTPUT/quarantine: the schema version and columns


@dataclass(frozen=True)
class Column:
    """One output column: its name, Spark DDL type, Arrow type, and what it says."""

    name: str
    ddl: str
    arrow: pa.DataType
    doc: str


_RANGE = pa.struct([("start", pa.int64()), ("end", pa.int64())])
_RANGES_DDL = "array<struct<start:bigint,end:bigint>>"


def _c(name: str, ddl: str, arrow: pa.DataType, doc: str) -> Column:
    return Column(name, ddl, arrow, doc)


_GROUP_ID = _c("group_id", "binary", pa.binary(), "GroupId (24 bytes) of the message or MQ group")
_SEQ = _c("msg_seq_number", "int", pa.int32(), "MsgSeqNumber: the message's place in its MQ group (1 for a lone one)")
_REASON = _c("reason", "int", pa.int32(), "MQ-style reason code (0 for complete; 2242, 2241, 9001, ...)")
_REASON_NAME = _c("reason_name", "string", pa.string(), "the reason code's name (NONE, INCOMPLETE_MSG, ...)")

MESSAGE_SCHEMA: tuple[Column, ...] = (
    _GROUP_ID,
    _SEQ,
    _c(
        "status",
        "string",
        pa.string(),
        "complete, incomplete, corrupt, conflict, invalid, group_failed or too_big (see the status table)",
    ),
    _REASON,
    _REASON_NAME,
    _c("detail", "string", pa.string(), "what went wrong, in one line fitting the case (NULL when complete)"),
    _c("payload", "binary", pa.binary(), "the verified message bytes (complete only; NULL when in payload_path)"),
    _c("payload_path", "string", pa.string(), "file holding the message, relative to the payload directory"),
    _c("stored_length", "bigint", pa.int64(), "bytes as stored (compressed) in the segments, where declared"),
    _c("original_length", "bigint", pa.int64(), "bytes of the original message, where any header declared it"),
    _c("message_checksum", "bigint", pa.int64(), "the verified whole-message checksum (complete only)"),
    _c(
        "missing_ranges",
        _RANGES_DDL,
        pa.list_(_RANGE),
        "[start, end) byte ranges not received (end NULL: unknown); offsets as missing_ranges_basis says",
    ),
    _c(
        "missing_ranges_basis",
        "string",
        pa.string(),
        "what missing_ranges' offsets count: original (no codec) or stored (compressed bytes); NULL: no ranges",
    ),
    _c(
        "missing_seq_numbers",
        "array<int>",
        pa.list_(pa.int32()),
        "MQ group: MsgSeqNumbers of which nothing arrived (the lowest 1,000)",
    ),
    _c(
        "last_seq_number",
        "int",
        pa.int32(),
        "MQ group: its last MsgSeqNumber, where a segment flagged LAST_MSG_IN_GROUP was seen (NULL: unknown)",
    ),
    _c("segments_used", "int", pa.int32(), "landing rows used to build it (complete only)"),
    _c("duplicates", "int", pa.int32(), "identical copies of its segments counted and ignored"),
    _c("rejected", "int", pa.int32(), "its segments quarantined (one quarantine row each)"),
)

QUARANTINE_SCHEMA: tuple[Column, ...] = (
    _c("raw", "binary", pa.binary(), "the landing row's value exactly (NULL for a NULL row or when raw_path is set)"),
    _c("group_id", "binary", pa.binary(), "GroupId, where the header could be read"),
    _c("msg_seq_number", "int", pa.int32(), "MsgSeqNumber, where the header could be read"),
    _c("offset", "bigint", pa.int64(), "the segment's Offset, where the header could be read"),
    _REASON,
    _REASON_NAME,
    _c("detail", "string", pa.string(), "why, in one line"),
    _c("raw_path", "string", pa.string(), "by reference: file holding the original bytes, relative to payload_dir"),
    _c("raw_offset", "bigint", pa.int64(), "by reference: where in raw_path the bytes start"),
    _c("raw_length", "bigint", pa.int64(), "by reference: how many bytes"),
)

# The streaming job's third folder: an identical copy of a segment whose message already left.
DUPLICATE_SCHEMA: tuple[Column, ...] = (
    _GROUP_ID,
    _SEQ,
    _c("offset", "bigint", pa.int64(), "the copy's Offset"),
    _REASON,
    _REASON_NAME,
    _c("detail", "string", pa.string(), "identical copy of a segment already delivered"),
)

SOURCES_DOC = (
    "present when input columns are kept: the kept columns of each landing row used, one struct per"
    " segment used, in offset order (duplicates are counted in duplicates, not listed)"
)
SOURCE_DOC = "present when input columns are kept: the kept columns of the landing row this is, unchanged"

MESSAGE_COLUMNS = tuple(c.name for c in MESSAGE_SCHEMA)
QUARANTINE_COLUMNS = tuple(c.name for c in QUARANTINE_SCHEMA)
DUPLICATE_COLUMNS = tuple(c.name for c in DUPLICATE_SCHEMA)

# One combined row inside the jobs: ``kind`` ("message" or "quarantine"), then every column of
# both kinds once (the message columns in their order, then the quarantine-only ones).
_COMBINED = {c.name: c for c in (*MESSAGE_SCHEMA, *QUARANTINE_SCHEMA)}
OUTPUT_FIELDS: tuple[tuple[str, str, pa.DataType], ...] = (
    ("kind", "string", pa.string()),
    *((c.name, c.ddl, c.arrow) for c in _COMBINED.values()),
)
OUTPUT_DDL = ", ".join(f"{name} {ddl}" for name, ddl, _ in OUTPUT_FIELDS)
OUTPUT_ARROW = pa.schema([(name, arrow) for name, _, arrow in OUTPUT_FIELDS])
MESSAGE_ARROW = pa.schema([(c.name, c.arrow) for c in MESSAGE_SCHEMA])
QUARANTINE_ARROW = pa.schema([(c.name, c.arrow) for c in QUARANTINE_SCHEMA])

SOURCES, SOURCE = "sources", "source"  # the lineage columns (present when columns are kept)


def lineage_arrow(schema: pa.Schema, src: pa.DataType | None, column: str) -> pa.Schema:
    """``schema`` plus the lineage column ``column`` (``sources`` or ``source``): kept columns, Arrow type ``src``."""
    if src is None:
        return schema
    return schema.append(pa.field(column, pa.list_(src) if column == SOURCES else src))


def combined_arrow(src: pa.DataType | None) -> pa.Schema:
    """:data:`OUTPUT_ARROW`, plus ``sources`` and ``source`` when columns are kept (``src``: their Arrow struct)."""
    return lineage_arrow(lineage_arrow(OUTPUT_ARROW, src, SOURCES), src, SOURCE)


def spark_type(ddl: str) -> Any:
    """The pyspark type of one of our DDL strings (built here: parsing DDL would ask the JVM)."""
    from pyspark.sql import types as T

    simple = {
        "string": T.StringType(),
        "binary": T.BinaryType(),
        "int": T.IntegerType(),
        "bigint": T.LongType(),
        "array<int>": T.ArrayType(T.IntegerType()),
        _RANGES_DDL: T.ArrayType(
            T.StructType([T.StructField("start", T.LongType()), T.StructField("end", T.LongType())])
        ),
    }
    return simple[ddl]


def spark_schema(columns: tuple[tuple[str, str], ...], src: Any = None, lineage: str | None = None) -> Any:
    """A pyspark StructType of (name, ddl) pairs, plus the lineage column ``lineage`` of kept
    columns (``src``: their StructType) when given."""
    from pyspark.sql import types as T

    fields = [T.StructField(name, spark_type(ddl)) for name, ddl in columns]
    if src is not None and lineage is not None:
        fields.append(T.StructField(lineage, T.ArrayType(src) if lineage == SOURCES else src))
    return T.StructType(fields)


def combined_spark(src: Any = None) -> Any:
    """The combined row as a pyspark StructType (plus ``sources`` and ``source`` when ``src`` is given)."""
    from pyspark.sql import types as T

    schema = spark_schema(tuple((n, d) for n, d, _ in OUTPUT_FIELDS))
    if src is not None:
        schema = T.StructType([*schema.fields, T.StructField(SOURCES, T.ArrayType(src)), T.StructField(SOURCE, src)])
    return schema


def message_columns(kept: bool) -> tuple[str, ...]:
    """The ``messages`` columns, in order (``sources`` last when columns are kept)."""
    return (*MESSAGE_COLUMNS, SOURCES) if kept else MESSAGE_COLUMNS


def quarantine_columns(kept: bool) -> tuple[str, ...]:
    """The ``quarantine`` columns, in order (``source`` last when columns are kept)."""
    return (*QUARANTINE_COLUMNS, SOURCE) if kept else QUARANTINE_COLUMNS


def folder_columns(kind: str, kept: bool) -> tuple[str, ...]:
    """The columns of the folder of rows of ``kind`` (``message``, ``quarantine``, ``duplicate``)."""
    if kind == "message":
        return message_columns(kept)
    if kind == "quarantine":
        return quarantine_columns(kept)
    return (*DUPLICATE_COLUMNS, SOURCE) if kept else DUPLICATE_COLUMNS


def manifest(keep_columns: tuple[str, ...]) -> dict[str, Any]:
    """What ``save()`` records beside the folders: the schema version and each folder's columns."""
    kept = bool(keep_columns)
    return {
        "schema_version": SCHEMA_VERSION,
        "messages": list(message_columns(kept)),
        "quarantine": list(quarantine_columns(kept)),
        "keep_columns": list(keep_columns),
    }


def markdown_tables() -> str:
    """The two column tables of ``docs/reference/output-schema.md`` (generated from this module)."""
    lines = []
    for title, cols, extra in (
        ("messages", MESSAGE_SCHEMA, (SOURCES, "array<struct<kept columns>>", SOURCES_DOC)),
        ("quarantine", QUARANTINE_SCHEMA, (SOURCE, "struct<kept columns>", SOURCE_DOC)),
    ):
        lines += [f"### `{title}`", "", "| # | column | type | meaning |", "|---|---|---|---|"]
        for i, c in enumerate(cols, 1):
            lines.append(f"| {i} | `{c.name}` | `{c.ddl}` | {c.doc} |")
        lines.append(f"| {len(cols) + 1} | `{extra[0]}` | `{extra[1]}` | {extra[2]} |")
        lines.append("")
    return "\n".join(lines)


@dataclass(frozen=True)
class ColumnNames:
    """Names of the input columns when segments arrive as columns instead of encoded bytes."""

    group_id: str = "group_id"
    """The column of each segment's 24-byte GroupId (binary)."""
    msg_seq_number: str = "msg_seq_number"
    """The column of its MsgSeqNumber, the message's number within its group (integer)."""
    offset: str = "offset"
    """The column of its Offset: where its data starts in the message (integer)."""
    msg_flags: str = "msg_flags"
    """The column of its MsgFlags (integer: the last-segment and last-message bits)."""
    original_length: str = "original_length"
    """The column of the message's declared length before any codec (integer)."""
    stored_length: str | None = None
    """The column of the message's stored length after its codec (integer); None: equal to
    ``original_length`` (no codec)."""
    data_checksum: str = "data_checksum"
    """The column of the checksum of the segment's data (integer)."""
    message_checksum: str = "message_checksum"
    """The column of the whole message's checksum (integer; NULL where a segment does not carry it)."""
    data: str = "data"
    """The column of the segment's data bytes (binary)."""
    codec: str | None = None
    """The column of the codec id (integer); None: no codec."""
    algorithm: str | None = None
    """The column of the checksum algorithm id (integer); None: CRC-32/IEEE."""
