"""``reassemble_stream``: segments that keep arriving, reassembled on Spark's arbitrary state.

Keyed by GroupId, ``transformWithState`` (Row API, RocksDB state store, event
time). Per key the state holds the raw segments received so far (list state,
bounded in bytes), their first event time, a summary of their headers, and after
the key is decided a small tombstone. What is decided and how is in
:mod:`.core` (the batch assembler, run on the held segments when the
summary says new ones could complete something), so the rows are the batch
job's rows for the same segments; :class:`~.processor.Reassembler` reads and
writes the state (:mod:`.layout`) and asks the core.

Time is event time only (timers fire when the watermark passes them): this is
what lets ``trigger(availableNow=True)`` end, and makes a replayed batch
decide exactly as the first attempt did.

:class:`BatchWriter` is the exactly-once sink: ``foreachBatch`` writing each
micro-batch into ``batch=N`` folders, committed by a marker file; a batch
replayed after a crash (same id, same input, same state version: the same
rows) finds its marker and is skipped, or, without it, is written again from
scratch. The marker also records what state holds after the batch (the sum
of the ``state`` rows so far): the status line's exact state fields.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reassembly.spark.pipeline import ReassemblyOptions
from reassembly.spark.schema import OUTPUT_DDL, ColumnNames
from reassembly.spark.state_store import CHANGELOG, ROCKSDB, configure, require_rocksdb
from reassembly.spark.stream.core import KIND_DUPLICATE, Footprint
from reassembly.spark.stream.layout import FOOTPRINT_COLUMNS, KIND_STATE, LAYOUT, STATE
from reassembly.spark.stream.spool import Spool
from reassembly.spark.writer import parquet_writer
from segmenter.header_table import FIELD
from segmenter.wire import GROUP_ID_LENGTH

# Where the GroupId sits in a header: from the header table, like every decoder (no literal offset).
_GROUP_ID_AT = FIELD["group_id"].offset

FOLDERS = {"message": "messages", "quarantine": "quarantine", KIND_DUPLICATE: "duplicates"}


@dataclass(frozen=True)
class StreamOptions:
    """How to reassemble a stream. Times are event time, in seconds."""

    reassembly: ReassemblyOptions = field(default_factory=ReassemblyOptions)  # unit_of_work, max_message_size
    expire_after: float = 3600.0  # an undecided key leaves as incomplete this long after its first segment
    watermark: float = 600.0  # how far event time may run behind the newest seen (Spark drops rows older)
    tombstone: float = 86400.0  # how long a decided key is remembered to judge late segments
    max_held_bytes: int = 256 << 20  # raw bytes held per key; a key that would exceed it is evicted first


def spool_of(opts: StreamOptions) -> Spool | None:
    """Large messages go to disk when a body directory is set (``reassembly.payload_dir``)."""
    r = opts.reassembly
    return None if r.payload_dir is None else Spool(r.payload_dir, r.large_message_bytes, r.max_message_size)


# A checkpoint's state layout (layout.LAYOUT, layout.STATE) is recorded in CHECKPOINT/_reassembly.json at
# its first start (see bind_checkpoint); the schemas are recorded as they are.
MANIFEST = "_reassembly.json"
# A checkpoint begun before the manifest existed was written by layout 1 (Spark's own files, no manifest).
_SPARK_FILES = ("offsets", "commits", "state")


class CheckpointMismatch(ValueError):
    """A checkpoint whose state this version, or these options, would misread: refused, not continued."""


def _bound(opts: StreamOptions) -> dict[str, Any]:
    """The options the held state depends on: Unit of Work (what a summary and a partial group mean) and
    the body directory (held rows point into its spool files). The others may change between runs."""
    r = opts.reassembly
    return {
        "unit_of_work": r.unit_of_work,
        "payload_dir": None if r.payload_dir is None else os.path.abspath(r.payload_dir),
    }


def _described(state: Any) -> str:
    """A manifest's state variables in a few words (their names; or what the manifest says instead)."""
    return f"state variables {', '.join(state)}" if isinstance(state, dict) else str(state)


