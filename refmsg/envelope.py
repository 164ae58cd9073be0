"""Envelope encryption for claim-check stores: the store holds ciphertext only.

:class:`EncryptedStore` wraps any :class:`~refmsg.stores.ObjectStore`. Each
object gets a fresh random 256-bit data key; the payload is encrypted with
AES-256-GCM in fixed-size chunks under that key, and the data key is wrapped
(AES-256-GCM again) by a key-encryption key named by a key id from
:class:`EncryptionKeys`. The reference message is unchanged: its length and
checksum are those of the plaintext, and ``open`` reports the plaintext size,
computed from the envelope header before any payload byte is decrypted.

Object layout (integers big-endian)::

    0   4   magic "SGEN"
    4   1   version 1
    5   1   algorithm 1: AES-256-GCM, chunked
    6   1   key id length n (1..64)
    7   1   reserved, 0
    8   4   chunk size C: plaintext bytes per chunk (1 .. 64 MiB)
    12  8   plaintext length L
    20  12  nonce of the wrapped data key
    32  48  wrapped data key: 32 bytes + 16-byte GCM tag
    80  n   key id (printable ASCII)
    80+n    chunks: ciphertext of min(C, rest) bytes + 16-byte tag, max(1, ceil(L / C)) of them

The wrapping's associated data is the header (all but the wrapped key) and
the object's key in the store, so a changed header field, an envelope moved to
another key, or one claimed by another key id fails authentication. Chunk
``i`` uses nonce ``i`` (96-bit big-endian; unique because the data key is new
for every object) and the associated data ``i`` and a last-chunk flag, so a
chunk reordered, dropped, duplicated or cut off is refused, and so is an
object truncated at a chunk boundary. Every failure is one of our exceptions:
:class:`~refmsg.errors.StoreError` (malformed envelope, cause ``envelope``,
or wrong size), :class:`~segmenter.digest.KeyringError` (a key id not in the
keys, 9034) or :class:`~segmenter.errors.ChecksumError` 9033 HMAC_MISMATCH
(not authentic: tampered, or the wrong key under a known id); never
cryptography's ``InvalidTag``.
"""

from __future__ import annotations

import io
import os
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, BinaryIO, cast

from segmenter.digest import KeyringError
from segmenter.errors import ChecksumError, Reason

from .errors import StoreError, StoreFault
from .stores import INSTALL_HINT, ObjectInfo, ObjectStore, StoredObject

Buffer = bytes | bytearray | memoryview

MAGIC = b"SGEN"
VERSION = 1
AES_256_GCM_CHUNKED = 1
KEY_SIZE = 32  # AES-256
TAG_SIZE = 16
NONCE_SIZE = 12
MAX_KEY_ID = 64
DEFAULT_CHUNK_SIZE = 64 * 1024  # plaintext per GCM chunk: what a reader decrypts at a time
MAX_CHUNK_SIZE = 64 << 20  # a header declaring more is refused before any allocation
_FIXED = struct.Struct(">4sBBBBIQ12s48s")  # magic .. wrapped data key: 80 bytes
_CHUNK_AAD = struct.Struct(">4sQB")  # "SGEC", index, last flag


def _aesgcm() -> Any:
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError:
        raise StoreError(
            f"encrypted stores need the cryptography package: {INSTALL_HINT}", cause=StoreFault.NOT_INSTALLED
        ) from None
    return AESGCM


def _invalid_tag() -> type[Exception]:
    from cryptography.exceptions import InvalidTag

    return cast(type[Exception], InvalidTag)


def _check_key_id(key_id: str) -> bytes:
    """1..64 printable ASCII characters, as the HMAC keyring's ids: safe in logs and in the envelope."""
    raw = key_id.encode("utf-8", "surrogatepass") if isinstance(key_id, str) else b""
    if not 1 <= len(raw) <= MAX_KEY_ID or not all(0x21 <= b <= 0x7E for b in raw):
        raise KeyringError(f"key id {key_id!r} must be 1..{MAX_KEY_ID} printable ASCII characters")
    return raw


