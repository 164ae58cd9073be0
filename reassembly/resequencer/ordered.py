"""MQ logical groups delivered message by message, in MsgSeqNumber order, as soon as the order allows.

The alternative to Unit-of-Work (all-or-nothing) delivery: an
:class:`~reassembly.assembler.core.Assembler` with ``unit_of_work=False`` hands
over each message of a group the moment it is whole and verified, in
whatever order that happens; a :class:`~reassembly.resequencer.core.Resequencer`
keyed by GroupId (literal start 1, MQ's first MsgSeqNumber; end: the message
flagged LAST_MSG_IN_GROUP) passes them on in order. Message 1 is delivered
while message 2 is still arriving; message 3, complete first, waits for 2.

What comes out of :meth:`OrderedGroups.receive` / ``tick`` / ``close``:

- ``Released(item=MessageComplete)`` (Out) / ``Expired(item=MessageComplete)``
  (after a skipped gap) / ``Missing`` / ``Failed``: the resequencer's events,
  the item being the assembler's :class:`~reassembly.assembler.events.MessageComplete`.
- a ``MessageComplete`` not in a group: passed through at once (nothing to order).
- every other assembler event (``Rejected``, ``Duplicate``, ``Unfinished``,
  ``GroupFailed``...) passed through. A group the assembler gives up on
  (``Unfinished``: expired, evicted, input ended; ``GroupFailed``: a message
  of it failed verification, after which the assembler takes no more of it)
  brings no more messages: its resequencer group is closed at once (what it
  held goes to Expire after a ``Skipped``, then ``GroupClosed(cause=closed)``).

:meth:`OrderedGroups.snapshot` / :meth:`OrderedGroups.restore` keep both
parts (:mod:`reassembly.resequencer.ordered_snapshot`): the segments of messages not yet
whole, the whole messages waiting for an earlier one, what each group has
delivered and how far its order has got. Restoring at any point and going on
gives exactly the events of going on without the restart.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from reassembly.assembler.bodies import BodyStore
from reassembly.assembler.core import Assembler
from reassembly.assembler.events import Event as AssemblerEvent
from reassembly.assembler.events import GroupFailed, MessageComplete, Unfinished
from reassembly.assembler.model import Limits
from reassembly.resequencer import ordered_snapshot as codec
from reassembly.resequencer.core import Resequencer
from reassembly.resequencer.model import EndWhen, Event, ResequenceLimits, ResequenceOptions, StartAt
from segmenter.flags import in_group, is_last_in_group
from segmenter.wire import Buffer, Segment


def _last_in_group(seq: int, item: Any) -> bool:
    return is_last_in_group(item.msg_flags)  # type: ignore[no-any-return]


class OrderedGroups:
    """Segments in, the messages of each MQ group out in MsgSeqNumber order as they complete.

    ``missing_timeout`` (clock units): how long a complete message waits for an
    earlier one before the gap is skipped (then it and the rest of its group go
    to Expire). ``keep_closed``: how long a finished group id is remembered (a
    group id reused later is a new instance).

    ``limits``: the assembler's bounds (None: the defaults of :class:`Limits`). ``clock``: the time source of both
    timeouts, in the units they are given in. ``resequence_limits``: the resequencer's bounds on what waits (None: the
    defaults of :class:`ResequenceLimits`). ``bodies``: where the assembler keeps the bodies of large messages (None: in
    memory).
    """

    def __init__(
        self,
        limits: Limits | None = None,
        *,
        clock: Callable[[], float],
        missing_timeout: float | None = 60.0,
        keep_closed: float | None = 3600.0,
        resequence_limits: ResequenceLimits | None = None,
        bodies: BodyStore | None = None,
    ) -> None:
        self._clock = clock
        self.assembler = Assembler(limits, clock=clock, unit_of_work=False, bodies=bodies)
        options = ResequenceOptions(
            start=StartAt(1),
            end=EndWhen(_last_in_group),
            missing_timeout=missing_timeout,
            keep_closed=keep_closed,
            limits=resequence_limits or ResequenceLimits(),
        )
        self.resequencer = Resequencer(options, clock=clock)

    def receive(self, item: Buffer | Segment) -> list[AssemblerEvent | Event]:
        """One segment in; what can be delivered now out.

        ``item``: one segment, its encoded bytes or a decoded :class:`Segment`.
        """
        return self._route(self.assembler.receive(item))

    def tick(self) -> list[AssemblerEvent | Event]:
        """Let time act: the assembler's expiry, then the resequencer's timeouts."""
        return self._route(self.assembler.expire()) + self.resequencer.tick()

    def close(self) -> list[AssemblerEvent | Event]:
        """End of input: what is open in either part comes out."""
        return self._route(self.assembler.close()) + self.resequencer.close()

    def snapshot(self) -> bytes:
        """Both parts' state as bytes. Deadlines and ages are clock values: use a wall clock if a
        snapshot must outlive the process."""
        return codec.encode(self.assembler.snapshot(), self.resequencer.snapshot(codec.encode_complete))

    @classmethod
    def restore(cls, blob: bytes, *args: Any, **kwargs: Any) -> OrderedGroups:
        """An instance in the state :meth:`snapshot` saved. ``args``/``kwargs`` are the constructor's (the
        limits, clock, timeouts and body store: configuration, not state, so given again). A malformed
        snapshot is a STATE_ERROR.

        ``blob``: the bytes :meth:`snapshot` returned.
        """
        assembler, resequencer = codec.decode(blob)
        og = cls(*args, **kwargs)
        asm, options, clock = og.assembler, og.resequencer.options, og._clock
        og.assembler = Assembler.restore(assembler, asm.limits, clock=clock, unit_of_work=False, bodies=asm.bodies)
        og.resequencer = Resequencer.restore(resequencer, options, clock=clock, decode=codec.decode_complete)
        return og

    def _route(self, events: list[AssemblerEvent]) -> list[AssemblerEvent | Event]:
        out: list[AssemblerEvent | Event] = []
        for ev in events:
            if isinstance(ev, MessageComplete) and in_group(ev.msg_flags):
                out += self.resequencer.offer(ev.group_id, ev.msg_seq_number, ev, size=ev.stored_length)
            elif isinstance(ev, (Unfinished, GroupFailed)):
                out.append(ev)
                out += self.resequencer.close(ev.group_id)
            else:
                out.append(ev)
        return out


__all__ = ["OrderedGroups"]
