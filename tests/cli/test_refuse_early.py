"""Answers that need no cluster come before Spark starts (``reassembly.spark.footers``).

A wrong ``--raw-column``, a missing column, a column of another type, values that do not frame and a
file that is not Parquet are answered from the files' footers and first values: the command runs
with a ``SPARK_HOME`` where no Spark is, so any Spark start would fail, and it still gives the
refusal's line and exit code; its CPU time (the child's user + system seconds, which a loaded
machine does not inflate) stays under 3 s. The lines are those Spark's check gives for the same
files (compared in the last test, over the test run's Spark session).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reassembly.spark.footers import check_files, spark_type
from reassembly.spark.inputs import InputRefused, SegmentInput, check_input
from reassembly.spark.testdata import generate
from tests.cli.test_refuse import KAFKA_COLUMNS, _batches, kafka_landing


def command(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """``reassemble ARGS`` where Spark cannot start; the result and the child's CPU seconds."""
    env = {**os.environ, "SPARK_HOME": str(tmp_path / "no-spark-here")}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [sys.executable, "-m", "reassembly", *args], capture_output=True, text=True, timeout=300, env=env
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return done, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def segments(n: int = 4) -> list[bytes]:
    return generate(n_messages=n, segments_per_message=3, segment_size=1024, faults=False).rows


def json_values(n: int = 40) -> list[bytes]:
    return [b'{"order": %d, "total": 12.5}' % i for i in range(n)]


CASES: dict[str, tuple[Any, tuple[str, ...], str]] = {
    "missing column": (segments, (), f"column 'segment' not in input (columns: {KAFKA_COLUMNS})"),
    "wrong raw column": (
        segments,
        ("--raw-column", "nope"),
        f"column 'nope' not in input (columns: {KAFKA_COLUMNS})",
    ),
    "wrong type": (
        segments,
        ("--raw-column", "topic"),
        f"column 'topic' is string, expected binary (columns: {KAFKA_COLUMNS})",
    ),
    "no segments": (
        json_values,
        ("--raw-column", "value"),
        "column 'value' holds no segments: none of its first 40 non-NULL values starts with a segment header",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("subcommand", ["run", "stream"])
def test_refused_from_the_footers_before_spark_starts(tmp_path: Path, case: str, subcommand: str) -> None:
    values, extra, line = CASES[case]
    landing = kafka_landing(tmp_path / "landing", values())
    out = tmp_path / "out"
    more = ("--checkpoint", str(tmp_path / "ck")) if subcommand == "stream" else ()
    done, cpu = command(tmp_path, subcommand, str(landing), str(out), *more, *extra)
    assert done.returncode == 2, done.stderr[-2000:]
    (said,) = [x for x in done.stderr.splitlines() if x.startswith("reassemble:")]
    assert said.startswith(f"reassemble: error: {line}"), said
    assert cpu < 3.0, f"{cpu:.1f} s of CPU"
    written = {"landing", "ck"} if subcommand == "stream" else {"landing"}  # the stream binds its checkpoint
    assert {p.name for p in tmp_path.iterdir()} == written and _batches(tmp_path / "ck") == []  # nothing read


def test_a_file_that_is_not_parquet_is_named_with_the_remedy(tmp_path: Path) -> None:
    landing = kafka_landing(tmp_path / "landing", segments())
    (landing / "notes.txt").write_text("not a table\n")
    done, _ = command(tmp_path, "run", str(landing), str(tmp_path / "out"), "--raw-column", "value")
    assert done.returncode == 1, done.stderr[-2000:]
    (said,) = [x for x in done.stderr.splitlines() if x.startswith("reassemble:")]
    assert said.startswith(f"reassemble: error: input {landing}: {landing / 'notes.txt'} is not a Parquet file (")
    assert said.endswith(
        f"move it out of the input, or name only the Parquet files with a glob ('{landing}/*.parquet')"
    )
    assert "java" not in said.lower()


def test_spark_type_names_are_spark_s() -> None:
    assert [spark_type(t) for t in (pa.binary(), pa.large_binary(), pa.string(), pa.int32(), pa.int64())] == [
        "binary",
        "binary",
        "string",
        "int",
        "bigint",
    ]
    assert spark_type(pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))) == (
        "array<struct<key:string,value:binary>>"
    )
    assert spark_type(pa.timestamp("ns")) is None  # not certain: left to Spark


@pytest.mark.spark
def test_the_footers_refuse_with_the_line_spark_s_check_gives(spark: Any, tmp_path: Path) -> None:
    """The same files refused from the footers and by ``check_input`` over Spark's read: the same line.
    Types of every kind Spark names here; and a subdirectory (partition columns) is left to Spark."""
    table = pa.table(
        {
            "value": pa.array(json_values(), pa.binary()),
            "n8": pa.array(range(40), pa.int8()),
            "u32": pa.array(range(40), pa.uint32()),
            "amount": pa.array([1] * 40, pa.decimal128(12, 2)),
            "at": pa.array([0] * 40, pa.timestamp("us", tz="UTC")),
            "local": pa.array([0] * 40, pa.timestamp("ms")),
            "day": pa.array([0] * 40, pa.date32()),
            "tags": pa.array([{"a": 1}] * 40, pa.map_(pa.string(), pa.int64())),
            "headers": pa.array([[{"key": "k", "value": b"v"}]] * 40),
            "ok": [True] * 40,
            "ratio": pa.array([0.5] * 40, pa.float32()),
        }
    )
    landing = tmp_path / "landing"
    landing.mkdir()
    pq.write_table(table, landing / "part-0.parquet")
    df = spark.read.parquet(str(landing))
    for what in (SegmentInput(raw_column="value"), SegmentInput(raw_column="nope"), SegmentInput(raw_column="n8")):
        with pytest.raises(InputRefused) as by_spark:
            check_input(df, what)
        with pytest.raises(InputRefused) as by_footers:
            check_files([str(landing)], str(landing), what)
        assert str(by_footers.value) == str(by_spark.value)
    (landing / "day=1").mkdir()
    pq.write_table(table, landing / "day=1" / "part-1.parquet")
    check_files([str(landing)], str(landing), SegmentInput(raw_column="nope"))  # not certain: no answer
