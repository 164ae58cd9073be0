"""Claim check: a damaged reference is never a payload; a stored object is sized before it is read.

Attacked from both ends: the reference (every single-bit flip, every truncation,
extensions, arbitrary damage, its MQMD Format) and the stored object (replaced,
grown, shrunk, swapped, a symlink, a directory, a FIFO, missing, changed while
read, a sparse file of a few GiB) with the memory and the bytes read measured
in a separate process.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refmsg import (
    CLAIM_CHECK_TYPE,
    DEFAULT_THRESHOLD,
    ENCODING_BIG_ENDIAN,
    ENCODING_NATIVE,
    FORMAT_REF_MSG_HEADER,
    DirectoryStore,
    Message,
    ObjectStore,
    PathError,
    RmhError,
    StoredObject,
    StoreError,
    StoreFault,
    claim_check_message,
    decode_message,
    decode_rmh,
    is_claim_check,
    offload,
    read_claim,
    resolve,
    resolve_into,
)
from segmenter.checksum import ChecksumAlgorithm, checksum
from segmenter.errors import ChecksumError, MessageTooBigError, Reason, SegmentationError

MiB, GiB = 1 << 20, 1 << 30
REPO = Path(__file__).resolve().parents[2]


class MemoryStore:
    """A second store implementation: what an S3 adapter would look like (size first, then a stream)."""

    def __init__(self, name: str = "memory") -> None:
        self.name = name
        self.objects: dict[str, bytes] = {}
        self.opened: list[str] = []

    def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
        self.objects[key] = bytes(data)

    def open(self, key: str) -> StoredObject:
        self.opened.append(key)
        try:
            data = self.objects[key]
        except KeyError:
            raise StoreError(f"no object {key!r}", key=key) from None
        return StoredObject(len(data), io.BytesIO(data))

    def delete(self, key: str) -> None:
        self.objects.pop(key, None)


class Unreadable(io.RawIOBase):
    """A stream that must never be read: stands for an object whose size alone must refuse it."""

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        raise AssertionError("the object was read although its size is wrong")


def reference(tmp_path: Path, payload: bytes, **kw: Any) -> tuple[DirectoryStore, Message]:
    store = DirectoryStore(tmp_path / "store")
    return store, offload(payload, store, threshold=10, key=kw.pop("key", "obj"), **kw)


def flipped(body: bytes, bit: int) -> bytes:
    out = bytearray(body)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


# ------------------------------------------------------------------ the happy path and the threshold
def test_threshold_is_256_kib_and_inclusive(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path)
    assert DEFAULT_THRESHOLD == 256 * 1024
    at = b"x" + os.urandom(DEFAULT_THRESHOLD - 1)
    inline = offload(at, store)
    assert inline == Message("        ", at) and not inline.is_reference
    assert resolve(inline, store) == at and resolve(at, store) == at
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("algorithm", list(ChecksumAlgorithm))
@pytest.mark.parametrize("encoding", [ENCODING_NATIVE, ENCODING_BIG_ENDIAN])
def test_offload_and_resolve(tmp_path: Path, algorithm: ChecksumAlgorithm, encoding: int) -> None:
    store = DirectoryStore(tmp_path / "store")
    payload = os.urandom(DEFAULT_THRESHOLD + 1)
    msg = offload(payload, store, algorithm=algorithm, header_encoding=encoding)
    assert msg.format == FORMAT_REF_MSG_HEADER and len(msg.body) < 256
    rmh = decode_rmh(msg.body).header  # a plain MQ reader sees an ordinary MQRMH
    assert rmh.object_type == CLAIM_CHECK_TYPE and rmh.is_last
    assert rmh.data_logical_length == len(payload) and rmh.src_env == "dir"
    integrity = decode_message(msg.body, require_integrity=True).message.integrity
    assert integrity is not None and integrity.object_checksum == checksum(algorithm, payload)
    assert read_claim(msg.body)[:5] == (store.name, rmh.src_name, len(payload), algorithm, integrity.object_checksum)
    assert (tmp_path / "store" / rmh.src_name).read_bytes() == payload
    assert resolve(msg, store) == payload
    sink = io.BytesIO()
    assert resolve_into(msg, store, sink, chunk_size=1000) == len(payload) and sink.getvalue() == payload
    assert is_claim_check(msg.body)
    assert resolve(msg.body, store, delete=True) == payload  # recognised without the Format
    assert not (tmp_path / "store" / rmh.src_name).exists()


def test_pluggable_store() -> None:
    store = MemoryStore()
    assert isinstance(store, ObjectStore)
    payload = b"p" * 1000
    msg = offload(payload, store, threshold=100, key="k/1")
    assert store.objects == {"k/1": payload}
    assert resolve(msg, store) == payload
    with pytest.raises(StoreError) as err:  # resolving against another store is refused, before opening
        resolve(msg, MemoryStore("other"))
    assert err.value.details["env"] == "memory"


@given(payload=st.binary(max_size=300), threshold=st.integers(0, 300), bare=st.booleans())
@settings(max_examples=200)
def test_every_offloaded_payload_comes_back(payload: bytes, threshold: int, bare: bool) -> None:
    """Including payloads that look like a reference: offload stores them instead of inlining."""
    store = MemoryStore()
    msg = offload(payload, store, threshold=threshold)
    assert msg.is_reference == (len(payload) > threshold or is_claim_check(payload))
    assert resolve(msg.body if bare else msg, store) == payload


def test_inline_payloads_that_look_like_a_header(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path / "store")
    for sneaky in (b"RMH " + os.urandom(50), b"RMH!" + os.urandom(50), b"RM", b"R"):
        msg = offload(sneaky, store)
        assert msg.is_reference  # stored, although far below the threshold
        assert resolve(msg.body, store) == sneaky
        with pytest.raises(SegmentationError):  # not from offload: recognised, refused, never a payload
            resolve(sneaky, store)
        with pytest.raises(SegmentationError):
            resolve(Message("        ", sneaky), store)
    for plain in (b"", b"RMX", b"hello", b"\x00RMH " + os.urandom(50), b"rmh " + os.urandom(50)):
        assert not is_claim_check(plain)
        assert resolve(plain, store) == plain == resolve(offload(plain, store), store)


# ------------------------------------------------------------------ the reference, attacked
@pytest.mark.parametrize("algorithm", list(ChecksumAlgorithm))
@pytest.mark.parametrize("encoding", [ENCODING_NATIVE, ENCODING_BIG_ENDIAN])
@pytest.mark.parametrize("key", ["k", "a/much/longer/key-" + "x" * 60])
def test_every_single_bit_flip_of_a_reference_is_detected(
    tmp_path: Path, algorithm: ChecksumAlgorithm, encoding: int, key: str
) -> None:
    payload = os.urandom(3000)
    store, msg = reference(tmp_path, payload, algorithm=algorithm, header_encoding=encoding, key=key)
    reasons: dict[Reason, int] = {}
    for bit in range(len(msg.body) * 8):
        damaged = flipped(msg.body, bit)
        assert is_claim_check(damaged), bit  # still recognised as a reference, so never a payload
        for form in (damaged, Message(FORMAT_REF_MSG_HEADER, damaged), Message("        ", damaged)):
            with pytest.raises(SegmentationError) as err:
                resolve(form, store)
            with pytest.raises(SegmentationError):
                resolve_into(form, store, io.BytesIO())
        reasons[err.value.reason] = reasons.get(err.value.reason, 0) + 1
    assert sum(reasons.values()) == len(msg.body) * 8
    assert Reason.HEADER_CHECKSUM_ERROR in reasons and set(reasons) <= {
        Reason.HEADER_CHECKSUM_ERROR,
        Reason.RMH_ERROR,
        Reason.SRC_ENV_ERROR,
        Reason.SRC_NAME_ERROR,
        Reason.DEST_ENV_ERROR,
        Reason.DEST_NAME_ERROR,
    }
    assert resolve(msg.body, store) == payload  # the object itself was never touched


def test_every_bit_flip_of_the_format_is_harmless(tmp_path: Path) -> None:
    """A damaged MQMD Format no longer says "reference", but the body still does: the payload, verified."""
    payload = os.urandom(3000)
    store, msg = reference(tmp_path, payload)
    raw = FORMAT_REF_MSG_HEADER.encode("ascii")
    for bit in range(len(raw) * 8):
        fmt = flipped(raw, bit).decode("latin-1")
        assert resolve(Message(fmt, msg.body), store) == payload


def test_every_truncation_is_detected(tmp_path: Path) -> None:
    store, msg = reference(tmp_path, os.urandom(3000))
    for n in range(1, len(msg.body)):
        cut = msg.body[:n]
        for form in (cut, Message(FORMAT_REF_MSG_HEADER, cut)):
            with pytest.raises(SegmentationError) as err:
                resolve(form, store)
            assert err.value.reason in (Reason.RMH_ERROR, Reason.HEADER_CHECKSUM_ERROR), n
    with pytest.raises(RmhError):  # with the Format, even an empty body is a damaged reference
        resolve(Message(FORMAT_REF_MSG_HEADER, b""), store)
    # Bare, nothing is left to tell a reference cut to zero bytes from an empty payload (docs/how-to/refmsg.md).
    assert resolve(b"", store) == b""


def test_extensions_are_detected(tmp_path: Path) -> None:
    payload = os.urandom(3000)
    store, msg = reference(tmp_path, payload)
    for extra in (b"\0", b"\0\0\0\0", os.urandom(100), payload, msg.body):
        for form in (msg.body + extra, Message(FORMAT_REF_MSG_HEADER, msg.body + extra)):
            with pytest.raises(RmhError) as err:
                resolve(form, store)
            assert err.value.details["length"] == len(msg.body) + len(extra) or "data_logical_length" in (
                err.value.details
            )


@given(data=st.data())
@settings(max_examples=150)
def test_any_damage_is_refused_or_harmless(data: st.DataObject) -> None:
    """Several flipped bytes, then a cut or an extension: either an error or exactly the payload."""
    store = MemoryStore()
    payload = b"payload-" * 50
    body = bytearray(offload(payload, store, threshold=10, key="obj").body)
    for _ in range(data.draw(st.integers(1, 6))):
        body[data.draw(st.integers(0, len(body) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(body)))
    damaged = bytes(body[:cut]) + data.draw(st.binary(max_size=20))
    try:
        out = resolve(damaged, store)
    except SegmentationError:
        return
    assert out == payload or (out == damaged and not is_claim_check(damaged))


def test_forged_references_that_reseal_the_checksum_are_still_checked(tmp_path: Path) -> None:
    """The header checksum stops accidents, not forgers; the object's size and checksum still must match."""
    payload = os.urandom(3000)
    store, _ = reference(tmp_path, payload)
    other = claim_check_message(store.name, "obj", 3000, checksum(ChecksumAlgorithm.CRC32, payload) ^ 1)
    with pytest.raises(ChecksumError) as err:
        resolve(other, store)
    assert (
        err.value.reason == Reason.MESSAGE_CHECKSUM_ERROR
        and err.value.details["expected"] != (err.value.details["computed"])
    )
    longer = claim_check_message(store.name, "obj", 3001, 0)
    with pytest.raises(SegmentationError) as serr:
        resolve(longer, store)
    assert serr.value.reason == Reason.OBJECT_SIZE_ERROR
    assert (serr.value.details["length"], serr.value.details["expected"]) == (3000, 3001)


