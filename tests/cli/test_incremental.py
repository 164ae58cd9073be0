"""``reassemble run --incremental``: a schedule's runs as real processes on real files, crashes included.

The landing data is the batch test data (every fault), each message cut in two: its segments at
the message's last position land in a later file than the rest, so every message straddles two
runs. Files land one at a time, and each run is killed once at a different point of the commit
protocol (by the job's own fault-injection point, and once from outside while Spark writes), then
run again. At the end, with every carried group expired, the committed runs together must hold
exactly what one plain ``run`` over all the files writes: every message once, byte-identical,
every segment accounted for.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reassembly.spark.incremental import FIRST_SEEN, KILL_AT, with_routing_key
from reassembly.spark.testdata import generate
from segmenter.errors import SegmentationError
from segmenter.wire import decode_header
from tests.support.command import reassemble

pytestmark = pytest.mark.spark

FILES = 3


def _start(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "reassembly", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        start_new_session=True,  # its own process group: the JVM and its Python workers die with it
    )


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGKILL to the process and everything it started (a killed driver's JVM too), then reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)


def killed_at(point: str, *args: str) -> int:
    """Run the command until it kills itself at ``point`` (the job's fault-injection point); its exit code."""
    proc = _start(*args, env={KILL_AT: point})
    try:
        proc.wait(timeout=600)
    finally:
        _kill_group(proc)
    return proc.returncode


def split_by_message(rows: list[bytes], files: int, seed: int = 3) -> list[list[bytes]]:
    """Each group's rows over two consecutive files: the rows at its last (MsgSeqNumber, Offset) in the
    later one, so no message (nor MQ group) is whole before the later file lands, and no copy of a
    segment lands after its message was decided; rows without a readable header anywhere."""
    rng = random.Random(seed)
    out: list[list[bytes]] = [[] for _ in range(files)]
    groups: dict[bytes, list[tuple[tuple[int, int], bytes]]] = {}
    for raw in rows:
        try:
            h = decode_header(raw)
        except SegmentationError:
            out[rng.randrange(files)].append(raw)
            continue
        groups.setdefault(h.group_id, []).append(((h.msg_seq_number, h.offset), raw))
    for i, (_, members) in enumerate(sorted(groups.items())):
        first = i % (files - 1)
        last = max(at for at, _ in members)
        for at, raw in members:
            out[first + (at == last)].append(raw)
    return out


def land(directory: Path, name: str, rows: list[bytes]) -> None:
    """A landing file that appears whole (written aside, renamed in)."""
    tmp = directory.parent / f".{name}"
    pq.write_table(pa.table({"segment": pa.array(rows, pa.binary())}), tmp)
    tmp.rename(directory / name)


def committed(out: Path, kind: str) -> list[dict[str, Any]]:
    """Every row of the committed runs (those with a marker), with its run."""
    rows = []
    for marker in sorted((out / "_runs").iterdir()):
        if marker.name.isdigit():
            folder = out / kind / f"run={marker.name}"
            rows += [{**r, "run": int(marker.name)} for r in pq.read_table(folder).to_pylist()]
    return rows


def _message(r: dict[str, Any]) -> tuple[Any, ...]:
    ranges = tuple((m["start"], m["end"]) for m in r["missing_ranges"] or [])
    return (r["status"], r["reason"], r["payload"], ranges, r["segments_used"], r["duplicates"], r["rejected"])


def _by_key(rows: list[dict[str, Any]]) -> dict[tuple[bytes, int], tuple[Any, ...]]:
    keys = Counter((r["group_id"], r["msg_seq_number"]) for r in rows)
    twice = [k for k, n in keys.items() if n > 1]
    assert not twice, f"written twice: {twice[:3]}"
    return {(r["group_id"], r["msg_seq_number"]): _message(r) for r in rows}


def _quarantined(rows: list[dict[str, Any]]) -> Counter[tuple[Any, ...]]:
    return Counter((r["raw"], r["reason"]) for r in rows)


def _consistent(out: Path, ck: Path) -> None:
    """What readers see after any run, killed or not: only committed runs, each whole, nothing staged."""
    markers = sorted(int(p.name) for p in (out / "_runs").iterdir() if p.name.isdigit())
    records = sorted(int(p.stem) for p in (ck / "runs").glob("*.json"))
    assert markers == records == list(range(1, len(records) + 1))
    for kind in ("messages", "quarantine"):
        assert sorted(int(p.name.removeprefix("run=")) for p in (out / kind).glob("run=*")) == markers
    assert not list(out.glob(".*")), "a staging folder was left behind"
    assert {p.name for p in (ck / "carry").glob("*")} <= {f"run={markers[-1]}"}  # the last run's carry at most


def _accounted(stdout: str) -> tuple[int, int]:
    """(rows in, rows carried out) of a run's accounting line, which must hold."""
    line = next(x for x in stdout.splitlines() if x.startswith("segments: "))
    assert line.endswith(": holds"), line
    numbers = [int(n) for n in line.replace("(", " ").replace(")", " ").split() if n.isdigit()]
    rows_in, new, carried_in, used, quarantined, duplicates, carried_out = numbers
    assert rows_in == new + carried_in == used + quarantined + duplicates + carried_out
    return rows_in, carried_out


@pytest.mark.sweep
def test_runs_killed_at_every_step_leave_committed_runs_that_equal_one_plain_run(tmp_path: Path) -> None:
    ds = generate(n_messages=20, segments_per_message=3, segment_size=1024, groups=2, seed=5)
    parts = split_by_message(ds.rows, FILES)
    landing, out, ck = tmp_path / "landing", tmp_path / "out", tmp_path / "ck"
    landing.mkdir()
    command = ("run", str(landing), str(out), "--incremental", "--checkpoint", str(ck))

    # run 1, killed once its output and carry are staged (before the commit record): redone whole
    land(landing, "f0.parquet", parts[0])
    assert killed_at("staged", *command) == -signal.SIGKILL
    assert not (ck / "runs").exists() and not list((out / "_runs").iterdir())
    assert list(out.glob(".run=1.*.staging")), "the killed run had staged its output"
    done = reassemble(*command)
    assert done.returncode == 0, done.stderr
    assert "run 1: 1 new file" in done.stdout and "committed: run 1" in done.stdout
    assert _accounted(done.stdout)[1] > 0  # the messages cut in two wait for their other part
    _consistent(out, ck)

    # runs 2 and 3, killed after the commit record (nothing published yet) and half-way through the
    # publication: committed; the next call finishes publishing, then has nothing new to do
    for n, point in ((1, "recorded"), (2, "published-messages")):
        land(landing, f"f{n}.parquet", parts[n])
        assert killed_at(point, *command) == -signal.SIGKILL
        again = reassemble(*command)
        assert again.returncode == 0, again.stderr
        assert again.stdout.startswith(f"idle: no new input (last run {n + 1}; carrying "), again.stdout
        _consistent(out, ck)
    assert len(json.loads((out / "_runs" / "3").read_text())["accounting"]) == 6

    # run 4 writes every group still carried (those that never complete) as incomplete: killed from
    # outside while its Spark job writes (the JVM with it), run again and killed after publishing
    # (before the superseded carry is removed), then nothing is left to do
    flush = (*command, "--expire-after", "0s")
    proc = _start(*flush)
    try:
        deadline = time.monotonic() + 600
        while not list(out.glob(".run=4.*.staging/messages")) and proc.poll() is None:
            assert time.monotonic() < deadline, "run 4 never started writing"
            time.sleep(0.05)
    finally:
        _kill_group(proc)
    assert proc.returncode == -signal.SIGKILL, "run 4 ended before it could be killed"
    assert not (ck / "runs" / "4.json").exists()
    assert killed_at("published", *flush) == -signal.SIGKILL
    idle = reassemble(*flush)
    assert idle.returncode == 0 and idle.stdout.startswith("idle: no new input (last run 4)"), idle.stdout
    _consistent(out, ck)
    summary = json.loads((out / "_runs" / "4").read_text())
    assert summary["files"] == 0 and summary["accounting"]["carried_out"] == 0
    assert summary["expired_groups"]["age"] > 0 and not list((ck / "carry").iterdir())

    plain = tmp_path / "plain"
    one = reassemble("run", str(landing), str(plain))
    assert one.returncode == 0, one.stderr
    expected_messages = _by_key(pq.read_table(plain / "messages").to_pylist())
    assert _by_key(committed(out, "messages")) == expected_messages
    assert _quarantined(committed(out, "quarantine")) == _quarantined(pq.read_table(plain / "quarantine").to_pylist())
    assert {"complete", "incomplete", "corrupt"} <= {v[0] for v in expected_messages.values()}

    # a landing file read by a run must not change: an error naming it, nothing run
    before = os.stat(landing / "f1.parquet")
    os.utime(landing / "f1.parquet", ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))
    changed = reassemble(*command)
    assert changed.returncode == 1
    assert f"landing file {(landing / 'f1.parquet').resolve()} changed after run 2 read it" in changed.stderr
    assert len(changed.stderr.strip().splitlines()) == 1
    _consistent(out, ck)


