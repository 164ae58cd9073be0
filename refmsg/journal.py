"""The receiver's journal: an append-only, fsync'd, checksummed record of what is durable.

One journal per object. Every record is framed and checksummed (big-endian)::

    u32 payload length | u8 type | payload | u32 CRC-32/IEEE of everything before it

A receiver killed mid-write leaves at most one torn record at the end; replay
stops there and the file is cut back to the last good record. A bad record
followed by more bytes than it claims is real damage and raises
:class:`~refmsg.errors.JournalError`. Record payloads (layout in docs/how-to/refmsg.md):

- OPEN (1): f64 time, u8 algorithm, 24s ObjectInstanceId, u16 name length, name (UTF-8)
- RANGE (2): f64 time, u64 offset, u64 length, u32 checksum of those bytes
- OBJECT (3): f64 time, u8 last, u8 has length, u64 length, u8 has checksum, u32 checksum
- DONE (4): f64 time, u64 object length, u32 object checksum (0 when unknown)
- CONFLICT (5): f64 time, u64 offset, u64 length of a verified chunk whose bytes differ from
  those applied: the object is never delivered (two copies pass every check; no guess)
- DIGESTS (6): f64 time, then the digest records the LAST message declared (the TLV bytes of
  ``segmenter.digest``), so a receiver restarted after a crash still verifies them

Encoding and decoding are pure; :class:`JournalFile` does the I/O.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from typing import NamedTuple

from segmenter.checksum import ChecksumAlgorithm, checksum

from .errors import JournalError

FRAME = struct.Struct(">IB")
CRC_LENGTH = 4
OPEN, RANGE, OBJECT, DONE, CONFLICT, DIGESTS = 1, 2, 3, 4, 5, 6
_OPEN = struct.Struct(">dB24sH")
_RANGE = struct.Struct(">dQQI")
_OBJECT = struct.Struct(">dBBQBI")
_DONE = struct.Struct(">dQI")
_CONFLICT = struct.Struct(">dQQ")
_AT = struct.Struct(">d")
MAX_PAYLOAD = 1 << 16


class OpenRecord(NamedTuple):
    at: float
    algorithm: ChecksumAlgorithm
    instance_id: bytes
    name: str


class RangeRecord(NamedTuple):
    at: float
    offset: int
    length: int
    checksum: int


class ObjectRecord(NamedTuple):
    at: float
    last: bool
    object_length: int | None
    object_checksum: int | None


class DoneRecord(NamedTuple):
    at: float
    object_length: int
    object_checksum: int


class ConflictRecord(NamedTuple):
    at: float
    offset: int
    length: int


class DigestsRecord(NamedTuple):
    at: float
    extension: bytes  # Digests.extension(): parsed back with segmenter.digest.parse_extension


Record = OpenRecord | RangeRecord | ObjectRecord | DoneRecord | ConflictRecord | DigestsRecord


def encode_record(record: Record) -> bytes:
    """One framed, checksummed record."""
    if isinstance(record, OpenRecord):
        name = record.name.encode("utf-8")
        kind, payload = OPEN, _OPEN.pack(record.at, record.algorithm, record.instance_id, len(name)) + name
    elif isinstance(record, RangeRecord):
        kind, payload = RANGE, _RANGE.pack(record.at, record.offset, record.length, record.checksum)
    elif isinstance(record, ObjectRecord):
        kind, payload = (
            OBJECT,
            _OBJECT.pack(
                record.at,
                record.last,
                record.object_length is not None,
                record.object_length or 0,
                record.object_checksum is not None,
                record.object_checksum or 0,
            ),
        )
    elif isinstance(record, ConflictRecord):
        kind, payload = CONFLICT, _CONFLICT.pack(record.at, record.offset, record.length)
    elif isinstance(record, DigestsRecord):
        kind, payload = DIGESTS, _AT.pack(record.at) + record.extension
    else:
        kind, payload = DONE, _DONE.pack(record.at, record.object_length, record.object_checksum)
    body = FRAME.pack(len(payload), kind) + payload
    return body + checksum(ChecksumAlgorithm.CRC32, body).to_bytes(4, "big")


def _decode_payload(kind: int, payload: bytes) -> Record:
    if kind == OPEN:
        at, algo, instance_id, name_length = _OPEN.unpack_from(payload)
        name = payload[_OPEN.size : _OPEN.size + name_length].decode("utf-8")
        return OpenRecord(at, ChecksumAlgorithm.parse(algo), instance_id, name)
    if kind == RANGE:
        return RangeRecord(*_RANGE.unpack(payload))
    if kind == OBJECT:
        at, last, has_len, length, has_crc, crc = _OBJECT.unpack(payload)
        return ObjectRecord(at, bool(last), length if has_len else None, crc if has_crc else None)
    if kind == DONE:
        return DoneRecord(*_DONE.unpack(payload))
    if kind == CONFLICT:
        return ConflictRecord(*_CONFLICT.unpack(payload))
    if kind == DIGESTS:
        (at,) = _AT.unpack_from(payload)
        return DigestsRecord(at, payload[_AT.size :])
    raise JournalError(f"unknown journal record type {kind}", kind=kind)


class Replay(NamedTuple):
    """What a journal holds: its good records and where they end."""

    records: tuple[Record, ...]
    good_length: int  # bytes of whole, valid records
    torn: bool  # a partial or damaged last record follows good_length


def decode_journal(data: bytes) -> Replay:
    """Parse a journal, tolerating one torn record at the end."""
    records: list[Record] = []
    pos = 0
    while pos < len(data):
        if len(data) - pos < FRAME.size + CRC_LENGTH:
            return Replay(tuple(records), pos, True)
        length, kind = FRAME.unpack_from(data, pos)
        end = pos + FRAME.size + length + CRC_LENGTH
        if length > MAX_PAYLOAD or end > len(data):
            if (end > len(data) and length <= MAX_PAYLOAD) or not any(data[pos:]):
                return Replay(tuple(records), pos, True)  # cut short, or a zero-filled tail after a crash
            raise JournalError(f"journal record at byte {pos} declares {length} bytes", position=pos)
        body = data[pos : end - CRC_LENGTH]
        stored = int.from_bytes(data[end - CRC_LENGTH : end], "big")
        if checksum(ChecksumAlgorithm.CRC32, body) != stored:
            if end == len(data) or not any(data[pos:]):
                return Replay(tuple(records), pos, True)
            raise JournalError(f"journal record at byte {pos} is damaged and followed by more records", position=pos)
        try:
            records.append(_decode_payload(kind, body[FRAME.size :]))
        except (struct.error, UnicodeDecodeError) as exc:
            raise JournalError(f"journal record at byte {pos} is malformed: {exc}", position=pos) from None
        pos = end
    return Replay(tuple(records), pos, False)


class JournalFile:
    """An open journal: appends are written in one ``write`` and fsync'd before returning."""

    def __init__(self, dir_fd: int, name: str, *, fsync: bool = True) -> None:
        self._fsync = fsync
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd)
        try:
            size = os.fstat(fd).st_size
            data = os.pread(fd, size, 0) if size else b""
            self.replay = decode_journal(data)
            if self.replay.torn:
                os.ftruncate(fd, self.replay.good_length)
                if fsync:
                    os.fsync(fd)
            os.lseek(fd, 0, os.SEEK_END)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd

    def append(self, records: Iterable[Record]) -> None:
        blob = b"".join(encode_record(r) for r in records)
        if not blob:
            return
        view = memoryview(blob)
        while view:
            written = os.write(self.fd, view)
            view = view[written:]
        if self._fsync:
            os.fsync(self.fd)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def read_journal(dir_fd: int, name: str) -> Replay:
    """Replay a journal without changing it (for reports)."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
    try:
        size = os.fstat(fd).st_size
        return decode_journal(os.pread(fd, size, 0) if size else b"")
    finally:
        os.close(fd)
