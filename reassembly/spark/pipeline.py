"""``reassemble``: segments DataFrame in, messages and quarantine out, every segment accounted for.

Data path:

1. Headers are decoded in the JVM (``decode.py``); rows that are not valid
   segments get a NULL key and go, as one group, to the Python decoder, which
   gives their exact reason.
2. One scan and one shuffle, by GroupId, so a whole MQ group (or a single
   message) meets in one place.
3. Each group goes through ``applyInArrow`` (iterator form) to the same
   :class:`~reassembly.assembler.Assembler` the in-process consumer uses:
   the rules live in one place, and the Spark output is, by construction,
   what a Python consumer would report for the same segments.

A JVM-only path for clean messages (``listagg`` + ``crc32``) was built and
measured; see README "Spark reassembly" for why it is not the default.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ..assembler import Limits
from .decode import decode_segments
from .rows import reassemble_group, reject_rows
from .schema import MESSAGE_COLUMNS, OUTPUT_ARROW, OUTPUT_DDL, QUARANTINE_COLUMNS, ColumnNames


@dataclass(frozen=True)
class ReassemblyOptions:
    """How to reassemble. Defaults suit a landing table of segments up to a few hundred MiB per message."""

    unit_of_work: bool = True  # MQ groups: deliver all messages of a group or none
    max_message_size: int = 1 << 30  # declared sizes above this are rejected (2030)
    partitions: int | None = None  # shuffle partitions (default: spark.sql.shuffle.partitions)

    def limits(self) -> Limits:
        # One group per assembler: the group itself is the only thing buffered.
        return Limits(
            max_message_size=self.max_message_size,
            max_segment_size=min(self.max_message_size + 4096, 1 << 62),
            max_buffered_bytes=1 << 62,
            max_open_groups=1 << 30,
        )


@dataclass(frozen=True)
class ReassemblyResult:
    """The outputs of one reassembly. ``combined`` holds both kinds; compute it once with :meth:`write`."""

    combined: Any

    @property
    def messages(self) -> Any:
        """One row per logical message: status, reason, payload, gaps, counts."""
        return self.combined.where("kind = 'message'").select(*MESSAGE_COLUMNS)

    @property
    def quarantine(self) -> Any:
        """One row per input segment not used in a complete message, with its original bytes."""
        return self.combined.where("kind = 'quarantine'").select(*QUARANTINE_COLUMNS)

    @property
    def groups(self) -> Any:
        """Unit-of-Work view: one row per group, its messages in MsgSeqNumber order."""
        from pyspark.sql import functions as F

        m = self.messages
        return m.groupBy("group_id").agg(
            F.sort_array(F.collect_list(F.struct(*[F.col(c) for c in MESSAGE_COLUMNS if c != "group_id"]))).alias(
                "messages"
            ),
            F.expr("bool_and(status = 'complete')").alias("complete"),
        )


def _views(arr: pa.Array) -> list[memoryview]:
    """Zero-copy, read-only views of a binary column's values (Arrow buffers never change once built)."""
    _, offsets, data = arr.buffers()
    pos = memoryview(offsets).cast("q" if pa.types.is_large_binary(arr.type) else "i")[arr.offset :]
    values = memoryview(data if data is not None else b"").toreadonly()
    return [values[pos[i] : pos[i + 1]] for i in range(len(arr))]


def _group_fn(limits: Limits) -> Any:
    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        raws: list[memoryview] = []
        group_id: bytes | None = None
        for batch in batches:
            if not batch.num_rows:
                continue
            group_id = batch.column(0)[0].as_py()
            if group_id is None:  # rows Spark could not decode: the Python decoder names the reason
                yield pa.RecordBatch.from_pylist(reject_rows(_views(batch.column(1)), limits), schema=OUTPUT_ARROW)
                continue
            raws += _views(batch.column(1))
        if raws:
            yield pa.RecordBatch.from_pylist(reassemble_group(raws, group_id, limits), schema=OUTPUT_ARROW)

    return fn


def reassemble(
    df: Any,
    *,
    encoded: bool = True,
    raw_column: str = "segment",
    columns: ColumnNames | None = None,
    options: ReassemblyOptions | None = None,
) -> ReassemblyResult:
    """Reassemble a DataFrame of segments (encoded, or as columns: see :class:`ColumnNames`)."""
    from pyspark.sql import functions as F


    opts = options or ReassemblyOptions()
    limits = opts.limits()
    if not encoded:
        from .columns import encode_columns

        df = encode_columns(df, columns or ColumnNames())
        raw_column = "segment"
    d = decode_segments(df, raw_column, opts.max_message_size)
    spark = df.sparkSession
    n = opts.partitions or int(spark.conf.get("spark.sql.shuffle.partitions"))

    # One scan, one shuffle: invalid rows travel with group_id NULL and form their own group.
    keyed = d.select(F.when(F.col("header_ok"), F.col("group_id")).alias("group_id"), "raw")
    out = keyed.repartition(n, "group_id").groupBy("group_id").applyInArrow(_group_fn(limits), OUTPUT_DDL)
    return ReassemblyResult(out)
