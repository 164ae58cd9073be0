"""Segments through a message broker: AMQP 1.0 (Qpid Proton) and STOMP (our own client), one interface.

Each segment travels as its own broker message whose body is the encoded segment, header and
data exactly as :meth:`Segment.encode` gives them: the body is self-describing and verified by
its own checksums, so nothing the broker adds or drops can corrupt a message unnoticed, and a
drain can land bodies in the Parquet table ``reassemble run`` reads without decoding them.
Broker fields carry only what the broker itself must act on:

* **group**: AMQP ``properties.group-id`` / STOMP ``JMSXGroupID`` = the segment's GroupId in hex.
  Every segment of a message, and every message of an MQ group, shares it, so ActiveMQ's message
  groups route the whole unit to one consumer at a time (and move it if that consumer dies).
* **no sequence**: AMQP ``group-sequence`` / STOMP ``JMSXGroupSeq`` is deliberately left unset.
  ActiveMQ gives it a meaning: a message with sequence 1 *reassigns* its group to whichever
  consumer it is dispatched to, and a negative one closes the group. Mapping MsgSeqNumber there
  would spread every unsegmented-group message's segments (all MsgSeqNumber 1) over all
  consumers; mapping the segment's send order (1, 2, ...) was measured to split a group after a
  consumer died: its redelivered first segment (sequence 1) went to one survivor, which became the
  owner, while new segments had already been given to another. Without a sequence the group is
  assigned once, to the consumer that receives its first message, and after that consumer dies,
  to the one that receives the group's next message (redelivered or new), which then gets all the
  rest. The body carries MsgSeqNumber and Offset; order within a group does not matter to the
  assembler.
* **durable** (AMQP ``header.durable`` / STOMP ``persistent:true``): ActiveMQ's dead-letter strategy
  ignores non-persistent messages, so a rejected segment would otherwise vanish.

The AMQP client library is imported lazily (``pip install segmenter[broker]``): ``import segmenter``
works without it. STOMP needs nothing but the standard library: :mod:`segmenter.brokers_stomp`
(a sans-I/O frame parser and one socket read in the caller's thread; it replaced stomp-py, whose
reader thread cost more per 64 KiB message than our whole segment processing). This module is the
transport only (connect, send with broker confirmation, fetch and settle deliveries); what a
receiver does with a delivery is :mod:`reassembly.brokers.receiver`.

Size limits: ActiveMQ checks every incoming message against the connector's
``wireFormat.maxFrameSize`` (unlimited by default in 5.17; upstream's sample config sets
104857600 on every connector; STOMP also has ``wireFormat.maxDataLength``, default 100 MiB), and
a message above it closes the connection. :func:`segment_size_for` turns that limit into the
producer's ``max_segment_size``, leaving :data:`ENVELOPE_RESERVE` bytes for the protocol's own
fields. The AMQP ``max-frame-size`` negotiated on the connection is a transfer frame size, not a
message limit: a message larger than a frame travels as several. It matters for speed, since
python-qpid-proton handles every frame in Python: its client offers only 32 KiB unless told
otherwise, so a 64 KiB segment took three frames. :data:`AMQP_FRAME_SIZE` (1 MiB) is offered
instead; the frame size used is the smaller of it and the broker's (ActiveMQ's connector option
``wireFormat.maxAmqpFrameSize``, 128 KiB by default).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import urlsplit

from .brokers_stomp import StompConnection, StompError, StompFrame, escape, explain
from .brokers_stomp import frame as stomp_frame
from .errors import Reason, SegmentationError
from .recycle import BufferPool
from .wire import Buffer, Segment

# Room left in the broker's message limit for what the protocol adds around the body: AMQP header,
# properties (message-id, group-id of 48 hex chars, group-sequence), annotations; STOMP command and
# headers. ActiveMQ measured 19 bytes over the body for a bare AMQP message; 4 KiB is ample.
ENVELOPE_RESERVE = 4096

# The AMQP max-frame-size this client offers (python-qpid-proton's own default is 32 KiB). Measured on
# loopback against ActiveMQ with 1 MiB frames, 64 KiB messages: 15 -> 27 MiB/s sent, 18 -> 23 received.
AMQP_FRAME_SIZE = 1 << 20

# AMQP 1.0 sections before the body, encoded once here instead of by proton's Message.encode (which
# starts from a 16-byte buffer and re-encodes the whole message at every doubling: 13 passes over a
# 64 KiB body). Header: described list [durable=true]. Properties: described list of 11 fields,
# the first 10 (message-id .. creation-time) null, then group-id as str8. Data: vbin32 body.
_HEADER_DURABLE = b"\x00\x53\x70\xc0\x02\x01\x41"


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
    without a copy, a read-only view of a pooled buffer (:mod:`segmenter.recycle`) that stays
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
        Written like :meth:`accept`."""


