"""What the segment store's operations take and return (:mod:`reassembly.segstore.store` runs them):
the claim a member holds, the fate of a written segment, a delivery's outcome, an opened unit, a
vacuum's count, and the options every store passes on. Frozen records, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

from reassembly.assembler.model import Limits
from reassembly.segstore import core
from reassembly.segstore.core import Delivered, Write
from segmenter.errors import Reason

if TYPE_CHECKING:
    from typing_extensions import Required

OnMessage = Callable[[Delivered], None]
"""What a claimant hands each delivered message to; it returns once the message is safe. Raising
means not settled: the claim's lease is released for a retry."""


@dataclass(frozen=True)
class Claim:
    """A unit this member holds under a lease: deliver it (:meth:`~reassembly.segstore.SegmentStore.deliver`)
    before ``until``."""

    group_id: bytes
    """The GroupId of the claimed unit."""
    unit: int
    """The unit's number: a message's MsgSeqNumber in a group, or ``WHOLE_GROUP`` (0) for a whole Unit-of-Work group or
    a message not in a group."""
    token: int
    """The lease's token, bumped on every claim: a delivery under a token that is no longer the unit's delivers nothing
    (the unit was settled or taken over since)."""
    until: float
    """When the lease ends, by the store's clock (seconds); another member may take the unit over after it."""


@dataclass(frozen=True)
class Written:
    """What one write did with one segment: its fate, its GroupId (when it decoded), why it was quarantined."""

    outcome: Write
    """What the write did: stored, kept as a variant, counted as a duplicate, or quarantined."""
    group_id: bytes | None = None
    """The segment's GroupId; None when its header did not decode."""
    reason: Reason | None = None
    """Why the segment was quarantined; None for any other outcome."""


@dataclass(frozen=True)
class Settled:
    """What one :meth:`~reassembly.segstore.SegmentStore.deliver` did."""

    delivered: int = 0
    """Messages handed on to ``on_message``."""
    quarantined: int = 0
    """Segments kept aside (losers, failed messages, late copies)."""
    settled: bool = False
    """The unit's segments were removed (False: not decided yet, or the lease was lost)."""


@dataclass(frozen=True)
class Opened:
    """A claimed unit assembled from the store and not settled yet (:meth:`~reassembly.segstore.SegmentStore.open`):
    its messages to hand on, and what :meth:`~reassembly.segstore.SegmentStore.settle` needs to account for every
    row."""

    claim: Claim
    result: core.Assembly
    keys: list[tuple[int, int, bytes]]
    raws: list[bytes]
    members: frozenset[str]  # the members whose writes stored the unit's segments

    @property
    def delivered(self) -> tuple[Delivered, ...]:
        return self.result.delivered


@dataclass(frozen=True)
class Vacuumed:
    """What :meth:`~reassembly.segstore.SegmentStore.vacuum` removed (or would remove, in a dry run)."""

    tombstones: int
    """Tombstones of settled or expired units removed (or, in a dry run, that would be)."""
    quarantined: int
    """Quarantined segments removed (or, in a dry run, that would be); 0 without ``quarantine_too``."""


class StoreOptions(TypedDict, total=False):
    """The keyword arguments every store passes on to :class:`~reassembly.segstore.SegmentStore` (their defaults and
    meaning are there): a store states only how it connects."""

    member: Required[str]
    lease_seconds: float
    limits: Limits | None
    unit_of_work: bool | None
    clock: Callable[[], float] | None
