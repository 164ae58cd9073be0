"""When to try a failed message again, and when to stop fetching: pure decisions, numbers in.

Both take what they need (the time, a random number, the amounts held) from the caller, so the
same inputs always give the same answer: the runners own the clock and the random generator, and
tests replay any sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

from segmenter.errors import Reason, SegmentationError


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter, up to ``max_attempts`` hand-outs of one message.

    The delay after the n-th failed attempt is ``min(cap, base * 2 ** (n - 1))``, shortened by up
    to ``jitter`` of itself at random: failures of many messages at once (a database restarting)
    come back spread out instead of in one wave. A message that failed ``max_attempts`` times is
    dead: a poison message must not hold its group, its partition's commit and a worker forever.
    """

    max_attempts: int = 5
    """Hand-outs of one message at most; after the last failure it is dead (dead-lettered)."""
    base: float = 0.5
    """Seconds of delay after the first failed attempt; each later one doubles it."""
    cap: float = 60.0
    """Seconds the delay never exceeds, however many attempts failed."""
    jitter: float = 0.5
    """The fraction (0 to 1) of each delay by which it is shortened at random."""

    def __post_init__(self) -> None:
        if not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise SegmentationError(
                f"max_attempts must be a whole number >= 1, not {self.max_attempts!r}", reason=Reason.ARGUMENT_ERROR
            )
        if not (self.base >= 0 and self.cap >= 0):
            raise SegmentationError(
                f"base and cap must be >= 0, not {self.base!r} and {self.cap!r}", reason=Reason.ARGUMENT_ERROR
            )
        if not 0 <= self.jitter <= 1:
            raise SegmentationError(f"jitter must be within [0, 1], not {self.jitter!r}", reason=Reason.ARGUMENT_ERROR)

    def delay(self, attempt: int, rnd: float) -> float:
        """The wait after failed attempt ``attempt`` (1 for the first), ``rnd`` in [0, 1)."""
        # 2 ** n overflows a float past n = 1023: the cap is reached long before
        raw = self.cap if attempt > 64 else min(self.cap, self.base * 2.0 ** max(0, attempt - 1))
        return raw * (1.0 - self.jitter * min(max(rnd, 0.0), 1.0))

    def decide(self, attempt: int, now: float, rnd: float) -> float | None:
        """The time to hand the message out again after failed attempt ``attempt``, or ``None``:
        it is dead (``attempt >= max_attempts``). ``rnd`` in [0, 1) comes from the caller (the
        runtime's ``random.random``), so the decision is reproducible.

        ``now``: the current time, in the runner clock's seconds.
        """
        if attempt >= self.max_attempts:
            return None
        return now + self.delay(attempt, rnd)


class Budget:
    """One limit on everything a consumer holds, in messages and in bytes, with hysteresis.

    Over the high-water mark (either limit reached) fetching pauses; it resumes only when both
    amounts are under ``low_water`` of their limits. The gap between the two marks keeps a
    consumer near its limit from pausing and resuming on every message (each a broker round trip).
    The caller counts what it holds (segments in assembly, messages queued and in flight) and
    calls :meth:`update` after every change; the answer is what to do, ``None`` for nothing.

    A pause needs something that can end it: with no message held, nothing will be settled, and
    the bytes held are segments of messages still in assembly that only more fetching can complete
    (or the assembler's own limits expire). So with no message held the budget never pauses and a
    paused budget resumes, whatever the bytes: a budget smaller than the messages in assembly
    cannot stall the consumer for good.

    ``max_messages``: the most whole messages held (queued and in flight). ``max_bytes``: the most bytes held (segments
    in assembly and messages). ``low_water``: the fraction of both limits to fall under before fetching resumes.
    """

    __slots__ = ("low_water", "max_bytes", "max_messages", "paused")

    def __init__(self, max_messages: int, max_bytes: int, low_water: float = 0.5) -> None:
        if max_messages < 1 or max_bytes < 1:
            raise SegmentationError(
                f"a budget needs max_messages and max_bytes >= 1, not {max_messages!r} and {max_bytes!r}",
                reason=Reason.ARGUMENT_ERROR,
            )
        if not 0 < low_water <= 1:
            raise SegmentationError(f"low_water must be within (0, 1], not {low_water!r}", reason=Reason.ARGUMENT_ERROR)
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.low_water = low_water
        self.paused = False

    def over(self, messages: int, bytes_: int) -> bool:
        """At or over the high-water mark: either limit reached, with a message held.

        ``messages``, ``bytes_``: what the consumer holds now, in messages and in bytes.
        """
        return messages > 0 and (messages >= self.max_messages or bytes_ >= self.max_bytes)

    def under(self, messages: int, bytes_: int) -> bool:
        """Under the low-water mark: both amounts below ``low_water`` of their limits, or no
        message held.

        ``messages``, ``bytes_``: what the consumer holds now, in messages and in bytes.
        """
        return messages == 0 or (
            messages < self.low_water * self.max_messages and bytes_ < self.low_water * self.max_bytes
        )

    def update(self, messages: int, bytes_: int) -> bool | None:
        """``True``: pause fetching; ``False``: resume; ``None``: leave it as it is (repeated calls
        on one side of the marks, or between them).

        ``messages``, ``bytes_``: what the consumer holds after the change, in messages and in bytes.
        """
        if not self.paused and self.over(messages, bytes_):
            self.paused = True
            return True
        if self.paused and self.under(messages, bytes_):
            self.paused = False
            return False
        return None

    def __repr__(self) -> str:
        state = "paused" if self.paused else "running"
        return f"Budget({self.max_messages} messages, {self.max_bytes} bytes, low_water={self.low_water}, {state})"
