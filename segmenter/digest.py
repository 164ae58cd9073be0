"""Optional whole-message SHA-256 digest and HMAC-SHA-256 tag (format in docs/concepts/wire-format.md).

CRCs detect accidents, not forgeries: anyone can craft bytes to a given CRC.
A SHA-256 digest makes a conflicting copy of any segment detectable (unless the
last segment itself is forged); an HMAC-SHA-256 under a shared key makes the
whole message authentic. Both cover the **decoded** logical message, like the
message checksum, and travel as TLV records in the header extension of the
last segment (bytes 80 .. header_length - 4, covered by the header CRC), read
when the message is verified: a malformed record is refused with 9030, an unknown
critical type with 9031.

Extension records: ``type`` (1 byte), ``length`` (2 bytes, big-endian), value.
Records are in strictly increasing type order (so each type at most once and
the encoding of given digests is unique). Types 0x00-0xBF are critical: a
reader that does not know one refuses the segment; 0xC0-0xFF may be skipped.
Assigned codes have an even number of set bits, so one flipped bit never turns
a known type into another known type or into a skippable one.

Pure: no I/O, no clocks; hashing is incremental so streaming producers and
receivers never hold a whole message.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from types import MappingProxyType

from .errors import ChecksumError, HeaderError, Reason, SegmentationError

Buffer = bytes | bytearray | memoryview

DIGEST_SIZE = 32  # SHA-256 and HMAC-SHA-256 output
BLOCK_SIZE = 64  # SHA-256 block: the HMAC key pad length
MAX_KEY_ID = 64  # bytes of a key id on the wire
MIN_KEY = 16  # shorter keys are refused: a guessable key authenticates nothing
MAX_EXTENSION = 4096 - 84  # a v1 header is at most 4096 bytes
FIRST_SKIPPABLE = 0xC0
_RECORD = struct.Struct(">BH")  # type, value length


class ExtensionType(IntEnum):
    """TLV type codes (even parity: Hamming distance 2 between any two)."""

    SHA256 = 0x11  # value: 32-byte SHA-256 of the decoded message
    HMAC_SHA256 = 0x12  # value: 32-byte tag, key id length (1 byte), key id (ASCII)


class KeyringError(SegmentationError):
    """A key id names no key in the keyring, or a keyring is configured wrongly."""

    default_reason = Reason.UNKNOWN_KEY


def _check_key_id(key_id: str) -> bytes:
    """Key ids are 1..64 printable ASCII characters: safe in logs, quarantine tables and SQL."""
    raw = key_id.encode("utf-8", "surrogatepass")
    if not 1 <= len(raw) <= MAX_KEY_ID or not all(0x21 <= b <= 0x7E for b in raw):
        raise KeyringError(
            f"key id {key_id!r} must be 1..{MAX_KEY_ID} printable ASCII characters", reason=Reason.EXTENSION_ERROR
        )
    return raw


@dataclass(frozen=True)
class HmacTag:
    """An HMAC-SHA-256 tag and the id of the key that made it."""

    key_id: str
    tag: bytes

    def __post_init__(self) -> None:
        _check_key_id(self.key_id)
        if len(self.tag) != DIGEST_SIZE:
            raise HeaderError(f"HMAC tag of {len(self.tag)} bytes", reason=Reason.EXTENSION_ERROR, length=len(self.tag))


@dataclass(frozen=True)
class Digests:
    """What a message declares (or what was computed): each part optional."""

    sha256: bytes | None = None
    hmac: HmacTag | None = None

    def __post_init__(self) -> None:
        if self.sha256 is not None and len(self.sha256) != DIGEST_SIZE:
            raise HeaderError(
                f"SHA-256 digest of {len(self.sha256)} bytes", reason=Reason.EXTENSION_ERROR, length=len(self.sha256)
            )

    def __bool__(self) -> bool:
        return self.sha256 is not None or self.hmac is not None

    def extension(self) -> bytes:
        """The header extension bytes carrying these digests (empty when there are none)."""
        out = bytearray()
        if self.sha256 is not None:
            out += _RECORD.pack(ExtensionType.SHA256, DIGEST_SIZE) + self.sha256
        if self.hmac is not None:
            key_id = _check_key_id(self.hmac.key_id)
            out += _RECORD.pack(ExtensionType.HMAC_SHA256, DIGEST_SIZE + 1 + len(key_id))
            out += self.hmac.tag + bytes([len(key_id)]) + key_id
        return bytes(out)


def _malformed(message: str, **details: int) -> HeaderError:
    return HeaderError(f"header extension: {message}", reason=Reason.EXTENSION_ERROR, **details)


def parse_extension(buf: Buffer) -> Digests:
    """Decode header extension bytes; every length is checked before it is used.

    Refuses records out of order or repeated, a critical type it does not know,
    and any length that does not fit; skips unknown types from 0xC0 up.
    """
    view = memoryview(buf).cast("B") if isinstance(buf, memoryview) else memoryview(buf)
    if len(view) > MAX_EXTENSION:
        raise _malformed(f"{len(view)} bytes, at most {MAX_EXTENSION}", length=len(view))
    pos, previous = 0, -1
    sha256: bytes | None = None
    tag: HmacTag | None = None
    while pos < len(view):
        if len(view) - pos < _RECORD.size:
            raise _malformed(f"{len(view) - pos} bytes left at {pos}, a record needs 3", position=pos)
        kind, length = _RECORD.unpack_from(view, pos)
        start, pos = pos + _RECORD.size, pos + _RECORD.size + length
        if pos > len(view):
            raise _malformed(f"record type 0x{kind:02x} at {start - 3} runs past the end", position=start - 3)
        if kind <= previous:
            raise _malformed(f"record type 0x{kind:02x} after 0x{previous:02x}", position=start - 3)
        previous = kind
        value = view[start:pos]
        if kind == ExtensionType.SHA256:
            if length != DIGEST_SIZE:
                raise _malformed(f"SHA-256 record of {length} bytes", length=length)
            sha256 = bytes(value)
        elif kind == ExtensionType.HMAC_SHA256:
            id_length = length - DIGEST_SIZE - 1
            if not 1 <= id_length <= MAX_KEY_ID or value[DIGEST_SIZE] != id_length:
                raise _malformed(f"HMAC record of {length} bytes", length=length)
            raw_id = bytes(value[DIGEST_SIZE + 1 :])
            if not all(0x21 <= b <= 0x7E for b in raw_id):
                raise _malformed("key id is not printable ASCII", length=id_length)
            tag = HmacTag(raw_id.decode("ascii"), bytes(value[:DIGEST_SIZE]))
        elif kind < FIRST_SKIPPABLE:
            raise HeaderError(
                f"header extension: unknown critical record type 0x{kind:02x}",
                reason=Reason.UNKNOWN_EXTENSION,
                type=kind,
            )
    return Digests(sha256, tag)


@dataclass(frozen=True)
class Keyring:
    """Keys by id: sign with ``current``, verify with whichever key a message names (rotation).

    Keep retired keys in the ring as long as messages signed with them may
    still arrive; drop them to refuse those messages.
    """

    keys: Mapping[str, bytes]
    current: str | None = None

    def __post_init__(self) -> None:
        for key_id, key in self.keys.items():
            _check_key_id(key_id)
            if len(key) < MIN_KEY:
                raise KeyringError(
                    f"key {key_id!r} has {len(key)} bytes, at least {MIN_KEY} needed", reason=Reason.STATE_ERROR
                )
        if self.current is not None and self.current not in self.keys:
            raise KeyringError(f"current key id {self.current!r} is not in the keyring", key_id=self.current)
        object.__setattr__(self, "keys", MappingProxyType({k: bytes(v) for k, v in self.keys.items()}))

    def key(self, key_id: str) -> bytes:
        """The key named ``key_id``; an unknown id is an error, never a fallback."""
        try:
            return self.keys[key_id]
        except KeyError:
            raise KeyringError(f"unknown HMAC key id {key_id!r}", key_id=key_id) from None

    def __repr__(self) -> str:  # never print keys
        return f"Keyring(key_ids={sorted(self.keys)!r}, current={self.current!r})"


def _same(declared: bytes, computed: bytes | None) -> bool:
    return computed is not None and hmac.compare_digest(declared, computed)


class Hasher:
    """Computes SHA-256 and/or HMAC-SHA-256 over a message fed in chunks of any size."""

    __slots__ = ("_hmac", "_key_id", "_sha256", "length")

    def __init__(self, *, sha256: bool, key: bytes | None = None, key_id: str | None = None) -> None:
        self._sha256 = hashlib.sha256() if sha256 else None
        self._hmac = hmac.new(key, digestmod=hashlib.sha256) if key is not None else None
        self._key_id = key_id
        self.length = 0

    def update(self, chunk: Buffer) -> None:
        if self._sha256 is not None:
            self._sha256.update(chunk)
        if self._hmac is not None:
            self._hmac.update(chunk)
        self.length += len(chunk)

    def digests(self) -> Digests:
        """What has been fed so far (the hasher can go on)."""
        sha = self._sha256.digest() if self._sha256 is not None else None
        tag = None
        if self._hmac is not None and self._key_id is not None:
            tag = HmacTag(self._key_id, self._hmac.digest())
        return Digests(sha, tag)


@dataclass(frozen=True)
class DigestPolicy:
    """What a producer writes and what a reader demands.

    A producer computes SHA-256 when ``sha256`` and signs with the keyring's
    current key when it has one. A reader verifies every digest a message
    carries that it can; it demands SHA-256 when ``sha256`` and an HMAC when it
    has a keyring (a forger would otherwise simply leave the tag out). A reader
    without a keyring cannot check a tag and ignores it.
    """

    sha256: bool = False
    keyring: Keyring | None = field(default=None)

    def signer(self) -> Hasher:
        """The producer's hasher."""
        ring = self.keyring
        if ring is None or ring.current is None:
            return Hasher(sha256=self.sha256)
        return Hasher(sha256=self.sha256, key=ring.key(ring.current), key_id=ring.current)

    def extension_size(self) -> int:
        """Bytes of header extension the producer adds (to budget segment sizes)."""
        size = _RECORD.size + DIGEST_SIZE if self.sha256 else 0
        if self.keyring is not None and self.keyring.current is not None:
            size += _RECORD.size + DIGEST_SIZE + 1 + len(self.keyring.current)
        return size

    def verifier(self, declared: Digests) -> Hasher:
        """The reader's hasher for what ``declared`` carries; refuses what this policy demands and is missing."""
        if self.sha256 and declared.sha256 is None:
            raise ChecksumError("the message carries no SHA-256 digest", reason=Reason.DIGEST_MISSING)
        if self.keyring is None:
            return Hasher(sha256=declared.sha256 is not None)
        if declared.hmac is None:
            raise ChecksumError("the message carries no HMAC-SHA-256 tag", reason=Reason.DIGEST_MISSING)
        key_id = declared.hmac.key_id
        return Hasher(sha256=declared.sha256 is not None, key=self.keyring.key(key_id), key_id=key_id)

    def check(self, declared: Digests, computed: Digests) -> None:
        """Raise unless every digest ``declared`` carries equals the ``computed`` one (constant time)."""
        if declared.sha256 is not None and not _same(declared.sha256, computed.sha256):
            raise ChecksumError(
                "SHA-256 digest mismatch",
                reason=Reason.DIGEST_MISMATCH,
                declared=declared.sha256.hex(),
                computed=computed.sha256.hex() if computed.sha256 else None,
            )
        tag, mine = declared.hmac, computed.hmac
        if tag is not None and self.keyring is not None and not _same(tag.tag, mine.tag if mine else None):
            raise ChecksumError(
                f"HMAC-SHA-256 tag mismatch (key id {tag.key_id!r})", reason=Reason.HMAC_MISMATCH, key_id=tag.key_id
            )

    def verify(self, declared: Digests, chunks: Iterable[Buffer]) -> None:
        """Check a whole message, given as chunks, against what it declares."""
        hasher = self.verifier(declared)
        for chunk in chunks:
            hasher.update(chunk)
        self.check(declared, hasher.digests())

    def sign(self, chunks: Iterable[Buffer]) -> Digests:
        """The digests a producer writes for a message given as chunks."""
        hasher = self.signer()
        for chunk in chunks:
            hasher.update(chunk)
        return hasher.digests()


