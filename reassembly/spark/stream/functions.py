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

:class:`BatchWriter` (:mod:`.sink`) is the exactly-once sink: ``foreachBatch`` writing each
micro-batch into ``batch=N`` folders, committed by a marker file that also records what state holds
after the batch. The stream's per-batch counts are also published as Spark observed metrics
(:data:`OBSERVATION`), in each ``StreamingQueryProgress.observedMetrics``.

:func:`file_source` reads the landing files' own schema and refuses input that
cannot be what was meant before the stream is set up (:mod:`reassembly.spark.inputs`).
"""

from __future__ import annotations

import json
import logging
import os
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
from reassembly.spark.schema import OUTPUT_DDL, ColumnNames, combined_spark
from reassembly.spark.stream.core import KIND_DUPLICATE
from reassembly.spark.stream.layout import KIND_STATE, LAYOUT, STATE
from reassembly.spark.stream.sink import (
    OLDEST,
    OPEN_KEYS,
    BatchWriter,
    Halt,
    SinkError,
    batch_counts,
    committed_batches,
    read_committed,
    state_after,
)
from reassembly.spark.stream.spool import Spool
from segmenter.header_table import FIELD
from segmenter.wire import GROUP_ID_LENGTH

if TYPE_CHECKING:
    from reassembly.spark.footers import Footers

logger = logging.getLogger(__name__)

# Where the GroupId sits in a header: from the header table, like every decoder (no literal offset).
_GROUP_ID_AT = FIELD["group_id"].offset


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
