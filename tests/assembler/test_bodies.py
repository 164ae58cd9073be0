"""Large messages kept in a BodyStore: same rules and outcomes as in memory, bodies in files, nothing left over."""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reassembly import (
    Assembler,
    ConflictingDuplicate,
    Duplicate,
    Limits,
    MessageComplete,
    MessageFailed,
    Unfinished,
)
from reassembly.assembler.bodies import StoredBody
from reassembly.storage import filestore
from reassembly.storage.filestore import FileBodyStore
from segmenter import ChecksumAlgorithm, Codec, Reason, Segment, SegmentationError, Segmenter, segment
from segmenter.checksum import checksum
from segmenter.producer import new_group_id
from segmenter.wire import decode_segment


def stored_assembler(directory: Path, threshold: int = -1) -> tuple[Assembler, FileBodyStore]:
    store = FileBodyStore(directory, "test", threshold)
    return Assembler(Limits(max_message_size=1 << 30), batch=True, bodies=store), store


def only_complete(events: list[object]) -> MessageComplete:
    done = [e for e in events if isinstance(e, MessageComplete)]
    assert len(done) == 1, [type(e).__name__ for e in events]
    return done[0]


def test_a_stored_message_is_a_verified_file_and_holds_no_memory(tmp_path: Path) -> None:
    payload = os.urandom(300_000)
    segs = [s.encode() for s in segment(payload, 10_000)]
    asm, _ = stored_assembler(tmp_path)
    events = asm.receive_many(random.Random(1).sample(segs, len(segs)) + segs[:3])
    assert asm.buffered_bytes == 0  # everything went to the file as it arrived
    assert sum(isinstance(e, Duplicate) for e in events) == 3  # compared against the file
    done = only_complete(events + asm.close())
    assert isinstance(done.payload, StoredBody)
    assert done.payload.length == len(payload) and done.payload.checksum == checksum(1, payload)
    assert (tmp_path / done.payload.location).read_bytes() == payload
    assert sorted(p.name for p in tmp_path.iterdir()) == [done.payload.location]  # no work files left


def test_below_the_threshold_a_message_stays_in_memory(tmp_path: Path) -> None:
    payload = os.urandom(5000)
    asm, _ = stored_assembler(tmp_path, threshold=len(payload))
    done = only_complete(asm.receive_many([s.encode() for s in segment(payload, 1000)]) + asm.close())
    assert bytes(done.payload) == payload  # type: ignore[arg-type]
    assert not list(tmp_path.iterdir())


def test_a_conflicting_copy_that_wins_is_moved_into_place(tmp_path: Path) -> None:
    payload = os.urandom(50_000)
    segs = segment(payload, 10_000)
    h = segs[2].header
    fake = os.urandom(h.data_length)
    impostor = Segment(h._replace(data_checksum=checksum(h.algorithm, fake)), fake).encode()
    asm, _ = stored_assembler(tmp_path)
    events = asm.receive_many([impostor, *(s.encode() for s in segs)]) + asm.close()  # the impostor came first
    done = only_complete(events)
    assert isinstance(done.payload, StoredBody)
    assert (tmp_path / done.payload.location).read_bytes() == payload
    losers = [e for e in events if isinstance(e, ConflictingDuplicate)]
    assert [e.raw for e in losers] == [impostor]  # the loser's original bytes, read back from the store
    assert len(list(tmp_path.iterdir())) == 1


def test_zstd_is_decompressed_from_the_store_into_the_store(tmp_path: Path) -> None:
    payload = b"structured record, " * 20_000 + os.urandom(10_000)
    segs = [s.encode() for s in Segmenter(4096, codec=Codec.ZSTD).segment(payload)]
    asm, _ = stored_assembler(tmp_path)
    done = only_complete(asm.receive_many(segs[::-1]) + asm.close())
    assert isinstance(done.payload, StoredBody) and done.payload.length == len(payload)
    assert (tmp_path / done.payload.location).read_bytes() == payload
    assert len(list(tmp_path.iterdir())) == 1


