"""The assembler: segments in, typed events out, no I/O (the sans-I/O core and its parts).

``core`` holds :class:`Assembler` and its intake; ``judging`` turns verdicts into events;
``leaving`` frees what a group held (delivered, ended, evicted, expired) and reports refused
segments; ``model`` and ``_state`` its per-group state and the rules as data; ``rules`` the
arbitration rule; ``build`` turns a decided group into bytes; ``events`` the typed events;
``positions`` Kafka-style positions and the safe commit offset; ``bodies`` where large message
bodies live (memory or a file: the one adapter particular to this core); ``snapshot`` the snapshot
codec; ``reader`` a convenience driver over sources.
"""

from reassembly.assembler.core import Assembler, LimitError, Limits, reassemble, reassemble_all
from reassembly.assembler.events import (
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
    ScatteredPayload,
    Unfinished,
)
from reassembly.assembler.reader import read_events

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
    "LimitError",
    "Limits",
    "MessageComplete",
    "MessageFailed",
    "Rejected",
    "ScatteredPayload",
    "Unfinished",
    "read_events",
    "reassemble",
    "reassemble_all",
]
