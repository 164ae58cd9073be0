"""Streaming reassembly on real Spark: a landing directory filling over time, runs, crashes and restarts.

In this process (one Spark session, four available-now runs):

Run 1 (two micro-batches) and run 2 deliver every fault of the batch test
data cut into three files; messages straddle micro-batches and runs. Run 3
brings a file far later in event time: the watermark passes every expiry.
Run 4 brings segments after the end: an identical copy, a conflicting copy,
a segment of an expired message. The streamed rows must equal, message for
message and segment for segment, what one batch ``reassemble`` run reports.

As a separate process (``reassemble stream``, 1 s trigger, one file per
micro-batch): SIGKILL (the JVM with it) the moment a micro-batch starts
writing, restart on the same checkpoint with a file far later in event time
landed meanwhile (every incomplete message expires), Ctrl-C (exit code 130
once the batch in flight has committed); every message exactly once,
byte-identical, and the accounting identity over the whole run.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reassembly.spark import reassemble
from reassembly.spark.stream.functions import (
    StreamOptions,
    file_source,
    read_committed,
    reassemble_stream,
    start,
)
from reassembly.spark.testdata import Dataset, _conflicting_copy, generate
from segmenter import Reason
from segmenter.producer import Segmenter
from tests.support.command import reassemble as command

pytestmark = pytest.mark.spark

T0 = time.time() - 100_000  # event times (file modification times) of the landing files
OPTIONS = StreamOptions(expire_after=300, watermark=0, tombstone=5000)


def _iso(at: float) -> str:
    """Spark's way of writing a time in progress reports."""
    return datetime.fromtimestamp(at, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def land(directory: Path, name: str, rows: list[bytes], at: float) -> None:
    """A Parquet file that 'arrives' at event time ``at`` (its modification time)."""
    path = directory / f"{name}.parquet"
    tmp = directory.parent / f".{name}.parquet"
    pq.write_table(pa.table({"segment": pa.array(rows, pa.binary())}), tmp)
    os.utime(tmp, (at, at))
    tmp.rename(path)  # appears whole, as a real landing would


def run_available_now(spark: Any, base: Path, max_files: int | None = None) -> None:
    df = file_source(spark, str(base / "landing"), max_files=max_files)
    query = start(reassemble_stream(df, options=OPTIONS), base / "out", str(base / "checkpoint"), "available-now")
    assert query.awaitTermination(600), "available-now run did not end"
    assert query.exception() is None


class Landing:
    def __init__(self, ds: Dataset, withheld: bytes, kept: list[bytes], late: list[bytes], files: list[list[bytes]]):
        self.ds, self.withheld, self.kept, self.late, self.files = ds, withheld, kept, late, files


@pytest.fixture(scope="module")
def landing(stream_spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Landing]:
    base = tmp_path_factory.mktemp("stream")
    (base / "landing").mkdir()
    ds = generate(n_messages=20, segments_per_message=3, segment_size=1024, seed=11)
    segs = [s.encode() for s in Segmenter(300).segment(random.Random(2).randbytes(1000))]
    withheld, kept = segs[1], [segs[0], *segs[2:]]  # this message never completes: expires, then its segment is late
    rows = [*ds.rows, *kept]
    random.Random(4).shuffle(rows)
    files = [rows[0::3], rows[1::3], rows[2::3]]
    fresh = [s.encode() for s in Segmenter(300).segment(b"pushes the watermark" * 20)]
    land(base / "landing", "f0", files[0], T0)
    land(base / "landing", "f1", files[1], T0 + 10)
    run_available_now(stream_spark, base, max_files=1)  # two micro-batches
    land(base / "landing", "f2", files[2], T0 + 20)
    run_available_now(stream_spark, base)  # messages straddling runs complete
    land(base / "landing", "f3", fresh, T0 + 1000)
    run_available_now(stream_spark, base)  # the watermark passes every expiry
    complete = next(k for k, e in ds.expected.items() if e.status == "complete" and len(e.payload or b"") > 2000)
    first = next(r for r in ds.rows if r[16:44] == complete[0] + complete[1].to_bytes(4, "big"))
    late = [first, _conflicting_copy(first, random.Random(9)), withheld]
    land(base / "landing", "f4", late, T0 + 1010)
    run_available_now(stream_spark, base)
    return base, Landing(ds, withheld, kept, late, [*files, fresh])


def _by_key(rows: list[dict[str, Any]]) -> dict[tuple[bytes, int], dict[str, Any]]:
    out: dict[tuple[bytes, int], dict[str, Any]] = {}
    for r in rows:
        key = (r["group_id"], r["msg_seq_number"])
        assert key not in out, f"message {key} written twice"
        out[key] = r
    return out


def test_streamed_rows_equal_one_batch_run(stream_spark: Any, landing: tuple[Path, Landing]) -> None:
    base, land_ = landing
    before_late = [n for n in range(100) if (base / "out" / "_commits" / str(n)).exists()]
    assert len(before_late) >= 4
    every = [r for f in land_.files for r in f]
    batch = reassemble(stream_spark.createDataFrame([(r,) for r in every], "segment binary")).combined.collect()
    want_msgs = {(bytes(r.group_id), r.msg_seq_number): r for r in batch if r.kind == "message"}
    msgs = _by_key(read_committed(base / "out", "message"))
    dups = Counter((r["group_id"], r["msg_seq_number"]) for r in read_committed(base / "out", "duplicate"))
    late_keys = {(r[16:40], int.from_bytes(r[40:44], "big")) for r in land_.late[:2]}
    assert set(msgs) == set(want_msgs)
    for key, want in want_msgs.items():
        got = msgs[key]
        for col in ("status", "reason", "payload", "segments_used", "missing_seq_numbers"):
            assert got[col] == (bytes(want[col]) if col == "payload" and want[col] else want[col]), (key, col)
        assert got["missing_ranges"] == [m.asDict() for m in want.missing_ranges]
        extra = 1 if key in late_keys else 0  # run 4's identical copy, not in the batch input
        assert got["duplicates"] + dups[key] == want.duplicates + extra, key
    late_raw = set(land_.late)
    got_q = Counter(
        (r["raw"], r["reason"]) for r in read_committed(base / "out", "quarantine") if r["raw"] not in late_raw
    )
    assert got_q == Counter((bytes(r.raw), r.reason) for r in batch if r.kind == "quarantine")


def test_expected_outcomes_and_exact_missing_ranges(landing: tuple[Path, Landing]) -> None:
    base, land_ = landing
    msgs = _by_key(read_committed(base / "out", "message"))
    for key, exp in land_.ds.expected.items():
        assert (msgs[key]["status"], msgs[key]["reason"]) == (exp.status, int(exp.reason)), key
        if exp.missing_ranges:
            assert [(m["start"], m["end"]) for m in msgs[key]["missing_ranges"]] == list(exp.missing_ranges)
    withheld = msgs[(land_.withheld[16:40], 1)]
    assert withheld["status"] == "incomplete" and withheld["missing_ranges"] == [{"start": 216, "end": 432}]


def test_after_the_end_duplicate_conflict_late(landing: tuple[Path, Landing]) -> None:
    base, land_ = landing
    dup, conflict, late = land_.late
    q = {r["raw"]: r for r in read_committed(base / "out", "quarantine")}
    assert q[conflict]["reason"] == Reason.CONFLICTING_DUPLICATE
    assert q[late]["reason"] == Reason.LATE_SEGMENT and "expired" in q[late]["detail"]
    at = int.from_bytes(dup[48:56], "big")
    assert any(r["group_id"] == dup[16:40] and r["offset"] == at for r in read_committed(base / "out", "duplicate"))


def test_accounting_identity_over_the_whole_run(landing: tuple[Path, Landing]) -> None:
    base, land_ = landing
    rows_in = sum(len(f) for f in land_.files) + len(land_.late)
    msgs = read_committed(base / "out", "message")
    used = sum(r["segments_used"] for r in msgs)
    dups = sum(r["duplicates"] for r in msgs) + len(read_committed(base / "out", "duplicate"))
    assert rows_in == used + len(read_committed(base / "out", "quarantine")) + dups
    straddling = {r[16:40] for r in land_.files[0] if any(r[16:40] == s[16:40] for s in land_.files[2])} & {
        k[0] for k, m in _by_key(msgs).items() if m["status"] == "complete"
    }
    assert straddling, "no complete message straddled the first and the second available-now run"


FILES = 4


def stream_command(base: Path, *options: str) -> list[str]:
    """``reassemble stream`` on ``base``'s landing directory, output and checkpoint."""
    landing, out, checkpoint = (str(base / d) for d in ("landing", "out", "checkpoint"))
    return [sys.executable, "-m", "reassembly", "stream", landing, out, "--checkpoint", checkpoint, *options]


def _command(base: Path, trigger: str) -> list[str]:
    one_file = ["--max-files-per-trigger", "1", "--partitions", "2"]
    return stream_command(base, "--trigger", trigger, *one_file, "--expire-after", "300s", "--watermark", "0s")


def _start(base: Path, trigger: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.Popen(
        _command(base, trigger),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        start_new_session=True,  # its own process group: the JVM and Python workers die with it
    )


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.mark.sweep
def test_sigkill_mid_batch_then_restart_exactly_once(tmp_path: Path) -> None:
    ds = generate(n_messages=24, segments_per_message=3, segment_size=1024, seed=5)
    (tmp_path / "landing").mkdir()
    for i in range(FILES):
        land(tmp_path / "landing", f"f{i}", ds.rows[i::FILES], T0 + i)
    out = tmp_path / "out"

    first = _start(tmp_path, "1s")
    try:
        # kill as soon as a batch (after the first committed one) is being written
        _wait(lambda: (out / "_commits").is_dir() and any((out / "_commits").iterdir()), 600, "a first batch")
        _wait(lambda: any((out / "_incoming").iterdir()) or first.poll() is not None, 600, "a batch in flight")
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    assert first.returncode == -signal.SIGKILL

    fresh = [s.encode() for s in Segmenter(300).segment(b"x" * 900)]
    land(tmp_path / "landing", "later", fresh, T0 + 5000)  # the watermark passes every expiry
    second = _start(tmp_path, "1s")
    try:
        _wait(lambda: len(read_committed(out, "message")) > len(ds.expected), 900, "every message")
        second.send_signal(signal.SIGINT)
        stdout, _ = second.communicate(timeout=300)
    finally:
        if second.poll() is None:
            os.killpg(second.pid, signal.SIGKILL)
    assert second.returncode == 130  # stopped by Ctrl-C, after the batch in flight committed
    assert "rows in; messages" in stdout

    msgs = read_committed(out, "message")
    keys = [(r["group_id"], r["msg_seq_number"]) for r in msgs]
    assert len(keys) == len(set(keys)), "a message was written twice"
    got = dict(zip(keys, msgs, strict=True))
    for key, exp in ds.expected.items():
        assert got[key]["status"] == exp.status, key
        if exp.payload is not None:
            assert got[key]["payload"] == exp.payload
    quarantined = read_committed(out, "quarantine")
    dups = sum(r["duplicates"] for r in msgs) + len(read_committed(out, "duplicate"))
    assert len(ds.rows) + len(fresh) == sum(r["segments_used"] for r in msgs) + len(quarantined) + dups


def test_columns_in_and_group_messages_leave_one_by_one(stream_spark: Any, tmp_path: Path) -> None:
    """Segments as columns (``encoded=False``); without Unit of Work the complete messages of an MQ group
    leave in the micro-batch that completes each, not when the group is complete; a large message is held
    on disk between micro-batches and delivered as a file in the body directory."""
    from pyspark.sql import functions as F

    from reassembly.spark.batch.pipeline import ReassemblyOptions
    from segmenter.producer import new_group_id
    from segmenter.wire import decode_segment

    rng = random.Random(8)
    payloads = [rng.randbytes(n) for n in (700, 20, 900)]
    segs = [s.encode() for s in Segmenter(300).segment_group(payloads, group_id=new_group_id())]
    last = [s for s in segs if decode_segment(s).header.is_last_segment][1:]  # of messages 2 and 3
    (tmp_path / "landing").mkdir()

    def columns(raws: list[bytes], name: str, at: float) -> None:
        heads = [decode_segment(r) for r in raws]
        table = pa.table(
            {
                "group_id": [s.header.group_id for s in heads],
                "msg_seq_number": [s.header.msg_seq_number for s in heads],
                "offset": [s.header.offset for s in heads],
                "msg_flags": [s.header.msg_flags for s in heads],
                "original_length": [s.header.original_length for s in heads],
                "data_checksum": [s.header.data_checksum for s in heads],
                "message_checksum": [s.header.message_checksum for s in heads],
                "data": pa.array([bytes(s.data) for s in heads], pa.binary()),
            }
        )
        pq.write_table(table, tmp_path / f".{name}")
        os.utime(tmp_path / f".{name}", (at, at))
        (tmp_path / f".{name}").rename(tmp_path / "landing" / name)

    columns([s for s in segs if s not in last], "a.parquet", T0)
    columns(last, "b.parquet", T0 + 1)
    ints = ("msg_seq_number", "offset", "msg_flags", "original_length", "data_checksum", "message_checksum")
    df = (
        stream_spark.readStream.schema(f"group_id binary, data binary, {', '.join(f'{c} bigint' for c in ints)}")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(tmp_path / "landing"))
        .select("*", F.col("_metadata.file_modification_time").alias("event_time"))
    )
    bodies = tmp_path / "bodies"
    large = ReassemblyOptions(unit_of_work=False, payload_dir=str(bodies), large_message_bytes=800)
    options = StreamOptions(reassembly=large, expire_after=300, watermark=0)
    rows = reassemble_stream(df, encoded=False, options=options)
    query = start(rows, tmp_path / "out", str(tmp_path / "ck"), "available-now", options=options)
    assert query.awaitTermination(600) and query.exception() is None
    msgs = read_committed(tmp_path / "out", "message")
    assert sorted((m["batch"], m["msg_seq_number"], m["status"]) for m in msgs) == [
        (0, 1, "complete"),
        (1, 2, "complete"),
        (1, 3, "complete"),
    ]
    got = {m["msg_seq_number"]: m["payload"] or (bodies / m["payload_path"]).read_bytes() for m in msgs}
    assert got == dict(enumerate(payloads, 1))
    assert [m["msg_seq_number"] for m in msgs if m["payload_path"]] == [3]
    assert read_committed(tmp_path / "out", "quarantine") == []
    assert not list((bodies / ".stream").iterdir())  # spool files go once their message is committed


def test_status_line_reports_exactly_what_state_holds(stream_spark: Any, tmp_path: Path) -> None:
    """After a batch with two incomplete messages (one small, in state; one large, spooled to disk) the
    status line's held bytes are exactly theirs; after the batch completing them, 0 held and two
    tombstones; once event time passes the tombstones' time, those go too."""
    from reassembly.cli.stream import status_line
    from reassembly.spark.batch.pipeline import ReassemblyOptions
    from reassembly.spark.stream.core import Footprint
    from reassembly.spark.stream.functions import OLDEST, OPEN_KEYS, batch_counts, committed_batches, state_after
    from segmenter.wire import decode_header

    rng = random.Random(21)
    small = [s.encode() for s in Segmenter(300).segment(rng.randbytes(800))]
    large = [s.encode() for s in Segmenter(300).segment(rng.randbytes(900))]
    first = [small[0], *small[2:], large[0], large[1]]
    (tmp_path / "landing").mkdir()
    bodies = tmp_path / "bodies"
    options = StreamOptions(
        reassembly=ReassemblyOptions(payload_dir=str(bodies), large_message_bytes=850),
        expire_after=300,
        watermark=0,
        tombstone=600,
    )

    def run() -> tuple[Footprint | None, str]:
        df = file_source(stream_spark, str(tmp_path / "landing"))
        query = start(
            reassemble_stream(df, options=options),
            tmp_path / "out",
            str(tmp_path / "ck"),
            "available-now",
            options=options,
        )
        assert query.awaitTermination(600) and query.exception() is None
        # the batch that read the file (a batch without input may follow it: the watermark moved)
        progress = [p for p in query.recentProgress if "addBatch" in p.durationMs and p.numInputRows][-1]
        counts = batch_counts(tmp_path / "out", progress.batchId) or Counter()
        return state_after(tmp_path / "out"), status_line(progress.batchId, counts, progress)

    land(tmp_path / "landing", "a", first, T0)
    held, line = run()
    head = [decode_header(r).header_length for r in large[:2]]
    want = Footprint(
        groups=2,
        segments=len(small) + 1,
        held_bytes=sum(map(len, first[: len(small) - 1])) + sum(head),
        spooled_bytes=sum(len(r) - n for r, n in zip(large[:2], head, strict=True)),
    )
    assert held == want
    assert (
        f"held 2 groups, {want.segments} segments, {want.held_bytes} bytes in state, {want.spooled_bytes} bytes spooled"
        in line
    )
    assert "tombstones 0 (0 bytes); oldest held 0ms;" in line  # event time now: the file's, when both opened
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z batch 0 \(\d+\.\ds\): ", line), line
    assert f"): {len(first)} rows in; " in line
    counts = batch_counts(tmp_path / "out", 0)
    assert counts is not None and abs(counts[OLDEST] - T0 * 1000) <= 1  # both groups opened at T0
    later = SimpleNamespace(
        numInputRows=0,
        stateOperators=[],
        timestamp="2026-01-01T00:00:00.000Z",
        durationMs={"triggerExecution": 1500},
        eventTime={"max": _iso(T0 + 90), "watermark": _iso(T0 + 80)},
    )
    assert "; oldest held 1m30s;" in status_line(0, counts, later)
    assert "; oldest held 1m40s;" in status_line(0, counts, later, lateness=20)  # the watermark trails by 20 s

    land(tmp_path / "landing", "b", [small[1], *large[2:]], T0 + 1)
    held, line = run()
    assert held is not None and held._replace(tombstone_bytes=0) == Footprint(tombstones=2)
    assert held.tombstone_bytes > 0
    assert "held 0 groups, 0 segments, 0 bytes in state, 0 bytes spooled; tombstones 2 (" in line
    assert "oldest held none" in line
    last = committed_batches(tmp_path / "out")[-1]
    assert pq.read_table(tmp_path / "out" / OPEN_KEYS / f"{last}.parquet").num_rows == 0
    assert not list((bodies / ".stream").iterdir())  # the spooled data left with its message

    fresh = [s.encode() for s in Segmenter(300).segment(b"moves event time on" * 10)]
    land(tmp_path / "landing", "c", fresh, T0 + 5000)  # past both tombstones' time
    held, _ = run()
    assert held is not None and (held.groups, held.segments, held.held_bytes, held.tombstones) == (0, 0, 0, 1)


def test_rows_that_are_not_whole_segments_are_quarantined_as_they_came_even_when_spooled(
    stream_spark: Any, tmp_path: Path
) -> None:
    """A large message's segments are spooled to disk at their offsets. A row longer than its
    segment, spooled, would write its extra bytes over the next segment's spooled data (its bytes
    lost, and with a CRC-preserving tail forged content delivered as complete); a shorter one would
    come back padded with zeros (quarantined as 9005 with bytes it never had); a NULL row has no
    bytes to spool. So each stays in state as it came and is quarantined as `run` does it, and
    the message completes from its whole segments."""
    from reassembly.spark.batch.pipeline import ReassemblyOptions

    payload = random.Random(31).randbytes(1500)
    seg0, seg1, seg2 = [s.encode() for s in Segmenter(600).segment(payload)]
    overlong, short = seg0 + b"EXTRA BYTES THAT LAND ON THE NEXT RANGE" * 3, seg2[:-40]
    (tmp_path / "landing").mkdir()
    land(tmp_path / "landing", "f1", [seg1, seg2], T0)
    land(tmp_path / "landing", "f2", [overlong, short, None], T0 + 1)  # type: ignore[list-item]
    land(tmp_path / "landing", "f3", [seg0], T0 + 2)
    options = StreamOptions(
        reassembly=ReassemblyOptions(payload_dir=str(tmp_path / "bodies"), large_message_bytes=1000),
        expire_after=300,
        watermark=0,
        tombstone=5000,
    )
    df = file_source(stream_spark, str(tmp_path / "landing"), max_files=1)
    query = start(reassemble_stream(df, options=options), tmp_path / "out", str(tmp_path / "ck"), "available-now",
                  options=options)  # fmt: skip
    assert query.awaitTermination(600) and query.exception() is None
    (msg,) = read_committed(tmp_path / "out", "message")
    assert msg["status"] == "complete" and (tmp_path / "bodies" / msg["payload_path"]).read_bytes() == payload
    quarantined = Counter((r["reason"], r["raw"]) for r in read_committed(tmp_path / "out", "quarantine"))
    truncated, trailing = int(Reason.TRUNCATED), int(Reason.TRAILING_BYTES)
    assert quarantined == Counter([(trailing, overlong), (truncated, short), (truncated, None)])  # NULL stays NULL


def test_null_event_times_and_old_files_are_read(stream_spark: Any, tmp_path: Path) -> None:
    """A NULL event time counts as the latest of its call (it must not stop the stream, which would
    stop again at every restart on the same input); a file whose modification time is more than 7
    days older than the newest seen is read too (Spark's maxFileAge would skip it without a word)."""
    rng = random.Random(41)
    first = [s.encode() for s in Segmenter(300).segment(rng.randbytes(700))]
    second = [s.encode() for s in Segmenter(300).segment(rng.randbytes(700))]
    landing = tmp_path / "landing"
    landing.mkdir()

    def put(name: str, rows: list[bytes], times: list[Any], mtime: float) -> None:
        tmp = tmp_path / f".{name}.parquet"
        pq.write_table(
            pa.table({"segment": pa.array(rows, pa.binary()), "t": pa.array(times, pa.timestamp("ms"))}), tmp
        )
        os.utime(tmp, (mtime, mtime))
        tmp.rename(landing / f"{name}.parquet")

    now = time.time()
    stamp = int(now * 1000)
    put("a", first, [None if i == 1 else stamp for i in range(len(first))], now)
    put("b", second, [None] * len(second), now - 30 * 86400)  # copied with its old mtime (cp -p)
    df = file_source(stream_spark, str(landing), event_time="t")
    query = start(reassemble_stream(df, options=OPTIONS), tmp_path / "out", str(tmp_path / "ck"), "available-now")
    assert query.awaitTermination(600) and query.exception() is None
    assert sorted(r["status"] for r in read_committed(tmp_path / "out", "message")) == ["complete", "complete"]


def test_each_batch_publishes_its_counts_as_spark_observed_metrics(stream_spark: Any, tmp_path: Path) -> None:
    """The stream's output carries ``DataFrame.observe("reassembly", ...)``: each batch's counts are in its
    ``StreamingQueryProgress.observedMetrics`` (what Spark's UI, listeners and metrics sinks read), equal
    to what the batch committed. A NULL row is quarantined with its value, NULL, never ``b''``."""
    from reassembly.spark.stream.functions import OBSERVATION, STATUSES, batch_counts

    rng = random.Random(51)
    good = [s.encode() for s in Segmenter(300).segment(rng.randbytes(700))]
    open_ = [s.encode() for s in Segmenter(300).segment(rng.randbytes(700))][:1]  # its message stays open
    (tmp_path / "landing").mkdir()
    land(tmp_path / "landing", "a", [*good, good[0], b"not a segment", None, *open_], T0)  # type: ignore[list-item]
    query = start(
        reassemble_stream(file_source(stream_spark, str(tmp_path / "landing")), options=OPTIONS),
        tmp_path / "out",
        str(tmp_path / "ck"),
        "available-now",
    )
    assert query.awaitTermination(600) and query.exception() is None
    assert OBSERVATION in query.lastProgress["observedMetrics"]
    ran = [p for p in query.recentProgress if "addBatch" in p.durationMs]
    got: Counter[str] = Counter()
    for p in ran:
        metrics = p.observedMetrics[OBSERVATION].asDict()
        counts = batch_counts(tmp_path / "out", p.batchId)
        assert counts is not None
        assert metrics["quarantined"] == counts["quarantine"] and metrics["duplicates"] == counts["duplicate"]
        assert all(metrics[f"messages_{s}"] == counts[f"message:{s}"] for s in STATUSES)
        got.update(metrics)
    assert got["messages"] == got["messages_complete"] == 1
    assert got["segments_used"] == len(good) and got["message_duplicates"] == 1
    assert (got["quarantined"], got["late"], got["duplicates"]) == (2, 0, 0)
    q = Counter(r["raw"] for r in read_committed(tmp_path / "out", "quarantine"))
    assert q == Counter([b"not a segment", None])


STATUS = re.compile(
    r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z batch \d+ \(\d+\.\ds\): (\d+) rows in; messages [^;]+; quarantined \d+"
    r" \(late \d+\); duplicates \d+ \(late \d+\); held \d+ groups?, .*; oldest held [^;]+;"
    r" store rows \d+; watermark \S+"
)


class _Running:
    """``reassemble stream`` as a process (its own process group, as a terminal's job), its output read as it comes."""

    def __init__(self, base: Path, trigger: str) -> None:
        import threading

        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        self.proc = subprocess.Popen(
            _command(base, trigger), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            start_new_session=True,
        )  # fmt: skip
        self.out: list[str] = []
        self.err: list[str] = []
        for stream, into in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
            threading.Thread(
                target=lambda s=stream, i=into: i.extend(line.rstrip("\n") for line in s), daemon=True
            ).start()

    def ctrl_c(self) -> float:
        os.killpg(self.proc.pid, signal.SIGINT)  # to the whole group, as a terminal sends it
        return time.monotonic()

    def said(self, prefix: str) -> bool:
        return any(line.startswith(prefix) for line in self.err)

    def end(self) -> int:
        try:
            return self.proc.wait(timeout=300)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def test_status_lines_and_ctrl_c_stopping_after_the_batch_in_flight(tmp_path: Path) -> None:
    """One status line per batch, with its time, duration, own rows in and oldest held age; the first batch
    after an idle trigger counts its own rows (Spark reports the idle trigger under the same batch id).
    Ctrl-C mid-batch says so on stderr at once, lets that batch commit, writes no other and exits 130; a
    second Ctrl-C aborts at once, the batch in flight uncommitted. The same command resumes: every row
    counted in exactly one status line, every message exactly once."""
    ds = generate(n_messages=24, segments_per_message=3, segment_size=1024, seed=7, faults=False)
    cuts = [0, 10, 30, 45, 60, len(ds.rows)]
    files = [ds.rows[cuts[i] : cuts[i + 1]] for i in range(len(cuts) - 1)]
    (tmp_path / "landing").mkdir()
    out = tmp_path / "out"
    land(tmp_path / "landing", "f0", files[0], T0)

    first = _Running(tmp_path, "1s")
    try:
        _wait(lambda: any(line.startswith("idle: no new input") for line in first.out), 600, "an idle trigger")
        for i in range(1, len(files)):
            land(tmp_path / "landing", f"f{i}", files[i], T0 + i)
        _wait(lambda: any(f": {len(files[1])} rows in; " in line for line in first.out), 600, "the batch after idling")
        _wait(lambda: any((out / "_incoming").iterdir()) or first.proc.poll() is not None, 600, "a batch in flight")
        sent = first.ctrl_c()
        _wait(lambda: first.said("reassemble: stopping"), 5, "the stopping line")
        said_in = time.monotonic() - sent
    finally:
        code = first.end()
    assert code == 130 and said_in < 5, first.err
    (stopping,) = [line for line in first.err if line.startswith("reassemble: stopping")]
    committed = sorted(int(p.name) for p in (out / "_commits").iterdir() if p.name.isdigit())
    assert stopping == f"reassemble: stopping after batch {committed[-1]} (Ctrl-C again to abort)", first.err
    assert first.err[-1] == f"reassemble: stopped after batch {committed[-1]} (the same command resumes from there)"
    assert not (out / "_incoming" / f"batch={committed[-1] + 1}").exists()  # the next batch wrote nothing
    status = [line for line in first.out if " rows in; " in line]
    assert status and all(STATUS.fullmatch(line) for line in status), status

    second = _Running(tmp_path, "1s")
    try:
        _wait(lambda: len(list((out / "_incoming").iterdir())) > 0 or second.proc.poll() is not None, 600, "a batch")
        second.ctrl_c()
        _wait(lambda: second.said("reassemble: stopping"), 5, "the stopping line")
        second.ctrl_c()
    finally:
        code = second.end()
    assert code == 130 and second.err[-1] == "reassemble: interrupted", second.err
    status += [line for line in second.out if " rows in; " in line]

    done = command(*_command(tmp_path, "available-now")[3:])  # no signal to test: in this process
    assert done.returncode == 0, done.stderr[-3000:]
    status += [line for line in done.stdout.splitlines() if " rows in; " in line]
    assert all(STATUS.fullmatch(line) for line in status), status
    assert sum(int(STATUS.fullmatch(line)[1]) for line in status) == len(ds.rows)  # type: ignore[index]
    msgs = _by_key(read_committed(out, "message"))  # each message once
    assert {k: m["status"] for k, m in msgs.items()} == {k: "complete" for k in ds.expected}
