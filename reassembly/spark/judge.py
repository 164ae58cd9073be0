"""The Python side of the Spark path: every aggregated row the JVM did not pass as clean.

A scalar Arrow UDF in its iterator form (one iterator per Spark task), so it
sees the end of its task's input: large messages, streamed piece by piece into
a :class:`~reassembly.assembler.filestore.FileBodyStore` as their rows arrive, are judged
when the input ends and their rows attached to the task's last row (the input
is read one batch ahead, so the last row is known when it is judged). Clean
rows come in as NULL and go out as NULL (the JVM writes them); an element NULL
in a returned array stands for "this row's clean message" when extra rows had
to be attached to it.

Memory goes by decoded sizes, not input sizes (a few KiB of zstd can decode to
gigabytes); with a ``payload_dir`` it is bounded whatever the input
(:func:`decoded_bound`): a message declaring more than ``large_message_bytes`` is
decompressed into a file, never in memory; the messages of one aggregated row
leave at most ``large_message_bytes`` in memory (an MQ group of medium messages:
the rest go to files too); and output rows are handed to Spark as soon as those
gathered hold :func:`flush_bytes`, so many medium messages in one Arrow batch
never pile up. A large message is held as headers and file handles while its rows
arrive and judged from the file (nothing of its body read back when its pieces
tile it). A large message that *fails* is quarantined by reference
(``quarantine.py``): its store keeps the failed body's files (``keep_failed``), the
assembler hands its segments back as handles, and each is copied block by block into
the task attempt's quarantine file under ``payload_dir``; the row carries ``raw_path``,
``raw_offset`` and ``raw_length`` with ``raw`` NULL. So a failing message of any size
(past Spark's 2 GiB per value too) costs the worker one copy block, never its size.

Which quarantine rows go by reference (with a ``payload_dir``; without one, all stay
in-row): every row of the task's large assembler (they all leave with the
task's last row, so in-row their sum would be unbounded), and every segment of a
message built in the store on the ordinary path (e.g. a small zstd frame declaring a
huge size). The other rows of the ordinary path keep ``raw``: each is no bigger than
the aggregated input row it came from, and leaves with it.
"""

from __future__ import annotations

import os
import struct
import uuid
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import pyarrow as pa

from reassembly.assembler.core import Assembler, Limits
from reassembly.assembler.events import Event
from reassembly.assembler.filestore import FileBodyStore
from reassembly.spark.jvm import SK_HEADER
from reassembly.spark.quarantine import ByReference, QuarantineFile
from reassembly.spark.rows import EventRows, Row, reassemble_group, reject_rows
from reassembly.spark.schema import OUTPUT_ARROW, OUTPUT_FIELDS

ROWS_ARROW = pa.list_(pa.struct(list(OUTPUT_ARROW)))
FLUSH_BYTES = 16 << 20  # output gathered up to this many bytes goes to Spark as one batch
ZSTD_WINDOW = 1 << 27  # zstd's default largest window (windowLog 27): a frame asking for more fails
SINK_WINDOW = 1 << 20  # what a decompression into a file holds (reassembly.assembler.build._FileSink)
_GROUP, _LENGTH = struct.Struct(">BBi"), struct.Struct(">q")  # a side file's group head, a row's length
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


def flush_bytes(large_message_bytes: int | None) -> int:
    """Output rows holding this many bytes (payloads, quarantined originals) are handed to Spark."""
    return FLUSH_BYTES if large_message_bytes is None else min(FLUSH_BYTES, large_message_bytes)


def decoded_bound(large_message_bytes: int) -> int:
    """Most decoded bytes one task's judge holds at once with a ``payload_dir``, whatever the input.

    Output gathered but not yet handed on (under :func:`flush_bytes`) plus the row being
    judged (its messages in memory declare at most ``large_message_bytes`` in all; one more
    candidate of the same message may be built beside them), twice while Arrow copies them
    into an output batch, plus one zstd window and the window of a decompression into a file.
    """
    return 2 * (flush_bytes(large_message_bytes) + large_message_bytes) + ZSTD_WINDOW + SINK_WINDOW


