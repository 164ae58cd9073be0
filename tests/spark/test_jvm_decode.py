"""The jar's decoder (``Decode.java`` over the generated ``HeaderTable.java``) gives the SQL decoder's columns.

The one pass reads its input from the jar's decoder, the SQL path from ``decode_segments`` +
``grouping.route``: both are rendered from ``segmenter.header_table``, so they must agree on every
column of a routable row and on every column anything reads of a row that is not routable, for any
bytes: forged headers with their checksum recomputed, values at the 2^31, 2^32, 2^63 and 2^64 edges
(where the generated 64-bit rules hand over to the exact ones), truncations, bit flips, NULL.
"""

from __future__ import annotations

import random
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from reassembly.spark import ReassemblyOptions
from reassembly.spark.batch import grouping
from reassembly.spark.batch.decode import decode_segments
from reassembly.spark.engine import bridge
from reassembly.spark.engine.bridge import reassembler
from segmenter import Segmenter, header_render, header_table
from segmenter.wire import table_constants
from tests.spark.test_jvm_jar import hostile_rows  # tests/ is on sys.path (pytest's rootdir import mode)

ROOT = Path(__file__).resolve().parents[2]
# What is read of a row that is not routable (the one pass, the side file, the judge).
UNROUTABLE = ("routable", "pk", "bk", "piece", "plen", "sk", "far", "is_null", "header_ok", "data_ok", "is_last")
EDGES = (0, 1, 84, 2**31 - 1, 2**31, 2**32 - 1, 2**62, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1)
INT_FIELDS = [f for f in header_table.FIELDS if f.kind == "int"]


def test_the_generated_java_is_the_table_rendered() -> None:
    committed = (ROOT / "jvm" / "src" / "segmenter" / "jvm" / "HeaderTable.java").read_text()
    assert committed == header_render.java_source(table_constants()), "run python tools/render.py"


def test_a_complement_outside_a_mask_is_refused_by_the_java_renderer() -> None:
    # Python's ~x is negative, 64-bit Java's a huge unsigned value: only x & ~MASK means the same in both
    with pytest.raises(ValueError, match="complement"):
        complement = header_table.lt(header_table.bnot(header_table.n("codec")), 1)
        header_render.java_expr(complement, table_constants(), False)


def reheader(raw: bytes) -> bytes:
    """``raw`` with its header checksum recomputed (a forgery that passes the CRC), if it has a header."""
    hl = int.from_bytes(raw[8:10], "big")
    if not header_table.HEADER_LENGTH <= hl <= len(raw):
        return raw
    return raw[: hl - 4] + zlib.crc32(raw[: hl - 4]).to_bytes(4, "big") + raw[hl:]


def with_field(raw: bytes, field: header_table.Field, value: int) -> bytes:
    return raw[: field.offset] + value.to_bytes(field.width, "big") + raw[field.offset + field.width :]


def mutations(rows: list[bytes], seed: int) -> list[bytes | None]:
    rng = random.Random(seed)
    out: list[bytes | None] = [None, b"", b"SGMT", b"SGMT\x01"]
    for raw in rows:
        for _ in range(3):
            flipped = bytearray(raw)
            at = rng.randrange(min(len(raw), 100))
            flipped[at] ^= 1 << rng.randrange(8)
            out += [bytes(flipped), reheader(bytes(flipped))]
        out.append(raw[: rng.randrange(len(raw) + 1)])
        field = rng.choice(INT_FIELDS)
        out += [reheader(with_field(raw, field, v)) for v in EDGES if v < 1 << (8 * field.width)]
    return out


