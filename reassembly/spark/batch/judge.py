"""The Python side of the Spark path: every aggregated row the JVM did not pass as clean.

A scalar Arrow UDF in its iterator form (one iterator per Spark task), so it
sees the end of its task's input: large messages, streamed piece by piece into
a :class:`~reassembly.storage.filestore.FileBodyStore` as their rows arrive, are judged
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

Lineage (input columns kept): each input row's kept columns travel in its ``meta`` as ``src``
(from the side file's ``.src`` beside it, for the side files' judge), and the judge gives them to the
rows (``rows.py``: the assembler is fed each segment at its index as its position).

Where the judge's rows are written (``save()``), its quarantine rows leave through a
:class:`Pending` file of their own instead of the task's output, and the output holds message
rows only: each written folder then holds its own columns, and no second pass over the
messages' bytes is needed to project them (``save.py``).
"""

from __future__ import annotations

import os
import struct
import uuid
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, NamedTuple

import pyarrow as pa

from reassembly.assembler.core import Assembler, Limits
from reassembly.assembler.events import Event
from reassembly.spark.batch.quarantine import ByReference, QuarantineFile
from reassembly.spark.engine.bridge import SK_HEADER, SRC
from reassembly.spark.rows import LINEAGE, EventRows, Row, reassemble_group, reject_rows
from reassembly.spark.schema import (
    MESSAGE_ARROW,
    OUTPUT_ARROW,
    OUTPUT_FIELDS,
    QUARANTINE_ARROW,
    SOURCE,
    SOURCES,
    combined_arrow,
    lineage_arrow,
)
from reassembly.storage.filestore import FileBodyStore

ROWS_ARROW = pa.list_(pa.struct(list(OUTPUT_ARROW)))
FLUSH_BYTES = 16 << 20  # output gathered up to this many bytes goes to Spark as one batch
ZSTD_WINDOW = 1 << 27  # zstd's default largest window (windowLog 27): a frame asking for more fails
SINK_WINDOW = 1 << 20  # what a decompression into a file holds (reassembly.assembler.build._FileSink)
_GROUP, _LENGTH = struct.Struct(">BBi"), struct.Struct(">q")  # a side file's group head, a row's length
ROWS_DDL = "array<struct<" + ", ".join(f"`{name}`: {ddl}" for name, ddl, _ in OUTPUT_FIELDS) + ">>"
SIDE_SOURCES = ".src"  # beside a side file ``X.side``: ``X.src``, its rows' kept columns (Arrow IPC stream)
PENDING = ".arrows"  # a task attempt's quarantine rows (Arrow IPC stream), finished
KIND_INPUT = "input"  # a side judge's count of the landing rows it read (``segments_used``): never written
PENDING_ROWS = 4096  # quarantine rows gathered before they are written as one batch (or PENDING_BYTES of them)
PENDING_BYTES = 1 << 20  # a pending file's batch: small, as the quarantine rows of one group go out at once


def src_type(meta: pa.DataType) -> pa.DataType | None:
    """The Arrow type of the kept columns in a ``meta`` list type (None: nothing kept)."""
    value = meta.value_type
    return value.field(SRC).type if value.get_field_index(SRC) >= 0 else None


def message_arrow(src: pa.DataType | None) -> pa.Schema:
    """What a judge writing through :class:`Pending` hands to Spark: ``kind`` and the message columns."""
    return lineage_arrow(MESSAGE_ARROW.insert(0, pa.field("kind", pa.string())), src, SOURCES)


def quarantine_arrow(src: pa.DataType | None) -> pa.Schema:
    """A :class:`Pending` file's rows: the quarantine columns (``source`` last when columns are kept)."""
    return lineage_arrow(QUARANTINE_ARROW, src, SOURCE)


