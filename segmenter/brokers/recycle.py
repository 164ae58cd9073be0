"""Receive buffers reused once nothing refers to them any more.

Why: a receiver that *holds* what it received (the segments of a message not yet complete, a
drain's batch until its file is durable) gets every new body in fresh memory. glibc gives a
freed block back to the kernel once more than twice its mmap threshold is free at the top of the
heap, so when eight 1 MiB bodies are released together the next eight are page-faulted in again,
4 KiB at a time, each page zeroed by the kernel before the copy overwrites it. Measured here
(``bench/README.md``, "Broker"): copying a 1 MiB body into fresh memory costs 470 µs against
35 µs into memory used before; 21 against 2.4 µs at 64 KiB. A consumer that hands each body
over and drops it (the floor) never sees this; one that holds eight does, on every body.

A :class:`BufferPool` keeps the buffers and lends them out as read-only views. A buffer is
lent again only when its reference count says that nothing but the pool refers to it: no view,
slice or object built on it is alive anywhere (every ``memoryview`` of a ``bytearray``, sliced or
not, holds one reference to it until the last view is gone). So reuse can never change bytes
that somebody can still see; that check is CPython's reference counting, which this relies on.
"""

from __future__ import annotations

import sys
from collections import deque

from ..buffers import Buffer

MIN_SIZE = 16 << 10  # smaller bodies: plain bytes (small blocks come from reused heap bins)
MAX_BYTES = 64 << 20  # buffers one pool keeps at most (in use and free); beyond: plain bytes
_TRIES = 4  # buffers of a size looked at per copy before a new one is made
_FREE = 3  # getrefcount of a pooled buffer held only by its ring: the ring, the local, the argument


class BufferPool:
    """Copies of received bodies into buffers that are reused once unreferenced.

    A body gets a buffer of its length rounded up to a multiple of an eighth of its power of two
    (64 KiB stays 64 KiB, 1 MiB + 84 bytes takes 1.25 MiB: never more than a quarter wasted); each
    size has a ring that is looked at oldest first, since bodies are mostly released in about the
    order they arrived. A
    body smaller than ``min_size``, or one that would take the pool over ``max_bytes``, is copied
    into plain ``bytes``: the pool bounds what it keeps, never what it can receive.
    """

    def __init__(self, max_bytes: int = MAX_BYTES, min_size: int = MIN_SIZE) -> None:
        self.max_bytes = max_bytes
        self.min_size = min_size
        self.kept = 0  # bytes of every buffer the pool keeps
        self.reused = 0  # copies into a buffer used before
        self._rings: dict[int, deque[bytearray]] = {}

    def copy(self, data: Buffer) -> bytes | memoryview:
        """``data``'s bytes in a buffer of their own: read-only, valid for as long as it is referenced."""
        n = len(data)
        if n < self.min_size:
            return bytes(data)
        step = 1 << max(0, n.bit_length() - 3)
        size = -(-n // step) * step
        ring = self._rings.get(size)
        if ring is None:
            ring = self._rings[size] = deque()
        for _ in range(min(_TRIES, len(ring))):
            buf = ring[0]
            ring.rotate(-1)
            if sys.getrefcount(buf) == _FREE:
                self.reused += 1
                break
        else:
            if self.kept + size > self.max_bytes:
                return bytes(data)
            buf = bytearray(size)
            ring.append(buf)
            self.kept += size
        view = memoryview(buf)
        view[:n] = data
        return view[:n].toreadonly()
