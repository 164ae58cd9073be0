"""The collector core: small messages gathered into one batch per destination (sans-I/O).

The reverse of segmentation (IBM's "aggregation and collection" worked example): messages
with a destination go in, :class:`BatchReady` events come out, each closed for one
:class:`Cause` under the destination's :class:`Rule` (looked up on every decision, so a rule
changed in the database applies to batches already open). The core holds no files, sockets or
clocks: time comes from the injected ``clock``, rules from the injected ``rules`` lookup, and
what to do with a batch (store it, write it, send it) is the caller's business; the durable
adapter is :mod:`reassembly.storage.durable`, the rule tables live in :mod:`reassembly.storage.collector`.

A batch travels as one MQ logical group (:func:`batch_segments`): member *i* is MsgSeqNumber
*i*, the last carries LAST_MSG_IN_GROUP, members that do not fit the pipe are segmented, and
the GroupId is derived from the batch id, so re-emitting a batch after a crash gives the same
group and a Unit-of-Work assembler delivers it whole or not at all.
"""

from __future__ import annotations

import hashlib
import math
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

from segmenter.errors import Reason, SegmentationError
from segmenter.producer import Segmenter
from segmenter.wire import GROUP_ID_LENGTH, MAX_SEQ_NUMBER, Segment


class Cause(str, Enum):
    """Why a batch was closed."""

    FULL = "full"  # max_messages reached, or the next message would pass max_bytes
    TIMEOUT = "timeout"  # the oldest member waited max_wait
    IDLE = "idle"  # no message was added for idle_timeout
    RECYCLED = "recycled"  # it holds messages left by an earlier collector for longer than stranded_after
    SHUTDOWN = "shutdown"  # flushed by close()
    FORCED = "forced"  # forced out now, one destination (force())


@dataclass(frozen=True)
class Rule:
    """How one destination is batched (a row of ``destination_rules``). Times in seconds.

    ``max_attempts`` is how many times the durable collector tries to write one of the
    destination's batches before it moves the batch to the dead letter (Camel's
    ``maximumRedeliveries`` with a dead-letter channel): one batch that can never be written must
    not hold its destination, or the collector, forever. ``idle_timeout`` (None: off) closes a
    batch to which no message was added for that long (Camel's ``completionTimeout``, restarted
    by every message), while ``max_wait`` bounds how long its oldest member waits whatever comes.
    """

    destination: str
    """The value of the messages' destination column this rule batches; ``*`` is the default rule."""
    target: str
    """Where the destination's batches go (``OUTPUT/<target>/`` for ``reassemble collect``)."""
    max_messages: int = 100
    """A batch is full at this many members (1 .. 999,999,999: MsgSeqNumber's range)."""
    max_bytes: int = 4 << 20
    """A batch is full at this many payload bytes."""
    max_wait: float = 60.0
    """An incomplete batch is closed (cause ``timeout``) this long after its oldest member arrived."""
    stranded_after: float = 300.0
    """A message an earlier collector left in the database is recycled once held this long."""
    enabled: bool = True
    """A disabled rule counts as missing: its messages are batched under the default rule."""
    max_attempts: int = 5
    """Times the durable collector tries to write one of the destination's batches before the batch
    goes to the dead letter."""
    idle_timeout: float | None = None
    """An incomplete batch is closed (cause ``idle``) once no message was added to it for this long
    (None: never for that reason)."""

    def __post_init__(self) -> None:
        limits = {
            "max_messages": self.max_messages,
            "max_bytes": self.max_bytes,
            "max_wait": self.max_wait,
            "stranded_after": self.stranded_after,
            "max_attempts": self.max_attempts,
            "idle_timeout": self.idle_timeout,
        }
        counts = (self.max_messages, self.max_bytes, self.max_attempts)
        times = (self.max_wait, self.stranded_after) + (() if self.idle_timeout is None else (self.idle_timeout,))
        if (
            not all(type(v) is int and 0 < v <= _MAX_COUNT for v in counts)  # no bool, no float, fits a BIGINT
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < math.inf for v in times)
            or self.max_messages > MAX_SEQ_NUMBER
            or type(self.enabled) is not bool
            or not isinstance(self.destination, str)
            or not isinstance(self.target, str)
        ):
            raise SegmentationError(
                f"rule for {self.destination!r}: limits must be positive (counts whole numbers up to 2**63-1, times"
                f" finite; idle_timeout may be None), max_messages at most {MAX_SEQ_NUMBER}, enabled true or false,"
                " names text",
                reason=Reason.RULE_ERROR,
                destination=self.destination,
                **limits,
            )


