"""``read_output``: the committed rows of any job's output as one DataFrame, on real Spark and real folders.

The three layouts are written here by the code that writes them for the jobs: ``save()`` (what
``reassemble run`` writes), ``save()`` folders published as ``run=N`` with ``_runs/N`` markers (what
``reassemble run --incremental`` publishes: tests/cli/test_incremental.py runs the command itself),
and the stream's sink (:class:`BatchWriter`) called with batch DataFrames. Each time a folder a
crash can leave uncommitted is put beside the committed ones: the reader must not see it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from reassembly.spark import ReassemblyOptions, read_output, read_quarantined, reassemble
from reassembly.spark.batch.output import layout
from reassembly.spark.schema import MESSAGE_COLUMNS, QUARANTINE_COLUMNS
from reassembly.spark.stream.functions import BatchWriter, read_committed
from reassembly.spark.testdata import generate

pytestmark = pytest.mark.spark


def _segments(spark: Any, seed: int) -> Any:
    ds = generate(n_messages=10, segments_per_message=3, segment_size=1024, groups=1, seed=seed)
    return spark.createDataFrame([(r,) for r in ds.rows], "segment binary")


def _keys(rows: list[Any]) -> list[tuple[bytes, int, str]]:
    return sorted((bytes(r.group_id), r.msg_seq_number, r.status) for r in rows)


def test_a_run_output_reads_as_its_folders(spark: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    reassemble(_segments(spark, 1)).save(out)
    assert layout(out) == "run"
    messages, quarantine = read_output(spark, out), read_output(spark, out, "quarantine")
    assert _keys(messages.collect()) == _keys(spark.read.parquet(str(out / "messages")).collect())
    assert quarantine.count() == spark.read.parquet(str(out / "quarantine")).count() > 0
    assert tuple(messages.columns[: len(MESSAGE_COLUMNS)]) == MESSAGE_COLUMNS
    with pytest.raises(ValueError, match="duplicates are counted"):
        read_output(spark, out, "duplicates")
    with pytest.raises(ValueError, match="kind must be one of"):
        read_output(spark, out, "message")
    with pytest.raises(FileNotFoundError, match="not the output of a reassemble job"):
        read_output(spark, tmp_path / "elsewhere")


def _publish(staged: Path, out: Path, run: int, *, marker: bool) -> None:
    """What the incremental job's publication does with a run's staged folders (then its marker)."""
    for name in ("messages", "quarantine", "payloads"):
        if (staged / name).exists():
            (out / name).mkdir(parents=True, exist_ok=True)
            (staged / name).rename(out / name / f"run={run}")
    (out / "_runs").mkdir(exist_ok=True)
    if marker:
        (out / "_runs" / str(run)).write_text("{}\n")


def test_an_incremental_output_reads_committed_runs_only_with_paths_under_payloads(spark: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "_runs").mkdir(parents=True)
    empty = read_output(spark, out)  # begun, nothing committed yet: no rows, the columns
    assert empty.count() == 0 and empty.columns == [*MESSAGE_COLUMNS, "run"]
    assert read_output(spark, out, "quarantine").columns == [*QUARANTINE_COLUMNS, "run"]
    expected = {}
    for run in (1, 2, 3):
        staged = tmp_path / f"staged{run}"
        # every message above 512 bytes is written to a file under the run's own payloads folder
        options = ReassemblyOptions(payload_dir=str(staged / "payloads"), large_message_bytes=512)
        reassemble(_segments(spark, run), options=options).save(staged)
        expected[run] = _keys(spark.read.parquet(str(staged / "messages")).collect())
        _publish(staged, out, run, marker=run != 3)  # run 3: in place, its marker not yet written
    assert layout(out) == "incremental"
    messages = read_output(spark, out)
    assert messages.columns == [*MESSAGE_COLUMNS, "run"]
    assert sorted(r.run for r in messages.select("run").distinct().collect()) == [1, 2]
    assert _keys(messages.collect()) == sorted(expected[1] + expected[2])
    stored = [r for r in messages.collect() if r.payload_path is not None]
    assert stored and all(r.payload_path.startswith(f"run={r.run}/") for r in stored)
    for r in stored:  # relative to OUTPUT/payloads, as in a run's output
        assert len((out / "payloads" / r.payload_path).read_bytes()) == r.original_length
    by_reference = [r for r in read_output(spark, out, "quarantine").collect() if r.raw_path is not None]
    for r in by_reference:
        original = read_quarantined(r, out / "payloads")
        assert original is not None and len(original) == r.raw_length


def test_a_stream_output_reads_committed_batches_only(spark: Any, tmp_path: Path) -> None:
    out = tmp_path / "out"
    sink = BatchWriter(out)
    for batch in (0, 1):
        sink(reassemble(_segments(spark, 10 + batch)).combined, batch)
    # a crash between a batch's renames and its marker: its folders in place, uncommitted
    shutil.copytree(out / "messages" / "batch=1", out / "messages" / "batch=2")
    assert layout(out) == "stream"
    messages = read_output(spark, out)
    assert sorted(r.batch for r in messages.select("batch").distinct().collect()) == [0, 1]
    committed = read_committed(out, "message")
    assert _keys(messages.collect()) == sorted((r["group_id"], r["msg_seq_number"], r["status"]) for r in committed)
    assert read_output(spark, out, "quarantine").count() == len(read_committed(out, "quarantine"))
    assert read_output(spark, out, "duplicates").count() == len(read_committed(out, "duplicate"))
