"""What the competing-consumer tests share: messages to send, member processes, waiting on the sink,
reading the members' logs, and the accounting checks against the store."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reassembly.segstore import open_store
from segmenter import segment
from tests.support.logs import complete_lines

if TYPE_CHECKING:
    from tests.support.kafka_cluster import ClientProcess

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
    return [line.split() for line in complete_lines(log)]


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


def connected(clients: Iterable[ClientProcess], ports: Iterable[int]) -> bool:
    """Every one of ``clients`` holds an established TCP connection to one of ``ports`` (its broker);
    a :func:`wait_for` condition for processes that write no start line. ``reassemble consume``
    connects while it opens its source and sets its SIGTERM handler (drain, exit 0) right after: a
    SIGTERM before that interrupts it (exit 130). A client that exited fails the wait at once."""
    import psutil

    wanted = set(ports)
    for client in clients:
        assert client.returncode is None, f"{client.name} exited {client.returncode}: {client.errors()[-2000:]}"
        try:
            proc = psutil.Process(client.pid)
            conns = (getattr(proc, "net_connections", None) or proc.connections)("tcp")  # psutil < 6: connections
        except psutil.NoSuchProcess:
            return False  # exited since: the next poll's returncode says so
        if not any(c.raddr and c.raddr.port in wanted and c.status == psutil.CONN_ESTABLISHED for c in conns):
            return False
    return True


def started(log: Path, names: list[str], clients: Iterable[ClientProcess]) -> bool:
    """Every one of ``names`` logged its start (a :func:`wait_for` condition). A member that died
    before its start fails the wait at once, with its stderr, rather than after the timeout."""
    up = {w[1] for w in log_lines(log) if w[0] == "start"}
    for client in clients:
        assert client.name in up or client.returncode is None, (
            f"{client.name} exited {client.returncode} before it started: {client.errors()[-2000:]}"
        )
    return up >= set(names)


class Restarts:
    """The kill tests' members (their sink and log under ``tmp``): each one found SIGKILLed at its
    drawn point is restarted once, as ``<name>r``, by ``start``; :meth:`check` stops the others and
    checks that nothing was lost."""

    def __init__(
        self, members: dict[str, ClientProcess], start: Callable[[str], ClientProcess], tmp: Path, sent: Sent
    ) -> None:
        self.members = members
        self.start = start
        self.tmp = tmp
        self.sent = sent
        self.restarted: set[str] = set()

    def __call__(self) -> bool:
        """Restart the dead; true once every message is in the sink (a :func:`wait_for` condition)."""
        for name, proc in list(self.members.items()):
            if proc.returncode is not None and name not in self.restarted:
                assert proc.returncode == -9, proc.errors()[-2000:]
                self.restarted.add(name)
                self.members[name] = self.start(f"{name}r")
        return len(in_sink(self.tmp / "sink")) == len(self.sent.payloads)

    def check(self, store: str) -> None:
        """The living members stop cleanly; every message in the sink byte-identical, once; the store
        empty; every kill restarted; a claimant killed holding its lease had its unit taken over."""
        log = self.tmp / "log"
        for proc in self.members.values():
            if proc.returncode is None:
                assert proc.terminate() == 0, proc.errors()[-2000:]
        kills = [w for w in log_lines(log) if w[0] == "kill"]
        check_sink(self.tmp / "sink", self.sent)
        counters = check_store(store, self.sent, log)
        sinks = [w for w in log_lines(log) if w[0] == "sink"]
        assert len(sinks) == len(self.sent.payloads)  # exactly once to the sink keyed by message id
        # 12 claims over 3 members: one member makes at least 4, so at least one drawn kill happens
        assert kills and len(kills) == len(self.restarted)
        if any(k[1] != "written" for k in kills):  # a claimant died holding its lease: another took the unit over
            assert counters.get("leases_expired", 0) >= 1, counters