@dataclass(frozen=True)
class EncryptionKeys:
    """Key-encryption keys by id: new objects are encrypted under ``current``, any listed key decrypts.

    The same shape as :class:`segmenter.digest.Keyring`: rotate by adding a new
    key and making it current, keep the old ones as long as objects encrypted
    under them may still be resolved, drop a key to make its objects unreadable.
    Keys are 32 random bytes (``os.urandom(32)``); ids are 1..64 printable
    ASCII characters and are stored in each envelope.
    """

    keys: Mapping[str, bytes]
    """Every key-encryption key by its id: 32 bytes each; any of them decrypts what it encrypted."""
    current: str
    """The id (one of ``keys``) new objects' data keys are encrypted under."""

    def __post_init__(self) -> None:
        for key_id, key in self.keys.items():
            _check_key_id(key_id)
            if len(key) != KEY_SIZE:
                raise KeyringError(
                    f"key {key_id!r} has {len(key)} bytes, AES-256 needs {KEY_SIZE}",
                    reason=Reason.STATE_ERROR,
                    key_id=key_id,
                )
        if self.current not in self.keys:
            raise KeyringError(f"current key id {self.current!r} is not among the keys", key_id=self.current)
        object.__setattr__(self, "keys", MappingProxyType({k: bytes(v) for k, v in self.keys.items()}))

    def key(self, key_id: str) -> bytes:
        """The key named ``key_id``; an unknown id is an error (9034), never a fallback."""
        try:
            return self.keys[key_id]
        except KeyError:
            raise KeyringError(f"unknown encryption key id {key_id!r}", key_id=key_id) from None

    def __repr__(self) -> str:  # never print keys
        return f"EncryptionKeys(key_ids={sorted(self.keys)!r}, current={self.current!r})"


