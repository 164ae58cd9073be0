"""One 1 GiB message through the ``reassemble`` command, with the Python workers' memory measured.

Slow (about two minutes and 3 GiB of disk), so CI deselects it; run it with
``.venv/bin/pytest -m slow tests/cli/test_large_message.py -s``.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from segmenter import Segmenter

pytestmark = [pytest.mark.slow, pytest.mark.spark]

GiB, MiB = 1 << 30, 1 << 20


def write_landing(directory: Path, size: int, segment_size: int) -> tuple[str, int]:
    """A ``size``-byte random file cut into segments (streamed: never in memory), 64 segments per Parquet file."""
    source = directory / "payload.bin"
    digest = hashlib.sha256()
    with open(source, "wb") as f:
        for _ in range(size // (64 * MiB)):
            block = os.urandom(64 * MiB)
            digest.update(block)
            f.write(block)
    landing = directory / "landing"
    landing.mkdir()
    batch: list[bytes] = []
    part = 0
    with open(source, "rb") as f:
        for s in Segmenter(segment_size).segment(f):
            batch.append(s.encode())
            if len(batch) == 64:
                pq.write_table(
                    pa.table({"segment": pa.array(batch, pa.binary())}), landing / f"part-{part:04d}.parquet"
                )
                batch, part = [], part + 1
    if batch:
        pq.write_table(pa.table({"segment": pa.array(batch, pa.binary())}), landing / f"part-{part:04d}.parquet")
    source.unlink()
    return digest.hexdigest(), size


class PythonWorkers:
    """Peak RSS of the Python processes Spark starts under a command (the command itself excluded)."""

    def __init__(self, root: psutil.Process) -> None:
        self.root, self.peak, self._stop = root, 0, threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.1):
            try:
                children = self.root.children(recursive=True)
            except psutil.Error:
                continue
            for p in children:
                try:
                    if "python" in p.name():
                        self.peak = max(self.peak, p.memory_info().rss)
                except psutil.Error:
                    continue

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def test_a_1_gib_message_reassembles_into_a_file_with_python_workers_under_1_gib(tmp_path: Path) -> None:
    expected, size = write_landing(tmp_path, GiB, MiB)
    out = tmp_path / "out"
    started = time.monotonic()
    proc = psutil.Popen(
        [sys.executable, "-m", "reassembly", "run", str(tmp_path / "landing"), str(out), "--partitions", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    workers = PythonWorkers(proc)
    _, stderr = proc.communicate(timeout=1800)
    peak = workers.stop()
    print(f"\n1 GiB message: {time.monotonic() - started:.0f} s, Python workers' peak RSS {peak / MiB:.0f} MiB")
    assert proc.returncode == 0, stderr[-3000:]
    messages = pq.read_table(out / "messages").to_pylist()
    assert [(m["status"], m["original_length"], m["payload"]) for m in messages] == [("complete", size, None)]
    body = out / "payloads" / messages[0]["payload_path"]
    digest = hashlib.sha256()
    with open(body, "rb") as f:
        while block := f.read(64 * MiB):
            digest.update(block)
    assert digest.hexdigest() == expected
    assert pq.read_table(out / "quarantine").num_rows == 0
    assert 0 < peak < GiB
