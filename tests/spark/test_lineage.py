"""Lineage: input columns kept unchanged into every output row, on every path, each row pointing at the
landing rows it is (quarantine) or was built from (messages: one per segment used, in offset order)."""

from __future__ import annotations

import datetime as dt
import subprocess
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from reassembly._errors import UsageError
from reassembly.spark import ReassemblyOptions, read_quarantined, reassemble
from reassembly.spark.batch.pipeline import INPUT_FILE, keep_input_file
from reassembly.spark.schema import SOURCE, SOURCES
from segmenter import Segmenter
from segmenter.wire import decode_header, decode_segment
from tests.spark.test_jvm_jar import hostile_rows
from tests.support import command

pytestmark = pytest.mark.spark

KEPT = ("id", "topic", "ts", "amount", "tag", "meta", "attrs")
SCHEMA = (
    "segment binary, id bigint, topic string, ts timestamp, amount decimal(10,2), tag binary,"
    " meta struct<a:int,b:array<string>>, attrs map<string,string>"
)


def _row(i: int, raw: bytes | None) -> tuple[Any, ...]:
    when = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=i, microseconds=i)
    return (
        raw,
        i,
        f"topic-{i % 3}",
        when,
        Decimal(i) / 100,
        i.to_bytes(4, "big"),
        (i, [str(i)] * (i % 3)),
        {"k": str(i)},
    )


@pytest.fixture(scope="module")
def landing(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[int, Any]]:
    """Hostile rows (every fault, duplicates, garbage) and a NULL row, each with columns of many types."""
    rows: list[bytes | None] = [*hostile_rows(), None]
    rows += [s.encode() for s in Segmenter(400).segment(b"x" * 1500)] * 2  # whole identical copies
    path = str(tmp_path_factory.mktemp("lineage") / "in")
    spark.createDataFrame([_row(i, r) for i, r in enumerate(rows)], SCHEMA).repartition(3).write.parquet(path)
    by_id = {r.id: r for r in spark.read.parquet(path).collect()}
    return path, by_id


def _kept(row: Any) -> tuple[Any, ...]:
    return tuple(row[c] for c in KEPT)


def check(messages: list[Any], quarantine: list[Any], by_id: dict[int, Any], payload_dir: Path | None) -> None:
    """Every quarantine row's source is its landing row; every message's sources are the rows it used."""
    quarantined = []
    for q in quarantine:
        src = q[SOURCE]
        landed = by_id[src.id]
        assert _kept(src) == _kept(landed)  # carried unchanged: every kept column, every type
        original = read_quarantined(q, payload_dir)
        assert original == (None if landed.segment is None else bytes(landed.segment))
        quarantined.append(src.id)
    used = []
    for m in messages:
        ids = [s.id for s in m[SOURCES]]
        assert all(_kept(s) == _kept(by_id[s.id]) for s in m[SOURCES])
        assert len(ids) == (m.segments_used or 0)
        segs = [decode_segment(bytes(by_id[i].segment)) for i in ids]
        offsets = [s.header.offset for s in segs]
        assert offsets == sorted(offsets)  # offset order
        assert {s.header.group_id for s in segs} <= {bytes(m.group_id)}
        assert {s.header.msg_seq_number for s in segs} <= {m.msg_seq_number}
        if m.status == "complete" and m.payload is not None and segs and segs[0].header.codec == 0:
            assert b"".join(bytes(s.data) for s in segs) == bytes(m.payload)
        used += ids
    assert len(set(used)) == len(used) and len(set(quarantined)) == len(quarantined)
    assert not set(used) & set(quarantined)
    duplicates = sum(m.duplicates for m in messages)
    assert len(by_id) == len(used) + len(quarantined) + duplicates  # each landing row accounted once
    # a row neither used nor quarantined is an identical copy of a used one
    for i in set(by_id) - set(used) - set(quarantined):
        raw = bytes(by_id[i].segment)
        assert any(bytes(by_id[u].segment) == raw for u in used), decode_header(raw)


