"""A broker receiver: deliveries feed an :class:`Assembler`; a segment is acknowledged only once
the message (or Unit-of-Work group) it belongs to was handed to the application and it returned.

The transport (AMQP or STOMP, :mod:`segmenter.brokers`) is behind a small interface; this
module decides what happens to every delivery, one of exactly four outcomes:

* **used**: part of a delivered message: accepted after the application's handler returned. If
  the process dies before that, the broker redelivers the segments (to another consumer, which
  reassembles the message again): at-least-once, so the application's sink must be idempotent
  on (GroupId, MsgSeqNumber), which every delivered message carries.
* **duplicate**: an identical copy of a held segment or of a segment of a message this receiver
  already delivered (a redelivery, a producer retry): accepted and counted.
* **rejected**: a bad segment, a failed message, or the held segments of a group that expired or
  was evicted: handed to ``on_quarantine`` and then *rejected*, which ActiveMQ turns into a move to
  ``ActiveMQ.DLQ`` (durable messages; the sender sends durable). Over AMQP the rejection carries
  ``segmenter:<reason code>`` and the error text. Held segments are rejected rather than released
  on expiry or eviction because ActiveMQ hands a released message straight back to the same
  consumer (the group's owner): releasing would loop on a group whose missing segments are not
  coming, while the DLQ keeps every byte (group id included) for inspection or replay.
* **held**: part of an incomplete message when the receiver stops: never settled; the broker
  redelivers it when the connection closes.

The accounting identity ``received == used + duplicates + rejected + held`` holds at every
moment (:attr:`ReceiverStats.holds`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from reassembly.assembler.core import Assembler
from reassembly.assembler.events import (
    Duplicate,
    Event,
    GroupComplete,
    GroupFailed,
    MessageComplete,
    MessageFailed,
    Rejected,
    Unfinished,
)
from segmenter.brokers import Consumer, Delivery, body_view
from segmenter.buffers import same_bytes
from segmenter.errors import Reason
from segmenter.wire import SegmentHeader

Delivered = MessageComplete | GroupComplete
Quarantined = Rejected | MessageFailed | GroupFailed | Unfinished


@dataclass
class ReceiverStats:
    """What happened to every delivery so far."""

    received: int = 0
    """Deliveries taken from the broker, each counted once whatever happened to it."""
    redelivered: int = 0
    """Deliveries the broker marked as redelivered."""
    used: int = 0
    """Accepted: segments of messages handed to the application."""
    duplicates: int = 0
    """Accepted deliveries that were identical copies of segments already held."""
    rejected: int = 0
    """Rejected (dead-lettered), with a reason."""
    messages: int = 0
    """Messages handed to the application."""
    by_reason: dict[int, int] = field(default_factory=dict)
    """Rejected deliveries by reason code (``int(Reason)`` -> count)."""

    def held(self) -> int:
        return self.received - self.used - self.duplicates - self.rejected

    def as_dict(self) -> dict[str, object]:
        return {
            "received": self.received,
            "redelivered": self.redelivered,
            "used": self.used,
            "duplicates": self.duplicates,
            "rejected": self.rejected,
            "held": self.held(),
            "messages": self.messages,
            "by_reason": {str(k): v for k, v in sorted(self.by_reason.items())},
        }


class _Held(NamedTuple):
    """An unsettled delivery, filed under its GroupId."""

    seq: int
    body: bytes | memoryview
    delivery: Delivery


_tuple_new = tuple.__new__  # builds a _Held without calling its (Python) __new__: one per delivery


class BrokerReceiver:
    """Feeds one :class:`Consumer` into one :class:`Assembler` and settles every delivery.

    ``handler`` receives each :class:`MessageComplete` (or :class:`GroupComplete` in
    Unit-of-Work mode) and must return only once the message is safe (written, committed): its
    segments are acknowledged right after. Give it an ``Assembler(join=False)`` (as the README's
    example does) and a message of several uncompressed segments arrives as a
    :class:`~reassembly.assembler.events.ScatteredPayload` of views of the deliveries (write its parts as they
    are, or ``bytes()`` it), not joined into a new buffer that the application then copies again:
    a broker receive's largest single cost. The segments are read with
    :func:`~segmenter.brokers.body_view` (no copy of a STOMP body).
    If ``handler`` raises, nothing of the message is acknowledged and the exception propagates
    (stop, reconnect: the broker redelivers). ``on_quarantine`` sees every event whose segments
    are about to be dead-lettered. With ``defer=True`` a message's deliveries are not accepted when
    ``handler`` returns but when :meth:`settle_message` is called (the group dispatcher's source,
    :mod:`reassembly.brokers.receiver_dispatch`, settles once a worker handled the message).

    ``consumer``: the queue's consumer (from :func:`segmenter.brokers.open_consumer`). ``assembler``: the assembler the
    segments go through (None: a new one with the default limits).
    """

    def __init__(
        self,
        consumer: Consumer,
        handler: Callable[[Delivered], None],
        assembler: Assembler | None = None,
        *,
        on_quarantine: Callable[[Quarantined], None] | None = None,
        defer: bool = False,
    ) -> None:
        self.consumer = consumer
        self.defer = defer
        self.handler = handler
        self.assembler = assembler if assembler is not None else Assembler()
        self.on_quarantine = on_quarantine
        self.stats = ReceiverStats()
        self._held: dict[bytes, list[_Held]] = {}  # unsettled deliveries by GroupId
        # defer=True: the deliveries of messages handed out, until settle_message (by GroupId, MsgSeqNumber
        # or None for a Unit-of-Work group); apart from _held, so a later failure of the group leaves them be
        self._deferred: dict[tuple[bytes, int | None], list[_Held]] = {}
        self._unheld: Delivery | None = None  # the delivery being received, until it is held
        self._view: bytes | memoryview = b""  # its body

    def poll(self, timeout: float = 1.0) -> int:
        """Fetch what arrived (waiting up to ``timeout`` s), process it, expire old groups; returns
        the number of deliveries processed."""
        deliveries = self.consumer.fetch(timeout)
        for d in deliveries:
            self._one(d)
        self._settle(self.assembler.expire())
        return len(deliveries)

    def run(self, stop: Callable[[], bool], *, timeout: float = 0.2) -> ReceiverStats:
        """Poll until ``stop()`` is true (checked between fetches).

        ``stop``: asked between fetches; True ends the loop. ``timeout``: each fetch's longest wait, in seconds.
        """
        while not stop():
            self.poll(timeout)
        return self.stats

    def close(self) -> None:
        """Disconnect; held segments are not settled, so the broker redelivers them."""
        self.consumer.close()

    def _one(self, d: Delivery) -> None:
        st = self.stats
        st.received += 1
        st.redelivered += d.redelivered
        # Decoded once, by the assembler: it calls _hold with the header (the GroupId files the
        # delivery) once the segment decoded and verified, before judging it. The segment's data
        # stays a view of ``d.body``.
        self._unheld = d
        self._view = view = body_view(d)
        events = self.assembler.receive(view, seen=self._hold)
        unheld, self._unheld, self._view = self._unheld, None, b""  # no reference left: the pool may reuse it
        if events:  # most segments of a message only wait: nothing to settle
            self._settle(events, unheld)

    def _hold(self, h: SegmentHeader) -> None:
        d = self._unheld
        assert d is not None
        item = _tuple_new(_Held, (h.msg_seq_number, self._view, d))
        held = self._held.get(h.group_id)
        if held is None:
            self._held[h.group_id] = [item]
        else:
            held.append(item)
        self._unheld = None

    def _settle(self, events: list[Event], unheld: Delivery | None = None) -> None:
        """Settle what ``events`` decided; ``unheld`` is the current delivery when the assembler
        refused it before it decoded (it was never held: the one Rejected event is about it)."""
        # Refusals first: a message's losing copies must not be accepted along with its winners.
        for ev in events:
            if isinstance(ev, Duplicate):
                self._take(ev.group_id, None, None).delivery.accept()
                self.stats.duplicates += 1
            elif isinstance(ev, Rejected) and unheld is not None:
                if self.on_quarantine is not None:
                    self.on_quarantine(ev)
                self._reject(unheld, ev.reason, str(ev.error))
            elif isinstance(ev, Rejected) and ev.header is not None:
                if self.on_quarantine is not None:
                    self.on_quarantine(ev)
                gid = ev.header.group_id
                if any(same_bytes(x.body, ev.raw) for x in self._held.get(gid, ())):
                    self._reject(self._take(gid, None, ev.raw).delivery, ev.reason, str(ev.error))
            # A failed message, a failed or unfinished group: every delivery held for it goes, matched
            # by MsgSeqNumber / GroupId, not by bytes (a store keeping failed bodies hands back
            # handles, not bytes: matched by bytes, those deliveries would never be settled).
            elif isinstance(ev, MessageFailed):
                self._quarantine(ev, ev.group_id, ev.msg_seq_number, ev.reason, str(ev.error))
            elif isinstance(ev, GroupFailed):
                self._quarantine(ev, ev.group_id, None, ev.reason, f"group failed: {ev.failed[0].error}")
            elif isinstance(ev, Unfinished):
                self._quarantine(ev, ev.group_id, None, ev.reason, f"{ev.cause.value}: incomplete")
        for ev in events:
            if isinstance(ev, MessageComplete | GroupComplete) and self.defer:
                seq = None if isinstance(ev, GroupComplete) else ev.msg_seq_number
                self._deferred[(ev.group_id, seq)] = self._take_all(ev.group_id, seq)
                self.handler(ev)  # handed over: settled by settle_message
            elif isinstance(ev, MessageComplete | GroupComplete):
                self.handler(ev)  # returns only once the application has the message safe
                seqs = None if isinstance(ev, GroupComplete) else {ev.msg_seq_number}
                n = len(ev.messages) if isinstance(ev, GroupComplete) else 1
                self._accept_all(ev.group_id, seqs)
                self.stats.messages += n

    def settle_message(self, ev: Delivered) -> int:
        """``defer=True``: accept every delivery of a message handed out (handled, or written to a
        dead letter); returns how many. A message not waiting here (settled already) settles nothing.

        ``ev``: the message handed out, as ``handler`` got it.
        """
        seq = None if isinstance(ev, GroupComplete) else ev.msg_seq_number
        items = self._deferred.pop((ev.group_id, seq), [])
        for x in items:
            x.delivery.accept()
        self.stats.used += len(items)
        if items:
            self.stats.messages += len(ev.messages) if isinstance(ev, GroupComplete) else 1
        return len(items)

    def deferred(self) -> int:
        """Deliveries of messages handed out and not yet settled (``defer=True``)."""
        return sum(len(v) for v in self._deferred.values())

    def _take_all(self, gid: bytes, seq: int | None) -> list[_Held]:
        """Remove the held deliveries of message ``seq`` of group ``gid`` (``None``: the whole group)."""
        held = self._held.pop(gid, [])
        keep = [x for x in held if seq is not None and x.seq != seq]
        if keep:
            self._held[gid] = keep
        return [x for x in held if seq is None or x.seq == seq]

    def _take(self, gid: bytes, seq: int | None, raw: bytes | None) -> _Held:
        """Remove one held delivery of group ``gid``: the one with bytes ``raw``, else the newest."""
        held = self._held[gid]
        i = len(held) - 1
        if raw is not None:
            i = next(i for i in range(len(held) - 1, -1, -1) if same_bytes(held[i].body, raw))
        item = held.pop(i)
        if not held:
            del self._held[gid]
        return item

    def _quarantine(self, ev: Quarantined, gid: bytes, seq: int | None, reason: Reason, text: str) -> None:
        """Reject every delivery held for message ``seq`` of group ``gid`` (``None``: the whole group)."""
        if self.on_quarantine is not None:
            self.on_quarantine(ev)
        held = self._held.pop(gid, [])
        keep = [x for x in held if seq is not None and x.seq != seq]
        if keep:
            self._held[gid] = keep
        for x in held:
            if seq is None or x.seq == seq:
                self._reject(x.delivery, reason, text)

    def _reject(self, d: Delivery, reason: Reason, text: str) -> None:
        d.reject(int(reason), text)
        self.stats.rejected += 1
        self.stats.by_reason[int(reason)] = self.stats.by_reason.get(int(reason), 0) + 1

    def _accept_all(self, gid: bytes, seqs: set[int] | None) -> None:
        held = self._held.get(gid, [])
        keep = []
        for x in held:
            if seqs is None or x.seq in seqs:
                x.delivery.accept()
                self.stats.used += 1
            else:
                keep.append(x)
        if keep:
            self._held[gid] = keep
        else:
            self._held.pop(gid, None)
