"""Generated landing tables of segments, with every fault a real pipe produces, and what to expect.

Used by the tests, the ``reassemble demo`` command and the benchmarks. Each
fault is injected into its own message so the expected outcome is exact.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from segmenter.checksum import ChecksumAlgorithm, checksum
from segmenter.errors import Reason
from segmenter.flags import Codec, MsgFlags
from segmenter.header_table import FIELD
from segmenter.producer import Segmenter, new_group_id
from segmenter.wire import HEADER_LENGTH, Segment, decode_header, decode_segment, make_header

FAULTS = (
    "duplicate",
    "conflict",
    "drop",
    "data_flip",
    "header_flip",
    "truncate",
    "zstd_bomb",
    "garbage",
    "group_drop",
    "message_checksum",
)


@dataclass(frozen=True)
class Expected:
    """What the reassembly must report for one logical message."""

    status: str
    reason: int
    payload: bytes | None = None
    missing_ranges: tuple[tuple[int, int | None], ...] = ()


@dataclass
class Dataset:
    rows: list[bytes] = field(default_factory=list)
    expected: dict[tuple[bytes, int], Expected] = field(default_factory=dict)
    garbage_rows: int = 0  # rows with no valid header at all (quarantined, no message)
    payload_bytes: int = 0


def _flip(raw: bytes, index: int) -> bytes:
    b = bytearray(raw)
    b[index] ^= 0x01
    return bytes(b)


def generate(
    n_messages: int = 40,
    segments_per_message: int = 4,
    segment_size: int = 4096,
    *,
    faults: bool = True,
    groups: int = 2,
    seed: int = 7,
    compress_every: int = 5,
) -> Dataset:
    """Segments of ``n_messages`` messages (plus ``groups`` MQ groups), faults injected if asked."""
    rng = random.Random(seed)
    ds = Dataset()
    data_size = segment_size - HEADER_LENGTH
    plain = Segmenter(segment_size)
    zstd = Segmenter(segment_size, codec=Codec.ZSTD)
    for i in range(n_messages):
        size = data_size * segments_per_message - rng.randrange(0, data_size // 2)
        payload = rng.randbytes(size)
        seg = zstd if compress_every and i % compress_every == 1 else plain
        segs = [s.encode() for s in seg.segment(payload)]
        ds.payload_bytes += size
        fault = FAULTS[i % len(FAULTS)] if faults else None
        ok = Expected("complete", 0, payload)
        if fault == "duplicate":
            segs.append(segs[0])
            segs.append(segs[-2])
        elif fault == "conflict":
            # a second copy of segment 1 with different bytes: quarantined, first copy kept
            segs.append(_conflicting_copy(segs[1], rng))
        elif fault == "drop" and len(segs) > 2:
            dropped = segs.pop(1)
            start = decode_header(dropped).offset
            ok = Expected("incomplete", Reason.INCOMPLETE_MSG, None, ((start, start + len(dropped) - HEADER_LENGTH),))
        elif fault == "data_flip":
            intact = segs[-1]
            segs[-1] = _flip(intact, len(intact) - 1)
            segs.append(intact)  # a good redelivery completes it; the flipped copy is quarantined
        elif fault == "header_flip":
            segs[0] = _flip(segs[0], FIELD["offset"].offset + 2)  # a bit of the Offset
            ok = Expected("incomplete", Reason.INCOMPLETE_MSG, None, ((0, data_size),))
        elif fault == "truncate":
            segs[0] = segs[0][: len(segs[0]) // 2]
            ok = Expected("incomplete", Reason.INCOMPLETE_MSG, None, ((0, data_size),))
        elif fault == "message_checksum":
            segs = [s.encode() for s in _lying_checksum(seg, payload)]
            ok = Expected("corrupt", Reason.MESSAGE_CHECKSUM_ERROR)
        elif fault == "garbage":
            ds.rows += [os.urandom(rng.randrange(0, 300)), b"SGMT" + os.urandom(120)]
            ds.garbage_rows += 2
        elif fault == "zstd_bomb":
            segs = [_bomb()]
            ds.rows += segs
            bomb_gid = decode_header(segs[0]).group_id
            ds.expected[(bomb_gid, 1)] = Expected("corrupt", Reason.DECOMPRESSION_ERROR)
            continue
        ds.rows += segs
        ds.expected[(decode_header(segs[-1]).group_id, 1)] = ok
    for g in range(groups):
        payloads = [rng.randbytes(rng.randrange(1, data_size * 3)) for _ in range(4)]
        gid = new_group_id()
        segs = [s.encode() for s in plain.segment_group(payloads, group_id=gid)]
        if faults and g % 2 == 1:
            segs = [s for s in segs if decode_header(s).msg_seq_number != 3]  # message 3 lost
            for n in range(1, 5):
                ds.expected[(gid, n)] = Expected("incomplete", Reason.INCOMPLETE_GROUP)
        else:
            for n, p in enumerate(payloads, 1):
                ds.expected[(gid, n)] = Expected("complete", 0, p)
        ds.rows += segs
    rng.shuffle(ds.rows)
    return ds


def _conflicting_copy(raw: bytes, rng: random.Random) -> bytes:
    """Same position, other bytes, a valid checksum: only the conflict rule can catch it."""
    h = decode_segment(raw).header
    data = rng.randbytes(h.data_length)
    return Segment(h._replace(data_checksum=checksum(h.algorithm, data)), data).encode()


def _lying_checksum(seg: Segmenter, payload: bytes) -> list[Segment]:
    out = []
    for s in seg.segment(payload):
        carried = s.header.message_checksum  # only the last segment carries it
        h = s.header._replace(message_checksum=None if carried is None else carried ^ 0xFFFF)
        out.append(Segment(h, s.data))
    return out


@lru_cache(maxsize=1)
def _bomb_body() -> bytes:
    return zstandard.ZstdCompressor().compress(bytes(64 * 1024 * 1024))


def _bomb() -> bytes:
    """A tiny zstd body that expands far beyond the original length it declares."""
    body = _bomb_body()
    declared = 1024
    h = make_header(
        group_id=new_group_id(),
        msg_seq_number=1,
        offset=0,
        data=body,
        original_length=declared,
        stored_length=len(body),
        msg_flags=MsgFlags.NONE,
        codec=Codec.ZSTD,
        algorithm=ChecksumAlgorithm.CRC32,
        message_checksum=checksum(ChecksumAlgorithm.CRC32, bytes(declared)),
    )
    return Segment(h, body).encode()


def write_parquet(ds: Dataset, directory: str | Path, files: int = 4, seed: int = 1) -> Path:
    """Spread the rows over ``files`` Parquet files in a shuffled order; return the directory."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    rows = list(ds.rows)
    random.Random(seed).shuffle(rows)
    for i in range(files):
        part = rows[i::files]
        pq.write_table(pa.table({"segment": pa.array(part, pa.binary())}), out / f"part-{i:04d}.parquet")
    return out
