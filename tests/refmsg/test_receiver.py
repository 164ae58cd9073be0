"""The receiver: ordering, duplicates, conflicts, path escapes, journal recovery, a real SIGKILL."""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from refmsg import (
    RMH,
    Chunker,
    DirectorySource,
    Integrity,
    Outcome,
    PathError,
    Receiver,
    ReferenceMessage,
    RmhFlags,
)
from refmsg.errors import JournalError
from refmsg.journal import RangeRecord, decode_journal, encode_record
from segmenter.checksum import ChecksumAlgorithm, checksum
from segmenter.errors import (
    ChecksumError,
    ConflictError,
    Reason,
    SegmentationError,
)
from tests.assembler.test_arbitration import forge_same_crc  # tests/ is on sys.path (pytest's rootdir import mode)

IID = bytes(range(1, 25))
CRC = ChecksumAlgorithm.CRC32
REPO = Path(__file__).resolve().parents[2]


def make(
    offset: int,
    data: bytes,
    *,
    last: bool = False,
    whole: bytes | None = None,
    name: str = "obj.bin",
    iid: bytes = IID,
    object_checksum: int | None = None,
) -> bytes:
    """One encoded chunk; ``whole`` (the object) adds the object length and checksum."""
    header = RMH(
        flags=RmhFlags.LAST if last else 0,
        object_instance_id=iid,
        dest_name=name,
        data_logical_offset=offset,
        data_logical_length=len(data),
    )
    integrity = Integrity(CRC, checksum(CRC, data))
    if whole is not None:
        crc = checksum(CRC, whole) if object_checksum is None else object_checksum
        integrity = Integrity(CRC, checksum(CRC, data), len(whole), crc)
    return ReferenceMessage(header, data, integrity).encode()


def chunks_of(payload: bytes, size: int, name: str = "obj.bin", iid: bytes = IID) -> list[bytes]:
    msgs = Chunker(max_length=size).messages(io.BytesIO(payload), name, instance_id=iid)
    return [m.encode() for m in msgs]


def test_out_of_order_object_visible_only_when_complete(tmp_path: Path) -> None:
    payload = os.urandom(10_000)
    msgs = chunks_of(payload, 1000)
    order = list(range(len(msgs)))
    random.Random(7).shuffle(order)
    final = tmp_path / "obj.bin"
    with Receiver(tmp_path) as rx:
        for n, i in enumerate(order):
            receipt = rx.receive(msgs[i])
            if n < len(order) - 1:
                assert receipt.outcome == Outcome.APPLIED and receipt.written == 1000
                assert not final.exists()
                assert (tmp_path / ".refmsg" / "objects" / (IID.hex() + ".part")).exists()
            else:
                assert receipt.outcome == Outcome.COMPLETED and receipt.path == str(final)
    assert final.read_bytes() == payload
    assert not (tmp_path / ".refmsg" / "objects" / (IID.hex() + ".part")).exists()


def test_nested_destination_and_empty_object(tmp_path: Path) -> None:
    with Receiver(tmp_path) as rx:
        receipt = rx.receive(chunks_of(b"", 100, name="a/b/c/empty")[0])
    assert receipt.outcome == Outcome.COMPLETED
    assert (tmp_path / "a" / "b" / "c" / "empty").read_bytes() == b""


def test_identical_redelivery_is_a_noop(tmp_path: Path) -> None:
    payload = os.urandom(3000)
    msgs = chunks_of(payload, 1000)
    journal = tmp_path / ".refmsg" / "objects" / (IID.hex() + ".journal")
    with Receiver(tmp_path) as rx:
        assert rx.receive(msgs[0]).outcome == Outcome.APPLIED
        size = journal.stat().st_size
        again = rx.receive(msgs[0])
        assert again.outcome == Outcome.DUPLICATE and again.written == 0
        assert journal.stat().st_size == size  # nothing re-applied, nothing journaled
        # An overlapping chunk with the same bytes writes only its new part.
        overlap = make(500, payload[500:1500])
        assert rx.receive(overlap).written == 500
        rx.receive(msgs[2])
        assert rx.receive(msgs[1]).outcome == Outcome.COMPLETED
        # After completion, re-deliveries are compared with the final file.
        assert rx.receive(msgs[1]).outcome == Outcome.DUPLICATE
        with pytest.raises(ConflictError):
            rx.receive(make(0, b"X" * 1000))
    assert (tmp_path / "obj.bin").read_bytes() == payload
    with Receiver(tmp_path) as rx:  # also across a restart
        assert rx.receive(msgs[0]).outcome == Outcome.DUPLICATE
        (tmp_path / "obj.bin").unlink()
        assert rx.receive(msgs[0]).outcome == Outcome.ALREADY_COMPLETE
        assert rx.forget_completed() == 1
        assert rx.receive(msgs[0]).outcome == Outcome.APPLIED  # a new transfer


