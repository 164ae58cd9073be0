"""Envelope encryption: every payload round-trips, every tampered envelope is refused with our errors.

The stores underneath are real (a directory, fsspec's memory file system, s3fs against moto's
S3 emulator on 127.0.0.1); the bytes they hold are inspected directly to prove that no
plaintext reaches them.
"""

from __future__ import annotations

import io
import os
import sys
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refmsg import (
    DirectoryStore,
    EncryptedStore,
    EncryptionKeys,
    FsspecStore,
    StoreError,
    StoreFault,
    offload,
    open_store,
    read_claim,
    release,
    resolve,
    resolve_into,
)
from refmsg.envelope import MAGIC, TAG_SIZE, envelope_size
from segmenter.digest import KeyringError
from segmenter.errors import ChecksumError, Reason, SegmentationError
from tests.support.s3_server import S3Bucket, s3_endpoint, s3_store_url

__all__ = ["s3_endpoint", "s3_store_url"]

K1, K2 = os.urandom(32), os.urandom(32)
KEYS = EncryptionKeys({"k1": K1}, current="k1")
HEADER = 80 + 2  # fixed part + key id "k1"


def memory_store() -> FsspecStore:
    return FsspecStore(f"memory://env-{uuid.uuid4().hex}", name="mem")


def raw(store: FsspecStore, key: str) -> bytes:
    return bytes(store.fs.cat_file(f"{store.root}/{key}"))


def put_raw(store: FsspecStore, key: str, data: bytes) -> None:
    store.fs.pipe_file(f"{store.root}/{key}", data)


# ------------------------------------------------------------------ round trips
@given(
    payload=st.binary(max_size=3000),
    chunk_size=st.integers(1, 700),
    read_size=st.integers(1, 900),
)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_payload_round_trips(payload: bytes, chunk_size: int, read_size: int) -> None:
    inner = memory_store()
    store = EncryptedStore(inner, KEYS, chunk_size=chunk_size)
    msg = offload(payload, store, threshold=-1)  # always stored
    key = read_claim(msg.body).key
    stored = raw(inner, key)
    assert len(stored) == envelope_size(len(payload), chunk_size, "k1") and stored.startswith(MAGIC)
    assert store.open(key).size == len(payload)  # the plaintext size, from the header
    assert resolve(msg, store) == payload
    sink = io.BytesIO()
    assert resolve_into(msg, store, sink, chunk_size=read_size) == len(payload) and sink.getvalue() == payload


def test_round_trip_on_disk_and_the_store_never_holds_plaintext(tmp_path: Path) -> None:
    inner = DirectoryStore(tmp_path / "s")
    store = EncryptedStore(inner, KEYS)  # default 64 KiB chunks
    payload = os.urandom(300_000)
    msg = offload(payload, store)
    key = read_claim(msg.body).key
    assert read_claim(msg.body).length == len(payload)  # the reference describes the plaintext
    on_disk = (tmp_path / "s" / key).read_bytes()
    assert all(payload[i : i + 16] not in on_disk for i in range(0, len(payload) - 16, 4096))
    assert resolve(msg, store) == payload
    readable = b"readable text " * 30_000  # compressible, repetitive: still nothing of it on disk
    msg2 = offload(readable, store)
    assert b"readable text" not in (tmp_path / "s" / read_claim(msg2.body).key).read_bytes()
    assert resolve(msg2, store) == readable
    release(msg2, store)
    assert [i.key for i in store.list()] == [key]


def test_s3_holds_ciphertext_only(s3_store_url: S3Bucket) -> None:
    inner = open_store(s3_store_url.url, name="s3", **s3_store_url.options)
    store = EncryptedStore(inner, KEYS, chunk_size=4096)
    payload = b"card number 4111-1111-1111-1111; " * 1000
    msg = offload(payload, store, threshold=1000)
    key = read_claim(msg.body).key
    got = s3_store_url.client().get_object(Bucket=s3_store_url.bucket, Key=f"payloads/{key}")["Body"].read()
    assert got.startswith(MAGIC) and b"4111" not in got
    sink = io.BytesIO()
    assert resolve_into(msg, store, sink, chunk_size=1000) == len(payload) and sink.getvalue() == payload


