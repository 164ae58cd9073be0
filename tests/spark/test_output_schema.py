"""One output schema: the doc lists it, every writer writes exactly it, and the manifest names its version."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from reassembly.spark import ReassemblyOptions, reassemble
from reassembly.spark.schema import (
    MANIFEST,
    MESSAGE_COLUMNS,
    QUARANTINE_COLUMNS,
    SCHEMA_VERSION,
    SOURCE,
    SOURCES,
    markdown_tables,
    message_columns,
    quarantine_columns,
)
from reassembly.spark.testdata import Dataset, generate, write_parquet
from segmenter import Segmenter
from tests.spark.test_jvm_jar import hostile_rows

DOC = Path(__file__).resolve().parents[2] / "docs" / "reference" / "output-schema.md"


def _doc_tables() -> dict[str, list[str]]:
    """The column names each table of the doc lists, in order (``### `name` `` headings, then rows)."""
    tables: dict[str, list[str]] = {}
    current = None
    for line in DOC.read_text().splitlines():
        heading = re.fullmatch(r"### `(\w+)`", line)
        if heading:
            current = tables.setdefault(heading.group(1), [])
        elif current is not None and (row := re.match(r"\| \d+ \| `(\w+)` \|", line)):
            current.append(row.group(1))
    return tables


def test_the_doc_lists_exactly_the_columns_of_the_schema_in_order() -> None:
    tables = _doc_tables()
    assert tables["messages"] == list(message_columns(True))
    assert tables["quarantine"] == list(quarantine_columns(True))
    assert markdown_tables() in DOC.read_text()  # the descriptions too: regenerate the tables after a change
    assert f"**Schema version {SCHEMA_VERSION}.**" in DOC.read_text()


def test_the_readme_names_the_schema_page_and_version() -> None:
    readme = (DOC.parents[2] / "README.md").read_text()
    assert "docs/reference/output-schema.md" in readme and f"version {SCHEMA_VERSION}" in readme


def _columns(folder: Path) -> set[tuple[str, ...]]:
    return {tuple(pq.read_schema(f).names) for f in folder.glob("*.parquet")}


def _manifest(out: Path) -> dict[str, Any]:
    return dict(json.loads((out / MANIFEST).read_text()))


@pytest.mark.spark
@pytest.mark.parametrize(
    "options",
    [
        {},  # the jar's one pass: clean messages by the JVM, the rest by the side judge
        {"use_jar": False},  # the SQL path: one plan
        {"jvm_fast_path": False},  # every group through the assembler
        {"large_message_bytes": 3000},  # with a payload directory: far rows, by-reference quarantine
    ],
    ids=["split", "sql", "assembler", "large"],
)
def test_every_written_folder_holds_exactly_its_columns(spark: Any, tmp_path: Path, options: dict[str, Any]) -> None:
    path = write_parquet(Dataset(rows=hostile_rows()), tmp_path / "in", files=2)
    df = spark.read.parquet(str(path)).union(spark.createDataFrame([(None,)], "segment binary"))
    if "large_message_bytes" in options:
        options = {**options, "payload_dir": str(tmp_path / "payloads")}
    result = reassemble(df, options=ReassemblyOptions(max_message_size=1 << 20, partitions=2, **options))
    out = tmp_path / "out"
    result.save(out)
    assert _columns(out / "messages") == {MESSAGE_COLUMNS}
    assert _columns(out / "quarantine") == {QUARANTINE_COLUMNS}
    assert _manifest(out) == {
        "schema_version": SCHEMA_VERSION,
        "messages": list(MESSAGE_COLUMNS),
        "quarantine": list(QUARANTINE_COLUMNS),
        "keep_columns": [],
    }
    assert not [p.name for p in out.iterdir() if p.name.startswith("_") and p.name != MANIFEST]
    # what save() writes is what the result's DataFrames hold: they union by position and by name
    written = spark.read.parquet(str(out / "messages"))
    assert tuple(result.messages.columns) == MESSAGE_COLUMNS == tuple(written.columns)
    assert written.schema == result.messages.schema
    assert result.messages.union(written).count() == 2 * written.count()
    quarantined = spark.read.parquet(str(out / "quarantine"))
    assert tuple(result.quarantine.columns) == QUARANTINE_COLUMNS == tuple(quarantined.columns)
    assert result.quarantine.unionByName(quarantined).count() == 2 * quarantined.count()
    # raw keeps the landing row's value: the NULL row's raw is NULL, never b''
    nulls = [r for r in quarantined.collect() if r.reason_name == "TRUNCATED" and r.group_id is None]
    assert any(r.raw is None and r.raw_path is None for r in nulls)
    assert all(r.raw != b"" for r in quarantined.collect())


@pytest.mark.spark
@pytest.mark.parametrize("keep", [(), ("n", "topic")])
def test_a_clean_run_has_an_empty_quarantine_table_of_the_schema(
    spark: Any, tmp_path: Path, keep: tuple[str, ...]
) -> None:
    rows = [s.encode() for i in range(4) for s in Segmenter(512).segment(bytes([i]) * 1500)]
    df = spark.createDataFrame([(r, i, "t") for i, r in enumerate(rows)], "segment binary, n bigint, topic string")
    out = tmp_path / "out"
    saved = reassemble(df, options=ReassemblyOptions(partitions=2, keep_columns=keep)).save(out)
    assert saved.side_files == 0
    empty = spark.read.parquet(str(out / "quarantine"))
    assert empty.count() == 0 and tuple(empty.columns) == quarantine_columns(bool(keep))
    if keep:
        assert empty.schema[SOURCE].dataType.fieldNames() == ["n", "topic"]
        assert (
            spark.read.parquet(str(out / "messages")).schema[SOURCES].dataType.elementType
            == df.select("n", "topic").schema
        )
    assert _manifest(out)["keep_columns"] == list(keep)


@pytest.mark.spark
def test_observed_metrics_count_what_was_written(spark: Any, tmp_path: Path) -> None:
    ds = generate(n_messages=24, segments_per_message=3, segment_size=1024)
    df = spark.read.parquet(str(write_parquet(ds, tmp_path / "in", files=3)))
    out = tmp_path / "out"
    saved = reassemble(df, options=ReassemblyOptions(partitions=3)).save(out)
    m = spark.read.parquet(str(out / "messages")).collect()
    q = spark.read.parquet(str(out / "quarantine")).count()
    metrics = dict(saved.metrics)
    assert metrics["rows_in"] == len(ds.rows) == metrics["used"] + metrics["quarantined"] + metrics["duplicates"]
    assert metrics["quarantined"] == q and metrics["messages"] == len(m)
    assert metrics["used"] == sum(r.segments_used for r in m) and metrics["duplicates"] == sum(r.duplicates for r in m)
    for status in {r.status for r in m}:
        assert metrics[f"messages_{status}"] == sum(r.status == status for r in m)
    assert metrics["bytes_complete"] == sum(r.original_length for r in m if r.status == "complete")
