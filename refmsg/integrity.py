"""The integrity block: checksums carried inside an MQRMH without breaking it.

MQ readers find the four strings through their offsets and skip everything
else inside ``StrucLength``. This library puts a 32-byte block in that
unreferenced space, ending exactly at ``StrucLength`` (layout in
docs/how-to/refmsg.md), all big-endian whatever the header's Encoding:

====== ==== ===========================================================
offset size field
====== ==== ===========================================================
0      4    magic ``b"SGRI"``
4      1    version (1)
5      1    checksum algorithm of the chunk/object checksums (1 CRC-32, 2 CRC-32C)
6      1    flags: bit 0 object length and checksum present
7      1    reserved, 0
8      4    block length (32, or 32 + n with n bytes of digest records before it)
12     4    chunk checksum: of the DataLogicalLength bytes this message describes
16     8    object length (meaningful with flag bit 0)
24     4    object checksum: of the whole object (with flag bit 0)
28     4    header checksum: CRC-32/IEEE of MQRMH bytes [0, StrucLength - 4)
====== ==== ===========================================================

The header checksum covers the whole MQRMH as sent (fixed part, strings, gaps
and this block), so any bit flipped anywhere in the header is detected.

Optional whole-object SHA-256 / HMAC-SHA-256 (:mod:`segmenter.digest`) travel
as the same TLV records as in a segment's header extension, placed right
BEFORE the 32-byte block; the block length then counts them (32 + n), so a
reader still finds the block at ``StrucLength - 32``. The chunker puts them on
the LAST message; :class:`ObjectCheck` verifies at completion.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import NamedTuple

from segmenter.checksum import ChecksumAlgorithm, checksum
from segmenter.digest import NO_DIGESTS, NO_POLICY, DigestPolicy, Digests, Hasher, parse_extension
from segmenter.errors import ChecksumError, Reason

from .errors import RmhError
from .header import LENGTH_1

Buffer = bytes | bytearray | memoryview

MAGIC = b"SGRI"
VERSION = 1
BLOCK = struct.Struct(">4sBBBBIIQI")  # everything but the header checksum
BLOCK_LENGTH = BLOCK.size + 4  # 32
HAS_OBJECT = 0x01


class Integrity(NamedTuple):
    """Checksums one reference message carries."""

    algorithm: ChecksumAlgorithm
    """The checksum algorithm of ``chunk_checksum`` and ``object_checksum``."""
    chunk_checksum: int
    """The checksum of this message's chunk of data."""
    object_length: int | None = None
    """The whole object's length; set together with ``object_checksum`` (both, or neither)."""
    object_checksum: int | None = None
    """The whole object's checksum; set together with ``object_length`` (both, or neither)."""
    digests: Digests = NO_DIGESTS
    """Of the whole object; on the LAST message."""

    @property
    def has_object(self) -> bool:
        return self.object_length is not None and self.object_checksum is not None

    def block(self) -> bytes:
        """Digest records and the block, with a zero header checksum (filled in by :func:`seal`)."""
        flags = HAS_OBJECT if self.has_object else 0
        extension = self.digests.extension()
        return (
            extension
            + BLOCK.pack(
                MAGIC,
                VERSION,
                self.algorithm,
                flags,
                0,
                BLOCK_LENGTH + len(extension),
                self.chunk_checksum,
                self.object_length or 0,
                self.object_checksum or 0,
            )
            + b"\0\0\0\0"
        )


def seal(header: bytes) -> bytes:
    """Write the header checksum into the last four bytes of a packed MQRMH."""
    crc = checksum(ChecksumAlgorithm.CRC32, memoryview(header)[:-4])
    return header[:-4] + crc.to_bytes(4, "big")


def find_block(header: Buffer, struc_length: int, spans: tuple[tuple[str, int, int], ...]) -> int | None:
    """Start of the integrity block inside ``header[:struc_length]``, or None when there is none.

    The block is present when its magic sits at ``struc_length - 32``, past the
    fixed part, and no string overlaps it.
    """
    start = struc_length - BLOCK_LENGTH
    if start < LENGTH_1 or bytes(header[start : start + 4]) != MAGIC:
        return None
    for _, offset, length in spans:
        if offset < struc_length and offset + length > start:
            return None
    return start


