"""What the runners' control loop meets: the source it reads, the carrier that moves work to
workers, the dead letter it writes, the handler's failure as it comes back, and its summary.

The control loop (:mod:`reassembly.runtime.base`) is written once for threads, asyncio tasks and
processes; the parts around it differ by runner and by broker. Their shapes are written here,
apart from the loop, so that a source (:mod:`reassembly.brokers`), a carrier
(:mod:`reassembly.runtime.threads`, ``aio``, ``processes``) or a dead letter
(:mod:`reassembly.runtime.deadletter`) is written against them without the loop's workings.
The names are importable from :mod:`reassembly.runtime.base` too.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import reassembly.dispatcher
from reassembly.dispatcher import Dispatcher, Work

Handler = Callable[[Any], object]
"""A plain function taking the delivered message (``MessageComplete``, or ``GroupComplete`` in
unit-of-work mode); raising means failure; its return value is ignored."""


@dataclass(frozen=True)
class Offered:
    """A whole message as a source hands it over, ready for :meth:`Dispatcher.offer`.

    ``key``: the ordering key (``Ordering.KEY``); ``size``: bytes counted against the budget
    (default: the payload's length); ``positions``: ``(partition, offset)`` of every segment it was
    built from (default: the message's own ``positions``).
    """

    message: object
    """The message to offer: what the handlers receive (a ``MessageComplete``, ``GroupComplete`` or anything)."""
    key: Hashable | None = None
    size: int | None = None
    positions: tuple[tuple[Hashable, int], ...] | None = None


class Source(Protocol):
    """What a runner reads from. Only the runner's control loop calls it (one thread)."""

    def fetch(self, timeout: float) -> Sequence[Offered]:
        """Whole messages, waiting up to ``timeout`` seconds for the first (0: what is there)."""
        ...

    def settled(self, work: Work, outcome: reassembly.dispatcher.Outcome) -> None:
        """The message is settled DONE or DEAD: settle the source's side (broker accept/reject).

        ``work``: the message settled. ``outcome``: how (DONE or DEAD).
        """
        ...

    def commit(self, dispatcher: Dispatcher, force: bool = False) -> None:
        """Commit what may be committed (Kafka: ``dispatcher.commit_offset`` per partition).

        ``dispatcher``: the runner's dispatcher, which knows what is settled. ``force``: True for the runner's last
        commit, as it stops.
        """
        ...

    def pause(self) -> None:
        """Stop fetching (back-pressure); ``fetch`` keeps being called to serve the client."""
        ...

    def resume(self) -> None:
        """Fetch again."""
        ...

    def held_bytes(self) -> int:
        """Bytes of segments held in assembly (``assembler.buffered_bytes()``)."""
        ...

    def revoked(self) -> list[Hashable]:
        """Partitions revoked since the last call."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Failure:
    """Why a handler failed, as it crosses from a worker (a process) to the loop: picklable."""

    kind: str
    """The exception's type name."""
    text: str
    """``str(exception)``, its first 2,000 characters."""

    @classmethod
    def of(cls, exc: BaseException) -> Failure:
        """The failure ``exc`` describes: its type's name and its text."""
        return cls(type(exc).__qualname__, str(exc)[:2000])

    def __str__(self) -> str:
        return f"{self.kind}: {self.text}" if self.text else self.kind


@dataclass(frozen=True)
class DeadRecord:
    """A message given up on: what a :class:`DeadLetter` keeps."""

    work: Work
    """The message given up on, as it was handed out (ticket, group, message, positions)."""
    failure: Failure
    """Why its last attempt failed."""
    attempts: int
    """How many attempts were made (the last one included)."""


class DeadLetter(Protocol):
    """Where messages go after their last failed attempt. ``write`` returns only once they are
    durable (the loop settles them DEAD, and so lets the commit pass them, after it returned);
    raising keeps them unsettled and the loop tries again."""

    def write(self, records: Sequence[DeadRecord]) -> None: ...

    def close(self) -> None: ...


@dataclass
class RunSummary:
    """What one :meth:`Runner.run` did."""

    offered: int = 0
    """Messages the source offered to the dispatcher."""
    done: int = 0
    """Messages handled and settled DONE."""
    dead: int = 0
    """Messages given up on after their last attempt (written to the dead letter when one is configured)."""
    retries: int = 0
    """Failed attempts to be made again."""
    fenced: int = 0
    """Settles ignored because the message's partition was revoked while it was in flight."""
    revoked_partitions: int = 0
    """Partitions the source gave up (a rebalance)."""
    dropped_by_revoke: int = 0
    """Queued messages of revoked partitions (their next owner reads them)."""
    commits: int = 0
    """Commits asked of the source (each may commit nothing new)."""
    pauses: int = 0
    """Times fetching was paused because the budget was full."""
    resumes: int = 0
    """Times fetching resumed once the budget had room."""
    workers_lost: int = 0
    """Workers that died: the message each was running counts as a failed attempt, the others it held come back."""
    unfinished: int = 0
    """Still in flight at the drain deadline: unsettled, handled again after a restart."""
    unwritten_dead: int = 0
    """Dead without a dead letter configured: logged at ERROR, one line each."""
    peak_held_bytes: int = 0
    """The most bytes held at once: the dispatcher's messages and the source's segments in assembly."""
    peak_held_messages: int = 0
    """The most messages held at once by the dispatcher."""
    seconds: float = 0.0
    """Seconds the run took, by the runner's clock."""
    drained: bool = True
    """Every message in flight finished before the drain deadline."""


Result = tuple[int, Failure | None]  # (ticket, None for success)


class Carrier(Protocol):
    """How work reaches workers and results come back; the loop calls it from its own thread."""

    def start(self, workers: int, results: queue.SimpleQueue[Any]) -> None:
        """Start the workers; each posts ``(worker, list[Result], seconds spent in the handler)``
        on ``results`` after each batch."""
        ...

    def hand(self, worker: int, batch: list[Work]) -> None:
        """Give ``worker`` these messages to handle in order."""
        ...

    def gone(self) -> list[tuple[int, int | None]]:
        """Workers that died since the last call, each with the ticket it was running (or None);
        each is replaced by a fresh worker with the same number."""
        ...

    def shutdown(self, timeout: float) -> None:
        """Stop the workers, waiting up to ``timeout`` seconds (they are idle, or what they still
        run no longer matters: the drain gave up on it)."""
        ...
