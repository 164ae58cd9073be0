"""Spark against in-process: on any hostile landing set, the Spark job reports exactly what the batch assembler does.

A hypothesis strategy builds landing sets a real pipe (or an attacker) can
produce: interleaved messages and MQ groups, duplicates, conflicting copies,
bit flips in headers and data, forged headers that reseal the header checksum,
huge declared lengths, LENGTH_DEFERRED mixes, zstd, header extensions, SHA-256
and HMAC-SHA-256 digests (read without keys, or with a keyring that demands a
tag), garbage, truncated, empty and NULL rows. The Spark ``messages`` and ``quarantine`` must
equal, row for row, what one in-process batch assembler reports on the same
rows (through the same ``rows.py`` conversion), with the JVM fast path on and
off, and with the large-message path on (a small ``large_message_bytes``): every column, the
incomplete facts (``detail``, ``missing_ranges_basis``, ``last_seq_number``, declared lengths)
included. With an input column kept, each row's lineage (``source`` / ``sources``) names landing
rows holding the same bytes as the in-process assembler's (identical copies are interchangeable).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from reassembly.spark import ReassemblyOptions, read_quarantined, reassemble
from reassembly.spark.rows import reassemble_group
from reassembly.spark.schema import OUTPUT_FIELDS
from segmenter import ChecksumAlgorithm, Codec, SegmentationError, Segmenter
from segmenter.checksum import checksum
from segmenter.digest import NO_POLICY, DigestPolicy, Keyring
from segmenter.header_table import FIELDS
from segmenter.wire import HEADER, HEADER_LENGTH, LENGTH_DEFERRED, UNKNOWN_LENGTH, Segment, check_prefix, decode_segment

pytestmark = pytest.mark.spark

MAX = 4000  # max_message_size: some generated messages exceed it (too_big)
KEYED = DigestPolicy(keyring=Keyring({"k1": b"differential-key"}, current="k1"))
_SIGNERS = {"sha256": DigestPolicy(sha256=True), "hmac": KEYED}
_INDEX = {f.name: i for i, f in enumerate(FIELDS)}
_HOSTILE = {
    "original_length": [0, 1, MAX, MAX + 1, 2**63 - 1, 2**63, UNKNOWN_LENGTH],
    "stored_length": [0, 1, MAX, MAX + 1, 2**63, UNKNOWN_LENGTH],
    "offset": [0, 1, 100, 2**62, 2**63, UNKNOWN_LENGTH],
    "data_length": [0, 1, 50],
    "msg_seq_number": [0, 1, 2, 999_999_999, 1_000_000_000],
    "msg_flags": [0, 2, 4, 6, 8, 16, 24, 32],
    "header_flags": [0, 1, 2, 3, 4],
    "codec": [0, 1, 2],
    "algorithm": [1, 2, 3],
    "reserved": [0, 1],
}


def reseal(raw: bytes, data: bytes | None = None, **changes: int) -> bytes:
    """A forged header: fields changed and the header checksum recomputed, so only the rules can tell."""
    hl = check_prefix(raw)
    fields = list(HEADER.unpack_from(raw))
    for name, value in changes.items():
        fields[_INDEX[name]] = value
    body = HEADER.pack(*fields) + raw[HEADER.size : hl - 4]
    return body + checksum(ChecksumAlgorithm.CRC32, body).to_bytes(4, "big") + (raw[hl:] if data is None else data)


def _framed(raw: bytes) -> bool:
    try:
        return len(raw) >= check_prefix(raw)
    except (SegmentationError, struct.error):
        return False


def with_extension(raw: bytes, extension: bytes) -> bytes:
    seg = decode_segment(raw, verify=False, max_segment_size=1 << 40)
    return Segment(seg.header._replace(extension=extension), seg.data).encode()


@st.composite
def message(draw: st.DrawFn, index: int) -> list[bytes | None]:
    """One message or MQ group (its own GroupId), then hostile changes to its rows."""
    gid = index.to_bytes(4, "big") + draw(st.binary(min_size=20, max_size=20))
    size = draw(st.integers(HEADER_LENGTH + 1, 400))
    kinds = ["plain", "zstd", "crc32c", "deferred", "group", "big", "extension", "sha256", "hmac"]
    kind = draw(st.sampled_from(kinds))
    seg = Segmenter(
        max(size, HEADER_LENGTH + 100) if kind in _SIGNERS else size,
        codec=Codec.ZSTD if kind == "zstd" else Codec.NONE,
        algorithm=ChecksumAlgorithm.CRC32C if kind == "crc32c" else ChecksumAlgorithm.CRC32,
        digest=_SIGNERS.get(kind, NO_POLICY),
    )
    length = draw(st.integers(MAX - 300, MAX + 600) if kind == "big" else st.integers(0, 1500))
    payload = draw(st.randoms(use_true_random=False)).randbytes(length)
    if kind == "group":
        parts = draw(st.lists(st.binary(max_size=500), min_size=1, max_size=3))
        rows: list[bytes | None] = [s.encode() for s in seg.segment_group(parts, group_id=gid)]
    elif kind == "deferred":
        w = seg.message_writer(group_id=gid)
        rows = [s.encode() for s in w.write(payload) + w.close()]
    else:
        rows = [s.encode() for s in seg.segment(payload, group_id=gid)]
    if kind == "extension":
        ext = draw(st.binary(min_size=1, max_size=40))
        rows = [with_extension(r, ext) for r in rows if r is not None]
    for _ in range(draw(st.integers(0, 3))):
        rows = mutate(draw, rows)
    return rows


def mutate(draw: st.DrawFn, rows: list[bytes | None]) -> list[bytes | None]:
    real = [r for r in rows if r is not None and _framed(r)]
    if not real:
        return rows
    raw = draw(st.sampled_from(real))
    hl = check_prefix(raw)
    op = draw(st.sampled_from(["dup", "drop", "data_flip", "header_flip", "forge", "conflict", "truncate", "defer"]))
    replace = draw(st.booleans())  # the damaged copy replaces the row, or arrives beside it
    if op == "dup":
        return [*rows, raw]
    if op == "drop":
        return [r for r in rows if r is not raw]
    if op == "data_flip" and len(raw) > hl:
        bit = draw(st.integers(0, (len(raw) - hl) * 8 - 1))
        new = bytearray(raw)
        new[hl + bit // 8] ^= 1 << (bit % 8)
        bad = bytes(new)
    elif op == "header_flip":
        bit = draw(st.integers(0, hl * 8 - 1))
        new = bytearray(raw)
        new[bit // 8] ^= 1 << (bit % 8)
        bad = bytes(new)
    elif op == "forge":
        name = draw(st.sampled_from(sorted(_HOSTILE)))
        bad = reseal(raw, **{name: draw(st.sampled_from(_HOSTILE[name]))})
    elif op == "conflict":  # same position, other bytes (maybe another length), a valid data checksum
        n, algo = len(raw) - hl, HEADER.unpack_from(raw)[_INDEX["algorithm"]]
        data = draw(st.binary(min_size=max(0, n - 2), max_size=n + 2))
        crc = checksum(ChecksumAlgorithm(algo) if algo in set(ChecksumAlgorithm) else ChecksumAlgorithm.CRC32, data)
        bad = reseal(raw, data, data_length=len(data), data_checksum=crc)
    elif op == "truncate":
        bad = raw[: draw(st.integers(0, len(raw) - 1))]
    elif op == "defer":
        flags = raw[7] ^ LENGTH_DEFERRED
        bad = (
            reseal(raw, header_flags=flags)
            if draw(st.booleans())
            else reseal(raw, header_flags=flags, original_length=UNKNOWN_LENGTH)
        )
    else:
        return rows
    return [bad if r is raw else r for r in rows] if replace else [*rows, bad]


@st.composite
def landing(draw: st.DrawFn) -> list[bytes | None]:
    """Several messages' rows interleaved, with rows that are no segment at all."""
    rows: list[bytes | None] = []
    for i in range(draw(st.integers(1, 6))):
        rows += draw(message(i))
    rows += draw(
        st.lists(
            st.one_of(st.none(), st.binary(max_size=120), st.binary(max_size=100).map(lambda b: b"SGMT" + b)),
            max_size=3,
        )
    )
    return draw(st.permutations(rows))


