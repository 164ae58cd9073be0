"""Sender side: IBM's worked example, streaming, header-only messages, the integrity block."""

from __future__ import annotations

import hashlib
import io
import os
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refmsg import RMH, Chunker, ReferenceMessage, RmhFlags, chunk, decode_message, decode_rmh
from refmsg.errors import RmhError
from refmsg.header import ENCODING_BIG_ENDIAN, LENGTH_1
from refmsg.integrity import BLOCK_LENGTH, MAGIC, Integrity, ObjectCheck, seal, verify_object
from segmenter.checksum import ChecksumAlgorithm, checksum, reference_function
from segmenter.digest import DigestPolicy, Digests, Keyring, KeyringError
from segmenter.errors import ChecksumError, Reason, SegmentationError


def test_ibm_worked_example_70000_over_40000(tmp_path: Path) -> None:
    payload = os.urandom(70_000)
    source = tmp_path / "object.bin"
    source.write_bytes(payload)
    messages = list(Chunker(max_length=40_000).messages(source, "object.bin"))
    assert [(m.offset, m.length, m.header.flags) for m in messages] == [
        (0, 40_000, RmhFlags.NOT_LAST),
        (40_000, 30_000, RmhFlags.LAST),
    ]
    assert [len(m.data) for m in messages] == [40_000, 30_000]
    for m in messages:
        assert m.header.src_name == str(source)
        decoded = decode_message(m.encode(), require_integrity=True).message
        assert decoded.header == m.header
        assert bytes(decoded.data) == payload[m.offset : m.offset + m.length]
    last = messages[-1].integrity
    assert last is not None and last.object_length == 70_000
    assert last.object_checksum == reference_function(ChecksumAlgorithm.CRC32)(payload)


def test_limit_can_include_the_header() -> None:
    payload = os.urandom(70_000)
    encoded = list(Chunker(max_length=40_000, limit_includes_header=True).encode(io.BytesIO(payload), "o"))
    assert all(len(e) <= 40_000 for e in encoded)
    assert len(encoded[0]) == 40_000
    assert len(encoded) == 2


def test_exact_multiple_and_empty_object() -> None:
    msgs = list(Chunker(max_length=100).messages(io.BytesIO(bytes(300)), "o"))
    assert [(m.offset, m.length, m.is_last) for m in msgs] == [(0, 100, False), (100, 100, False), (200, 100, True)]
    empty = list(Chunker(max_length=100).messages(io.BytesIO(b""), "o"))
    assert [(m.offset, m.length, m.is_last) for m in empty] == [(0, 0, True)]
    assert empty[0].integrity == Integrity(ChecksumAlgorithm.CRC32, 0, 0, 0)


class CountingReader(io.RawIOBase):
    """A non-seekable stream that records its read sizes (files are never read whole)."""

    def __init__(self, size: int) -> None:
        self.left = size
        self.reads: list[int] = []

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        assert n > 0, "the chunker must never read without a size"
        self.reads.append(n)
        take = min(n, self.left)
        self.left -= take
        return b"z" * take


def test_streams_in_chunk_sized_reads() -> None:
    reader = CountingReader(10_000)
    msgs = Chunker(max_length=1000).messages(reader, "o")  # type: ignore[arg-type]
    first = next(msgs)
    assert first.length == 1000 and len(reader.reads) == 2  # one chunk held back to find the last
    assert sum(1 for _ in msgs) == 9
    assert set(reader.reads) == {1000}


def test_header_only_messages_carry_checksums_not_data() -> None:
    payload = os.urandom(2500)
    msgs = list(Chunker(max_length=1000).messages(io.BytesIO(payload), "o", header_only=True, src_name="shared/o"))
    assert all(m.header_only and not m.data for m in msgs)
    for m in msgs:
        encoded = m.encode()
        decoded = decode_message(encoded, require_integrity=True)
        assert len(encoded) == decoded.layout.struc_length
        assert decoded.message.header_only
        assert m.integrity is not None
        assert m.integrity.chunk_checksum == checksum(ChecksumAlgorithm.CRC32, payload[m.offset : m.offset + m.length])