def read_block(
    header: Buffer, struc_length: int, start: int, spans: tuple[tuple[str, int, int], ...] = ()
) -> Integrity:
    """Verify the header checksum and parse the block at ``start`` (and the digest records before it)."""
    view = memoryview(header)
    stored = int.from_bytes(view[struc_length - 4 : struc_length], "big")
    actual = checksum(ChecksumAlgorithm.CRC32, view[: struc_length - 4])
    if stored != actual:
        raise ChecksumError(
            f"MQRMH header checksum 0x{stored:08x}, computed 0x{actual:08x}",
            reason=Reason.HEADER_CHECKSUM_ERROR,
            stored=stored,
            computed=actual,
        )
    _, version, algo, flags, reserved, length, chunk_crc, obj_len, obj_crc = BLOCK.unpack_from(view, start)
    if version != VERSION:
        raise RmhError(f"integrity block version {version}", reason=Reason.UNSUPPORTED_VERSION, version=version)
    first = struc_length - length
    if length < BLOCK_LENGTH or first < LENGTH_1 or any(o < struc_length and o + n > first for _, o, n in spans):
        raise RmhError(f"integrity block length {length}", reason=Reason.HEADER_LENGTH_ERROR, length=length)
    if reserved or flags & ~HAS_OBJECT:
        raise RmhError("integrity block reserved bits set", reason=Reason.RESERVED_FIELD_ERROR, flags=flags)
    algorithm = ChecksumAlgorithm.parse(algo)
    digests = parse_extension(view[first:start])
    if flags & HAS_OBJECT:
        return Integrity(algorithm, chunk_crc, obj_len, obj_crc, digests)
    if digests:
        raise RmhError("digests without the object length", reason=Reason.EXTENSION_ERROR)
    return Integrity(algorithm, chunk_crc)


class ObjectCheck:
    """Whole-object verification at completion: CRC plus the digests, in one pass over the bytes.

    The receiver feeds the assembled object in blocks (``update``) and calls
    :meth:`finish`; it raises :class:`ChecksumError` (or
    :class:`~segmenter.digest.KeyringError`) when anything does not match or
    when ``policy`` demands a digest the object did not declare.
    """

    __slots__ = ("_algorithm", "_crc", "_declared", "_hasher", "_policy")

    def __init__(
        self,
        algorithm: ChecksumAlgorithm,
        object_checksum: int | None,
        digests: Digests = NO_DIGESTS,
        policy: DigestPolicy = NO_POLICY,
    ) -> None:
        self._algorithm = algorithm
        self._declared = (object_checksum, digests)
        self._policy = policy
        self._hasher: Hasher = policy.verifier(digests)
        self._crc = 0

    @property
    def length(self) -> int:
        """Bytes fed so far."""
        return self._hasher.length

    def update(self, block: Buffer) -> None:
        self._crc = checksum(self._algorithm, block, self._crc)
        self._hasher.update(block)

    def finish(self) -> int:
        """Raise on any mismatch; return the object checksum computed."""
        object_checksum, digests = self._declared
        if object_checksum is not None and self._crc != object_checksum:
            raise ChecksumError(
                f"object checksum 0x{self._crc:08x}, expected 0x{object_checksum:08x}",
                reason=Reason.MESSAGE_CHECKSUM_ERROR,
                stored=object_checksum,
                computed=self._crc,
            )
        self._policy.check(digests, self._hasher.digests())
        return self._crc


def verify_object(
    blocks: Iterable[Buffer],
    algorithm: ChecksumAlgorithm,
    object_checksum: int | None,
    digests: Digests = NO_DIGESTS,
    policy: DigestPolicy = NO_POLICY,
) -> int:
    """One-shot :class:`ObjectCheck` over an object given in blocks; returns its checksum."""
    check = ObjectCheck(algorithm, object_checksum, digests, policy)
    for block in blocks:
        check.update(block)
    return check.finish()
