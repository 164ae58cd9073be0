"""IBM MQ MsgFlags (exact cmqc.h values) and the codec ids of the wire format."""

from __future__ import annotations

from enum import IntEnum, IntFlag


class MsgFlags(IntFlag):
    """MQMD MsgFlags. LAST_SEGMENT implies SEGMENT; LAST_MSG_IN_GROUP implies MSG_IN_GROUP."""

    NONE = 0x00  # MQMF_NONE / MQMF_SEGMENTATION_INHIBITED
    SEGMENTATION_ALLOWED = 0x01  # MQMF_SEGMENTATION_ALLOWED
    SEGMENT = 0x02  # MQMF_SEGMENT
    LAST_SEGMENT = 0x04  # MQMF_LAST_SEGMENT
    MSG_IN_GROUP = 0x08  # MQMF_MSG_IN_GROUP
    LAST_MSG_IN_GROUP = 0x10  # MQMF_LAST_MSG_IN_GROUP


KNOWN_FLAGS = 0x1F
# Plain-int copies for the per-segment hot path (IntFlag arithmetic costs microseconds).
_SEGMENT = MsgFlags.SEGMENT.value
_LAST_SEGMENT = MsgFlags.LAST_SEGMENT.value
_ANY_SEGMENT = _SEGMENT | _LAST_SEGMENT
_IN_GROUP = MsgFlags.MSG_IN_GROUP.value
_LAST_IN_GROUP = MsgFlags.LAST_MSG_IN_GROUP.value
_ANY_GROUP = _IN_GROUP | _LAST_IN_GROUP


def is_segment(flags: int) -> bool:
    """True when the physical message is one segment of a larger logical message."""
    return bool(int(flags) & _ANY_SEGMENT)


def is_last_segment(flags: int) -> bool:
    """True for the last segment, and for a message that is not segmented at all."""
    f = int(flags)
    return bool(f & _LAST_SEGMENT) or not f & _SEGMENT


def in_group(flags: int) -> bool:
    """True when the logical message belongs to a group of several messages."""
    return bool(int(flags) & _ANY_GROUP)


def is_last_in_group(flags: int) -> bool:
    """True for the last logical message of its group."""
    return bool(int(flags) & _LAST_IN_GROUP)


def group_bits(flags: int) -> int:
    """The group part of the flags, normalised (same for every segment of a message)."""
    f = int(flags)
    if f & _LAST_IN_GROUP:
        return _ANY_GROUP
    return f & _IN_GROUP


class Codec(IntEnum):
    """How the stored body of a logical message is encoded before splitting."""

    NONE = 0
    ZSTD = 1
