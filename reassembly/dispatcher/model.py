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


@dataclass(frozen=True)
class Work:
    """One message handed to one worker: what the worker needs, and what settles it."""

    ticket: int  # unique per offer, never reused: the handle that settles it
    group: Hashable  # the ordering key this message is serialized under
    message: object  # what was offered (MessageComplete | GroupComplete | anything)
    attempt: int  # 1 for the first hand-out; a hand-out taken back from a gone worker does not count
    size: int  # bytes counted against the budget
    positions: tuple[tuple[Hashable, int], ...]  # (partition, offset) of every segment it was built from


@dataclass(frozen=True)
class Settled:
    """The answer to a settle that changed the state."""

    ticket: int
    group: Hashable
    outcome: Outcome
    attempt: int  # the attempt that ended
    retry_at: float | None  # RETRY: not handed out again before this time (None: at once)
    group_free: bool  # the group has no message in flight any more: any worker may take it
    on_hold: bool  # DEAD with AfterDead.HOLD: the group waits for release()


@dataclass(frozen=True)
class Fenced:
    """The answer to a settle of a message whose partition was revoked while it was in flight.

    Nothing of the result counts: the partition's next owner reads the message again, so
    committing or recording it here would be a second, conflicting truth. The worker's hold on the
    group ends.
    """

    ticket: int
    group: Hashable
    outcome: Outcome  # what the worker answered, ignored


@dataclass(frozen=True)
class Revoked:
    """What a revocation took away from one partition."""

    partition: Hashable
    dropped: tuple[int, ...]  # queued (or retrying, or held) tickets forgotten: never handed out here
    fenced: tuple[int, ...]  # tickets in flight: their settle answers Fenced
    dropped_bytes: int  # the size of the dropped messages (no longer held)


@dataclass(frozen=True)
class GroupView:
    """One group as a message-group broker answers a query: who holds what."""

    group: Hashable
    queued: int  # messages waiting (retries and held ones included)
    owner: Hashable | None  # the worker that holds the group, or None when it is free
    acquired: int  # messages of it in flight
    oldest_offer: float | None  # the offer time of its oldest unsettled message
    on_hold: bool  # AfterDead.HOLD after a dead message: waits for release()


@dataclass(frozen=True)
class DispatchStats:
    """Counters and gauges for the metrics: what is held now and what happened so far."""

    held_messages: int  # unsettled: queued, retrying, on hold and in flight
    held_bytes: int
    queued: int  # waiting for a worker (retries and held ones included)
    in_flight: int  # handed out, not settled (fenced ones included)
    groups: int  # groups with something held, or on hold
    groups_owned: int  # groups a worker holds
    groups_on_hold: int  # groups waiting for release()
    offered: int  # counters from here on
    done: int
    dead: int
    retries: int
    returned: int  # hand-outs taken back from gone workers
    fenced: int  # settles answered Fenced
    dropped: int  # queued messages forgotten by revocations
