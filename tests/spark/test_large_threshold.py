"""``large_message_bytes`` is one rule on every path: a message longer than it is a file, one of at most
its length is held inline, whether the JVM's clean test or the Python assembler decides.

The messages here have no segment at an offset of the threshold or more (no far row, which would send
them to the assembler anyway): only the message's declared length can tell the clean path that the
assembler would have built it in a file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reassembly.spark import ReassemblyOptions, reassemble
from reassembly.spark.engine.bridge import row_ok
from segmenter import Segmenter

pytestmark = pytest.mark.spark

T = 3000
SEGMENT = 1600  # offsets 0 and 1600: below T, for every size here


def _bodies() -> dict[int, bytes]:
    return {n: bytes((i * 7 + n) % 251 for i in range(n)) for n in (T - 1, T, T + 1)}


def test_a_message_longer_than_the_threshold_is_a_file_on_every_path(spark: Any, tmp_path: Path) -> None:
    """The message rows of the jar's one pass (``messages``, and ``save()``: the two jobs of ``reassemble
    run``) and of the SQL clean test are those of the assembler alone (``jvm_fast_path=False``), column
    for column, and their payload files hold the same bytes."""
    bodies = _bodies()
    segments = {n: [s.encode() for s in Segmenter(SEGMENT).segment(b)] for n, b in bodies.items()}
    assert all(len(s) == 2 for s in segments.values())
    df = spark.createDataFrame([(s,) for ss in segments.values() for s in ss], "segment binary")

    def options(name: str, jvm_fast_path: bool = True, use_jar: bool = True) -> ReassemblyOptions:
        payloads = str(tmp_path / name)
        return ReassemblyOptions(
            partitions=2, payload_dir=payloads, large_message_bytes=T, jvm_fast_path=jvm_fast_path, use_jar=use_jar
        )

    def by_length(rows: list[Any]) -> dict[int, dict[str, Any]]:
        return {r["original_length"]: r.asDict() for r in rows}

    want = by_length(reassemble(df, options=options("assembler", jvm_fast_path=False)).messages.collect())
    for n, body in bodies.items():
        row = want[n]
        assert row["status"] == "complete" and row["stored_length"] == n
        if n > T:  # more than the threshold: a file
            assert row["payload"] is None and (tmp_path / "assembler" / row["payload_path"]).read_bytes() == body
        else:  # at most the threshold: inline
            assert bytes(row["payload"]) == body and row["payload_path"] is None
    reassemble(df, options=options("saved")).save(tmp_path / "out")
    got = {
        "jar": by_length(reassemble(df, options=options("jar")).messages.collect()),
        "sql": by_length(reassemble(df, options=options("sql", use_jar=False)).messages.collect()),
        "saved": by_length(spark.read.parquet(str(tmp_path / "out" / "messages")).collect()),
    }
    for name, rows in got.items():
        assert rows == want, name  # every column: payload, payload_path, lengths, checksum, counts
        assert (tmp_path / name / want[T + 1]["payload_path"]).read_bytes() == bodies[T + 1], name


def test_the_clean_test_states_the_threshold_once_for_the_jar_and_the_sql() -> None:
    """Without a payload directory nothing is a file, and the per-row rule has no length test."""
    assert "original_length" not in row_ok()
    assert f"original_length BETWEEN 0 AND {T}" in row_ok(large_message_bytes=T)
    assert "NOT m.length_deferred" in row_ok("m.", large_message_bytes=T)