def test_a_reference_above_max_size_is_refused_before_the_store_is_asked() -> None:
    store = MemoryStore()
    msg = claim_check_message(store.name, "big", 2**31 - 1, 0)
    with pytest.raises(MessageTooBigError) as err:
        resolve(msg, store, max_size=10 * MiB)
    assert err.value.reason == Reason.MSG_TOO_BIG and err.value.details == {"length": 2**31 - 1, "limit": 10 * MiB}
    assert store.opened == []


# ------------------------------------------------------------------ the stored object, attacked
def test_object_replaced_with_other_bytes_of_the_same_size(tmp_path: Path) -> None:
    payload = os.urandom(5000)
    store, msg = reference(tmp_path, payload)
    (tmp_path / "store" / "obj").write_bytes(bytes([payload[0] ^ 0xFF]) + payload[1:])  # never the same byte
    with pytest.raises(ChecksumError) as err:
        resolve(msg, store)
    assert err.value.reason == Reason.MESSAGE_CHECKSUM_ERROR and err.value.details["key"] == "obj"


@pytest.mark.parametrize("size", [0, 4999, 5001, 5000 + MiB])
def test_object_grown_or_shrunk_is_refused_by_its_size_alone(tmp_path: Path, size: int) -> None:
    store, msg = reference(tmp_path, os.urandom(5000))
    with open(tmp_path / "store" / "obj", "r+b") as f:
        f.truncate(size)
    with pytest.raises(StoreError) as err:
        resolve(msg, store)
    assert err.value.reason == Reason.OBJECT_SIZE_ERROR
    assert (err.value.details["length"], err.value.details["expected"]) == (size, 5000)
    mem = MemoryStore("dir")
    mem.open = lambda key: StoredObject(size, io.BufferedReader(Unreadable()))  # type: ignore[method-assign]
    with pytest.raises(SegmentationError):  # any store: the size decides before a byte is read
        resolve(msg, mem)


