"""``reassemble drain``: broker queue -> landing Parquet files -> ``reassemble run`` (issue 13).

Crashes at both dangerous points, as real processes against a real ActiveMQ:
* killed after a file was renamed into place but before its batch was acknowledged (a SIGKILL
  from the ``on_file`` hook): the batch is redelivered and landed again, so ``reassemble run``
  must count exactly those segments as duplicates;
* the command SIGKILLed mid-file: the temporary file is orphaned (removed by the next drain) and
  its segments, never acknowledged, are redelivered.
Then ``reassemble run`` on the landing directory: every message complete, nothing missing.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("proton")
pytest.importorskip("stomp")

from activemq_server import ActiveMQ, activemq, available, free_env

from segmenter import segment, segment_group
from segmenter.brokers import open_consumer, open_sender

pytestmark = pytest.mark.skipif(not available(), reason="ActiveMQ (Debian package activemq) or java missing")

# A drain that SIGKILLs itself right after its first file became durable, before acknowledging it.
_KILL_AFTER_FIRST_FILE = """
import os, signal, sys
from pathlib import Path
from reassembly.drain import Drain, Rolling
from segmenter.brokers import open_consumer
url, queue, landing = sys.argv[1:4]
drain = Drain(open_consumer(url, queue), Path(landing), Rolling(max_bytes=64 << 10),
              on_file=lambda path, n: (print(n, flush=True), os.kill(os.getpid(), signal.SIGKILL)))
drain.run(lambda: False)
"""


@pytest.fixture(scope="module")
def broker() -> Iterator[ActiveMQ]:
    with activemq() as b:
        yield b


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "reassembly", *args]


def _landed(landing: Path) -> list[bytes]:
    import pyarrow.parquet as pq

    files = sorted(landing.glob("*.parquet"))
    return [bytes(b) for f in files for b in pq.read_table(f, columns=["segment"]).column(0).to_pylist()]


def test_drain_killed_twice_then_reassemble_run(broker: ActiveMQ, tmp_path: Path) -> None:
    url, queue, landing = broker.amqp_url, "drain.test", tmp_path / "landing"
    rng = random.Random(7)
    payloads: dict[tuple[bytes, int], bytes] = {}
    segs = []
    for i in range(120):
        if i % 4 == 0:
            group = [rng.randbytes(rng.randint(1, 12_000)) for _ in range(3)]
            got = list(segment_group(group, max_segment_size=2048))
            payloads.update({(got[0].header.group_id, n): p for n, p in enumerate(group, 1)})
        else:
            p = rng.randbytes(rng.randint(0, 20_000))
            got = segment(p, max_segment_size=2048)
            payloads[(got[0].header.group_id, 1)] = p
        segs += got
    rng.shuffle(segs)
    with open_sender(url, queue) as s:
        for x in segs:
            s.send(x)
    sent = len(segs)
    env = free_env()

    # 1. Killed between publishing its first file and acknowledging it.
    first = subprocess.run(
        [sys.executable, "-c", _KILL_AFTER_FIRST_FILE, url, queue, str(landing)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert first.returncode == -signal.SIGKILL
    in_first_file = int(first.stdout.split()[0])
    assert len(_landed(landing)) == in_first_file > 0

    # 2. The command, SIGKILLed while writing a file (small files, so several land first).
    cmd = _cli("drain", url, queue, str(landing), "--max-file-bytes", str(32 << 10), "--prefetch", "50")
    p = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    assert p.stderr is not None
    published = 0
    for line in p.stderr:
        published += " segments" in line
        if published == 3:
            break
    time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    orphans = list(landing.glob(".drain-*.tmp"))

    # 3. Restarted; it removes the orphan and drains the rest, exiting when the queue stays empty.
    done = subprocess.run(
        [*cmd, "--idle-exit", "2"], env=env, capture_output=True, text=True, timeout=300
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert not list(landing.glob(".drain-*.tmp"))
    rows = _landed(landing)
    encoded = {x.encode() for x in segs}
    assert set(rows) == encoded  # nothing missing, nothing foreign
    assert len(rows) - sent == in_first_file  # exactly the unacknowledged-but-landed file, twice
    assert orphans  # it was killed mid-file: the restart removed the orphan
    c = open_consumer(url, queue)
    try:
        assert c.fetch(1.0) == []
    finally:
        c.close()

    # 4. The Spark job on the landing directory: every message complete, the redelivered segments
    # counted as duplicates, the accounting identity holds.
    out = tmp_path / "out"
    run = subprocess.run(
        _cli("run", str(landing), str(out), "--no-progress"), env=env, capture_output=True, text=True, timeout=900
    )
    assert run.returncode == 0, run.stderr
    m = re.search(r"segments: (\d+) in = (\d+) used \+ (\d+) quarantined \+ (\d+) duplicates: holds", run.stdout)
    assert m, run.stdout
    assert [int(x) for x in m.groups()] == [len(rows), sent, 0, in_first_file]
    import pyarrow.parquet as pq

    msgs = pq.read_table(out / "messages").to_pylist()
    assert {r["status"] for r in msgs} == {"complete"}
    assert {(bytes(r["group_id"]), r["msg_seq_number"]): bytes(r["payload"]) for r in msgs} == payloads


def test_drain_over_stomp_rolls_by_time_and_lands_every_segment(broker: ActiveMQ, tmp_path: Path) -> None:
    """STOMP, a slow trickle: files roll by age (1 s), the drain stops on SIGTERM after finishing
    its current file, and everything sent is landed exactly once."""
    url, queue, landing = broker.stomp_url, "drain.stomp", tmp_path / "landing"
    p = subprocess.Popen(
        _cli("drain", url, queue, str(landing), "--max-file-seconds", "1"),
        env=free_env(), stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    segs = segment(os.urandom(40_000), max_segment_size=4096)
    time.sleep(1.0)
    with open_sender(url, queue) as s:
        for x in segs:
            s.send(x)
            s.flush()
            time.sleep(0.25)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert sorted(_landed(landing)) == sorted(x.encode() for x in segs)
    assert len(list(landing.glob("*.parquet"))) >= 2  # rolled by time, not only at the end