_MAX_COUNT = (1 << 63) - 1  # a database BIGINT

# The rule for a destination with no enabled row and no "*" row: one batch a minute or 100 messages.
DEFAULT_DESTINATION = "*"
DEFAULT_RULE = Rule(DEFAULT_DESTINATION, target="default")


class Held(NamedTuple):
    """One message held in an open batch. ``id`` is the caller's (the database row id)."""

    id: int
    payload: bytes
    """The message's bytes, as added."""
    received_at: float
    """When the message arrived, in the collector clock's seconds."""
    restored: bool = False
    """Handed over from the database (an earlier collector's), not received here."""


@dataclass(frozen=True)
class BatchReady:
    """A closed batch: emit ``messages`` (in this order) as one logical group under ``rule``."""

    destination: str
    """The destination the batch was gathered for."""
    batch_id: str
    """The batch's unique id (a UUID by default, from the collector's ``new_batch_id``)."""
    messages: tuple[Held, ...]
    cause: Cause
    """Why the batch closed: full, timed out, idle, recycled, shut down or forced."""
    rule: Rule

    @property
    def size(self) -> int:
        return sum(len(m.payload) for m in self.messages)


class _Open:
    __slots__ = ("bytes", "members", "newest", "oldest", "stranded_since")

    def __init__(self) -> None:
        self.members: list[Held] = []
        self.bytes = 0
        self.oldest = float("inf")
        self.newest = float("-inf")  # the latest member's arrival: idle_timeout counts from it
        self.stranded_since = float("inf")  # oldest restored member's arrival

    def add(self, held: Held) -> None:
        self.members.append(held)
        self.bytes += len(held.payload)
        self.oldest = min(self.oldest, held.received_at)
        self.newest = max(self.newest, held.received_at)
        if held.restored:
            self.stranded_since = min(self.stranded_since, held.received_at)


def _uuid_batch_id() -> str:
    return uuid.uuid4().hex