def test_conflicting_copies_overwrite_nothing_and_the_object_is_never_delivered(tmp_path: Path) -> None:
    payload = os.urandom(3000)
    part = tmp_path / ".refmsg" / "objects" / (IID.hex() + ".part")
    with Receiver(tmp_path) as rx:
        rx.receive(make(0, payload[:1000]))
        before = part.read_bytes()
        with pytest.raises(ConflictError) as err:  # a second verified copy with other bytes: no guess
            rx.receive(make(0, bytes([payload[0] ^ 0xFF]) + payload[1:1000]))
        assert err.value.reason == Reason.CONFLICTING_DUPLICATE
        with pytest.raises(ConflictError):  # from now on nothing of this object is taken
            rx.receive(make(999, payload[999:2000]))
        assert part.read_bytes() == before  # nothing written by refused chunks
        with pytest.raises(ConflictError):
            rx.receive(make(2000, payload[2000:], last=True, whole=payload))
        (stuck,) = rx.incomplete()
        assert stuck.conflict and stuck.applied == 1000
    assert not (tmp_path / "obj.bin").exists()
    with Receiver(tmp_path) as rx:  # the journal remembers the conflict across restarts
        with pytest.raises(ConflictError):
            rx.receive(make(1000, payload[1000:2000]))
        assert [s.conflict for s in rx.purge(0)] == [True]
        rx.receive(make(0, payload[:1000]))  # purged: a fresh transfer starts
    assert not (tmp_path / "obj.bin").exists()


def test_a_copy_forged_to_the_same_crc_is_a_conflict_in_either_order(tmp_path: Path) -> None:
    payload = os.urandom(3000)
    forged = forge_same_crc(CRC, bytes(b ^ 0x33 for b in payload[:1000]), checksum(CRC, payload[:1000]))
    for first, second in ((payload[:1000], forged), (forged, payload[:1000])):
        root = tmp_path / first[:4].hex()
        with Receiver(root) as rx:
            rx.receive(make(1000, payload[1000:2000]))
            rx.receive(make(0, first))
            with pytest.raises(ConflictError):
                rx.receive(make(0, second))
            with pytest.raises(ConflictError):
                rx.receive(make(2000, payload[2000:], last=True, whole=payload))
        assert not (root / "obj.bin").exists()


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize(
    "other",
    [
        pytest.param(lambda p: make(100, p[100:250], last=True, whole=p[:250]), id="a-shorter-last"),
        pytest.param(lambda p: make(250, p[250:] + b"extra", last=True, whole=p + b"extra"), id="a-longer-last"),
        pytest.param(lambda p: make(250, p[250:] + b"extra"), id="a-chunk-past-the-end"),
        pytest.param(lambda p: make(0, p[:100], whole=p + b"x"), id="another-declared-length"),
    ],
)
def test_chunks_contradicting_the_object_length_are_a_conflict_in_either_order(
    tmp_path: Path, other: Any, reverse: bool
) -> None:
    """Each chunk is consistent in itself; which one tells the object's true end is no guess, so
    neither order delivers (the first to arrive does not win)."""
    payload = os.urandom(300)
    pair = [make(200, payload[200:], last=True, whole=payload), other(payload)]
    with Receiver(tmp_path) as rx:
        rx.receive(pair[reverse])
        with pytest.raises(ConflictError):
            rx.receive(pair[not reverse])
        with pytest.raises(ConflictError):
            rx.receive(make(0, payload[:200]))
        assert [s.conflict for s in rx.incomplete()] == [True]
    assert not (tmp_path / "obj.bin").exists()
    status, data = _spark_objects([*pair, make(0, payload[:200])])["obj.bin"]  # the Spark job agrees
    assert (status, data) == ("invalid", None)