def body_view(d: Delivery) -> bytes | memoryview:
    """A delivery's body without a copy: its ``view`` where it has one (STOMP), else ``body``."""
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
    """

    def __init__(self, transport: _Transport, max_message_size: int | None) -> None:
        self._t = transport
        self._limit = max_message_size
        self._gid: bytes | None = None
        self._group: str | None = None
        self.sent = 0
        self.sent_bytes = 0

    def send(self, segment: Segment) -> None:
        """Send one segment: body = its encoding (header, then data), broker group = its GroupId in hex.

        The header and the data go to the transport separately and are joined only in the frame
        it writes: :meth:`Segment.encode` first would copy every byte once more than the floor."""
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
        """Send one broker message as is (the floor in ``bench/brokerbench.py``: no segment header)."""
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
        """Wait until the broker confirmed every message sent so far."""
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


class _Transport(Protocol):
    def send(self, header: bytes, data: Buffer, size: int, group: str | None) -> None:
        """Write one message whose body is ``header + data`` (``size`` bytes), copying it once."""

    def flush(self, timeout: float) -> None: ...
    def close(self) -> None: ...


def open_sender(
    url: str,
    queue: str,
    *,
    max_message_size: int | None = None,
    window: int = 256,
    amqp_frame_size: int = AMQP_FRAME_SIZE,
) -> Sender:
    """A :class:`Sender` for ``amqp://host:port`` or ``stomp://host:port``."""
    scheme = urlsplit(url).scheme
    transport: _Transport
    if scheme in ("amqp", "amqps"):
        transport = _AmqpSender(url, queue, window, amqp_frame_size)
    elif scheme == "stomp":
        transport = _StompSender(url, queue, window)
    else:
        raise BrokerError(f"unknown broker URL scheme {scheme!r} (amqp://, amqps://, stomp://)", url=url)
    return Sender(transport, max_message_size)


def open_consumer(url: str, queue: str, *, prefetch: int = 1000, amqp_frame_size: int = AMQP_FRAME_SIZE) -> Consumer:
    """A :class:`Consumer` of ``queue`` with up to ``prefetch`` deliveries in flight.

    STOMP's ``activemq.prefetchSize`` caps *unacknowledged* messages, and a receiver holds the
    segments of every incomplete message unacknowledged: prefetch must exceed the segments held
    at once, or the consumer stalls. AMQP credit is refilled as messages arrive, not as they are
    settled, so it does not cap what is held (it must be at least 2: ActiveMQ stalls at 1).
    ``amqp_frame_size``: see :data:`AMQP_FRAME_SIZE`.
    """
    scheme = urlsplit(url).scheme
    if scheme in ("amqp", "amqps"):
        return _AmqpConsumer(url, queue, max(prefetch, 2), amqp_frame_size)
    if scheme == "stomp":
        return _StompConsumer(url, queue, prefetch)
    raise BrokerError(f"unknown broker URL scheme {scheme!r} (amqp://, amqps://, stomp://)", url=url)


