"""Claim-check stores: one behaviour suite over every implementation, and the receiving side's rules.

The same tests run against DirectoryStore, FsspecStore on fsspec's local and memory file
systems, and FsspecStore through s3fs against moto's S3 emulator on 127.0.0.1 (a real HTTP
server started for this module, tests/support/s3_server.py): put/open/list/delete, key
confinement, missing objects, the size known before a byte is read, bounded partial reads.
Then the allowlist, ``missing="skip"``, the safe delete order (``release``) and ``open_store``.
"""

from __future__ import annotations

import io
import os
import sys
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from refmsg import (
    DirectoryStore,
    FsspecStore,
    ListableStore,
    Message,
    MissingPayload,
    ObjectInfo,
    ObjectStore,
    PathError,
    StoredObject,
    StoreError,
    StoreFault,
    offload,
    open_store,
    read_claim,
    release,
    resolve,
    resolve_into,
)
from segmenter.errors import MessageTooBigError, Reason, SegmentationError
from tests.support.s3_server import S3Bucket, s3_endpoint, s3_store_url

__all__ = ["s3_endpoint", "s3_store_url"]  # the module-scoped emulator and a fresh bucket per test

KINDS = ["dir", "fsspec-file", "fsspec-memory", "s3"]


@pytest.fixture(params=KINDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ListableStore:
    kind = request.param
    if kind == "dir":
        return DirectoryStore(tmp_path / "store", name="st")
    if kind == "fsspec-file":
        return FsspecStore(f"file://{tmp_path / 'store'}", name="st")
    if kind == "fsspec-memory":
        return FsspecStore(f"memory://test-{uuid.uuid4().hex}/payloads", name="st")
    bucket: S3Bucket = request.getfixturevalue("s3_store_url")
    return open_store(bucket.url, name="st", **bucket.options)


def read_all(store: ObjectStore, key: str) -> bytes:
    obj = store.open(key)
    with obj.stream:
        return obj.stream.read(obj.size)


# ------------------------------------------------------------------ the behaviour suite
def test_put_open_overwrite(store: ListableStore) -> None:
    assert isinstance(store, ObjectStore) and isinstance(store, ListableStore)
    payload = os.urandom(70_000)
    store.put("a/b/c.bin", payload)
    assert read_all(store, "a/b/c.bin") == payload
    store.put("a/b/c.bin", memoryview(b"shorter"))  # a put replaces the whole object
    assert read_all(store, "a/b/c.bin") == b"shorter"
    store.put("empty", b"")
    obj = store.open("empty")
    with obj.stream:
        assert obj.size == 0 and obj.stream.read(10) == b""


def test_size_before_read_and_bounded_partial_reads(store: ListableStore) -> None:
    payload = os.urandom(50_000)
    store.put("k", payload)
    obj = store.open("k")
    assert isinstance(obj, StoredObject) and obj.size == len(payload)  # known before a byte is read
    pieces = []
    with obj.stream:
        while piece := obj.stream.read(7_000):
            assert len(piece) <= 7_000  # never more than asked for
            pieces.append(piece)
    assert b"".join(pieces) == payload


def test_list_keys_sizes_and_modified_times(store: ListableStore) -> None:
    assert list(store.list()) == []
    before = datetime.now(timezone.utc) - timedelta(seconds=5)
    objects = {"b": 3, "a/x": 10, "a/y/z": 0, "ab": 1, "c/d/e/f": 7}
    for key, size in objects.items():
        store.put(key, b"q" * size)
    after = datetime.now(timezone.utc) + timedelta(seconds=5)
    listed = list(store.list())
    assert [info.key for info in listed] == sorted(objects)
    for info in listed:
        assert isinstance(info, ObjectInfo) and info.size == objects[info.key]
        assert info.modified.tzinfo is not None and info.modified.utcoffset() == timedelta(0)
        assert before <= info.modified <= after
    assert [i.key for i in store.list("a")] == ["a/x", "a/y/z", "ab"]  # a string prefix, as S3 has it
    assert [i.key for i in store.list("a/")] == ["a/x", "a/y/z"]
    assert [i.key for i in store.list("c/d/")] == ["c/d/e/f"]
    assert list(store.list("nothing/here/")) == []
    store.delete("a/x")
    assert [i.key for i in store.list("a/")] == ["a/y/z"]


def test_delete_is_idempotent(store: ListableStore) -> None:
    store.put("d/k", b"x")
    store.delete("d/k")
    store.delete("d/k")
    store.delete("never/stored/at/all")
    with pytest.raises(StoreError) as err:
        store.open("d/k")
    assert err.value.missing and err.value.reason == Reason.STORE_ERROR


@pytest.mark.parametrize("key", ["../escape", "/abs", "a/../../b", "a//b", "a\0b", "a\\b", "", ".", "x/./y"])
def test_keys_are_confined(store: ListableStore, key: str) -> None:
    for call in (lambda: store.put(key, b"x"), lambda: store.open(key), lambda: store.delete(key)):
        with pytest.raises(PathError):
            call()
    with pytest.raises(PathError):
        list(store.list("../"))
    assert list(store.list()) == []


def test_missing_object_is_told_from_other_errors(store: ListableStore) -> None:
    with pytest.raises(StoreError) as err:
        store.open("no/such/object")
    assert err.value.missing and err.value.details["cause"] == StoreFault.MISSING
    msg = offload(os.urandom(1000), store, threshold=10, key="gone")
    store.delete("gone")
    with pytest.raises(StoreError) as raised:
        resolve(msg, store)
    assert raised.value.missing
    skipped = resolve(msg, store, missing="skip")
    assert isinstance(skipped, MissingPayload) and skipped != b""  # never an empty payload
    assert (skipped.store, skipped.key, skipped.claim.length) == ("st", "gone", 1000)
    sink = io.BytesIO()
    assert isinstance(resolve_into(msg, store, sink, missing="skip"), MissingPayload) and sink.getvalue() == b""
    store.put("gone", b"wrong size")  # present but wrong: an error whatever the policy
    with pytest.raises(StoreError) as wrong:
        resolve(msg, store, missing="skip")
    assert wrong.value.reason == Reason.OBJECT_SIZE_ERROR and not wrong.value.missing


def test_offload_resolve_release(store: ListableStore) -> None:
    payload = os.urandom(300_000)
    msg = offload(payload, store)
    key = read_claim(msg.body).key  # the key the producer stored (what a ledger records)
    assert [i.key for i in store.list()] == [key]
    assert resolve(msg, store) == payload
    sink = io.BytesIO()
    assert resolve_into(msg, store, sink, chunk_size=4096) == len(payload) and sink.getvalue() == payload
    claim = release(msg, store)  # after the consumer's commit
    assert claim is not None and claim.key == key and list(store.list()) == []
    assert release(msg, store) == claim  # idempotent
    assert release(offload(b"small", store), store) is None  # inline: nothing stored, nothing to release


# ------------------------------------------------------------------ the files themselves
def test_directory_store_files_are_private(tmp_path: Path) -> None:
    old = os.umask(0)  # even with a permissive umask
    try:
        for store in (DirectoryStore(tmp_path / "a"), FsspecStore(str(tmp_path / "b"))):
            store.put("k/v", b"secret")
            root = Path(store.root) if isinstance(store, DirectoryStore) else tmp_path / "b"
            assert (root / "k" / "v").stat().st_mode & 0o777 == 0o600
        DirectoryStore(tmp_path / "c", file_mode=0o640).put("k", b"x")
        assert (tmp_path / "c" / "k").stat().st_mode & 0o777 == 0o640
    finally:
        os.umask(old)


def test_directory_listing_skips_links_temporaries_and_the_receiver(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path / "s")
    store.put("real", b"1")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_bytes(b"2")
    (tmp_path / "s" / "link").symlink_to(tmp_path / "outside" / "secret")
    (tmp_path / "s" / "dirlink").symlink_to(tmp_path / "outside")
    (tmp_path / "s" / f".real.{uuid.uuid4().hex}.tmp").write_bytes(b"unfinished put")
    (tmp_path / "s" / ".refmsg").mkdir()
    (tmp_path / "s" / ".refmsg" / "lock").write_bytes(b"")
    os.mkfifo(tmp_path / "s" / "fifo")
    assert [i.key for i in store.list()] == ["real"]
    with pytest.raises(StoreError) as err:
        store.open("link")
    assert err.value.details["cause"] == StoreFault.NOT_AN_OBJECT and not err.value.missing


# ------------------------------------------------------------------ the receiving side: allowlist, delete order
class Recording:
    """A store that records every call: proves a refused reference touched nothing."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.inner = FsspecStore(f"memory://rec-{uuid.uuid4().hex}", name=name)
        self.calls: list[str] = []

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        self.calls.append("put")
        self.inner.put(key, data)

    def open(self, key: str) -> StoredObject:
        self.calls.append("open")
        return self.inner.open(key)

    def delete(self, key: str) -> None:
        self.calls.append("delete")
        self.inner.delete(key)


def test_allowlist(tmp_path: Path) -> None:
    prod, dev = Recording("s3-prod"), Recording("dev")
    payload = os.urandom(5000)
    msg = offload(payload, prod, threshold=10)
    allow = {"s3-prod": prod, "dir": DirectoryStore(tmp_path)}
    assert resolve(msg, allow) == payload
    prod.calls.clear()
    forged = offload(payload, dev, threshold=10)  # a reference naming a store the consumer must never read
    for call in (
        lambda: resolve(forged, allow),
        lambda: resolve_into(forged, allow, io.BytesIO()),
        lambda: release(forged, allow),
        lambda: resolve(forged, allow, missing="skip"),
    ):
        with pytest.raises(StoreError) as err:
            call()
        assert err.value.details["cause"] == StoreFault.NOT_ALLOWED
        assert err.value.details["env"] == "dev" and err.value.details["allowed"] == ["dir", "s3-prod"]
    assert prod.calls == [] and dev.calls == ["put"]  # refused before any store was touched
    with pytest.raises(StoreError) as one:  # one store: the reference must name it
        resolve(forged, prod)
    assert one.value.details["cause"] == StoreFault.WRONG_STORE and prod.calls == []


def test_max_size_is_checked_before_the_store_is_asked() -> None:
    rec = Recording("r")
    msg = offload(os.urandom(5000), rec, threshold=10)
    rec.calls.clear()
    with pytest.raises(MessageTooBigError):
        resolve(msg, {"r": rec}, max_size=4999, missing="skip")
    assert rec.calls == []


def test_safe_and_unsafe_delete_orders() -> None:
    rec = Recording("r")
    payload = os.urandom(5000)
    msg = offload(payload, rec, threshold=10)
    assert resolve(msg, rec) == payload and "delete" not in rec.calls  # resolving never deletes by default
    committed: list[bytes] = []
    committed.append(resolve(msg, rec))  # ... the consumer commits its output and the message ...
    release(msg, rec)  # ... then the payload goes, last
    assert rec.calls[-1] == "delete" and committed == [payload]
    again = offload(payload, rec, threshold=10)
    assert resolve(again, rec, delete=True) == payload  # the unsafe order, still available
    assert rec.calls[-2:] == ["open", "delete"]


def test_missing_policy_is_checked() -> None:
    rec = Recording("r")
    with pytest.raises(SegmentationError) as err:
        resolve(offload(os.urandom(100), rec, threshold=10), rec, missing="ignore")  # type: ignore[call-overload]
    assert err.value.reason == Reason.ARGUMENT_ERROR


def test_a_read_failure_of_the_back_end_is_a_store_error() -> None:
    class Failing(io.RawIOBase):
        def readable(self) -> bool:
            return True

        def readinto(self, b: Any) -> int:
            raise ConnectionResetError("peer reset")

    rec = Recording("r")
    msg = offload(os.urandom(100), rec, threshold=10)
    rec.open = lambda key: StoredObject(100, io.BufferedReader(Failing()))  # type: ignore[method-assign]
    with pytest.raises(StoreError) as err:
        resolve(msg, rec)
    assert err.value.details["offset"] == 0


# ------------------------------------------------------------------ open_store
def test_open_store_urls(tmp_path: Path, s3_store_url: S3Bucket) -> None:
    plain = open_store(tmp_path / "p")
    assert isinstance(plain, DirectoryStore) and plain.name == "dir"
    assert isinstance(open_store(f"file://{tmp_path / 'f'}", name="x", fsync=False), DirectoryStore)
    mem = open_store(f"memory://open-{uuid.uuid4().hex}/pre")
    assert isinstance(mem, FsspecStore) and mem.name == "memory"
    s3 = open_store(s3_store_url.url, name="s3-prod", **s3_store_url.options)
    assert isinstance(s3, FsspecStore) and s3.name == "s3-prod"
    s3.put("k", b"v")
    listed = s3_store_url.client().list_objects_v2(Bucket=s3_store_url.bucket)["Contents"]
    assert [o["Key"] for o in listed] == ["payloads/k"]  # under the URL's prefix
    for bad in ("nosuchprotocol://x/y", "://x"):
        with pytest.raises(StoreError) as err:
            open_store(bad)
        assert err.value.details["cause"] == StoreFault.CONFIG
    with pytest.raises(StoreError) as err:
        open_store(tmp_path / "q", endpoint_url="http://127.0.0.1:1")  # an option a directory does not take
    assert err.value.details["cause"] == StoreFault.CONFIG
    no_bucket = open_store(f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/p", **s3_store_url.options)
    msg = offload(os.urandom(1000), s3, threshold=10)
    with pytest.raises(StoreError) as gone:  # not "missing": skip must not hide a wrong bucket
        resolve(msg, {"s3-prod": no_bucket}, missing="skip")
    assert gone.value.details["cause"] == StoreFault.CONFIG and not gone.value.missing


def test_without_fsspec_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "fsspec", None)  # what `import fsspec` sees when it is not installed
    with pytest.raises(StoreError) as err:
        open_store("memory://x")
    assert "pip install fsspec cryptography (the extra objectstore" in str(err.value)
    assert err.value.details["cause"] == StoreFault.NOT_INSTALLED


def test_a_store_of_the_three_method_protocol_still_works() -> None:
    class Minimal:
        name = "mini"

        def __init__(self) -> None:
            self.objects: dict[str, bytes] = {}

        def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
            self.objects[key] = bytes(data)

        def open(self, key: str) -> StoredObject:
            try:
                return StoredObject(len(self.objects[key]), io.BytesIO(self.objects[key]))
            except KeyError:
                raise StoreError("gone", cause=StoreFault.MISSING) from None

        def delete(self, key: str) -> None:
            self.objects.pop(key, None)

    mini = Minimal()
    assert isinstance(mini, ObjectStore) and not isinstance(mini, ListableStore)
    msg = offload(b"z" * 500, mini, threshold=10)
    assert resolve(Message(msg.format, msg.body), mini) == b"z" * 500
    release(msg, mini)
    assert isinstance(resolve(msg, mini, missing="skip"), MissingPayload)