# ------------------------------------------------------------------ tampering
def _refused(msg: object, store: EncryptedStore) -> SegmentationError:
    with pytest.raises(SegmentationError) as err:
        resolve(msg, store)  # type: ignore[call-overload]
    with pytest.raises(SegmentationError):
        resolve_into(msg, store, io.BytesIO(), chunk_size=5)  # type: ignore[call-overload]
    assert isinstance(err.value, (StoreError, ChecksumError, KeyringError)), type(err.value)
    return err.value


@pytest.mark.parametrize("length", [0, 1, 100])
def test_every_flipped_byte_is_refused(length: int) -> None:
    inner = memory_store()
    store = EncryptedStore(inner, KEYS, chunk_size=16)
    payload = os.urandom(length)
    msg = offload(payload, store, threshold=-1, key="obj")
    good = raw(inner, "obj")
    reasons = set()
    for i in range(len(good)):
        for flip in (0x01, 0x80, 0xFF):
            damaged = bytearray(good)
            damaged[i] ^= flip
            put_raw(inner, "obj", bytes(damaged))
            reasons.add(_refused(msg, store).reason)
    assert Reason.HMAC_MISMATCH in reasons and reasons <= {
        Reason.HMAC_MISMATCH,
        Reason.STORE_ERROR,
        Reason.OBJECT_SIZE_ERROR,
        Reason.UNKNOWN_KEY,
        Reason.EXTENSION_ERROR,  # a key id turned unprintable, refused as a key id
    }
    put_raw(inner, "obj", good)
    assert resolve(msg, store) == payload


def test_every_truncation_and_extension_is_refused() -> None:
    inner = memory_store()
    store = EncryptedStore(inner, KEYS, chunk_size=16)
    msg = offload(os.urandom(100), store, threshold=-1, key="obj")
    good = raw(inner, "obj")
    for n in range(len(good)):
        put_raw(inner, "obj", good[:n])
        err = _refused(msg, store)
        assert err.reason in (Reason.OBJECT_SIZE_ERROR, Reason.STORE_ERROR), n
    for extra in (b"\0", os.urandom(16), good[HEADER : HEADER + 32]):
        put_raw(inner, "obj", good + extra)
        assert _refused(msg, store).reason == Reason.OBJECT_SIZE_ERROR


def test_chunks_swapped_dropped_or_duplicated_are_refused() -> None:
    inner = memory_store()
    store = EncryptedStore(inner, KEYS, chunk_size=16)
    msg = offload(os.urandom(64), store, threshold=-1, key="obj")  # four full chunks
    good = raw(inner, "obj")
    head, body = good[:HEADER], good[HEADER:]
    chunks = [body[i : i + 16 + TAG_SIZE] for i in range(0, len(body), 16 + TAG_SIZE)]
    assert len(chunks) == 4
    for order in ([1, 0, 2, 3], [0, 1, 3, 2], [0, 0, 2, 3], [3, 1, 2, 0]):
        put_raw(inner, "obj", head + b"".join(chunks[i] for i in order))
        assert _refused(msg, store).reason == Reason.HMAC_MISMATCH


def test_envelopes_cannot_move_between_keys_or_objects() -> None:
    inner = memory_store()
    store = EncryptedStore(inner, KEYS, chunk_size=16)
    a = offload(os.urandom(100), store, threshold=-1, key="a")
    b = offload(os.urandom(100), store, threshold=-1, key="b")
    raw_a, raw_b = raw(inner, "a"), raw(inner, "b")
    put_raw(inner, "a", raw_b)  # the same size, a valid envelope, under another key
    assert _refused(a, store).reason == Reason.HMAC_MISMATCH
    put_raw(inner, "a", raw_a[:HEADER] + raw_b[HEADER:])  # a's header (and data key), b's chunks
    assert _refused(a, store).reason == Reason.HMAC_MISMATCH
    put_raw(inner, "a", raw_a)
    assert resolve(a, store) and resolve(b, store)


