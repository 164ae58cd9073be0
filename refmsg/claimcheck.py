"""Claim check: big payloads go to a store, the message carries a small MQRMH pointing at them.

:func:`offload` stores a payload above ``threshold`` (default 256 KiB, the SQS
limit the AWS extended clients use) and returns a header-only reference
message: ObjectType ``"CLAIMCHK"``, SrcEnv the store's name, SrcName the key,
DataLogicalLength the size, and the integrity block with the object length and
checksum. Smaller payloads travel inline. :func:`resolve` turns either back into
the payload, verifying size and checksum. A message knows which it is by its
MQMD Format (``"MQHREF  "`` for the reference), carried in :class:`Message`.

Stores implement :class:`ObjectStore` (put/get/delete by key); the default
:class:`DirectoryStore` writes each object atomically (temporary file, fsync,
rename) under a directory, with keys confined like receiver names.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from typing import NamedTuple, Protocol, runtime_checkable

from segmenter.checksum import DEFAULT_ALGORITHM, ChecksumAlgorithm, checksum
from segmenter.errors import ChecksumError, Reason, SegmentationError

from .chunker import new_instance_id
from .errors import RmhError, StoreError
from .header import CCSID_UTF8, ENCODING_NATIVE, FORMAT_NONE, FORMAT_REF_MSG_HEADER, MAX_MQLONG, RMH, RmhFlags
from .integrity import Integrity
from .message import ReferenceMessage, decode_message
from .paths import open_parent, open_root, split_name

DEFAULT_THRESHOLD = 256 * 1024
CLAIM_CHECK_TYPE = "CLAIMCHK"


@runtime_checkable
class ObjectStore(Protocol):
    """Where offloaded payloads live. ``name`` is recorded in the message (SrcEnv)."""

    name: str

    def put(self, key: str, data: bytes) -> None: ...

    def get(self, key: str) -> bytes: ...

    def delete(self, key: str) -> None: ...


class DirectoryStore:
    """An :class:`ObjectStore` over a local (or mounted shared) directory."""

    def __init__(self, root: str | os.PathLike[str], *, name: str = "dir", fsync: bool = True) -> None:
        self.root = os.fspath(root)
        self.name = name
        self._fsync = fsync
        os.makedirs(self.root, exist_ok=True)

    def _dir(self, key: str, create: bool) -> tuple[int, str]:
        parts = split_name(key)
        root_fd = open_root(self.root, create=False)
        try:
            return open_parent(root_fd, parts, create=create), parts[-1]
        finally:
            os.close(root_fd)

    def put(self, key: str, data: bytes) -> None:
        dir_fd, leaf = self._dir(key, create=True)
        tmp = f".{leaf[:200]}.{uuid.uuid4().hex}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=dir_fd)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                if self._fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, leaf, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            if self._fsync:
                os.fsync(dir_fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise StoreError(f"cannot store {key!r}: {exc.strerror}", key=key) from None
        finally:
            os.close(dir_fd)

    def get(self, key: str) -> bytes:
        try:
            dir_fd, leaf = self._dir(key, create=False)
        except SegmentationError as exc:
            raise StoreError(f"cannot find {key!r}: {exc}", key=key) from None
        try:
            fd = os.open(leaf, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
        except OSError as exc:
            raise StoreError(f"cannot read {key!r}: {exc.strerror}", key=key) from None
        finally:
            os.close(dir_fd)
        with os.fdopen(fd, "rb") as f:
            return f.read()

    def delete(self, key: str) -> None:
        dir_fd, leaf = self._dir(key, create=False)
        try:
            os.unlink(leaf, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        finally:
            os.close(dir_fd)


class Message(NamedTuple):
    """A message body and its MQMD Format ("MQHREF  " when it is a claim check)."""

    format: str
    body: bytes

    @property
    def is_reference(self) -> bool:
        return self.format == FORMAT_REF_MSG_HEADER


def offload(
    payload: bytes,
    store: ObjectStore,
    *,
    threshold: int = DEFAULT_THRESHOLD,
    algorithm: ChecksumAlgorithm = DEFAULT_ALGORITHM,
    key: str | None = None,
    inline_format: str = FORMAT_NONE,
    header_encoding: int = ENCODING_NATIVE,
    ccsid: int = CCSID_UTF8,
) -> Message:
    """The payload itself when ``len(payload) <= threshold``, else a claim-check reference message."""
    if len(payload) <= threshold:
        return Message(inline_format, bytes(payload))
    if len(payload) > MAX_MQLONG:
        raise SegmentationError(
            f"{len(payload)} bytes exceed DataLogicalLength's range", reason=Reason.MSG_TOO_BIG, length=len(payload)
        )
    algorithm = ChecksumAlgorithm.parse(algorithm)
    key = key or uuid.uuid4().hex
    crc = checksum(algorithm, payload)
    store.put(key, bytes(payload))
    header = RMH(
        flags=RmhFlags.LAST,
        object_type=CLAIM_CHECK_TYPE,
        object_instance_id=new_instance_id(),
        src_env=store.name,
        src_name=key,
        data_logical_length=len(payload),
        format=inline_format,
        encoding=header_encoding,
        ccsid=ccsid,
    )
    body = ReferenceMessage(header, b"", Integrity(algorithm, crc, len(payload), crc)).encode()
    return Message(FORMAT_REF_MSG_HEADER, body)


def is_claim_check(body: bytes) -> bool:
    """True when ``body`` decodes as a claim-check reference message (for callers without the Format)."""
    if body[:4] != b"RMH ":
        return False
    try:
        decoded = decode_message(body, require_integrity=True).message
    except SegmentationError:
        return False
    return decoded.header.object_type == CLAIM_CHECK_TYPE and decoded.header_only


def resolve(message: Message | bytes, store: ObjectStore, *, delete: bool = False) -> bytes:
    """The payload: inline as is, or fetched from ``store`` and verified (size and checksum).

    A bare ``bytes`` body is sniffed with :func:`is_claim_check`; pass a
    :class:`Message` to decide by the Format instead. ``delete`` removes the
    stored object once it is verified.
    """
    if isinstance(message, Message):
        if not message.is_reference:
            return message.body
        body = message.body
    else:
        body = bytes(message)
        if not is_claim_check(body):
            return body
    ref = decode_message(body, require_integrity=True).message
    rmh, integrity = ref.header, ref.integrity
    assert integrity is not None
    if rmh.object_type != CLAIM_CHECK_TYPE or not integrity.has_object:
        raise RmhError(f"ObjectType {rmh.object_type!r} is not a claim check", object_type=rmh.object_type)
    if rmh.src_env != store.name:
        raise StoreError(f"message points at store {rmh.src_env!r}, resolving with {store.name!r}", env=rmh.src_env)
    data = store.get(rmh.src_name)
    if len(data) != integrity.object_length:
        raise SegmentationError(
            f"stored object {rmh.src_name!r} holds {len(data)} bytes, {integrity.object_length} expected",
            reason=Reason.OBJECT_SIZE_ERROR,
            key=rmh.src_name,
            length=len(data),
            expected=integrity.object_length,
        )
    actual = checksum(integrity.algorithm, data)
    if actual != integrity.object_checksum:
        raise ChecksumError(
            f"stored object {rmh.src_name!r}: checksum 0x{actual:08x}, expected 0x{integrity.object_checksum:08x}",
            reason=Reason.MESSAGE_CHECKSUM_ERROR,
            key=rmh.src_name,
        )
    if delete:
        store.delete(rmh.src_name)
    return data