class _Large:
    """Large messages of one task: one assembler over a file store, judged at the end.

    Every body is built in the store (threshold 0): these messages reach past
    ``large_message_bytes`` (or claim to), and their rows all go out with the task's last row,
    so every original they quarantine goes by reference, copied out as its event arrives.
    """

    def __init__(self, limits: Limits, unit_of_work: bool, payload_dir: str, quarantine: QuarantineFile) -> None:
        self.store = FileBodyStore(payload_dir, f"{_task_token()}-large", keep_failed=True)
        self.asm = Assembler(limits, batch=True, unit_of_work=unit_of_work, bodies=self.store)
        self.rows = EventRows(ByReference(quarantine, every=True))

    def _add(self, events: list[Event]) -> None:
        self.rows.add(events)
        self.store.purge()  # failed bodies are copied out: their files go

    def feed(self, raws: list[bytes | None]) -> None:
        self._add(self.asm.receive_many(raw for raw in raws if raw is not None))

    def close(self) -> list[Row]:
        self._add(self.asm.close())
        self.store.close()
        return self.rows.rows()


def _task_token() -> str:
    """Unique per task attempt: names of work in progress in the payload directory."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return f"{ctx.stageId()}-{ctx.partitionId()}-{ctx.taskAttemptId()}" if ctx is not None else "local"


def _quarantine_token() -> str:
    """The task attempt plus a random part: another job writing to the same payload_dir never collides."""
    return f"{_task_token()}-{uuid.uuid4().hex[:16]}"


def _weight(rows: Sequence[Row | None] | None) -> int:
    """Bytes an output element holds in memory (payloads and quarantined originals)."""
    total = 0
    for row in rows or ():
        if row is not None:
            total += sum(len(row[c]) for c in ("payload", "raw") if row.get(c) is not None)
    return total


class _Task:
    """One task's judging: what each aggregated row becomes, and when output goes to Spark."""

    def __init__(self, limits: Limits, unit_of_work: bool, payload_dir: str | None, threshold: int | None) -> None:
        self.limits, self.unit_of_work, self.payload_dir = limits, unit_of_work, payload_dir
        self.large: _Large | None = None  # created on the first large row of the task
        # Unique per task attempt and per job: no attempt ever writes over a file committed rows point at.
        self.quarantine = None if payload_dir is None else QuarantineFile(payload_dir, _quarantine_token())
        # Messages of one row: above the threshold into files, and at most the threshold in memory in all.
        self.store = (
            None
            if payload_dir is None or threshold is None
            else FileBodyStore(payload_dir, _task_token(), threshold, threshold, keep_failed=True)
        )
        self.flush = flush_bytes(threshold)

    def _large(self) -> _Large:
        if self.large is None:
            assert self.payload_dir is not None and self.quarantine is not None
            self.large = _Large(self.limits, self.unit_of_work, self.payload_dir, self.quarantine)
        return self.large

    def _group(self, raws: list[bytes | None]) -> list[Row]:
        if self.store is None:
            return reassemble_group(raws, self.limits, unit_of_work=self.unit_of_work)
        assert self.quarantine is not None
        sink = ByReference(self.quarantine, every=False)  # originals of messages built in the store
        rows = reassemble_group(raws, self.limits, unit_of_work=self.unit_of_work, bodies=self.store, sink=sink)
        self.store.release()  # the in-memory bound is per row; gathered output is bounded by flushing
        self.store.purge()  # failed bodies are copied out: their files go
        return rows

    def finish(self) -> None:
        """The task's input has ended (every row handed on): make its quarantine file durable and visible."""
        if self.quarantine is not None:
            self.quarantine.finish()

    def outputs(self, arr: pa.StructArray, last: bool) -> Iterator[pa.Array]:
        """Output arrays for one input batch (``last``: the task's last), each holding about the flush size at most."""
        valid = arr.is_valid().to_pylist()
        ok = arr.field("routable").to_pylist()
        big = arr.field("large").to_pylist()
        blobs = views(arr.field("blob"))
        metas = arr.field("meta")
        pending: list[list[Row | None] | None] = []
        held = 0
        for i, is_valid in enumerate(valid):
            rows = self._judge(ok[i], big[i], blobs[i], metas[i].as_py()) if is_valid else None
            if last and i == len(arr) - 1 and self.large is not None:
                rows = [*(rows if rows is not None else [None]), *self.large.close()]
            held += _weight(rows)
            pending.append(rows)
            del rows  # the pending list is the only reference: flushing frees the payloads
            if held >= self.flush:
                out = pa.array(pending, ROWS_ARROW)
                pending, held = [], 0
                yield out
        if pending:
            yield pa.array(pending, ROWS_ARROW)

    def _judge(self, routable: bool, large: bool, blob: memoryview, meta: list[dict[str, Any]]) -> list[Row | None]:
        raws = originals(blob, meta, routable)
        return list[Row | None](self.judge(routable, large or any(m["far"] for m in meta), raws))

    def judge(self, routable: bool, large: bool, raws: list[bytes | None]) -> list[Row]:
        """One group's rows (``large``: a per-offset group or one with far rows: judged at the task's end)."""
        if not routable:
            return reject_rows(raws, self.limits)
        if large:
            self._large().feed(raws)
            return []
        return self._group(raws)

    def judged(self, groups: Iterable[SideGroup]) -> Iterator[list[Row]]:
        """Every output row of ``groups`` (one task's side file), about the flush size at a time."""
        pending: list[Row] = []
        held = 0
        for group in groups:
            rows = self.judge(*group)
            del group  # its original rows: not kept while the output is out (the input's size again)
            held += _weight(rows)
            pending += rows
            del rows
            if held >= self.flush:
                yield pending
                pending, held = [], 0
        if self.large is not None:
            pending += self.large.close()
        if pending:
            yield pending
        self.finish()  # runs once Spark has taken the last output, before the task can commit


