"""What carries over: the landing rows of the groups still incomplete at the end of a run, written to
the checkpoint's carry folder and dropped from the run's output, within the carry's bounds
(:mod:`reassembly.spark.incremental`, "What carries over", "Bounds"); and the run's tables and report."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reassembly._errors import JobError, counted
from reassembly._files import hadoop_literal
from reassembly.spark.batch.job import reason_rows, status_rows
from reassembly.spark.batch.output import PAYLOADS
from reassembly.spark.incremental.discovery import iso_utc
from reassembly.spark.incremental.model import (
    FIRST_SEEN,
    CarryAccounting,
    CarryFacts,
    IncrementalOptions,
    LandingFile,
)
from reassembly.spark.writer import parquet_writer
from segmenter.header_table import FIELD
from segmenter.wire import GROUP_ID_LENGTH

_GID_AT = FIELD["group_id"].offset  # where the GroupId sits in a header (from the header table)
_PACK = "__reassembly_landing"  # helper column names: chosen not to meet a landing table's
_KEY, _GID, _FILE, _REF = "__reassembly_key", "__reassembly_gid", "__reassembly_file", "__reassembly_ref"


def with_routing_key(df: Any, raw_column: str, name: str = _KEY) -> Any:
    """``df`` with one more column, ``name``: the GroupId the reassembly routes the row by, NULL for a
    row it routes by a hash of its bytes (framing broken, NULL, too short).

    The same rules as :func:`~reassembly.spark.batch.decode.decode_segments`' ``routable`` (generated from
    :mod:`segmenter.header_table`, ``ROUTING_STAGES``), over ``df``'s other columns untouched (they
    travel in one struct while the header's fields are computed beside them).

    ``raw_column``: ``df``'s binary column of encoded segments.
    """
    from pyspark.sql import functions as F

    from reassembly.spark.batch.decode import routable_sql
    from segmenter import header_render
    from segmenter.wire import table_constants

    env = table_constants()
    fields = header_render.sql_fields("raw")
    d = df.select(
        F.struct(*[F.col(f"`{c}`") for c in df.columns]).alias(_PACK),
        F.col(f"`{raw_column}`").cast("binary").alias("raw"),
    )
    d = d.select(_PACK, "raw", F.expr(fields["header_length"]).alias("header_length"))
    d = d.select("*", *[F.expr(sql).alias(n) for n, sql in fields.items() if n != "header_length"])
    d = d.select("*", *[F.expr(sql).alias(n) for n, sql in header_render.sql_derived(env).items()])
    routable = F.coalesce(F.expr(routable_sql(env)), F.lit(False))
    return d.select(f"{_PACK}.*", F.when(routable, F.col("group_id")).alias(name))


def _gid(raw_column: str) -> Any:
    """The GroupId's bytes of a row (what the routing key is when the row is routable)."""
    from pyspark.sql import functions as F

    return F.substring(F.col(f"`{raw_column}`"), _GID_AT + 1, GROUP_ID_LENGTH)


def read_parquet(spark: Any, *paths: Path | str) -> Any:
    return spark.read.parquet(*(hadoop_literal(str(p)) for p in paths))


def _local(uri: str) -> Path:
    from urllib.parse import unquote, urlparse

    parsed = urlparse(uri)
    if parsed.scheme not in ("", "file"):
        raise JobError(f"the incremental job writes local paths only, found {uri}")
    return Path(unquote(parsed.path))


@dataclass(frozen=True)
class CarryDecision:
    """The outcome of a run's carry decision."""

    facts: CarryFacts
    expired_by_age: int = 0
    expired_by_size: int = 0


