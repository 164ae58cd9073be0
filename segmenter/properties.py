"""Segment headers as broker message properties, and as MQMD version-2 fields.

For brokers that carry headers (Kafka record headers, JMS/AMQP properties)
the body can stay raw segment data: the header travels as properties and is
verified on the way back exactly like an embedded one. The group id doubles
as the broker's grouping key (Kafka record key, JMSXGroupID), so a broker
with message groups gives every segment of a group to one consumer.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from .errors import HeaderError, OffsetError, OriginalLengthError, Reason, SequenceError
from .wire import MAX_SEQ_NUMBER, UNKNOWN_LENGTH, Buffer, Segment, SegmentHeader, decode_header, verify_data

HEADER_PROPERTY = "SegmentHeader"  # the packed 84-byte header (bytes in Kafka, base64 text in JMS)
MQLONG_MAX = 2**31 - 1
MQ_OFFSET_MAX = 999_999_999


def kafka_key(header: SegmentHeader) -> bytes:
    """Record key: the group id in hex, so one partition (one consumer) holds a whole group."""
    return header.group_id.hex().encode()


def kafka_headers(segment: Segment) -> list[tuple[str, bytes]]:
    """Kafka record headers for a segment whose record value is ``segment.data``."""
    h = segment.header
    return [
        (HEADER_PROPERTY, h.pack()),
        ("JMSXGroupID", h.group_id.hex().encode()),
        ("JMSXGroupSeq", str(h.msg_seq_number).encode()),
    ]


def jms_properties(segment: Segment) -> dict[str, str | int]:
    """JMS/AMQP application properties (strings and ints only) for a body of ``segment.data``."""
    h = segment.header
    return {
        "JMSXGroupID": h.group_id.hex(),
        "JMSXGroupSeq": h.msg_seq_number,  # JMS requires >= 1: MsgSeqNumber already is
        HEADER_PROPERTY: base64.b64encode(h.pack()).decode("ascii"),
    }


def _binary(value: object, what: str) -> Buffer:
    """A header value or body as sent: bytes-like, else refused (a Kafka tombstone or null header
    value, a JMS text body: a hostile producer can send each)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return value
    raise HeaderError(
        f"{what} is {'missing (null)' if value is None else type(value).__name__}, not bytes",
        reason=Reason.TRUNCATED if value is None else Reason.BAD_MAGIC,
    )


def _verified(packed: bytes, body: object) -> Segment:
    body = _binary(body, "the body")
    header = decode_header(packed)
    if len(body) != header.data_length:
        raise HeaderError(
            f"body has {len(body)} bytes, header says {header.data_length}",
            reason=Reason.TRUNCATED,
            declared=header.data_length,
            present=len(body),
        )
    verify_data(header, body)
    return Segment(header, body)


def from_kafka(headers: Iterable[tuple[str, bytes | None]], value: Buffer | None) -> Segment:
    """Rebuild and verify a segment from Kafka record headers and value."""
    found = [v for k, v in headers if k == HEADER_PROPERTY]
    if len(found) != 1:
        raise HeaderError(f"expected one {HEADER_PROPERTY} header, found {len(found)}", reason=Reason.BAD_MAGIC)
    return _verified(bytes(_binary(found[0], f"the {HEADER_PROPERTY} header")), value)


def from_jms(properties: Mapping[str, object], body: Buffer | None) -> Segment:
    """Rebuild and verify a segment from JMS/AMQP properties and body."""
    text = properties.get(HEADER_PROPERTY)
    if not isinstance(text, str):
        raise HeaderError(f"property {HEADER_PROPERTY} missing", reason=Reason.BAD_MAGIC)
    try:
        packed = base64.b64decode(text, validate=True)
    except ValueError:
        raise HeaderError(f"property {HEADER_PROPERTY} is not base64", reason=Reason.BAD_MAGIC) from None
    segment = _verified(packed, body)
    if properties.get("JMSXGroupID") not in (None, segment.header.group_id.hex()):
        raise HeaderError("JMSXGroupID disagrees with the header", reason=Reason.HEADER_MISMATCH)
    return segment


class MQMDv2Fields(NamedTuple):
    """The MQMD version-2 group and segment fields (MQMD_LENGTH_2 offsets 324..363)."""

    GroupId: bytes
    MsgSeqNumber: int
    Offset: int
    MsgFlags: int
    OriginalLength: int


def mqmd_fields(header: SegmentHeader) -> MQMDv2Fields:
    """MQMD v2 values for a segment, refused where MQ's MQLONG ranges cannot hold them.

    OriginalLength is the stored length of the whole logical message (what the
    segments reassemble to), or MQOL_UNDEFINED (-1) when not yet known.
    """
    if not 1 <= header.msg_seq_number <= MAX_SEQ_NUMBER:
        raise SequenceError(f"MsgSeqNumber {header.msg_seq_number} outside 1..{MAX_SEQ_NUMBER}")
    if header.offset > MQ_OFFSET_MAX:
        raise OffsetError(
            f"Offset {header.offset} exceeds MQ's {MQ_OFFSET_MAX}", offset=header.offset, limit=MQ_OFFSET_MAX
        )
    original = -1 if header.stored_length == UNKNOWN_LENGTH else header.stored_length
    if original > MQLONG_MAX:
        raise OriginalLengthError(
            f"OriginalLength {original} does not fit an MQLONG", original_length=original, limit=MQLONG_MAX
        )
    return MQMDv2Fields(header.group_id, header.msg_seq_number, header.offset, int(header.msg_flags), original)
