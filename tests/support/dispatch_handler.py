"""Handlers for the ``reassemble consume`` tests (``--handler tests.support.dispatch_handler:handle``).

:func:`handle` sleeps a random while (up to ``DISPATCH_SLEEP_MS`` ms), fails at random
(``DISPATCH_FAIL_RATE``) and always fails a poisoned message (its payload starts with ``POISON``).
Every attempt appends two lines to ``DISPATCH_LOG`` (one ``os.write`` each on an ``O_APPEND``
descriptor, so lines of several processes never mix): ``start`` before the work and ``end`` after
it, with the process id, the message's GroupId and MsgSeqNumber, its segments' (partition, offset)
and the wall-clock time, from which the test checks that no two handlers ever held one group at
once, that a group's messages went in order and that every commit was below every unsettled message.

:func:`digest` (the share-group test) appends one ``digest`` line per message with the SHA-256 of
its payload, and fails the first attempt of every third message (by MsgSeqNumber and GroupId):
retries then wait in the dispatcher while the store holds the claim.

:func:`slow` (the budget test) waits for a file to appear (``DISPATCH_GATE``) before it returns:
the test holds every handler until it has seen the consumer pause its fetching.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import threading
import time
from typing import Any

# The open log, by path: the command also runs in the test process (tests/support/command.py), where
# one test's handlers must not write into an earlier test's log. The lock: handlers run in threads.
_fd: tuple[str, int] | None = None
_lock = threading.Lock()


def _append(line: dict[str, Any]) -> None:
    global _fd
    path = os.environ["DISPATCH_LOG"]
    with _lock:
        if _fd is None or _fd[0] != path:
            if _fd is not None:
                os.close(_fd[1])
            _fd = (path, os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
        fd = _fd[1]
    os.write(fd, (json.dumps(line) + "\n").encode())


def _log(kind: str, message: Any, **extra: Any) -> None:
    line = {
        "kind": kind,
        "pid": os.getpid(),
        "group": message.group_id.hex(),
        "seq": message.msg_seq_number,
        "positions": [[o.partition[1], o.position] for o in message.positions],
        "time": time.time(),
        **extra,
    }
    _append(line)


def handle(message: Any) -> None:
    """Sleep at random, fail at random; a poisoned message always fails."""
    _log("start", message)
    ok = False
    try:
        time.sleep(random.uniform(0, float(os.environ.get("DISPATCH_SLEEP_MS", "20")) / 1000))
        if bytes(message.payload[:6]) == b"POISON":
            raise ValueError("poisoned message")
        if random.random() < float(os.environ.get("DISPATCH_FAIL_RATE", "0.2")):
            raise RuntimeError("a transient failure")
        ok = True
    finally:
        _log("end", message, ok=ok)


def slow(message: Any) -> None:
    """Hold until the gate file exists (the test opens it once it saw the fetch paused)."""
    _log("start", message)
    gate = os.environ["DISPATCH_GATE"]
    while not os.path.exists(gate):  # polls a file the test creates: the handler's own pace, not the test's
        time.sleep(0.01)
    _log("end", message, ok=True)


async def handle_async(message: Any) -> None:
    """:func:`handle` for ``--runner asyncio``: the same log lines, no sleep, never failing."""
    _log("start", message)
    _log("end", message, ok=True)


_failed: set[bytes] = set()


def digest(message: Any) -> None:
    """Log the payload's SHA-256 once the message is handled; every third GroupId fails its first attempt."""
    gid = bytes(message.group_id)
    if gid[-1] % 3 == 0 and gid not in _failed:
        _failed.add(gid)
        raise RuntimeError("a transient failure")
    line = {
        "kind": "digest",
        "pid": os.getpid(),
        "group": gid.hex(),
        "seq": message.msg_seq_number,
        "sha256": hashlib.sha256(bytes(message.payload)).hexdigest(),
    }
    _append(line)