class Collector:
    """Open batches per destination; every message ends in exactly one :class:`BatchReady`.

    ``rules(destination)`` returns the rule in force (cached by the caller); ``clock()`` the
    time in seconds (wall time when received times are stored and compared across processes);
    ``new_batch_id()`` a unique id (a UUID by default).
    """

    def __init__(
        self,
        rules: Callable[[str], Rule],
        clock: Callable[[], float],
        new_batch_id: Callable[[], str] = _uuid_batch_id,
    ) -> None:
        self._rules = rules
        self._clock = clock
        self._new_id = new_batch_id
        self._open: dict[str, _Open] = {}

    def __len__(self) -> int:
        """Messages held in open batches."""
        return sum(len(b.members) for b in self._open.values())

    def held_ids(self, destination: str) -> set[int]:
        batch = self._open.get(destination)
        return {m.id for m in batch.members} if batch else set()

    def add(self, destination: str, msg_id: int, payload: bytes, received_at: float | None = None) -> list[BatchReady]:
        """Hold one message; return the batches this closes (a full one, before or after it).

        ``destination``: the destination whose rule batches the message. ``msg_id``: the message's id, unique per
        destination (the database row id, for one that stores them). ``payload``: the message's bytes. ``received_at``:
        when it arrived, in the collector clock's seconds (None: the clock's now).
        """
        held = Held(msg_id, payload, self._clock() if received_at is None else received_at)
        return self._hold(destination, held)

    def restore(self, destination: str, messages: Iterable[Held]) -> list[BatchReady]:
        """Take over messages an earlier collector stored but never batched (oldest first).

        They keep their received time: the next :meth:`tick` recycles them once they have been
        held longer than the rule's ``stranded_after``, or times them out as usual before that.

        ``destination``: the destination they were held for. ``messages``: the stored messages, with their ids and
        received times.
        """
        out: list[BatchReady] = []
        for m in messages:
            out += self._hold(destination, m._replace(restored=True))
        return out + self.tick()

    def _hold(self, destination: str, held: Held) -> list[BatchReady]:
        rule = self._rules(destination)
        out = []
        batch = self._open.get(destination)
        if batch is not None and batch.members and batch.bytes + len(held.payload) > rule.max_bytes:
            out += self._close(destination, Cause.FULL, rule)  # this message would pass max_bytes
            batch = None
        if batch is None:
            batch = self._open[destination] = _Open()
        batch.add(held)
        if len(batch.members) >= rule.max_messages or batch.bytes >= rule.max_bytes:
            out += self._close(destination, Cause.FULL, rule)
        return out

    def _close(self, destination: str, cause: Cause, rule: Rule) -> list[BatchReady]:
        """The open batch, as as many batches as ``rule``'s limits need: a rule lowered under an open
        batch must not let a timeout, a recycle or a shutdown emit one above them (oldest first; a
        message alone above ``max_bytes`` is a batch of one, as when it arrives)."""
        out: list[BatchReady] = []
        part: list[Held] = []
        size = 0
        for m in self._open.pop(destination).members:
            if part and (len(part) >= rule.max_messages or size + len(m.payload) > rule.max_bytes):
                out.append(BatchReady(destination, self._new_id(), tuple(part), cause, rule))
                part, size = [], 0
            part.append(m)
            size += len(m.payload)
        out.append(BatchReady(destination, self._new_id(), tuple(part), cause, rule))
        return out

    def tick(self) -> list[BatchReady]:
        """Close what the clock (or a changed rule) says is due: recycled, timed out, idle, or now full."""
        now = self._clock()
        out = []
        for destination in list(self._open):
            batch = self._open[destination]
            rule = self._rules(destination)
            if now - batch.stranded_since >= rule.stranded_after:
                out += self._close(destination, Cause.RECYCLED, rule)
            elif now - batch.oldest >= rule.max_wait:
                out += self._close(destination, Cause.TIMEOUT, rule)
            elif rule.idle_timeout is not None and now - batch.newest >= rule.idle_timeout:
                out += self._close(destination, Cause.IDLE, rule)
            elif len(batch.members) >= rule.max_messages or batch.bytes >= rule.max_bytes:
                out += self._split(destination, rule)  # the rule was lowered under an open batch
        return out

    def _split(self, destination: str, rule: Rule) -> list[BatchReady]:
        members = self._open.pop(destination).members
        out: list[BatchReady] = []
        for m in members:
            out += self._hold(destination, m)
        return out

    def next_deadline(self) -> float | None:
        """The earliest time a :meth:`tick` can close something under the current rules (None: nothing open)."""
        deadlines = []
        for destination, batch in self._open.items():
            rule = self._rules(destination)
            idle = math.inf if rule.idle_timeout is None else batch.newest + rule.idle_timeout
            deadlines.append(min(batch.oldest + rule.max_wait, batch.stranded_since + rule.stranded_after, idle))
        return min(deadlines, default=None)

    def drop(self, destination: str) -> list[Held]:
        """Forget a destination's open batch (its lease was lost: another collector owns those messages now).

        ``destination``: the destination whose open batch is forgotten.
        """
        batch = self._open.pop(destination, None)
        return batch.members if batch else []

    def force(self, destination: str) -> list[BatchReady]:
        """Close one destination's open batch now, whatever its rule says (Camel's
        ``forceCompletionOfGroup``): cause ``forced``, cut to the rule's limits; [] if none is open.

        ``destination``: the destination whose open batch is closed.
        """
        if destination not in self._open:
            return []
        return self._close(destination, Cause.FORCED, self._rules(destination))

    def close(self) -> list[BatchReady]:
        """End of input: every open batch, closed as ``shutdown``."""
        return [b for d in list(self._open) for b in self._close(d, Cause.SHUTDOWN, self._rules(d))]


def group_id_for(batch_id: str) -> bytes:
    """The batch's GroupId: derived, so a batch re-emitted after a crash is the same MQ group.

    ``batch_id``: the batch's id.
    """
    return hashlib.sha256(b"collector-batch:" + batch_id.encode()).digest()[:GROUP_ID_LENGTH]


def batch_segments(batch: BatchReady, segmenter: Segmenter) -> Iterator[Segment]:
    """The batch as one MQ logical group: MsgSeqNumber 1..n, LAST_MSG_IN_GROUP on the last.

    ``batch``: the closed batch. ``segmenter``: the settings the segments are made with.
    """
    return segmenter.segment_group((m.payload for m in batch.messages), group_id=group_id_for(batch.batch_id))
