"""``reassemble_stream``: segments that keep arriving, reassembled on Spark's arbitrary state.

Keyed by GroupId, ``transformWithState`` (Row API, RocksDB state store, event
time). Per key the state holds the raw segments received so far (list state,
bounded in bytes), their first event time, a summary of their headers, and after
the key is decided a small tombstone. What is decided and how is in
:mod:`.stream_state` (the batch assembler, run on the held segments when the
summary says new ones could complete something), so the rows are the batch
job's rows for the same segments.

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
import uuid
from binascii import a2b_base64, b2a_base64
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reassembly.assembler.bodies import FileBodyStore
from reassembly.assembler.events import Cause
from reassembly.spark.pipeline import ReassemblyOptions
from reassembly.spark.schema import OUTPUT_DDL, OUTPUT_FIELDS, ColumnNames
from reassembly.spark.stream.core import (
    KIND_DUPLICATE,
    Footprint,
    Partial,
    Summary,
    Verdict,
    judge,
    late_rows,
    reject_now,
    take,
    undecodable,
)
from reassembly.spark.stream.spool import IN_STATE, HeldRows, Spool
from reassembly.spark.writer import parquet_writer
from segmenter.header_table import FIELD
from segmenter.wire import GROUP_ID_LENGTH, SegmentHeader, decode_header

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
# Each state commit uploads a small changelog instead of a RocksDB snapshot (snapshots are taken in the
# background): halves the commit time of a micro-batch here. Spark switches existing checkpoints either way.
CHANGELOG = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"


def configure(spark: Any, partitions: int | None = None) -> int:
    """Session settings for a stream: the RocksDB provider, changelog checkpointing, and state
    partitions (``spark.sql.shuffle.partitions``; default: the cores Spark has). Returns the partitions.

    Every micro-batch pays a fixed cost per state partition (a RocksDB commit, a Python state worker
    round trip), so more partitions than cores only add latency. Spark fixes the number into a
    checkpoint at its first start: a resumed stream keeps its own, whatever is set here.
    """
    if partitions is None:
        sc = getattr(spark, "sparkContext", None)  # None on Spark Connect: keep the session's setting
        partitions = sc.defaultParallelism if sc is not None else int(spark.conf.get("spark.sql.shuffle.partitions"))
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    spark.conf.set(CHANGELOG, "true")
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    return partitions


# Where the GroupId sits in a header: from the header table, like every decoder (no literal offset).
_GROUP_ID_AT = FIELD["group_id"].offset

FOLDERS = {"message": "messages", "quarantine": "quarantine", KIND_DUPLICATE: "duplicates"}

# ``kind = "state"`` rows: one per key and call that changed what state holds, the change of its
# :class:`Footprint` in these numeric columns (the sink sums them: the status line's exact state).
KIND_STATE = "state"
_FOOTPRINT_COLUMNS = dict(
    zip(
        Footprint._fields,
        ("reason", "segments_used", "stored_length", "original_length", "rejected", "offset"),
        strict=True,
    )
)


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


# A held row: a whole segment (at = IN_STATE), or a spooled one's header (stream_spool), as base64 text. Text,
# not binary: the state server hands every value read back to Python pickled by Pyrolite, which writes a
# ``byte[]`` as ``bytearray(str, "latin-1")``, one char at a time, then UTF-8 encodes that string: JFR put
# 43% of the JVM's samples in a 128 MiB run there (layout 2 held ``raw binary``). An ASCII string crosses
# both ways as a plain copy; base64 costs 4/3 the bytes in RocksDB and a C-speed encode/decode here.
_HELD = "raw string, at long"
# Everything else about a key, in one value, so that one get() answers "new, open or decided?": open
# (``state`` null): its first and last event times, its expiry deadline (its timer), the state bytes of its
# held segments and ``blob`` = stream_state.Summary.dump(); decided: how it ended (``state``), ``blob`` =
# the tombstone (the assembler snapshot), ``deadline_ms`` = when the tombstone goes. (Layout 1 kept these
# in three variables, ``info``, ``summary`` and ``tomb``: three round trips where this takes one.)
_KEY = "first_ms long, deadline_ms long, held_bytes long, last_ms long, blob binary, state string"
_NAMES = tuple(name for name, _, _ in OUTPUT_FIELDS)

# What a checkpoint's state means, recorded in CHECKPOINT/_reassembly.json at its first start (see
# bind_checkpoint). LAYOUT changes whenever the state variables or what they hold change meaning (the
# Summary blob's fields, what ``at`` says, how a held row is encoded); the schemas are recorded as they are.
# Layout 3: held rows as base64 text (layout 2: binary; the same variables otherwise).
LAYOUT = 3
MANIFEST = "_reassembly.json"
_STATE = {"held": _HELD, "key": _KEY}
# A checkpoint begun before the manifest existed was written by layout 1 (Spark's own files, no manifest).
_SPARK_FILES = ("offsets", "commits", "state")


def _text(head: bytes) -> str:
    """A held row's bytes as the state stores them (see ``_HELD``)."""
    return b2a_base64(head, newline=False).decode("ascii")


