"""What the dispatcher is told and what it answers: enums and immutable records.

The records are frozen so that a runner can hand a :class:`Work` to another thread or process and
keep its own copy for settling: nobody can change what was handed out.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from enum import Enum


class Ordering(str, Enum):
    """What a message is serialized under: the key that decides which messages go one at a time.

    A group's messages are handed out in order and to one worker at a time; different groups run
    in parallel. The finer the key, the more parallelism and the less order.
    """

    GROUP = "group"  # an MQ logical group's messages in msg_seq_number order; other messages alone
    KEY = "key"  # a key the caller gives at offer() (a Kafka record key, a header); no key: alone
    PARTITION = "partition"  # the partition of the message's first segment (the plain consumer's order)
    UNORDERED = "unordered"  # every message its own group


class Outcome(str, Enum):
    """How a handed-out message ended: the three answers a message-group broker takes."""

    DONE = "done"  # handled: settled, its offsets may be committed
    RETRY = "retry"  # failed, try again (at a time the caller decides): back at the head of its group
    DEAD = "dead"  # given up (written to a dead letter): settled, its offsets may be committed


class AfterDead(str, Enum):
    """What a group does after one of its messages went dead.

    The choice is the application's: a group of independent messages goes on; a group whose later
    messages make no sense without the dead one (a ledger, a file in parts) waits for an operator.
    """

    CONTINUE = "continue"  # the group's next message goes on
    HOLD = "hold"  # the group's later messages wait for Dispatcher.release(group)


@dataclass(frozen=True)
class Alone:
    """The group of a message that keeps no order with any other: unique per offer.

    A key of its own (not the message's group id) so that it never collides with a caller's key.
    """

    ticket: int
    """The ticket of the message this key is for: unique, so no other message shares the key."""


@dataclass(frozen=True)
class Work:
    """One message handed to one worker: what the worker needs, and what settles it."""

    ticket: int
    """Unique per offer, never reused: the handle that settles it."""
    group: Hashable
    """The ordering key this message is serialized under."""
    message: object
    """What was offered (MessageComplete | GroupComplete | anything)."""
    attempt: int
    """1 for the first hand-out; a hand-out taken back from a gone worker does not count."""
    size: int
    """Bytes counted against the budget."""
    positions: tuple[tuple[Hashable, int], ...]
    """(partition, offset) of every segment it was built from."""


@dataclass(frozen=True)
class Settled:
    """The answer to a settle that changed the state."""

    ticket: int
    """The ticket of the message settled."""
    group: Hashable
    """The group the message was serialized under."""
    outcome: Outcome
    """How it was settled: done, retry or dead."""
    attempt: int
    """The attempt that ended."""
    retry_at: float | None
    """RETRY: not handed out again before this time (None: at once)."""
    group_free: bool
    """The group has no message in flight any more: any worker may take it."""
    on_hold: bool
    """DEAD with AfterDead.HOLD: the group waits for release()."""


@dataclass(frozen=True)
class Fenced:
    """The answer to a settle of a message whose partition was revoked while it was in flight.

    Nothing of the result counts: the partition's next owner reads the message again, so
    committing or recording it here would be a second, conflicting truth. The worker's hold on the
    group ends.
    """

    ticket: int
    """The ticket of the message whose settle was fenced."""
    group: Hashable
    """The group the message was serialized under."""
    outcome: Outcome
    """What the worker answered, ignored."""


@dataclass(frozen=True)
class Revoked:
    """What a revocation took away from one partition."""

    partition: Hashable
    """The partition that was revoked."""
    dropped: tuple[int, ...]
    """Queued (or retrying, or held) tickets forgotten: never handed out here."""
    fenced: tuple[int, ...]
    """Tickets in flight: their settle answers Fenced."""
    dropped_bytes: int
    """The size of the dropped messages (no longer held)."""


@dataclass(frozen=True)
class GroupView:
    """One group as a message-group broker answers a query: who holds what."""

    group: Hashable
    """The group's ordering key."""
    queued: int
    """Messages waiting (retries and held ones included)."""
    owner: Hashable | None
    """The worker that holds the group, or None when it is free."""
    acquired: int
    """Messages of it in flight."""
    oldest_offer: float | None
    """The offer time of its oldest unsettled message."""
    on_hold: bool
    """AfterDead.HOLD after a dead message: waits for release()."""


@dataclass(frozen=True)
class DispatchStats:
    """Counters and gauges for the metrics: what is held now and what happened so far."""

    held_messages: int
    """Unsettled: queued, retrying, on hold and in flight."""
    held_bytes: int
    """Bytes held: the sizes of the held messages, as offered."""
    queued: int
    """Waiting for a worker (retries and held ones included)."""
    in_flight: int
    """Handed out, not settled (fenced ones included)."""
    groups: int
    """Groups with something held, or on hold."""
    groups_owned: int
    """Groups a worker holds."""
    groups_on_hold: int
    """Groups waiting for release()."""
    offered: int
    """Messages offered so far (this and the counters below count from the start)."""
    done: int
    """Messages settled DONE (handled)."""
    dead: int
    """Messages settled DEAD (given up on)."""
    retries: int
    """Settles answered RETRY: attempts that will be made again."""
    returned: int
    """Hand-outs taken back from gone workers."""
    fenced: int
    """Settles answered :class:`Fenced`: their partition was revoked while they were in flight."""
    dropped: int
    """Queued messages forgotten by revocations."""
