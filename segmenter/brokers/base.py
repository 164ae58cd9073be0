"""What every broker transport offers: :class:`Sender`, :class:`Consumer`, :class:`Delivery`, and the size limits.

Size limits: ActiveMQ checks every incoming message against the connector's
``wireFormat.maxFrameSize`` (unlimited by default in 5.17; upstream's sample config sets
104857600 on every connector; STOMP also has ``wireFormat.maxDataLength``, default 100 MiB), and
a message above it closes the connection. :func:`segment_size_for` turns that limit into the
producer's ``max_segment_size``, leaving :data:`ENVELOPE_RESERVE` bytes for the protocol's own
fields; a :class:`Sender` given the limit refuses an oversized segment itself (2218) instead of
losing the connection.
"""

from __future__ import annotations

from typing import Protocol

from ..errors import Reason, SegmentationError
from ..wire import Buffer, Segment

# Room left in the broker's message limit for what the protocol adds around the body: AMQP header,
# properties (message-id, group-id of 48 hex chars, group-sequence), annotations; STOMP command and
# headers. ActiveMQ measured 19 bytes over the body for a bare AMQP message; 4 KiB is ample.
ENVELOPE_RESERVE = 4096


class BrokerError(SegmentationError):
    """The broker refused something or the connection broke (2009 CONNECTION_BROKEN)."""

    default_reason = Reason.CONNECTION_BROKEN


def segment_size_for(broker_max_message_size: int) -> int:
    """The ``max_segment_size`` (encoded segment, header included) that fits a broker's message limit.

    ``broker_max_message_size`` is ActiveMQ's ``wireFormat.maxFrameSize`` of the connector used
    (or the smaller of it and STOMP's ``wireFormat.maxDataLength``).
    """
    size = broker_max_message_size - ENVELOPE_RESERVE
    if size < 1024:
        raise SegmentationError(
            "broker message limit too small for segments",
            reason=Reason.MSG_TOO_BIG_FOR_CHANNEL,
            limit=broker_max_message_size,
            reserve=ENVELOPE_RESERVE,
        )
    return size


class Delivery(Protocol):
    """One message received from the broker, not yet settled.

    ``body`` is the message as ``bytes``. A STOMP delivery also has ``view``: the same bytes
    without a copy, a read-only view of a pooled buffer (:mod:`segmenter.brokers.recycle`) that stays
    valid, and unchanged, for as long as anything refers to it; its ``body`` is copied from it when
    asked for. :func:`body_view` gives whichever a delivery has without copying (the ``BrokerReceiver``
    and the drain read that)."""

    @property
    def body(self) -> bytes: ...

    redelivered: bool  # the broker delivered it before (to this or a dead consumer)

    def accept(self) -> None:
        """Acknowledge: the broker forgets the message. Written with the consumer's next
        ``fetch`` or ``close`` at the latest (settlements leave in batches)."""

    def reject(self, reason: int, description: str) -> None:
        """Refuse: ActiveMQ moves a durable message to its dead-letter queue (ActiveMQ.DLQ).
        Written like :meth:`accept`.

        ``reason``: the :class:`~segmenter.Reason` code why (reported to the application; a broker may not carry it).
        ``description``: what happened, in words.
        """


def body_view(d: Delivery) -> bytes | memoryview:
    """A delivery's body without a copy: its ``view`` where it has one (STOMP), else ``body``.

    ``d``: the delivery.
    """
    view: bytes | memoryview | None = getattr(d, "view", None)
    return d.body if view is None else view


class Consumer(Protocol):
    """A subscription to one queue: deliveries in, settlements out."""

    def fetch(self, timeout: float) -> list[Delivery]:
        """Write the settlements made since the last call, then return what arrived, waiting up
        to ``timeout`` seconds for the first delivery."""

    def close(self) -> None:
        """Flush settlements and disconnect; unsettled deliveries go back to the broker."""


class Sender:
    """Sends segments to one queue; :meth:`flush` returns once the broker confirmed every one.

    Up to ``window`` sends are unconfirmed at a time (pipelining; the broker confirms a durable
    message once stored). ``max_message_size`` (the broker's limit, see :func:`segment_size_for`)
    makes an oversized segment a 2218 error here instead of a dropped connection there.

    ``transport``: the broker connection, already open on the queue.
    """

    def __init__(self, transport: Transport, max_message_size: int | None) -> None:
        self._t = transport
        self._limit = max_message_size
        self._gid: bytes | None = None
        self._group: str | None = None
        self.sent = 0
        self.sent_bytes = 0

    def send(self, segment: Segment) -> None:
        """Send one segment: body = its encoding (header, then data), broker group = its GroupId in hex.

        The header and the data go to the transport separately and are joined only in the frame
        it writes: :meth:`Segment.encode` first would copy every byte once more than the floor.

        ``segment``: the segment sent.
        """
        gid = segment.header.group_id
        if gid != self._gid:  # a message's segments share it: hex once per message, not per segment
            self._gid, self._group = gid, gid.hex()
        header, data = segment.header.pack(), segment.data
        if isinstance(data, memoryview) and (data.itemsize != 1 or not data.c_contiguous):
            data = data.tobytes()  # the transports write flat byte buffers
        # The length written in the frame is the bytes' own, never what the header claims.
        size = len(header) + (data.nbytes if isinstance(data, memoryview) else len(data))
        self._send(header, data, size, self._group)

    def send_bytes(self, body: bytes, group: str | None = None) -> None:
        """Send one broker message as is, with no segment header (for a message that needs none, or
        to compare with the segmented path on the same connection).

        ``body``: the message's bytes. ``group``: the broker's message group (None: none).
        """
        self._send(b"", body, len(body), group)

    def _send(self, header: bytes, data: Buffer, size: int, group: str | None) -> None:
        if self._limit is not None and size + ENVELOPE_RESERVE > self._limit:
            raise SegmentationError(
                "segment too big for the broker",
                reason=Reason.MSG_TOO_BIG_FOR_CHANNEL,
                size=size,
                limit=self._limit,
                reserve=ENVELOPE_RESERVE,
            )
        self._t.send(header, data, size, group)
        self.sent += 1
        self.sent_bytes += size

    def flush(self, timeout: float = 60.0) -> None:
        """Wait until the broker confirmed every message sent so far.

        ``timeout``: the longest wait, in seconds.
        """
        self._t.flush(timeout)

    def close(self) -> None:
        """Flush and disconnect."""
        try:
            self._t.flush(60.0)
        finally:
            self._t.close()

    def __enter__(self) -> Sender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Transport(Protocol):
    """What a :class:`Sender` writes through: one per protocol (:mod:`.amqp`, :mod:`.stomp`). The
    segment logic (limits, the group, counting) is the Sender's, so each protocol is only its wire."""

    def send(self, header: bytes, data: Buffer, size: int, group: str | None) -> None:
        """Write one message whose body is ``header + data`` (``size`` bytes), copying it once."""

    def flush(self, timeout: float) -> None: ...
    def close(self) -> None: ...