def _struct(ddl: str) -> Any:
    """A state schema as a StructType: given as a DDL string, pyspark would send it to the JVM to be
    parsed, twice per state variable and task (two socket round trips each, every micro-batch)."""
    from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

    types = {"long": LongType(), "binary": BinaryType(), "string": StringType()}
    return StructType([StructField(name, types[kind]) for name, kind in (f.split() for f in ddl.split(", "))])


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
    now: dict[str, Any] = {"layout": LAYOUT, "state": _STATE, "options": None if options is None else _bound(options)}
    try:
        was = json.loads(path.read_text())
    except FileNotFoundError:  # a new checkpoint, or one begun before the manifest (by layout 1)
        begun = any((root / name).exists() for name in _SPARK_FILES)
        was = {"layout": 1, "state": "no manifest: begun before it"} if begun else None
    if was is not None:
        if any(was.get(k) != now[k] for k in ("layout", "state")):
            raise CheckpointMismatch(
                f"checkpoint {checkpoint} holds state of layout {was.get('layout')} ({_described(was.get('state'))});"
                f" this version reads layout {LAYOUT} ({_described(_STATE)}): let a version of layout"
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


class _Profiler:
    """cProfile over one task's processor (init to close), dumped into a directory for ``pstats``."""

    def __init__(self, directory: str) -> None:
        import cProfile

        self.directory = Path(directory)
        self.profile = cProfile.Profile()
        self.profile.enable()

    def dump(self) -> None:
        self.profile.disable()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.profile.dump_stats(self.directory / f"{os.getpid()}-{uuid.uuid4().hex[:8]}.prof")


def _processor(opts: StreamOptions) -> Any:
    """The stateful processor (built here so pyspark is imported only when a stream is set up)."""
    from pyspark.sql import Row
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    limits = opts.reassembly.limits()
    uow = opts.reassembly.unit_of_work
    spool = spool_of(opts)
    profile = os.environ.get(PROFILE)  # read here, in the driver: the closure carries it to the workers
    expire_ms, tomb_ms = int(opts.expire_after * 1000), int(opts.tombstone * 1000)

    def out(rows: list[dict[str, Any]]) -> Iterator[Any]:
        for r in rows:
            yield Row(**{n: r.get(n) for n in _NAMES})

    class Reassembler(StatefulProcessor):  # type: ignore[misc]
        """Per key and call, each state call is a socket round trip to the JVM (milliseconds on a loaded
        machine): a key decided by its first segments costs 4 with the framework's own (set the key, get
        ``key``, store the tombstone, its timer), an open key's next segments 4 (set, get, append, update),
        the call that decides it 5 (set, get, read the held list, clear it, store the tombstone)."""

        def init(self, handle: Any) -> None:
            self.profiler = _Profiler(profile) if profile else None
            self.handle = handle
            self.held = handle.getListState("held", _struct(_HELD))
            self.key = handle.getValueState("key", _struct(_KEY))
            self.change = Footprint()  # what this call changed in the key's state (one kind=state row)
            self.read: list[tuple[bytes, int, SegmentHeader]] | None = None  # held rows, read once a call

        def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
            self.change, self.read = Footprint(), None
            raws: list[bytes] = []
            stamps: list[int | None] = []
            for r in rows:
                raws.append(b"" if r.raw is None else bytes(r.raw))  # NULL: garbage, quarantined (9007) as `run` does
                stamps.append(r.event_ms)
            # A NULL event time: the row counts as arriving with the call's latest (else the watermark).
            known_times = [t for t in stamps if t is not None]
            fill = max(known_times) if known_times else timerValues.getCurrentWatermarkInMs()
            times = [fill if t is None else t for t in stamps]
            unreadable = [undecodable(raw) for raw in raws]
            good = [raw for raw, u in zip(raws, unreadable, strict=True) if not u]
            result = reject_now([raw for raw, u in zip(raws, unreadable, strict=True) if u], limits)
            now = self.key.get() if good else None  # one round trip: new (None), open, or decided
            if now is not None and now[5] is not None:
                result += late_rows(bytes(now[4]), now[5], good, limits, uow)
            elif good:
                result += self._take(bytes(key[0]), good, times, now)
                if spool is not None:
                    spool.sync()  # before the state that points at the spool files commits
            return out(result + self._accounted())

        def _take(
            self, gid: bytes, good: list[bytes], times: list[int], now: tuple[Any, ...] | None
        ) -> list[dict[str, Any]]:
            rows: list[dict[str, Any]] = []
            known = now is not None
            if now is not None:
                first, deadline, held_bytes, last, blob, _ = now
                summary = Summary.load(bytes(blob))
                if summary.left:  # non-Unit-of-Work: copies of messages that already left are judged late
                    gone = [raw for raw in good if decode_header(raw).msg_seq_number in summary.left]
                    rows += late_rows(summary.tombstone(gid), "complete", gone, limits, uow)
                    good = [raw for raw in good if decode_header(raw).msg_seq_number not in summary.left]
            else:
                first, held_bytes, last, summary = min(times), 0, min(times), Summary()
                deadline = first + expire_ms  # its timer is registered only if the key stays open (_keep)
            if held_bytes == 0:
                self.read = []  # nothing held: no need to ask the state store
            last = max(last, *times)
            if not good:
                return rows
            store = self._store()
            verdict = take(self._held, good, held_bytes, summary, opts.max_held_bytes, limits, uow, store)
            if verdict is None:
                fresh = self._hold(good, summary)
                self.held.appendList([(_text(head), at) for head, at, _ in fresh])
                self._keep(first, deadline, held_bytes + Footprint.of(fresh).held_bytes, last, summary, known)
            elif isinstance(verdict, Partial):
                before = self._rows()
                kept = [r for r in before if r[2].msg_seq_number not in verdict.left]
                every = kept + self._hold(
                    [raw for raw in good if decode_header(raw).msg_seq_number not in verdict.left], summary
                )
                if every:
                    self.held.put([(_text(head), at) for head, at, _ in every])  # replaces the list: one round trip
                elif before:
                    self.held.clear()
                self.change = self.change.plus(Footprint.of(kept)).plus(Footprint.of(before), -1)
                self._keep(first, deadline, Footprint.of(every).held_bytes, last, summary, known)
                rows += verdict.rows
            else:
                self._decided(verdict, first, deadline, last, known)
                rows += verdict.rows
            if store is not None:
                store.close()  # bodies not delivered (still open, or failed): their work files go
            return rows

        def _store(self) -> FileBodyStore | None:
            """Where this call builds large messages (work files named for it; finished ones renamed)."""
            if spool is None:
                return None
            return FileBodyStore(spool.directory, uuid.uuid4().hex, opts.reassembly.large_message_bytes)

        def _hold(self, raws: list[bytes], summary: Summary) -> list[tuple[bytes, int, SegmentHeader]]:
            """Segments to hold, as held rows (a large message's data goes to its spool files), accounted;
            the caller writes them."""
            held = []
            for raw in raws:
                h = decode_header(raw)
                head, at = (
                    spool.put(raw, h, summary.spool) if spool is not None and spool.wants(raw, h) else (raw, IN_STATE)
                )
                held.append((head, at, h))
            self.change = self.change.plus(Footprint.of(held))
            return held

        def _rows(self) -> list[tuple[bytes, int, SegmentHeader]]:
            if self.read is None:
                heads = [(a2b_base64(text), at) for text, at in self.held.get()]
                self.read = [(head, at, decode_header(head)) for head, at in heads]
            return self.read

        def _held(self) -> HeldRows:
            return HeldRows(self._rows(), spool)

        def _keep(self, first: int, deadline: int, held_bytes: int, last: int, summary: Summary, known: bool) -> None:
            self.key.update((first, deadline, held_bytes, last, summary.dump(), None))
            if not known:
                self.handle.registerTimer(deadline)
                self.change = self.change._replace(groups=self.change.groups + 1)

        def _decided(
            self, verdict: Verdict, first: int, deadline: int, last: int, known: bool, fired: int | None = None
        ) -> None:
            """The key's held segments go, its tombstone stays until ``tombstone`` past the later of its last
            segment and its expiry deadline. An open key's expiry timer is left in place: when it fires, it
            sets the tombstone's (a round trip then, not on the way of the message leaving now). A key decided
            by its first segments, or by that timer (``fired``: its time), sets the tombstone's timer now."""
            state, blob = verdict.state, verdict.tombstone
            self.change = self.change.plus(Footprint.of(self._rows()), -1).plus(
                Footprint(groups=-int(known), tombstones=1, tombstone_bytes=Footprint.tombstone_size(blob, state))
            )
            if self._rows():
                self.held.clear()
            until = max(last, deadline) + tomb_ms
            if fired is not None:
                until = max(until, fired + 1)  # a timer set at the firing time would go with the fired one
            self.key.update((first, until, 0, last, blob, state))
            if not known or fired is not None:
                self.handle.registerTimer(until)

        def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:
            self.change, self.read = Footprint(), None
            at = expiredTimerInfo.getExpiryTimeInMs()
            rows: list[dict[str, Any]] = []
            now = self.key.get()
            if now is not None:
                first, deadline, held_bytes, last, blob, state = now
                if state is None and deadline == at:  # an open key's expiry
                    if held_bytes == 0:
                        self.read = []
                    store = self._store()
                    summary = Summary.load(bytes(blob))
                    verdict = judge(self._held(), limits, uow, Cause.EXPIRED, summary, bytes(key[0]), store)
                    assert isinstance(verdict, Verdict)  # a final cause always decides
                    if store is not None:
                        store.close()
                    self._decided(verdict, first, deadline, last, True, fired=at)
                    rows = verdict.rows
                elif state is not None and deadline <= max(at, timerValues.getCurrentWatermarkInMs()):
                    # the tombstone's time is up (also when this is the expiry timer of a key decided before
                    # it, and the watermark has passed the tombstone's time too: as its own timer would now)
                    self.key.clear()
                    self.change = Footprint(
                        tombstones=-1, tombstone_bytes=-Footprint.tombstone_size(bytes(blob), state)
                    )
                elif state is not None:  # the expiry timer of a key decided before it: now the tombstone's
                    self.handle.registerTimer(deadline)
            return out(rows + self._accounted())

        def _accounted(self) -> list[dict[str, Any]]:
            """The call's change of the key's footprint as one ``state`` row (none if nothing changed)."""
            if self.change == Footprint():
                return []
            return [{"kind": KIND_STATE, **{_FOOTPRINT_COLUMNS[k]: v for k, v in self.change._asdict().items()}}]

        def close(self) -> None:
            if self.profiler is not None:
                self.profiler.dump()

    return Reassembler()


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
    conf = df.sparkSession.conf.get("spark.sql.streaming.stateStore.providerClass", "")
    if conf != ROCKSDB:
        raise ValueError(f"streaming reassembly needs spark.sql.streaming.stateStore.providerClass={ROCKSDB}")
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
        cols = pq.read_table(f, columns=list(_FOOTPRINT_COLUMNS.values())).to_pydict()
        total = total.plus(Footprint(*(sum(cols[c]) for c in _FOOTPRINT_COLUMNS.values())))
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
    # its old mtime (cp -p, rsync -t) was never read. Ten years: every file is read; the price is
    # the source remembering every file name seen (as its checkpoint log does anyway).
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
