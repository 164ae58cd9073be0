"""``reassemble``: segments DataFrame in, messages and quarantine out, every segment accounted for.

Data path:

1. Headers are decoded in the JVM (``decode.py``): rows that are not valid
   segments go to the Python decoder, which gives their exact reason.
2. One shuffle, by GroupId, so a whole MQ group (or a single message) meets
   in one place.
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


def _group_fn(limits: Limits) -> Any:
    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        raws: list[bytes] = []
        group_id = None
        for batch in batches:
            if group_id is None and batch.num_rows:
                group_id = batch.column(0)[0].as_py()
            raws += batch.column(1).to_pylist()
        rows = reassemble_group(raws, group_id, limits)
        yield pa.RecordBatch.from_pylist(rows, schema=OUTPUT_ARROW)

    return fn


def _reject_fn(limits: Limits) -> Any:
    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            rows = reject_rows(batch.column(0).to_pylist(), limits)
            yield pa.RecordBatch.from_pylist(rows, schema=OUTPUT_ARROW)

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

    opts = options or ReassemblyOptions()
    limits = opts.limits()
    if not encoded:
        from .columns import encode_columns

        df = encode_columns(df, columns or ColumnNames())
        raw_column = "segment"
    d = decode_segments(df, raw_column, opts.max_message_size)
    spark = df.sparkSession
    n = opts.partitions or int(spark.conf.get("spark.sql.shuffle.partitions"))

    bad = d.where("NOT header_ok").select("raw").mapInArrow(_reject_fn(limits), OUTPUT_DDL)
    good = d.where("header_ok").select("group_id", "raw").repartition(n, "group_id")
    groups = good.groupBy("group_id").applyInArrow(_group_fn(limits), OUTPUT_DDL)
    return ReassemblyResult(groups.unionByName(bad))