def test_usage_errors_refuse_before_anything_is_touched(tmp_path: Path) -> None:
    landing, out, ck = tmp_path / "landing", tmp_path / "out", tmp_path / "ck"
    landing.mkdir()
    land(landing, "f0.parquet", [b"x"])
    reports = tmp_path / "reports"  # the command writes --summary-json on failure too
    reports.mkdir()
    base = ("run", str(landing), str(out))
    cases = {
        "--incremental needs --checkpoint": (*base, "--incremental"),
        "--checkpoint needs --incremental": (*base, "--checkpoint", str(ck)),
        "--expire-after needs --incremental": (*base, "--expire-after", "1h"),
        "--overwrite with --incremental": (*base, "--incremental", "--checkpoint", str(ck), "--overwrite"),
        f"checkpoint {landing / 'ck'} is inside the input": (
            *base, "--incremental", "--checkpoint", str(landing / "ck"),
        ),
        f"output {landing / 'out'} is inside the input": (
            "run", str(landing), str(landing / "out"), "--incremental", "--checkpoint", str(ck),
        ),
        "overlap: keep them apart": (*base, "--incremental", "--checkpoint", str(out / "ck")),
        f"--summary-json {landing / 's.json'} is inside the input": (
            *base, "--incremental", "--checkpoint", str(ck), "--summary-json", str(landing / "s.json"),
        ),
    }  # fmt: skip
    for message, args in cases.items():
        done = reassemble(*args)
        assert done.returncode == 2, (message, done.stderr)
        assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["landing", "reports"]
    assert sorted(p.name for p in landing.iterdir()) == ["f0.parquet"]