NO_DIGESTS = Digests()
NO_POLICY = DigestPolicy()  # verify what can be verified, demand nothing


# -- Spark SQL: verification in the JVM with the built-in sha2 -----------------------------------


# For spark.sql.redaction.string.regex: the padded HMAC keys as plans print them (0x... or X'...').
REDACT_KEYS = "(?i)(0x|X')[0-9a-f]{128}"


def _literal(data: bytes) -> str:
    return f"X'{data.hex().upper()}'"


def sha256_sql(blob_expr: str) -> str:
    """SQL giving the 32-byte SHA-256 (binary) of a binary expression."""
    return f"unhex(sha2({blob_expr}, 256))"


def hmac_pads(key: bytes) -> tuple[bytes, bytes]:
    """RFC 2104's ``K xor ipad`` and ``K xor opad`` (64 bytes each; a longer key is hashed first)."""
    padded = (hashlib.sha256(key).digest() if len(key) > BLOCK_SIZE else key).ljust(BLOCK_SIZE, b"\0")
    return bytes(b ^ 0x36 for b in padded), bytes(b ^ 0x5C for b in padded)


def hmac_sha256_sql(blob_expr: str, key: bytes) -> str:
    """SQL giving the 32-byte HMAC-SHA-256 (binary) of a binary expression under ``key``.

    Two nested ``sha2`` calls over the padded key, so Spark computes it in the
    JVM. The padded key is a literal in the plan: anyone who can read plans
    (Spark UI, event logs, ``explain``) can read it. Set
    ``spark.sql.redaction.string.regex`` to :data:`REDACT_KEYS` and alias the
    column (a name derived from the expression holds the key), or verify in Python.
    """
    inner, outer = hmac_pads(key)
    return sha256_sql(f"concat({_literal(outer)}, {sha256_sql(f'concat({_literal(inner)}, {blob_expr})')})")