def test_a_contradiction_after_delivery_is_refused_and_the_object_stays(tmp_path: Path) -> None:
    payload = os.urandom(300)
    with Receiver(tmp_path) as rx:
        rx.receive(make(200, payload[200:], last=True, whole=payload))
        assert rx.receive(make(0, payload[:200])).outcome == Outcome.COMPLETED
        with pytest.raises(ConflictError):
            rx.receive(make(250, payload[250:] + b"extra"))
    assert (tmp_path / "obj.bin").read_bytes() == payload


def test_two_declared_object_checksums_are_a_conflict(tmp_path: Path) -> None:
    payload = os.urandom(300)
    with Receiver(tmp_path) as rx:
        rx.receive(make(200, payload[200:], last=True, whole=payload))
        with pytest.raises(ConflictError):  # which declaration is genuine? no guess
            rx.receive(make(0, payload[:100], whole=payload, object_checksum=1234))
        with pytest.raises(ConflictError):
            rx.receive(make(0, payload[:200]))
        assert [s.conflict for s in rx.incomplete()] == [True]
    assert not (tmp_path / "obj.bin").exists()


def test_wrong_whole_object_checksum_keeps_the_object_invisible(tmp_path: Path) -> None:
    payload = os.urandom(200)
    bad = checksum(CRC, payload) ^ 1
    with Receiver(tmp_path) as rx:
        rx.receive(make(0, payload[:100]))
        with pytest.raises(ChecksumError) as err:
            rx.receive(make(100, payload[100:], last=True, whole=payload, object_checksum=bad))
        assert err.value.reason == Reason.MESSAGE_CHECKSUM_ERROR
        assert not (tmp_path / "obj.bin").exists()
        assert [o.name for o in rx.incomplete()] == ["obj.bin"]


def test_integrity_required_by_default(tmp_path: Path) -> None:
    plain = [m.encode() for m in Chunker(max_length=10, integrity=False).messages(io.BytesIO(b"a" * 25), "p")]
    with Receiver(tmp_path) as rx, pytest.raises(ChecksumError):
        rx.receive(plain[0])
    with Receiver(tmp_path, require_integrity=False) as rx:
        outcomes = [rx.receive(m).outcome for m in plain]
    assert outcomes[-1] == Outcome.COMPLETED
    assert (tmp_path / "p").read_bytes() == b"a" * 25


ESCAPES = [
    "../outside",
    "a/../../outside",
    "..",
    "/etc/passwd",
    "//etc/passwd",
    "\\windows\\x",
    "C:evil",
    "a\\..\\b",
    "a\0b",
    "",
    "a//b",
    "./a",
    "a/.",
    ".refmsg/objects/x",
    "x" * 256,
]


@pytest.mark.parametrize("name", ESCAPES)
def test_path_escapes_are_refused(tmp_path: Path, name: str) -> None:
    root = tmp_path / "root"
    with Receiver(root) as rx:
        msg = ReferenceMessage(
            RMH(flags=RmhFlags.LAST, object_instance_id=IID, dest_name=name, data_logical_length=3),
            b"bad",
            Integrity(CRC, checksum(CRC, b"bad"), 3, checksum(CRC, b"bad")),
        )
        with pytest.raises(PathError) as err:
            rx.receive(msg.encode())
        assert err.value.reason == Reason.PATH_ERROR
    assert sorted(p.name for p in tmp_path.iterdir()) == ["root"]
    assert sorted(p.name for p in root.iterdir()) == [".refmsg"]


def test_symlinks_are_never_followed(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "link").symlink_to(outside, target_is_directory=True)
    (root / "file-link").symlink_to(outside / "target")
    with Receiver(root) as rx:
        for name in ("link/x", "file-link"):
            with pytest.raises(PathError):
                rx.receive(make(0, b"abc", last=True, whole=b"abc", name=name, iid=os.urandom(24)))
        # A symlink planted mid-transfer, after the first chunk, is refused at the rename.
        (root / "later").mkdir()
        rx.receive(make(0, b"ab", name="later/x"))
        (root / "later").rmdir()
        (root / "later").symlink_to(outside, target_is_directory=True)
        with pytest.raises(PathError):
            rx.receive(make(2, b"c", last=True, whole=b"abc", name="later/x"))
    assert list(outside.iterdir()) == []


