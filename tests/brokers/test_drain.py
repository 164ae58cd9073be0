"""``reassemble drain``: broker queue -> landing Parquet files -> ``reassemble run``.

Crashes at both dangerous points, as real processes against a real ActiveMQ:
* killed after a file was renamed into place but before its batch was acknowledged (a SIGKILL
  from the ``on_file`` hook): the batch is redelivered and landed again, so the job must count
  every segment landed twice (that file's, and any a later kill caught between rename and
  acknowledgement) as a duplicate;
* the command SIGKILLed mid-file: the temporary file is orphaned (removed by the next drain) and
  its segments, never acknowledged, are redelivered.
Then the job on the landing directory (in the shared Spark session; the ``reassemble run``
command as a process under ``-m slow``): every message complete, nothing missing.
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
from typing import Any, NamedTuple

import pytest

pytest.importorskip("proton")

from segmenter import segment, segment_group
from segmenter.brokers import open_consumer, open_sender
from tests.support.activemq_server import ActiveMQ, activemq, available, free_env

pytestmark = pytest.mark.skipif(not available(), reason="ActiveMQ (Debian package activemq) or java missing")

# A drain that SIGKILLs itself right after its first file became durable, before acknowledging it.
_KILL_AFTER_FIRST_FILE = """
import os, signal, sys
from pathlib import Path
from reassembly.brokers.drain import Drain, Rolling
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


class Drained(NamedTuple):
    landing: Path
    sent: int
    twice: int  # segments landed twice (redelivered after the drain published them)
    payloads: dict[tuple[bytes, int], bytes]


