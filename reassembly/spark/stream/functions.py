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
of the ``state`` rows so far) and the first event time of the oldest key still
open (from the set of open keys kept beside the markers, ``_open/N.parquet``):
the status line's exact state fields. The stream's per-batch counts are also
published as Spark observed metrics (:data:`OBSERVATION`), in each
``StreamingQueryProgress.observedMetrics``.

:func:`file_source` reads the landing files' own schema and refuses input that
cannot be what was meant before the stream is set up (:mod:`reassembly.spark.inputs`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reassembly.spark.batch.pipeline import ReassemblyOptions, check_keep_columns
from reassembly.spark.engine.bridge import SRC
from reassembly.spark.engine.environment import check_worker_python, configure
from reassembly.spark.engine.state_store import CHANGELOG, ROCKSDB, require_rocksdb
from reassembly.spark.inputs import InputRefused, SegmentInput, check_input, check_schema
from reassembly.spark.schema import OUTPUT_DDL, SOURCES, ColumnNames, combined_spark, folder_columns
from reassembly.spark.stream.core import KIND_DUPLICATE, Footprint
from reassembly.spark.stream.layout import FOOTPRINT_COLUMNS, KIND_STATE, LAYOUT, OPENED_COLUMN, STATE
from reassembly.spark.stream.spool import Spool
from reassembly.spark.writer import parquet_writer, project_folder
from segmenter.header_table import FIELD
from segmenter.wire import GROUP_ID_LENGTH

if TYPE_CHECKING:
    from reassembly.spark.footers import Footers

logger = logging.getLogger(__name__)

# Where the GroupId sits in a header: from the header table, like every decoder (no literal offset).
_GROUP_ID_AT = FIELD["group_id"].offset

FOLDERS = {"message": "messages", "quarantine": "quarantine", KIND_DUPLICATE: "duplicates"}


@dataclass(frozen=True)
class StreamOptions:
    """How to reassemble a stream. Times are event time, in seconds."""

    reassembly: ReassemblyOptions = field(default_factory=ReassemblyOptions)
    """How each key's messages are judged (``unit_of_work``, ``max_message_size``, ``digest``,
    ``payload_dir``, ``large_message_bytes``, ``keep_columns``; the batch-only ones are not used)."""
    expire_after: float = 3600.0
    """Seconds of event time after a key's first segment at which a key still undecided leaves as
    incomplete."""
    watermark: float = 600.0
    """Seconds event time may run behind the newest seen; Spark drops rows older than that (counted as
    ``dropped_by_watermark``)."""
    tombstone: float = 86400.0
    """Seconds of event time a decided key is remembered, so a late segment of it is judged as late
    (quarantined), not as the start of a new message."""
    max_held_bytes: int = 256 << 20
    """Raw segment bytes held per key at most; a key that would hold more is decided at once as
    evicted, before anything more is stored, so one key cannot grow the state without bound."""


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
        # held rows carry the kept columns (lineage): recorded only when kept, so earlier checkpoints match
        **({"keep_columns": list(r.keep_columns)} if r.keep_columns else {}),
    }


def _described(state: Any) -> str:
    """A manifest's state variables in a few words (their names; or what the manifest says instead)."""
    return f"state variables {', '.join(state)}" if isinstance(state, dict) else str(state)


def bind_checkpoint(checkpoint: str, options: StreamOptions | None = None) -> None:
    """Refuse a checkpoint begun by a version with another state layout, or with other state-bound
    options (:class:`CheckpointMismatch`, naming what differs; nothing is touched); else record this
    version's layout (and the options, when given) in it. Spark checks its own part (the number of
    state partitions, the source); this guards what our state variables mean. A checkpoint that is
    not a local path (``hdfs://...``) is not checked.

    ``checkpoint``: the stream's checkpoint location. ``options``: the stream's options, whose state-bound ones are
    checked and recorded (None: only the layout).
    """
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
            changed = {k: (old.get(k), new.get(k)) for k in {**old, **new} if old.get(k) != new.get(k)}
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