def _chunks(length: int, chunk_size: int) -> int:
    return max(1, -(-length // chunk_size))


def envelope_size(length: int, chunk_size: int, key_id: str) -> int:
    """Bytes stored for ``length`` bytes of plaintext: header, ciphertext, one tag per chunk."""
    return _FIXED.size + len(_check_key_id(key_id)) + length + TAG_SIZE * _chunks(length, chunk_size)


def _wrap_aad(header: bytes, key_id: bytes, object_key: str) -> bytes:
    return b"".join((header[:32], key_id, object_key.encode("utf-8", "surrogatepass")))


def _chunk_aad(index: int, last: bool) -> bytes:
    return _CHUNK_AAD.pack(b"SGEC", index, last)


def _nonce(index: int) -> bytes:
    return index.to_bytes(NONCE_SIZE, "big")


def _envelope_error(key: str, message: str, **details: Any) -> StoreError:
    return StoreError(f"encrypted object {key!r}: {message}", key=key, cause=StoreFault.ENVELOPE, **details)


def _not_authentic(key: str, message: str, **details: Any) -> ChecksumError:
    return ChecksumError(f"encrypted object {key!r}: {message}", reason=Reason.HMAC_MISMATCH, key=key, **details)


def seal(plaintext: Buffer, keys: EncryptionKeys, object_key: str, *, chunk_size: int = DEFAULT_CHUNK_SIZE) -> bytes:
    """The envelope for ``plaintext`` stored under ``object_key``, encrypted under ``keys.current``."""
    aesgcm = _aesgcm()
    if not 1 <= chunk_size <= MAX_CHUNK_SIZE:
        raise StoreError(f"chunk_size {chunk_size} outside 1..{MAX_CHUNK_SIZE}", cause=StoreFault.CONFIG)
    view = memoryview(plaintext).cast("B")
    key_id = _check_key_id(keys.current)
    data_key = aesgcm.generate_key(bit_length=256)
    wrap_nonce = os.urandom(NONCE_SIZE)
    head = _FIXED.pack(
        MAGIC, VERSION, AES_256_GCM_CHUNKED, len(key_id), 0, chunk_size, len(view), wrap_nonce, bytes(48)
    )
    wrapped = aesgcm(keys.key(keys.current)).encrypt(wrap_nonce, data_key, _wrap_aad(head, key_id, object_key))
    out = [head[:32], wrapped, key_id]
    cipher = aesgcm(data_key)
    count = _chunks(len(view), chunk_size)
    for index in range(count):
        piece = view[index * chunk_size : (index + 1) * chunk_size]
        out.append(cipher.encrypt(_nonce(index), bytes(piece), _chunk_aad(index, index == count - 1)))
    return b"".join(out)


class _Decrypting(io.RawIOBase):
    """The plaintext of an envelope, decrypted one chunk at a time as it is read.

    Reads exactly each chunk's ciphertext from the underlying stream (never past
    the envelope); holds at most one chunk of plaintext beyond what ``read`` returns.
    """

    def __init__(self, inner: BinaryIO, cipher: Any, key: str, length: int, chunk_size: int) -> None:
        self._inner = inner
        self._cipher = cipher
        self._key = key
        self._length = length
        self._chunk_size = chunk_size
        self._count = _chunks(length, chunk_size)
        self._index = 0
        self._held = b""
        self._invalid_tag = _invalid_tag()

    def readable(self) -> bool:
        return True

    def verify_empty(self) -> None:
        """Authenticate the single empty chunk of an empty payload."""
        self._held = self._next_chunk()

    def _next_chunk(self) -> bytes:
        index = self._index
        plain = min(self._chunk_size, self._length - index * self._chunk_size)
        want = plain + TAG_SIZE
        parts, got = [], 0
        while got < want:
            try:
                piece = self._inner.read(want - got)
            except (OSError, ValueError) as exc:
                raise _envelope_error(self._key, f"read failed in chunk {index}: {exc}", chunk=index) from None
            if not piece:
                raise StoreError(
                    f"encrypted object {self._key!r}: ends inside chunk {index} ({got} of {want} bytes)",
                    reason=Reason.OBJECT_SIZE_ERROR,
                    key=self._key,
                    cause=StoreFault.ENVELOPE,
                    chunk=index,
                )
            parts.append(piece)
            got += len(piece)
        last = index == self._count - 1
        try:
            out = self._cipher.decrypt(_nonce(index), b"".join(parts), _chunk_aad(index, last))
        except self._invalid_tag:
            raise _not_authentic(self._key, f"chunk {index} fails authentication", chunk=index) from None
        self._index += 1
        return cast(bytes, out)

    def read(self, size: int | None = -1) -> bytes:
        """Up to ``size`` bytes (all that is left for ``None`` or a negative size); ``b""`` at the end."""
        parts, total = [], 0
        limit = self._length if size is None or size < 0 else size
        while total < limit:
            if not self._held:
                if self._index >= self._count:
                    break
                self._held = self._next_chunk()
                if not self._held:
                    continue  # the one empty chunk of an empty payload, authenticated
            take = self._held[: limit - total]
            self._held = self._held[len(take) :]
            parts.append(take)
            total += len(take)
        return b"".join(parts)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        memoryview(buffer).cast("B")[: len(data)] = data
        return len(data)

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            self._held = b""
            super().close()


class EncryptedStore:
    """An :class:`~refmsg.stores.ObjectStore` that encrypts before ``put`` and decrypts on ``open``.

    ``EncryptedStore(FsspecStore("s3://bucket/p", name="s3"), EncryptionKeys({"k1": key}, current="k1"))``:
    the inner store only ever sees envelopes (module docstring). ``name`` is the
    inner store's unless given. ``list`` reports the inner store's objects
    (sizes are envelope sizes); ``delete`` deletes them.

    ``store``: the inner store, which keeps the envelopes. ``keys``: the keys that wrap each object's data key (the
    current one for new objects). ``chunk_size``: the plaintext bytes per encrypted chunk, what a reader decrypts at a
    time.
    """

    def __init__(
        self,
        store: ObjectStore,
        keys: EncryptionKeys,
        *,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        name: str | None = None,
    ) -> None:
        if not 1 <= chunk_size <= MAX_CHUNK_SIZE:
            raise StoreError(f"chunk_size {chunk_size} outside 1..{MAX_CHUNK_SIZE}", cause=StoreFault.CONFIG)
        if not isinstance(keys, EncryptionKeys):
            raise StoreError("keys must be an EncryptionKeys", cause=StoreFault.CONFIG)
        _aesgcm()  # fail at construction, not at the first message, when cryptography is absent
        self.store = store
        self.keys = keys
        self.chunk_size = chunk_size
        self.name = name if name is not None else store.name

    def __repr__(self) -> str:
        return f"EncryptedStore({self.store!r}, {self.keys!r}, chunk_size={self.chunk_size})"

    def put(self, key: str, data: Buffer) -> None:
        self.store.put(key, seal(data, self.keys, key, chunk_size=self.chunk_size))

    def open(self, key: str) -> StoredObject:
        """Plaintext size and a decrypting stream; the header is read and the data key unwrapped first.

        Nothing of the payload is decrypted here; the envelope's size must be
        exactly what its header declares (9019 otherwise).

        ``key``: the object's key.
        """
        obj = self.store.open(key)
        try:
            return self._open(key, obj)
        except BaseException:
            obj.stream.close()
            raise

    def _read_exactly(self, key: str, stream: BinaryIO, count: int) -> bytes:
        parts, got = [], 0
        while got < count:
            try:
                piece = stream.read(count - got)
            except (OSError, ValueError) as exc:
                raise _envelope_error(key, f"header unreadable: {exc}") from None
            if not piece:
                raise _envelope_error(key, f"header cut at {got} bytes", reason=Reason.OBJECT_SIZE_ERROR)
            parts.append(piece)
            got += len(piece)
        return b"".join(parts)

    def _open(self, key: str, obj: StoredObject) -> StoredObject:
        if obj.size < _FIXED.size:
            raise _envelope_error(key, f"{obj.size} bytes, shorter than an envelope header", length=obj.size)
        head = self._read_exactly(key, obj.stream, _FIXED.size)
        magic, version, algorithm, id_length, reserved, chunk_size, length, wrap_nonce, wrapped = _FIXED.unpack(head)
        if magic != MAGIC:
            raise _envelope_error(key, f"magic {magic!r}, not {MAGIC!r}: not an envelope")
        if version != VERSION or algorithm != AES_256_GCM_CHUNKED or reserved:
            raise _envelope_error(
                key, f"version {version} algorithm {algorithm} reserved {reserved}: unknown", version=version
            )
        if not 1 <= id_length <= MAX_KEY_ID or not 1 <= chunk_size <= MAX_CHUNK_SIZE:
            raise _envelope_error(key, f"key id length {id_length}, chunk size {chunk_size}: out of range")
        if obj.size < _FIXED.size + id_length:
            raise _envelope_error(key, f"{obj.size} bytes, shorter than its header", length=obj.size)
        raw_id = self._read_exactly(key, obj.stream, id_length)
        if not all(0x21 <= b <= 0x7E for b in raw_id):
            raise _envelope_error(key, "key id is not printable ASCII")
        key_id = raw_id.decode("ascii")
        kek = self.keys.key(key_id)
        expected = _FIXED.size + id_length + length + TAG_SIZE * _chunks(length, chunk_size)
        if obj.size != expected:
            raise StoreError(
                f"encrypted object {key!r} holds {obj.size} bytes, its header declares {expected}",
                reason=Reason.OBJECT_SIZE_ERROR,
                key=key,
                cause=StoreFault.ENVELOPE,
                length=obj.size,
                expected=expected,
            )
        aesgcm = _aesgcm()
        try:
            data_key = aesgcm(kek).decrypt(wrap_nonce, wrapped, _wrap_aad(head, raw_id, key))
        except _invalid_tag():
            raise _not_authentic(
                key, f"envelope header fails authentication under key id {key_id!r}", key_id=key_id
            ) from None
        reader = _Decrypting(obj.stream, aesgcm(data_key), key, length, chunk_size)
        if length == 0:
            reader.verify_empty()  # no read would ever reach the one (empty) chunk: authenticate it now
        return StoredObject(length, cast(BinaryIO, reader))

    def delete(self, key: str) -> None:
        self.store.delete(key)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """The inner store's objects (envelope sizes); a StoreError when the inner store cannot list.

        ``prefix``: only keys starting with it ("": every object).
        """
        lister = getattr(self.store, "list", None)
        if lister is None:
            raise StoreError(f"{self.store!r} cannot list its objects", cause=StoreFault.CONFIG)
        return cast(Iterator[ObjectInfo], lister(prefix))
