"""Shared by the collector tests: landing files, reading batch files back through the assembler, the command."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from reassembly import Assembler, GroupComplete
from reassembly.collector import Rule
from reassembly.storage.collector import Storage, open_storage


def land(landing: Path, name: str, rows: list[tuple[str, bytes]]) -> None:
    """A landing file written under a hidden name and renamed into place, as producers should."""
    tmp = landing / f".{name}.tmp"
    table = pa.table(
        {
            "destination": pa.array([d for d, _ in rows], pa.string()),
            "payload": pa.array([p for _, p in rows], pa.binary()),
        }
    )
    pq.write_table(table, tmp)
    os.replace(tmp, landing / name)


def messages_for(prefix: str, destinations: list[str], n: int) -> list[tuple[str, bytes]]:
    return [(destinations[i % len(destinations)], f"{prefix}:{i}".encode()) for i in range(n)]


def read_batches(out: Path) -> dict[tuple[Path, bytes], list[bytes]]:
    """Every batch (file, GroupId) and its members, each reassembled as one complete Unit-of-Work group."""
    batches = {}
    files = [
        p for p in out.rglob("*.parquet") if not any(part.startswith((".", "_")) for part in p.relative_to(out).parts)
    ]
    for path in sorted(files):
        asm = Assembler(unit_of_work=True)
        events = [e for raw in pq.read_table(path).column("segment").to_pylist() for e in asm.receive(raw)]
        events += asm.close()
        assert all(isinstance(e, GroupComplete) for e in events), (path, events)
        for group in events:
            batches[path, group.group_id] = [bytes(m.payload) for m in group.messages]  # type: ignore[union-attr,arg-type]
    return batches


def assert_exactly_once(out: Path, sent: list[tuple[str, bytes]]) -> dict[tuple[Path, bytes], list[bytes]]:
    batches = read_batches(out)
    seen = Counter(p for members in batches.values() for p in members)
    twice = [p for p, n in seen.items() if n > 1]
    missing = {p for _, p in sent} - set(seen)
    assert not twice, f"{len(twice)} messages in two batches, e.g. {twice[:3]}"
    assert not missing, f"{len(missing)} messages in no batch, e.g. {sorted(missing)[:3]}"
    assert set(seen) == {p for _, p in sent}
    return batches


class Clock:
    """An injected clock the test moves by hand."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def collect_cmd(landing: Path, out: Path, rules: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "reassembly", "collect", str(landing), str(out), "--rules", rules, *extra]


def start(cmd: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def put_rules(storage: Storage) -> None:
    storage.put_rule(Rule("acme", "ftp-acme", max_messages=4, max_wait=60, stranded_after=120))
    storage.put_rule(Rule("globex", "ftp-globex", max_messages=10, max_wait=30, stranded_after=90))


def kill_9_then_restart(tmp_path: Path, db: str) -> None:
    """A collector process killed -9 in the middle of filling, more input, a second one: each message in one batch."""
    landing, out = tmp_path / "landing", tmp_path / "out"
    landing.mkdir()
    storage = open_storage(db)
    put_rules(storage)
    storage.close()
    sent = []
    for i in range(8):
        rows = messages_for(f"f{i}", ["acme", "globex", "initech"], 60)
        land(landing, f"part-{i:03d}.parquet", rows)
        sent += rows
    first = start(collect_cmd(landing, out, db, "--lease", "1s", "--poll", "0.05s"))
    assert first.stdout is not None
    lines = [first.stdout.readline() for _ in range(15)]  # mid-filling: 15 batches out, more to come
    assert all(line.startswith("batch ") for line in lines), lines
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    for i in range(8, 12):  # more input arrives while no collector runs
        rows = messages_for(f"f{i}", ["acme", "globex", "initech"], 60)
        land(landing, f"part-{i:03d}.parquet", rows)
        sent += rows
    second = subprocess.run(
        collect_cmd(landing, out, db, "--lease", "1s", "--poll", "0.05s", "--once"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert second.returncode == 0, second.stderr
    batches = assert_exactly_once(out, sent)
    limit = {"ftp-acme": 4, "ftp-globex": 10, "default": 100}
    assert all(len(members) <= limit[path.parent.name] for (path, _), members in batches.items())
    assert {path.parent.name for path, _ in batches} == set(limit)
