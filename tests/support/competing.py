"""What the competing-consumer tests share: messages to send, member processes, waiting on the sink,
reading the members' logs, and the accounting checks against the store."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reassembly.segstore import open_store
from segmenter import segment

PROBE = b"probe"  # what priming a share group sends: not a segment, quarantined if a member reads it


@dataclass(frozen=True)
class Sent:
    """The messages a test sends: GroupId -> payload, and each message's encoded segments."""

    payloads: dict[bytes, bytes]
    segments: dict[bytes, list[bytes]]

    @property
    def total(self) -> int:
        return sum(len(s) for s in self.segments.values())


def messages(count: int, size: int, segment_size: int, seed: int = 0) -> Sent:
    """``count`` random payloads of about ``size`` bytes cut into segments of ``segment_size``."""
    payloads: dict[bytes, bytes] = {}
    segs: dict[bytes, list[bytes]] = {}
    for i in range(count):
        gid = (seed * 1000 + i).to_bytes(8, "big") + os.urandom(16)
        payload = os.urandom(size - 97 * i % 500)
        payloads[gid] = payload
        segs[gid] = [s.encode() for s in segment(payload, segment_size, group_id=gid)]
    return Sent(payloads, segs)


def wait_for(what: str, ok: Callable[[], bool], timeout: float) -> None:
    """Poll ``ok`` (a file, a log, the store) until true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not ok():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.05)


def in_sink(sink: Path) -> set[str]:
    return {p.name for p in sink.iterdir() if not p.name.startswith(".")}


def log_lines(log: Path) -> list[list[str]]:
    return [line.split() for line in log.read_text().splitlines()] if log.exists() else []


def spread(log: Path) -> dict[str, set[str]]:
    """GroupId hex -> the members that stored a segment of it (first copies and variants)."""
    out: dict[str, set[str]] = {}
    for w in log_lines(log):
        if w[0] == "w" and w[5] in ("stored", "variant"):
            out.setdefault(w[2], set()).add(w[1])
    return out


def check_sink(sink: Path, sent: Sent) -> None:
    """Every message in the sink, byte-identical, and nothing else."""
    expected = {f"{gid.hex()}-1": payload for gid, payload in sent.payloads.items()}
    assert in_sink(sink) == set(expected)
    for name, payload in expected.items():
        assert (sink / name).read_bytes() == payload, f"{name} differs"


def check_store(url: str, sent: Sent, log: Path) -> dict[str, Any]:
    """The store is empty and every segment is accounted for: used once (a tombstone), or a
    duplicate; the only records quarantined are priming probes. The store's counters returned."""
    with open_store(url, member="checker") as store:
        stats = store.stats()
        quarantined = store.quarantined()
    assert (stats.units, stats.segments, stats.bytes) == (0, 0, 0), stats
    assert all(q[5] == PROBE for q in quarantined), [q[3] for q in quarantined]
    c = stats.counters
    assert c.get("used", 0) == sent.total, c
    assert c.get("delivered", 0) == len(sent.payloads), c
    written = [w for w in log_lines(log) if w[0] == "w"]
    outcomes: dict[str, int] = {}
    for w in written:
        outcomes[w[5]] = outcomes.get(w[5], 0) + 1
    # every record a member wrote was stored once or judged a duplicate (or is a quarantined probe)
    assert outcomes.get("stored", 0) + outcomes.get("variant", 0) == sent.total, outcomes
    assert outcomes.get("quarantined", 0) == len(quarantined), outcomes
    assert outcomes.get("duplicate", 0) == c.get("duplicates", 0), (outcomes, c)
    return dict(c)
