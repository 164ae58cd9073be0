"""segmenter.buffers.same_bytes: byte equality at memcmp speed, whatever the buffer types, lengths
and offsets (chunked above 64 KiB): always the answer ``bytes(a) == bytes(b)`` gives."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from segmenter.buffers import same_bytes

_KINDS = st.sampled_from(["bytes", "bytearray", "view", "readonly view", "slice"])


def _as(kind: str, data: bytes) -> bytes | bytearray | memoryview:
    if kind == "bytes":
        return data
    if kind == "bytearray":
        return bytearray(data)
    if kind == "view":
        return memoryview(bytearray(data))
    if kind == "readonly view":
        return memoryview(data).toreadonly()
    return memoryview(b"pad" + data + b"pad")[3:-3]


@settings(max_examples=200, deadline=None)
@given(
    size=st.sampled_from([0, 1, 100, (64 << 10) - 1, 64 << 10, (64 << 10) + 1, 200_000]),
    flip=st.one_of(st.none(), st.integers(0, 199_999)),
    trim=st.booleans(),
    ka=_KINDS,
    kb=_KINDS,
    seed=st.integers(0, 2**16),
)
def test_same_bytes_is_bytes_equality(size: int, flip: int | None, trim: bool, ka: str, kb: str, seed: int) -> None:
    a = bytes((seed + i * 7) % 256 for i in range(min(size, 1000))) * (size // 1000 + 1)
    a = a[:size]
    b = bytearray(a)
    if flip is not None and size:
        b[flip % size] ^= 1 << (seed % 8)
    if trim and size:
        b = b[:-1]
    x, y = _as(ka, a), _as(kb, bytes(b))
    assert same_bytes(x, y) == (a == bytes(b)) == same_bytes(y, x)
