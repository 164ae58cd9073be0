"""The input checks that need no cluster, made from the Parquet files themselves before Spark starts.

Starting Spark costs tens of seconds on a loaded machine; a wrong ``--raw-column``, a missing
column, a column of another type or values that do not frame as segments need none of it: the
schema is in each file's footer and the first values in its first pages. :func:`check_files`
reads those with pyarrow and refuses such input with the very line
:func:`~reassembly.spark.inputs.check_input` gives once Spark has read it (the same
:class:`~reassembly.spark.inputs.InputRefused`, exit code 2), and names a file in the input that is
not Parquet at all.

It answers only where it can tell what Spark will see: every file's footer readable and all of
them alike, no subdirectory (Spark would add partition columns), every column of a type whose
Spark name is known here, at most :data:`MAX_FILES` files. Otherwise it says nothing and the
checks run in Spark, as before: an answer that is slower, never one that differs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from reassembly._errors import JobError
from reassembly.spark.inputs import SAMPLE, SegmentInput, check_types, refuse_heads
from segmenter.wire import MAX_HEADER_LENGTH

MAX_FILES = 256
"""Inputs of more files are left to Spark: reading every footer would cost more than it saves."""

_INTS = {
    pa.int8(): "tinyint",
    pa.int16(): "smallint",
    pa.int32(): "int",
    pa.int64(): "bigint",
    pa.uint8(): "smallint",
    pa.uint16(): "int",
    pa.uint32(): "bigint",
    pa.uint64(): "decimal(20,0)",
}


def spark_type(t: pa.DataType) -> str | None:
    """The name Spark gives (``simpleString``) the column pyarrow reads as ``t`` from a Parquet file, or
    None where that is not certain here (then the check is left to Spark)."""
    if t in _INTS:
        return _INTS[t]
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "binary"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_float32(t):
        return "float"
    if pa.types.is_float64(t):
        return "double"
    if pa.types.is_date32(t):
        return "date"
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_timestamp(t) and t.unit in ("ms", "us"):
        return "timestamp" if t.tz is not None else "timestamp_ntz"
    if pa.types.is_dictionary(t):
        return spark_type(t.value_type)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        inner = spark_type(t.value_type)
        return None if inner is None else f"array<{inner}>"
    if pa.types.is_map(t):
        k, v = spark_type(t.key_type), spark_type(t.item_type)
        return None if k is None or v is None else f"map<{k},{v}>"
    if pa.types.is_struct(t):
        fields = [(f.name, spark_type(f.type)) for f in t]
        if any(s is None for _, s in fields):
            return None
        return "struct<" + ",".join(f"{n}:{s}" for n, s in fields) + ">"
    return None


def _files(paths: Sequence[str]) -> list[str] | None:
    """The files Spark reads for ``paths`` (names starting ``.`` or ``_`` skipped, as Spark skips
    them), or None where a directory holds a subdirectory (partition columns: left to Spark)."""
    found: list[str] = []
    for p in paths:
        if not os.path.isdir(p):
            found.append(p)
            continue
        for entry in sorted(os.scandir(p), key=lambda e: e.name):
            if entry.name.startswith((".", "_")):
                continue
            if entry.is_dir():
                return None
            found.append(entry.path)
    return found


def _not_parquet(path: str, pattern: str, exc: Exception) -> JobError:
    """The line for a file in the input that is not Parquet: which, and how to read only the others."""
    where = Path(pattern)
    glob = f"{where / '*.parquet'}" if os.path.isdir(pattern) else f"{where.parent / '*.parquet'}"
    why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return JobError(
        f"input {pattern}: {path} is not a Parquet file ({why}): move it out of the input,"
        f" or name only the Parquet files with a glob ('{glob}')"
    )


def footer_types(paths: Sequence[str], pattern: str, *, strict: bool = True) -> list[tuple[str, str]] | None:
    """The input's columns with the names of their Spark types, from the files' footers; None where
    Spark's view cannot be told for certain. JobError naming a file that is not Parquet (the
    ``.parquet`` files of the input are Parquet, or the job's own read says what is wrong); not
    ``strict`` (Spark told to skip unreadable files), None for it instead: the job counts it skipped.

    ``paths``: the input's files, as Spark would read them. ``pattern``: the input as given (a path or a glob), named in
    the error with the glob that reads only the Parquet files.
    """
    files = _files(paths)
    if not files or len(files) > MAX_FILES:
        return None
    schema: pa.Schema | None = None
    for f in files:
        try:
            this = pq.read_schema(f)
        except (OSError, pa.ArrowException) as exc:
            if strict and not f.endswith(".parquet"):
                raise _not_parquet(f, pattern, exc) from None
            return None  # a damaged Parquet file: the job's read reports it
        if schema is None:
            schema = this
        elif not this.equals(schema):
            return None  # Spark takes one file's schema: which one is its choice
    assert schema is not None
    types = [(field.name, spark_type(field.type)) for field in schema]
    if any(t is None for _, t in types):
        return None
    return [(name, str(t)) for name, t in types]


def _heads(files: Sequence[str], column: str) -> Iterator[bytes]:
    """The header-sized start of each non-NULL value of ``column``, file after file, batch after batch."""
    for f in files:
        reader = pq.ParquetFile(f)
        for batch in reader.iter_batches(batch_size=SAMPLE, columns=[column]):
            for value in batch.column(0):
                if value.is_valid:
                    yield value.as_buffer()[:MAX_HEADER_LENGTH].to_pybytes()


@dataclass(frozen=True)
class Footers:
    """What :func:`check_files` could tell from the files: the input's columns and the names of their
    Spark types (the schema Spark would infer, so a job can be given it instead of inferring it with a
    job of its own), and whether the first values were read and found to frame (``sampled``: Spark
    need not sample them again)."""

    types: tuple[tuple[str, str], ...]
    """Each input column's name and the name of its Spark type (``binary``, ``string``...)."""
    sampled: bool

    def ddl(self) -> str:
        """The schema as Spark's DDL (``spark.read.schema(...)``): every column nullable, as Spark reads Parquet."""
        return ", ".join(f"`{name.replace('`', '``')}` {kind}" for name, kind in self.types)


