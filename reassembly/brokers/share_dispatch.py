"""Competing consumers for the group dispatcher: a Kafka share group (or a queue read without message
groups) through the shared segment store, whole messages handed to the runners' workers.

:class:`ShareDispatchSource` is the runners' :class:`~reassembly.runtime.Source` over a
:class:`~reassembly.brokers.share.ShareGroupReceiver` (or a
:class:`~reassembly.brokers.competing.CompetingReceiver`: anything with ``receive``, ``member`` and
``close``). Each :meth:`~ShareDispatchSource.fetch`:

* reads one batch, writes it to the store and acknowledges each record only once the store kept
  it (stored, a duplicate, or quarantined with its bytes): the receiver's own ``receive``;
* opens the units that batch completed (claimed by this member in the write's transaction) and,
  every ``take_over_every`` seconds, units whose claimant died (its lease ran out): each is
  assembled from the store with the assembler's rules and its messages are offered, still
  unsettled in the store;
* renews the lease of every unit it holds every ``lease_seconds / 3`` seconds, so a message
  waiting for a worker or for a retry's backoff keeps its claim.

:meth:`~ShareDispatchSource.settled` (DONE, or DEAD once the runner wrote the dead letter) settles
the unit in the store when all its messages are settled: its segments deleted, tombstones written.
A unit whose lease was lost anyway (this process stalled past its lease) is taken over and delivered
by another member; this member's settle is then refused by the store (``settlements_lost``), so the
handler may see such a message twice: at least once, as everywhere, and a sink keyed by (GroupId,
MsgSeqNumber) stays exact. :meth:`~ShareDispatchSource.close` gives back the units still held
(released, not settled), so another member takes them over at once instead of after the lease.

Order: the dispatcher orders the messages this process offers (by MQ group, key, ...); messages of
one MQ group completed by different members are handed to different processes, so a group's order
holds across members only as a unit of work (``unit_of_work=True``: the whole group is one claim).
Acknowledgements are per record and sent as the records are stored: :meth:`commit` has nothing to do.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from reassembly.assembler.events import GroupComplete
from reassembly.runtime.base import Offered
from reassembly.runtime.sources import PauseFlag
from reassembly.segstore.member import MemberStats, StoreMember
from reassembly.segstore.records import Claim, Opened
from reassembly.segstore.store import SegmentStore
from segmenter.errors import Reason, SegmentationError

if TYPE_CHECKING:
    import reassembly.dispatcher
    from reassembly.dispatcher import Dispatcher, Work

log = logging.getLogger(__name__)


class Receiver(Protocol):
    """What the source reads through: a share-group or competing-queue receiver of :mod:`reassembly.brokers`."""

    member: StoreMember

    def receive(self, timeout: float = 1.0) -> tuple[int, list[Claim]]: ...

    def close(self) -> None: ...


@dataclass
class ShareSourceStats:
    """What one member's source did; ``spread`` counts the units it opened by how many members
    stored their segments (``{"1": 40, "2": 30, "3": 12}``: the competing consumers at work)."""

    member: str
    """This member's name in the segment store."""
    records: int = 0
    """Records (or deliveries) read."""
    opened: int = 0
    """Claimed units assembled and offered (or settled at once: nothing to deliver)."""
    messages: int = 0
    """Messages offered to the dispatcher."""
    settled: int = 0
    """Units settled in the store after their messages were settled."""
    settlements_lost: int = 0
    """Units whose lease another member took over before this one settled."""
    renewals: int = 0
    """Leases of claimed units renewed while their messages were being handled."""
    leases_lost: int = 0
    """Renewals refused: the unit was taken over (this process stalled past its lease)."""
    released: int = 0
    """Units given back unsettled at close."""
    spread: dict[str, int] = field(default_factory=dict)
    store: MemberStats = field(default_factory=MemberStats)
    """The counters of this member of the segment store (segments stored, units claimed)."""


@dataclass
class _Held:
    opened: Opened
    claim: Claim
    left: int  # messages not settled yet


def _never(event: object) -> None:
    """The receiver's own ``on_message``: unused, this source delivers what it claims through the runner.

    ``event``: what the receiver would hand on (never called with one).
    """
    raise SegmentationError(
        "a ShareDispatchSource hands its claims to the runner, not to on_message", reason=Reason.STATE_ERROR
    )


