"""Input that cannot be what was meant is refused by ``reassemble stream`` and ``run``: exit code 2, one
line naming the column asked for and the columns found, and nothing consumed or written, so the rerun
with the right column processes every row.

A Kafka landing table's segments are in ``value`` (the default column is ``segment``): the stream once
took every row's ``segment`` as NULL, quarantined all of them without their bytes and moved its
checkpoint past the files, so the corrected rerun found "no new input".
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reassembly.spark.stream.functions import read_committed
from reassembly.spark.testdata import generate
from tests.support.command import reassemble

pytestmark = pytest.mark.spark

KAFKA_COLUMNS = "key binary, value binary, topic string, partition int, offset bigint"
T0 = time.time() - 100_000


def kafka_landing(directory: Path, values: list[bytes], files: int = 2) -> Path:
    """Parquet files as a Kafka sink lands them: the record's bytes in ``value`` beside its coordinates."""
    directory.mkdir(parents=True)
    for i in range(files):
        part = values[i::files]
        table = pa.table(
            {
                "key": pa.array([b"k"] * len(part), pa.binary()),
                "value": pa.array(part, pa.binary()),
                "topic": ["segments"] * len(part),
                "partition": pa.array([i] * len(part), pa.int32()),
                "offset": pa.array(range(len(part)), pa.int64()),
            }
        )
        tmp = directory.parent / f".part-{i}.parquet"
        pq.write_table(table, tmp)
        os.utime(tmp, (T0 + i, T0 + i))
        tmp.rename(directory / f"part-{i}.parquet")
    return directory


def _error_lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.startswith("reassemble:")]


def _batches(checkpoint: Path) -> list[str]:
    """What Spark has logged in a checkpoint (batches begun or committed): nothing, for a refused stream."""
    logs = [checkpoint / "offsets", checkpoint / "commits"]
    return sorted(p.name for d in logs if d.is_dir() for p in d.iterdir())


def test_stream_refuses_a_landing_whose_segments_are_in_value_and_consumes_nothing(tmp_path: Path) -> None:
    ds = generate(n_messages=6, segments_per_message=3, segment_size=1024, faults=False)
    landing = kafka_landing(tmp_path / "landing", ds.rows)
    out, ck = tmp_path / "out", tmp_path / "ck"
    done = reassemble("stream", str(landing), str(out), "--checkpoint", str(ck))
    assert done.returncode == 2, done.stderr[-2000:]
    assert _error_lines(done) == [f"reassemble: error: column 'segment' not in input (columns: {KAFKA_COLUMNS})"]
    assert _batches(ck) == [] and not out.exists()  # the query never started: nothing consumed

    done = reassemble("stream", str(landing), str(out), "--checkpoint", str(ck), "--raw-column", "value")
    assert done.returncode == 0, done.stderr[-2000:]
    assert f": {len(ds.rows)} rows in; " in done.stdout  # every file, in the stream's first batch
    msgs = read_committed(out, "message")
    assert {(m["group_id"], m["msg_seq_number"]): m["status"] for m in msgs} == {k: "complete" for k in ds.expected}
    assert sum(m["segments_used"] for m in msgs) == len(ds.rows) and read_committed(out, "quarantine") == []


def test_run_refuses_the_same_mistake_with_exit_code_2(tmp_path: Path) -> None:
    ds = generate(n_messages=4, segments_per_message=3, segment_size=1024, faults=False)
    landing = kafka_landing(tmp_path / "landing", ds.rows)
    out = tmp_path / "out"
    done = reassemble("run", str(landing), str(out))
    assert done.returncode == 2, done.stderr[-2000:]
    assert _error_lines(done) == [f"reassemble: error: column 'segment' not in input (columns: {KAFKA_COLUMNS})"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["landing"]  # no output, no hidden temporary

    done = reassemble("run", str(landing), str(out), "--raw-column", "value")
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"segments: {len(ds.rows)} in = {len(ds.rows)} used + 0 quarantined + 0 duplicates: holds" in done.stdout


def test_a_binary_column_that_holds_no_segments_is_refused(tmp_path: Path) -> None:
    """The column exists and is binary, but holds JSON: none of its first values frames as a segment."""
    landing = kafka_landing(tmp_path / "landing", [b'{"order": %d, "total": 12.5}' % i for i in range(40)])
    out, ck = tmp_path / "out", tmp_path / "ck"
    done = reassemble("stream", str(landing), str(out), "--checkpoint", str(ck), "--raw-column", "value")
    assert done.returncode == 2, done.stderr[-2000:]
    (line,) = _error_lines(done)
    assert line.startswith("reassemble: error: column 'value' holds no segments: none of its first 40 non-NULL")
    assert "bad magic" in line and line.endswith(f"(columns: {KAFKA_COLUMNS})")
    assert _batches(ck) == [] and not out.exists()


def test_a_stream_begun_on_an_empty_directory_checks_the_first_file_before_it_starts(tmp_path: Path) -> None:
    """It waits for the first file rather than starting with columns it cannot check: the file that lands
    is refused as it would have been at the start, and nothing is consumed."""
    (tmp_path / "landing").mkdir()
    out, ck = tmp_path / "out", tmp_path / "ck"
    cmd = [sys.executable, "-m", "reassembly", "stream", str(tmp_path / "landing"), str(out), "--checkpoint", str(ck)]
    proc = subprocess.Popen([*cmd, "--trigger", "1s"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("idle: nothing has landed in ")
        ds = generate(n_messages=2, segments_per_message=2, segment_size=1024, faults=False)
        for i, name in enumerate(("a", "b")):  # a Kafka sink's file
            table = pa.table({"key": pa.array([b"k"] * len(ds.rows), pa.binary()), "value": ds.rows})
            pq.write_table(table, tmp_path / f".{name}.parquet")
            os.utime(tmp_path / f".{name}.parquet", (T0 + i, T0 + i))
            (tmp_path / f".{name}.parquet").rename(tmp_path / "landing" / f"{name}.parquet")
        _, stderr = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 2, stderr[-2000:]
    lines = [line for line in stderr.splitlines() if line.startswith("reassemble:")]
    assert lines == ["reassemble: error: column 'segment' not in input (columns: key binary, value binary)"]
    assert _batches(ck) == []