class Pending:
    """One task attempt's quarantine rows, in a file of their own (an Arrow IPC stream) instead of
    the task's output: created on the first row, renamed to ``<key>-<attempt>-<id>.arrows`` when the
    task's input has ended (:func:`pending_files` takes one per key). ``key``: what the rows are the
    judgement of, the same for every attempt (default: the task's partition; a side judge's task
    may judge several side files, each its own key)."""

    def __init__(self, directory: str, schema: pa.Schema, key: str | None = None) -> None:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        at = "0-0" if ctx is None else f"{ctx.attemptNumber()}-{ctx.taskAttemptId()}"
        name = f"{key if key is not None else 0 if ctx is None else ctx.partitionId()}-{at}"
        self.directory = Path(directory)
        self.final = self.directory / f"{name}{PENDING}"
        self.part = self.directory / f".{name}.part"
        self.schema = schema
        self._file: IO[bytes] | None = None
        self._writer: Any = None
        self._rows: list[Row] = []  # gathered up to PENDING_BYTES (or PENDING_ROWS), then written as one batch
        self._held = 0

    def write(self, rows: list[Row]) -> None:
        self._rows += rows
        self._held += _weight(rows)
        if self._held >= PENDING_BYTES or len(self._rows) >= PENDING_ROWS:
            self._flush()

    def _flush(self) -> None:
        if not self._rows:
            return
        if self._writer is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._file = open(self.part, "wb")  # noqa: SIM115 (open until finish)
            self._writer = pa.ipc.new_stream(self._file, self.schema)
        batch = pa.RecordBatch.from_pylist(self._rows, schema=self.schema)
        self._rows, self._held = [], 0
        self._writer.write_batch(batch)

    def finish(self) -> None:
        """The task's input has ended: the file becomes visible (nothing if no row was written)."""
        self._flush()
        if self._writer is None or self._file is None:
            return
        self._writer.close()
        self._file.close()
        self._writer = self._file = None
        os.replace(self.part, self.final)


def pending_files(directory: str | os.PathLike[str]) -> list[str]:
    """One finished pending file per partition: two finished attempts of one partition judged the same rows."""
    chosen: dict[str, Path] = {}
    for path in sorted(Path(directory).glob(f"*{PENDING}")):
        chosen.setdefault(path.name.split("-", 1)[0], path)
    return [str(chosen[k]) for k in sorted(chosen, key=int)]