def test_crc32c_selectable() -> None:
    payload = os.urandom(3000)
    msgs = list(Chunker(max_length=1000, algorithm=ChecksumAlgorithm.CRC32C).messages(io.BytesIO(payload), "o"))
    last = msgs[-1].integrity
    assert last is not None and last.algorithm == ChecksumAlgorithm.CRC32C
    assert last.object_checksum == reference_function(ChecksumAlgorithm.CRC32C)(payload)


def test_integrity_block_location_and_layout() -> None:
    payload = b"0123456789"
    (msg,) = Chunker(max_length=100).messages(io.BytesIO(payload), "dir/name", src_name="src", src_env="E")
    encoded = msg.encode()
    layout = decode_rmh(encoded)
    sl = layout.struc_length
    assert sl % 4 == 0
    block = encoded[sl - BLOCK_LENGTH : sl]
    magic, version, algo, flags, reserved, length, chunk_crc, obj_len, obj_crc, head_crc = struct.unpack(
        ">4sBBBBIIQII", block
    )
    assert (magic, version, algo, flags, reserved, length) == (MAGIC, 1, 1, 1, 0, 32)
    assert chunk_crc == obj_crc == checksum(ChecksumAlgorithm.CRC32, payload) and obj_len == 10
    assert head_crc == checksum(ChecksumAlgorithm.CRC32, encoded[: sl - 4])
    # No string offset references the block: an MQ reader sees an ordinary MQRMH.
    assert all(span.end <= sl - BLOCK_LENGTH for span in layout.spans)
    assert encoded[sl:] == payload
    assert sl >= LENGTH_1 + BLOCK_LENGTH


def test_plain_mq_layout_without_integrity() -> None:
    (msg,) = Chunker(max_length=100, integrity=False).messages(io.BytesIO(b"abc"), "o")
    assert msg.integrity is None
    encoded = msg.encode()
    assert decode_message(encoded).message.integrity is None
    with pytest.raises(ChecksumError):
        decode_message(encoded, require_integrity=True)


def test_big_endian_sender() -> None:
    encoded = chunk(io.BytesIO(b"x" * 250), "o", max_length=100)
    assert len(encoded) == 3
    msgs = list(Chunker(max_length=100, header_encoding=ENCODING_BIG_ENDIAN).encode(io.BytesIO(b"y" * 250), "o"))
    assert msgs[0][4:8] == b"\0\0\0\x01"
    assert decode_message(msgs[2], require_integrity=True).message.is_last


def test_corrupted_chunk_data_detected() -> None:
    (msg,) = Chunker(max_length=100).messages(io.BytesIO(b"abcdef"), "o")
    encoded = bytearray(msg.encode())
    encoded[-1] ^= 0x40
    with pytest.raises(ChecksumError) as err:
        decode_message(bytes(encoded))
    assert err.value.reason == Reason.DATA_CHECKSUM_ERROR


def test_bad_configuration() -> None:
    with pytest.raises(SegmentationError):
        Chunker(max_length=0)
    with pytest.raises(SegmentationError):
        list(Chunker(max_length=144, limit_includes_header=True).messages(io.BytesIO(b"abc"), "o"))


def test_chunk_past_declared_object_length_rejected() -> None:
    header = RMH(data_logical_offset=10, data_logical_length=5, flags=RmhFlags.LAST)
    crc = checksum(ChecksumAlgorithm.CRC32, b"abcde")
    encoded = ReferenceMessage(header, b"abcde", Integrity(ChecksumAlgorithm.CRC32, crc, 12, crc)).encode()
    with pytest.raises(SegmentationError) as err:
        decode_message(encoded)
    assert err.value.reason == Reason.OFFSET_ERROR


# -- whole-object SHA-256 / HMAC-SHA-256 in the integrity block ----------------------------------

RING = Keyring({"2026-10": b"k" * 16, "2026-11": bytes(range(40))}, current="2026-11")
SIGNED = DigestPolicy(sha256=True, keyring=RING)