def test_wrong_key_unknown_key_and_rotation() -> None:
    inner = memory_store()
    old = EncryptedStore(inner, KEYS)
    payload = os.urandom(1000)
    msg = offload(payload, old, threshold=-1)
    impostor = EncryptedStore(inner, EncryptionKeys({"k1": K2}, current="k1"))  # same id, other bytes
    assert _refused(msg, impostor).reason == Reason.HMAC_MISMATCH
    stranger = EncryptedStore(inner, EncryptionKeys({"k9": K2}, current="k9"))
    err = _refused(msg, stranger)
    assert isinstance(err, KeyringError) and err.reason == Reason.UNKNOWN_KEY and err.details["key_id"] == "k1"
    rotated = EncryptedStore(inner, EncryptionKeys({"k1": K1, "k2": K2}, current="k2"))
    assert resolve(msg, rotated) == payload  # the old key still decrypts
    new = offload(payload, rotated, threshold=-1)
    new_key = read_claim(new.body).key
    assert raw(inner, new_key)[80:82] == b"k2"  # new objects use the current key
    assert resolve(new, rotated) == payload
    retired = EncryptedStore(inner, EncryptionKeys({"k2": K2}, current="k2"))
    assert resolve(new, retired) == payload
    assert _refused(msg, retired).reason == Reason.UNKNOWN_KEY  # k1 dropped: its objects unreadable


def test_plain_objects_are_not_envelopes(tmp_path: Path) -> None:
    inner = DirectoryStore(tmp_path)
    store = EncryptedStore(inner, KEYS)
    msg = offload(os.urandom(500), inner, threshold=10)  # written without encryption
    err = _refused(msg, store)
    assert isinstance(err, StoreError) and err.details["cause"] == StoreFault.ENVELOPE


@given(garbage=st.binary(max_size=400), mutate=st.booleans(), data=st.data())
@settings(max_examples=120, deadline=None)
def test_only_our_exceptions_escape_on_garbage(garbage: bytes, mutate: bool, data: st.DataObject) -> None:
    inner = memory_store()
    store = EncryptedStore(inner, KEYS, chunk_size=data.draw(st.integers(1, 64)))
    payload = data.draw(st.binary(max_size=200))
    msg = offload(payload, store, threshold=-1, key="obj")
    if mutate:  # a valid envelope, some bytes changed, then cut or extended
        body = bytearray(raw(inner, "obj"))
        for _ in range(data.draw(st.integers(1, 4))):
            body[data.draw(st.integers(0, len(body) - 1))] = data.draw(st.integers(0, 255))
        garbage = bytes(body[: data.draw(st.integers(0, len(body)))]) + garbage[: data.draw(st.integers(0, 20))]
    put_raw(inner, "obj", garbage)
    try:
        out = resolve(msg, store)
    except SegmentationError:
        return
    assert out == payload  # only the original envelope, intact, gives anything back


# ------------------------------------------------------------------ keys and configuration
def test_keys_are_checked_and_never_printed() -> None:
    for bad in ({"k": os.urandom(16)}, {"k": os.urandom(33)}, {"": K1}, {"has space": K1}, {"x" * 65: K1}):
        with pytest.raises(KeyringError):
            EncryptionKeys(bad, current=next(iter(bad)))
    with pytest.raises(KeyringError):
        EncryptionKeys({"k1": K1}, current="k2")
    keys = EncryptionKeys({"k1": K1, "k2": K2}, current="k2")
    assert K1.hex() not in repr(keys) and str(K1) not in repr(keys) and "k1" in repr(keys)
    assert K1.hex() not in repr(EncryptedStore(memory_store(), keys))
    with pytest.raises(StoreError):
        EncryptedStore(memory_store(), keys, chunk_size=0)


def test_without_cryptography_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cryptography.hazmat.primitives.ciphers.aead", None)
    with pytest.raises(StoreError) as err:
        EncryptedStore(memory_store(), KEYS)
    assert "pip install fsspec cryptography (the extra objectstore" in str(err.value)
    assert err.value.details["cause"] == StoreFault.NOT_INSTALLED
