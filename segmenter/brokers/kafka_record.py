"""One Kafka record of a segment: its key, its headers, and how large its value may be.

Every segment travels as one record, and a topic refuses a record batch above its
``max.message.bytes``: the producer (:mod:`segmenter.brokers.kafka`) cuts each message at the size
that leaves room for the batch header, the record's framing, the key and the headers. That
arithmetic, the record key (the GroupId in hex by default, or one derived from a message id) and
the MQ fields as record headers are written here, apart from the client that sends the records,
so that they need no confluent-kafka to be read or tested.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import Reason, SegmentationError
from ..sources import argument_error
from ..wire import GROUP_ID_LENGTH, UNKNOWN_LENGTH, Segment

# A topic's max.message.bytes when neither the caller nor the cluster says otherwise: Kafka's
# default (broker message.max.bytes = 1 MiB + 12, the log overhead of offset and length).
DEFAULT_MAX_RECORD_BYTES = 1_048_588
# Record batch v2 header: base offset 8, length 4, leader epoch 4, magic 1, CRC 4, attributes 2,
# last offset delta 4, first and max timestamps 8 + 8, producer id 8, epoch 2, base sequence 4, count 4.
RECORD_BATCH_OVERHEAD = 61
# One record's framing at its largest: length, timestamp delta (a 64-bit zigzag varint: 10 bytes),
# offset delta, key length, value length and header count as varints (5 bytes each), attributes 1.
RECORD_OVERHEAD = 5 + 1 + 10 + 5 + 5 + 5 + 5
HEADER_OVERHEAD = 10  # per record header: its key length and value length varints
KEY_LENGTH = 2 * GROUP_ID_LENGTH  # the default key: the GroupId in hex
# The MQ fields carried as headers (headers=True) and the longest text each value can be.
MQ_HEADERS = (
    ("GroupId", 2 * GROUP_ID_LENGTH),
    ("MsgSeqNumber", 9),
    ("Offset", 20),
    ("MsgFlags", 10),
    ("OriginalLength", 20),
)
MQ_HEADER_BYTES = sum(HEADER_OVERHEAD + len(name) + size for name, size in MQ_HEADERS)
_MIN_SEGMENT = 1024  # the smallest max_segment_size worth sending (segment_size_for's floor too)

Headers = Sequence[tuple[str, bytes | str]]


def kafka_segment_size_for(max_record_bytes: int, *, key_length: int = KEY_LENGTH, header_bytes: int = 0) -> int:
    """The ``max_segment_size`` (encoded segment, header included) whose record fits ``max_record_bytes``.

    ``max_record_bytes`` is the topic's ``max.message.bytes`` (the largest record batch the broker
    takes); ``key_length`` the record key's length; ``header_bytes`` the record headers' keys and
    values together plus :data:`HEADER_OVERHEAD` each (:data:`MQ_HEADER_BYTES` for ``headers=True``).
    The default topic limit, 1,048,588, gives 1,048,443 with the default key and no headers.
    """
    size = max_record_bytes - RECORD_BATCH_OVERHEAD - RECORD_OVERHEAD - key_length - header_bytes
    if size < _MIN_SEGMENT:
        raise SegmentationError(
            "Kafka record limit too small for segments",
            reason=Reason.MSG_TOO_BIG_FOR_CHANNEL,
            limit=max_record_bytes,
            reserve=max_record_bytes - size,
        )
    return size


def _as_key(key: bytes | str | None, group_id: bytes) -> bytes:
    if key is None:
        return group_id.hex().encode("ascii")
    if isinstance(key, str):
        return key.encode("utf-8")
    if isinstance(key, (bytes, bytearray, memoryview)):
        return bytes(key)
    raise argument_error(f"a record key must be bytes or str, not {type(key).__name__}")


def group_id_for(msg_id: bytes | str) -> bytes:
    """The 24-byte GroupId of a caller's message id: the first 24 bytes of its SHA-256 (of the
    UTF-8 text for a ``str``). Deterministic, so a producer restarted after a crash that sends the
    message again under the same id sends the same segments, which the consumer's assembler
    recognises as duplicates.

    ``msg_id``: the caller's message id, bytes or text.
    """
    import hashlib

    if isinstance(msg_id, str):
        raw = msg_id.encode("utf-8")
    elif isinstance(msg_id, (bytes, bytearray, memoryview)):
        raw = bytes(msg_id)
    else:
        raise argument_error(f"msg_id must be bytes or str, not {type(msg_id).__name__}")
    if not raw:
        raise argument_error("msg_id must not be empty")
    return hashlib.sha256(raw).digest()[:GROUP_ID_LENGTH]


def _encoded_headers(headers: Headers) -> list[tuple[str, bytes]]:
    out = []
    for item in headers:
        try:
            name, value = item
        except (TypeError, ValueError):
            raise argument_error(f"a record header is a (name, value) pair, not {item!r}"[:120]) from None
        if not isinstance(name, str):
            raise argument_error(f"a record header name is a str, not {type(name).__name__}")
        if isinstance(value, str):
            value = value.encode("utf-8")
        elif not isinstance(value, bytes):
            raise argument_error(f"a record header value is bytes or str, not {type(value).__name__}")
        out.append((name, value))
    return out


def _mq_headers(seg: Segment) -> list[tuple[str, bytes]]:
    h = seg.header
    out = [
        ("GroupId", h.group_id.hex().encode()),
        ("MsgSeqNumber", str(h.msg_seq_number).encode()),
        ("Offset", str(h.offset).encode()),
        ("MsgFlags", str(int(h.msg_flags)).encode()),
    ]
    if h.original_length != UNKNOWN_LENGTH:
        out.append(("OriginalLength", str(h.original_length).encode()))
    return out
