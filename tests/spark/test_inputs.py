"""Input that cannot be what was meant is refused, in one line naming the columns found, before a job reads it.

The schema checks need no Spark session (a schema is a plain object); the sampling of values runs
on the session every test shares.
"""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType

from reassembly._errors import UsageError
from reassembly.spark.inputs import SAMPLE, InputRefused, SegmentInput, check_input, check_schema, described
from reassembly.spark.schema import ColumnNames
from segmenter.producer import Segmenter
from segmenter.wire import decode_segment

KAFKA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
    ]
)


def _refusal(schema: StructType, what: SegmentInput, **kw: Any) -> str:
    with pytest.raises(InputRefused) as refused:
        check_schema(schema, what, **kw)
    assert isinstance(refused.value, UsageError)  # the command's exit code 2
    assert "\n" not in str(refused.value)
    return str(refused.value)


def test_a_missing_column_is_named_with_the_columns_found_and_their_types() -> None:
    said = _refusal(KAFKA, SegmentInput())
    assert said == (
        "column 'segment' not in input (columns: key binary, value binary, topic string, partition int, offset bigint)"
    )
    check_schema(KAFKA, SegmentInput(raw_column="value"))  # the right name: accepted


def test_a_column_of_another_type_is_refused() -> None:
    schema = StructType([StructField("segment", StringType())])
    assert _refusal(schema, SegmentInput()) == "column 'segment' is string, expected binary (columns: segment string)"


def test_the_event_time_column_must_exist() -> None:
    said = _refusal(KAFKA, SegmentInput(raw_column="value"), event_time="ts")
    assert said.startswith("event-time column 'ts' not in input (columns: key binary, value binary")


def test_columns_input_needs_every_named_column_with_its_type() -> None:
    names = ColumnNames()
    said = _refusal(KAFKA, SegmentInput(encoded=False))
    assert said.startswith("columns 'group_id', 'msg_seq_number', 'msg_flags', 'original_length'")
    assert "not in input (input format columns) (columns: key binary" in said
    fields = [StructField(n, BinaryType() if n in ("group_id", "data") else LongType()) for n in (
        names.group_id, names.msg_seq_number, names.offset, names.msg_flags, names.original_length,
        names.data_checksum, names.message_checksum, names.data)]  # fmt: skip
    check_schema(StructType(fields), SegmentInput(encoded=False))
    fields[1] = StructField("msg_seq_number", StringType())
    said = _refusal(StructType(fields), SegmentInput(encoded=False))
    assert said.startswith("column 'msg_seq_number' is string, expected integer (input format columns)")


def test_a_wide_table_is_listed_in_part() -> None:
    wide = StructType([StructField(f"c{i}", IntegerType()) for i in range(45)])
    assert described(wide).endswith("c29 int, ... and 15 more")


SEGMENTS = [s.encode() for s in Segmenter(300).segment(b"a message of several segments " * 30)]


def _binary(spark: Any, values: list[bytes | None]) -> Any:
    return spark.createDataFrame([(v,) for v in values], "value binary").coalesce(1)


@pytest.mark.spark
def test_a_binary_column_holding_no_segments_is_refused(spark: Any) -> None:
    json_rows = [b'{"id": %d, "name": "not a segment"}' % i for i in range(150)]
    with pytest.raises(InputRefused) as refused:
        check_input(_binary(spark, json_rows), SegmentInput(raw_column="value"))
    said = str(refused.value)
    assert said.startswith(f"column 'value' holds no segments: none of its first {SAMPLE} non-NULL values starts")
    assert "[9001 BAD_MAGIC] bad magic b'{\"id'" in said and said.endswith("(columns: value binary)")


@pytest.mark.spark
def test_one_segment_among_the_first_values_is_enough_and_nulls_are_not_counted(spark: Any) -> None:
    """Damaged rows are data faults, quarantined later with their bytes; NULLs are skipped by the sample."""
    garbage = [b"garbage %d" % i for i in range(SAMPLE - 1)]
    check_input(_binary(spark, [*garbage, SEGMENTS[0]]), SegmentInput(raw_column="value"))
    check_input(_binary(spark, [None] * 300 + [SEGMENTS[1]]), SegmentInput(raw_column="value"))
    with pytest.raises(InputRefused):  # only the first 100 non-NULL values are read
        check_input(_binary(spark, [*garbage, b"one more", SEGMENTS[0]]), SegmentInput(raw_column="value"))


@pytest.mark.spark
def test_input_with_nothing_to_sample_is_not_refused(spark: Any) -> None:
    check_input(_binary(spark, []), SegmentInput(raw_column="value"))
    check_input(_binary(spark, [None, None]), SegmentInput(raw_column="value"))


@pytest.mark.spark
def test_columns_are_sampled_as_the_job_encodes_them(spark: Any) -> None:
    heads = [decode_segment(s).header for s in SEGMENTS]
    data = [bytes(decode_segment(s).data) for s in SEGMENTS]

    def table(group_ids: list[bytes]) -> Any:
        rows = [
            (g, h.msg_seq_number, h.offset, h.msg_flags, h.original_length, h.data_checksum, h.message_checksum, d)
            for g, h, d in zip(group_ids, heads, data, strict=True)
        ]
        ddl = "group_id binary, msg_seq_number int, offset bigint, msg_flags int, original_length bigint, "
        return spark.createDataFrame(rows, ddl + "data_checksum bigint, message_checksum bigint, data binary")

    check_input(table([h.group_id for h in heads]), SegmentInput(encoded=False))
    with pytest.raises(InputRefused) as refused:  # GroupIds of 3 bytes: no row encodes to a segment
        check_input(table([b"abc"] * len(heads)), SegmentInput(encoded=False))
    assert str(refused.value).startswith("the input's columns make no segments: none of the first")


@pytest.mark.spark
def test_the_stream_source_reads_the_files_own_schema_and_refuses_before_a_query(spark: Any, tmp_path: Any) -> None:
    """``file_source`` asks the landed files (a schema it assumed read a missing column as NULL in every
    row); with nothing landed yet it takes the columns as named, and the stream is set up as before."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from reassembly.spark.stream.functions import file_source

    (tmp_path / "empty").mkdir()
    assert file_source(spark, str(tmp_path / "empty")).columns == ["segment", "event_time"]
    (tmp_path / "landing").mkdir()
    table = pa.table({"key": pa.array([b"k"] * 3, pa.binary()), "value": pa.array(SEGMENTS[:3], pa.binary())})
    pq.write_table(table, tmp_path / "landing" / "part-0.parquet")
    with pytest.raises(InputRefused, match=r"^column 'segment' not in input \(columns: key binary, value binary\)$"):
        file_source(spark, str(tmp_path / "landing"))
    with pytest.raises(InputRefused, match="event-time column 'ts' not in input"):
        file_source(spark, str(tmp_path / "landing"), raw_column="value", event_time="ts")
    with pytest.raises(InputRefused, match=r"^columns 'group_id', 'msg_seq_number', .* \(input format columns\)"):
        file_source(spark, str(tmp_path / "landing"), encoded=False)
    df = file_source(spark, str(tmp_path / "landing"), raw_column="value")
    assert df.isStreaming and df.columns == ["segment", "event_time"]
