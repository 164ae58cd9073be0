"""The Python side of the Spark path: every aggregated row the JVM did not pass as clean.

A scalar Arrow UDF in its iterator form (one iterator per Spark task), so it
sees the end of its task's input: large messages, streamed piece by piece into
a :class:`~reassembly.bodies.FileBodyStore` as their rows arrive, are judged
when the input ends and their rows attached to the task's last row. Clean rows
come in as NULL and go out as NULL (the JVM writes them); an element NULL in a
returned array stands for "this row's clean message" when extra rows had to be
attached to it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from ..assembler import Assembler, Limits
from ..bodies import FileBodyStore
from ..events import Event
from .jvm import SK_HEADER
from .rows import Row, event_rows, reassemble_group, reject_rows
from .schema import OUTPUT_ARROW, OUTPUT_FIELDS

ROWS_ARROW = pa.list_(pa.struct(list(OUTPUT_ARROW)))
ROWS_DDL = "array<struct<" + ", ".join(f"`{name}`: {ddl}" for name, ddl, _ in OUTPUT_FIELDS) + ">>"


def views(arr: pa.Array) -> list[memoryview]:
    """Zero-copy, read-only views of a binary column's values (Arrow buffers never change once built)."""
    _, offsets, data = arr.buffers()[:3]
    pos = memoryview(offsets).cast("q" if pa.types.is_large_binary(arr.type) else "i")[arr.offset :]
    values = memoryview(data if data is not None else b"").toreadonly()
    return [values[pos[i] : pos[i + 1]] for i in range(len(arr))]


def originals(blob: memoryview, meta: list[dict[str, Any]], routable: bool) -> list[bytes | None]:
    """The original rows of one aggregated row (``header || piece`` in ``sk`` order; None for a NULL row).

    A far row's stub in a main aggregate is skipped: its piece travels in its own aggregate.
    """
    out: list[bytes | None] = []
    pos = 0
    for m in meta:
        if m["far"]:
            continue
        if m["is_null"]:
            out.append(None)
            continue
        piece = blob[pos : pos + m["plen"]]
        pos += m["plen"]
        out.append(bytes(m["sk"][SK_HEADER:]) + piece if routable else bytes(piece))
    return out


class _Large:
    """Large messages of one task: one assembler over a file store, judged at the end."""

    def __init__(self, limits: Limits, unit_of_work: bool, payload_dir: str, threshold: int) -> None:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        token = f"{ctx.stageId()}-{ctx.partitionId()}-{ctx.taskAttemptId()}" if ctx is not None else "local"
        self.store = FileBodyStore(payload_dir, token, threshold)
        self.asm = Assembler(limits, batch=True, unit_of_work=unit_of_work, bodies=self.store)
        self.events: list[Event] = []

    def feed(self, raws: list[bytes | None]) -> None:
        self.events += self.asm.receive_many(raw for raw in raws if raw is not None)

    def close(self) -> list[Row]:
        events = self.events + self.asm.close()
        self.store.close()
        return event_rows(events)


def make_judge(limits: Limits, unit_of_work: bool, payload_dir: str | None, threshold: int | None) -> Any:
    """The UDF: ``struct(routable, pk, large, blob, meta)`` (NULL for clean rows) -> output rows.

    ``large``: a per-offset aggregate. Its rows, and every row of a main aggregate that has far
    rows, go to the task's large assembler, which judges those messages when the task's input ends.
    """
    from pyspark.sql.functions import arrow_udf  # type: ignore[attr-defined]

    def judge_rows(arr: pa.StructArray, large: list[_Large]) -> list[list[Row | None] | None]:
        out: list[list[Row | None] | None] = [None] * len(arr)
        if arr.null_count == len(arr):
            return out
        valid = arr.is_valid().to_pylist()
        ok = arr.field("routable").to_pylist()
        big = arr.field("large").to_pylist()
        blobs = views(arr.field("blob"))
        metas = arr.field("meta")
        for i, is_valid in enumerate(valid):
            if not is_valid:
                continue
            meta = metas[i].as_py()
            raws = originals(blobs[i], meta, ok[i])
            if not ok[i]:
                out[i] = list[Row | None](reject_rows(raws, limits))
            elif big[i] or any(m["far"] for m in meta):
                if not large:
                    assert payload_dir is not None and threshold is not None
                    large.append(_Large(limits, unit_of_work, payload_dir, threshold))
                large[0].feed(raws)
                out[i] = []
            else:
                out[i] = list[Row | None](reassemble_group(raws, limits, unit_of_work=unit_of_work))
        return out

    @arrow_udf(ROWS_DDL)  # type: ignore[untyped-decorator]
    def judge(batches: Iterator[pa.Array]) -> Iterator[pa.Array]:
        large: list[_Large] = []  # created on the first large row of the task
        held: list[list[list[Row | None] | None]] = []  # outputs from the last non-empty batch on
        for arr in batches:
            rows = judge_rows(arr, large)
            if rows:
                for pending in held:
                    yield pa.array(pending, ROWS_ARROW)
                held = []
            held.append(rows)
        extra = large[0].close() if large else []
        if extra:
            last = next(rows for rows in reversed(held) if rows)
            last[-1] = [*(last[-1] if last[-1] is not None else [None]), *extra]
        for pending in held:
            yield pa.array(pending, ROWS_ARROW)

    return judge