def test_incomplete_and_failed_messages_leave_no_files_and_return_their_bytes(tmp_path: Path) -> None:
    gap = [s.encode() for s in segment(os.urandom(40_000), 10_000)]
    del gap[1]
    lying = [
        Segment(
            s.header._replace(
                message_checksum=None if s.header.message_checksum is None else s.header.message_checksum ^ 1
            ),
            s.data,
        ).encode()
        for s in segment(os.urandom(40_000), 10_000)
    ]
    asm, _ = stored_assembler(tmp_path)
    events = asm.receive_many(gap + lying) + asm.close()
    unfinished = [e for e in events if isinstance(e, Unfinished)]
    failed = [e for e in events if isinstance(e, MessageFailed)]
    assert len(unfinished) == 1 and sorted(unfinished[0].segments) == sorted(gap)
    assert unfinished[0].gaps[0].missing_ranges == ((9916, 19832),)
    assert len(failed) == 1 and failed[0].reason == Reason.MESSAGE_CHECKSUM_ERROR
    assert sorted(failed[0].segments) == sorted(lying)
    assert not list(tmp_path.iterdir())


def test_a_zstd_bomb_in_the_store_stops_at_the_declared_length(tmp_path: Path) -> None:
    import zstandard

    from segmenter.flags import MsgFlags
    from segmenter.wire import make_header

    body = zstandard.ZstdCompressor().compress(bytes(8 << 20))
    h = make_header(
        group_id=new_group_id(),
        msg_seq_number=1,
        offset=0,
        data=body,
        original_length=1000,
        stored_length=len(body),
        msg_flags=MsgFlags.NONE,
        codec=Codec.ZSTD,
        algorithm=1,  # type: ignore[arg-type]
        message_checksum=checksum(1, bytes(1000)),
    )
    asm, _ = stored_assembler(tmp_path)
    events = asm.receive_many([Segment(h, body).encode()]) + asm.close()
    assert [e.reason for e in events if isinstance(e, MessageFailed)] == [Reason.DECOMPRESSION_ERROR]
    assert not list(tmp_path.iterdir())


@given(
    payload=st.binary(min_size=0, max_size=20_000),
    size=st.integers(min_value=85, max_value=3000),
    seed=st.integers(0, 2**32),
    zstd=st.booleans(),
)
def test_any_payload_order_and_duplicates_give_the_same_bytes_as_in_memory(
    tmp_path_factory: object, payload: bytes, size: int, seed: int, zstd: bool
) -> None:
    directory = tmp_path_factory.mktemp("bodies")  # type: ignore[attr-defined]
    segs = [s.encode() for s in Segmenter(size, codec=Codec.ZSTD if zstd else Codec.NONE).segment(payload)]
    rng = random.Random(seed)
    arrivals = rng.sample(segs, len(segs)) + rng.choices(segs, k=rng.randrange(3))
    asm, _ = stored_assembler(directory)
    done = only_complete(asm.receive_many(arrivals) + asm.close())
    assert isinstance(done.payload, StoredBody)
    assert (directory / done.payload.location).read_bytes() == payload
    assert done.segments == len(segs)
    assert all(decode_segment(s).header.group_id == done.group_id for s in segs)


def test_work_files_are_created_never_opened_through_what_is_planted(tmp_path: Path, monkeypatch: Any) -> None:
    """Work-file names derive from the GroupId, which the segment carries: a symlink planted under
    one must not make the store truncate and fill a file outside its directory. Names end in a
    random part and are created exclusively: a planted name is refused (9018), nothing outside is
    touched."""
    import uuid as uuid_module

    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    store_dir = tmp_path / "store"
    store_dir.mkdir()
    gid = b"P" * 24
    (store_dir / f".{gid.hex()}-1.part-t").symlink_to(victim)  # an older layout's name (no random part)
    payload = os.urandom(500)
    segs = [s.encode() for s in segment(payload, 200, group_id=gid)]
    events = Assembler(bodies=FileBodyStore(store_dir, "t", threshold=0)).receive_many(segs)
    (done,) = [e for e in events if isinstance(e, MessageComplete)]
    assert isinstance(done.payload, StoredBody) and (store_dir / done.payload.location).read_bytes() == payload
    fixed = uuid_module.UUID(int=7)
    monkeypatch.setattr(uuid_module, "uuid4", lambda: fixed)  # the name is now predictable: plant it
    (store_dir / f".{gid.hex()}-1.part-t-{fixed.hex[:12]}").symlink_to(victim)
    with pytest.raises(SegmentationError) as refused:
        Assembler(bodies=FileBodyStore(store_dir, "t", threshold=0)).receive_many(segs)
    assert refused.value.reason == Reason.STORE_ERROR and victim.read_text() == "keep me"