def _last_integrity(payload: bytes, chunker: Chunker) -> Integrity:
    messages = list(chunker.encode(io.BytesIO(payload), "o"))
    decoded = [decode_message(m, require_integrity=True).message for m in messages]
    assert all(d.integrity is not None and not d.integrity.digests for d in decoded[:-1])
    integrity = decoded[-1].integrity
    assert integrity is not None
    return integrity


@pytest.mark.parametrize("size", [0, 1, 999, 1000, 2500])
def test_digests_travel_on_the_last_message_and_verify(size: int) -> None:
    payload = os.urandom(size)
    integrity = _last_integrity(payload, Chunker(max_length=1000, digest=SIGNED))
    assert integrity.digests == SIGNED.sign([payload])
    assert integrity.digests.sha256 == hashlib.sha256(payload).digest()
    blocks = [payload[i : i + 7] for i in range(0, len(payload), 7)]
    crc = verify_object(blocks, integrity.algorithm, integrity.object_checksum, integrity.digests, SIGNED)
    assert crc == integrity.object_checksum == checksum(ChecksumAlgorithm.CRC32, payload)
    check = ObjectCheck(integrity.algorithm, integrity.object_checksum, integrity.digests, SIGNED)
    for block in blocks:
        check.update(memoryview(block))
    assert check.length == size and check.finish() == crc


def test_object_check_refuses_tampering_missing_digests_and_unknown_keys() -> None:
    payload = os.urandom(3000)
    integrity = _last_integrity(payload, Chunker(max_length=1000, digest=SIGNED))
    forged = payload[:-1] + bytes([payload[-1] ^ 1])
    crc = checksum(ChecksumAlgorithm.CRC32, forged)  # a forger matches the CRC; the digests still differ
    tag_only = Digests(hmac=integrity.digests.hmac)
    for policy, declared, reason in (
        (SIGNED, integrity.digests, Reason.DIGEST_MISMATCH),
        (DigestPolicy(keyring=RING), tag_only, Reason.HMAC_MISMATCH),
    ):
        with pytest.raises(ChecksumError) as err:
            verify_object([forged], ChecksumAlgorithm.CRC32, crc, declared, policy)
        assert err.value.reason == reason
    with pytest.raises(ChecksumError) as err:
        verify_object([forged], ChecksumAlgorithm.CRC32, integrity.object_checksum, integrity.digests, SIGNED)
    assert err.value.reason == Reason.MESSAGE_CHECKSUM_ERROR
    unsigned = _last_integrity(payload, Chunker(max_length=1000))
    with pytest.raises(ChecksumError) as err:
        verify_object([payload], ChecksumAlgorithm.CRC32, unsigned.object_checksum, unsigned.digests, SIGNED)
    assert err.value.reason == Reason.DIGEST_MISSING
    with pytest.raises(KeyringError):
        ObjectCheck(ChecksumAlgorithm.CRC32, None, integrity.digests, DigestPolicy(keyring=Keyring({"x": bytes(16)})))
    # Rotation: a receiver holding both keys accepts objects signed with the old one.
    old = Chunker(max_length=1000, digest=DigestPolicy(keyring=Keyring(RING.keys, current="2026-10")))
    old_integrity = _last_integrity(payload, old)
    verify_object([payload], ChecksumAlgorithm.CRC32, None, old_integrity.digests, DigestPolicy(keyring=RING))


def test_limit_including_header_counts_the_digests() -> None:
    payload = os.urandom(100_000)
    for policy in (SIGNED, DigestPolicy(sha256=True)):
        chunker = Chunker(max_length=40_000, limit_includes_header=True, digest=policy)
        encoded = list(chunker.encode(io.BytesIO(payload), "o"))
        assert all(len(e) <= 40_000 for e in encoded) and len(encoded) == 3
        assert len(encoded[0]) > 40_000 - policy.extension_size() - 4  # only the digests' room is given up


def test_digests_need_the_integrity_block() -> None:
    with pytest.raises(SegmentationError):
        Chunker(integrity=False, digest=DigestPolicy(sha256=True))
    Chunker(integrity=False, digest=DigestPolicy(keyring=Keyring(RING.keys)))  # a reader's ring adds nothing


