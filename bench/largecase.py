"""One message far above Spark's 2 GiB value cap, reassembled into a payload file and checked.

``python -m bench.largecase --gib 8`` writes one 8 GiB message as 8,192 segments of 1 MiB
(streamed: never more than one 64 MiB block in memory, no payload file on disk), runs
``reassemble`` with ``ReassemblyOptions(payload_dir=..., large_message_bytes=64 MiB)`` in a
fresh process (``bench.sparkcase``) while sampling the peak RSS of every process, then checks
the payload file's size and CRC-32 against the generator's (read in blocks, never whole).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from segmenter import Segmenter

from .sparkbench import LARGE, MiB, make_dataset, run_cases

BLOCK = 64 * MiB


def write_message(path: Path, size: int, segment_size: int, rows_per_file: int = 64) -> dict[str, Any]:
    """One message of ``size`` bytes cut into ``segment_size`` segments, shuffled over Parquet files.

    The payload is a 64 MiB random block whose first 8 bytes carry the block number, repeated:
    every segment differs from its neighbours, and nothing bigger than one block is held. The
    CRC-32 is computed here with zlib, independently of the segmenter's own. Cached: a data set
    is reused while its ``_DONE`` file (holding this description) exists.
    """
    done = path / "_DONE"
    if done.exists():
        return dict(json.loads(done.read_text()))
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    block = random.Random(size).randbytes(BLOCK)
    seg = Segmenter(segment_size)
    writer = seg.message_writer(original_length=size)
    segments = -(-size // seg.data_size)
    names = list(range(-(-segments // rows_per_file)))
    random.Random(1).shuffle(names)  # file order is not segment order
    crc, written, batch = 0, 0, []
    for i in range(-(-size // BLOCK)):
        chunk = (i.to_bytes(8, "big") + block[8:])[: size - written]
        crc = zlib.crc32(chunk, crc)
        written += len(chunk)
        batch += [s.encode() for s in writer.write(chunk)]
        while len(batch) >= rows_per_file:
            _write(path / f"part-{names.pop():05d}.parquet", batch[:rows_per_file])
            batch = batch[rows_per_file:]
    batch += [s.encode() for s in writer.close()]
    if batch:
        _write(path / f"part-{names.pop():05d}.parquet", batch)
    info = {"messages": 1, "bytes": size, "segment": segment_size, "per_message": segments}
    info["crc32"] = crc
    done.write_text(json.dumps(info))
    return info


def _write(path: Path, rows: list[bytes]) -> None:
    pq.write_table(pa.table({"segment": pa.array(rows, pa.binary())}), path, compression="none")


def file_crc32(path: Path) -> tuple[int, int]:
    """Size and CRC-32 of a file, read 64 MiB at a time."""
    crc = size = 0
    with open(path, "rb") as f:
        while block := f.read(BLOCK):
            crc = zlib.crc32(block, crc)
            size += len(block)
    return size, crc


def check(out: Path, payload_dir: Path, expected: dict[str, Any]) -> dict[str, Any]:
    """What the job wrote (``save()``: ``messages/`` and ``quarantine/``): one complete message, no
    quarantine, its payload file's size and CRC as generated."""
    columns = ["status", "reason_name", "original_length", "payload_path"]
    files = sorted((out / "messages").glob("*.parquet"))
    messages = [r for f in files for r in pq.read_table(f, columns=columns).to_pylist()]
    quarantined = sum(pq.read_metadata(f).num_rows for f in (out / "quarantine").glob("*.parquet"))
    result: dict[str, Any] = {"messages": len(messages), "quarantined": quarantined}
    if len(messages) != 1 or quarantined or messages[0]["payload_path"] is None:
        return result | {"ok": False, "detail": f"expected one message in a file, got {messages[:3]}"}
    m = messages[0]
    size, crc = file_crc32(payload_dir / m["payload_path"])
    want = ("complete", expected["bytes"], expected["bytes"], expected["crc32"])
    ok = (m["status"], m["original_length"], size, crc) == want
    return result | {"ok": ok, "status": m["status"], "reason": m["reason_name"], "file_bytes": size, "file_crc32": crc}


def run(work: Path, size: int, segment_size: int, conf: dict[str, str], keep_data: bool) -> dict[str, Any]:
    """Generate, reassemble in a fresh process, check; delete the output (and the data unless ``keep_data``)."""
    src = work / f"single-{size // MiB}M-{segment_size // 1024}K"
    started = time.monotonic()
    expected = write_message(src, size, segment_size)
    generated = time.monotonic() - started
    warm = work / "warmup-32M"
    make_dataset(warm, 32 * MiB, 64 * 1024, 8)
    out = work / "out-large"
    try:
        case = run_cases(src, [LARGE], warm, out, keep=True, conf=conf)[0]
        verdict = check(out, out.parent / "payloads", expected) if case["seconds"] is not None else {"ok": False}
    finally:
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(out.parent / "payloads", ignore_errors=True)
        if not keep_data:
            shutil.rmtree(src, ignore_errors=True)
    return {"kind": "single_large", **expected, **case, "generate_seconds": generated, "conf": conf, **verdict}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.largecase", description=__doc__)
    p.add_argument("--gib", type=float, default=8.0, help="message size in GiB (default 8)")
    p.add_argument("--segment-kib", type=int, default=1024)
    p.add_argument("--work", default=None, help="scratch directory (default: a temp dir)")
    p.add_argument("--keep-data", action="store_true", help="keep the generated landing table for another run")
    p.add_argument("--pyspark-memory", default="", help="spark.executor.pyspark.memory, e.g. 512m (default: not set)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="an extra Spark setting")
    p.add_argument("--json", default=None, help="write the result here")
    args = p.parse_args(argv)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench-large-"))
    settings = conf(args.pyspark_memory) | dict(kv.split("=", 1) for kv in args.conf)
    result = run(work, int(args.gib * 1024) * MiB, args.segment_kib * 1024, settings, args.keep_data)
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0 if result.get("ok") else 1


def conf(pyspark_memory: str) -> dict[str, str]:
    """Spark settings of the large case: the Python workers' memory cap, when asked for."""
    return {"spark.executor.pyspark.memory": pyspark_memory} if pyspark_memory else {}


if __name__ == "__main__":
    sys.exit(main())
