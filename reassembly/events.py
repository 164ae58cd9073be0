"""What the assembler reports: typed, immutable events.

Every input segment ends up in exactly one place: used in a completed
message, counted as a :class:`Duplicate`, or handed back (original bytes
included) in a :class:`Rejected`, :class:`MessageFailed` or
:class:`Unfinished` event. Nothing is dropped silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from segmenter.errors import Reason, SegmentationError
from segmenter.wire import SegmentHeader

from .bodies import StoredBody, StoredOriginal
from .positions import Origin

# ``positions`` on an event: where each segment whose bytes (or use) it reports was read, for
# segments given to ``Assembler.receive`` with a position; parallel to ``segments`` / ``raw``.
# ``stored`` on a failure event: segments of failed messages whose store keeps them past the
# failure (``FileBodyStore(keep_failed=True)``), handed back as handles instead of bytes (a
# failed message of any size is never read back into memory); always empty with any other store.
# ``positions`` then follow the segments message by message (the Spark judge, which uses such a
# store, gives no positions).


class Cause(str, Enum):
    """Why an unfinished group left the assembler."""

    EXPIRED = "expired"  # older than the configured expiry
    EVICTED = "evicted"  # pushed out by a memory or open-group limit
    CLOSED = "closed"  # still open when the input ended
    REVOKED = "revoked"  # its partition was taken away (a log rebalance): its next owner reads it again


@dataclass(frozen=True)
class MessageComplete:
    """A logical message, reassembled and verified (segment and message checksums)."""

    group_id: bytes
    msg_seq_number: int
    payload: bytes | memoryview | StoredBody  # StoredBody: the message lives in the assembler's BodyStore
    msg_flags: int
    segments: int  # segments used
    duplicates: int  # identical copies counted and ignored
    stored_length: int
    original_length: int
    checksum: int | None = None  # the verified whole-message checksum (algorithm as in the segments)
    positions: tuple[Origin, ...] = ()  # of the segments used


@dataclass(frozen=True)
class GroupComplete:
    """Every message of a group, in MsgSeqNumber order, gap free (Unit-of-Work delivery)."""

    group_id: bytes
    messages: tuple[MessageComplete, ...]

    @property
    def positions(self) -> tuple[Origin, ...]:
        """Of every segment used, message by message."""
        return tuple(o for m in self.messages for o in m.positions)


@dataclass(frozen=True)
class Duplicate:
    """An identical copy of a segment already held: counted, ignored."""

    group_id: bytes
    msg_seq_number: int
    offset: int
    length: int
    positions: tuple[Origin, ...] = ()  # of this copy


@dataclass(frozen=True)
class Rejected:
    """A segment that was refused; ``raw`` holds its original bytes for quarantine."""

    reason: Reason
    error: SegmentationError
    raw: bytes
    header: SegmentHeader | None = None
    positions: tuple[Origin, ...] = ()  # of this segment


@dataclass(frozen=True)
class ChecksumMismatch(Rejected):
    """A segment whose header or data does not match its checksum."""


@dataclass(frozen=True)
class ConflictingDuplicate(Rejected):
    """Same position as a used segment, different bytes: the copy that lost the arbitration
    (or that came after its message was delivered)."""


@dataclass(frozen=True)
class Late(Rejected):
    """A segment for a group that already completed, failed, expired or was evicted (see the
    assembler's ``second_chance`` to start an expired or evicted group again instead)."""


@dataclass(frozen=True)
class GapReport:
    """What one logical message is missing."""

    msg_seq_number: int
    missing_ranges: tuple[tuple[int, int | None], ...]  # [start, end) of the stored body; end None = unknown
    stored_length: int | None
    received_bytes: int
    last_segment_seen: bool


@dataclass(frozen=True)
class MessageFailed:
    """All segments arrived but the message is wrong (message checksum, decompression, size), or two
    assemblies of them pass every check (conflict, 9012): nothing is delivered."""

    group_id: bytes
    msg_seq_number: int
    reason: Reason
    error: SegmentationError
    segments: tuple[bytes, ...]  # original bytes of every segment used
    positions: tuple[Origin, ...] = ()
    stored: tuple[StoredOriginal, ...] = ()  # the rest of them, left in the store


@dataclass(frozen=True)
class Unfinished:
    """A group that left the assembler without completing; its segments come back."""

    group_id: bytes
    cause: Cause
    reason: Reason  # 2242 if a message is incomplete, else 2241 (MQ's preference)
    gaps: tuple[GapReport, ...]  # messages that are incomplete
    missing_seq_numbers: tuple[int, ...]  # messages of which nothing arrived (known range; the lowest 1,000)
    last_seq_number: int | None  # the group's last MsgSeqNumber, if its LAST message was seen
    segments: tuple[bytes, ...] = field(default=())  # original bytes of every segment held
    failed: tuple[MessageFailed, ...] = field(default=())  # messages that failed inside the group
    positions: tuple[Origin, ...] = ()
    stored: tuple[StoredOriginal, ...] = ()  # the rest of the segments held, left in the store


@dataclass(frozen=True)
class GroupFailed:
    """A Unit-of-Work group with a failed message: nothing of it is delivered."""

    group_id: bytes
    reason: Reason
    failed: tuple[MessageFailed, ...]
    segments: tuple[bytes, ...]  # original bytes of the group's other segments
    positions: tuple[Origin, ...] = ()  # of ``segments`` (each failed message carries its own)
    stored: tuple[StoredOriginal, ...] = ()  # the rest of the group's other segments, left in the store


Event = MessageComplete | GroupComplete | Duplicate | Rejected | MessageFailed | Unfinished | GroupFailed
