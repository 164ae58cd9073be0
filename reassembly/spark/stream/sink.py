"""The stream's exactly-once sink, and reading what it committed.

:class:`BatchWriter` is ``foreachBatch`` writing each micro-batch into ``batch=N`` folders,
committed by a marker file; a batch replayed after a crash (same id, same input, same state
version: the same rows) finds its marker and is skipped, or, without it, is written again from
scratch. The marker also records what state holds after the batch (the sum of the ``state`` rows so
far) and the first event time of the oldest key still open (from the set of open keys kept beside
the markers, ``_open/N.parquet``): the status line's exact state fields. :class:`Halt` is the
command's stop after the batch in flight, shared with the sink. :func:`batch_counts`,
:func:`state_after`, :func:`committed_batches` and :func:`read_committed` read the committed batches.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reassembly.spark.schema import SOURCES, folder_columns
from reassembly.spark.stream.core import KIND_DUPLICATE, Footprint
from reassembly.spark.stream.layout import FOOTPRINT_COLUMNS, KIND_STATE, OPENED_COLUMN
from reassembly.spark.stream.spool import Spool
from reassembly.spark.writer import parquet_writer, project_folder

FOLDERS = {"message": "messages", "quarantine": "quarantine", KIND_DUPLICATE: "duplicates"}
"""The sink's output folders by row kind (``state`` rows are the markers' footprint, no folder)."""


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