class ShareDispatchSource(PauseFlag):
    """A :class:`~reassembly.runtime.Source` of whole messages completed in a shared segment store.

    ``receiver`` wraps ``store`` (built with ``on_message=`` :data:`ON_MESSAGE`; the source owns
    both and closes them). Each message is offered with its GroupId as key and no positions (the
    store keeps the segments: nothing is held in this process and nothing is committed by offset).

    ``take_over_every``: seconds between looks for units whose claimant's lease ran out. ``clock``: the clock those
    seconds are read on.
    """

    def __init__(
        self,
        receiver: Receiver,
        store: SegmentStore,
        *,
        take_over_every: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.receiver = receiver
        self.store = store
        self.member = receiver.member
        self.member.take_over_every = take_over_every
        self.clock = clock
        self.renew_every = store.lease_seconds / 3
        self._next_renewal = clock() + self.renew_every
        self._held: dict[tuple[bytes, int], _Held] = {}
        self._unit_of: dict[int, tuple[bytes, int]] = {}  # id(message offered) -> its unit
        self.stats = ShareSourceStats(store.member, store=self.member.stats)

    def fetch(self, timeout: float) -> list[Offered]:
        """One batch stored and acknowledged; the messages of the units it completed and of those
        taken over; leases renewed when due. While paused: nothing read, leases still renewed.

        ``timeout``: the longest wait for the first record, in seconds.
        """
        out: list[Offered] = []
        if not self._paused:
            read, claims = self.receiver.receive(timeout)
            self.stats.records += read
            for claim in [*claims, *self.member.due()]:
                out += self._open(claim)
        self._renew()
        return out

    def _open(self, claim: Claim) -> list[Offered]:
        opened = self.store.open(claim)
        if opened is None:
            return []  # lost since, or not decided yet (released: it waits for its segments)
        st = self.stats
        st.opened += 1
        n = str(len(opened.members))
        st.spread[n] = st.spread.get(n, 0) + 1
        if not opened.delivered:  # every message failed: its segments quarantined, nothing to hand on
            self._settle_unit(opened, claim)
            return []
        key = (claim.group_id, claim.unit)
        self._held[key] = _Held(opened, claim, len(opened.delivered))
        out = []
        for event in opened.delivered:
            self._unit_of[id(event)] = key
            out.append(Offered(event, key=event.group_id, positions=()))
        st.messages += len(out)
        self.member.stats.messages += _messages(out)
        return out

    def _renew(self) -> None:
        now = self.clock()
        if now < self._next_renewal:
            return
        self._next_renewal = now + self.renew_every
        for key, held in self._held.items():
            renewed = self.store.renew(held.claim)
            if renewed is None:
                self.stats.leases_lost += 1
                log.warning(
                    "the lease of %s unit %d was taken over by another member: it may be handled twice",
                    key[0].hex(),
                    key[1],
                )
                continue
            held.claim = renewed
            self.stats.renewals += 1

    def settled(self, work: Work, outcome: reassembly.dispatcher.Outcome) -> None:
        """DONE, or DEAD once the dead letter has it: the unit is settled in the store with its last message.

        ``work``: the message settled. ``outcome``: how (DONE or DEAD).
        """
        key = self._unit_of.pop(id(work.message), None)
        if key is None:
            return
        held = self._held[key]
        held.left -= 1
        if held.left == 0:
            del self._held[key]
            self._settle_unit(held.opened, held.claim)

    def _settle_unit(self, opened: Opened, claim: Claim) -> None:
        done = self.store.settle(opened)
        if done.settled:
            self.stats.settled += 1
        else:
            self.stats.settlements_lost += 1
            log.warning("%s unit %d was settled by another member (lease lost)", claim.group_id.hex(), claim.unit)

    def commit(self, dispatcher: Dispatcher, force: bool = False) -> None:
        """Nothing to commit: each record was acknowledged once the store kept it.

        ``dispatcher``, ``force``: as :class:`~reassembly.runtime.Source` gives them (unused here).
        """

    def held_bytes(self) -> int:
        """Incomplete messages are held in the store, not in this process."""
        return 0

    def revoked(self) -> list[Hashable]:
        """A share group moves no partitions between members: any member may read any record."""
        return []

    def close(self) -> None:
        """Give back the units still held (another member takes them over), leave the group, close the store."""
        try:
            for held in self._held.values():
                self.store.release(held.claim)
                self.stats.released += 1
            self._held.clear()
            self._unit_of.clear()
            self.receiver.close()
        finally:
            self.store.close()


ON_MESSAGE = _never
"""The ``on_message`` to build a receiver for a :class:`ShareDispatchSource` with (never called)."""


def _messages(out: Sequence[Offered]) -> int:
    return sum(len(o.message.messages) if isinstance(o.message, GroupComplete) else 1 for o in out)


__all__ = ["ON_MESSAGE", "ShareDispatchSource", "ShareSourceStats"]
