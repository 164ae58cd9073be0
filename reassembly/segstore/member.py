"""One competing consumer's side of the shared store: records in, settlements decided, claims delivered.

Every adapter (a Kafka share group, a queue read without message groups, an SQS-like
receive/delete loop) does the same three things, in this order:

1. :meth:`StoreMember.write` a batch of record bodies; it returns, per record, whether to
   acknowledge it (``accept``: stored, a duplicate, or quarantined with its bytes in the store) —
   every one of them is durable in the store by then, so acknowledging cannot lose a byte;
2. acknowledge the records (the adapter's own call);
3. :meth:`StoreMember.deliver` the claims the write made, and :meth:`StoreMember.tick` now and
   then, which takes over units whose claimant died (its lease ran out) and delivers them.

A record the adapter should refuse outright (at its delivery limit) goes through
:meth:`StoreMember.quarantine` first and is rejected after.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from reassembly.segstore.core import Write
from reassembly.segstore.records import Claim, OnMessage, Written
from reassembly.segstore.store import SegmentStore
from segmenter.errors import Reason

log = logging.getLogger(__name__)


@dataclass
class MemberStats:
    """What one member did since it started (the store's own counters cover every member)."""

    received: int = 0
    """Records this member wrote to the store or quarantined, each counted once."""
    stored: int = 0
    """New segments (variants included)."""
    duplicates: int = 0
    """Identical copies of segments held or used, counted and not stored."""
    quarantined: int = 0
    """Refused segments and records at their delivery limit, bytes kept in the store."""
    claims: int = 0
    """Units this member claimed by completing them."""
    taken_over: int = 0
    """Units claimed by tick(): unclaimed, or a dead claimant's lease ran out."""
    messages: int = 0
    """Messages handed to ``on_message``."""
    handler_failures: int = 0
    """Deliveries in which ``on_message`` raised (the exception goes on to the caller)."""
    by_reason: dict[int, int] = field(default_factory=dict)
    """Quarantined segments and records by reason code (``int(Reason)`` -> count)."""

    def as_dict(self) -> dict[str, object]:
        return {
            "received": self.received,
            "stored": self.stored,
            "duplicates": self.duplicates,
            "quarantined": self.quarantined,
            "claims": self.claims,
            "taken_over": self.taken_over,
            "messages": self.messages,
            "handler_failures": self.handler_failures,
            "by_reason": {str(k): v for k, v in sorted(self.by_reason.items())},
        }


class StoreMember:
    """Writes records into a :class:`SegmentStore` and delivers the units it claims to ``on_message``.

    ``on_message`` gets each message (or Unit-of-Work group) once this member holds its claim; it
    returns once the message is safe. If it raises, the claim's lease is released (any member
    retries) and the exception propagates to the adapter's loop. ``take_over_every`` seconds (on
    ``clock``), :meth:`tick` looks for units to take over.

    ``store``: the segment store written to and delivered from.
    """

    def __init__(
        self,
        store: SegmentStore,
        on_message: OnMessage,
        *,
        take_over_every: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.on_message = on_message
        self.take_over_every = take_over_every
        self.clock = clock
        self.stats = MemberStats()
        self._next_look = clock()

    def write(self, bodies: Sequence[bytes | memoryview]) -> tuple[list[Written], list[Claim]]:
        """Store a batch of record bodies (one transaction). Every record may be acknowledged when
        this returns: each is stored, a duplicate, or quarantined in the store with its bytes.

        ``bodies``: the records' bodies, each an encoded segment.
        """
        if not bodies:
            return [], []
        written, claims = self.store.write(bodies)
        s = self.stats
        s.received += len(bodies)
        for w in written:
            if w.outcome is Write.DUPLICATE:
                s.duplicates += 1
            elif w.outcome is Write.QUARANTINED:
                s.quarantined += 1
                if w.reason is not None:
                    s.by_reason[int(w.reason)] = s.by_reason.get(int(w.reason), 0) + 1
            else:
                s.stored += 1
        s.claims += len(claims)
        return written, claims

    def quarantine(self, body: bytes | memoryview, reason: Reason, detail: str) -> None:
        """Keep a record's bytes in the store's quarantine (committed on return): reject it after.

        ``body``: the record's bytes, kept as they came. ``reason``: why it is kept aside. ``detail``: what happened, in
        words.
        """
        self.store.quarantine(body, reason, detail)
        self.stats.received += 1
        self.stats.quarantined += 1
        self.stats.by_reason[int(reason)] = self.stats.by_reason.get(int(reason), 0) + 1

    def deliver(self, claims: Sequence[Claim]) -> int:
        """Deliver claimed units (assembled from the store, handed on, settled); messages handed on.

        ``claims``: the units this member claimed.
        """
        handed = 0
        for claim in claims:
            try:
                done = self.store.deliver(claim, self.on_message)
            except Exception:
                self.stats.handler_failures += 1
                raise
            handed += done.delivered
        self.stats.messages += handed
        return handed

    def tick(self, *, force: bool = False) -> int:
        """Take over what is due (every ``take_over_every`` seconds, or now with ``force``) and deliver it."""
        return self.deliver(self.due(force=force))

    def due(self, *, force: bool = False) -> list[Claim]:
        """Claim what is due for a take-over (every ``take_over_every`` seconds, or now with
        ``force``) without delivering it: for a caller that hands messages on and settles later."""
        now = self.clock()
        if not force and now < self._next_look:
            return []
        self._next_look = now + self.take_over_every
        claims = self.store.take_over()
        if claims:
            log.info("taking over %d unit(s) from the store", len(claims))
        self.stats.taken_over += len(claims)
        return claims


class MemberReceiver(ABC):
    """The loop every store-fed receiver runs around its own fetch: :meth:`receive` (the adapter's:
    fetch, :meth:`StoreMember.write`, acknowledge), then deliver what it completed and take over
    what is due. One loop, so that an adapter writes only how it fetches and acknowledges."""

    member: StoreMember

    @abstractmethod
    def receive(self, timeout: float = 1.0) -> tuple[int, list[Claim]]:
        """One fetch written and acknowledged, nothing delivered: (records read, the units it completed).

        ``timeout``: the longest wait for the first record, in seconds.
        """

    @property
    def stats(self) -> MemberStats:
        return self.member.stats

    def poll(self, timeout: float = 1.0) -> int:
        """One fetch: write, acknowledge, deliver what it completed, take over what is due. Records read.

        ``timeout``: the longest wait for the first record, in seconds.
        """
        read, claims = self.receive(timeout)
        self.member.deliver(claims)
        self.member.tick()
        return read

    def run(self, stop: Callable[[], bool], *, timeout: float = 0.5) -> MemberStats:
        """Poll until ``stop()`` is true (checked between fetches).

        ``stop``: asked between fetches; True ends the loop. ``timeout``: each fetch's longest wait, in seconds.
        """
        while not stop():
            self.poll(timeout)
        return self.stats