def bind_checkpoint(checkpoint: str, options: StreamOptions | None = None) -> None:
    """Refuse a checkpoint begun by a version with another state layout, or with other state-bound
    options (:class:`CheckpointMismatch`, naming what differs; nothing is touched); else record this
    version's layout (and the options, when given) in it. Spark checks its own part (the number of
    state partitions, the source); this guards what our state variables mean. A checkpoint that is
    not a local path (``hdfs://...``) is not checked."""
    if "://" in checkpoint and not checkpoint.startswith("file:"):
        return
    root = Path(checkpoint.removeprefix("file://").removeprefix("file:"))
    path = root / MANIFEST
    now: dict[str, Any] = {"layout": LAYOUT, "state": STATE, "options": None if options is None else _bound(options)}
    try:
        was = json.loads(path.read_text())
    except FileNotFoundError:  # a new checkpoint, or one begun before the manifest (by layout 1)
        begun = any((root / name).exists() for name in _SPARK_FILES)
        was = {"layout": 1, "state": "no manifest: begun before it"} if begun else None
    if was is not None:
        if any(was.get(k) != now[k] for k in ("layout", "state")):
            raise CheckpointMismatch(
                f"checkpoint {checkpoint} holds state of layout {was.get('layout')} ({_described(was.get('state'))});"
                f" this version reads layout {LAYOUT} ({_described(STATE)}): let a version of layout"
                f" {was.get('layout')} finish it, then start a new checkpoint and output"
            )
        old, new = was.get("options"), now["options"]
        if old is not None and new is not None and old != new:
            changed = {k: (old.get(k), v) for k, v in new.items() if old.get(k) != v}
            raise CheckpointMismatch(
                f"checkpoint {checkpoint} was begun with other state-bound options "
                + ", ".join(f"{k}={a!r} (now {b!r})" for k, (a, b) in changed.items())
                + ": use the same ones, or start a new checkpoint and output"
            )
        if new is None or old == new:
            return
    root.mkdir(parents=True, exist_ok=True)
    pending = root / f".{MANIFEST}.tmp"
    pending.write_text(json.dumps(now, indent=1) + "\n")
    os.replace(pending, path)


# A directory: every state task's Python processor is profiled (cProfile from init to close, one file each;
# the ncalls of the state clients' methods are the round trips). For the bench; off by default.
PROFILE = "REASSEMBLY_STREAM_PROFILE"


def _processor(opts: StreamOptions) -> Any:
    """The stateful processor for these options (its module imports pyspark: only once a stream is set up).
    The profile directory is read here, on the driver: the instance carries it to the workers."""
    from reassembly.spark.stream.processor import Reassembler

    return Reassembler(
        limits=opts.reassembly.limits(),
        unit_of_work=opts.reassembly.unit_of_work,
        max_held_bytes=opts.max_held_bytes,
        expire_ms=int(opts.expire_after * 1000),
        tombstone_ms=int(opts.tombstone * 1000),
        large_message_bytes=opts.reassembly.large_message_bytes,
        spool=spool_of(opts),
        profile=os.environ.get(PROFILE) or None,
    )


def reassemble_stream(
    df: Any,
    *,
    event_time: str = "event_time",
    encoded: bool = True,
    raw_column: str = "segment",
    columns: ColumnNames | None = None,
    options: StreamOptions | None = None,
) -> Any:
    """Reassemble a streaming DataFrame of segments (encoded, or as columns as for the batch
    :func:`~reassembly.spark.reassemble`: see :class:`ColumnNames`); returns the stream of output rows.

    ``event_time`` names a timestamp column of ``df`` (for a file source, e.g.
    ``_metadata.file_modification_time`` selected as a column; for Kafka, the
    record ``timestamp``). Rows are the batch job's combined schema
    (:data:`~reassembly.spark.schema.OUTPUT_DDL`); ``kind`` is ``message``,
    ``quarantine``, ``duplicate`` (an identical copy of a segment whose
    message had already left: counted, no bytes) or ``state`` (the change of
    what state holds for one key: see :data:`KIND_STATE`; drop them or sum
    them). The session must use the RocksDB state store provider
    (:data:`ROCKSDB`; :func:`configure` sets it).
    """
    from pyspark.sql import functions as F

    opts = options or StreamOptions()
    require_rocksdb(df.sparkSession, "streaming reassembly")
    if not encoded:  # encoded row by row beside its event time: then the same path as encoded input
        from reassembly.spark.columns import encode_columns

        df, raw_column = encode_columns(df, columns or ColumnNames(), keep=(event_time,)), "segment"
    rows = df.select(
        F.col(raw_column).alias("raw"),
        F.col(event_time).cast("timestamp").alias("event_time"),
    ).withWatermark("event_time", f"{int(opts.watermark * 1000)} milliseconds")
    keyed = rows.select(
        F.coalesce(F.substring("raw", _GROUP_ID_AT + 1, GROUP_ID_LENGTH), F.expr("X''")).alias("key"),
        "raw",
        F.expr("unix_millis(event_time)").alias("event_ms"),
        "event_time",
    )
    return keyed.groupBy("key").transformWithState(
        statefulProcessor=_processor(opts),
        outputStructType=OUTPUT_DDL,
        outputMode="Append",
        timeMode="EventTime",
    )


