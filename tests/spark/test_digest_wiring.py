"""SHA-256 / HMAC-SHA-256 wired through: producer, assembler, Spark (JVM fast path on and off), refmsg.

The attacker here crafts a conflicting copy of a segment (or chunk, or stored
object) to the same length and the same CRC (``forge_same_crc``), so it passes
every CRC check: only a digest tells it from the genuine one.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reassembly._errors import UsageError
from reassembly._keyring import load_keyring
from reassembly.assembler import Assembler, Limits
from reassembly.assembler.bodies import StoredBody
from reassembly.assembler.events import ConflictingDuplicate, MessageComplete, MessageFailed
from reassembly.storage.filestore import FileBodyStore
from refmsg import Chunker, Receiver
from refmsg.claimcheck import DirectoryStore, offload, resolve, resolve_into
from refmsg.core import ChunkRow, assemble_chunks
from segmenter import Codec, Segmenter
from segmenter.checksum import ChecksumAlgorithm, checksum
from segmenter.digest import NO_POLICY, REDACT_KEYS, DigestPolicy, Keyring, parse_extension
from segmenter.errors import Reason, SegmentationError
from segmenter.wire import HEADER_LENGTH, Segment, decode_segment
from tests.assembler.test_arbitration import forge_same_crc  # tests/ is on sys.path (pytest's rootdir import mode)

K1, K2 = b"k1-secret-key-0123456789abcdef", b"k2-secret-key-fedcba9876543210"
OLD = Keyring({"k1": K1}, current="k1")
NEW = Keyring({"k1": K1, "k2": K2}, current="k2")  # k2 signs, k1 still verifies
SHA = DigestPolicy(sha256=True)
POLICIES = {"none": NO_POLICY, "sha256": SHA, "hmac": DigestPolicy(keyring=NEW), "both": DigestPolicy(True, NEW)}
GID = b"G" * 24


def segments(payload: bytes, policy: DigestPolicy, codec: Codec = Codec.NONE, size: int = 600) -> list[bytes]:
    return [s.encode() for s in Segmenter(size, codec=codec, digest=policy).segment(payload, group_id=GID)]


def judged(rows: list[bytes], policy: DigestPolicy, bodies: FileBodyStore | None = None) -> list[Any]:
    asm = Assembler(Limits(digest=policy), batch=True, bodies=bodies)
    return asm.receive_many(rows) + asm.close()


def payload_of(events: list[Any], store: Path | None = None) -> bytes | None:
    done = [e for e in events if isinstance(e, MessageComplete)]
    if not done:
        return None
    p = done[0].payload
    return (store / p.location).read_bytes() if isinstance(p, StoredBody) and store else bytes(p)  # type: ignore[arg-type]


def failure(events: list[Any]) -> Reason | None:
    failed = [e for e in events if isinstance(e, MessageFailed)]
    return failed[0].reason if failed else None


def forged_copy(raw: bytes) -> bytes:
    """A conflicting copy of a segment: other data, same length, same data CRC (so the same message CRC)."""
    seg = decode_segment(raw)
    data = bytes(seg.data)
    fake = forge_same_crc(seg.header.algorithm, bytes(b ^ 0x5A for b in data), checksum(seg.header.algorithm, data))
    return Segment(seg.header, fake).encode()


# ------------------------------------------------------------------------------ producer


@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.parametrize("codec", [Codec.NONE, Codec.ZSTD])
def test_only_the_last_segment_carries_the_digests_and_every_segment_fits(name: str, codec: Codec) -> None:
    policy, payload = POLICIES[name], os.urandom(3000)
    rows = segments(payload, policy, codec)
    assert all(len(r) <= 600 for r in rows)
    heads = [decode_segment(r).header for r in rows]
    assert all(h.extension == b"" for h in heads[:-1])
    assert parse_extension(heads[-1].extension) == policy.sign([payload])
    writer = Segmenter(600, codec=codec, digest=policy).message_writer(group_id=GID)  # streaming: same digests
    streamed = [s.encode() for s in writer.write(payload) + writer.close()]
    assert decode_segment(streamed[-1]).header.extension == heads[-1].extension


# ------------------------------------------------------------------------------ assembler


@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.parametrize("codec", [Codec.NONE, Codec.ZSTD])
def test_round_trip_in_memory_and_through_a_body_store(name: str, codec: Codec, tmp_path: Path) -> None:
    policy, payload = POLICIES[name], os.urandom(3000)
    rows = segments(payload, policy, codec)
    assert payload_of(judged(rows, policy)) == payload
    store = FileBodyStore(tmp_path, "t", threshold=0)
    assert payload_of(judged(rows, policy, store), tmp_path) == payload
    store.close()


@pytest.mark.parametrize("name", ["sha256", "hmac", "both"])
def test_a_forged_copy_passing_every_crc_is_caught(name: str) -> None:
    policy, payload = POLICIES[name], os.urandom(3000)
    rows = segments(payload, policy)
    forged = forged_copy(rows[1])
    assert payload_of(judged([rows[0], forged, *rows[2:]], NO_POLICY if name == "hmac" else policy)) != payload
    alone = judged([rows[0], forged, *rows[2:]], policy)
    assert payload_of(alone) is None
    assert failure(alone) == (Reason.DIGEST_MISMATCH if policy.sha256 else Reason.HMAC_MISMATCH)


@pytest.mark.parametrize("name", ["sha256", "hmac", "both"])
def test_the_digest_decides_between_conflicting_copies(name: str) -> None:
    policy, payload = POLICIES[name], os.urandom(3000)
    rows = segments(payload, policy)
    forged = forged_copy(rows[1])
    for landing in ([*rows, forged], [forged, *rows], [*reversed(rows), forged]):
        events = judged(landing, policy)
        assert payload_of(events) == payload
        assert [e.raw for e in events if isinstance(e, ConflictingDuplicate)] == [forged]
    # Without a digest both assemblies pass every check: a conflict, never a guess.
    plain = segments(payload, NO_POLICY)
    assert failure(judged([*plain, forged_copy(plain[1])], NO_POLICY)) == Reason.CONFLICTING_DUPLICATE


def test_a_last_segment_with_forged_digests_loses_to_the_genuine_one() -> None:
    payload = os.urandom(2000)
    rows = segments(payload, SHA)
    last = decode_segment(rows[-1])
    fake = SHA.sign([b"something else"]).extension()
    forged = Segment(last.header._replace(extension=fake, header_length=HEADER_LENGTH + len(fake)), last.data).encode()
    for landing in ([*rows, forged], [forged, *rows]):
        events = judged(landing, NO_POLICY)
        assert payload_of(events) == payload
        assert [e.raw for e in events if isinstance(e, ConflictingDuplicate)] == [forged]


def test_keys_wrong_unknown_rotated_and_demanded() -> None:
    payload = os.urandom(1500)
    old = segments(payload, DigestPolicy(keyring=OLD))  # signed with k1
    new = segments(payload, DigestPolicy(keyring=NEW))  # signed with k2
    assert payload_of(judged(old, DigestPolicy(keyring=NEW))) == payload  # rotation: k1 still verifies
    assert payload_of(judged(new, DigestPolicy(keyring=NEW))) == payload
    assert failure(judged(new, DigestPolicy(keyring=OLD))) == Reason.UNKNOWN_KEY
    wrong = DigestPolicy(keyring=Keyring({"k2": b"not-the-right-key-at-all"}))
    assert failure(judged(new, wrong)) == Reason.HMAC_MISMATCH
    assert failure(judged(segments(payload, SHA), DigestPolicy(keyring=NEW))) == Reason.DIGEST_MISSING
    assert failure(judged(segments(payload, NO_POLICY), SHA)) == Reason.DIGEST_MISSING
    assert payload_of(judged(new, NO_POLICY)) == payload  # no keys: the tag cannot be checked, nothing demanded


def test_stripping_the_tag_does_not_help_a_forger() -> None:
    payload = os.urandom(1500)
    rows = segments(payload, DigestPolicy(keyring=NEW))
    last = decode_segment(rows[-1])
    stripped = Segment(last.header._replace(extension=b"", header_length=HEADER_LENGTH), last.data).encode()
    assert failure(judged([*rows[:-1], stripped], DigestPolicy(keyring=NEW))) == Reason.DIGEST_MISSING


# ------------------------------------------------------------------------------ command line


def test_keyring_file(tmp_path: Path) -> None:
    good = tmp_path / "ring.json"
    good.write_text(f'{{"current": "k2", "keys": {{"k1": "{K1.hex()}", "k2": "{K2.hex()}"}}}}')
    assert load_keyring(str(good)) == NEW
    for text in ("not json", '{"keys": {}}', '{"keys": {"k1": "zz"}}', '{"current": "k9", "keys": {"k1": "%s"}}'):
        bad = tmp_path / "bad.json"
        bad.write_text(text % K1.hex() if "%s" in text else text)
        with pytest.raises(UsageError) as info:
            load_keyring(str(bad))
        assert K1.hex() not in str(info.value)
    short = tmp_path / "short.json"
    short.write_text('{"keys": {"k1": "00ff"}}')
    with pytest.raises(UsageError, match="at least 16"):
        load_keyring(str(short))


# ------------------------------------------------------------------------------ refmsg


def chunked(payload: bytes, policy: DigestPolicy) -> list[bytes]:
    return list(Chunker(max_length=1000, digest=policy).encode(io.BytesIO(payload), "obj.bin"))


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_receiver_round_trip_and_restart_keeps_the_digests(name: str, tmp_path: Path) -> None:
    policy, payload = POLICIES[name], os.urandom(3500)
    messages = chunked(payload, policy)
    with Receiver(tmp_path, digest=policy) as rx:
        rx.receive(messages[-1])  # the LAST message (the digests) first, then a crash
    with Receiver(tmp_path, digest=policy) as rx:
        for m in messages[:-1]:
            rx.receive(m)
    assert (tmp_path / "obj.bin").read_bytes() == payload


def test_receiver_refuses_a_forged_chunk_and_missing_digests(tmp_path: Path) -> None:
    from refmsg.message import decode_message
    from tests.refmsg.test_receiver import CRC as crc
    from tests.refmsg.test_receiver import make  # the receiver tests' message builder

    payload = os.urandom(3000)
    genuine = payload[:1000]
    forged = forge_same_crc(crc, bytes(b ^ 0x33 for b in genuine), checksum(crc, genuine))
    digests = SHA.sign([payload])
    last = decode_message(make(2000, payload[2000:], last=True, whole=payload)).message
    signed = last._replace(integrity=last.integrity._replace(digests=digests)).encode()  # type: ignore[union-attr]
    with Receiver(tmp_path / "a", digest=SHA) as rx:
        rx.receive(make(0, forged))
        rx.receive(make(1000, payload[1000:2000]))
        with pytest.raises(SegmentationError) as info:
            rx.receive(signed)
        assert info.value.reason in (Reason.DIGEST_MISMATCH, Reason.MESSAGE_CHECKSUM_ERROR)
    assert not (tmp_path / "a" / "obj.bin").exists()
    with Receiver(tmp_path / "b", digest=SHA) as rx:
        rx.receive(make(0, genuine))
        rx.receive(make(1000, payload[1000:2000]))
        with pytest.raises(SegmentationError) as info:
            rx.receive(make(2000, payload[2000:], last=True, whole=payload))  # no digest, one demanded
        assert info.value.reason == Reason.DIGEST_MISSING


def test_assemble_chunks_checks_the_digests() -> None:
    payload = os.urandom(3000)
    digests = SHA.sign([payload]).extension()
    crc = ChecksumAlgorithm.CRC32

    def rows(first: bytes) -> list[ChunkRow]:
        return [
            ChunkRow(0, 1500, first, False, checksum(crc, first)),
            ChunkRow(1500, 1500, payload[1500:], True, checksum(crc, payload[1500:]), checksum(crc, payload), digests),
        ]

    assert assemble_chunks(rows(payload[:1500]), algorithm=crc, digest=SHA) == payload
    forged = forge_same_crc(crc, bytes(1500), checksum(crc, payload[:1500]))
    with pytest.raises(SegmentationError) as info:
        assemble_chunks(rows(forged), algorithm=crc)
    assert info.value.reason == Reason.DIGEST_MISMATCH
    with pytest.raises(SegmentationError) as info:
        first, last = rows(payload[:1500])
        assemble_chunks([first, last._replace(digests=None)], digest=SHA)
    assert info.value.reason == Reason.DIGEST_MISSING


def test_claim_check_verifies_the_digests_while_streaming(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path / "store")
    payload = os.urandom(5000)
    policy = DigestPolicy(True, NEW)
    msg = offload(payload, store, threshold=100, digest=policy)
    assert resolve(msg, store, digest=policy) == payload
    key = next(p.name for p in (tmp_path / "store").iterdir())
    crc = ChecksumAlgorithm.CRC32C
    (tmp_path / "store" / key).write_bytes(forge_same_crc(crc, bytes(5000), checksum(crc, payload)))
    for call in (lambda: resolve(msg, store, digest=policy), lambda: resolve(msg, store)):
        with pytest.raises(SegmentationError) as info:
            call()
        assert info.value.reason in (Reason.DIGEST_MISMATCH, Reason.MESSAGE_CHECKSUM_ERROR)
    plain = offload(payload, store, threshold=100)
    with pytest.raises(SegmentationError) as info:
        resolve_into(plain, store, open(os.devnull, "wb"), digest=SHA)  # noqa: SIM115
    assert info.value.reason == Reason.DIGEST_MISSING


# ------------------------------------------------------------------------------ Spark


def _landing(tmp: Path, rows: list[bytes]) -> str:
    path = tmp / "landing.parquet"
    pq.write_table(pa.table({"segment": pa.array(rows, pa.binary())}), path)
    return str(path)


def _spark_messages(spark: Any, path: str, policy: DigestPolicy, fast: bool) -> list[Any]:
    from reassembly.spark import ReassemblyOptions, reassemble

    opts = ReassemblyOptions(partitions=2, digest=policy, jvm_fast_path=fast)
    return reassemble(spark.read.parquet(path), options=opts).combined.collect()


def _clean_flags(spark: Any, path: str, policy: DigestPolicy) -> list[bool]:
    """The JVM clean test per aggregated message: True means verified in the JVM, never sent to Python."""
    from pyspark.sql import functions as F

    from reassembly.spark.batch import grouping
    from reassembly.spark.batch.decode import decode_segments

    agg = grouping.aggregate(grouping.route(decode_segments(spark.read.parquet(path), "segment", 1 << 30), None), 2)
    return [r.c for r in agg.select(F.expr(grouping.clean(policy)).alias("c")).collect()]


@pytest.mark.spark
def test_spark_round_trip_verified_in_the_jvm(spark: Any, tmp_path: Path) -> None:
    payloads = {name: os.urandom(2500) for name in POLICIES}
    for name, policy in POLICIES.items():
        rows = [s.encode() for s in Segmenter(600, digest=policy).segment(payloads[name])]
        (tmp_path / name).mkdir()
        path = _landing(tmp_path / name, rows)
        assert _clean_flags(spark, path, policy) == [True], name  # the fast path verifies the digests itself
        for fast in (True, False):
            out = _spark_messages(spark, path, policy, fast)
            assert [(r.status, bytes(r.payload)) for r in out if r.kind == "message"] == [
                ("complete", payloads[name])
            ], (name, fast)


@pytest.mark.spark
def test_spark_forged_copies_and_wrong_keys(spark: Any, tmp_path: Path) -> None:
    policy = DigestPolicy(True, NEW)
    payload = os.urandom(2500)
    rows = segments(payload, policy)
    forged = forged_copy(rows[1])
    conflict = _landing(tmp_path, [*rows, forged])
    tampered_dir = tmp_path / "t"
    tampered_dir.mkdir()
    tampered = _landing(tampered_dir, [rows[0], forged, *rows[2:]])
    assert _clean_flags(spark, tampered, policy) == [False]  # the JVM does not pass it: Python gives the reason
    for fast in (True, False):
        out = _spark_messages(spark, conflict, policy, fast)
        assert [(r.status, bytes(r.payload)) for r in out if r.kind == "message"] == [("complete", payload)]
        assert [bytes(r.raw) for r in out if r.kind == "quarantine"] == [forged]
        bad = _spark_messages(spark, tampered, policy, fast)
        assert [r.reason_name for r in bad if r.kind == "message"] == ["DIGEST_MISMATCH"]
        unknown = _spark_messages(spark, conflict, DigestPolicy(keyring=Keyring({"k1": K1})), fast)
        assert {r.reason_name for r in unknown if r.kind == "message"} == {"UNKNOWN_KEY"}


@pytest.mark.spark
def test_spark_plans_do_not_show_the_keys(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql.functions import col

    from reassembly.spark import ReassemblyOptions, reassemble
    from segmenter.digest import hmac_pads

    path = _landing(tmp_path, segments(os.urandom(1000), DigestPolicy(keyring=NEW)))
    result = reassemble(spark.read.parquet(path), options=ReassemblyOptions(digest=DigestPolicy(keyring=NEW)))
    plan = result.combined.select(col("status"))._jdf.queryExecution().toString()
    assert REDACT_KEYS in spark.conf.get("spark.sql.redaction.string.regex")  # set when the plan is built
    for key in (K1, K2):
        for pad in hmac_pads(key):
            assert pad.hex() not in plan.lower()


def test_the_command_refuses_a_bad_keyring_before_spark_starts(tmp_path: Path) -> None:
    from tests.support.command import reassemble as command

    ring = tmp_path / "ring.json"
    ring.write_text(f'{{"keys": {{"k1": "{K1.hex()}", "k2": "00"}}}}')  # k2 too short
    done = command("run", str(tmp_path / "in"), str(tmp_path / "out"), "--hmac-keyring", str(ring))
    assert done.returncode == 2
    assert (
        done.stderr.startswith("reassemble: error: keyring") and K1.hex() not in done.stderr and "'k2'" in done.stderr
    )
    stream_args = ["stream", str(tmp_path), str(tmp_path / "sout"), "--checkpoint", str(tmp_path / "ck")]
    done = command(*stream_args, "--hmac-keyring", str(ring))
    assert done.returncode == 2, done.stderr  # the stream job reads it before Spark too
    assert K1.hex() not in done.stderr