def _processor(opts: StreamOptions, lineage: Any = None) -> Any:
    """The stateful processor for these options (its module imports pyspark: only once a stream is set up).
    The profile directory is read here, on the driver: the instance carries it to the workers.
    ``lineage``: the kept columns' StructType (None: nothing kept)."""
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
        lineage=lineage,
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

    ``encoded``: each row holds one encoded segment in the binary column ``raw_column`` (True), or
    its header fields and data as columns named by ``columns`` (False). ``options``: how to
    reassemble and how long to wait (:class:`StreamOptions`).
    ``event_time`` names a timestamp column of ``df`` (for a file source, e.g.
    ``_metadata.file_modification_time`` selected as a column; for Kafka, the
    record ``timestamp``). Rows are the batch job's combined schema
    (:data:`~reassembly.spark.schema.OUTPUT_DDL`); ``kind`` is ``message``,
    ``quarantine``, ``duplicate`` (an identical copy of a segment whose
    message had already left: counted, no bytes) or ``state`` (the change of
    what state holds for one key: see :data:`KIND_STATE`; drop them or sum
    them). The session must use the RocksDB state store provider
    (:data:`ROCKSDB`; :func:`configure` sets it).

    ``df`` must have the columns named (the segment column binary; as columns, those of
    :class:`ColumnNames` with their types) and ``event_time``:
    :class:`~reassembly.spark.inputs.InputRefused` (a UsageError) names what is missing and what
    ``df`` has, before anything runs. Each batch's counts are published as the observed metrics
    :data:`OBSERVATION` (see :func:`observed`). Columns kept (``options.reassembly.keep_columns``)
    come out unchanged as each row's ``source`` / ``sources`` (docs/reference/output-schema.md).
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    opts = options or StreamOptions()
    require_rocksdb(df.sparkSession, "streaming reassembly")
    check_schema(df.schema, SegmentInput(encoded, raw_column, columns or ColumnNames()), event_time=event_time)
    keep = check_keep_columns(
        df, opts.reassembly.keep_columns, raw_column if encoded else (columns or ColumnNames()).data
    )
    check_worker_python(df.sparkSession)  # the one eager step: a worker Python without the library, in one line
    lineage = StructType([df.schema[k] for k in keep]) if keep else None
    if not encoded:  # encoded row by row beside its event time: then the same path as encoded input
        from reassembly.spark.columns import encode_columns

        df, raw_column = encode_columns(df, columns or ColumnNames(), keep=(event_time, *keep)), "segment"
    src = [F.struct(*[F.col(_quoted(k)) for k in keep]).alias(SRC)] if keep else []
    rows = df.select(
        F.col(raw_column).alias("raw"),
        F.col(event_time).cast("timestamp").alias("event_time"),
        *src,
    ).withWatermark("event_time", f"{int(opts.watermark * 1000)} milliseconds")
    keyed = rows.select(
        F.coalesce(F.substring("raw", _GROUP_ID_AT + 1, GROUP_ID_LENGTH), F.expr("X''")).alias("key"),
        "raw",
        F.expr("unix_millis(event_time)").alias("event_ms"),
        "event_time",
        *([SRC] if keep else []),
    )
    return observed(
        keyed.groupBy("key").transformWithState(
            statefulProcessor=_processor(opts, lineage),
            outputStructType=OUTPUT_DDL if lineage is None else combined_spark(lineage),
            outputMode="Append",
            timeMode="EventTime",
        )
    )


OBSERVATION = "reassembly"
"""The name of the stream's observed metrics (``query.lastProgress.observedMetrics["reassembly"]``)."""

STATUSES = ("complete", "incomplete", "corrupt", "conflict", "invalid", "group_failed", "too_big")
"""Every message status (:class:`reassembly.spark.rows.Status`), one observed metric each."""


