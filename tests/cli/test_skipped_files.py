"""No file skipped silently: with ``spark.sql.files.ignoreCorruptFiles`` on, a landing file Spark cannot
read is skipped by Spark's read without a word; ``reassemble run``, ``run --incremental`` and ``stream``
count and name it in their report and in the summary JSON, and ``--fail-on skipped`` fails on it (exit
3, everything written)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from reassembly.cli.summary import problems
from reassembly.spark.testdata import generate, write_parquet
from tests.support.command import reassemble

pytestmark = pytest.mark.spark


def test_a_file_spark_skips_is_counted_named_and_can_fail_the_run(tmp_path: Path) -> None:
    ds = generate(n_messages=6, segments_per_message=3, segment_size=1024, faults=False)
    landing = write_parquet(ds, tmp_path / "landing", files=2)
    bad = landing / "part-9999.parquet"
    bad.write_bytes(b"PAR1 damaged in transit")
    summary, out = tmp_path / "summary.json", tmp_path / "out"
    done = reassemble(
        "run", str(landing), str(out), "--no-progress",
        "--conf", "spark.sql.files.ignoreCorruptFiles=true", "--fail-on", "skipped",
        "--summary-json", str(summary),
    )  # fmt: skip
    assert done.returncode == 3, done.stderr[-3000:]
    assert (
        f"skipped: 1 input file Spark did not read whole (spark.sql.files.ignoreCorruptFiles): {bad} (unreadable)"
        in done.stdout
    )
    assert "reassemble: --fail-on: skipped (1 file)" in done.stderr
    record = json.loads(summary.read_text())
    assert problems(record) == []
    assert record["input"]["skipped_files"] == [{"path": str(bad), "rows_expected": None, "rows_read": 0}]
    assert record["conditions"]["skipped"] is True and record["fail_on"]["held"] == ["skipped"]
    assert record["counts"]["rows_in"] == len(ds.rows)  # the other files, whole


def _landing_with_a_damaged_file(tmp_path: Path) -> tuple[Path, Path, int]:
    """A landing directory of two good files and one that is not readable Parquet; the good files' rows."""
    ds = generate(n_messages=6, segments_per_message=3, segment_size=1024, faults=False)
    landing = write_parquet(ds, tmp_path / "landing", files=2)
    bad = landing / "part-9999.parquet"
    bad.write_bytes(b"PAR1 damaged in transit")
    return landing, bad, len(ds.rows)


SKIP = ("--conf", "spark.sql.files.ignoreCorruptFiles=true", "--fail-on", "skipped")


def test_an_incremental_run_names_a_new_file_spark_skips_and_can_fail_on_it(tmp_path: Path) -> None:
    landing, bad, rows = _landing_with_a_damaged_file(tmp_path)
    summary, out, ck = tmp_path / "summary.json", tmp_path / "out", tmp_path / "ck"
    done = reassemble(
        "run", str(landing), str(out), "--incremental", "--checkpoint", str(ck), "--no-progress",
        *SKIP, "--summary-json", str(summary),
    )  # fmt: skip
    _reported_and_failed(done, summary, bad, rows)


def _reported_and_failed(done: subprocess.CompletedProcess[str], summary: Path, bad: Path, rows: int) -> None:
    """The damaged file named in the report and the summary, ``--fail-on skipped`` held (exit 3), and
    the accounting identity over the rows Spark did read."""
    assert done.returncode == 3, done.stderr[-3000:]
    said = f"skipped: 1 input file Spark did not read whole (spark.sql.files.ignoreCorruptFiles): {bad} (unreadable)"
    assert said in done.stdout and "reassemble: --fail-on: skipped (1 file)" in done.stderr
    record = json.loads(summary.read_text())
    assert problems(record) == []
    assert record["input"]["skipped_files"] == [{"path": str(bad), "rows_expected": None, "rows_read": 0}]
    assert record["fail_on"]["held"] == ["skipped"] and record["counts"]["rows_in"] == rows
    assert record["accounting"]["holds"] is True


def test_a_stream_names_a_file_spark_skips_in_its_batch_and_can_fail_on_it(tmp_path: Path) -> None:
    landing, bad, rows = _landing_with_a_damaged_file(tmp_path)
    summary, out, ck = tmp_path / "summary.json", tmp_path / "out", tmp_path / "ck"
    done = reassemble("stream", str(landing), str(out), "--checkpoint", str(ck), *SKIP, "--summary-json", str(summary))
    _reported_and_failed(done, summary, bad, rows)