def canonical(rows: list[dict[str, Any]], payload_dir: Path | None = None) -> list[str]:
    out = []
    for row in rows:
        r = {name: row.get(name) for name, _, _ in OUTPUT_FIELDS}
        if r["payload_path"] is not None and payload_dir is not None:  # a file instead of a value: compare bytes
            r["payload"], r["payload_path"] = (payload_dir / r["payload_path"]).read_bytes(), None
        if r["raw_path"] is not None and payload_dir is not None:  # quarantined by reference: compare bytes
            r["raw"] = read_quarantined(r, payload_dir)
            r["raw_path"] = r["raw_offset"] = r["raw_length"] = None
        if r["payload"] is not None:
            r["payload"] = bytes(r["payload"])
        out.append(repr(sorted(r.items())))
    return sorted(out)


def spark_rows(spark: Any, path: Path, digest: DigestPolicy, **options: Any) -> list[dict[str, Any]]:
    opts = ReassemblyOptions(max_message_size=MAX, partitions=3, digest=digest, **options)
    result = reassemble(spark.read.parquet(str(path)), options=opts)
    return [r.asDict(recursive=True) for r in result.combined.collect()]


def in_process(rows: list[bytes | None], digest: DigestPolicy = NO_POLICY) -> list[str]:
    return canonical(reassemble_group(rows, ReassemblyOptions(max_message_size=MAX, digest=digest).limits()))