def failing_to_put_in_place(monkeypatch: Any, stem: str) -> None:
    """A disk error (EIO) whenever a body whose name starts with ``stem`` is put in place."""
    real = filestore._put_in_place

    def put(done: Any, target: Path) -> None:
        if target.name.startswith(stem):
            raise OSError(errno.EIO, "Input/output error (injected)", str(target))
        real(done, target)

    monkeypatch.setattr(filestore, "_put_in_place", put)


def test_a_store_that_cannot_put_a_body_in_place_raises_our_error_and_the_assembler_goes_on(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """The store fails to put a body in place (a disk error stands in: a directory planted at the
    body's name is skipped): it raises our error, and the assembler goes on. The work files
    stay open until the message is done with, so no later call on that message, nor close(),
    meets EBADF."""
    payload = os.urandom(3000)
    gid = b"Q" * 24
    segs = [s.encode() for s in segment(payload, 1100, group_id=gid)]
    failing_to_put_in_place(monkeypatch, gid.hex())
    asm = Assembler(bodies=FileBodyStore(tmp_path, "t", threshold=0))
    with pytest.raises(SegmentationError) as refused:
        asm.receive_many(segs)
    assert refused.value.reason == Reason.STORE_ERROR
    other = os.urandom(3000)
    (done,) = [
        e for e in asm.receive_many([s.encode() for s in segment(other, 1100)]) if isinstance(e, MessageComplete)
    ]
    assert isinstance(done.payload, StoredBody) and (tmp_path / done.payload.location).read_bytes() == other
    assert [type(e).__name__ for e in asm.close()] == ["Unfinished"]  # the first one is reported, not lost


def test_kept_handles_survive_a_group_that_starts_again_and_die_loudly_after_purge(tmp_path: Path) -> None:
    """keep_failed: a revoked group read again must open its own work file, not reopen the one the
    kept handles point at (truncating it), and purge() must not delete the new message's file
    (FileNotFoundError at delivery); a purged handle raises our error, never reads whatever file
    reused its descriptor number."""
    payload = os.urandom(500)
    segs = [s.encode() for s in segment(payload, 200)]
    store = FileBodyStore(tmp_path, "t", threshold=0, keep_failed=True)
    asm = Assembler(bodies=store)
    asm.receive(segs[0], position=0, partition=0)
    asm.receive(segs[1], position=1, partition=0)
    (revoked,) = asm.revoke(0)
    handles = revoked.stored
    asm.receive(segs[0], position=0, partition=0)  # the partition comes back: read again
    assert sorted(bytes(h) for h in handles) == sorted(segs[:2])
    store.purge()
    events = [e for i in range(1, len(segs)) for e in asm.receive(segs[i], position=i, partition=0)]
    (done,) = [e for e in events if isinstance(e, MessageComplete)]
    assert isinstance(done.payload, StoredBody) and (tmp_path / done.payload.location).read_bytes() == payload
    with open(tmp_path / "unrelated", "wb") as other:  # takes a descriptor number a handle had
        other.write(b"x" * 1000)
        with pytest.raises(SegmentationError) as dead:
            bytes(handles[0])
    assert dead.value.reason == Reason.STORE_ERROR


def test_a_group_member_the_store_could_not_put_in_place_is_reported_never_dropped(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """unit_of_work=False: the store fails to put message 1 in place, so it is not delivered; when
    message 2 completes the group, message 1 leaves with an event (Unfinished), never silently."""
    from segmenter.wire import decode_segment as decode

    gid = b"G" * 24
    p1, p2 = os.urandom(3000), os.urandom(3000)
    w = Segmenter(1100).group_writer(group_id=gid)
    s1 = [s.encode() for s in w.add(p1)]
    s2 = [s.encode() for s in w.add(p2, last=True)]
    failing_to_put_in_place(monkeypatch, f"{gid.hex()}-1-")
    asm = Assembler(unit_of_work=False, bodies=FileBodyStore(tmp_path, "t", threshold=0))
    with pytest.raises(SegmentationError):
        asm.receive_many(s1)
    events = asm.receive_many(s2) + asm.close()
    assert [e.msg_seq_number for e in events if isinstance(e, MessageComplete)] == [2]
    (left,) = [e for e in events if isinstance(e, Unfinished)]
    assert sorted(left.segments) == sorted(s1) and {decode(r).header.msg_seq_number for r in left.segments} == {1}


@pytest.mark.parametrize("codec", [Codec.NONE, Codec.ZSTD])
def test_a_body_with_the_same_crc_under_a_reused_group_id_never_replaces_another(tmp_path: Path, codec: Codec) -> None:
    """A stream reusing a GroupId delivers a second message whose bytes were made to have the
    first one's CRC (4 bytes suffice): the file name holds the CRC, so both want the same name,
    and a rename over it would replace the first delivery's body, which committed rows still name.
    The second takes the next free name; a replay of either finds its own file (idempotent)."""
    from tests.assembler.test_arbitration import forge_same_crc

    first = bytes(range(256)) * 64
    second = forge_same_crc(ChecksumAlgorithm.CRC32, b"X" + first[1:], checksum(ChecksumAlgorithm.CRC32, first))
    gid = new_group_id()

    def deliver(payload: bytes) -> str:
        asm, _ = stored_assembler(tmp_path)
        segs = [s.encode() for s in segment(payload, 4000, group_id=gid, codec=codec)]
        done = only_complete(asm.receive_many(segs) + asm.close())
        assert isinstance(done.payload, StoredBody)
        assert (tmp_path / done.payload.location).read_bytes() == payload
        return done.payload.location

    a = deliver(first)
    b = deliver(second)
    assert b == a.replace(".bin", "-2.bin")
    assert (deliver(first), deliver(second)) == (a, b)  # replays: their own names, nothing new
    assert (tmp_path / a).read_bytes() == first and (tmp_path / b).read_bytes() == second
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([a, b])


def test_two_writers_placing_other_bytes_under_one_name_never_replace_each_other(tmp_path: Path) -> None:
    """Two stores in one directory (two consumers, two task attempts) verify different bodies with
    the same CRC under one GroupId: both find the name free, and a second rename would replace the
    first writer's file. The second is refused with 9018 (its message stays held, reported);
    a second writer with the same bytes (a retried attempt) still puts its copy in place."""
    from tests.assembler.test_arbitration import forge_same_crc

    crc32 = ChecksumAlgorithm.CRC32
    first = bytes(range(256)) * 16
    second = forge_same_crc(crc32, b"X" + first[1:], checksum(crc32, first))
    key = (new_group_id(), 1)

    def placed(token: str, data: bytes) -> tuple[FileBodyStore, str]:
        store = FileBodyStore(tmp_path, token, threshold=0)
        piece = store.put(key, 0, data)
        body = store.body(key, [(0, piece)], len(data))
        return store, store.place(key, checksum(crc32, data), body)

    (a, name_a), (b, name_b), (c, name_c) = placed("a", first), placed("b", second), placed("c", first)
    assert name_a == name_b == name_c  # all verified before any was in place
    a.finish(key, False)
    with pytest.raises(SegmentationError) as refused:
        b.finish(key, False)
    assert refused.value.reason == Reason.STORE_ERROR
    c.finish(key, False)  # the same bytes: a retry, in place as before
    assert (tmp_path / name_a).read_bytes() == first
    b.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [name_a]


@pytest.mark.parametrize("planted", ["directory", "link to the same bytes", "link elsewhere", "fifo"])
def test_anything_but_the_same_bytes_at_a_bodys_name_is_left_alone_and_the_body_takes_the_next(
    tmp_path: Path, planted: str
) -> None:
    """A directory, a link or a FIFO at the final name is not the message's failure (9018) and is
    never replaced by the rename: what the store did not put there is kept as it is, like a file
    with other bytes, and the body goes to the next free name. A FIFO is never opened."""
    payload = os.urandom(5000)
    gid = new_group_id()
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.write_bytes(payload if planted == "link to the same bytes" else b"not yours")
    name = out / f"{gid.hex()}-1-{checksum(ChecksumAlgorithm.CRC32, payload):08x}.bin"
    if planted == "directory":
        name.mkdir()
    elif planted == "fifo":
        os.mkfifo(name)
    else:
        name.symlink_to(elsewhere)
    asm, _ = stored_assembler(out)
    done = only_complete(asm.receive_many([s.encode() for s in segment(payload, 2000, group_id=gid)]) + asm.close())
    assert isinstance(done.payload, StoredBody) and done.payload.location == name.name.replace(".bin", "-2.bin")
    assert (out / done.payload.location).read_bytes() == payload
    assert name.is_dir() if planted == "directory" else os.path.lexists(name)
    assert name.is_symlink() == planted.startswith("link")
    assert elsewhere.read_bytes() == (payload if planted == "link to the same bytes" else b"not yours")
