"""Claim check: offload above the threshold, resolve with size and checksum verification."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from refmsg import (
    CLAIM_CHECK_TYPE,
    DEFAULT_THRESHOLD,
    FORMAT_REF_MSG_HEADER,
    DirectoryStore,
    Message,
    ObjectStore,
    PathError,
    StoreError,
    decode_message,
    decode_rmh,
    is_claim_check,
    offload,
    resolve,
)
from segmenter.checksum import ChecksumAlgorithm, checksum
from segmenter.errors import ChecksumError, Reason, SegmentationError


class MemoryStore:
    """A second store implementation: what an S3 adapter would look like."""

    def __init__(self) -> None:
        self.name = "memory"
        self.objects: dict[str, bytes] = {}

    def put(self, key: str, data: bytes) -> None:
        self.objects[key] = bytes(data)

    def get(self, key: str) -> bytes:
        try:
            return self.objects[key]
        except KeyError:
            raise StoreError(f"no object {key!r}", key=key) from None

    def delete(self, key: str) -> None:
        self.objects.pop(key, None)


def test_threshold_is_256_kib_and_inclusive(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path)
    assert DEFAULT_THRESHOLD == 256 * 1024
    at = os.urandom(DEFAULT_THRESHOLD)
    inline = offload(at, store)
    assert inline == Message("        ", at) and not inline.is_reference
    assert resolve(inline, store) == at
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("algorithm", list(ChecksumAlgorithm))
def test_offload_and_resolve(tmp_path: Path, algorithm: ChecksumAlgorithm) -> None:
    store = DirectoryStore(tmp_path / "store")
    payload = os.urandom(DEFAULT_THRESHOLD + 1)
    msg = offload(payload, store, algorithm=algorithm)
    assert msg.format == FORMAT_REF_MSG_HEADER and len(msg.body) < 256
    rmh = decode_rmh(msg.body).header  # a plain MQ reader sees an ordinary MQRMH
    assert rmh.object_type == CLAIM_CHECK_TYPE and rmh.is_last
    assert rmh.data_logical_length == len(payload) and rmh.src_env == "dir"
    integrity = decode_message(msg.body, require_integrity=True).message.integrity
    assert integrity is not None and integrity.object_checksum == checksum(algorithm, payload)
    assert (tmp_path / "store" / rmh.src_name).read_bytes() == payload
    assert resolve(msg, store) == payload
    assert is_claim_check(msg.body)
    assert resolve(msg.body, store, delete=True) == payload  # sniffed without the Format
    assert not (tmp_path / "store" / rmh.src_name).exists()


def test_pluggable_store() -> None:
    store = MemoryStore()
    assert isinstance(store, ObjectStore)
    payload = b"p" * 1000
    msg = offload(payload, store, threshold=100, key="k/1")
    assert store.objects == {"k/1": payload}
    assert resolve(msg, store) == payload
    other = MemoryStore()
    other.name = "other"
    with pytest.raises(StoreError):  # resolving against another store is refused
        resolve(msg, other)


def test_tampering_is_detected(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path)
    payload = os.urandom(5000)
    msg = offload(payload, store, threshold=10, key="obj")
    (tmp_path / "obj").write_bytes(payload + b"!")
    with pytest.raises(SegmentationError) as err:
        resolve(msg, store)
    assert err.value.reason == Reason.OBJECT_SIZE_ERROR
    (tmp_path / "obj").write_bytes(b"\0" + payload[1:])
    with pytest.raises(ChecksumError) as cerr:
        resolve(msg, store)
    assert cerr.value.reason == Reason.MESSAGE_CHECKSUM_ERROR
    (tmp_path / "obj").unlink()
    with pytest.raises(StoreError) as serr:
        resolve(msg, store)
    assert serr.value.reason == Reason.STORE_ERROR
    body = bytearray(msg.body)
    body[-10] ^= 4
    with pytest.raises(SegmentationError):
        resolve(Message(FORMAT_REF_MSG_HEADER, bytes(body)), store)


def test_inline_payload_that_looks_like_a_header(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path)
    sneaky = b"RMH " + os.urandom(50)
    assert resolve(Message("        ", sneaky), store) == sneaky
    assert resolve(sneaky, store) == sneaky


@pytest.mark.parametrize("key", ["../escape", "/abs", "a/../../b", "a\0b", ".refmsg/x"])
def test_store_keys_are_confined(tmp_path: Path, key: str) -> None:
    store = DirectoryStore(tmp_path / "store")
    with pytest.raises(PathError):
        offload(b"x" * 100, store, threshold=10, key=key)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]