def test_one_receiver_per_root(tmp_path: Path) -> None:
    with Receiver(tmp_path), pytest.raises(SegmentationError) as err:
        Receiver(tmp_path)
    assert err.value.reason == Reason.STATE_ERROR


def test_existing_destination(tmp_path: Path) -> None:
    (tmp_path / "obj.bin").write_bytes(b"old")
    with Receiver(tmp_path, replace_existing=False) as rx, pytest.raises(PathError):
        rx.receive(make(0, b"new", last=True, whole=b"new"))
    assert (tmp_path / "obj.bin").read_bytes() == b"old"
    with Receiver(tmp_path) as rx:
        rx.receive(make(0, b"new", last=True, whole=b"new", iid=os.urandom(24)))
    assert (tmp_path / "obj.bin").read_bytes() == b"new"


def test_resume_after_restart_and_torn_journal_record(tmp_path: Path) -> None:
    payload = os.urandom(5000)
    msgs = chunks_of(payload, 1000)
    journal = tmp_path / ".refmsg" / "objects" / (IID.hex() + ".journal")
    with Receiver(tmp_path) as rx:
        for m in msgs[:3]:
            rx.receive(m)
    good = journal.stat().st_size
    torn = encode_record(RangeRecord(0.0, 3000, 1000, 0))
    with open(journal, "ab") as f:
        f.write(torn[: len(torn) // 2])  # killed mid-append
    with Receiver(tmp_path) as rx:
        assert rx.receive(msgs[0]).outcome == Outcome.DUPLICATE  # journals are opened on first use
        assert journal.stat().st_size == good  # cut back to the last good record
        outcomes = [rx.receive(m).outcome for m in msgs]
    assert outcomes == [Outcome.DUPLICATE] * 3 + [Outcome.APPLIED, Outcome.COMPLETED]
    assert (tmp_path / "obj.bin").read_bytes() == payload


def test_unjournaled_bytes_are_written_again(tmp_path: Path) -> None:
    payload = os.urandom(2000)
    msgs = chunks_of(payload, 1000)
    part = tmp_path / ".refmsg" / "objects" / (IID.hex() + ".part")
    with Receiver(tmp_path) as rx:
        rx.receive(msgs[0])
    with open(part, "r+b") as f:  # killed after writing chunk 2 (garbage) but before journaling it
        f.seek(1000)
        f.write(b"\xee" * 1000)
    with Receiver(tmp_path) as rx:
        assert rx.receive(msgs[1]).outcome == Outcome.COMPLETED
    assert (tmp_path / "obj.bin").read_bytes() == payload


def test_killed_between_rename_and_done_record(tmp_path: Path) -> None:
    payload = os.urandom(2000)
    msgs = chunks_of(payload, 1000)
    journal = tmp_path / ".refmsg" / "objects" / (IID.hex() + ".journal")
    with Receiver(tmp_path) as rx:
        for m in msgs:
            rx.receive(m)
    data = journal.read_bytes()
    records = decode_journal(data).records
    done = encode_record(records[-1])
    journal.write_bytes(data[: -len(done)])  # the DONE record never made it
    with Receiver(tmp_path) as rx:
        assert rx.receive(msgs[0]).outcome == Outcome.DUPLICATE
        assert rx.incomplete() == []
    assert (tmp_path / "obj.bin").read_bytes() == payload


def test_killed_after_last_range_before_rename(tmp_path: Path) -> None:
    payload = os.urandom(2000)
    msgs = chunks_of(payload, 1000)
    objects = tmp_path / ".refmsg" / "objects"
    with Receiver(tmp_path) as rx:
        rx.receive(msgs[0])
        rx.receive(msgs[1])
    # Undo the rename and the DONE record: as if killed between journaling and renaming.
    (tmp_path / "obj.bin").rename(objects / (IID.hex() + ".part"))
    journal = objects / (IID.hex() + ".journal")
    data = journal.read_bytes()
    journal.write_bytes(data[: -len(encode_record(decode_journal(data).records[-1]))])
    with Receiver(tmp_path) as rx:
        assert rx.receive(msgs[1]).outcome == Outcome.DUPLICATE
    assert (tmp_path / "obj.bin").read_bytes() == payload


def test_damaged_journal_is_an_error_not_a_silent_loss(tmp_path: Path) -> None:
    msgs = chunks_of(os.urandom(3000), 1000)
    journal = tmp_path / ".refmsg" / "objects" / (IID.hex() + ".journal")
    with Receiver(tmp_path) as rx:
        rx.receive(msgs[0])
        rx.receive(msgs[1])
    data = bytearray(journal.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a record in the middle, followed by good ones
    journal.write_bytes(bytes(data))
    with Receiver(tmp_path) as rx, pytest.raises(JournalError):
        rx.receive(msgs[2])


def test_incomplete_objects_reported_and_purged_by_age(tmp_path: Path) -> None:
    now = [1000.0]
    with Receiver(tmp_path, clock=lambda: now[0], max_age=600) as rx:
        rx.receive(make(0, b"a" * 10, name="old", iid=b"\x01" * 24))
        now[0] = 1500.0
        rx.receive(make(10, b"b" * 10, last=True, whole=b"a" * 5 + b"b" * 15, name="young", iid=b"\x02" * 24))
        rx.receive(chunks_of(b"done", 10, name="finished", iid=b"\x03" * 24)[0])
        now[0] = 2000.0
        report = rx.incomplete(older_than=600)
        assert [(o.name, o.age(now[0]), o.applied, o.last_arrived) for o in report] == [("old", 1000.0, 10, False)]
        assert [o.name for o in rx.incomplete()] == ["old"]  # the configured max_age
        assert {o.name for o in rx.incomplete(older_than=0)} == {"old", "young"}
        young = next(o for o in rx.incomplete(older_than=0) if o.name == "young")
        assert young.object_length == 20 and [tuple(g) for g in young.gaps] == [(0, 10)]
        assert [o.name for o in rx.purge()] == ["old"]
        assert {o.name for o in rx.incomplete(older_than=0)} == {"young"}
        # A purged object starts over when a chunk arrives again.
        assert rx.receive(make(0, b"a" * 10, name="old", iid=b"\x01" * 24)).outcome == Outcome.APPLIED
    assert (tmp_path / "finished").read_bytes() == b"done"


def test_header_only_messages_fetch_from_shared_storage(tmp_path: Path) -> None:
    shared, root = tmp_path / "shared", tmp_path / "root"
    shared.mkdir()
    payload = os.urandom(2500)
    (shared / "big.dat").write_bytes(payload)
    msgs = list(
        Chunker(max_length=1000).messages(io.BytesIO(payload), "copy.dat", src_name="big.dat", header_only=True)
    )
    with Receiver(root, source=DirectorySource(shared)) as rx:
        outcomes = [rx.receive(m.encode()).outcome for m in reversed(msgs)]
    assert outcomes[-1] == Outcome.COMPLETED
    assert (root / "copy.dat").read_bytes() == payload
    (shared / "big.dat").write_bytes(bytes([payload[0] ^ 0xFF]) + payload[1:])  # the shared copy changed under us
    with Receiver(tmp_path / "root2", source=DirectorySource(shared)) as rx, pytest.raises(ChecksumError):
        rx.receive(msgs[0].encode())
    with Receiver(tmp_path / "root3") as rx, pytest.raises(SegmentationError):
        rx.receive(msgs[0].encode())  # no source configured


def _frame(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


def _start(root: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "reassembly", "receive", "--root", str(root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=REPO,
    )


def test_sigkill_mid_object_then_restart_gives_identical_object(tmp_path: Path) -> None:
    payload = os.urandom(120 * 1024)
    msgs = chunks_of(payload, 1024, name="dir/big.bin")
    proc = _start(tmp_path)
    assert proc.stdin is not None and proc.stdout is not None
    acked = 0
    for m in msgs[:40]:
        proc.stdin.write(_frame(m))
    proc.stdin.flush()
    while acked < 30:
        line = json.loads(proc.stdout.readline())
        assert line["outcome"] == "applied", line
        acked += 1
    for m in msgs[40:60]:  # more in flight: the kill lands somewhere in the middle of them
        proc.stdin.write(_frame(m))
    proc.stdin.flush()
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    assert not (tmp_path / "dir" / "big.bin").exists()
    journal = tmp_path / ".refmsg" / "objects" / (IID.hex() + ".journal")
    applied = sum(r.length for r in decode_journal(journal.read_bytes()).records if isinstance(r, RangeRecord))
    assert 30 * 1024 <= applied <= 60 * 1024  # killed part-way: the acknowledged chunks are durable

    # Restart and re-deliver everything (MQ backs out and redelivers), in a shuffled order.
    proc = _start(tmp_path)
    order = list(range(len(msgs)))
    random.Random(3).shuffle(order)
    out, _ = proc.communicate(b"".join(_frame(msgs[i]) for i in order), timeout=120)
    assert proc.returncode == 0
    lines = [json.loads(x) for x in out.decode().splitlines()]
    assert len(lines) == len(msgs)
    assert not [x for x in lines if "error" in x]
    by_offset = {x["offset"]: x["outcome"] for x in lines}
    for i in range(30):  # acknowledged before the kill: durable, never re-applied
        assert by_offset[i * 1024] in ("duplicate", "completed"), (i, by_offset[i * 1024])
    assert sum(x["outcome"] == "completed" for x in lines) == 1
    assert (tmp_path / "dir" / "big.bin").read_bytes() == payload


def _run_receive(root: Path, stdin: bytes | Path) -> subprocess.CompletedProcess[bytes]:
    cmd = [sys.executable, "-m", "reassembly", "receive", "--root", str(root)]
    if isinstance(stdin, Path):
        with stdin.open("rb") as f:
            return subprocess.run(cmd, stdin=f, capture_output=True, cwd=REPO, timeout=120)
    return subprocess.run(cmd, input=stdin, capture_output=True, cwd=REPO, timeout=120)


def test_the_receive_command_reports_every_frame_and_refuses_what_it_cannot_frame(tmp_path: Path) -> None:
    """A name too long to journal is one error line and the next frame is still received; input
    that ends inside a frame, or declares a frame over 100 MiB, is an error (exit 1) after the frames
    before it were answered, never a silent end or an allocation of the declared size."""
    long_name = "/".join(["a" * 200] * 330)  # every part under 255 bytes, 66,329 in all
    (ok,) = chunks_of(b"fine", 1024, name="ok.txt", iid=bytes(24))
    done = _run_receive(tmp_path / "r1", _frame(chunks_of(b"x", 1024, name=long_name)[0]) + _frame(ok))
    lines = [json.loads(x) for x in done.stdout.decode().splitlines()]
    assert done.returncode == 0 and [x.get("reason") for x in lines] == ["PATH_ERROR", None]
    assert lines[1]["outcome"] == "completed" and (tmp_path / "r1" / "ok.txt").read_bytes() == b"fine"
    for tail, says in (
        (b"\x00\x00\x00\x64hello", "input ends inside a frame (5 of 100 bytes)"),
        (b"\x00\x00", "input ends inside a frame (2 bytes of a length prefix)"),
        (b"\xff\xff\xff\xf0abc", "frame of 4294967280 bytes declared"),
    ):
        done = _run_receive(tmp_path / "r2", _frame(ok) + tail)
        assert done.returncode == 1 and says in done.stderr.decode(), done.stderr
        assert len(done.stdout.decode().splitlines()) == 1  # the whole frame before it was answered


def test_the_receive_command_refuses_input_read_from_inside_its_root(tmp_path: Path) -> None:
    (frame,) = chunks_of(b"12345", 1024, name="frames.bin")
    root = tmp_path / "root"
    root.mkdir()
    (root / "frames.bin").write_bytes(_frame(frame))
    done = _run_receive(root, root / "frames.bin")
    assert done.returncode == 2 and b"is inside --root" in done.stderr
    assert (root / "frames.bin").read_bytes() == _frame(frame)  # untouched
    outside = tmp_path / "frames.bin"
    outside.write_bytes(_frame(frame))
    assert _run_receive(root, outside).returncode == 0 and (root / "frames.bin").read_bytes() == b"12345"


def test_a_directory_source_reads_no_more_than_the_file_holds(tmp_path: Path) -> None:
    """A header-only message may declare 2**31-1 bytes of a 10-byte file: refused as truncated
    without a buffer of the declared size."""
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "small.dat").write_bytes(b"0123456789")
    import tracemalloc

    tracemalloc.start()
    with pytest.raises(SegmentationError) as refused:
        DirectorySource(shared).read_range("", "small.dat", 0, 2**31 - 1)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert refused.value.reason == Reason.TRUNCATED and peak < 1 << 20
    assert DirectorySource(shared).read_range("", "small.dat", 2, 3) == b"234"


def _spark_objects(raws: list[bytes]) -> dict[str, tuple[str, bytes | None]]:
    """What the ``refmsg`` Spark job decides for these messages (its two Arrow functions, run here)."""
    import pyarrow as pa

    from reassembly.spark.batch.objects import _KEYED, _key_fn, _object_fn

    keyed = next(
        _key_fn(
            iter([pa.RecordBatch.from_pylist([{"raw": r} for r in raws], schema=pa.schema([("raw", pa.binary())]))])
        )
    )
    groups: dict[tuple[str, bytes], list[dict[str, Any]]] = {}
    for row in keyed.to_pylist():
        groups.setdefault((row["dest_name"], row["object_instance_id"]), []).append(row)
    out = {}
    for rows in groups.values():
        (obj,) = [
            r
            for r in next(_object_fn(iter([pa.RecordBatch.from_pylist(rows, schema=_KEYED)]))).to_pylist()
            if r["kind"] == "object"
        ]
        out[obj["dest_name"]] = (obj["status"], obj["data"])
    return out


def _received(root: Path, raws: list[bytes]) -> dict[str, bytes]:
    with Receiver(root) as rx:
        for raw in raws:
            with contextlib.suppress(SegmentationError):
                rx.receive(raw)
    return {p.name: p.read_bytes() for p in root.iterdir() if p.is_file()}


def test_the_spark_job_delivers_exactly_what_the_receiver_delivers(tmp_path: Path) -> None:
    """The Spark job checks what the receiver checks: the integrity block's object length and its
    SHA-256, a header-only message (which carries no bytes to deliver), and names an object by its
    destination or else its source. It delivered all four objects below; the receiver refused three."""
    import hashlib

    from segmenter.digest import Digests

    obj = b"0123456789ABCDEFGHIJ"

    def chunk(data: bytes, offset: int, *, last: bool = False, length: int | None = None, dest: str = "f.bin",
              src: str = "", whole: tuple[int, int] | None = None, digests: Digests | None = None,
              iid: bytes = IID) -> bytes:  # fmt: skip
        size = len(data) if length is None else length
        header = RMH(flags=RmhFlags.LAST if last else 0, object_instance_id=iid, dest_name=dest, src_name=src,
                     data_logical_offset=offset, data_logical_length=size)  # fmt: skip
        if whole is None:
            return ReferenceMessage(header, data, Integrity(CRC, checksum(CRC, data))).encode()
        integrity = Integrity(CRC, checksum(CRC, data), whole[0], whole[1], digests or Digests())
        return ReferenceMessage(header, data, integrity).encode()

    full = (len(obj), checksum(CRC, obj))
    cases = {
        "wrong sha-256": [chunk(obj[:10], 0), chunk(obj[10:], 10, last=True, whole=full,
                                                   digests=Digests(sha256=hashlib.sha256(b"other").digest()))],
        "object length 30, ends at 20": [chunk(obj[:10], 0), chunk(obj[10:], 10, last=True, whole=(30, full[1]))],
        "header-only last": [chunk(obj[:10], 0), chunk(b"", 10, last=True, length=10, whole=full)],
    }  # fmt: skip
    for name, raws in cases.items():
        assert _received(tmp_path / name.replace(" ", "_"), raws) == {}, name
        assert _spark_objects(raws)["f.bin"][0] != "complete", name

    def named(data: bytes, src: str) -> bytes:  # no destination, no ObjectInstanceId: told apart by source name
        return chunk(data, 0, last=True, dest="", src=src, whole=(len(data), checksum(CRC, data)), iid=bytes(24))

    by_source = [named(b"A" * 5, "srcA"), named(b"B" * 7, "srcB")]
    assert _received(tmp_path / "by_source", by_source) == {"srcA": b"A" * 5, "srcB": b"B" * 7}
    assert _spark_objects(by_source) == {"srcA": ("complete", b"A" * 5), "srcB": ("complete", b"B" * 7)}
