"""The one framing every snapshot the library writes shares: a magic, a version byte, length-checked parts.

Layout::

    magic (4 bytes) | version (1 byte) | u64 length, part | u64 length, part | ... | tail

Each part is a big-endian u64 length and that many bytes; the optional tail is whatever follows the
last part, with no length of its own (its reader knows where its pieces end). The magic says what
the snapshot is of, the version which layout its parts follow. The three snapshot codecs
(:mod:`reassembly.assembler.snapshot`, :mod:`reassembly.resequencer.snapshot`,
:mod:`reassembly.resequencer.ordered_snapshot`) encode with :func:`frame` and decode with
:func:`unframe`, and describe what their parts and tail hold.

Why this layout and no other: it is, byte for byte, the layout of every snapshot these codecs
write (the assembler's ``b"SGAS\x01"`` reads as the magic ``b"SGAS"`` and version 1), so one
reader restores them all, those a Spark streaming checkpoint keeps in its state included, with no
second, legacy reader to keep and test. A new layout would add nothing these lack (a magic, a
version, checked lengths) and would cost that second reader. The tail costs one parameter and
keeps the resequencer's items (their lengths are in its document) and the ordered groups' second
snapshot as they are. A codec that changes what its parts hold takes a new version, not a new
framing.

Reading trusts nothing, since a snapshot is input like any other: the magic and the version are
checked before anything else, every length is checked against the bytes left before it is used
(a declared 2**63 costs nothing: nothing is sized or allocated by a length), parts are views into
the blob (no copy), and they are read one at a time, so a blob of many tiny parts never becomes a
list the size of the blob. Every failure is a :class:`~reassembly._checks.Corrupt` naming what is
wrong, with the numbers in ``details``; the codec's :func:`~reassembly._checks.restoring` turns it
into a STATE_ERROR at the restore's boundary.
"""

from __future__ import annotations

import struct
from collections.abc import Collection

from reassembly._checks import Corrupt

MAGIC_SIZE = 4
HEAD_SIZE = MAGIC_SIZE + 1  # magic and version
_LEN = struct.Struct(">Q")
LENGTH_SIZE = _LEN.size  # the bytes of the length before each part


def frame(magic: bytes, version: int, *parts: bytes, tail: bytes = b"") -> bytes:
    """``magic``, ``version``, each of ``parts`` after its length, then ``tail`` as it is."""
    if len(magic) != MAGIC_SIZE or not 0 <= version <= 0xFF:
        raise ValueError(f"a snapshot magic is {MAGIC_SIZE} bytes and its version one byte")
    out = [magic, bytes([version])]
    for part in parts:
        out += [_LEN.pack(len(part)), part]
    out.append(tail)
    return b"".join(out)


def unframe(blob: bytes, magic: bytes, versions: Collection[int]) -> Reader:
    """A reader of ``blob``'s parts once its magic is ``magic`` and its version one of ``versions``."""
    view = memoryview(blob).cast("B")
    if len(view) < HEAD_SIZE:
        raise Corrupt(f"truncated: {len(view)} bytes, a snapshot begins with {HEAD_SIZE}", length=len(view))
    if bytes(view[:MAGIC_SIZE]) != magic:
        raise Corrupt(f"bad magic {bytes(view[:MAGIC_SIZE])!r}, not {magic!r}")
    version = view[MAGIC_SIZE]
    if version not in versions:
        raise Corrupt(f"unsupported version {version} (readable: {sorted(versions)})", version=version)
    return Reader(view, version)


class Reader:
    """The parts of a framed snapshot, read in the order they were framed; each read checks its
    length against what is left and moves on."""

    def __init__(self, view: memoryview, version: int) -> None:
        self.version = version
        self._view = view
        self._pos = HEAD_SIZE

    @property
    def left(self) -> int:
        """Bytes not read yet."""
        return len(self._view) - self._pos

    def part(self, what: str = "part") -> memoryview:
        """The next part (a view into the blob)."""
        if self.left < _LEN.size:
            raise Corrupt(f"truncated: the length of a {what} needs {_LEN.size} bytes, {self.left} left")
        (n,) = _LEN.unpack_from(self._view, self._pos)
        self._pos += _LEN.size
        return self.take(n, what)

    def take(self, n: int, what: str = "part") -> memoryview:
        """The next ``n`` bytes of the tail, ``n`` read elsewhere (the codec's own document)."""
        if not 0 <= n <= self.left:
            raise Corrupt(f"truncated: a {what} of {n} bytes, {self.left} left", length=n, left=self.left)
        out = self._view[self._pos : self._pos + n]
        self._pos += n
        return out

    def rest(self) -> memoryview:
        """The tail: everything not read yet."""
        return self.take(self.left, "tail")

    def end(self) -> None:
        """Check that every byte was read: bytes after the last part are damage, not padding."""
        if self.left:
            raise Corrupt(f"{self.left} trailing bytes", trailing=self.left)
