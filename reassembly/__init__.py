"""Consumer-side reassembly: the sans-I/O assembler and (in ``reassembly.spark``) the Spark functions."""

from .assembler import Assembler, Limits, reassemble, reassemble_all
from .events import (
    Cause,
    ChecksumMismatch,
    ConflictingDuplicate,
    Duplicate,
    Event,
    GapReport,
    GroupComplete,
    GroupFailed,
    Late,
    MessageComplete,
    MessageFailed,
    Rejected,
    Unfinished,
)
from .reader import read_events

__all__ = [
    "Assembler",
    "Cause",
    "ChecksumMismatch",
    "ConflictingDuplicate",
    "Duplicate",
    "Event",
    "GapReport",
    "GroupComplete",
    "GroupFailed",
    "Late",
    "Limits",
    "MessageComplete",
    "MessageFailed",
    "Rejected",
    "Unfinished",
    "read_events",
    "reassemble",
    "reassemble_all",
]
