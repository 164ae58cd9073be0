"""Input that cannot be what the user meant is refused before any of it is consumed.

A job reads segments from one binary column of encoded segments (``encoded``, the column
named by ``raw_column``) or from the header fields given as columns (``columns``, named by
:class:`~reassembly.spark.schema.ColumnNames`). A mistaken name is not a data fault: a stream
over a landing table whose segment column is ``value`` would read every row's ``segment`` as
NULL, quarantine all of them with nothing of the original kept, and move its checkpoint past
the files, so the rerun with the right name would find nothing new. So before a job reads
anything for real (before a stream's first batch, before ``run`` writes), :func:`check_input`
asks the input itself:

* its schema, as the files have it (never a schema the job assumes): the named column exists
  and is binary, or every named column exists with a type the format takes (GroupId and data
  binary, every number an integer);
* its values: of the first :data:`SAMPLE` non-NULL values, at least one must frame as a
  segment (its header decodes with :func:`segmenter.wire.decode_header`, the rules of the header
  table; column input is encoded first, exactly as the job encodes it). A damaged value is a data
  fault, quarantined later with its original bytes; none framing at all means the column does not
  hold segments.

A refusal is :class:`InputRefused`, a :class:`~reassembly._errors.UsageError` (the command exits
2) with one line naming what was asked for and the columns found with their types. Input with no
value to sample (no file yet, no rows, only NULLs in the column) is not refused: there is nothing
yet that could be a mistake.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from reassembly._errors import UsageError
from reassembly.spark.schema import ColumnNames
from segmenter.errors import SegmentationError
from segmenter.wire import MAX_HEADER_LENGTH, decode_header

SAMPLE = 100
"""How many non-NULL values are read to see whether the column holds segments at all."""

_LISTED = 30  # columns named in a refusal (a wide table's line stays readable)
_INTEGRAL = frozenset({"tinyint", "smallint", "int", "bigint"})
_WHOLE_DECIMAL = re.compile(r"decimal\(\d+,0\)")  # e.g. a Parquet UINT_64 column


class InputRefused(UsageError):
    """The input cannot be what was meant (a column missing or of another type, or no segments in it)."""


@dataclass(frozen=True)
class SegmentInput:
    """Where a job finds its segments: ``raw_column`` (encoded) or the columns ``columns`` names."""

    encoded: bool = True
    """True: each segment is encoded bytes in one binary column; False: its header fields are columns."""
    raw_column: str = "segment"
    """The binary column of encoded segments (``encoded``)."""
    columns: ColumnNames = field(default_factory=ColumnNames)
    """The columns of the header fields and the data (not ``encoded``)."""

    def wanted(self) -> dict[str, str]:
        """Each column the input must have -> the kind of type it must be (``binary`` or ``integer``)."""
        if self.encoded:
            return {self.raw_column: "binary"}
        c = self.columns
        named = {
            c.group_id: "binary",
            c.msg_seq_number: "integer",
            c.offset: "integer",
            c.msg_flags: "integer",
            c.original_length: "integer",
            c.stored_length: "integer",
            c.data_checksum: "integer",
            c.message_checksum: "integer",
            c.data: "binary",
            c.codec: "integer",
            c.algorithm: "integer",
        }
        return {name: kind for name, kind in named.items() if name is not None}

    @property
    def sampled(self) -> str:
        """The column whose non-NULL values are sampled (each row's segment bytes, or its GroupId)."""
        return self.raw_column if self.encoded else self.columns.group_id


def described(schema: Any) -> str:
    """``name type, ...`` for a Spark schema, as a refusal lists them (the first 30, then how many more).

    ``schema``: the Spark schema (a StructType).
    """
    return _described(_pairs(schema))


def _pairs(schema: Any) -> list[tuple[str, str]]:
    return [(f.name, f.dataType.simpleString()) for f in schema.fields]


def _described(types: list[tuple[str, str]]) -> str:
    fields = [f"{name} {type_name}" for name, type_name in types]
    more = len(fields) - _LISTED
    return ", ".join(fields[:_LISTED]) + (f", ... and {more} more" if more > 0 else "") if fields else "none"


def _fits(type_name: str, kind: str) -> bool:
    if kind == "binary":
        return type_name == "binary"
    return type_name in _INTEGRAL or _WHOLE_DECIMAL.fullmatch(type_name) is not None


def _names(names: Iterable[str]) -> str:
    names = list(names)
    return ("column " if len(names) == 1 else "columns ") + ", ".join(repr(n) for n in names)


def check_schema(schema: Any, what: SegmentInput, *, event_time: str | None = None) -> None:
    """Refuse a schema without the columns ``what`` names, or with one of another type (InputRefused).

    ``event_time`` (a stream's event-time column, if one is named) must exist too. Works on the
    schema of any DataFrame, a streaming one included (it reads no value).

    ``schema``: the input's Spark schema. ``what``: which columns hold the segments and what type each must have.
    """
    check_types(_pairs(schema), what, event_time=event_time)


def check_types(types: list[tuple[str, str]], what: SegmentInput, *, event_time: str | None = None) -> None:
    """:func:`check_schema` over the columns as (name, Spark type name) pairs: the same refusal, for a
    schema read elsewhere than in Spark (the Parquet footers, :mod:`reassembly.spark.footers`).

    ``types``: the input's columns, as (name, Spark type name) pairs. ``what``: which columns hold the segments.
    ``event_time``: the stream's event-time column (None: none named).
    """
    named = dict(types)
    wanted = what.wanted()
    fmt = "" if what.encoded else " (input format columns)"
    missing = [name for name in wanted if name not in named]
    if missing:
        raise InputRefused(f"{_names(missing)} not in input{fmt} (columns: {_described(types)})")
    wrong = [name for name, kind in wanted.items() if not _fits(named[name], kind)]
    if wrong:
        got = ", ".join(f"{name!r} is {named[name]}, expected {wanted[name]}" for name in wrong)
        raise InputRefused(f"column {got}{fmt} (columns: {_described(types)})")
    if event_time is not None and event_time not in named:
        raise InputRefused(f"event-time column {event_time!r} not in input (columns: {_described(types)})")


def check_binary_column(schema: Any, column: str) -> None:
    """Refuse a schema whose ``column`` is missing or not binary (for inputs that are not segments).

    ``schema``: the input's Spark schema. ``column``: the column that must be binary.
    """
    check_schema(schema, SegmentInput(raw_column=column))


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _prefixes(df: Any, what: SegmentInput, sample: int) -> list[bytes]:
    """The header-sized start of each of the first ``sample`` segments the job would read (encoded as
    the job encodes column input), non-NULL ones only: a bounded read, whatever the segments' size."""
    from pyspark.sql import functions as F

    first = df.where(F.col(_quoted(what.sampled)).isNotNull()).limit(sample)
    if what.encoded:
        raw = F.col(_quoted(what.raw_column))
    else:
        from reassembly.spark.columns import encode_columns

        first, raw = encode_columns(first, what.columns), F.col("segment")
    rows = first.select(F.substring(raw, 1, MAX_HEADER_LENGTH).alias("head")).collect()
    return [bytes(r.head) for r in rows if r.head is not None]


def frames(value: bytes) -> SegmentationError | None:
    """None if ``value`` starts with a segment header the wire format accepts, else why not."""
    try:
        decode_header(value)
    except SegmentationError as exc:
        return exc
    return None


def check_input(df: Any, what: SegmentInput, *, event_time: str | None = None, sample: int = SAMPLE) -> None:
    """Refuse ``df`` (a batch DataFrame of the input) when it cannot hold what ``what`` names:
    :func:`check_schema`, then none of the first ``sample`` non-NULL values framing as a segment.
    Runs one small Spark job (``sample`` header-sized values).

    ``event_time``: the event-time column that must exist (None: none named).
    """
    check_schema(df.schema, what, event_time=event_time)
    refuse_heads(_prefixes(df, what, sample), what, _pairs(df.schema))


def refuse_heads(heads: list[bytes], what: SegmentInput, types: list[tuple[str, str]]) -> None:
    """Refuse the input (its columns ``types``) when none of ``heads``, the starts of its first
    non-NULL values, frames as a segment; nothing to sample (no file, no row, only NULLs) is no refusal.

    ``what``: which columns hold the segments (named in the refusal).
    """
    errors = [frames(head) for head in heads]
    if not errors or None in errors:  # nothing to sample yet (no file, no row, only NULLs), or segments
        return
    why = errors[0]
    if what.encoded:
        raise InputRefused(
            f"column {what.raw_column!r} holds no segments: none of its first {len(heads)} non-NULL values"
            f" starts with a segment header (the first: {why}) (columns: {_described(types)})"
        )
    raise InputRefused(
        f"the input's columns make no segments: none of the first {len(heads)} rows with a GroupId in"
        f" {what.sampled!r} encodes to a segment header (the first: {why}) (columns: {_described(types)})"
    )


__all__ = [
    "SAMPLE",
    "InputRefused",
    "SegmentInput",
    "check_binary_column",
    "check_input",
    "check_schema",
    "check_types",
    "described",
    "frames",
    "refuse_heads",
]