def _without_frames(exc: Exception) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip() and not line.startswith(("\tat ", "\t..."))]
    first, *rest = lines or [""]
    return "\n".join([f"py4j.protocol.Py4JJavaError: {first}", *rest])


class SinkError(RuntimeError):
    """A Spark error while the sink wrote a batch (the batch is not committed: it is replayed)."""


class BatchWriter:
    """``foreachBatch`` sink, idempotent by batch id: OUTPUT/{messages,quarantine,duplicates}/batch=N.

    A batch is written to OUTPUT/_incoming/batch=N, its folders renamed into
    place, then OUTPUT/_commits/N marks it done. A replay of a committed batch
    is skipped; a replay of an uncommitted one first removes what the crashed
    attempt left. Readers that must never see a batch being renamed read only
    the batches listed in ``_commits``.
    """

    def __init__(
        self, out: Path, on_batch: Callable[[int, Counter[str]], None] | None = None, spool: Spool | None = None
    ) -> None:
        self.out = out
        self.on_batch = on_batch
        self.spool = spool
        for name in (*FOLDERS.values(), "_commits", "_incoming"):
            (out / name).mkdir(parents=True, exist_ok=True)

    def __call__(self, df: Any, batch_id: int) -> None:
        from py4j.protocol import Py4JJavaError  # type: ignore[import-untyped]

        try:
            self._write(df, batch_id)
        except Py4JJavaError as exc:
            # A stop() during the write interrupts it; Spark tells that from a failure by matching the
            # error's text with StreamExecution.PROXY_ERROR, "py4j.protocol.Py4JJavaError: An error occurred
            # while calling((.|\r\n|\r|\n)*)(java.lang.InterruptedException|...)", which recurses once per
            # character after its start: on the Java stack trace that follows, the stream thread's stack
            # overflows (a StackOverflowError printed at stop). The same text without the stack frames
            # ("at ..." lines; the exception and its causes kept) is matched at once, as Spark intends.
            raise SinkError(_without_frames(exc)) from None

    def _write(self, df: Any, batch_id: int) -> None:
        marker = self.out / "_commits" / str(batch_id)
        if marker.exists():
            self._drop(batch_id)  # a crash may have come between the marker and the clean-up
            return
        part = f"batch={batch_id}"
        tmp = self.out / "_incoming" / part
        for stale in (tmp, *(self.out / f / part for f in FOLDERS.values())):
            shutil.rmtree(stale, ignore_errors=True)
        parquet_writer(df).partitionBy("kind").parquet(str(tmp))
        counts = _counts(tmp)
        before = Footprint() if batch_id == 0 else state_after(self.out, batch_id - 1)
        if before is not None:  # None: the checkpoint was started by a version that kept no accounting
            after = before.plus(_change(tmp))
            counts.update({f"state:{k}": v for k, v in after._asdict().items()})
        for kind, folder in FOLDERS.items():
            src = tmp / f"kind={kind}"
            if src.exists():
                src.rename(self.out / folder / part)
        shutil.rmtree(tmp)
        pending = marker.with_name(f".{batch_id}.tmp")
        pending.write_text(_summary(counts))
        os.replace(pending, marker)
        self._drop(batch_id)
        if self.on_batch is not None:
            self.on_batch(batch_id, counts)

    def _drop(self, batch_id: int) -> None:
        """Spool files of the messages whose rows batch ``batch_id`` committed (no replay needs them now)."""
        if self.spool is None:
            return
        import pyarrow.parquet as pq

        for f in (self.out / FOLDERS["message"] / f"batch={batch_id}").glob("*.parquet"):
            keys = pq.read_table(f, columns=["group_id", "msg_seq_number"]).to_pydict()
            for gid, seq in zip(keys["group_id"], keys["msg_seq_number"], strict=True):
                self.spool.drop(gid, seq)


def _counts(tmp: Path) -> Counter[str]:
    """Rows of one written batch by kind and status (read back from its Parquet: the batch is not recomputed)."""
    import pyarrow.parquet as pq

    counts: Counter[str] = Counter()
    for kind in FOLDERS:
        for f in sorted((tmp / f"kind={kind}").glob("*.parquet")):
            cols = pq.read_table(f, columns=["status", "reason_name"]).to_pydict()
            for status, reason in zip(cols["status"], cols["reason_name"], strict=True):
                if kind == "message":
                    counts[f"message:{status}"] += 1
                elif kind == "quarantine":
                    counts["quarantine"] += 1
                    counts["late"] += reason == "LATE_SEGMENT"
                else:
                    counts["duplicate"] += 1
    return counts


