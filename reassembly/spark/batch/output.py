"""Reading what a job wrote, committed rows only, as one lazy DataFrame whatever job wrote it.

Three layouts share the folder names (``messages``, ``quarantine``; ``duplicates`` in a stream's
output) and their columns (:mod:`reassembly.spark.schema`):

* ``reassemble run``: ``OUTPUT/messages/*.parquet``. The whole directory was renamed into place
  when the job succeeded, so everything in it is committed.
* ``reassemble run --incremental`` (:mod:`reassembly.spark.incremental`): one ``run=N`` folder
  per run under each folder, renamed into place only after the run committed, and the marker
  ``OUTPUT/_runs/N`` written once all of run N's folders are in place. Only runs with a marker
  are read (a run whose publication a crash cut short gets its marker from the next run).
* ``reassemble stream`` (:class:`~reassembly.spark.stream.functions.BatchWriter`): one ``batch=N``
  folder per micro-batch, committed by ``OUTPUT/_commits/N``. A folder renamed into place but
  not committed (a crash between the two) is replayed from scratch by the stream: not read.

The rows keep their partition column (``run`` or ``batch``), so a reader can take one run, or
every run after the last it processed. Why a DataFrame, not rows: payloads of hundreds of MiB
in a Python list do not fit a driver; a DataFrame reads them where Spark's tasks run.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from reassembly._files import hadoop_literal

log = logging.getLogger(__name__)

KINDS = ("messages", "quarantine", "duplicates")
RUN_MARKERS = "_runs"  # OUTPUT/_runs/N: run N of an incremental output is committed and published
BATCH_MARKERS = "_commits"  # OUTPUT/_commits/N: batch N of a stream's output is committed (BatchWriter)
PAYLOADS = "payloads"


def _ids(folder: Path) -> list[int]:
    """The numbers named by the markers in ``folder`` (temporary names, dot-files, are not markers)."""
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def layout(output: str | os.PathLike[str]) -> str:
    """``"incremental"``, ``"stream"`` or ``"run"``: which job wrote ``output``; FileNotFoundError if none did."""
    out = Path(output)
    if (out / RUN_MARKERS).is_dir():
        return "incremental"
    if (out / BATCH_MARKERS).is_dir():
        return "stream"
    if (out / "messages").is_dir():
        return "run"
    raise FileNotFoundError(
        f"not the output of a reassemble job (no messages/, {RUN_MARKERS}/ or {BATCH_MARKERS}/): {out}"
    )


def committed_runs(output: str | os.PathLike[str]) -> list[int]:
    """The runs of an incremental output that readers see (committed and published).

    ``output``: the incremental output directory.
    """
    folder = Path(output) / RUN_MARKERS
    return _ids(folder) if folder.is_dir() else []


def _empty(spark: Any, kind: str, partition: str | None) -> Any:
    """No committed rows yet: an empty DataFrame with the columns a committed folder of ``kind`` has."""
    from reassembly.spark.schema import DUPLICATE_SCHEMA, MESSAGE_SCHEMA, QUARANTINE_SCHEMA, spark_schema

    columns = {"messages": MESSAGE_SCHEMA, "quarantine": QUARANTINE_SCHEMA, "duplicates": DUPLICATE_SCHEMA}[kind]
    pairs = tuple((c.name, c.ddl) for c in columns) + (((partition, "int"),) if partition else ())
    return spark.createDataFrame([], spark_schema(pairs))


def read_output(spark: Any, output: str | os.PathLike[str], kind: str = "messages") -> Any:
    """Every committed row of one ``kind`` (``messages``, ``quarantine``; ``duplicates`` for a stream's
    output) that ``reassemble run``, ``run --incremental`` or ``stream`` wrote to ``output``.

    A lazy DataFrame: nothing is read until an action runs, payloads included. An incremental
    output's rows carry their ``run``, a stream's their ``batch`` (the partition folders); only
    committed ones are read, whatever a crash left (module doc). ``payload_path`` and
    ``raw_path`` name files relative to ``OUTPUT/payloads`` for ``run`` and ``run --incremental``
    alike (an incremental run stores them relative to its own ``payloads/run=N``; this reader
    puts the ``run=N/`` in front), so
    :func:`~reassembly.spark.batch.quarantine.read_quarantined` ``(row, OUTPUT/payloads)`` reads any
    quarantine row back; a stream's are relative to its ``--payload-dir``.

    ``spark``: the session that reads.
    """
    from pyspark.sql import functions as F

    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    out = Path(output)
    found = layout(out)
    if found == "run":
        if kind == "duplicates":
            raise ValueError(f"{out} is a run's output: duplicates are counted in messages.duplicates")
        return spark.read.parquet(hadoop_literal(str(out / kind)))
    if found == "stream":
        from reassembly.spark.stream.functions import committed_batches

        partition, ids = "batch", committed_batches(out)
    else:
        if kind == "duplicates":
            raise ValueError(f"{out} is an incremental output: duplicates are counted in messages.duplicates")
        partition, ids = "run", committed_runs(out)
    base = out / kind
    folders = [base / f"{partition}={n}" for n in ids if (base / f"{partition}={n}").is_dir()]
    if not folders:
        return _empty(spark, kind, partition)
    df = spark.read.option("basePath", hadoop_literal(str(base))).parquet(*(hadoop_literal(str(f)) for f in folders))
    if partition == "run":
        prefix = F.concat(F.lit("run="), F.col("run").cast("string"), F.lit("/"))
        paths = [c for c in ("payload_path", "raw_path") if c in df.columns]  # messages have one, quarantine the other
        df = df.withColumns({c: F.when(F.col(c).isNotNull(), F.concat(prefix, F.col(c))) for c in paths})
    return df


__all__ = ["BATCH_MARKERS", "KINDS", "PAYLOADS", "RUN_MARKERS", "committed_runs", "layout", "read_output"]
