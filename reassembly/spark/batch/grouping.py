"""Grouping each message's rows in Spark: routing keys, one aggregate per message, and the clean test.

Routing reads only what can be trusted. A *routable* row (its framing holds:
magic, version, header length, header checksum; see ``segmenter.header_table``)
goes by its GroupId, whatever else its header claims; every other row (NULL
included) by a hash of its bytes, to be quarantined by the Python decoder with
its exact reason. No other rule decides routing: a too-big, badly flagged or
inconsistent segment reaches its message's aggregate and the assembler judges it
there, so one (GroupId, MsgSeqNumber) can never be split into two outcomes.

Aggregates are keyed by ``(routable, pk, bk)``:

* the main aggregate of a message or MQ group (``pk`` = GroupId, ``bk`` NULL):
  its data concatenated in the JVM (``blob``, ordered by ``sk``) plus one small
  ``meta`` struct per row;
* with ``payload_dir`` set, a row whose Offset is at or beyond
  ``large_message_bytes`` is *far*: it is emitted twice (an ``explode`` of a
  two-element int array, never of the payload), once into the main aggregate
  without its piece (its meta only) and once into a per-offset aggregate
  (``bk`` = the Offset bytes) carrying the piece. Both hash by ``pk`` so they
  land in one task. The split goes by offset, not by a declared length
  (declared lengths are forgeable): an aggregate value holds at most the pieces
  below the threshold (plus copies of them) whatever the headers say.

``sk`` (MsgSeqNumber, Offset, then the header bytes) orders ``blob`` and
``meta`` identically, so Python rebuilds every original row as
``header || piece`` from one aggregated row.

:func:`clean` is deliberately narrow: every row passes every rule of the header
table (the ``header_ok`` column, generated from the table with the same limits
as the assembler), a single message (not in an MQ group) with no far row and,
with ``payload_dir`` set, one the assembler keeps in memory (:func:`held_inline`:
length known, at most ``large_message_bytes``; a longer one is a file), no
codec, CRC-32/IEEE with every segment's checksum verified here, pieces
contiguous from offset 0 with exactly one LAST segment at the end, header fields
that agree, and the whole-message CRC of the concatenation equal to the declared
one, and the digests of the last header's extension verified with Spark's
``sha2`` (:func:`segmenter.digest.verify_sql`: SHA-256, and HMAC-SHA-256 under
the policy's keys) with what the policy demands present. Such a message is
complete by every rule of the Python assembler, so it is written without
leaving the JVM; anything else goes to the assembler itself.
"""

from __future__ import annotations

from typing import Any

from reassembly.spark.engine.bridge import META, SK_HEADER, SRC, row_ok
from segmenter import header_table as table
from segmenter.digest import DigestPolicy, verify_sql

_SEQ, _OFFSET = table.FIELD["msg_seq_number"], table.FIELD["offset"]


def _bytes_of(field: table.Field) -> str:
    return f"substring(raw, {field.offset + 1}, {field.width})"


def route(decoded: Any, large_message_bytes: int | None) -> Any:
    """Add the keys ``pk`` / ``bk``, the sort key ``sk``, each row's ``piece``, ``far`` and ``null``.

    Far rows (offset at or past ``large_message_bytes``) come out twice: see the module doc.
    """
    from pyspark.sql import functions as F

    if large_message_bytes is None:
        far = F.lit(False)
    else:  # an offset too large for a long (NULL) is far too
        far = F.expr(f"routable AND coalesce(offset >= {large_message_bytes}, true)")
    routed = decoded.select(
        "*",
        far.alias("far"),
        F.expr("raw IS NULL").alias("is_null"),
        F.expr("CASE WHEN routable THEN group_id ELSE CAST(CAST(xxhash64(raw) AS STRING) AS BINARY) END").alias("pk"),
        # Rows that are not routable are ordered by their bytes: two rows whose hashes collide stay in step.
        F.expr(
            f"CASE WHEN routable THEN concat({_bytes_of(_SEQ)}, {_bytes_of(_OFFSET)}, substring(raw, 1, header_length))"
            " ELSE coalesce(raw, X'') END"
        ).alias("sk"),
        F.expr("CASE WHEN routable THEN data ELSE raw END").alias("piece"),
    )
    if large_message_bytes is not None:
        routed = routed.select(
            "*", F.explode(F.expr("CASE WHEN far THEN array(0, 1) ELSE array(0) END")).alias("copy")
        ).select(
            *[c for c in routed.columns if c not in ("far", "piece")],
            F.expr("far AND copy = 0").alias("far"),
            F.expr("CASE WHEN far AND copy = 0 THEN CAST(NULL AS BINARY) ELSE piece END").alias("piece"),
            F.expr(f"CASE WHEN copy = 1 THEN {_bytes_of(_OFFSET)} END").alias("bk"),
        )
    else:
        routed = routed.select("*", F.lit(None).cast("binary").alias("bk"))
    return routed.select("*", F.expr("coalesce(length(piece), 0)").alias("plen"))