def observed(rows: Any) -> Any:
    """``rows`` (the stream's output) with its per-batch counts as Spark observed metrics named
    :data:`OBSERVATION`: ``messages`` and ``messages_<status>`` for each of :data:`STATUSES`,
    ``segments_used`` and ``message_duplicates`` (summed over the messages), ``quarantined``,
    ``late`` (of those, segments after their group was decided) and ``duplicates`` (copies of
    segments already delivered). Spark computes them as the sink writes the batch and reports them
    in the batch's ``StreamingQueryProgress.observedMetrics``, so its UI, listeners and metrics
    sinks see them; ``state`` rows are not counted."""
    from pyspark.sql import functions as F

    kind, status = F.col("kind"), F.col("status")
    message = kind == "message"

    def count(condition: Any, name: str) -> Any:
        return F.count(F.when(condition, 1)).alias(name)

    def total(column: str, name: str) -> Any:
        return F.coalesce(F.sum(F.when(message, F.col(column))), F.lit(0)).cast("bigint").alias(name)

    return rows.observe(
        OBSERVATION,
        count(message, "messages"),
        *(count(message & (status == s), f"messages_{s}") for s in STATUSES),
        total("segments_used", "segments_used"),
        total("duplicates", "message_duplicates"),
        count(kind == "quarantine", "quarantined"),
        count((kind == "quarantine") & (F.col("reason_name") == "LATE_SEGMENT"), "late"),
        count(kind == KIND_DUPLICATE, "duplicates"),
    )


def _without_frames(exc: Exception) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip() and not line.startswith(("\tat ", "\t..."))]
    first, *rest = lines or [""]
    return "\n".join([f"py4j.protocol.Py4JJavaError: {first}", *rest])


class SinkError(RuntimeError):
    """A Spark error while the sink wrote a batch (the batch is not committed: it is replayed)."""


class Halt:
    """A request to stop a stream after the batch in flight (the command's Ctrl-C), shared with its sink.

    :meth:`request` names the batch that may still commit (None: none is running). A later batch
    that reaches the sink writes nothing: it waits until :attr:`stopping` is set (right before
    ``query.stop()``) and ends as interrupted, so Spark counts the query as stopped, not failed, and
    reads that batch's input again at the next start. So no batch runs after the one named, even
    one Spark begins in the instant between that batch's commit and the stop.
    """

    def __init__(self) -> None:
        self.requested = threading.Event()
        self.stopping = threading.Event()
        self.after: int | None = None

    def request(self, after: int | None) -> None:
        self.after = after
        self.requested.set()

    def holds(self, batch_id: int) -> bool:
        """Whether batch ``batch_id`` must not be written (a stop was asked for before it)."""
        return self.requested.is_set() and (self.after is None or batch_id > self.after)


# How long a held batch waits for the stop, and then for Spark to mark the query as being stopped.
_HALT_WAIT, _HALT_SETTLE = 120.0, 0.5


