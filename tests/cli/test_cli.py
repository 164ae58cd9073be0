"""The ``reassemble`` command as a user runs it: real files, real Spark; a real process where the process
is what is tested (its launch output, a failing job, Ctrl-C), else in this process (tests/support/command.py)."""

from __future__ import annotations

import io
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reassembly.spark.batch.quarantine import read_quarantined
from reassembly.spark.testdata import generate, write_parquet
from tests.support.command import reassemble

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def landing(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ds = generate(n_messages=20, segments_per_message=3, segment_size=2048, groups=2)
    return write_parquet(ds, tmp_path_factory.mktemp("landing"), files=3)


def test_run_writes_messages_and_quarantine_and_prints_a_summary(landing: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = reassemble("run", str(landing / "*.parquet"), str(out), "--partitions", "4", process=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "messages by status" in done.stdout and "quarantined segments by reason" in done.stdout
    assert "MiB/s" in done.stdout
    assert re.search(r"^segments: (\d+) in = \d+ used \+ \d+ quarantined \+ \d+ duplicates: holds$", done.stdout, re.M)
    assert done.stderr == ""  # no Spark start-up lines (hostname, NativeCodeLoader, log4j), no worker chatter
    messages = pq.read_table(out / "messages").to_pylist()
    quarantine = pq.read_table(out / "quarantine").to_pylist()
    assert {m["status"] for m in messages} >= {"complete", "incomplete", "corrupt"}
    assert all(q["raw"] is not None for q in quarantine)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left behind


def test_the_summary_counts_bytes_without_reading_a_payload(
    landing: Path, tmp_path: Path, spark: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The summary's bytes are the complete messages' original lengths, the same sum as measuring each
    inline payload with length(payload), which would read every payload value into the JVM: batches of
    100 MiB messages would run it out of heap and fail the job after everything was written."""
    from reassembly.spark.batch.job import totals_by_status

    out = tmp_path / "out"
    done = reassemble("run", str(landing / "*.parquet"), str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    totals = totals_by_status(spark.read.parquet(str(out / "messages")))
    capsys.readouterr()
    totals.explain()
    scans = [line for line in capsys.readouterr().out.splitlines() if "ReadSchema" in line]
    assert scans and not any("payload:" in line for line in scans), scans
    messages = pq.read_table(out / "messages").to_pylist()
    complete = [m for m in messages if m["status"] == "complete"]
    assert complete and all(m["payload"] is not None for m in complete)
    by_status = {r.status: r.bytes or 0 for r in totals.collect()}
    assert by_status["complete"] == sum(len(m["payload"]) for m in complete)
    assert f"{by_status['complete']:>16,}" in done.stdout


def test_the_summary_tables_put_the_most_first_and_ties_by_name(spark: Any) -> None:
    """Sorted in Python, not by the plan (a sort per table costs a job and a stage), and the same order
    on every run: a tie between two statuses or two reasons goes by name."""
    from reassembly.spark.batch.job import reason_rows, status_rows

    messages = spark.createDataFrame(
        [("incomplete", 0, 2, 0), ("complete", 10, 3, 1), ("corrupt", 0, 1, 0), ("incomplete", 0, 1, 0),
         ("complete", 20, 2, 0)],
        "status string, original_length long, segments_used int, duplicates int",
    )  # fmt: skip
    assert [(r.status, r.n, r.bytes, r.used, r.duplicates) for r in status_rows(messages)] == [
        ("complete", 2, 30, 5, 1),
        ("incomplete", 2, None, 3, 0),
        ("corrupt", 1, None, 1, 0),
    ]
    quarantine = spark.createDataFrame(
        [(9001, "BAD_MAGIC"), (2242, "INCOMPLETE_MSG"), (9001, "BAD_MAGIC"), (2241, "INCOMPLETE_GROUP"),
         (2242, "INCOMPLETE_MSG"), (9004, "HEADER_CHECKSUM_ERROR")],
        "reason int, reason_name string",
    )  # fmt: skip
    assert [(r.reason, r["count"]) for r in reason_rows(quarantine)] == [(2242, 2), (9001, 2), (2241, 1), (9004, 1)]


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The run's stderr is exactly one ``reassemble: error:`` line, which is returned."""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("reassemble: error: "), done.stderr[-3000:]
    assert not lines[0].rstrip().endswith(":")
    return lines[0]


def test_bad_arguments_and_missing_input_are_one_line_errors(tmp_path: Path) -> None:
    bad = reassemble("run")
    assert bad.returncode == 2 and "the following arguments are required" in one_error_line(bad)
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
    done = reassemble("run", str(table), str(out), process=True)  # a failing job stops its session
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
    assert done.returncode == 2  # a usage error: refused before anything is written
    assert "reassemble: error: column 'segment' is string, expected binary (columns: segment string)" in done.stderr
    assert not (tmp_path / "out").exists()


SIZE_OPTIONS = [
    ("run", "--max-message-size"),
    ("run", "--large-message-bytes"),
    ("run", "--partitions"),
    ("refmsg", "--max-message-size"),
    ("refmsg", "--partitions"),
    ("demo", "--messages"),
    ("demo", "--segments-per-message"),
    ("demo", "--segment-size"),
    ("demo", "--large-message-bytes"),
    ("demo", "--max-message-size"),
]


def test_every_size_and_count_option_rejects_zero_negative_and_junk(tmp_path: Path) -> None:
    """Argparse refuses them (exit 2, one line) before anything starts: a size of -1 would quarantine everything."""
    for command, option in SIZE_OPTIONS:
        places = [str(tmp_path / "in"), str(tmp_path / "out")] if command != "demo" else []
        for value in ("-1", "0", "12x", "-9223372036854775808"):
            done = reassemble(command, *places, f"{option}={value}")
            line = one_error_line(done)
            assert done.returncode == 2 and option in line and value in line, (command, option, value, line)
    assert "at least 128" in one_error_line(reassemble("demo", "--segment-size", "84"))  # not even a header


def test_a_malformed_master_is_a_usage_error_in_one_line(tmp_path: Path) -> None:
    for master in ("bogus://x", "spark://", "spark://host", "spark://host:99999", "local[x]", "sc:/x"):
        done = reassemble("run", str(tmp_path), str(tmp_path / "out"), "--master", master)
        assert done.returncode == 2 and "not a Spark master URL" in one_error_line(done), master


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("scheme", ["spark", "sc"])
def test_a_master_where_nothing_listens_fails_fast_in_one_line(landing: Path, tmp_path: Path, scheme: str) -> None:
    port = free_port()
    done = reassemble(
        "run", str(landing), str(tmp_path / "out"), "--master", f"{scheme}://127.0.0.1:{port}", timeout=60
    )
    assert done.returncode == 1
    assert f"no Spark master answers at {scheme}://127.0.0.1:{port}: " in one_error_line(done)
    assert list(tmp_path.iterdir()) == []  # nothing claimed, nothing written


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
    assert done.stderr == ""
    assert f"messages: {len(rows)} in = " in done.stdout and "quarantined: holds" in done.stdout
    objects = {o["dest_name"]: o for o in pq.read_table(out / "objects").to_pylist()}
    assert objects["docs/a.bin"]["status"] == "complete" and objects["docs/a.bin"]["data"] == whole
    assert objects["b.bin"]["status"] != "complete"
    quarantine = pq.read_table(out / "quarantine").to_pylist()
    assert b"not a reference message" in {q["raw"] for q in quarantine}


def test_demo_checks_itself() -> None:
    done = reassemble("demo", "--messages", "30", "--segments-per-message", "3", "--segment-size", "2048")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert re.search(r"check: (\d+)/\1 messages as expected", done.stdout), done.stdout[-1500:]
    assert "duplicates: holds" in done.stdout and "segments accounted for: yes" in done.stdout
    (removed,) = re.findall(
        r"^demo: removed (\S+) \(--keep DIR keeps the landing table and the output\)$", done.stdout, re.M
    )
    assert f"{removed}/landing" in done.stdout and not Path(removed).exists()  # the paths it printed are gone


def test_demo_with_large_messages_streams_them_to_payload_files(tmp_path: Path) -> None:
    done = reassemble(
        "demo", "--messages", "20", "--segments-per-message", "3", "--segment-size", "2048",
        "--large-message-bytes", "3000", "--keep", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert re.search(r"check: (\d+)/\1 messages as expected", done.stdout), done.stdout[-1500:]
    messages = pq.read_table(tmp_path / "out" / "messages").to_pylist()
    files = {m["payload_path"] for m in messages if m["payload_path"]}
    payloads = tmp_path / "out" / "payloads"
    assert files and files == {p.name for p in payloads.iterdir() if p.name != "quarantine"}
    # large failures are quarantined by reference; every file left under quarantine/ is named by a row
    refs = [q for q in pq.read_table(tmp_path / "out" / "quarantine").to_pylist() if q["raw_path"]]
    assert refs and all(q["raw"] is None and read_quarantined(q, payloads) for q in refs)
    assert {q["raw_path"] for q in refs} == {f"quarantine/{p.name}" for p in (payloads / "quarantine").iterdir()}


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` (symlinks not followed) with its bytes: to prove nothing was touched."""
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() and not p.is_symlink() else None
        for p in sorted(root.rglob("*"))
    }


# (input, output) relative to a work directory holding landing/ (3 files) and link -> landing.
OVERLAPS = [
    ("landing", "landing"),  # the example: replaced with --overwrite
    ("landing/", "landing"),  # trailing slash
    ("landing", "./landing/."),
    ("landing", "landing/../landing"),  # `..`
    ("landing", "{abs}/landing"),  # absolute against relative
    ("link", "landing"),  # the input through a symlink
    ("landing", "link"),  # the output through a symlink
    ("landing", "landing/out"),  # inside: the next run reads its own output
    ("landing", "landing/deeper/out"),
    ("link/", "landing/out"),
    ("landing", "."),  # a parent: the input would be deleted
    ("landing/part-0000.parquet", "landing"),  # a file input and its directory
    ("landing/part-0000.parquet", "landing/part-0000.parquet"),
    ("landing/part-0000.parquet", "{abs}"),
    ("landing/*.parquet", "landing"),  # a glob and its directory
    ("landing/*.parquet", "landing/x.parquet"),  # not an input yet, but the same glob would read it
    ("landing/part-*", "landing/part-9999"),
    ("link/*.parquet", "landing/new.parquet"),
    ("linked", "real"),  # a directory input holding a symlink to a file of `real`: Spark reads it
    ("linked/", "{abs}/real/../real"),
]


def test_an_output_overlapping_the_input_is_refused_and_nothing_is_touched(landing: Path, tmp_path: Path) -> None:
    """Each shape once, alternating the commands that write and --overwrite."""
    work = tmp_path / "work"
    (work / "landing").mkdir(parents=True)
    for f in landing.iterdir():
        (work / "landing" / f.name).write_bytes(f.read_bytes())
    (work / "link").symlink_to("landing")
    (work / "real").mkdir()
    (work / "linked").mkdir()
    first = sorted(landing.iterdir())[0]
    (work / "real" / first.name).write_bytes(first.read_bytes())
    (work / "linked" / first.name).symlink_to(work / "real" / first.name)
    before = _tree(tmp_path)
    for i, (source, target) in enumerate(OVERLAPS):
        command, overwrite = ("run", "refmsg")[i % 2], ((), ("--overwrite",))[i // 2 % 2]
        argv = [command, source.format(abs=work), target.format(abs=work), *overwrite, "--master", "spark://0.0.0.0:9"]
        done = reassemble(*argv, cwd=work)
        line = one_error_line(done)
        assert done.returncode == 2 and "choose an output outside" in line, (argv, line)
        assert _tree(tmp_path) == before, argv  # no hidden temporary either


def test_an_output_beside_the_input_is_accepted_even_through_a_shared_prefix(landing: Path, tmp_path: Path) -> None:
    """`landing2` starts with `landing` but is not inside it: a string prefix is not a parent."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "landing").symlink_to(landing)
    (work / "link").symlink_to(work)
    from reassembly._files import claim_output, inputs

    pattern = str(work / "landing" / "*.parquet")
    for out in (work / "landing2", work / "landing.parquet", work / "link" / "out"):
        assert claim_output(str(out), inputs(pattern), pattern=pattern).out == out


def test_a_literal_input_path_is_read_as_named_and_the_output_may_be_dot(landing: Path, tmp_path: Path) -> None:
    """Spark globs the paths it reads: `in{a,b}` would read `ina` and `inb`, which the output checks
    never saw (and `ina` could be the output). The path is escaped: exactly the named input is read.
    An output named `.` (the current directory, replaced with --overwrite) works like any other."""
    files = sorted(landing.iterdir())
    for name, picked in (("in{a,b}", files[:1]), ("ina", files[1:2]), ("inb", files[2:3])):
        (tmp_path / name).mkdir()
        for f in picked:
            (tmp_path / name / f.name).write_bytes(f.read_bytes())
    from reassembly._files import hadoop_literal

    assert hadoop_literal("/a/in{a,b}/[x]*?\\y") == "/a/in\\{a,b\\}/\\[x\\]\\*\\?\\\\y"
    rows = pq.read_table(files[0]).num_rows
    here = tmp_path / "here"
    here.mkdir()
    done = reassemble("run", str(tmp_path / "in{a,b}"), ".", "--overwrite", "--no-progress", cwd=here)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"segments: {rows} in = " in done.stdout
    assert (here / "messages").is_dir() and (here / "quarantine").is_dir()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left behind


def test_ctrl_c_cleans_up_the_hidden_output_and_exits_130(tmp_path: Path) -> None:
    """SIGINT to the whole process group, as a terminal's Ctrl-C sends it, while Spark writes."""
    ds = generate(n_messages=300, segments_per_message=8, segment_size=16 * 1024, groups=2)
    data = write_parquet(ds, tmp_path / "in", files=4)
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "reassembly", "run", str(data), str(work / "out"), "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not list(work.glob(".out.tmp-*")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list(work.glob(".out.tmp-*")), "the job never started writing"
        os.killpg(proc.pid, signal.SIGINT)
        _, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, stderr[-3000:]
    assert stderr.strip().splitlines() == ["reassemble: interrupted"], stderr[-3000:]
    assert list(work.iterdir()) == []  # neither OUTPUT nor the hidden temporary


def test_a_ctrl_c_that_pyspark_swallowed_still_ends_the_job_as_interrupted(tmp_path: Path) -> None:
    """pyspark converts a Java exception under ``except BaseException: pass``: a Ctrl-C landing there
    raises nothing, and the job would run on to exit 0 with its output (test_ctrl_c_... above lands
    there about 1 run in 7). The handler's flag still says it came: the job's output is removed and
    the error is an interruption."""
    from reassembly._processes import INTERRUPTED
    from reassembly.spark.batch.job import Job
    from reassembly.spark.engine.session import SparkSettings

    job = Job("in", ["in"], tmp_path / "out", None, None, SparkSettings())
    try:
        with pytest.raises(KeyboardInterrupt), job.writing() as tmp:
            (tmp / "part-0.parquet").write_bytes(b"written before the Ctrl-C was noticed")
            INTERRUPTED.set()  # what _processes.on_interrupt does before its KeyboardInterrupt is swallowed
    finally:
        INTERRUPTED.clear()
    assert list(tmp_path.iterdir()) == []  # neither OUTPUT nor the hidden temporary


def test_the_jar_is_looked_for_without_a_java_exception(spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before ``ADD JAR`` the class is simply absent: asked through the class loader, not by catching
    the ClassNotFoundException whose conversion by pyspark swallows a Ctrl-C."""
    from pyspark.errors.exceptions import captured

    from reassembly.spark.engine.bridge import CLASS, _loadable, reassembler

    converted: list[object] = []
    convert = captured.convert_exception
    monkeypatch.setattr(captured, "convert_exception", lambda e: converted.append(e) or convert(e))
    jvm = spark.sparkContext._jvm
    assert not _loadable(jvm, "segmenter.jvm.NoSuchClass")
    assert reassembler(spark) is not None and _loadable(jvm, CLASS)
    assert converted == []  # no Java exception went through pyspark's conversion


def test_first_line_names_the_root_cause_of_a_python_worker_error(spark: object) -> None:
    """A worker's error text starts with a header ending in a colon; the line must carry the cause."""
    from reassembly._errors import first_line

    def fail(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            if batch.num_rows:
                raise ValueError("segment 3 has no header")
            yield batch

    df = spark.range(4).mapInArrow(fail, "id long")  # type: ignore[attr-defined]
    with pytest.raises(Exception) as caught:
        df.collect()
    line = first_line(caught.value)
    assert "ValueError: segment 3 has no header" in line and "\n" not in line, line
    with pytest.raises(Exception) as missing:
        spark.read.parquet("/no/such/landing")  # type: ignore[attr-defined]
    assert "/no/such/landing" in first_line(missing.value) and not first_line(missing.value).endswith(":")