def test_objects_swapped_between_two_references(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path / "store")
    same = [offload(os.urandom(5000), store, threshold=10, key=k) for k in ("a", "b")]
    longer = offload(os.urandom(6000), store, threshold=10, key="c")
    root = tmp_path / "store"
    (root / "a").rename(root / "tmp")
    (root / "b").rename(root / "a")
    (root / "tmp").rename(root / "b")
    for msg in same:
        with pytest.raises(ChecksumError):
            resolve(msg, store)
    (root / "c").rename(root / "tmp")
    (root / "a").rename(root / "c")
    with pytest.raises(SegmentationError) as err:
        resolve(longer, store)
    assert err.value.reason == Reason.OBJECT_SIZE_ERROR


@pytest.mark.parametrize("kind", ["symlink_to_object", "symlink_to_dev_zero", "directory", "fifo", "missing"])
def test_object_that_is_not_a_regular_file(tmp_path: Path, kind: str) -> None:
    payload = os.urandom(5000)
    store, msg = reference(tmp_path, payload)
    obj = tmp_path / "store" / "obj"
    obj.rename(tmp_path / "original")
    if kind == "symlink_to_object":
        obj.symlink_to(tmp_path / "original")  # even the right bytes are not read through a link
    elif kind == "symlink_to_dev_zero":
        obj.symlink_to("/dev/zero")
    elif kind == "directory":
        obj.mkdir()
    elif kind == "fifo":
        os.mkfifo(obj)  # no writer: a blocking open would hang the test
    with pytest.raises(StoreError) as err:
        resolve(msg, store)
    assert err.value.reason == Reason.STORE_ERROR and err.value.details["key"] == "obj"


