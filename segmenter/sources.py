"""Payload inputs as bytes: a buffer as a flat view of its bytes, a binary source read to its end.

Why a module: a typed or strided buffer counted by ``len`` gives items, not bytes (an
``array('I')`` view of 200 bytes has length 50), and a file's ``read`` result means three
things (bytes; ``b""``, the end; ``None``, no data *yet* from a non-blocking source) while a
short read means nothing. Taking a short read or ``None`` for the end sends a truncated object
flagged complete, with checksums that vouch for it.
"""

from __future__ import annotations

from typing import BinaryIO

from .errors import Reason, SegmentationError


def argument_error(why: str, **details: object) -> SegmentationError:
    """An input or option the call cannot use (9020)."""
    return SegmentationError(why, reason=Reason.ARGUMENT_ERROR, **details)


def byte_view(data: object) -> memoryview:
    """Any bytes-like object as a flat view of its bytes (a strided or multi-dimensional one is
    copied into one: the only case that needs a copy); anything else is refused."""
    try:
        view = memoryview(data)  # type: ignore[arg-type]
    except TypeError:
        raise argument_error(f"a payload must be bytes-like or a binary file, not {type(data).__name__}") from None
    if not view.c_contiguous:
        view = memoryview(view.tobytes())
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def read_some(f: BinaryIO, size: int) -> bytes:
    """One read of at most ``size`` bytes; ``b""`` only at the source's end."""
    chunk = f.read(size)
    if chunk is None:
        raise argument_error("the source returned no data (non-blocking, not at its end): use a blocking source")
    if not isinstance(chunk, (bytes, bytearray, memoryview)):
        raise argument_error(f"the source returned {type(chunk).__name__}, not bytes: open it in binary mode")
    if len(chunk) > size:  # a source breaking the read contract: taking it would misplace the chunk ends
        raise argument_error(f"the source returned {len(chunk)} bytes when asked for at most {size}")
    return chunk if isinstance(chunk, bytes) else bytes(chunk)


def read_full(f: BinaryIO, size: int) -> bytes:
    """``size`` bytes, fewer only at the source's end (a pipe or socket returns what it has)."""
    first = read_some(f, size)
    if len(first) == size or not first:
        return first
    parts = [first]
    got = len(first)
    while got < size and (more := read_some(f, size - got)):
        parts.append(more)
        got += len(more)
    return b"".join(parts)