def aggregate(routed: Any, partitions: int) -> Any:
    """One shuffle (by ``pk``, so a group and its far rows stay in one task), one aggregate.

    With kept columns (``src``) each meta struct carries them too, and the pieces and the metas
    are both ordered by (``sk``, ``plen``, a number unique to the row): the judge pairs each piece
    with its meta's kept columns, so two rows alike in header and length but not in data must take
    the same places in both (without lineage their raws are the same whichever piece each header
    meets). Kept columns need not be orderable (a map), and never decide an order."""
    from pyspark.sql import functions as F

    meta = ", ".join(META)
    pieces = "listagg(piece, X'') WITHIN GROUP (ORDER BY sk, plen)"
    if SRC in routed.columns:
        routed = routed.select("*", F.monotonically_increasing_id().alias("row_id"))
        pieces = "listagg(piece, X'') WITHIN GROUP (ORDER BY sk, plen, row_id)"
        a, b = "struct(a.sk, a.plen, a.row_id)", "struct(b.sk, b.plen, b.row_id)"
        order = f"(a, b) -> CASE WHEN {a} < {b} THEN -1 WHEN {a} > {b} THEN 1 ELSE 0 END"
        metas = F.expr(f"array_sort(collect_list(struct({meta}, {SRC}, row_id)), {order})")
    else:
        metas = F.expr(f"array_sort(collect_list(struct({meta})))")
    return (
        routed.repartition(partitions, "pk")
        .groupBy("routable", "pk", "bk")
        .agg(
            F.expr(pieces).alias("blob"),
            metas.alias("meta"),
        )
        .withColumn("n", F.size("meta"))
        .withColumn("last", F.expr("meta[n - 1]"))
    )


# The last row's header extension: header bytes [FIXED_LENGTH, header_length - 4), read from its sk.
EXTENSION = (
    f"substring(last.sk, {SK_HEADER + table.FIXED_LENGTH + 1}, length(last.sk) - {SK_HEADER + table.HEADER_LENGTH})"
)


def _clean(large_message_bytes: int | None) -> str:
    rules = row_ok("m.", large_message_bytes=large_message_bytes)
    return f"""coalesce(
  routable AND bk IS NULL
  AND forall(meta, m -> {rules} AND m.length_deferred = last.length_deferred
      AND (m.stored_length IS NULL OR m.stored_length = last.stored_length)
      AND (m.original_length IS NULL OR m.original_length = last.original_length)
      AND (m.message_checksum IS NULL OR m.message_checksum = last.message_checksum))
  AND meta[0].offset = 0
  AND last.is_last
  AND forall(zip_with(slice(meta, 1, n - 1), slice(meta, 2, n - 1),
      (a, b) -> NOT a.is_last AND b.offset = a.offset + a.data_length), ok -> ok)
  AND crc32(blob) = last.message_checksum,
  false)"""


def clean(digest: DigestPolicy, *, large_message_bytes: int | None = None) -> str:
    """SQL boolean: the aggregated row is a complete message by every rule (module doc), its
    digests included (``large_message_bytes``: see :func:`row_ok`). With a keyring the keys are
    literals in the plan (see ``REDACT_KEYS``)."""
    return f"({_clean(large_message_bytes)}) AND {verify_sql('blob', EXTENSION, digest)}"


def clean_row(sources: str | None = None) -> dict[str, str]:
    """SQL for each output column of a clean message (what the assembler would report for it).
    ``sources``: SQL for its rows' kept columns in offset order (lineage), or None: no such columns."""
    lineage = {} if sources is None else {"sources": sources, "source": "NULL"}
    return {
        "kind": "'message'",
        "group_id": "pk",
        "msg_seq_number": "1",
        "status": "'complete'",
        "reason": "0",
        "reason_name": "'NONE'",
        "detail": "CAST(NULL AS STRING)",
        "payload": "blob",
        "payload_path": "CAST(NULL AS STRING)",
        "stored_length": "last.stored_length",
        "original_length": "last.original_length",
        "message_checksum": "last.message_checksum",
        "missing_ranges": "CAST(array() AS array<struct<start:bigint,end:bigint>>)",
        "missing_ranges_basis": "CAST(NULL AS STRING)",
        "missing_seq_numbers": "CAST(array() AS array<int>)",
        "last_seq_number": "CAST(NULL AS INT)",
        "segments_used": "n",
        "duplicates": "0",
        "rejected": "0",
        "offset": "CAST(NULL AS BIGINT)",
        "raw": "CAST(NULL AS BINARY)",
        "raw_path": "CAST(NULL AS STRING)",
        "raw_offset": "CAST(NULL AS BIGINT)",
        "raw_length": "CAST(NULL AS BIGINT)",
        **lineage,
    }
