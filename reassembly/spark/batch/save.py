"""Writing a reassembly's outputs: each folder with its own columns, clean messages by a JVM-only job.

Why two jobs: in one plan (``ReassemblyResult.combined``) every row, clean ones included, passes
the Python UDF operator after the JVM's one pass: Spark queues each row with its payload while
its argument (NULL for a clean message) goes to Python and back, the explode copies the payload
again, and every task starts Python workers whether or not a row needs them
(``python -m bench.stages`` compares the variants ``ours`` and ``save``). Here the one pass
(``Reassemble.split`` in the jar) writes the clean messages straight from the JVM, and every
other group to a side file (one per task, in the output's hidden ``_side`` folder,
``SideFile.java``); only if a side file exists are those groups judged in Python (the same
per-task judge as the UDF, ``judge._Task``) and their messages written beside the first job's.
Same rows as ``combined`` (tests/spark/test_save.py).

Where they are judged: side files totalling at most ``ReassemblyOptions.driver_judge_bytes``
(:attr:`Split.driver_judge_bytes`; the rest of a mostly clean table is a few MiB) are judged in
this, the driver's, process by the very function a Spark job would run on them
(``judge.make_side_judge``), and their message rows written with pyarrow (``writer.write_part``:
one file of the job's schema, read by Spark like the job's own); a Spark job there costs seconds
of starting Python workers and repartitioning a list of paths for well under a second of judging.
More: a second job (``Split.judge``, a ``mapInArrow`` over the list of files) judges them.
Same rows, files and counts either way (tests/spark/test_save_driver.py).

Each folder holds exactly its own columns (``schema.py``): the judge, wherever it runs for a
write, hands Spark message rows only and sends its quarantine rows to a pending file of its
task (``judge.Pending``, in ``_side/quarantine``); a last, small job writes those into
``quarantine`` (an empty table when there are none; the driver itself, with pyarrow, where they
total at most ``driver_judge_bytes``). So no job writes both kinds, and nothing is written twice
to drop the other kind's columns.

Where the split cannot run (Spark Connect, no jar, a digest policy that demands digests,
``jvm_fast_path=False``), :func:`save` writes the messages of ``combined``'s plan in one job (its
judge sending quarantine rows to pending files as above), then the quarantine. For an output
that is not a local path the combined rows are persisted and each folder written from them.

The side folder is inside the output, so it is wherever the output is: on a cluster the output
(like ``payload_dir``) must be a directory every executor sees.

Counts: every job publishes what it wrote as Spark observed metrics (``pyspark.sql.Observation``,
named ``reassembly...``: Spark's UI, listeners and metrics sinks see them); what the driver
judges or writes itself it counts as it goes (:class:`_Counted`); :class:`Saved` gives their sum as
``metrics`` (:data:`METRICS`), the same counts wherever the rows were judged. The staged plan's scan
tasks add their choice (staged, or passed through after their first rows) to Spark accumulators
(``bridge.ScanTally``), read after the first job: ``scan_tasks_staged`` and ``scan_tasks_passed_through``
(both 0 where nothing is staged: lineage, ``assemble_in_splits=False``, no jar).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

import pyarrow as pa

from reassembly.spark.batch.judge import KIND_INPUT, SIDE_SOURCES, pending_files, read_pending, side_decoded_bytes
from reassembly.spark.rows import Status
from reassembly.spark.schema import (
    MANIFEST,
    MESSAGE_SCHEMA,
    QUARANTINE_ARROW,
    QUARANTINE_SCHEMA,
    SOURCE,
    SOURCES,
    lineage_arrow,
    manifest,
    message_columns,
    quarantine_columns,
    spark_schema,
)
from reassembly.spark.writer import empty_folder, parquet_writer, spark_codec, spark_version, write_part

logger = logging.getLogger(__name__)

FOLDERS = {"message": "messages", "quarantine": "quarantine"}
SIDE = "_side"
PENDING = "quarantine"  # under SIDE: the judges' quarantine rows (judge.Pending)
_JUDGED = "_judged"
_STATUSES = tuple(v for k, v in vars(Status).items() if not k.startswith("_"))
# Every key of Saved.metrics, in order.
METRICS = (
    "rows_in",
    "used",
    "duplicates",
    "quarantined",
    "messages",
    *(f"messages_{s}" for s in _STATUSES),
    "bytes_complete",
    "scan_tasks_staged",
    "scan_tasks_passed_through",
)
OBSERVED_WAIT = 10.0  # seconds to wait, after a job, for its observed metrics to arrive


SideJudge = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]  # judge.make_side_judge's function


@dataclass(frozen=True)
class Split:
    """The jobs of a split write, bound to one ``reassemble()`` call."""

    clean: Callable[[str], Any]  # a side folder -> the clean messages (the messages columns)
    judge: Callable[[list[str], str], Any]  # side files, pending folder -> ``kind`` + messages columns
    # A pending folder -> the function ``judge`` maps over the side files' paths, to call in the driver
    # (batches of paths -> ``kind`` + messages columns); None: always ``judge``.
    side_judge: Callable[[str], SideJudge] | None = None
    # Side files (and pending quarantine files) totalling at most this many bytes are judged (written)
    # in the driver: no Spark job, no Python worker to start. 0: always a Spark job.
    driver_judge_bytes: int = 0
    # After ``clean``'s job: its scan tasks by their choice (``scan_tasks_staged``,
    # ``scan_tasks_passed_through``: Stage.java); {} where nothing was staged. None: no staging.
    scan_tasks: Callable[[], dict[str, int]] | None = None


@dataclass(frozen=True)
class Output:
    """What :func:`save` writes, as ``reassemble()`` planned it."""

    spark: Any
    # (pending folder or None, a hook observing the aggregated rows or None) -> the combined rows:
    # with a pending folder, its judge sends quarantine rows there (the plan then holds messages only)
    plan: Callable[[str | None, Callable[[Any], Any] | None], Any]
    split: Split | None
    keep_columns: tuple[str, ...] = ()
    lineage: Any = None  # the kept columns' StructType (None: nothing kept)


class Saved(NamedTuple):
    """How :func:`save` wrote: ``split`` (the clean messages by a JVM-only job), the side files judged
    after it, ``metrics``: the counts the jobs published as observed metrics plus those the driver
    counted (:data:`METRICS`; empty where Spark gave none: a warning is logged), and
    ``judged_in_driver``: the side files were judged in the driver process, not by a Spark job
    (they totalled at most ``ReassemblyOptions.driver_judge_bytes``)."""

    split: bool
    side_files: int
    """How many side files (the rows the split set aside) were judged after it."""
    metrics: Mapping[str, int] = MappingProxyType({})
    judged_in_driver: bool = False


def side_files(folder: Path) -> list[str]:
    """One finished side file per partition (any two finished attempts of a partition hold the same groups)."""
    chosen: dict[str, Path] = {}
    for path in sorted(folder.glob("*.side")):
        chosen.setdefault(path.name.split("-", 1)[0], path)
    return [str(chosen[k]) for k in sorted(chosen)]


def _local(directory: str | Path) -> Path | None:
    text = str(directory)
    if "://" in text and not text.startswith("file://"):
        return None
    return Path(text.removeprefix("file://"))


def _message_metrics(where: str = "TRUE") -> list[str]:
    """SQL aggregates over message rows (those ``where`` holds for) for :data:`METRICS`."""
    out = [
        f"count_if({where}) AS messages",
        f"coalesce(sum(CASE WHEN {where} THEN segments_used END), 0) AS used",
        f"coalesce(sum(CASE WHEN {where} THEN duplicates END), 0) AS duplicates",
        f"coalesce(sum(CASE WHEN {where} AND status = 'complete' THEN original_length END), 0) AS bytes_complete",
    ]
    out += [f"count_if({where} AND status = '{s}') AS messages_{s}" for s in _STATUSES]
    return out


@dataclass
class Meter:
    """The observations of one save (one per job and DataFrame), summed into :data:`METRICS`."""

    spark: Any
    observations: list[Any] = field(default_factory=list)

    def observe(self, df: Any, name: str, exprs: list[str]) -> Any:
        """``df`` with its counts observed (``df`` as it was where Spark cannot observe)."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        try:
            obs = Observation(name)
            observed = df.observe(obs, *[F.expr(e) for e in exprs])
        except Exception as exc:  # e.g. a session without observations: counts are not essential
            logger.warning("observed metrics unavailable (%s): %s", name, exc)
            return df
        self.observations.append(obs)
        return observed

    def input(self, agg: Any) -> Any:
        """The aggregated rows: the landing rows in them (a far row's stub is not a row of its own)."""
        rows = "coalesce(sum(n - coalesce(size(filter(meta, m -> m.far)), 0)), 0) AS rows_in"
        return self.observe(agg, "reassembly_input", [rows])

    def metrics(self) -> dict[str, int]:
        """The sum of every observation's values (each job's once it ran); {} if any is missing."""
        total = dict.fromkeys(METRICS, 0)
        for obs in self.observations:
            values = _observed(obs)
            if values is None:
                return {}
            for k, v in values.items():
                total[k] = total.get(k, 0) + int(v or 0)
        return total


