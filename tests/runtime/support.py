"""Messages, recording handlers and checks shared by the runner tests.

The recording handlers write one line per start and per end of a handler call (with the
system-wide monotonic clock, comparable across processes) to a file opened for appending: the
checks read the log back, so the same checks serve threads, tasks and processes.
"""

from __future__ import annotations

import itertools
import os
import time
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path

from reassembly.assembler import GroupComplete, MessageComplete
from segmenter.flags import MsgFlags


def message(gid: int, seq: int, *, size: int = 64, last: bool = False, partition: str = "p", offset: int = 0,
            grouped: bool = True) -> MessageComplete:  # fmt: skip
    """A whole message of group ``gid`` (24-byte GroupId), its payload a pattern naming it."""
    group_id = gid.to_bytes(24, "big")
    flags = (MsgFlags.LAST_MSG_IN_GROUP if last else MsgFlags.MSG_IN_GROUP) if grouped else MsgFlags.NONE
    stem = f"{gid}:{seq}:".encode()
    payload = (stem * (size // len(stem) + 1))[:size]
    from reassembly.assembler.positions import Origin

    return MessageComplete(group_id, seq, payload, int(flags), 1, 0, size, size, None, (Origin(partition, offset),))


def interleaved(
    sizes: Sequence[int], *, size: int = 64, partitions: Sequence[str] = ("p",), first: int = 0
) -> list[MessageComplete]:
    """Groups of these sizes (numbered from ``first``), their messages interleaved round-robin (as
    arrivals mix groups), each on the partition of its group, offsets increasing per partition."""
    out: list[MessageComplete] = []
    offsets = dict.fromkeys(partitions, 0)
    longest = max(sizes, default=0)
    for seq in range(1, longest + 1):
        for gid, n in enumerate(sizes, first):
            if seq <= n:
                p = partitions[gid % len(partitions)]
                out.append(message(gid, seq, size=size, last=seq == n, partition=p, offset=offsets[p]))
                offsets[p] += 1
    return out


def name(m: object) -> tuple[int, int]:
    """(group, seq) of a MessageComplete, (group, 0) of a GroupComplete."""
    if isinstance(m, GroupComplete):
        return int.from_bytes(m.group_id, "big"), 0
    assert isinstance(m, MessageComplete)
    return int.from_bytes(m.group_id, "big"), m.msg_seq_number


def record(log: str, m: object, what: str, extra: str = "") -> None:
    g, s = name(m)
    line = f"{what} {g} {s} {time.monotonic():.9f} {os.getpid()} {extra}\n".encode()
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)  # one write of a short line with O_APPEND: whole, never interleaved
    finally:
        os.close(fd)


def recording(log: str, m: object, sleep: float = 0.0, poison: frozenset[tuple[int, int]] = frozenset()) -> None:
    """A handler (top-level: picklable with functools.partial): log start, work, maybe fail, log end.
    The end line carries the payload's CRC-32 (what the worker saw) and ``ok`` or ``fail``."""
    record(log, m, "start")
    if sleep:
        time.sleep(sleep)
    crc = zlib.crc32(bytes(m.payload)) if isinstance(m, MessageComplete) else 0
    if name(m) in poison:
        record(log, m, "end", f"{crc} fail")
        raise ValueError(f"poison {name(m)}")
    record(log, m, "end", f"{crc} ok")


def read_log(log: str | Path) -> list[tuple[str, int, int, float, str]]:
    """(what, group, seq, time, rest) per line."""
    out = []
    for line in Path(log).read_text().splitlines():
        what, g, s, t, _pid, *rest = line.split(" ")
        out.append((what, int(g), int(s), float(t), " ".join(rest)))
    return out


def check_log(log: str | Path, expected: Iterable[tuple[int, int]], poison: Iterable[tuple[int, int]] = (),
              attempts: int = 1) -> None:  # fmt: skip
    """Every expected message handled ok exactly once, each poisoned one failing ``attempts`` times;
    within a group, messages in order (every attempt of one before any of the next) and never two
    handler calls at once."""
    lines = read_log(log)
    poison = set(poison)
    ends = [(g, s, rest.split()[-1]) for what, g, s, _t, rest in lines if what == "end"]
    ok = [(g, s) for g, s, r in ends if r == "ok"]
    assert sorted(ok) == sorted(set(expected) - poison), "each message handled ok exactly once"
    for p in poison:
        assert sum(1 for g, s, r in ends if (g, s) == p and r == "fail") == attempts, p
    per_group: dict[int, list[tuple[float, float, int]]] = {}
    starts: dict[tuple[int, int], list[float]] = {}
    for what, g, s, t, _rest in lines:
        if what == "start":
            starts.setdefault((g, s), []).append(t)
        else:
            per_group.setdefault(g, []).append((starts[(g, s)].pop(0), t, s))
    for g, calls in per_group.items():
        calls.sort()
        for (_a0, a1, sa), (b0, _b1, sb) in itertools.pairwise(calls):
            assert a1 <= b0, f"group {g}: two handlers at once ({sa} and {sb})"
            assert sa <= sb, f"group {g}: {sb} handled before {sa}"