def test_a_symlinked_directory_on_the_way_is_refused(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path / "store")
    msg = offload(os.urandom(5000), store, threshold=10, key="d/obj")
    (tmp_path / "store" / "d").rename(tmp_path / "elsewhere")
    (tmp_path / "store" / "d").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(StoreError) as err:
        resolve(msg, store)
    assert err.value.details["cause"] == StoreFault.NOT_AN_OBJECT


class Meddler(io.RawIOBase):
    """A sink that changes the stored object after the first piece arrives (a concurrent writer)."""

    def __init__(self, act: Any) -> None:
        self.out = bytearray()
        self._act = act

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        if not self.out:
            self._act()
        self.out += b
        return len(b)


def test_object_changed_while_it_is_read(tmp_path: Path) -> None:
    payload = os.urandom(50_000)
    store, msg = reference(tmp_path, payload)
    path = tmp_path / "store" / "obj"

    def shrink() -> None:
        os.truncate(path, 20_000)

    with pytest.raises(SegmentationError) as err:
        resolve_into(msg, store, Meddler(shrink), chunk_size=10_000)  # type: ignore[arg-type]
    assert err.value.reason == Reason.OBJECT_SIZE_ERROR and err.value.details["offset"] == 20_000

    path.write_bytes(payload)

    def grow() -> None:
        with open(path, "ab") as f:
            f.write(b"appended later")

    sink = Meddler(grow)
    assert resolve_into(msg, store, sink, chunk_size=10_000) == len(payload)  # type: ignore[arg-type]
    assert bytes(sink.out) == payload  # harmless: only the declared bytes are read, and they verify

    path.write_bytes(payload)
    other = tmp_path / "other"

    def replace() -> None:
        other.write_bytes(os.urandom(50_000))
        other.rename(path)  # the open descriptor still reads the object it opened

    sink = Meddler(replace)
    assert resolve_into(msg, store, sink, chunk_size=10_000) == len(payload)  # type: ignore[arg-type]
    assert bytes(sink.out) == payload


def test_a_damaged_object_never_reaches_the_sink_whole(tmp_path: Path) -> None:
    payload = os.urandom(50_000)
    store, msg = reference(tmp_path, payload)
    (tmp_path / "store" / "obj").write_bytes(payload[:-1] + bytes([payload[-1] ^ 1]))  # always a change
    sink = io.BytesIO()
    with pytest.raises(ChecksumError):
        resolve_into(msg, store, sink, chunk_size=10_000)
    assert len(sink.getvalue()) < len(payload)  # the last piece is held back until the checksum matched