def _observed(obs: Any) -> dict[str, Any] | None:
    """An observation's values once its job has run (None, with a warning, where Spark gives none)."""
    try:
        jo = getattr(obs, "_jo", None)
        if jo is not None:  # classic: its future completes as the job's listener event arrives
            deadline = time.monotonic() + OBSERVED_WAIT
            while not jo.future().isCompleted():
                if time.monotonic() > deadline:
                    logger.warning("observed metrics of %s did not arrive within %s s", obs._name, OBSERVED_WAIT)
                    return None
                time.sleep(0.01)
        return dict(obs.get)
    except Exception as exc:
        logger.warning("observed metrics unavailable: %s", exc)
        return None


def _write(df: Any, path: Path | str) -> None:
    parquet_writer(df).parquet(str(path))


def _quarantine_job(output: Output, meter: Meter, pending: Path, target: Path) -> None:
    """The judges' pending quarantine rows into ``target`` (one task per file; written by the driver
    where they total at most ``driver_judge_bytes``), or an empty table."""
    kept = output.lineage is not None
    files = pending_files(pending) if pending.exists() else []
    if files and _in_driver(output.split, files):
        written = _quarantine_here(output, files, target)
        if written:
            meter.observations.append(_Counted({"quarantined": written}))
            return
        files = []  # finished pending files hold a row each: an empty one is nothing quarantined
    if not files:
        from pyspark.sql.pandas.types import to_arrow_type

        src = None if output.lineage is None else to_arrow_type(output.lineage, timezone="UTC")
        empty_folder(target, lineage_arrow(QUARANTINE_ARROW, src, SOURCE))
        meter.observations.append(_Counted({"quarantined": 0}))
        return
    schema = spark_schema(tuple((c.name, c.ddl) for c in QUARANTINE_SCHEMA), output.lineage, SOURCE if kept else None)
    paths = output.spark.createDataFrame([(f,) for f in files], "path string").repartition(len(files))
    rows = paths.mapInArrow(read_pending, schema)
    _write(meter.observe(rows, "reassembly_quarantine", ["count(1) AS quarantined"]), target)


