"""Decode encoded segments into columns inside the JVM (Spark SQL), without a Python round trip.

Every expression here is generated from :mod:`segmenter.header_table`, the table
the Python decoder is generated from too: field offsets, widths, the derived
values and the rules. The header is big-endian so ``conv(hex(substring(...)))``
reads it, and its checksum is CRC-32/IEEE so Spark's ``crc32`` verifies it.
"""

from __future__ import annotations

from typing import Any

from reassembly.spark.engine.bridge import SRC
from segmenter import header_render
from segmenter import header_table as table
from segmenter.checksum import ChecksumAlgorithm
from segmenter.wire import DEFAULT_MAX_SEGMENT_SIZE, MAX_HEADER_LENGTH, MAX_LENGTH, table_constants

_TYPES = {"msg_seq_number": "INT"}  # output column types other than BIGINT


def routable_sql(env: dict[str, Any]) -> str:
    """Framing rules only: a row passing them has a GroupId that can be trusted for routing."""
    return header_render.sql_rules(table.ROUTING_STAGES, env, {"max_header_length": MAX_HEADER_LENGTH})


def decode_segments(
    df: Any,
    raw_column: str = "segment",
    max_message_size: int = MAX_LENGTH,
    max_segment_size: int | None = None,
    keep: tuple[str, ...] = (),
) -> Any:
    """Add one column per header field, ``data``, and the flags ``routable`` / ``header_ok`` / ``data_ok``.

    ``raw`` keeps the original bytes. Rows are never dropped (NULL rows included). ``keep``: input
    columns carried along unchanged, as one struct column ``src`` (lineage).
    ``routable``: the framing holds (magic, version, header length, header checksum).
    ``header_ok``: every rule of the table holds (``decode_segment`` with ``verify=False``
    would accept the row). ``data_ok`` is true/false for CRC-32/IEEE segments (verified
    here) and NULL for CRC-32C (verified in Python). Lengths above 2^63-1 (the unknown
    length 2^64-1 included) read as NULL.

    ``df``: the input DataFrame. ``raw_column``: its binary column of encoded segments. ``max_message_size``: the
    largest message a header may declare, in bytes. ``max_segment_size``: the largest segment accepted, in bytes (None:
    segment sizes are not checked).
    """
    from pyspark.sql import functions as F

    env = table_constants()
    fields = header_render.sql_fields("raw")
    ints = [f.name for f in table.FIELDS if f.kind == "int"]
    src = [F.struct(*[F.col(f"`{k}`") for k in keep]).alias(SRC)] if keep else []
    d = df.select(F.col(raw_column).cast("binary").alias("raw"), *src)  # a string column: its UTF-8 bytes
    d = d.select("raw", *([SRC] if keep else []), F.expr(fields["header_length"]).alias("header_length"))
    exact = [F.expr(sql).alias(name) for name, sql in fields.items() if name != "header_length"]
    d = d.select("*", *exact)
    d = d.select("*", *[F.expr(sql).alias(name) for name, sql in header_render.sql_derived(env).items()])
    params = {
        "max_message_size": max_message_size,
        "max_header_length": MAX_HEADER_LENGTH,
        "max_segment_size": DEFAULT_MAX_SEGMENT_SIZE if max_segment_size is None else max_segment_size,
    }
    stages = [s for s in dict.fromkeys(r.stage for r in table.RULES) if s != "segment" or max_segment_size]
    crc32 = int(ChecksumAlgorithm.CRC32)
    plain = [f.name for f in table.FIELDS if f.name != "message_checksum"]
    out = [
        "raw",
        *([SRC] if keep else []),
        *[F.expr(f"try_cast(`{c}` AS {_TYPES.get(c, 'BIGINT')})").alias(c) if c in ints else c for c in plain],
        F.expr("CASE WHEN has_message_checksum THEN message_checksum END").alias("message_checksum"),
        F.expr("try_cast(`end` AS BIGINT)").alias("end"),
        "length_deferred",
        "last",
        "in_group",
        F.expr("substring(raw, header_length + 1)").alias("data"),
        F.coalesce(F.expr(routable_sql(env)), F.lit(False)).alias("routable"),
        F.coalesce(F.expr(header_render.sql_rules(stages, env, params)), F.lit(False)).alias("header_ok"),
    ]
    d = d.select(*out)
    data_ok = f"CASE WHEN NOT header_ok THEN false WHEN algorithm = {crc32} THEN crc32(data) = data_checksum END"
    return d.select(
        "*",
        F.expr(data_ok).alias("data_ok"),
        F.expr("header_ok AND last").alias("is_last"),
    )