# --------------------------------------------------------------------------------------- AMQP
class _Proton:
    """One proton Container driven from the caller's thread: ``pump`` runs its event loop a while."""

    def __init__(self, url: str, handler: Any, frame_size: int | None) -> None:
        from proton.reactor import Container

        self.url = url
        self.handler = handler
        self.error: str | None = None
        self.container = Container(handler)
        # How long one turn of the loop may wait in select(). Sends and settlements made outside an
        # event are written on the next turn, so this bounds their latency: 50 ms gave 52 64-KiB
        # messages/s, 1 ms 132/s, at the price of idle wake-ups. 5 ms is the compromise.
        self.container.timeout = 0.005
        self.container.start()
        self.connection = self.container.connect(url, reconnect=False, max_frame_size=frame_size)

    def pump(self, until: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not until():
            if self.error is not None:
                raise BrokerError(f"{what}: {self.error}", url=self.url)
            if time.monotonic() > deadline:
                raise BrokerError(f"{what}: no answer from the broker within {timeout} s", url=self.url)
            self.container.process()
        if self.error is not None:
            raise BrokerError(f"{what}: {self.error}", url=self.url)

    def close(self) -> None:
        conn = self.connection
        if conn.state & conn.LOCAL_ACTIVE:
            conn.close()
        deadline = time.monotonic() + 5.0
        while not conn.state & conn.REMOTE_CLOSED and self.error is None and time.monotonic() < deadline:
            self.container.process()
        self.container.stop()
        self.container.process()


def _amqp_envelope(group: str | None) -> bytes:
    """The AMQP sections before a message's body: header (durable) and properties (group-id)."""
    if group is None:
        return _HEADER_DURABLE
    g = group.encode()
    if len(g) > 200:  # str8 and list8 bounds; a GroupId in hex is 48
        raise BrokerError("broker group id too long", size=len(g))
    properties = b"\x00\x53\x73\xc0" + bytes((13 + len(g), 11)) + b"\x40" * 10 + b"\xa1" + bytes((len(g),)) + g
    return _HEADER_DURABLE + properties


def _amqp_data_section(size: int) -> bytes:
    """The constructor and length of the one data section (vbin32) holding a ``size``-byte body."""
    return b"\x00\x53\x75\xb0" + size.to_bytes(4, "big")


def _amqp_handler(on_message: Callable[[Any], None] | None = None) -> Any:
    """A MessagingHandler recording errors and (for a consumer) incoming deliveries. Credit is
    granted by the consumer itself (prefetch=0 here): proton's flow controller sends a flow frame
    after every delivery, one more event and one more socket write per message."""
    from proton.handlers import MessagingHandler

    class Handler(MessagingHandler):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(prefetch=0, auto_accept=False, auto_settle=True)
            self.link_open = False
            self.owner: _Proton | None = None
            self.confirmed = 0
            self.refused: list[str] = []

        def _fail(self, text: str) -> None:
            if self.owner is not None and self.owner.error is None:
                self.owner.error = text

        def on_link_opened(self, event: Any) -> None:
            self.link_open = True

        def on_transport_error(self, event: Any) -> None:
            c = event.transport.condition
            self._fail(f"{c.name}: {c.description}" if c else "transport error")

        def on_connection_error(self, event: Any) -> None:
            c = event.connection.remote_condition
            self._fail(f"{c.name}: {c.description}" if c else "connection closed by the broker")

        def on_link_error(self, event: Any) -> None:
            c = event.link.remote_condition
            self._fail(f"{c.name}: {c.description}" if c else "link closed by the broker")

        def on_disconnected(self, event: Any) -> None:
            self._fail("disconnected")

        def on_accepted(self, event: Any) -> None:
            self.confirmed += 1

        def on_rejected(self, event: Any) -> None:
            c = event.delivery.remote.condition
            self.refused.append(f"{c.name}: {c.description}" if c else "rejected")
            self.confirmed += 1

        def on_released(self, event: Any) -> None:
            self.refused.append("released by the broker")
            self.confirmed += 1

        def on_message(self, event: Any) -> None:
            if on_message is not None:
                on_message(event)

    return Handler()


class _AmqpSender:
    def __init__(self, url: str, queue: str, window: int, frame_size: int) -> None:
        self.handler = _amqp_handler()
        self.p = _Proton(url, self.handler, frame_size)
        self.handler.owner = self.p
        self.link = self.p.container.create_sender(self.p.connection, queue)
        self.window = window
        self.sent = 0
        self.group: str | None = None
        self.envelope = _amqp_envelope(None)
        self.p.pump(lambda: self.handler.link_open, 30.0, f"attach sender to {queue}")

    def send(self, header: bytes, data: Buffer, size: int, group: str | None) -> None:
        h, link = self.handler, self.link
        if link.credit <= 0 or self.sent - h.confirmed >= self.window:
            self.p.pump(lambda: link.credit > 0 and self.sent - h.confirmed < self.window, 60.0, "send")
        if group != self.group:  # consecutive segments share it: encode the envelope once per message
            self.group, self.envelope = group, _amqp_envelope(group)
        self.sent += 1
        link.delivery(str(self.sent))  # the tag: unique on this link
        # Two writes, as for any body: proton copies them into the delivery, the only copy of the data.
        link.stream(self.envelope + _amqp_data_section(size) + header)
        link.stream(data)  # type: ignore[arg-type]  # any contiguous buffer: cffi's from_buffer
        link.advance()
        self._check()

    def _check(self) -> None:
        if self.handler.refused:
            raise BrokerError(f"the broker refused a message: {self.handler.refused[0]}", url=self.p.url)

    def flush(self, timeout: float) -> None:
        self.p.pump(lambda: self.handler.confirmed >= self.sent, timeout, "flush")
        self._check()

    def close(self) -> None:
        self.p.close()


class _AmqpDelivery:
    __slots__ = ("_d", "body", "redelivered")

    def __init__(self, delivery: Any, body: bytes, redelivered: bool) -> None:
        self._d, self.body, self.redelivered = delivery, body, redelivered

    def accept(self) -> None:
        self._d.update(self._d.ACCEPTED)
        self._d.settle()

    def reject(self, reason: int, description: str) -> None:
        from proton import Condition

        self._d.local.condition = Condition(f"segmenter:{reason}", description)
        self._d.update(self._d.REJECTED)
        self._d.settle()


class _AmqpConsumer:
    def __init__(self, url: str, queue: str, prefetch: int, frame_size: int) -> None:
        self.arrived: list[Delivery] = []
        self.prefetch = prefetch
        self.handler = _amqp_handler(self._on_message)
        self.p = _Proton(url, self.handler, frame_size)
        self.handler.owner = self.p
        self.link = self.p.container.create_receiver(self.p.connection, queue)
        self.link.flow(prefetch)
        self.p.pump(lambda: self.handler.link_open, 30.0, f"attach receiver to {queue}")

    def _on_message(self, event: Any) -> None:
        msg = event.message
        self.arrived.append(_AmqpDelivery(event.delivery, _amqp_body(msg), bool(msg.delivery_count)))
        # Credit is topped up as messages arrive (not as they are settled), in batches of half the
        # prefetch: one flow frame per prefetch/2 messages instead of one per message.
        link = self.link
        if link.credit <= self.prefetch // 2:
            link.flow(self.prefetch - link.credit)

    def fetch(self, timeout: float) -> list[Delivery]:
        deadline = time.monotonic() + timeout
        self.p.container.process()  # also flushes settlements made since the last call
        while not self.arrived and time.monotonic() < deadline and self.p.error is None:
            self.p.container.process()
        if self.p.error is not None and not self.arrived:
            raise BrokerError(f"receive: {self.p.error}", url=self.p.url)
        got, self.arrived = self.arrived, []
        return got

    def close(self) -> None:
        self.p.close()


def _amqp_body(msg: Any) -> bytes:
    """The body as bytes, whatever a foreign producer sent: a data section as is, text as its
    UTF-8, nothing as empty, any other AMQP value as the whole message encoded (never ``bytes(x)``:
    an integer body sized an allocation, a text body raised out of ``fetch()`` at every restart)."""
    body = msg.body
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    if isinstance(body, str):
        return body.encode("utf-8", "surrogatepass")
    if body is None:
        return b""
    return bytes(msg.encode())


# -------------------------------------------------------------------------------------- STOMP
def _stomp_connect(url: str, pool: BufferPool | None = None) -> StompConnection:
    try:
        return StompConnection(url, pool=pool)
    except StompError as exc:
        raise BrokerError(str(exc), url=url) from exc


_SERVER_COMMANDS = frozenset({"CONNECTED", "MESSAGE", "RECEIPT", "ERROR"})  # all STOMP 1.2 lets a server send


def _stomp_read(conn: StompConnection, timeout: float, what: str) -> list[StompFrame]:
    """Frames within ``timeout`` s; an ERROR frame or a lost connection raises."""
    try:
        frames = conn.read(timeout)
    except StompError as exc:
        raise BrokerError(f"{what}: {exc}", url=conn.url) from exc
    for f in frames:
        if f.command == "ERROR":
            conn.close(0.0)
            raise BrokerError(f"{what}: the broker says: {explain(f)}", url=conn.url)
        if f.command not in _SERVER_COMMANDS:  # a frame out of step (e.g. a body with a NUL and no
            conn.close(0.0)  # content-length): whatever follows is misframed; never skip it silently
            raise BrokerError(f"{what}: unexpected frame {f.command[:40]!r}: the stream is out of step", url=conn.url)
    return frames


def _stomp_write(conn: StompConnection, frames: bytes, what: str) -> None:
    try:
        conn.write(frames)
    except StompError as exc:
        raise BrokerError(f"{what}: {exc}", url=conn.url) from exc


class _StompSender:
    """Every SEND asks for a RECEIPT (ActiveMQ sends it once a persistent message is stored). The
    receipts are read only when ``window`` sends are unconfirmed and at :meth:`flush`: a few dozen
    bytes each, they wait in the socket buffer meanwhile, and no thread is needed to read them."""

    def __init__(self, url: str, queue: str, window: int) -> None:
        self.url, self.window = url, window
        self.conn = _stomp_connect(url)
        self.sent = 0
        self.confirmed = 0
        # Every frame's fixed headers, encoded once (content-length and receipt are added per message).
        self.prefix = (
            b"SEND\ndestination:" + escape(f"/queue/{queue}") + b"\npersistent:true\n"
            b"content-type:application/octet-stream\n"
        )
        self.group: str | None = None
        self.group_line = b""

    def send(self, header: bytes, data: Buffer, size: int, group: str | None) -> None:
        if self.sent - self.confirmed >= self.window:
            self._await(lambda: self.sent - self.confirmed < self.window, 60.0, "send")
        if group != self.group:
            self.group = group
            self.group_line = b"" if group is None else b"JMSXGroupID:" + escape(group) + b"\n"
        self.sent += 1
        head = b"%s%sreceipt:%d\ncontent-length:%d\n\n%s" % (self.prefix, self.group_line, self.sent, size, header)
        _stomp_write(self.conn, b"".join((head, data, b"\x00")), "send")

    def _await(self, until: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not until():
            if time.monotonic() > deadline:
                raise BrokerError(f"{what}: no answer from the broker within {timeout} s", url=self.url)
            frames = _stomp_read(self.conn, deadline - time.monotonic(), what)
            self.confirmed += sum(f.command == "RECEIPT" for f in frames)

    def flush(self, timeout: float) -> None:
        self._await(lambda: self.confirmed >= self.sent, timeout, "flush")

    def close(self) -> None:
        self.conn.close()


class _StompDelivery:
    __slots__ = ("_ack", "_owner", "redelivered", "view")

    def __init__(self, owner: _StompConsumer, f: StompFrame) -> None:
        self._owner = owner
        ack = f.headers.get("ack")
        if ack is None:  # we subscribe with client-individual acks: every MESSAGE must carry one
            raise BrokerError("a STOMP MESSAGE without an ack header: it could never be settled", url=owner.url)
        self._ack = escape(ack)
        self.view = f.body  # bytes, or a view of the consumer's pooled buffer
        self.redelivered = f.headers.get("redelivered") == "true"

    @property
    def body(self) -> bytes:
        """A copy of :attr:`view` (``bytes`` as they are): what a caller that keeps bytes gets."""
        view = self.view
        return view if isinstance(view, bytes) else view.tobytes()

    def accept(self) -> None:
        self._owner.settle(b"ACK\nid:" + self._ack + b"\n\n\x00")

    def reject(self, reason: int, description: str) -> None:
        # STOMP's NACK carries no reason: ActiveMQ treats it as a poison ack and dead-letters the
        # message with its own cause; the receiver reports the reason to the application instead.
        self._owner.settle(b"NACK\nid:" + self._ack + b"\n\n\x00")


class _StompConsumer:
    """Settlements (ACK / NACK frames, one per message: ``client-individual``) are queued by
    ``accept``/``reject`` and written together, in order, by the next :meth:`fetch` or
    :meth:`close`, or as soon as a quarter of the prefetch is queued (the broker sends no more than
    ``prefetch`` unacknowledged messages, so a longer queue would stall it): one socket write per
    batch instead of one per segment. A settlement still leaves only after the receiver called
    ``accept``, i.e. after the application had the message; a process that dies before the write
    leaves the message unacknowledged, so the broker redelivers it (at-least-once, as with any
    crash between hand-over and acknowledgement). The socket is read in :meth:`fetch`, in the
    caller's thread: nothing runs between two fetches."""

    def __init__(self, url: str, queue: str, prefetch: int) -> None:
        self.url = url
        self.settlements: list[bytes] = []
        self.batch = max(1, prefetch // 4)
        # Bodies into reused buffers: a receiver holds the segments of incomplete messages, and
        # fresh memory for each would be page-faulted in 4 KiB at a time (segmenter/recycle.py).
        self.conn = _stomp_connect(url, BufferPool())
        subscribe = {
            "id": "1",
            "destination": f"/queue/{queue}",
            "ack": "client-individual",
            "activemq.prefetchSize": str(prefetch),
        }
        _stomp_write(self.conn, stomp_frame("SUBSCRIBE", subscribe), "subscribe")

    def settle(self, frame: bytes) -> None:
        self.settlements.append(frame)
        if len(self.settlements) >= self.batch:
            self._write_settlements()

    def _write_settlements(self) -> None:
        if self.settlements:
            frames, self.settlements = b"".join(self.settlements), []
            _stomp_write(self.conn, frames, "settle")

    def fetch(self, timeout: float) -> list[Delivery]:
        self._write_settlements()  # before waiting: the broker may hold further messages until these are acked
        return [_StompDelivery(self, f) for f in _stomp_read(self.conn, timeout, "receive") if f.command == "MESSAGE"]

    def close(self) -> None:
        try:
            if not self.conn.closed:
                self._write_settlements()
        finally:
            self.conn.close()
