"""``save()`` judging the side files in the driver (``ReassemblyOptions.driver_judge_bytes``) against a
Spark job judging them: the same message and quarantine rows, the same schemas read back through
Spark, the same ``Saved.metrics``; a rest over the threshold goes to the Spark job."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reassembly.spark import ReassemblyOptions, Saved, reassemble
from reassembly.spark.schema import SOURCE, SOURCES
from reassembly.spark.writer import DRIVER_PART, SPARK_SCHEMA, write_part
from segmenter import Segmenter
from tests.spark.test_differential import canonical  # tests/ is on sys.path (pytest's rootdir import mode)
from tests.spark.test_jvm_jar import hostile_rows
from tests.spark.test_lineage import KEPT, SCHEMA, _row

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def landing(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Hostile rows (every fault), a NULL row and whole identical copies, with columns of many types to keep."""
    rows: list[bytes | None] = [*hostile_rows(), None]
    rows += [s.encode() for s in Segmenter(400).segment(b"x" * 1500)] * 2
    path = str(tmp_path_factory.mktemp("driver") / "in")
    spark.createDataFrame([_row(i, r) for i, r in enumerate(rows)], SCHEMA).repartition(3).write.parquet(path)
    return path


def saved(spark: Any, df: Any, out: Path, **options: Any) -> tuple[Saved, int]:
    """``save()`` of ``df`` into ``out`` (payloads, where any, in ``out/payloads``), and the Spark jobs it ran."""
    sc = spark.sparkContext
    group = f"save-{uuid.uuid4().hex}"
    sc.setJobGroup(group, "test_save_driver")
    try:
        opts = ReassemblyOptions(max_message_size=1 << 20, partitions=3, **options)
        result = reassemble(df, options=opts).save(out)
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    return result, len(sc.statusTracker().getJobIdsForGroup(group))


def rows(spark: Any, out: Path) -> list[dict[str, Any]]:
    got = []
    for kind, folder in (("message", "messages"), ("quarantine", "quarantine")):
        got += [{**r.asDict(recursive=True), "kind": kind} for r in spark.read.parquet(str(out / folder)).collect()]
    return got


def as_said(rows: list[dict[str, Any]], payloads: Path | None) -> list[str]:
    """Each row as what it says (payload files and originals by reference by their bytes) and its lineage."""
    return sorted(repr((canonical([r], payloads), r.get(SOURCES), r.get(SOURCE))) for r in rows)


def schema(spark: Any, path: Path) -> str:
    return str(spark.read.parquet(str(path)).schema.json())


@pytest.mark.parametrize(
    ("options", "job_bytes"),
    [
        ({}, 0),
        ({"keep_columns": KEPT, "large_message_bytes": 3000}, 1),  # lineage, payload files, a rest over 1 byte
    ],
    ids=["plain", "lineage-payloads"],
)
def test_the_driver_judges_as_a_spark_job_does(
    spark: Any, tmp_path: Path, landing: str, options: dict[str, Any], job_bytes: int
) -> None:
    df = spark.read.parquet(landing)
    large = "large_message_bytes" in options
    outs, results, payloads = {}, {}, {}
    for where, limit in (("driver", 64 << 20), ("job", job_bytes)):
        out = outs[where] = tmp_path / where
        payloads[where] = out / "payloads" if large else None
        extra = {"payload_dir": str(payloads[where])} if large else {}
        results[where] = saved(spark, df, out, driver_judge_bytes=limit, **options, **extra)
    (here, here_jobs), (job, job_jobs) = results["driver"], results["job"]
    assert here.side_files == job.side_files > 0
    assert here.judged_in_driver and not job.judged_in_driver
    assert here_jobs <= job_jobs - 2  # no judge job, no quarantine job
    assert here.metrics == job.metrics and here.metrics["messages"] > 20 and here.metrics["quarantined"] > 10
    m = here.metrics
    assert m["rows_in"] == m["used"] + m["quarantined"] + m["duplicates"]

    got = rows(spark, outs["driver"])
    assert as_said(got, payloads["driver"]) == as_said(rows(spark, outs["job"]), payloads["job"])
    if large:  # the driver's judge streamed large messages to files, and quarantined originals by reference
        assert any(r["payload_path"] is not None for r in got)
        assert any((r.get("raw_path") or "").startswith("quarantine/driver-") for r in got)
    for folder in ("messages", "quarantine"):
        # Spark infers a folder's schema from any one of its files: each alone reads as the job's
        assert schema(spark, outs["driver"] / folder) == schema(spark, outs["job"] / folder)
        (ours,) = (outs["driver"] / folder).glob(f"{DRIVER_PART}*.parquet")
        theirs = [f for f in (outs["job"] / folder).glob("part-*.parquet") if pq.ParquetFile(f).metadata.num_rows]
        assert schema(spark, ours) == schema(spark, theirs[0]) == schema(spark, outs["job"] / folder)
        assert (outs["driver"] / folder / "_SUCCESS").exists()
        codec = pq.ParquetFile(ours).metadata.row_group(0).column(0).compression
        assert codec == "SNAPPY"  # Spark's default, as in Spark's files
        assert {pq.ParquetFile(f).metadata.row_group(0).column(0).compression for f in theirs} == {codec}


def test_a_part_written_in_the_driver_carries_spark_s_schema_and_only_when_it_has_rows(tmp_path: Path) -> None:
    schema = pa.schema([("kind", pa.string())])
    empty = pa.RecordBatch.from_pylist([], schema=schema)
    assert write_part(tmp_path / "none", iter([empty]), "{}", "snappy", "4.0.0") == 0
    assert not (tmp_path / "none").exists()
    batches = [pa.RecordBatch.from_pylist([{"kind": "a"}] * n, schema=schema) for n in (2, 0, 3)]
    assert write_part(tmp_path / "some", iter(batches), '{"type":"struct","fields":[]}', "zstd", "4.0.0") == 5
    (part,) = (tmp_path / "some").iterdir()  # no temporary file left
    assert part.name.startswith(DRIVER_PART) and part.suffix == ".parquet"
    meta = pq.ParquetFile(part).metadata
    assert meta.num_row_groups == 2 and meta.row_group(0).column(0).compression == "ZSTD"
    assert meta.metadata[SPARK_SCHEMA] == b'{"type":"struct","fields":[]}'
    assert meta.metadata[b"org.apache.spark.version"] == b"4.0.0"
