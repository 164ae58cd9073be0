"""Segments given as columns: encode them into the wire format so one pipeline serves both forms.

The encoding reuses :meth:`segmenter.wire.SegmentHeader.pack`, so a quarantine
row's ``raw`` is exactly the segment a producer would have sent for those
column values. Column input skips the header checksum (there is none to
check); every other rule applies unchanged. A row whose values the wire format cannot carry
(a NULL or out-of-range number, a GroupId other than 24 bytes, NULL data) is kept as garbage
(``COLUMNS:`` and its values): quarantined, never padded, cut or guessed into a segment.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from reassembly.spark.schema import ColumnNames
from segmenter.checksum import DEFAULT_ALGORITHM
from segmenter.flags import Codec
from segmenter.wire import GROUP_ID_LENGTH, UNKNOWN_LENGTH, SegmentHeader


def _encode(keep: tuple[str, ...] = ()) -> Any:
    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            cols = batch.to_pydict()
            n = batch.num_rows
            out = []
            for i in range(n):
                given = cols["data"][i]
                data = b"" if given is None else given
                original = cols["original_length"][i]
                stored = cols["stored_length"][i] if "stored_length" in cols else original
                mcrc = cols["message_checksum"][i]
                header = SegmentHeader(
                    group_id=cols["group_id"][i],
                    msg_seq_number=cols["msg_seq_number"][i],
                    offset=cols["offset"][i],
                    data_length=len(data),
                    original_length=UNKNOWN_LENGTH if original is None else original,
                    stored_length=UNKNOWN_LENGTH if stored is None else stored,
                    msg_flags=cols["msg_flags"][i],
                    codec=cols["codec"][i] if "codec" in cols else Codec.NONE,
                    algorithm=cols["algorithm"][i] if "algorithm" in cols else DEFAULT_ALGORITHM,
                    data_checksum=cols["data_checksum"][i],
                    message_checksum=mcrc,
                    length_deferred=original is None,
                )
                try:
                    if given is None or len(header.group_id) != GROUP_ID_LENGTH:  # pack would pad or cut it:
                        raise ValueError("NULL data or a GroupId that is not 24 bytes")  # two groups merged
                    out.append(header.pack() + data)
                except (struct.error, TypeError, ValueError):  # a value that does not fit: keep it, as garbage
                    out.append(b"COLUMNS:" + repr(header).encode()[:200] + b"|" + data)
            kept = [batch.column(k) for k in keep]
            yield pa.RecordBatch.from_arrays([pa.array(out, pa.binary()), *kept], names=["segment", *keep])

    return fn


def encode_columns(df: Any, names: ColumnNames, keep: tuple[str, ...] = ()) -> Any:
    """One binary column ``segment`` (wire format v1) from the configured input columns, then the
    columns named in ``keep`` as they are (a stream's event time)."""
    from pyspark.sql import functions as F

    picks = {
        "group_id": names.group_id,
        "msg_seq_number": names.msg_seq_number,
        "offset": names.offset,
        "msg_flags": names.msg_flags,
        "original_length": names.original_length,
        "stored_length": names.stored_length,
        "data_checksum": names.data_checksum,
        "message_checksum": names.message_checksum,
        "data": names.data,
        "codec": names.codec,
        "algorithm": names.algorithm,
    }
    # try_cast, every number as a bigint: a value out of a field's range reaches _encode as itself and
    # is kept as garbage there (Spark's ANSI cast to int would fail the whole job on one 3,000,000,000);
    # what no bigint holds (text, a wide decimal) arrives as NULL, garbage too.
    types = {"group_id": "binary", "data": "binary"}
    cols = [F.col(src).try_cast(types.get(dst, "bigint")).alias(dst) for dst, src in picks.items() if src is not None]
    kept = ", ".join(f"`{k}` {df.schema[k].dataType.simpleString()}" for k in keep)
    return df.select(*cols, *keep).mapInArrow(_encode(keep), "segment binary" + (f", {kept}" if kept else ""))
