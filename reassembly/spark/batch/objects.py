"""The refmsg job (``reassemble refmsg``): rebuild objects from MQ reference messages (MQRMH + chunk data).

Each row holds one encoded reference message. Messages are decoded and
verified by ``refmsg.decode_message`` (header, integrity block, chunk
checksum); the chunks of one object (same name, the destination's or else the source's, as the
receiver names it, and ObjectInstanceId) meet in one group, where ``refmsg.assemble_chunks`` (the
receiver's own rules) checks coverage, overlaps and the object checksum.
Objects are written as Parquet rows (``objects/``); every message that could
not be used is in ``quarantine/`` with its original bytes and reason.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from reassembly._files import claim_output, inputs
from reassembly.spark.batch.job import has_parquet, open_job, write_split
from reassembly.spark.engine.session import SparkSettings
from segmenter.checksum import DEFAULT_ALGORITHM
from segmenter.errors import Reason, SegmentationError

_DDL_TYPES = {pa.string(): "string", pa.binary(): "binary", pa.int32(): "int", pa.int64(): "bigint"}
OBJECT_ARROW = pa.schema(
    [
        ("kind", pa.string()),
        ("dest_name", pa.string()),
        ("object_instance_id", pa.binary()),
        ("status", pa.string()),
        ("reason", pa.int32()),
        ("reason_name", pa.string()),
        ("size", pa.int64()),
        ("data", pa.binary()),
        ("chunks", pa.int32()),
        ("detail", pa.string()),
        ("raw", pa.binary()),
    ]
)
# A message keyed by its object (or its reason when it cannot be decoded): a subset of the object row.
_KEYED = pa.schema(
    [OBJECT_ARROW.field(n) for n in ("dest_name", "object_instance_id", "raw", "reason", "reason_name", "detail")]
)


def _ddl(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name} {_DDL_TYPES[f.type]}" for f in schema)


OBJECT_DDL = _ddl(OBJECT_ARROW)
_KEYED_DDL = _ddl(_KEYED)


def _row(kind: str, **values: Any) -> dict[str, Any]:
    return {name: values.get(name) for name in OBJECT_ARROW.names} | {"kind": kind}


def _key_fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Decode each message just enough to find its object; undecodable ones keep their reason."""
    from refmsg import decode_message

    for batch in batches:
        out: list[dict[str, Any]] = []
        for raw in batch.column(0).to_pylist():
            try:
                h = decode_message(raw or b"").message.header
                # the object's name as the receiver names it: the destination, else the source
                out.append(
                    {"dest_name": h.dest_name or h.src_name, "object_instance_id": h.object_instance_id, "raw": raw}
                )
            except SegmentationError as exc:
                out.append({"raw": raw, "reason": int(exc.reason), "reason_name": exc.reason.name, "detail": str(exc)})
        yield pa.RecordBatch.from_pylist(out, schema=_KEYED)


def _object_fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """All messages of one object: assemble with the receiver's rules, or quarantine every one."""
    from refmsg import ChunkRow, assemble_chunks, decode_message

    raws: list[bytes] = []
    name, oid = None, None
    for batch in batches:
        d = batch.to_pydict()
        raws += d["raw"]
        name, oid = d["dest_name"][0], d["object_instance_id"][0]
    rows: list[ChunkRow] = []
    algorithm = None
    for raw in raws:
        m = decode_message(raw).message
        integ = m.integrity
        if integ is not None:
            algorithm = algorithm or integ.algorithm
        declared = integ is not None and integ.has_object
        rows.append(
            ChunkRow(
                offset=m.offset,
                length=m.length,  # the declared DataLogicalLength: a header-only message carries none of it
                data=None if m.header_only else bytes(m.data),
                last=m.is_last,
                chunk_checksum=integ.chunk_checksum if integ else None,
                object_checksum=integ.object_checksum if declared and integ else None,
                digests=(integ.digests.extension() or None) if integ else None,
                object_length=integ.object_length if declared and integ else None,
            )
        )
    try:
        data = assemble_chunks(rows, name=name or "", algorithm=algorithm or DEFAULT_ALGORITHM)
    except SegmentationError as exc:
        status = "incomplete" if exc.reason in (Reason.INCOMPLETE_MSG, Reason.OFFSET_ERROR) else "invalid"
        out = [
            _row(
                "object",
                dest_name=name,
                object_instance_id=oid,
                status=status,
                reason=int(exc.reason),
                reason_name=exc.reason.name,
                chunks=0,
                detail=str(exc),
            )
        ]
        out += [
            _row(
                "quarantine",
                dest_name=name,
                object_instance_id=oid,
                reason=int(exc.reason),
                reason_name=exc.reason.name,
                detail=str(exc),
                raw=r,
            )
            for r in raws
        ]
        yield pa.RecordBatch.from_pylist(out, schema=OBJECT_ARROW)
        return
    yield pa.RecordBatch.from_pylist(
        [
            _row(
                "object",
                dest_name=name,
                object_instance_id=oid,
                status="complete",
                reason=0,
                reason_name="NONE",
                size=len(data),
                data=data,
                chunks=len(rows),
            )
        ],
        schema=OBJECT_ARROW,
    )


def reassemble_objects(df: Any, message_column: str = "message") -> Any:
    """Objects and quarantine (combined, ``kind`` tells them apart) from a DataFrame of encoded messages."""
    from pyspark.sql import functions as F

    keyed = df.select(F.col(message_column).alias("raw")).mapInArrow(_key_fn, _KEYED_DDL)
    bad = keyed.where("reason IS NOT NULL").select(
        F.lit("quarantine").alias("kind"),
        "dest_name",
        "object_instance_id",
        F.lit(None).cast("string").alias("status"),
        "reason",
        "reason_name",
        F.lit(None).cast("bigint").alias("size"),
        F.lit(None).cast("binary").alias("data"),
        F.lit(None).cast("int").alias("chunks"),
        "detail",
        "raw",
    )
    good = keyed.where("reason IS NULL").select("dest_name", "object_instance_id", "raw")
    return good.groupBy("dest_name", "object_instance_id").applyInArrow(_object_fn, OBJECT_DDL).unionByName(bad)


def run_refmsg(pattern: str, output: str, *, column: str, overwrite: bool, settings: SparkSettings) -> str:
    """The ``refmsg`` job: same atomic output and one-line errors as ``run``; returns its report."""
    claimed = claim_output(output, inputs(pattern), pattern=pattern, may_exist=overwrite)  # before anything starts
    job = open_job(claimed, column=column, settings=settings)
    rows_in = job.df.count()
    start = time.monotonic()
    with job.writing() as tmp:
        write_split(reassemble_objects(job.df, column), tmp, {"object": "objects", "quarantine": "quarantine"})
    out, spark = job.out, job.spark
    objs = spark.read.parquet(str(out / "objects")) if has_parquet(out / "objects") else None
    by_status = objs.groupBy("status").count().collect() if objs is not None else []
    used = (objs.agg({"chunks": "sum"}).first()[0] or 0) if objs is not None else 0
    q = spark.read.parquet(str(out / "quarantine")).count() if has_parquet(out / "quarantine") else 0
    holds = "holds" if rows_in == used + q else "BROKEN"
    return "\n".join(
        [
            "objects by status: " + (", ".join(f"{r.status} {r['count']}" for r in by_status) or "none"),
            f"messages: {rows_in} in = {used} in objects + {q} quarantined: {holds}",
            f"{time.monotonic() - start:.1f} s; output: {out}/objects  {out}/quarantine",
        ]
    )
