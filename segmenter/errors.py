"""One exception hierarchy for the whole library.

Every error carries a machine-readable :class:`Reason` (IBM MQ's reason code
where MQ has one, a library code from 9001 up where it does not) and the
numbers that explain it in ``details``, so callers and quarantine tables can
branch on ``err.reason`` instead of parsing messages.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any


class Reason(IntEnum):
    """Why something was refused. MQ's own codes keep MQ's numbers."""

    CONNECTION_BROKEN = 2009  # MQRC_CONNECTION_BROKEN: the broker connection failed or refused
    MSG_TOO_BIG = 2030  # MQRC_MSG_TOO_BIG_FOR_Q: declared size above the limit
    MSG_TOO_BIG_FOR_CHANNEL = 2218  # MQRC_MSG_TOO_BIG_FOR_CHANNEL: a segment larger than the pipe's maximum
    RMH_ERROR = 2220  # MQRC_RMH_ERROR: a reference message header (MQRMH) is malformed
    INCOMPLETE_GROUP = 2241  # MQRC_INCOMPLETE_GROUP: a message of the MQ group is missing
    INCOMPLETE_MSG = 2242  # MQRC_INCOMPLETE_MSG: segments of the message are missing
    MSG_FLAGS_ERROR = 2249  # MQRC_MSG_FLAGS_ERROR: missing/repeated LAST flag
    MSG_SEQ_NUMBER_ERROR = 2250  # MQRC_MSG_SEQ_NUMBER_ERROR: out of range, or beyond the group's last
    OFFSET_ERROR = 2251  # MQRC_OFFSET_ERROR: overlap, offset out of range
    ORIGINAL_LENGTH_ERROR = 2252  # MQRC_ORIGINAL_LENGTH_ERROR: OriginalLength inconsistent with the data
    SEGMENT_LENGTH_ZERO = 2253  # MQRC_SEGMENT_LENGTH_ZERO: an empty segment that is not the last
    GROUP_ID_ERROR = 2258  # MQRC_GROUP_ID_ERROR: a GroupId that is not 24 bytes
    SRC_ENV_ERROR = 2261  # MQRC_SRC_ENV_ERROR: an MQRMH's source environment string is out of bounds
    SRC_NAME_ERROR = 2262  # MQRC_SRC_NAME_ERROR: an MQRMH's source name string is out of bounds
    DEST_ENV_ERROR = 2263  # MQRC_DEST_ENV_ERROR: an MQRMH's destination environment string is out of bounds
    DEST_NAME_ERROR = 2264  # MQRC_DEST_NAME_ERROR: an MQRMH's destination name string is out of bounds
    # Library reasons (no MQ equivalent).
    BAD_MAGIC = 9001  # not a segment: the first bytes are not the magic SGMT (or a row is unreadable)
    UNSUPPORTED_VERSION = 9002  # a header version this reader does not know
    HEADER_LENGTH_ERROR = 9003  # the declared header length is impossible
    HEADER_CHECKSUM_ERROR = 9004  # the header does not match its own checksum
    DATA_CHECKSUM_ERROR = 9005  # a segment's data does not match its checksum
    MESSAGE_CHECKSUM_ERROR = 9006  # the assembled message does not match its whole-message checksum
    TRUNCATED = 9007  # fewer bytes than the header declares (or none: a NULL row)
    RESERVED_FIELD_ERROR = 9008  # reserved header bits are set
    UNKNOWN_CODEC = 9009  # a codec id this reader does not know
    UNKNOWN_CHECKSUM = 9010  # a checksum algorithm id or name this reader does not know
    DECOMPRESSION_ERROR = 9011  # a compressed body is corrupt or expands to another size than declared
    CONFLICTING_DUPLICATE = 9012  # two copies of one position carry different bytes
    HEADER_MISMATCH = 9013  # segments of one message disagree on a field that must be equal
    BUFFER_LIMIT = 9014  # a resource bound (buffered bytes, open groups) forced an eviction
    LATE_SEGMENT = 9015  # a segment of a message that was already delivered, failed or expired
    STATE_ERROR = 9016  # a call the object's state does not allow, or a snapshot that cannot be restored
    PATH_ERROR = 9017  # an object name that is not a safe relative path
    STORE_ERROR = 9018  # the object or body store failed (unreadable, purged, out of space)
    OBJECT_SIZE_ERROR = 9019  # a stored object's size is not the size its claim check declares
    ARGUMENT_ERROR = 9020  # a producer option or input the wire format cannot carry (segment size, codec, payload type)
    TRAILING_BYTES = 9021  # more bytes than the header declares: bytes after the segment's declared data
    # Digests (9030 up, leaving room for other additions): see segmenter/digest.py.
    EXTENSION_ERROR = 9030  # a header extension (or its digest records) is malformed
    UNKNOWN_EXTENSION = 9031  # a critical extension record type this reader does not know
    DIGEST_MISMATCH = 9032  # the whole-message SHA-256 does not match
    HMAC_MISMATCH = 9033  # the HMAC-SHA-256 tag does not match: not authentic
    UNKNOWN_KEY = 9034  # the HMAC key id names no key in the keyring
    DIGEST_MISSING = 9035  # the reader demands a digest or tag the message does not carry
    # Collector (9040 up): see reassembly/collector.py and reassembly/storage.py.
    RULE_ERROR = 9040  # a destination rule with impossible limits
    STORAGE_ERROR = 9041  # the collection database refused or failed an operation
    # Resequencer (9050 up): see reassembly/resequencer/.
    RESEQ_BAD_NUMBER = 9050  # sequence number not an integer (None, text...), or batch sort key missing or incomparable
    RESEQ_BEFORE_START = 9051  # below the group's start of sequence
    RESEQ_AFTER_END = 9052  # above the group's end of sequence
    RESEQ_DUPLICATE = 9053  # the number is already held or was already passed on
    RESEQ_START_NOT_LOWEST = 9054  # a predicate start above a number already held
    RESEQ_END_BELOW_RECEIVED = 9055  # a predicate end below a number already received
    RESEQ_FORGOTTEN = 9056  # below the oldest skipped range still remembered (max_gaps)
    RESEQ_BAD_SIZE = 9057  # the size given with a message is not a whole number of bytes (>= 0)
    # Spark environment (9060 up): see reassembly/spark/engine/environment.py.
    ENVIRONMENT_ERROR = 9060  # Spark cannot run the library: no session starts, or its workers' Python lacks it
    # Competing consumers (9070 up): see reassembly/segstore/ and reassembly/brokers/share.py.
    DELIVERY_LIMIT = 9070  # a record delivered as often as its queue allows: quarantined, then rejected


class SegmentationError(Exception):
    """Root of every error this library raises on purpose.

    ``message``: what happened, in words. ``reason``: the reason code (None: the class's ``default_reason``).
    ``**details``: the facts of the case (lengths, offsets, the GroupId), kept in ``details`` for a program to read.
    """

    default_reason: Reason = Reason.STATE_ERROR

    def __init__(self, message: str, *, reason: Reason | None = None, **details: Any) -> None:
        super().__init__(message)
        self.reason: Reason = reason if reason is not None else self.default_reason
        self.details: dict[str, Any] = details

    def __str__(self) -> str:
        base = super().__str__()
        return f"[{self.reason.value} {self.reason.name}] {base}"

    def name_group(self, group_id: bytes) -> SegmentationError:
        """Name the MQ GroupId (hex) of the segment or message refused, in the message and in
        ``details["group_id"]``; once (an error reported for several segments is named once).

        The checks that raise see one segment or message, not always its group; the assembler, which
        knows it, names it before reporting, so an offset in an error can be traced to its message.

        ``group_id``: the 24-byte GroupId.
        """
        if "group_id" not in self.details:
            gid = bytes(group_id).hex()
            self.details["group_id"] = gid
            message = self.args[0] if self.args else ""
            self.args = (f"{message} (GroupId {gid})", *self.args[1:])
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep reason and details across pickling (Spark ships errors between processes).
        return (_rebuild, (type(self), self.args[0] if self.args else "", self.reason, self.details))


def _rebuild(cls: type[SegmentationError], message: str, reason: Reason, details: dict[str, Any]) -> SegmentationError:
    return cls(message, reason=reason, **details)


class HeaderError(SegmentationError):
    """A segment header is malformed: magic, version, length, reserved bits, ranges."""

    default_reason = Reason.BAD_MAGIC


class ChecksumError(SegmentationError):
    """Data does not match its checksum (header, segment data or whole message)."""

    default_reason = Reason.DATA_CHECKSUM_ERROR


class SequenceError(SegmentationError):
    """MsgSeqNumber out of range, or beyond the last message of its group (MQ 2250)."""

    default_reason = Reason.MSG_SEQ_NUMBER_ERROR


class OffsetError(SegmentationError):
    """Offset out of range, or segments overlap (MQ 2251)."""

    default_reason = Reason.OFFSET_ERROR


class OriginalLengthError(SegmentationError):
    """OriginalLength inconsistent with the data (MQ 2252)."""

    default_reason = Reason.ORIGINAL_LENGTH_ERROR


class SegmentLengthZeroError(SegmentationError):
    """An empty segment that is not the last of its message (MQ 2253)."""

    default_reason = Reason.SEGMENT_LENGTH_ZERO


class FlagsError(SegmentationError):
    """MsgFlags contradict each other or the group (MQ 2249)."""

    default_reason = Reason.MSG_FLAGS_ERROR


class MessageTooBigError(SegmentationError):
    """A declared or produced length is above the configured limit (MQ 2030)."""

    default_reason = Reason.MSG_TOO_BIG


class IncompleteError(SegmentationError):
    """A message (2242) or group (2241) is missing parts."""

    default_reason = Reason.INCOMPLETE_MSG


class ConflictError(SegmentationError):
    """Two copies of one position carry different bytes: the checks decide; if both pass, neither is delivered."""

    default_reason = Reason.CONFLICTING_DUPLICATE


class DecompressionError(SegmentationError):
    """A compressed body is corrupt or decompresses to the wrong size."""

    default_reason = Reason.DECOMPRESSION_ERROR


class LimitError(SegmentationError):
    """A resource bound (buffered bytes, open groups) forced an eviction."""

    default_reason = Reason.BUFFER_LIMIT