def test_the_routing_key_is_the_reassemblys(spark: Any) -> None:
    """The carry takes a group's rows by the key the reassembly routes them by: the GroupId of a row
    whose framing holds, none for any other row (garbage, a flipped header bit, truncation, NULL)."""
    from reassembly.spark.batch.decode import decode_segments

    ds = generate(n_messages=30, segments_per_message=2, segment_size=512, groups=2, seed=2)
    rows = [*ds.rows, None, b"", b"SGMT", ds.rows[0][:50]]
    df = spark.createDataFrame([(r, i) for i, r in enumerate(rows)], f"segment binary, `{FIRST_SEEN}` bigint")
    keyed = with_routing_key(df, "segment").collect()
    assert [r[FIRST_SEEN] for r in keyed] == list(range(len(rows)))  # the other columns travel unchanged
    decoded = decode_segments(df.select("segment")).select("routable", "group_id").collect()
    expected = [d.group_id if d.routable else None for d in decoded]
    assert [r["__reassembly_key"] for r in keyed] == expected
    assert sum(k is None for k in expected) > 4  # some rows are not routable


def _plain(value: Any) -> Any:
    """A header field as Parquet takes it (flags are int enums)."""
    return value if value is None or isinstance(value, bytes) else int(value)


def test_columns_are_carried_encoded_with_their_lineage_and_the_size_bound_holds(tmp_path: Path, spark: Any) -> None:
    """Segments as columns (``--input-format columns``), encoded as ``run`` encodes them and carried in
    that form with their other columns: a message cut in two is complete in the later run and lists as
    its sources (``--keep-columns``, ``--keep-input-file``) the rows of both runs. The messages begun in
    that later run are younger than ``--expire-after`` but past ``--carry-max-bytes``: written as
    incomplete, with what is missing, instead of carried."""
    from reassembly.spark import read_output
    from segmenter.wire import decode_segment

    ds = generate(n_messages=8, segments_per_message=3, segment_size=1024, faults=False, groups=0, compress_every=0)
    parts = split_by_message(ds.rows, 3)  # messages over files 0+1 and 1+2
    landing, out, ck = tmp_path / "landing", tmp_path / "out", tmp_path / "ck"
    landing.mkdir()
    command: tuple[str, ...] = ("run", str(landing), str(out), "--incremental", "--checkpoint", str(ck))
    command += ("--keep-columns", "topic", "--keep-input-file", "--input-format", "columns")
    for i in (0, 1):
        segments = [decode_segment(raw) for raw in parts[i]]
        columns = {name: [_plain(getattr(s.header, name)) for s in segments] for name in (
            "group_id", "msg_seq_number", "offset", "msg_flags", "original_length", "data_checksum",
            "message_checksum",
        )}  # fmt: skip
        table = pa.table({**columns, "data": pa.array([bytes(s.data) for s in segments], pa.binary())})
        pq.write_table(table.append_column("topic", pa.array([f"t{i}"] * len(segments))), landing / f".f{i}")
        (landing / f".f{i}").rename(landing / f"f{i}.parquet")
        if i == 0:
            first = reassemble(*command)
            assert first.returncode == 0, first.stderr
            assert _accounted(first.stdout)[1] == len(parts[0])  # every message waits for its last segment
            time.sleep(1.1)
    second = reassemble(*command, "--expire-after", "1s", "--carry-max-bytes", "1")
    assert second.returncode == 0, second.stderr
    assert _accounted(second.stdout)[1] == 0 and not list((ck / "carry").iterdir())
    messages = [r.asDict(recursive=True) for r in read_output(spark, out).collect()]
    assert {m["run"] for m in messages} == {2}
    complete = [m for m in messages if m["status"] == "complete"]
    assert {m["group_id"] for m in complete} == {bytes(r[16:40]) for r in parts[0]}
    for m in complete:  # lineage across the carry: each segment used, with the file it landed in
        assert (m["group_id"], 1) in ds.expected and m["payload"] == ds.expected[(m["group_id"], 1)].payload
        assert len(m["sources"]) == m["segments_used"] and {s["topic"] for s in m["sources"]} == {"t0", "t1"}
        assert all(s["input_file"].endswith(f"f{s['topic'][1]}.parquet") for s in m["sources"])
    incomplete = [m for m in messages if m["status"] == "incomplete"]
    assert incomplete and all(m["missing_ranges"] for m in incomplete)
    assert len(complete) + len(incomplete) == len(ds.expected)
    assert f"0 groups past --expire-after, {len(incomplete)} past --carry-max-bytes" in second.stdout
    again = reassemble(*command[:-2])  # the checkpoint keeps the input format it began with
    assert again.returncode == 1 and "was begun with" in again.stderr, again.stderr