class _Counted:
    """Counts known without a job, in an observation's stead (no pending file: nothing quarantined;
    what the driver judged or wrote itself)."""

    def __init__(self, values: dict[str, int]) -> None:
        self.get = values


def _in_driver(split: Split | None, files: list[str]) -> bool:
    """Whether ``files`` (side files with their ``.src`` companions, or pending files) are few
    enough bytes to read in the driver rather than by a Spark job: their size, and for side files
    what judging them can decode (:func:`~reassembly.spark.batch.judge.side_decoded_bytes`), at most
    ``driver_judge_bytes``. So the driver holds no more than that budget of decoded bytes, far
    under the bound one Spark task's judge keeps to (``decoded_bound``), whatever the side files
    declare."""
    if split is None or split.side_judge is None or split.driver_judge_bytes <= 0:
        return False
    total = 0
    for f in files:
        companion = f.removesuffix(".side") + SIDE_SOURCES if f.endswith(".side") else None
        total += os.path.getsize(f)
        total += os.path.getsize(companion) if companion is not None and os.path.exists(companion) else 0
    if total > split.driver_judge_bytes:
        return False
    sides = [f for f in files if f.endswith(".side")]
    return not sides or side_decoded_bytes(sides, split.driver_judge_bytes) <= split.driver_judge_bytes


def _spark_json(output: Output, schema: tuple[Any, ...], lineage: str) -> str:
    """The StructType the Spark job of a folder writes, as Spark records it in a Parquet footer."""
    kept = output.lineage is not None
    return str(spark_schema(tuple((c.name, c.ddl) for c in schema), output.lineage, lineage if kept else None).json())


def _sum(column: Any) -> int:
    import pyarrow.compute as pc

    return int(pc.sum(column).as_py() or 0)


def _judge_here(output: Output, split: Split, files: list[str], pending: Path, messages: Path) -> dict[str, int]:
    """The side files judged in this process by ``split.side_judge`` (the Spark job's very function,
    on one batch of their paths): the message rows written into ``messages`` as one file, the
    quarantine rows to pending files (as the job's tasks do). Returns the counts the job would have
    observed (``reassembly_judged``)."""
    import pyarrow.compute as pc

    assert split.side_judge is not None
    judge = split.side_judge(str(pending))
    counts = dict.fromkeys(("rows_in", "used", "duplicates", "messages", "bytes_complete"), 0)
    counts.update({f"messages_{s}": 0 for s in _STATUSES})
    paths = pa.RecordBatch.from_pydict({"path": pa.array(files, pa.string())})

    def rows() -> Iterator[pa.RecordBatch]:
        for batch in judge(iter([paths])):
            kind = batch.column("kind")
            counts["rows_in"] += _sum(batch.filter(pc.equal(kind, KIND_INPUT)).column("segments_used"))
            out = batch.filter(pc.equal(kind, "message")).drop_columns(["kind"])
            del batch, kind  # the filtered copy only, while it is written
            status = out.column("status")
            counts["messages"] += out.num_rows
            counts["used"] += _sum(out.column("segments_used"))
            counts["duplicates"] += _sum(out.column("duplicates"))
            counts["bytes_complete"] += _sum(out.filter(pc.equal(status, "complete")).column("original_length"))
            for s in _STATUSES:
                counts[f"messages_{s}"] += _sum(pc.equal(status, s).cast(pa.int64()))
            yield out

    spark = output.spark
    write_part(messages, rows(), _spark_json(output, MESSAGE_SCHEMA, SOURCES), spark_codec(spark), spark_version(spark))
    return counts