def check_files(
    paths: Sequence[str],
    pattern: str,
    what: SegmentInput | None,
    *,
    column: str | None = None,
    event_time: str | None = None,
    strict: bool = True,
) -> Footers | None:
    """Refuse (:class:`~reassembly.spark.inputs.InputRefused`) the Parquet input ``paths`` as
    :func:`~reassembly.spark.inputs.check_input` would once Spark read it (``what``), or, without
    ``what``, a ``column`` that is missing or not binary (``event_time``: a stream's event-time
    column, which must exist too); JobError for a file that is not Parquet (``strict``, see
    :func:`footer_types`). Says nothing where it cannot be certain (module doc); what it could
    tell is returned (None: nothing, Spark checks it all).

    ``pattern``: the input as given, named in the errors.
    """
    types = footer_types(paths, pattern, strict=strict)
    if types is None:
        return None
    if what is None and column is None:
        return Footers(tuple(types), sampled=False)
    check_types(types, what if what is not None else SegmentInput(raw_column=str(column)), event_time=event_time)
    if what is None or not what.encoded:  # column input is encoded in Spark before it can frame
        return Footers(tuple(types), sampled=False)
    files = _files(paths) or []
    heads: list[bytes] = []
    try:
        for head in _heads(files, what.raw_column):
            heads.append(head)
            if len(heads) >= SAMPLE:
                break
    except (OSError, pa.ArrowException):
        return Footers(tuple(types), sampled=False)  # a page that does not decode: the job reads it and names it
    refuse_heads(heads, what, types)
    return Footers(tuple(types), sampled=True)


def footer_rows(path: str) -> int | None:
    """The rows the footer of the Parquet file ``path`` holds, or None if it cannot be read."""
    try:
        return int(pq.read_metadata(path).num_rows)
    except (OSError, pa.ArrowException):
        return None


__all__ = ["Footers", "check_files", "footer_rows", "footer_types", "spark_type"]