def test_header_only_messages_carry_digests() -> None:
    payload = os.urandom(2500)
    msgs = list(Chunker(max_length=1000, digest=SIGNED).messages(io.BytesIO(payload), "o", header_only=True))
    last = decode_message(msgs[-1].encode(), require_integrity=True).message
    assert last.header_only and last.integrity is not None and last.integrity.digests == SIGNED.sign([payload])


@pytest.mark.parametrize("encoding", [ENCODING_BIG_ENDIAN, 546])
def test_every_bit_flip_of_a_signed_last_message_is_detected(encoding: int) -> None:
    payload = b"signed object"
    (msg,) = Chunker(max_length=100, digest=SIGNED).messages(io.BytesIO(payload), "dir/o", src_name="s")
    encoded = msg.encode(header_encoding=encoding)
    for bit in range(8 * len(encoded)):
        flipped = bytearray(encoded)
        flipped[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(SegmentationError):
            decoded = decode_message(bytes(flipped), require_integrity=True).message
            assert decoded.integrity is not None
            verify_object(
                [decoded.data], decoded.integrity.algorithm, decoded.integrity.object_checksum,
                decoded.integrity.digests, SIGNED,
            )  # fmt: skip


def _resealed(header: RMH, integrity: Integrity, patch: Callable[[bytearray, int], None]) -> bytes:
    """A message whose block was changed by ``patch`` and then given a correct header checksum."""
    encoded = bytearray(ReferenceMessage(header, b"", integrity).encode())
    struc_length = decode_rmh(bytes(encoded)).struc_length
    patch(encoded, struc_length)
    return seal(bytes(encoded[:struc_length])) + bytes(encoded[struc_length:])


def _set_block_length(value: int) -> Callable[[bytearray, int], None]:
    def patch(buf: bytearray, struc_length: int) -> None:
        buf[struc_length - BLOCK_LENGTH + 8 : struc_length - BLOCK_LENGTH + 12] = value.to_bytes(4, "big")

    return patch


def test_hostile_block_lengths_and_orphan_digests_are_refused() -> None:
    header = RMH(dest_name="o", data_logical_length=3, flags=RmhFlags.LAST)
    crc = checksum(ChecksumAlgorithm.CRC32, b"abc")
    signed = Integrity(ChecksumAlgorithm.CRC32, crc, 3, crc, SIGNED.sign([b"abc"]))
    good = ReferenceMessage(header, b"", signed).encode()
    struc_length = decode_rmh(good).struc_length
    for length in (0, 31, struc_length - 107, struc_length, 1 << 31, 0xFFFFFFFF):
        with pytest.raises(RmhError) as err:
            decode_message(_resealed(header, signed, _set_block_length(length)))
        assert err.value.reason == Reason.HEADER_LENGTH_ERROR, length
    # A block length reaching back into a string (DestName) is refused, not read as digests.
    (span,) = decode_rmh(good).spans
    with pytest.raises(RmhError) as err:
        decode_message(_resealed(header, signed, _set_block_length(struc_length - span.end + 1)))
    assert err.value.reason == Reason.HEADER_LENGTH_ERROR

    def drop_object_flag(buf: bytearray, struc_length: int) -> None:
        buf[struc_length - BLOCK_LENGTH + 6] = 0

    with pytest.raises(SegmentationError) as err:
        decode_message(_resealed(header, signed, drop_object_flag))
    assert err.value.reason == Reason.EXTENSION_ERROR


@settings(max_examples=40)
@given(st.binary(max_size=300), st.data())
def test_fuzz_signed_messages_raise_only_library_errors(payload: bytes, data: st.DataObject) -> None:
    (msg,) = Chunker(max_length=1000, digest=SIGNED).messages(io.BytesIO(payload), "o")
    encoded = bytearray(msg.encode())
    for _ in range(data.draw(st.integers(1, 3))):
        encoded[data.draw(st.integers(0, len(encoded) - 1))] = data.draw(st.integers(0, 255))
    try:
        decoded = decode_message(bytes(encoded)).message
        if decoded.integrity is not None:
            verify_object([decoded.data], decoded.integrity.algorithm, None, decoded.integrity.digests, SIGNED)
    except SegmentationError:
        pass