def decide_carry(
    spark: Any, rows: Any, raw_column: str, staging: Path, carry: Path, now_ms: int, options: IncrementalOptions
) -> CarryDecision:
    """Write the landing rows of the groups still incomplete (not expired) to ``carry``.

    Candidates: the GroupIds of the staged ``incomplete`` messages. Their rows: the landing rows
    routed by one of them (a broadcast semi-join on the header's GroupId bytes, then the exact
    routing rule on those rows only). Then the bounds, group by group, by first-seen time."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    candidates = (
        read_parquet(spark, staging / "messages")
        .where("status = 'incomplete'")
        .select(F.col("group_id").alias(_GID))
        .distinct()
    )
    if candidates.limit(1).count() == 0:
        return CarryDecision(CarryFacts())
    every = carry.with_name(carry.name + ".all")
    near = rows.join(F.broadcast(candidates), _gid(raw_column) == F.col(_GID), "left_semi")
    exact = with_routing_key(near, raw_column).where(F.col(_KEY).isNotNull()).drop(_KEY)
    parquet_writer(exact).parquet(str(every))
    written = read_parquet(spark, every)
    groups = written.groupBy(_gid(raw_column).alias(_GID)).agg(
        F.min(FIRST_SEEN).alias("first"),
        F.sum(F.length(F.col(f"`{raw_column}`"))).alias("bytes"),
        F.count("*").alias("rows"),
    )
    # Age first; then, newest first, the groups whose running total of bytes stays within the bound:
    # the same as writing the oldest out until what remains fits.
    aged = F.lit(now_ms) - F.col("first") >= F.lit(int(options.expire_after * 1000))
    newest_first = Window.orderBy(F.desc("first"), F.desc(_GID)).rowsBetween(Window.unboundedPreceding, 0)
    young = groups.where(~aged).withColumn("total", F.sum("bytes").over(newest_first))
    verdicts = groups.where(aged).select(_GID, "first", "bytes", "rows", F.lit("age").alias("verdict")).unionByName(
        young.select(
            _GID, "first", "bytes", "rows",
            F.when(F.col("total") > options.carry_max_bytes, "size").otherwise("carry").alias("verdict"),
        )
    ).cache()  # fmt: skip
    try:
        tally = {
            r.verdict: r
            for r in verdicts.groupBy("verdict")
            .agg(F.count("*").alias("groups"), F.sum("rows").alias("rows"), F.sum("bytes").alias("bytes"),
                 F.min("first").alias("oldest"))
            .collect()
        }  # fmt: skip
        kept = tally.get("carry")
        if kept is None:
            shutil.rmtree(every)
        elif len(tally) == 1:
            every.rename(carry)
        else:
            keep = verdicts.where("verdict = 'carry'").select(_GID)
            parquet_writer(written.join(F.broadcast(keep), _gid(raw_column) == F.col(_GID), "left_semi")).parquet(
                str(carry)
            )
            shutil.rmtree(every)
    finally:
        verdicts.unpersist()
    facts = CarryFacts(int(kept.rows), int(kept.bytes), int(kept.groups), int(kept.oldest)) if kept else CarryFacts()
    return CarryDecision(
        facts, int(tally["age"].groups) if "age" in tally else 0, int(tally["size"].groups) if "size" in tally else 0
    )


def _replace_files(spark: Any, folder: Path, files: list[str], kept: Any, columns: list[str]) -> None:
    """Rewrite ``files`` of ``folder`` (staged, not yet visible) as ``kept``: their rows but the dropped ones."""
    import pyarrow.parquet as pq

    schema = pq.read_schema(files[0])
    tmp = folder.with_name(f".{folder.name}.rewrite")
    shutil.rmtree(tmp, ignore_errors=True)
    parquet_writer(kept.select(*[f"`{c}`" for c in columns])).parquet(str(tmp))
    for f in map(Path, files):
        f.unlink()
        f.with_name(f".{f.name}.crc").unlink(missing_ok=True)  # Hadoop's checksum beside it
    for part in tmp.glob("*.parquet"):
        part.rename(folder / part.name)
    shutil.rmtree(tmp)
    if not any(folder.glob("*.parquet")):  # every row was carried: the folder keeps its columns
        pq.write_table(schema.empty_table(), folder / "part-00000-empty.parquet")


def _ref_keys(spark: Any, quarantine: Any, payloads: Path) -> Any:
    """The GroupId of each quarantine row by reference whose header did not decode (``group_id`` NULL):
    read from its original bytes in the payload folder (a few bytes each). Only a routable row is ever
    quarantined by reference (the judge's stores serve routed groups), so its routing key is those bytes."""
    refs = quarantine.where("group_id IS NULL AND raw IS NULL AND raw_path IS NOT NULL").select(
        "raw_path", "raw_offset"
    )
    found = []
    for r in refs.collect():
        with open(payloads / r.raw_path, "rb") as f:
            f.seek(r.raw_offset + _GID_AT)
            found.append((r.raw_path, r.raw_offset, f.read(GROUP_ID_LENGTH)))
    if not found:
        return None
    return spark.createDataFrame(found, f"raw_path string, raw_offset bigint, {_REF} binary")


def drop_carried(spark: Any, staging: Path, carry: Path, raw_column: str) -> None:
    """Remove from the staged output every row of the carried groups (they are decided by a later run)."""
    from pyspark.sql import functions as F

    carried = read_parquet(spark, carry).select(_gid(raw_column).alias(_GID)).distinct()

    def messages(paths: Sequence[Path | str]) -> Any:
        df = read_parquet(spark, *paths)
        return df.select("*", F.col("_metadata.file_path").alias(_FILE)), df.columns, F.col("group_id")

    refs = _ref_keys(spark, read_parquet(spark, staging / "quarantine"), staging / PAYLOADS)

    def quarantine(paths: Sequence[Path | str]) -> Any:
        df = read_parquet(spark, *paths)
        keyed = with_routing_key(df.select("*", F.col("_metadata.file_path").alias(_FILE)), "raw")
        if refs is not None:
            keyed = keyed.join(F.broadcast(refs), ["raw_path", "raw_offset"], "left")
        else:
            keyed = keyed.withColumn(_REF, F.lit(None).cast("binary"))
        return keyed, df.columns, F.coalesce(F.col("group_id"), F.col(_KEY), F.col(_REF))

    for name, read in (("messages", messages), ("quarantine", quarantine)):
        folder = staging / name
        df, columns, key = read([folder])
        hit = df.join(F.broadcast(carried), key == F.col(_GID), "left_semi")
        files = sorted(str(_local(r[0])) for r in hit.select(_FILE).distinct().collect())
        if files:
            df, _, key = read(files)
            _replace_files(
                spark, folder, files, df.join(F.broadcast(carried), key == F.col(_GID), "left_anti"), columns
            )


def prune_bodies(payloads: Path, messages: Path) -> None:
    """Remove staged body files no message row names (those of carried groups, of discarded attempts)."""
    import pyarrow.parquet as pq

    if not payloads.is_dir():
        return
    named: set[str] = set()
    for part in messages.glob("*.parquet"):
        named.update(p for p in pq.read_table(part, columns=["payload_path"]).column(0).to_pylist() if p is not None)
    for f in payloads.iterdir():
        if f.is_file() and not f.name.startswith(".") and f.name not in named:
            f.unlink()


def status_tables(spark: Any, staging: Path) -> tuple[list[Any], list[Any]]:
    """Messages, bytes, used and duplicates by status; quarantined rows by reason (of the staged output)."""
    messages, quarantine = read_parquet(spark, staging / "messages"), read_parquet(spark, staging / "quarantine")
    return status_rows(messages), reason_rows(quarantine)


def report_lines(
    run: int,
    files: Sequence[LandingFile],
    tables: tuple[list[Any], list[Any]],
    accounting: CarryAccounting,
    carry: CarryDecision,
    seconds: float,
) -> list[str]:
    by_status, by_reason = tables
    mib = sum(f.size for f in files) / (1 << 20)
    a = accounting
    lines = [
        f"run {run}: {counted(len(files), 'new file')} ({mib:,.1f} MiB), {counted(a.new, 'row')};"
        f" {counted(a.carried_in, 'row')} carried in"
    ]
    lines.append("messages by status")
    lines.append(f"  {'status':<14}{'messages':>10}{'bytes':>16}")
    lines += [f"  {r.status:<14}{r.n:>10}{(r.bytes or 0):>16,}" for r in by_status]
    lines.append("quarantined segments by reason")
    lines.append(f"  {'reason':<34}{'segments':>10}")
    lines += [f"  {f'{r.reason} {r.reason_name}':<34}{r['count']:>10}" for r in by_reason] or ["  (none)"]
    f = carry.facts
    oldest = "" if f.oldest_ms is None else f", the oldest first read {iso_utc(f.oldest_ms * 1_000_000, 3)}"
    lines.append(
        f"carried over: {counted(accounting.carried_in, 'row')} in, {counted(f.rows, 'row')} out"
        f" ({counted(f.groups, 'incomplete group')}, {f.bytes:,} bytes{oldest}); written as incomplete:"
        f" {counted(carry.expired_by_age, 'group')} past --expire-after, {carry.expired_by_size} past --carry-max-bytes"
    )
    lines.append(f"input {mib:,.1f} MiB in {seconds:,.1f} s: {mib / max(seconds, 1e-9):,.1f} MiB/s")
    lines.append(accounting.line())
    return lines


def carried_facts(record: dict[str, Any] | None) -> CarryFacts:
    return CarryFacts(**record["carry"]) if record else CarryFacts()