def columns(spark: Any, rows: list[bytes | None] | Any, threshold: int | None) -> tuple[list[str], list[str]]:
    """The canonical rows of the SQL decoder and of the jar's, over the jar decoder's columns, of
    ``rows`` (or of a DataFrame with a binary column ``segment``)."""
    assert reassembler(spark) is not None  # loads the jar
    df = spark.createDataFrame([(r,) for r in rows], "segment binary") if isinstance(rows, list) else rows
    limits = ReassemblyOptions(max_message_size=1 << 20).limits()
    jar = bridge.decoded_in_jar(df, "segment", limits, threshold)
    sql = grouping.route(decode_segments(df, "segment", limits.max_message_size, limits.max_segment_size), threshold)

    def canonical(frame: Any) -> list[str]:
        out = []
        for row in frame.select(*jar.columns).collect():
            d = row.asDict()
            out.append(repr(sorted(d.items() if d["routable"] else ((k, d[k]) for k in UNROUTABLE))))
        return sorted(out)

    return canonical(sql), canonical(jar)


@pytest.mark.spark
def test_the_jars_decoder_gives_the_sql_columns_on_hostile_and_forged_rows(spark: Any) -> None:
    rows = hostile_rows()
    writer = Segmenter(700).message_writer()  # length deferred: UNKNOWN_LENGTH (2^64-1) until the last
    rows += [s.encode() for s in [*writer.write(bytes(range(256)) * 9), *writer.close()]]
    mutated = mutations([r for r in rows if r is not None][:80], seed=3)
    for threshold in (None, 100, 3000):  # far rows come out twice, as in grouping.route
        sql, jar = columns(spark, [*rows, *mutated], threshold)
        assert sql == jar
    assert sum("('header_ok', True)" in r for r in jar) > 100  # not only refusals


@pytest.mark.spark
@settings(max_examples=15)
@given(
    payload=st.binary(max_size=3000),
    size=st.integers(min_value=100, max_value=1200),
    edits=st.lists(
        st.tuples(st.integers(0, 10**6), st.sampled_from(INT_FIELDS), st.integers(0, 2**64 - 1), st.booleans()),
        max_size=12,
    ),
)
def test_any_forged_field_value_decodes_alike_in_the_jar_and_in_sql(
    spark: Any, payload: bytes, size: int, edits: list[tuple[int, header_table.Field, int, bool]]
) -> None:
    rows = [s.encode() for s in Segmenter(size).segment(payload)]
    forged: list[bytes | None] = list(rows)
    for pick, field, value, edge in edits:
        value = EDGES[value % len(EDGES)] if edge else value
        forged.append(reheader(with_field(rows[pick % len(rows)], field, value % (1 << (8 * field.width)))))
    sql, jar = columns(spark, forged, 2 * size)
    assert sql == jar


@pytest.mark.spark
@pytest.mark.parametrize("fmt", ["parquet", "orc"])
def test_a_columnar_landing_table_is_decoded_from_its_batches_with_the_same_columns(
    spark: Any, tmp_path: Path, fmt: str
) -> None:
    """A Parquet or ORC scan is read as column batches, each value a view of the reader's memory
    (``Decode.columnar``): batches of 7 rows, so views end at every batch's edge, NULLs among them;
    every column equals the SQL decoder's over the same scan. A scan with anything on top (here a
    cast from string) is read as rows."""
    rows: list[bytes | None] = [*hostile_rows(), None]
    rows += mutations([r for r in rows if r is not None][:40], seed=5)
    path = str(tmp_path / fmt)
    spark.createDataFrame([(r,) for r in rows], "segment binary").repartition(3).write.format(fmt).save(path)
    assert reassembler(spark) is not None  # loads the jar
    decode = spark.sparkContext._jvm.segmenter.jvm.Decode
    batch_size = f"spark.sql.{fmt}.columnarReaderBatchSize"
    spark.conf.set(batch_size, "7")
    try:
        df = spark.read.format(fmt).load(path)
        assert decode.columnar(df.select("segment")._jdf)
        assert not decode.columnar(df.select(F.col("segment").cast("string").cast("binary"))._jdf)
        assert not decode.columnar(spark.createDataFrame([(b"x",)], "segment binary")._jdf)
        for threshold in (None, 3000):
            sql, jar = columns(spark, df, threshold)
            assert sql == jar
            assert len(jar) == len(rows) + sum("('far', True)" in r for r in jar)
    finally:
        spark.conf.unset(batch_size)