@pytest.fixture(scope="module")
def drained(broker: ActiveMQ, tmp_path_factory: pytest.TempPathFactory) -> Drained:
    """Mixed traffic through a drain killed twice (after a publish, mid-file), then restarted."""
    url, queue = broker.amqp_url, "drain.test"
    landing = tmp_path_factory.mktemp("drain") / "landing"
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
    # Kill it while a file is open: stop it, look, and kill only once a temporary file exists
    # (a fixed sleep would race with the drain: a fast one could be between files at the kill).
    deadline = time.monotonic() + 60
    while True:
        p.send_signal(signal.SIGSTOP)
        if list(landing.glob(".drain-*.tmp")) or time.monotonic() > deadline:
            break
        p.send_signal(signal.SIGCONT)
        time.sleep(0.005)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert list(landing.glob(".drain-*.tmp"))  # killed mid-file: its temporary file is orphaned

    # 3. Restarted; it removes the orphan and drains the rest, exiting when the queue stays empty.
    # Idle for 10 s, not 2: the killed drain's unacknowledged segments come back only once the broker
    # has noticed its connection is gone, and on a loaded machine a 2 s idle exit can come before
    # them (segments missing from the landing table, still on the queue).
    done = subprocess.run([*cmd, "--idle-exit", "10"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert not list(landing.glob(".drain-*.tmp"))
    rows = _landed(landing)
    assert set(rows) == {x.encode() for x in segs}  # nothing missing, nothing foreign
    # Landed twice: the first file (published, never acknowledged), and any file the SIGKILL caught
    # between its rename and the broker receiving its acknowledgements.
    assert len(rows) - len(segs) >= in_first_file
    c = open_consumer(url, queue)
    try:
        assert c.fetch(1.0) == []  # the queue is empty
    finally:
        c.close()
    return Drained(landing, len(segs), len(rows) - len(segs), payloads)


def _check_messages(msgs: list[dict[str, Any]], d: Drained) -> None:
    assert {r["status"] for r in msgs} == {"complete"}
    assert {(bytes(r["group_id"]), r["msg_seq_number"]): bytes(r["payload"]) for r in msgs} == d.payloads


def test_the_job_on_the_landing_table(spark: Any, drained: Drained) -> None:
    """The Spark job (shared session) on what the drain landed: every message complete, the
    redelivered segments counted as duplicates, the accounting identity holds."""
    from reassembly.spark import reassemble

    out = reassemble(spark.read.parquet(str(drained.landing))).combined.collect()
    msgs = [r.asDict() for r in out if r.kind == "message"]
    _check_messages(msgs, drained)
    assert [r for r in out if r.kind == "quarantine"] == []
    assert sum(r["segments_used"] for r in msgs) == drained.sent
    assert sum(r["duplicates"] for r in msgs) == drained.twice


@pytest.mark.slow
def test_reassemble_run_command_on_the_landing_directory(drained: Drained, tmp_path: Path) -> None:
    """The same through the command, ``reassemble run LANDING OUT``, as a process (its own Spark)."""
    out = tmp_path / "out"
    run = subprocess.run(
        _cli("run", str(drained.landing), str(out), "--no-progress"),
        env=free_env(), capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    m = re.search(r"segments: (\d+) in = (\d+) used \+ (\d+) quarantined \+ (\d+) duplicates: holds", run.stdout)
    assert m, run.stdout
    d = drained
    assert [int(x) for x in m.groups()] == [d.sent + d.twice, d.sent, 0, d.twice]
    import pyarrow.parquet as pq

    _check_messages(pq.read_table(out / "messages").to_pylist(), d)


def test_drain_over_stomp_rolls_by_time_and_lands_every_segment(broker: ActiveMQ, tmp_path: Path) -> None:
    """STOMP: files roll by age (2 s); SIGTERM (as Ctrl-C) finishes and publishes
    the current file before exiting 0; every segment sent is landed or still queued, exactly once."""
    url, queue, landing = broker.stomp_url, "drain.stomp", tmp_path / "landing"
    p = subprocess.Popen(
        _cli("drain", url, queue, str(landing), "--max-file-seconds", "2"),
        env=free_env(), stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    segs = segment(os.urandom(40_000), max_segment_size=4096)

    def wait_for(pattern: str) -> None:
        deadline = time.monotonic() + 60
        while not list(landing.glob(pattern)):
            assert time.monotonic() < deadline, f"no {pattern} in {landing}"
            time.sleep(0.02)

    with open_sender(url, queue) as s:
        for x in segs[:5]:
            s.send(x)
        s.flush()
        wait_for("*.parquet")  # nothing but age can roll a 20 KiB file: rolled by time
        for x in segs[5:]:
            s.send(x)
        s.flush()
    wait_for(".drain-*.tmp")  # the drain is writing the second file
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    c = open_consumer(url, queue)  # what arrived after the signal stays unacknowledged on the queue
    left: list[bytes] = []
    try:
        while batch := c.fetch(1.0):
            left += [bytes(d.body) for d in batch]
            for d in batch:
                d.accept()
    finally:
        c.close()
    assert sorted(_landed(landing) + left) == sorted(x.encode() for x in segs)  # each exactly once
    assert len(list(landing.glob("*.parquet"))) >= 2  # the open file was finished, not abandoned


def test_orphan_cleanup_takes_only_names_a_drain_writes(tmp_path: Path) -> None:
    """A stray file named like a temporary file (no pid, an empty or 23-digit one) stopped every
    drain from starting (ValueError / OverflowError); a host whose name extends ours ("vm" and
    "vm-7") could lose a live file. Only the exact pattern of a dead drain of this host goes."""
    import socket

    from reassembly.brokers.drain import remove_orphans

    host = socket.gethostname()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)  # exited: no process has this pid (for now)
    names = [
        f".drain-{host}-notapid.tmp",
        f".drain-{host}--1-x.tmp",
        f".drain-{host}-{'9' * 23}-0123456789ab.tmp",
        f".drain-{host}-0-0123456789ab.tmp",  # pid 0 would signal our own process group
        f".drain-{host}-7-{pid}-0123456789ab.tmp",  # host "<host>-7", pid {pid}
        f".drain-{host}-{os.getpid()}-0123456789ab.tmp",  # alive
    ]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    orphan = tmp_path / f".drain-{host}-{pid}-0123456789ab.tmp"
    orphan.write_bytes(b"x")
    assert remove_orphans(tmp_path) == 1 and not orphan.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names)


def test_a_body_that_is_not_binary_is_landed_as_bytes_never_a_crash(broker: ActiveMQ, tmp_path: Path) -> None:
    """AMQP values a foreign producer can send, each landed as bytes: text (any JMS TextMessage) must
    not raise TypeError out of fetch() at every restart (a poison message), nor an integer N become
    N zero bytes (4e9: MemoryError)."""
    from proton import Message
    from proton.utils import BlockingConnection

    queue = "drain.foreign"
    conn = BlockingConnection(broker.amqp_url.replace("amqp://", ""))
    sender = conn.create_sender(queue)
    for body in ("just text", 4 * 10**9, None, {"a": 1}, b"\x00bytes"):
        sender.send(Message(body=body, durable=True))
    conn.close()
    run = subprocess.run(_cli("drain", broker.amqp_url, queue, str(tmp_path / "landing"), "--idle-exit", "2"),
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr
    landed = _landed(tmp_path / "landing")
    assert landed[0] == b"just text" and landed[2] == b"" and landed[4] == b"\x00bytes"
    assert 0 < len(landed[1]) < 100 and 0 < len(landed[3]) < 100  # the encoded message, not 4e9 zeros
    left = open_consumer(broker.amqp_url, queue)
    try:
        assert left.fetch(1.0) == []  # every one acknowledged once landed
    finally:
        left.close()
