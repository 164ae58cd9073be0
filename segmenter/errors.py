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
    MSG_TOO_BIG_FOR_CHANNEL = 2218  # MQRC_MSG_TOO_BIG_FOR_CHANNEL
    RMH_ERROR = 2220  # MQRC_RMH_ERROR
    INCOMPLETE_GROUP = 2241  # MQRC_INCOMPLETE_GROUP
    INCOMPLETE_MSG = 2242  # MQRC_INCOMPLETE_MSG
    MSG_FLAGS_ERROR = 2249  # MQRC_MSG_FLAGS_ERROR: missing/repeated LAST flag
    MSG_SEQ_NUMBER_ERROR = 2250  # MQRC_MSG_SEQ_NUMBER_ERROR
    OFFSET_ERROR = 2251  # MQRC_OFFSET_ERROR: overlap, offset out of range
    ORIGINAL_LENGTH_ERROR = 2252  # MQRC_ORIGINAL_LENGTH_ERROR
    SEGMENT_LENGTH_ZERO = 2253  # MQRC_SEGMENT_LENGTH_ZERO
    GROUP_ID_ERROR = 2258  # MQRC_GROUP_ID_ERROR
    SRC_ENV_ERROR = 2261  # MQRC_SRC_ENV_ERROR
    SRC_NAME_ERROR = 2262  # MQRC_SRC_NAME_ERROR
    DEST_ENV_ERROR = 2263  # MQRC_DEST_ENV_ERROR
    DEST_NAME_ERROR = 2264  # MQRC_DEST_NAME_ERROR
    # Library reasons (no MQ equivalent).
    BAD_MAGIC = 9001
    UNSUPPORTED_VERSION = 9002
    HEADER_LENGTH_ERROR = 9003
    HEADER_CHECKSUM_ERROR = 9004
    DATA_CHECKSUM_ERROR = 9005
    MESSAGE_CHECKSUM_ERROR = 9006
    TRUNCATED = 9007
    RESERVED_FIELD_ERROR = 9008
    UNKNOWN_CODEC = 9009
    UNKNOWN_CHECKSUM = 9010
    DECOMPRESSION_ERROR = 9011
    CONFLICTING_DUPLICATE = 9012
    HEADER_MISMATCH = 9013
    BUFFER_LIMIT = 9014
    LATE_SEGMENT = 9015
    STATE_ERROR = 9016
    PATH_ERROR = 9017
    STORE_ERROR = 9018
    OBJECT_SIZE_ERROR = 9019
    ARGUMENT_ERROR = 9020  # a producer option or input the wire format cannot carry (segment size, codec, payload type)
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
    # Resequencer (9050 up): see reassembly/resequencer.py.
    RESEQ_BAD_NUMBER = 9050  # the sequence number is not an integer (None, text, a float...)
    RESEQ_BEFORE_START = 9051  # below the group's start of sequence
    RESEQ_AFTER_END = 9052  # above the group's end of sequence
    RESEQ_DUPLICATE = 9053  # the number is already held or was already passed on
    RESEQ_START_NOT_LOWEST = 9054  # a predicate start above a number already held
    RESEQ_END_BELOW_RECEIVED = 9055  # a predicate end below a number already received
    RESEQ_FORGOTTEN = 9056  # below the oldest skipped range still remembered (max_gaps)
    RESEQ_BAD_SIZE = 9057  # the size given with a message is not a whole number of bytes (>= 0)


class SegmentationError(Exception):
    """Root of every error this library raises on purpose."""

    default_reason: Reason = Reason.STATE_ERROR

    def __init__(self, message: str, *, reason: Reason | None = None, **details: Any) -> None:
        super().__init__(message)
        self.reason: Reason = reason if reason is not None else self.default_reason
        self.details: dict[str, Any] = details

    def __str__(self) -> str:
        base = super().__str__()
        return f"[{self.reason.value} {self.reason.name}] {base}"

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
