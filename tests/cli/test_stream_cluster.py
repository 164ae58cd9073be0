"""``reassemble stream`` on the loopback standalone cluster (two one-core workers).

The checkpoint, the state's RocksDB snapshots and the output live on a
directory both workers see (here: the same machine's temporary directory).
Two available-now runs: messages straddling them complete in the second.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reassembly.spark.stream.functions import read_committed
from reassembly.spark.testdata import generate
from tests.spark.test_stream import land, stream_command

pytestmark = pytest.mark.cluster


def _stream(master: str, base: Path) -> None:
    done = subprocess.run(
        stream_command(base, "--master", master, "--partitions", "2"),
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rows in; messages" in done.stdout


# Slow: the default run keeps the batch job (tests/cli/test_deploy.py) and spark-submit
# (tests/cli/test_submit.py) on the standalone cluster; the stream's state store there is this variant.
@pytest.mark.slow
def test_stream_runs_on_a_standalone_cluster(cluster: str, tmp_path: Path) -> None:  # cluster: tests/cli/conftest.py
    ds = generate(n_messages=12, segments_per_message=3, segment_size=2048, groups=2, faults=False)
    (tmp_path / "landing").mkdir()
    half = len(ds.rows) // 2
    land(tmp_path / "landing", "a", ds.rows[:half], time.time() - 10)
    _stream(cluster, tmp_path)
    land(tmp_path / "landing", "b", ds.rows[half:], time.time())
    _stream(cluster, tmp_path)
    got = {(m["group_id"], m["msg_seq_number"]): m for m in read_committed(tmp_path / "out", "message")}
    assert {k: m["status"] for k, m in got.items()} == {k: "complete" for k in ds.expected}
    assert all(got[k]["payload"] == e.payload for k, e in ds.expected.items())
