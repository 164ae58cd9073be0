"""The JVM side of the Spark path: routing keys, one aggregate per group, and the clean test.

Every input row lands in exactly one aggregated row, keyed by
``(header_ok, pk, bk)``:

* a message or MQ group (``pk`` = GroupId, ``bk`` NULL): its data concatenated
  in the JVM (``blob``, ordered by ``sk``) plus one small ``meta`` struct per row;
* one position of a large message (``bk`` = Offset): streamed to a file in Python;
* identical rows that are not segments at all (``header_ok`` false, ``pk`` a hash
  of the bytes): quarantined by the Python decoder with their exact reason.

``sk`` (MsgSeqNumber, Offset, then the header bytes) orders ``blob`` and
``meta`` identically, so Python can rebuild every original row as
``header || piece`` from one aggregated row (copies with equal keys have
identical headers, so which piece goes with which header does not matter).

:func:`clean` is deliberately narrow: a single message (not in an MQ group), no
codec, CRC-32/IEEE, every segment's checksum verified here, pieces contiguous
from offset 0 with exactly one LAST segment at the end, header fields that agree,
and the whole-message CRC of the concatenation equal to the declared one. Such a
message is complete by every rule of the Python assembler, so it is written
without leaving the JVM; anything else goes to the assembler itself, which is the
authority on what is wrong. Tests check both paths give identical rows.
"""

from __future__ import annotations

from typing import Any

# Per-row facts the clean test reads (all small); Python needs only sk and plen.
_META = (
    "sk",
    "plen",
    "data_ok",
    "is_last",
    "msg_flags",
    "codec",
    "algorithm",
    "msg_seq_number",
    "offset",
    "data_length",
    "stored_length",
    "original_length",
    "message_checksum",
    "length_deferred",
)


def route(decoded: Any, large_message_bytes: int | None) -> Any:
    """Add the keys, the sort key ``sk``, the ``piece`` of each row, and ``large``.

    ``large``: a message not in a group whose segments declare an OriginalLength above
    ``large_message_bytes`` or defer it (every segment says so: see the wire format's
    LENGTH_DEFERRED), so all its rows route alike without being gathered first.
    """
    from pyspark.sql import functions as F

    if large_message_bytes is None:
        large = F.lit(False)
    else:
        large = F.expr(f"header_ok AND NOT in_group AND (length_deferred OR original_length > {large_message_bytes})")
    return decoded.select(
        "*",
        large.alias("large"),
        F.expr("CASE WHEN header_ok THEN group_id ELSE CAST(CAST(xxhash64(raw) AS STRING) AS BINARY) END").alias("pk"),
        F.expr(
            "CASE WHEN header_ok THEN concat(substring(raw, 41, 4), substring(raw, 49, 8), "
            "substring(raw, 1, length(raw) - data_length)) ELSE X'' END"
        ).alias("sk"),
        F.expr("CASE WHEN header_ok THEN data ELSE raw END").alias("piece"),
    ).select(
        "*",
        F.when(F.col("large"), F.col("offset")).alias("bk"),
        F.expr("length(piece)").alias("plen"),
    )


def aggregate(routed: Any, partitions: int) -> Any:
    """One shuffle (by GroupId, so a group and a large message stay in one task), one aggregate."""
    from pyspark.sql import functions as F

    meta = ", ".join(_META)
    return (
        routed.repartition(partitions, "pk")
        .groupBy("header_ok", "pk", "bk")
        .agg(
            F.expr("listagg(piece, X'') WITHIN GROUP (ORDER BY sk)").alias("blob"),
            F.expr(f"array_sort(collect_list(struct({meta})))").alias("meta"),
        )
        .withColumn("n", F.size("meta"))
        .withColumn("last", F.expr("meta[n - 1]"))
    )


CLEAN = """coalesce(
  header_ok AND bk IS NULL
  AND forall(meta, m -> m.data_ok AND m.codec = 0 AND m.algorithm = 1 AND m.msg_flags & 24 = 0
      AND m.msg_seq_number = 1 AND m.length_deferred = last.length_deferred
      AND (m.stored_length IS NULL OR m.stored_length = last.stored_length)
      AND (m.original_length IS NULL OR m.original_length = last.original_length)
      AND (m.message_checksum IS NULL OR m.message_checksum = last.message_checksum))
  AND meta[0].offset = 0
  AND last.is_last
  AND forall(zip_with(slice(meta, 1, n - 1), slice(meta, 2, n - 1),
      (a, b) -> NOT a.is_last AND b.offset = a.offset + a.data_length), ok -> ok)
  AND crc32(blob) = last.message_checksum,
  false)"""


def clean_row() -> dict[str, str]:
    """SQL for each output column of a clean message (what the assembler would report for it)."""
    return {
        "kind": "'message'",
        "group_id": "pk",
        "msg_seq_number": "1",
        "status": "'complete'",
        "reason": "0",
        "reason_name": "'NONE'",
        "payload": "blob",
        "payload_path": "CAST(NULL AS STRING)",
        "stored_length": "last.stored_length",
        "original_length": "last.original_length",
        "message_checksum": "last.message_checksum",
        "missing_ranges": "CAST(array() AS array<struct<start:bigint,end:bigint>>)",
        "missing_seq_numbers": "CAST(array() AS array<int>)",
        "segments_used": "n",
        "duplicates": "0",
        "rejected": "0",
        "offset": "CAST(NULL AS BIGINT)",
        "detail": "CAST(NULL AS STRING)",
        "raw": "CAST(NULL AS BINARY)",
    }
