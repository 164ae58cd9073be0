"""The ``reassemble`` command as a user runs it: real processes, real files, real Spark."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reassembly.spark.testdata import generate, write_parquet

pytestmark = pytest.mark.spark


def reassemble(*args: str, env: dict[str, str] | None = None, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reassembly", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture(scope="module")
def landing(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ds = generate(n_messages=20, segments_per_message=3, segment_size=2048, groups=2)
    return write_parquet(ds, tmp_path_factory.mktemp("landing"), files=3)


def test_run_writes_messages_and_quarantine_and_prints_a_summary(landing: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = reassemble("run", str(landing / "*.parquet"), str(out), "--partitions", "4")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "messages by status" in done.stdout and "quarantined segments by reason" in done.stdout
    assert "MiB/s" in done.stdout
    messages = pq.read_table(out / "messages").to_pylist()
    quarantine = pq.read_table(out / "quarantine").to_pylist()
    assert {m["status"] for m in messages} >= {"complete", "incomplete", "corrupt"}
    assert all(q["raw"] is not None for q in quarantine)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left behind


def test_bad_arguments_and_missing_input_are_one_line_errors(tmp_path: Path) -> None:
    bad = reassemble("run")
    assert bad.returncode == 2 and "usage:" in bad.stderr
    missing = reassemble("run", str(tmp_path / "nope"), str(tmp_path / "out"))
    assert missing.returncode == 1
    assert missing.stderr.strip().splitlines() == [f"reassemble: error: input not found: {tmp_path / 'nope'}"]


def test_unreadable_input_is_one_line_not_a_java_stack_trace(tmp_path: Path) -> None:
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"this is not parquet")
    done = reassemble("run", str(junk), str(tmp_path / "out"))
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if line.startswith("reassemble: error:")]
    assert len(errors) == 1 and "cannot read" in errors[0]
    assert "\tat org.apache" not in done.stderr and "Traceback" not in done.stderr


def _corrupt_parquet(path: Path) -> None:
    """A Parquet file whose footer and schema are fine but whose data page is garbage:
    Spark plans the job, starts writing, and fails while reading rows."""
    rows = pa.array([os.urandom(5000) for _ in range(50)], pa.binary())
    pq.write_table(pa.table({"segment": rows}), path, compression="snappy", use_dictionary=False)
    start = pq.ParquetFile(path).metadata.row_group(0).column(0).data_page_offset + 100
    with open(path, "r+b") as f:
        f.seek(start)
        f.write(b"\xff" * 20_000)


def test_failed_run_leaves_no_output(tmp_path: Path) -> None:
    table = tmp_path / "corrupt.parquet"
    _corrupt_parquet(table)
    out = tmp_path / "out"
    done = reassemble("run", str(table), str(out))
    assert done.returncode == 1, done.stdout[-1000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("reassemble: error:")]
    assert len(errors) == 1 and "job failed" in errors[0] and "corrupt.parquet" in errors[0], done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "\tat org.apache" not in done.stderr
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["corrupt.parquet"]  # no hidden temporary left either


def test_a_column_that_is_not_binary_is_a_one_line_error(tmp_path: Path) -> None:
    table = tmp_path / "strings.parquet"
    pq.write_table(pa.table({"segment": pa.array(["not", "binary"], pa.string())}), table)
    done = reassemble("run", str(table), str(tmp_path / "out"))
    assert done.returncode == 1
    assert "reassemble: error: column 'segment' is string, expected binary" in done.stderr
    assert not (tmp_path / "out").exists()


def test_existing_output_needs_overwrite(landing: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    done = reassemble("run", str(landing), str(out))
    assert done.returncode == 1 and "output exists" in done.stderr


def test_refmsg_command_rebuilds_objects(tmp_path: Path) -> None:
    from refmsg import chunk

    whole = os.urandom(70_000)
    partial = os.urandom(90_000)
    msgs = chunk(io.BytesIO(whole), "docs/a.bin", max_length=40_000)
    lost = chunk(io.BytesIO(partial), "b.bin", max_length=30_000)
    rows = [*msgs[::-1], msgs[0], *lost[:-1], b"not a reference message"]
    src = tmp_path / "refs.parquet"
    pq.write_table(pa.table({"message": pa.array(rows, pa.binary())}), src)
    out = tmp_path / "out"
    done = reassemble("refmsg", str(src), str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    objects = {o["dest_name"]: o for o in pq.read_table(out / "objects").to_pylist()}
    assert objects["docs/a.bin"]["status"] == "complete" and objects["docs/a.bin"]["data"] == whole
    assert objects["b.bin"]["status"] != "complete"
    quarantine = pq.read_table(out / "quarantine").to_pylist()
    assert b"not a reference message" in {q["raw"] for q in quarantine}


def test_demo_checks_itself() -> None:
    done = reassemble("demo", "--messages", "30", "--segments-per-message", "3", "--segment-size", "2048")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert re.search(r"check: (\d+)/\1 messages as expected", done.stdout), done.stdout[-1500:]
    assert "duplicates: holds" in done.stdout


def test_demo_with_large_messages_streams_them_to_payload_files(tmp_path: Path) -> None:
    done = reassemble(
        "demo", "--messages", "20", "--segments-per-message", "3", "--segment-size", "2048",
        "--large-message-bytes", "3000", "--keep", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert re.search(r"check: (\d+)/\1 messages as expected", done.stdout), done.stdout[-1500:]
    messages = pq.read_table(tmp_path / "out" / "messages").to_pylist()
    files = {m["payload_path"] for m in messages if m["payload_path"]}
    assert files and files == {p.name for p in (tmp_path / "out" / "payloads").iterdir()}