class BatchWriter:
    """``foreachBatch`` sink, idempotent by batch id: OUTPUT/{messages,quarantine,duplicates}/batch=N.

    A batch is written to OUTPUT/_incoming/batch=N, its folders renamed into
    place, then OUTPUT/_commits/N marks it done. A replay of a committed batch
    is skipped; a replay of an uncommitted one first removes what the crashed
    attempt left. Readers that must never see a batch being renamed read only
    the batches listed in ``_commits``. With a :class:`Halt`, a batch after the
    one a stop was asked for is not written.

    ``out``: the output directory. ``on_batch``: called as ``on_batch(batch_id, counts)`` once a batch is committed,
    with its rows by kind and status (None: nothing called). ``spool``: the stream's spool, whose files of the messages
    a batch wrote are removed once it is committed (None: no spool). ``halt``: the stop request batches are checked
    against (None: every batch is written).
    """

    def __init__(
        self,
        out: Path,
        on_batch: Callable[[int, Counter[str]], None] | None = None,
        spool: Spool | None = None,
        halt: Halt | None = None,
    ) -> None:
        self.out = out
        self.on_batch = on_batch
        self.spool = spool
        self.halt = halt
        for name in (*FOLDERS.values(), "_commits", "_incoming"):
            (out / name).mkdir(parents=True, exist_ok=True)

    def __call__(self, df: Any, batch_id: int) -> None:
        from py4j.protocol import Py4JJavaError  # type: ignore[import-untyped]

        if self.halt is not None and self.halt.holds(batch_id):
            self.halt.stopping.wait(_HALT_WAIT)
            time.sleep(_HALT_SETTLE)  # stop() marks the query terminated, then waits for this call to return
            # The text Spark takes for an interrupted stop (StreamExecution.PROXY_ERROR), not a failure.
            raise SinkError(
                "py4j.protocol.Py4JJavaError: An error occurred while calling the sink.\n"
                f": java.lang.InterruptedException: batch {batch_id} not written: the stream is stopping"
            )
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
            oldest = _open_keys(self.out, tmp, batch_id, before)
            if oldest is not None:
                counts[OLDEST] = oldest
        kept = SOURCES in df.columns
        for kind, folder in FOLDERS.items():
            src = tmp / f"kind={kind}"
            if src.exists():  # each folder with exactly its columns (schema.py), not every kind's
                project_folder(src, self.out / folder / part, folder_columns(kind, kept))
        shutil.rmtree(tmp)
        pending = marker.with_name(f".{batch_id}.tmp")
        pending.write_text(_summary(counts))
        os.replace(pending, marker)
        for older in (self.out / OPEN_KEYS).glob("*.parquet"):  # a replay of the next batch reads this one's
            if older.stem.isdigit() and int(older.stem) < batch_id:
                older.unlink(missing_ok=True)
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
    """Rows of one written batch by kind and status (read back from its Parquet: the batch is not
    recomputed); ``used`` and ``message_duplicates``: the segments its messages used and the identical
    copies they counted (with the ``duplicate`` rows, every copy: the batch job's ``duplicates``)."""
    import pyarrow.parquet as pq

    counts: Counter[str] = Counter({"used": 0, "message_duplicates": 0})
    for kind in FOLDERS:
        for f in sorted((tmp / f"kind={kind}").glob("*.parquet")):
            cols = pq.read_table(f, columns=["status", "reason_name", "segments_used", "duplicates"]).to_pydict()
            for status, reason, used, copies in zip(
                cols["status"], cols["reason_name"], cols["segments_used"], cols["duplicates"], strict=True
            ):
                if kind == "message":
                    counts[f"message:{status}"] += 1
                    counts["used"] += used or 0
                    counts["message_duplicates"] += copies or 0
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


OPEN_KEYS = "_open"
"""OUTPUT/_open/N.parquet: the keys open after batch N (``group_id``, ``first_ms``), for the next batch."""
OLDEST = "state:oldest_ms"
"""A marker's entry: the first event time (epoch ms) of the oldest key held open after the batch."""