def verify_sql(blob_expr: str, extension_expr: str, policy: DigestPolicy) -> str:
    """SQL boolean: the extension is in the canonical layout and ``blob_expr`` matches all it declares.

    The canonical layout is what producers write: an optional SHA-256 record,
    then an optional HMAC record, nothing else. False (never NULL) means "not
    verified in SQL", not "forged": a legal extension with skippable records
    is false here, so hand false rows to :meth:`DigestPolicy.verify` for the
    verdict and its reason. Demands of ``policy`` (SHA-256, an HMAC when it has
    a keyring) are enforced; the keyring's keys become literals in the plan
    (see :func:`hmac_sha256_sql`).
    """
    e = extension_expr
    has_sha = f"(substring({e}, 1, 3) = {_literal(_RECORD.pack(ExtensionType.SHA256, DIGEST_SIZE))})"
    at = f"(CASE WHEN {has_sha} THEN {_RECORD.size + DIGEST_SIZE + 1} ELSE 1 END)"  # 1-based start of the HMAC
    has_hmac = f"(substring({e}, {at}, 1) = {_literal(bytes([ExtensionType.HMAC_SHA256]))})"
    value_length = f"CAST(conv(hex(substring({e}, {at} + 1, 2)), 16, 10) AS INT)"
    id_length = f"CAST(conv(hex(substring({e}, {at} + {_RECORD.size + DIGEST_SIZE}, 1)), 16, 10) AS INT)"
    tag = f"substring({e}, {at} + {_RECORD.size}, {DIGEST_SIZE})"
    key_id = f"substring({e}, {at} + {_RECORD.size + DIGEST_SIZE + 1}, {id_length})"
    layout = (
        f"length({e}) = (CASE WHEN {has_sha} THEN {_RECORD.size + DIGEST_SIZE} ELSE 0 END)"
        f" + (CASE WHEN {has_hmac} THEN {_RECORD.size} + {value_length} ELSE 0 END)"
        f" AND (NOT {has_hmac} OR ({id_length} BETWEEN 1 AND {MAX_KEY_ID}"
        f" AND {value_length} = {DIGEST_SIZE + 1} + {id_length}"
        # printable ASCII, as parse_extension demands (a space, a NUL or a 65-byte id passed here and
        # the SQL path delivered what the assembler quarantines as 9030); non-UTF-8 fails the cast's match
        f" AND cast({key_id} AS STRING) RLIKE '^[!-~]+$'))"
    )
    absent = "false" if policy.sha256 else "true"
    sha = f"(CASE WHEN {has_sha} THEN {sha256_sql(blob_expr)} = substring({e}, 4, {DIGEST_SIZE}) ELSE {absent} END)"
    checks = [layout, sha]
    if policy.keyring is not None:
        branches = " ".join(
            f"WHEN {_literal(key_id_bytes.encode('ascii'))} THEN {hmac_sha256_sql(blob_expr, key)} = {tag}"
            for key_id_bytes, key in sorted(policy.keyring.keys.items())
        )
        checks.append(f"{has_hmac} AND (CASE {key_id} {branches} ELSE false END)")
    return f"coalesce({' AND '.join(f'({c})' for c in checks)}, false)"
