"""Decode encoded segments into columns inside the JVM (Spark SQL), without a Python round trip.

The header is big-endian so ``conv(hex(substring(...)), 16, 10)`` reads it,
and its checksum is CRC-32/IEEE so Spark's ``crc32`` verifies it. These checks
only *route* rows: a row that fails any of them goes to the Python decoder,
which is the authority on the exact reason.
"""

from __future__ import annotations

from typing import Any

from segmenter.wire import HEADER_LENGTH, MAX_HEADER_LENGTH, MAX_SEQ_NUMBER

_HL = "hl"  # helper column: the declared header length


def _uint(raw: str, start: int, size: int) -> str:
    """Unsigned big-endian integer at 0-based ``start``; NULL if it does not fit a signed 64-bit long."""
    return f"try_cast(conv(hex(substring({raw}, {start + 1}, {size})), 16, 10) AS BIGINT)"


def decode_segments(df: Any, raw_column: str = "segment", max_message_size: int = (1 << 63) - 1) -> Any:
    """Add one column per header field, ``data``, and the routing flags ``header_ok`` / ``data_ok``.

    ``raw`` keeps the original bytes. Rows are never dropped: a row that is not
    a valid segment has ``header_ok = false``. ``data_ok`` is true/false for
    CRC-32/IEEE segments (verified here) and NULL for CRC-32C (verified in Python).
    """
    from pyspark.sql import functions as F

    r = "raw"
    d = df.select(F.col(raw_column).alias(r))
    d = d.withColumn(_HL, F.expr(_uint(r, 8, 2)))
    fields = {
        "magic_ok": f"substring({r}, 1, 4) = X'53474D54'",
        "version": _uint(r, 4, 1),
        "algorithm": _uint(r, 5, 1),
        "codec": _uint(r, 6, 1),
        "header_flags": _uint(r, 7, 1),
        "reserved": _uint(r, 10, 2),
        "msg_flags": _uint(r, 12, 4),
        "group_id": f"substring({r}, 17, 24)",
        "msg_seq_number": f"try_cast({_uint(r, 40, 4)} AS INT)",
        "data_length": _uint(r, 44, 4),
        "offset": _uint(r, 48, 8),
        "original_length": _uint(r, 56, 8),
        "stored_length": _uint(r, 64, 8),
        "data_checksum": _uint(r, 72, 4),
        "message_checksum_field": _uint(r, 76, 4),
        "header_checksum": f"try_cast(conv(hex(substring({r}, {_HL} - 3, 4)), 16, 10) AS BIGINT)",
        "header_checksum_actual": f"crc32(substring({r}, 1, {_HL} - 4))",
    }
    for name, expr in fields.items():
        d = d.withColumn(name, F.expr(expr))
    d = d.withColumn("data", F.expr(f"substring({r}, {_HL} + 1, length({r}) - {_HL})"))
    d = d.withColumn("message_checksum", F.expr("CASE WHEN header_flags & 1 = 1 THEN message_checksum_field END"))
    d = d.withColumn("length_deferred", F.expr("header_flags & 2 = 2"))
    last = "(msg_flags & 4 = 4 OR msg_flags & 2 = 0)"
    ok = " AND ".join(
        [
            f"length({r}) >= {HEADER_LENGTH}",
            "magic_ok",
            "version = 1",
            f"{_HL} BETWEEN {HEADER_LENGTH} AND {MAX_HEADER_LENGTH}",
            f"length({r}) >= {_HL}",
            "header_checksum = header_checksum_actual",
            "reserved = 0",
            "header_flags & 252 = 0",
            "(length_deferred OR original_length IS NOT NULL)",
            "algorithm IN (1, 2)",
            "codec IN (0, 1)",
            f"msg_seq_number BETWEEN 1 AND {MAX_SEQ_NUMBER}",
            "msg_flags & ~31 = 0",
            f"length({r}) - {_HL} = data_length",
            "offset IS NOT NULL",
            "try_add(offset, data_length) IS NOT NULL",  # the end fits a signed 64-bit integer
            # NULL lengths mean "not known" only for 2^64-1; any other value above 2^63-1 is too big
            f"(original_length IS NOT NULL OR substring({r}, 57, 8) = X'FFFFFFFFFFFFFFFF')",
            f"(stored_length IS NOT NULL OR substring({r}, 65, 8) = X'FFFFFFFFFFFFFFFF')",
            "(msg_flags & 6 != 0 OR offset = 0)",
            f"(data_length > 0 OR {last})",
            f"(original_length IS NULL OR original_length <= {max_message_size})",
            f"(stored_length IS NULL OR stored_length <= {max_message_size})",
            "(stored_length IS NULL OR try_add(offset, data_length) <= stored_length)",
            f"(NOT {last} OR (stored_length = try_add(offset, data_length) AND original_length IS NOT NULL"
            " AND message_checksum IS NOT NULL))",
            "(codec != 0 OR original_length IS NULL OR stored_length IS NULL OR original_length = stored_length)",
        ]
    )
    d = d.withColumn("header_ok", F.coalesce(F.expr(ok), F.lit(False)))
    d = d.withColumn(
        "data_ok",
        F.expr("CASE WHEN NOT header_ok THEN false WHEN algorithm = 1 THEN crc32(data) = data_checksum END"),
    )
    d = d.withColumn("is_last", F.expr(f"header_ok AND {last}"))
    d = d.withColumn("in_group", F.expr("msg_flags & 24 != 0"))
    return d.drop(_HL, "magic_ok", "message_checksum_field", "header_checksum_actual", "reserved")
