"""Byte equality of buffers at ``memcmp`` speed.

Why: CPython 3.11 compares two ``memoryview``s (and ``bytes`` with a ``memoryview``) item by
item, unpacking every byte: 2.6 ms per MiB here, against about 0.1 ms for ``bytes == bytes``
(``memcmp``) after one copy of each side. Segment data are views (of a delivery, of an Arrow
buffer), and the assembler compares them whenever a copy arrives twice: with ``==`` one duplicate
1 MiB segment costs 3.3 ms, twenty times the segment itself (``bench/README.md``, "Broker").
"""

from __future__ import annotations

Buffer = bytes | bytearray | memoryview  # what every bytes-taking call here accepts

# Compared a chunk at a time: a copy this small reuses memory just freed (still mapped and cached),
# where a copy of a whole 1 MiB view is page-faulted in (segmenter/brokers/recycle.py says why).
_CHUNK = 64 << 10


def same_bytes(a: Buffer, b: Buffer) -> bool:
    """``a`` and ``b`` hold the same bytes (lengths first: unequal lengths copy nothing)."""
    va, vb = memoryview(a).cast("B"), memoryview(b).cast("B")
    n = len(va)
    if n != len(vb):
        return False
    if n <= _CHUNK:
        return _plain(a, va) == _plain(b, vb)
    return all(va[i : i + _CHUNK].tobytes() == vb[i : i + _CHUNK].tobytes() for i in range(0, n, _CHUNK))


def _plain(x: Buffer, view: memoryview) -> bytes:
    return x if type(x) is bytes else view.tobytes()
