"""The resequencer: items in, the same items out in sequence order, no I/O.

``core`` holds :class:`Resequencer` (IBM's Resequence node, in-process); ``model`` its options,
phases and typed events; ``snapshot`` its snapshot codec; ``ordered`` :class:`OrderedGroups`,
MQ groups delivered message by message through an assembler, and ``ordered_snapshot`` its codec.
``batch`` holds :class:`BatchResequencer` (Apache Camel's batch resequencer: windows sorted by any
totally ordered key), ``batch_model`` its options and events, ``batch_snapshot`` its codec.
"""

from reassembly.resequencer.batch import BatchResequencer
from reassembly.resequencer.batch_model import (
    BatchDuplicate,
    BatchInvalid,
    BatchOptions,
    BatchReleased,
    DuplicatePolicy,
    WindowCause,
    WindowClosed,
)
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
    "BatchDuplicate",
    "BatchInvalid",
    "BatchOptions",
    "BatchReleased",
    "BatchResequencer",
    "CloseCause",
    "DuplicatePolicy",
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
    "WindowCause",
    "WindowClosed",
]