def _open_keys(out: Path, tmp: Path, batch_id: int, before: Footprint) -> int | None:
    """The keys open after batch ``batch_id`` (those open before it, less those its ``state`` rows
    closed, plus those they opened), written to OUTPUT/_open/N.parquet; returns the first event
    time of the oldest of them, or None when none is open or that is not known (open keys of a
    checkpoint begun by a version that kept no such set: known again once none is open). One read
    and one write of the open keys per batch: 32 bytes each."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    schema = pa.schema([("group_id", pa.binary()), ("first_ms", pa.int64())])
    previous = out / OPEN_KEYS / f"{batch_id - 1}.parquet"
    if before.groups == 0:
        held = schema.empty_table()
    elif previous.exists():
        held = pq.read_table(previous, schema=schema)
    else:
        return None
    groups = FOOTPRINT_COLUMNS["groups"]
    files = sorted((tmp / f"kind={KIND_STATE}").glob("*.parquet"))
    if files:
        rows = pa.concat_tables(pq.read_table(f, columns=["group_id", groups, OPENED_COLUMN]) for f in files)
        net = rows.group_by("group_id").aggregate([(groups, "sum"), (OPENED_COLUMN, "max")])
        changed = net.filter(pc.not_equal(net[f"{groups}_sum"], 0))["group_id"].combine_chunks()  # opened, closed
        opened = net.filter(pc.greater(net[f"{groups}_sum"], 0))
        held = pa.concat_tables(
            [
                held.filter(pc.invert(pc.is_in(held["group_id"], value_set=changed))),
                pa.table([opened["group_id"], opened[f"{OPENED_COLUMN}_max"].cast(pa.int64())], schema=schema),
            ]
        )
    (out / OPEN_KEYS).mkdir(exist_ok=True)
    pending = out / OPEN_KEYS / f".{batch_id}.tmp"
    pq.write_table(held, pending)
    os.replace(pending, out / OPEN_KEYS / f"{batch_id}.parquet")
    oldest = pc.min(held["first_ms"]).as_py()
    return None if oldest is None else int(oldest)


def _summary(counts: Counter[str]) -> str:
    return "".join(f"{k} {v}\n" for k, v in sorted(counts.items()))


def batch_counts(out: Path, batch_id: int) -> Counter[str] | None:
    """What a committed batch's marker records (rows by kind and status, ``state:*`` after it), or None.

    ``out``: the stream's output directory. ``batch_id``: the micro-batch.
    """
    try:
        text = (out / "_commits" / str(batch_id)).read_text()
    except FileNotFoundError:
        return None
    return Counter({k: int(v) for k, v in (line.split(" ") for line in text.splitlines())})


def state_after(out: Path, batch_id: int | None = None) -> Footprint | None:
    """What state held after a committed batch (default: the last one); None if that is not known
    (no such batch, or a checkpoint begun by a version that kept no accounting).

    ``out``: the stream's output directory. ``batch_id``: the micro-batch (None: the last committed).
    """
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
    """The batch ids whose output is complete (what a reader should read).

    ``out``: the stream's output directory.
    """
    return sorted(int(p.name) for p in (out / "_commits").iterdir() if p.name.isdigit())


def read_committed(out: Path, kind: str) -> list[dict[str, Any]]:
    """Every committed row of one kind (``message``, ``quarantine``, ``duplicate``), with its ``batch``.

    ``out``: the stream's output directory. ``kind``: which rows.
    """
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = []
    for n in committed_batches(out):
        for f in sorted((out / FOLDERS[kind] / f"batch={n}").glob("*.parquet")):
            rows += [{**r, "batch": n} for r in pq.read_table(f).to_pylist()]
    return rows


def file_source(
    spark: Any,
    path: str,
    *,
    raw_column: str = "segment",
    event_time: str | None = None,
    max_files: int | None = None,
    encoded: bool = True,
    columns: ColumnNames | None = None,
    keep: tuple[str, ...] = (),
    input_file: str | None = None,
    footers: Footers | None = None,
) -> Any:
    """The landing directory ``path`` of Parquet files as a stream of ``spark``, with ``event_time``: the named column,
    or by default each file's modification time (its arrival, from the source's metadata). ``keep``: other columns
    of the files to pass on (to keep them: ``ReassemblyOptions(keep_columns=...)``; their types are read from the
    files that have landed, so at least one must have); ``input_file``: a column of that name with each row's file
    path, too. ``max_files``: files per micro-batch at most (None: every file that has landed). Encoded input
    (``encoded``, the segments in ``raw_column``) comes as columns ``segment`` and ``event_time``; column input
    (``encoded`` False, the columns ``columns`` names) as those columns and ``event_time``. The schema is the files'
    own, read from those that have landed, and the input is checked before the stream is set up
    (:func:`~reassembly.spark.inputs.check_input`): a named column missing or of another type, or a segment column
    none of whose first 100 values frames as a segment, raises :class:`~reassembly.spark.inputs.InputRefused` (a
    UsageError, one line naming the columns found) and nothing is read. With no file yet there is nothing to check:
    the columns are taken as named (the segment column binary), and a file landing later without them reads as NULLs
    (quarantined as such); ``reassemble stream`` waits for the first file instead.

    ``footers``: what :func:`~reassembly.spark.footers.check_files` told of the landed files (the
    command's check before Spark starts): their schema is taken from it instead of a Spark job
    inferring it, and where it sampled the first values Spark does not sample them again."""
    from pyspark.sql import functions as F

    what = SegmentInput(encoded, raw_column, columns or ColumnNames())
    landed = None
    try:
        landed = _landed(spark, path, footers)
        schema = landed.schema
    except Exception as exc:
        if "UNABLE_TO_INFER_SCHEMA" not in str(exc):
            raise
        logger.info("nothing has landed in %s yet: its columns are taken as named, not read", path)
        types = {"binary": "binary", "integer": "bigint"}
        named = [f"`{c}` {types[kind]}" for c, kind in what.wanted().items()]
        schema = ", ".join(named + ([f"`{event_time}` timestamp"] if event_time else []))
    else:
        if footers is not None and footers.sampled:
            check_schema(landed.schema, what, event_time=event_time)  # the values were sampled from the files
        else:
            check_input(landed, what, event_time=event_time)
    if keep or input_file:
        _check_kept(landed, path, keep, input_file, raw_column if encoded else what.columns.data)
    # Spark's file source ignores, without a word, a file whose modification time is more than
    # maxFileAge (default 7 days) older than the newest file it has seen: a landing file copied with
    # its old mtime (cp -p, rsync -t) would never be read. Ten years: every file is read; the price
    # is the source remembering every file name seen (as its checkpoint log does anyway).
    reader = spark.readStream.schema(schema).option("maxFileAge", "3650d")
    if max_files is not None:
        reader = reader.option("maxFilesPerTrigger", max_files)
    df = reader.parquet(path)
    t = (F.col(_quoted(event_time)) if event_time else F.col("_metadata.file_modification_time")).alias("event_time")
    kept = [F.col(_quoted(k)) for k in keep]
    if input_file:
        kept.append(F.col("_metadata.file_path").alias(input_file))
    if encoded:
        return df.select(F.col(_quoted(raw_column)).alias("segment"), t, *kept)
    return df.select(*(F.col(_quoted(c)) for c in what.wanted()), t, *kept)


def _landed(spark: Any, path: str, footers: Footers | None) -> Any:
    """The files landed in ``path``, read with the footers' schema where it is given (no Spark job to
    infer it; a schema Spark's DDL cannot say is left to Spark)."""
    if footers is not None:
        try:
            return spark.read.schema(footers.ddl()).parquet(path)
        except Exception:
            logger.debug("the footers' schema was not taken; Spark infers it", exc_info=True)
    return spark.read.parquet(path)


def _check_kept(landed: Any, path: str, keep: tuple[str, ...], input_file: str | None, segment: str) -> None:
    """Columns to keep must be in the landed files (UsageError before the stream is set up)."""
    from reassembly._errors import UsageError

    if landed is None:
        raise UsageError(f"cannot keep columns of {path} before a file has landed there: their types are unknown")
    check_keep_columns(landed, keep, segment)
    if input_file and input_file in landed.columns:
        raise UsageError(f"cannot add the input file as column {input_file!r}: the input has a column of that name")


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def start(
    stream: Any,
    out: Path,
    checkpoint: str,
    trigger: str,
    on_batch: Callable[[int, Counter[str]], None] | None = None,
    options: StreamOptions | None = None,
    halt: Halt | None = None,
) -> Any:
    """Start writing ``stream`` (from :func:`reassemble_stream`) to ``out``, its progress in Spark's
    ``checkpoint`` directory (keep it: the stream resumes from it exactly once); ``trigger`` is
    ``available-now`` or a processing-time interval such as ``10 seconds``. Pass the stream's
    ``options`` when they set a ``payload_dir``: the sink removes committed messages' spool files.
    A checkpoint that the stream's state would be misread from is refused first (:func:`bind_checkpoint`;
    pass ``options`` for its options to be checked too). ``on_batch(batch_id, counts)`` is called once
    each batch is committed, with what its marker records. ``halt``: see :class:`Halt`."""
    bind_checkpoint(checkpoint, options)
    sink = BatchWriter(out, on_batch, spool_of(options) if options is not None else None, halt)
    writer = stream.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
    writer = writer.trigger(availableNow=True) if trigger == "available-now" else writer.trigger(processingTime=trigger)
    return writer.start()


__all__ = [
    "CHANGELOG",
    "ROCKSDB",
    "BatchWriter",
    "CheckpointMismatch",
    "Halt",
    "SinkError",
    "LAYOUT",
    "MANIFEST",
    "PROFILE",
    "StreamOptions",
    "KIND_STATE",
    "OBSERVATION",
    "OLDEST",
    "OPEN_KEYS",
    "STATUSES",
    "InputRefused",
    "batch_counts",
    "bind_checkpoint",
    "committed_batches",
    "configure",
    "file_source",
    "observed",
    "read_committed",
    "reassemble_stream",
    "start",
    "state_after",
]
