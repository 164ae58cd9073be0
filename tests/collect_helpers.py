"""Shared by the collector tests: landing files, reading batch files back through the assembler, the command."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from reassembly import Assembler, GroupComplete


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


def read_batches(out: Path) -> dict[Path, list[bytes]]:
    """Each batch file's members, reassembled as one Unit-of-Work group (asserted complete)."""
    batches = {}
    for path in sorted(p for p in out.rglob("*.parquet") if not p.name.startswith(".")):
        asm = Assembler(unit_of_work=True)
        events = [e for raw in pq.read_table(path).column("segment").to_pylist() for e in asm.receive(raw)]
        events += asm.close()
        groups = [e for e in events if isinstance(e, GroupComplete)]
        assert len(groups) == 1 and len(events) == 1, (path, events)
        batches[path] = [bytes(m.payload) for m in groups[0].messages]  # type: ignore[arg-type]
    return batches


def assert_exactly_once(out: Path, sent: list[tuple[str, bytes]]) -> dict[Path, list[bytes]]:
    batches = read_batches(out)
    seen = Counter(p for members in batches.values() for p in members)
    twice = [p for p, n in seen.items() if n > 1]
    missing = {p for _, p in sent} - set(seen)
    assert not twice, f"{len(twice)} messages in two batches, e.g. {twice[:3]}"
    assert not missing, f"{len(missing)} messages in no batch, e.g. {sorted(missing)[:3]}"
    assert set(seen) == {p for _, p in sent}
    return batches


def collect_cmd(landing: Path, out: Path, rules: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "reassembly", "collect", str(landing), str(out), "--rules", rules, *extra]


def start(cmd: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