def _change(tmp: Path) -> Footprint:
    """The sum of a written batch's ``state`` rows: how much its calls changed what state holds."""
    import pyarrow.parquet as pq

    total = Footprint()
    for f in sorted((tmp / f"kind={KIND_STATE}").glob("*.parquet")):
        cols = pq.read_table(f, columns=list(FOOTPRINT_COLUMNS.values())).to_pydict()
        total = total.plus(Footprint(*(sum(cols[c]) for c in FOOTPRINT_COLUMNS.values())))
    return total


def _summary(counts: Counter[str]) -> str:
    return "".join(f"{k} {v}\n" for k, v in sorted(counts.items()))


def batch_counts(out: Path, batch_id: int) -> Counter[str] | None:
    """What a committed batch's marker records (rows by kind and status, ``state:*`` after it), or None."""
    try:
        text = (out / "_commits" / str(batch_id)).read_text()
    except FileNotFoundError:
        return None
    return Counter({k: int(v) for k, v in (line.split(" ") for line in text.splitlines())})


def state_after(out: Path, batch_id: int | None = None) -> Footprint | None:
    """What state held after a committed batch (default: the last one); None if that is not known
    (no such batch, or a checkpoint begun by a version that kept no accounting)."""
    if batch_id is None:
        batches = committed_batches(out)
        if not batches:
            return None
        batch_id = batches[-1]
    counts = batch_counts(out, batch_id)
    if counts is None or "state:groups" not in counts:
        return None
    return Footprint(*(counts[f"state:{k}"] for k in Footprint._fields))


def committed_batches(out: Path) -> list[int]:
    """The batch ids whose output is complete (what a reader should read)."""
    return sorted(int(p.name) for p in (out / "_commits").iterdir() if p.name.isdigit())


def read_committed(out: Path, kind: str) -> list[dict[str, Any]]:
    """Every committed row of one kind (``message``, ``quarantine``, ``duplicate``), with its ``batch``."""
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = []
    for n in committed_batches(out):
        for f in sorted((out / FOLDERS[kind] / f"batch={n}").glob("*.parquet")):
            rows += [{**r, "batch": n} for r in pq.read_table(f).to_pylist()]
    return rows


def file_source(
    spark: Any, path: str, *, raw_column: str = "segment", event_time: str | None = None, max_files: int | None = None
) -> Any:
    """A landing directory of Parquet files as a stream, with ``event_time``: the named column, or by
    default each file's modification time (its arrival, from the source's metadata)."""
    from pyspark.sql import functions as F

    schema = f"`{raw_column}` binary" + (f", `{event_time}` timestamp" if event_time else "")
    # Spark's file source ignores, without a word, a file whose modification time is more than
    # maxFileAge (default 7 days) older than the newest file it has seen: a landing file copied with
    # its old mtime (cp -p, rsync -t) would never be read. Ten years: every file is read; the price
    # is the source remembering every file name seen (as its checkpoint log does anyway).
    reader = spark.readStream.schema(schema).option("maxFileAge", "3650d")
    if max_files is not None:
        reader = reader.option("maxFilesPerTrigger", max_files)
    df = reader.parquet(path)
    t = F.col(event_time) if event_time else F.col("_metadata.file_modification_time")
    return df.select(F.col(raw_column).alias("segment"), t.alias("event_time"))


def start(
    stream: Any,
    out: Path,
    checkpoint: str,
    trigger: str,
    on_batch: Callable[[int, Counter[str]], None] | None = None,
    options: StreamOptions | None = None,
) -> Any:
    """Start writing ``stream`` (from :func:`reassemble_stream`) to ``out``; ``trigger`` is
    ``available-now`` or a processing-time interval such as ``10 seconds``. Pass the stream's
    ``options`` when they set a ``payload_dir``: the sink removes committed messages' spool files.
    A checkpoint that the stream's state would be misread from is refused first (:func:`bind_checkpoint`;
    pass ``options`` for its options to be checked too)."""
    bind_checkpoint(checkpoint, options)
    sink = BatchWriter(out, on_batch, spool_of(options) if options is not None else None)
    writer = stream.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
    writer = writer.trigger(availableNow=True) if trigger == "available-now" else writer.trigger(processingTime=trigger)
    return writer.start()


__all__ = [
    "CHANGELOG",
    "ROCKSDB",
    "BatchWriter",
    "CheckpointMismatch",
    "SinkError",
    "LAYOUT",
    "MANIFEST",
    "PROFILE",
    "StreamOptions",
    "KIND_STATE",
    "batch_counts",
    "bind_checkpoint",
    "committed_batches",
    "configure",
    "file_source",
    "read_committed",
    "reassemble_stream",
    "start",
    "state_after",
]