class SideGroup(NamedTuple):
    """One group of a side file: what an aggregated row carries to the judge, as original rows."""

    routable: bool
    large: bool
    raws: list[bytes | None]


def read_side(path: str) -> Iterator[SideGroup]:
    """The groups of one side file (``jvm/src/segmenter/jvm/SideFile.java``), one at a time.

    Every count and length is checked against what is left of the file before anything is read
    or allocated for it: a file cut short or damaged is an error, never an early end or a guess.
    """
    with open(path, "rb", buffering=1 << 20) as f:
        size = os.fstat(f.fileno()).st_size

        def take(n: int) -> bytes:
            if not 0 <= n <= size - f.tell():
                raise OSError(f"side file {path} cut short or damaged: {n} bytes wanted at {f.tell()} of {size}")
            return f.read(n)

        def group() -> SideGroup:
            # A function of its own: its locals go when it returns, so the suspended generator
            # holds no group's rows while the caller judges and hands on the next ones.
            routable, large, n = _GROUP.unpack(take(_GROUP.size))
            if not 0 <= n <= (size - f.tell()) // _LENGTH.size:
                raise OSError(f"side file {path} cut short or damaged: {n} rows declared at {f.tell()} of {size}")
            raws: list[bytes | None] = []
            for _ in range(n):
                (length,) = _LENGTH.unpack(take(_LENGTH.size))
                raws.append(None if length == -1 else take(length))
            return SideGroup(bool(routable), bool(large), raws)

        while f.tell() < size:
            yield group()


def make_side_judge(limits: Limits, unit_of_work: bool, payload_dir: str | None, threshold: int | None) -> Any:
    """For ``mapInArrow`` over a column of side-file paths: every file's groups judged, as output rows."""

    def judge(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for path in batch.column(0).to_pylist():
                task = _Task(limits, unit_of_work, payload_dir, threshold)
                for rows in task.judged(read_side(path)):
                    batch = pa.RecordBatch.from_pylist(rows, schema=OUTPUT_ARROW)
                    # The rows' payloads are in the batch now: the list (``judged`` holds it too
                    # until it resumes) must not keep them while Spark writes the batch out.
                    rows.clear()
                    yield batch

    return judge


def make_judge(limits: Limits, unit_of_work: bool, payload_dir: str | None, threshold: int | None) -> Any:
    """The UDF: ``struct(routable, pk, large, blob, meta)`` (NULL for clean rows) -> output rows.

    ``large``: a per-offset aggregate. Its rows, and every row of a main aggregate that has far
    rows, go to the task's large assembler, which judges those messages when the task's input ends.
    """
    from pyspark.sql.functions import arrow_udf  # type: ignore[attr-defined]

    @arrow_udf(ROWS_DDL)  # type: ignore[untyped-decorator]
    def judge(batches: Iterator[pa.Array]) -> Iterator[pa.Array]:
        task = _Task(limits, unit_of_work, payload_dir, threshold)
        ahead = (arr for arr in batches if len(arr))  # read one batch ahead: the last row must be known
        arr = next(ahead, None)
        while arr is not None:
            following = next(ahead, None)
            yield from task.outputs(arr, last=following is None)
            arr = following
        task.finish()  # runs once Spark has taken the last output, before the task can commit

    return judge