@pytest.mark.parametrize("key", ["../escape", "/abs", "a/../../b", "a\0b", ".refmsg/x"])
def test_store_keys_are_confined(tmp_path: Path, key: str) -> None:
    store = DirectoryStore(tmp_path / "store")
    with pytest.raises(PathError):
        offload(b"x" * 100, store, threshold=10, key=key)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]


# ------------------------------------------------------------------ big sparse files, memory measured
CHILD = """
import json, os, sys
import psutil
from refmsg import DirectoryStore, Message, resolve, resolve_into
from segmenter.errors import SegmentationError

root, ref_file, mode = sys.argv[1:4]
msg = Message("MQHREF  ", open(ref_file, "rb").read())
store = DirectoryStore(root)
me = psutil.Process()
try:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak (VmHWM) to the current RSS: the peak below is the resolve's own
    reset = True
except OSError:  # not allowed here: only the parent's sampling measures the peak
    reset = False
rss_before, read_before = me.memory_info().rss, me.io_counters().read_chars
result = {}
try:
    if mode == "bytes":
        result["length"] = len(resolve(msg, store))
    else:
        with open(os.devnull, "wb") as sink:
            result["length"] = resolve_into(msg, store, sink)
except SegmentationError as exc:
    result["reason"] = int(exc.reason)
    result["details"] = exc.details
result["read"] = me.io_counters().read_chars - read_before
result["rss_before"] = rss_before
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
result["peak"] = int(status["VmHWM"].split()[0]) * 1024 if reset else rss_before
print(json.dumps(result))
"""


def zeros_crc(n: int) -> int:
    block, value = bytes(MiB), 0
    for _ in range(n // MiB):
        value = checksum(ChecksumAlgorithm.CRC32, block, value)
    return checksum(ChecksumAlgorithm.CRC32, block[: n % MiB], value)


def sparse(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        f.truncate(size)
    assert os.stat(path).st_blocks * 512 < MiB, "the filesystem must support sparse files"


def run_child(root: Path, msg: Message, mode: str) -> tuple[dict[str, Any], int]:
    """Resolve in a separate process; return its report and the highest RSS psutil saw from outside."""
    ref = root.parent / "ref.bin"
    ref.write_bytes(msg.body)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(root), str(ref), mode], stdout=subprocess.PIPE, env=env, text=True
    )
    watched, seen = psutil.Process(proc.pid), 0
    while proc.poll() is None:
        try:
            seen = max(seen, watched.memory_info().rss)
        except psutil.NoSuchProcess:
            break
        time.sleep(0.005)
    out, _ = proc.communicate()
    assert proc.returncode == 0
    report = json.loads(out)
    print(mode, {k: v for k, v in report.items() if k != "details"}, "rss seen from outside", seen)
    return report, seen


def test_object_replaced_by_a_3_gib_sparse_file_is_refused_unread(tmp_path: Path) -> None:
    _, msg = reference(tmp_path, os.urandom(5000))
    sparse(tmp_path / "store" / "obj", 3 * GiB)
    report, seen = run_child(tmp_path / "store", msg, "bytes")
    assert report["reason"] == Reason.OBJECT_SIZE_ERROR
    assert (report["details"]["length"], report["details"]["expected"]) == (3 * GiB, 5000)
    assert report["read"] < 4096  # no byte of the object: only psutil reading /proc
    assert report["peak"] - report["rss_before"] < 16 * MiB and seen - report["rss_before"] < 16 * MiB


def large_object_in_bounded_memory(tmp_path: Path, size: int) -> None:
    store = DirectoryStore(tmp_path / "store")
    sparse(tmp_path / "store" / "big", size)
    msg = claim_check_message(store.name, "big", size, zeros_crc(size))
    report, seen = run_child(tmp_path / "store", msg, "stream")
    assert report.get("length") == size, report
    assert size <= report["read"] < size + 4096  # the object exactly once, nothing past its size
    # DEFAULT_CHUNK_SIZE (1 MiB) in flight; measured: about 3 MiB above the RSS before, for 512 MiB and 2 GiB.
    assert report["peak"] - report["rss_before"] < 16 * MiB and seen - report["rss_before"] < 16 * MiB
    (tmp_path / "store" / "big").unlink()


def test_a_large_object_streams_in_bounded_memory(tmp_path: Path) -> None:
    large_object_in_bounded_memory(tmp_path, 512 * MiB)


@pytest.mark.slow
def test_the_largest_object_streams_in_bounded_memory(tmp_path: Path) -> None:
    large_object_in_bounded_memory(tmp_path, 2**31 - 1)  # DataLogicalLength's maximum