def by_landing_bytes(rows: list[dict[str, Any]], landing: list[bytes | None]) -> list[str]:
    """:func:`canonical`, each lineage entry (``{"row": i}``) replaced by the bytes of landing row i."""

    def named(src: dict[str, Any] | None) -> bytes | None:
        assert src is not None
        return landing[src["row"]]

    out = []
    for row in rows:
        lineage = [named(s) for s in row["sources"]] if row["kind"] == "message" else [named(row["source"])]
        out.append(repr((canonical([row]), lineage)))
    return sorted(out)


def check_lineage(spark: Any, rows: list[bytes | None], path: Path, digest: DigestPolicy) -> None:
    """The kept column ``row`` (each landing row's index) names rows with the same bytes as in-process."""
    limits = ReassemblyOptions(max_message_size=MAX, digest=digest).limits()
    expected = by_landing_bytes(reassemble_group(rows, limits, sources=[{"row": i} for i in range(len(rows))]), rows)
    df = spark.read.parquet(str(path))
    for use_jar in (True, False):  # the one pass, and the SQL aggregate (its pieces and metas apart)
        opts = ReassemblyOptions(
            max_message_size=MAX, partitions=3, digest=digest, keep_columns=("row",), use_jar=use_jar
        )
        got = [r.asDict(recursive=True) for r in reassemble(df, options=opts).combined.collect()]
        assert by_landing_bytes(got, rows) == expected, f"lineage, use_jar={use_jar}"


def check(spark: Any, rows: list[bytes | None], tmp: Path, digest: DigestPolicy = NO_POLICY) -> None:
    path = tmp / "landing.parquet"
    pq.write_table(pa.table({"segment": pa.array(rows, pa.binary()), "row": pa.array(range(len(rows)))}), path)
    expected = in_process(rows, digest)  # arbitration is order-independent: any order gives this
    assert canonical(spark_rows(spark, path, digest)) == expected, "JVM fast path on"
    assert canonical(spark_rows(spark, path, digest, jvm_fast_path=False)) == expected, "JVM fast path off"
    files = tmp / "payloads"
    large = spark_rows(spark, path, digest, payload_dir=str(files), large_message_bytes=150)
    assert canonical(large, files) == expected, "large-message path"
    check_lineage(spark, rows, path, digest)


# No shrinking: each example costs three Spark jobs; a failure prints its rows as drawn.
_SETTINGS = {
    "deadline": None,
    "suppress_health_check": list(HealthCheck),
    "phases": (Phase.explicit, Phase.reuse, Phase.generate),
}


_READERS = st.sampled_from([NO_POLICY, KEYED])


@settings(max_examples=4, **_SETTINGS)  # type: ignore[arg-type]
@given(rows=landing(), digest=_READERS)
def test_spark_reports_what_the_in_process_assembler_reports(
    spark: Any, tmp_path_factory: pytest.TempPathFactory, rows: list[bytes | None], digest: DigestPolicy
) -> None:
    check(spark, rows, tmp_path_factory.mktemp("differential"), digest)


@pytest.mark.slow
@settings(max_examples=40, **_SETTINGS)  # type: ignore[arg-type]
@given(rows=landing(), digest=_READERS)
def test_spark_reports_what_the_in_process_assembler_reports_many(
    spark: Any, tmp_path_factory: pytest.TempPathFactory, rows: list[bytes | None], digest: DigestPolicy
) -> None:
    check(spark, rows, tmp_path_factory.mktemp("differential"), digest)


@settings(max_examples=200, **_SETTINGS)  # type: ignore[arg-type]
@given(rows=landing(), data=st.data())
def test_in_process_outcome_does_not_depend_on_arrival_order(rows: list[bytes | None], data: st.DataObject) -> None:
    assert in_process(data.draw(st.permutations(rows))) == in_process(rows)
