"""How every job of ours writes Parquet: sized for rows that are whole messages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

# Parquet-mr measures what a writer has buffered (against the page size, 1 MiB, and the row group
# size, 128 MiB) only after 100 rows at first, then at an estimate of half way to the limit, up to
# 10,000 rows ahead. For rows of a few KiB that is cheap and safe. Our rows are whole messages, each
# up to max_message_size: with the defaults 100 of them go into one page before the first look, so a
# task's writer holds 100 messages, not one row group, and an 8 MiB message costs a share of a
# 100-message page grown by doubling and compressed at the end (1 GiB of 8 MiB messages, reduce stage
# wall: 4.1-6.6 s with the defaults, 2.3-2.8 s with these; measured by
# ``python -m bench.sparkcase --stages`` on ``data-1024M-1024K-8``). Looking after every row bounds the
# writer by one row group plus one message; a look is a sum over the columns, nothing next to what a
# row costs.
LARGE_ROWS = {"parquet.page.size.row.check.min": "1", "parquet.page.size.row.check.max": "1"}


def parquet_writer(df: Any) -> Any:
    """``df.write`` with :data:`LARGE_ROWS` (Spark hands writer options to Parquet's Hadoop settings)."""
    return df.write.options(**LARGE_ROWS)


def empty_folder(path: Path, schema: pa.Schema) -> None:
    """An output folder with no rows, as one empty Parquet file of ``schema``: Spark cannot read a
    directory that holds no file (UNABLE_TO_INFER_SCHEMA), so a reader of a clean run's
    ``quarantine`` would break on exactly the healthy runs."""
    import pyarrow.parquet as pq

    path.mkdir(parents=True)
    pq.write_table(schema.empty_table(), path / "part-00000-empty.parquet")


SPARK_SCHEMA = b"org.apache.spark.sql.parquet.row.metadata"  # Spark's schema in a Parquet footer


def project_folder(src: Path, dst: Path, columns: tuple[str, ...]) -> None:
    """Parquet folder ``src`` (written by Spark) as ``dst`` holding exactly ``columns``, in that order:
    renamed when it does already, else each file rewritten one row group at a time, reading only those
    columns (a row group is what its writer held: ``LARGE_ROWS``). Spark's own schema in the footer
    (which Spark reads in preference to Parquet's) is kept, less the columns dropped, so the types
    Spark wrote (a ``varchar``, a ``short``) read back as they were. No Spark job: the streaming sink
    calls this for every micro-batch."""
    import json

    import pyarrow.parquet as pq

    files = sorted(src.glob("*.parquet"))
    if all(tuple(pq.read_schema(f).names) == columns for f in files):
        src.rename(dst)
        return
    dst.mkdir(parents=True)
    for f in files:
        reader = pq.ParquetFile(f)
        schema = reader.schema_arrow
        schema = pa.schema([schema.field(c) for c in columns], metadata=schema.metadata)
        meta = dict(schema.metadata or {})
        if SPARK_SCHEMA in meta:
            spark_schema = json.loads(meta[SPARK_SCHEMA])
            fields = {field["name"]: field for field in spark_schema["fields"]}
            spark_schema["fields"] = [fields[c] for c in columns]
            meta[SPARK_SCHEMA] = json.dumps(spark_schema).encode()
        schema = schema.with_metadata(meta)
        with pq.ParquetWriter(dst / f.name, schema) as writer:
            for i in range(reader.num_row_groups):
                writer.write_table(reader.read_row_group(i, columns=list(columns)).replace_schema_metadata(meta))
    for f in src.iterdir():
        f.unlink()
    src.rmdir()