def read_pending(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """For ``mapInArrow`` over a column of pending file paths: their quarantine rows, batch by batch."""
    for batch in batches:
        for path in batch.column(0).to_pylist():
            with pa.OSFile(path, "rb") as f, pa.ipc.open_stream(f) as reader:
                yield from reader


def views(arr: pa.Array) -> list[memoryview]:
    """Zero-copy, read-only views of a binary column's values (Arrow buffers never change once built)."""
    _, offsets, data = arr.buffers()[:3]
    pos = memoryview(offsets).cast("q" if pa.types.is_large_binary(arr.type) else "i")[arr.offset :]
    values = memoryview(data if data is not None else b"").toreadonly()
    return [values[pos[i] : pos[i + 1]] for i in range(len(arr))]


def sources(meta: list[dict[str, Any]]) -> list[Any] | None:
    """The kept columns of the rows :func:`originals` gives, in its order (None: nothing kept)."""
    if not meta or SRC not in meta[0]:
        return None
    return [m[SRC] for m in meta if not m["far"]]


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

    Output gathered but not yet handed on (under :func:`flush_bytes`; with a :class:`Pending` file,
    its quarantine rows gathered too, under :data:`PENDING_BYTES`) plus the row being judged (its
    messages in memory declare at most ``large_message_bytes`` in all; one more candidate of the same
    message may be built beside them), twice while Arrow copies them into an output batch, plus one
    zstd window and the window of a decompression into a file.
    """
    gathered = flush_bytes(large_message_bytes) + PENDING_BYTES
    return 2 * (gathered + large_message_bytes) + ZSTD_WINDOW + SINK_WINDOW


class _Large:
    """Large messages of one task: one assembler over a file store, judged at the end.

    Every body is built in the store (threshold 0): these messages reach past
    ``large_message_bytes`` (or claim to), and their rows all go out with the task's last row,
    so every original they quarantine goes by reference, copied out as its event arrives.
    """

    def __init__(
        self, limits: Limits, unit_of_work: bool, payload_dir: str, quarantine: QuarantineFile, lineage: bool = False
    ) -> None:
        self.store = FileBodyStore(payload_dir, f"{_task_token()}-large", keep_failed=True)
        self.asm = Assembler(limits, batch=True, unit_of_work=unit_of_work, bodies=self.store)
        # Lineage: every row fed is at its place in ``sources`` (its position), across the task's rows.
        self.sources: list[Any] | None = [] if lineage else None
        self.rows = EventRows(ByReference(quarantine, every=True), self.sources)

    def _add(self, events: list[Event]) -> None:
        self.rows.add(events)
        self.store.purge()  # failed bodies are copied out: their files go

    def feed(self, raws: list[bytes | None], srcs: list[Any] | None = None) -> None:
        if self.sources is None or srcs is None:
            self._add(self.asm.receive_many(raw for raw in raws if raw is not None))
            return
        events: list[Event] = []
        for raw, src in zip(raws, srcs, strict=True):
            if raw is not None:  # a large group is routable: no NULL row reaches it
                self.sources.append(src)
                events += self.asm.receive(raw, len(self.sources) - 1, LINEAGE)
        self._add(events)

    def close(self) -> list[Row]:
        self._add(self.asm.close())
        self.store.close()
        return self.rows.rows()


def _task_token() -> str:
    """Unique per task attempt: names of work in progress in the payload directory."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return f"{ctx.stageId()}-{ctx.partitionId()}-{ctx.taskAttemptId()}" if ctx is not None else "driver"


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
    """One task's judging: what each aggregated row becomes, and when output goes to Spark.

    ``lineage``: rows carry ``source`` / ``sources`` (the input rows' kept columns). ``pending``:
    quarantine rows go there (:class:`Pending`), not to Spark.
    """

    def __init__(
        self,
        limits: Limits,
        unit_of_work: bool,
        payload_dir: str | None,
        threshold: int | None,
        lineage: bool = False,
        pending: Pending | None = None,
    ) -> None:
        self.limits, self.unit_of_work, self.payload_dir = limits, unit_of_work, payload_dir
        self.lineage, self.pending = lineage, pending
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
            self.large = _Large(self.limits, self.unit_of_work, self.payload_dir, self.quarantine, self.lineage)
        return self.large

    def _group(self, raws: list[bytes | None], srcs: list[Any] | None) -> list[Row]:
        if self.store is None:
            return reassemble_group(raws, self.limits, unit_of_work=self.unit_of_work, sources=srcs)
        assert self.quarantine is not None
        sink = ByReference(self.quarantine, every=False)  # originals of messages built in the store
        rows = reassemble_group(
            raws, self.limits, unit_of_work=self.unit_of_work, bodies=self.store, sink=sink, sources=srcs
        )
        self.store.release()  # the in-memory bound is per row; gathered output is bounded by flushing
        self.store.purge()  # failed bodies are copied out: their files go
        return rows

    def divert(self, rows: list[Row]) -> list[Row]:
        """With a pending file: its quarantine rows go there; the message rows stay (else all stay)."""
        if self.pending is None:
            return rows
        self.pending.write([r for r in rows if r["kind"] == "quarantine"])
        return [r for r in rows if r["kind"] != "quarantine"]

    def finish(self) -> None:
        """The task's input has ended (every row handed on): make its quarantine file durable and visible."""
        if self.quarantine is not None:
            self.quarantine.finish()
        if self.pending is not None:
            self.pending.finish()

    def outputs(self, arr: pa.StructArray, last: bool, out_type: pa.DataType = ROWS_ARROW) -> Iterator[pa.Array]:
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
                rows = [*(rows if rows is not None else [None]), *self.divert(self.large.close())]
            held += _weight(rows)
            pending.append(rows)
            del rows  # the pending list is the only reference: flushing frees the payloads
            if held >= self.flush:
                out = pa.array(pending, out_type)
                pending, held = [], 0
                yield out
        if pending:
            yield pa.array(pending, out_type)

    def _judge(self, routable: bool, large: bool, blob: memoryview, meta: list[dict[str, Any]]) -> list[Row | None]:
        raws = originals(blob, meta, routable)
        srcs = sources(meta) if self.lineage else None
        return list[Row | None](self.divert(self.judge(routable, large or any(m["far"] for m in meta), raws, srcs)))

    def judge(self, routable: bool, large: bool, raws: list[bytes | None], srcs: list[Any] | None = None) -> list[Row]:
        """One group's rows (``large``: a per-offset group or one with far rows: judged at the task's end);
        ``srcs``: the rows' kept columns, parallel to ``raws`` (lineage)."""
        if not routable:
            return reject_rows(raws, self.limits, srcs)
        if large:
            self._large().feed(raws, srcs)
            return []
        return self._group(raws, srcs)

    def judged(self, groups: Iterable[SideGroup]) -> Iterator[list[Row]]:
        """Every output row of ``groups`` (one task's side file), about the flush size at a time; with a
        pending file, its quarantine rows go there and a last row of kind ``input`` counts the rows read."""
        pending: list[Row] = []
        held = read = 0
        for group in groups:
            read += len(group.raws)
            rows = self.divert(self.judge(*group))
            del group  # its original rows: not kept while the output is out (the input's size again)
            held += _weight(rows)
            pending += rows
            del rows
            if held >= self.flush:
                yield pending
                pending, held = [], 0
        if self.large is not None:
            pending += self.divert(self.large.close())
        if self.pending is not None:
            pending.append({"kind": KIND_INPUT, "segments_used": read})
        if pending:
            yield pending
        self.finish()  # runs once Spark has taken the last output, before the task can commit


class SideGroup(NamedTuple):
    """One group of a side file: what an aggregated row carries to the judge, as original rows
    (and, where columns are kept, their kept columns, from the side file's ``.src`` stream)."""

    routable: bool
    large: bool
    raws: list[bytes | None]
    sources: list[Any] | None = None


class _SideSources:
    """The kept columns of a side file's rows, read from its ``.src`` Arrow stream a group at a time."""

    def __init__(self, path: str) -> None:
        self._file = pa.OSFile(path, "rb")
        self._reader = pa.ipc.open_stream(self._file)
        self.type = pa.struct(list(self._reader.schema))
        self._rows: list[Any] = []
        self._at = 0

    def take(self, n: int) -> list[Any]:
        out: list[Any] = []
        while len(out) < n:
            if self._at == len(self._rows):
                try:
                    batch = self._reader.read_next_batch()
                except StopIteration:
                    raise OSError(f"side file sources {self._file} hold fewer rows than the side file") from None
                self._rows, self._at = batch.to_pylist(), 0
                continue
            take = min(n - len(out), len(self._rows) - self._at)
            out += self._rows[self._at : self._at + take]
            self._at += take
        return out

    def close(self) -> None:
        self._file.close()


def side_sources(path: str) -> _SideSources | None:
    """The ``.src`` stream beside side file ``path`` (None: no columns are kept)."""
    src = path.removesuffix(".side") + SIDE_SOURCES
    return _SideSources(src) if os.path.exists(src) else None


def read_side(path: str) -> Iterator[SideGroup]:
    """The groups of one side file (``jvm/src/segmenter/jvm/SideFile.java``), one at a time.

    Every count and length is checked against what is left of the file before anything is read
    or allocated for it: a file cut short or damaged is an error, never an early end or a guess.
    """
    srcs = side_sources(path)
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
            return SideGroup(bool(routable), bool(large), raws, None if srcs is None else srcs.take(n))

        try:
            while f.tell() < size:
                yield group()
        finally:
            if srcs is not None:
                srcs.close()


def side_decoded_bytes(paths: Iterable[str], limit: int) -> int:
    """An upper bound of the bytes judging the side files ``paths`` can decode, or more than
    ``limit`` once it is known to exceed it (the rest is not read).

    A compressed segment counts what its header declares the message decodes to (the assembler
    decodes no further than that: a bomb's excess is an error, never held); a segment whose length
    is deferred counts as more than ``limit`` (nothing bounds it but ``max_message_size``); every
    other row counts its own bytes. For the driver, which judges side files itself only when this
    fits its budget: a few KiB of zstd can declare gigabytes.
    """
    from segmenter.errors import SegmentationError
    from segmenter.flags import Codec
    from segmenter.wire import decode_header

    total = 0
    for path in paths:
        for group in read_side(path):
            for raw in group.raws:
                if raw is None:
                    continue
                try:
                    header = decode_header(raw)
                except SegmentationError:
                    total += len(raw)  # quarantined as it is
                else:
                    if header.length_deferred:
                        return limit + 1
                    total += header.original_length if header.codec != Codec.NONE else len(raw)
                if total > limit:
                    return total
    return total


def make_side_judge(
    limits: Limits, unit_of_work: bool, payload_dir: str | None, threshold: int | None, pending: str | None = None
) -> Any:
    """For ``mapInArrow`` over a column of side-file paths: every file's groups judged, as output rows
    (the combined schema). With ``pending`` (a directory): quarantine rows go to :class:`Pending`
    files there and the output is :func:`message_arrow`'s, with one ``input`` row per file."""

    def judge(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for path in batch.column(0).to_pylist():
                srcs = side_sources(path)
                src = None if srcs is None else srcs.type
                if srcs is not None:
                    srcs.close()
                schema = combined_arrow(src) if pending is None else message_arrow(src)
                key = os.path.basename(path).split("-", 1)[0]  # the side file's partition: one judge each
                sink = None if pending is None else Pending(pending, quarantine_arrow(src), key)
                task = _Task(limits, unit_of_work, payload_dir, threshold, src is not None, sink)
                for rows in task.judged(read_side(path)):
                    batch = pa.RecordBatch.from_pylist(rows, schema=schema)
                    # The rows' payloads are in the batch now: the list (``judged`` holds it too
                    # until it resumes) must not keep them while Spark writes the batch out.
                    rows.clear()
                    yield batch

    return judge


def make_judge(
    limits: Limits,
    unit_of_work: bool,
    payload_dir: str | None,
    threshold: int | None,
    lineage: Any = None,
    pending: str | None = None,
) -> Any:
    """The UDF: ``struct(routable, pk, large, blob, meta)`` (NULL for clean rows) -> output rows.

    ``large``: a per-offset aggregate. Its rows, and every row of a main aggregate that has far
    rows, go to the task's large assembler, which judges those messages when the task's input ends.
    ``lineage``: the kept columns' pyspark StructType (their values travel in ``meta``), or None.
    ``pending``: a directory for the tasks' :class:`Pending` files (the UDF then returns message rows only).
    """
    from pyspark.sql.functions import arrow_udf  # type: ignore[attr-defined]
    from pyspark.sql.types import ArrayType

    from reassembly.spark.schema import combined_spark

    returns: Any = ROWS_DDL if lineage is None else ArrayType(combined_spark(lineage))

    @arrow_udf(returns)  # type: ignore[untyped-decorator]
    def judge(batches: Iterator[pa.Array]) -> Iterator[pa.Array]:
        ahead = (arr for arr in batches if len(arr))  # read one batch ahead: the last row must be known
        arr = next(ahead, None)
        src = None if arr is None or lineage is None else src_type(arr.type.field("meta").type)
        out_type = ROWS_ARROW if src is None else pa.list_(pa.struct(list(combined_arrow(src))))
        sink = None if pending is None else Pending(pending, quarantine_arrow(src))
        task = _Task(limits, unit_of_work, payload_dir, threshold, src is not None, sink)
        while arr is not None:
            following = next(ahead, None)
            yield from task.outputs(arr, last=following is None, out_type=out_type)
            arr = following
        task.finish()  # runs once Spark has taken the last output, before the task can commit

    return judge