def _quarantine_here(output: Output, files: list[str], target: Path) -> int:
    """The pending quarantine rows written into ``target`` by this process (:func:`read_pending`,
    as the job's tasks read them): the rows written."""
    paths = pa.RecordBatch.from_pydict({"path": pa.array(files, pa.string())})
    spark = output.spark
    json_schema = _spark_json(output, QUARANTINE_SCHEMA, SOURCE)
    written = write_part(target, read_pending(iter([paths])), json_schema, spark_codec(spark), spark_version(spark))
    if written:
        (target / "_SUCCESS").touch()  # as Spark's job leaves it
    return written


def save(output: Output, directory: str | Path) -> Saved:
    """``directory/messages`` and ``directory/quarantine`` (Parquet; neither may exist yet), each with
    exactly its columns (``schema.py``), and ``directory/_reassembly.json`` (:data:`MANIFEST`) saying
    which (a local directory)."""
    local = _local(directory)
    meter = Meter(output.spark)
    kept = output.lineage is not None
    if local is None:
        _save_elsewhere(output, str(directory), meter)
        return Saved(False, 0, meter.metrics())
    side = local.resolve() / SIDE
    pending = side / PENDING
    messages = local / FOLDERS["message"]
    columns = [f"`{c}`" for c in message_columns(kept)]
    files: list[str] = []
    here = False
    if output.split is None:
        plan = output.plan(str(pending), meter.input)
        rows = plan.where("kind = 'message'").select(*columns)
        _write(meter.observe(rows, "reassembly", _message_metrics()), messages)
    else:
        clean = output.split.clean(str(side))
        _write(
            meter.observe(clean, "reassembly", [*_message_metrics(), "coalesce(sum(segments_used), 0) AS rows_in"]),
            messages,
        )
        if output.split.scan_tasks is not None:  # Spark accumulators: read once the job has run
            meter.observations.append(_Counted(output.split.scan_tasks()))
        files = side_files(side) if side.exists() else []
        here = bool(files) and _in_driver(output.split, files)
        if here:
            meter.observations.append(_Counted(_judge_here(output, output.split, files, pending, messages)))
        elif files:
            judged = output.split.judge(files, str(pending))
            counts = [
                *_message_metrics("kind = 'message'"),
                "coalesce(sum(CASE WHEN kind = 'input' THEN segments_used END), 0) AS rows_in",
            ]
            judged = meter.observe(judged, "reassembly_judged", counts)
            _write(judged.where("kind = 'message'").select(*columns), local / _JUDGED)
            for part in (local / _JUDGED).iterdir():
                if not part.name.startswith(("_", "._")):  # not _SUCCESS (nor its .crc): messages/ has one
                    part.rename(messages / part.name)
            shutil.rmtree(local / _JUDGED)
    _quarantine_job(output, meter, pending, local / FOLDERS["quarantine"])
    shutil.rmtree(side, ignore_errors=True)
    _manifest(local, output.keep_columns)
    return Saved(output.split is not None, len(files), meter.metrics(), here)


def _manifest(local: Path, keep_columns: tuple[str, ...]) -> None:
    pending = local / f".{MANIFEST}.tmp"
    pending.write_text(json.dumps(manifest(keep_columns), indent=1) + "\n")
    os.replace(pending, local / MANIFEST)


def _save_elsewhere(output: Output, directory: str, meter: Meter) -> None:
    """An output no local path names (``hdfs://...``): the combined rows persisted, each folder written
    from them (the judge cannot put pending files there)."""
    from pyspark import StorageLevel

    kept = output.lineage is not None
    combined = output.plan(None, meter.input).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        rows = combined.where("kind = 'message'").select(*[f"`{c}`" for c in message_columns(kept)])
        _write(meter.observe(rows, "reassembly", _message_metrics()), f"{directory}/{FOLDERS['message']}")
        q = combined.where("kind = 'quarantine'").select(*[f"`{c}`" for c in quarantine_columns(kept)])
        _write(
            meter.observe(q, "reassembly_quarantine", ["count(1) AS quarantined"]),
            f"{directory}/{FOLDERS['quarantine']}",
        )
    finally:
        combined.unpersist()
