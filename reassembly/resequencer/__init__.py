"""The resequencer: items in, the same items out in sequence order, no I/O.

``core`` holds :class:`Resequencer` (IBM's Resequence node, in-process); ``model`` its options,
phases and typed events; ``snapshot`` its snapshot codec; ``ordered`` :class:`OrderedGroups`,
MQ groups delivered message by message through an assembler, and ``ordered_snapshot`` its codec.
"""

from reassembly.resequencer.core import Resequencer
from reassembly.resequencer.model import (
    CloseCause,
    EndAt,
    EndAuto,
    EndWhen,
    Expired,
    Failed,
    GroupClosed,
    Missing,
    Released,
    ResequenceLimits,
    ResequenceOptions,
    SkipCause,
    Skipped,
    StartAt,
    StartAuto,
    StartWhen,
)
from reassembly.resequencer.ordered import OrderedGroups

__all__ = [
    "CloseCause",
    "EndAt",
    "EndAuto",
    "EndWhen",
    "Expired",
    "Failed",
    "GroupClosed",
    "Missing",
    "OrderedGroups",
    "Released",
    "ResequenceLimits",
    "ResequenceOptions",
    "Resequencer",
    "SkipCause",
    "Skipped",
    "StartAt",
    "StartAuto",
    "StartWhen",
]
