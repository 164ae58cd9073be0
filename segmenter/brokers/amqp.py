"""AMQP 1.0 through python-qpid-proton, driven from the caller's thread.

python-qpid-proton is the optional extra ``segmenter[broker]``: it is imported inside the functions
that open a connection, never at module level, so ``import segmenter.brokers`` works without it and
only an ``amqp://`` URL needs it.

The AMQP ``max-frame-size`` negotiated on the connection is a transfer frame size, not a message
limit: a message larger than a frame travels as several. It matters for speed, since
python-qpid-proton handles every frame in Python: its client offers only 32 KiB unless told
otherwise, so a 64 KiB segment would take three frames. :data:`AMQP_FRAME_SIZE` (1 MiB) is offered
instead; the frame size used is the smaller of it and the broker's (ActiveMQ's connector option
``wireFormat.maxAmqpFrameSize``, 128 KiB by default).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..wire import Buffer
from .base import BrokerError, Delivery

# The AMQP max-frame-size this client offers (python-qpid-proton's own default is 32 KiB). Measured on
# loopback against ActiveMQ with 1 MiB frames, 64 KiB messages: 15 -> 27 MiB/s sent, 18 -> 23 received.
AMQP_FRAME_SIZE = 1 << 20

# AMQP 1.0 sections before the body, encoded once here instead of by proton's Message.encode (which
# starts from a 16-byte buffer and re-encodes the whole message at every doubling: 13 passes over a
# 64 KiB body). Header: described list [durable=true]. Properties: described list of 11 fields,
# the first 10 (message-id .. creation-time) null, then group-id as str8. Data: vbin32 body.
_HEADER_DURABLE = b"\x00\x53\x70\xc0\x02\x01\x41"


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


class AmqpSender:
    """The AMQP :class:`~segmenter.brokers.base.Transport`: a sender link, its deliveries written as
    pre-encoded sections around the body (one copy of the data, into proton)."""

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


class AmqpConsumer:
    """The AMQP :class:`~segmenter.brokers.base.Consumer`: a receiver link with credit it grants itself."""

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
    of an integer body it allocates that many bytes, of a text body it raises out of ``fetch()``,
    and the same message is redelivered at every restart)."""
    body = msg.body
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    if isinstance(body, str):
        return body.encode("utf-8", "surrogatepass")
    if body is None:
        return b""
    return bytes(msg.encode())