@pytest.mark.parametrize(
    "options",
    [{}, {"use_jar": False}, {"jvm_fast_path": False}, {"large_message_bytes": 100}, {"large_message_bytes": 3000}],
    ids=["split", "sql", "assembler", "far-rows", "large"],
)
def test_saved_rows_point_at_their_landing_rows(
    spark: Any, tmp_path: Path, landing: tuple[str, dict[int, Any]], options: dict[str, Any]
) -> None:
    path, by_id = landing
    payloads = tmp_path / "payloads" if "large_message_bytes" in options else None
    if payloads is not None:
        options = {**options, "payload_dir": str(payloads)}
    opts = ReassemblyOptions(max_message_size=1 << 20, partitions=3, keep_columns=KEPT, **options)
    df = spark.read.parquet(path)
    result = reassemble(df, options=opts)
    out = tmp_path / "out"
    saved = result.save(out)
    if not options or "large_message_bytes" in options:
        assert saved.split and saved.side_files > 0  # the side files carried the kept columns
    messages = spark.read.parquet(str(out / "messages"))
    quarantine = spark.read.parquet(str(out / "quarantine"))
    kept_type = df.select(*KEPT).schema
    assert messages.schema[SOURCES].dataType.elementType == kept_type == quarantine.schema[SOURCE].dataType
    check(messages.collect(), quarantine.collect(), by_id, payloads)
    # the lazy result gives the same lineage
    check(result.messages.collect(), result.quarantine.collect(), by_id, payloads)


def test_without_kept_columns_there_are_no_lineage_columns(spark: Any, landing: tuple[str, dict[int, Any]]) -> None:
    result = reassemble(spark.read.parquet(landing[0]))
    assert SOURCES not in result.messages.columns and SOURCE not in result.quarantine.columns
    assert SOURCES not in result.combined.columns


@pytest.mark.parametrize(
    ("keep", "match"),
    [
        (("nope",), "cannot keep column 'nope': not in the input"),
        (("segment",), "cannot keep column 'segment': it is the segment column"),
        (("id", "id"), "column 'id' named twice"),
    ],
)
def test_a_column_that_cannot_be_kept_is_refused_before_anything_runs(
    spark: Any, landing: tuple[str, dict[int, Any]], keep: tuple[str, ...], match: str
) -> None:
    with pytest.raises(UsageError, match=match):
        reassemble(spark.read.parquet(landing[0]), options=ReassemblyOptions(keep_columns=keep))


def test_the_input_file_is_kept_like_a_column(spark: Any, tmp_path: Path, landing: tuple[str, dict[int, Any]]) -> None:
    df = keep_input_file(spark.read.parquet(landing[0]))
    files = {r.id: r[INPUT_FILE] for r in df.select("id", INPUT_FILE).collect()}
    assert all(f.startswith("file:") and f.endswith(".parquet") for f in files.values())
    result = reassemble(df, options=ReassemblyOptions(keep_columns=("id", INPUT_FILE)))
    for q in result.quarantine.collect():
        assert q.source[INPUT_FILE] == files[q.source.id]
    with pytest.raises(UsageError, match="input file"):
        keep_input_file(df)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return command.reassemble(*args)


def test_the_command_keeps_columns_and_refuses_what_it_cannot_keep(
    spark: Any, tmp_path: Path, landing: tuple[str, dict[int, Any]]
) -> None:
    path, by_id = landing
    bad = _run("run", path, str(tmp_path / "bad"), "--keep-columns", "id,nope", "--no-progress")
    assert bad.returncode == 2, bad.stderr
    assert bad.stderr.strip().splitlines() == [
        f"reassemble: error: cannot keep column 'nope': not in the input (columns: {', '.join(['segment', *KEPT])})"
    ]
    assert not (tmp_path / "bad").exists()
    out = tmp_path / "out"
    ok = _run("run", path, str(out), "--keep-columns", "id,topic", "--keep-input-file", "--no-progress")
    assert ok.returncode == 0, ok.stderr
    q = spark.read.parquet(str(out / "quarantine"))
    assert q.schema[SOURCE].dataType.fieldNames() == ["id", "topic", INPUT_FILE]
    for row in q.collect():
        assert row.source.topic == by_id[row.source.id].topic and row.source[INPUT_FILE].endswith(".parquet")
    m = spark.read.parquet(str(out / "messages"))
    assert sum(len(r.sources) for r in m.collect()) == sum(r.segments_used for r in m.collect())
