"""A broker URL to its transport: :func:`open_sender` and :func:`open_consumer` (``amqp://``,
``amqps://``, ``stomp://``), the one place that knows which module serves which scheme."""

from __future__ import annotations

from urllib.parse import urlsplit

from .amqp import AMQP_FRAME_SIZE, AmqpConsumer, AmqpSender
from .base import BrokerError, Consumer, Sender, Transport
from .stomp import StompConsumer, StompSender


def open_sender(
    url: str,
    queue: str,
    *,
    max_message_size: int | None = None,
    window: int = 256,
    amqp_frame_size: int = AMQP_FRAME_SIZE,
) -> Sender:
    """A :class:`Sender` for ``amqp://host:port`` or ``stomp://host:port``.

    ``url``: the broker. ``queue``: the queue sent to. ``max_message_size``: the broker's largest message, in bytes
    (None: not checked here). ``window``: the most sends unconfirmed at a time. ``amqp_frame_size``: the AMQP maximum
    frame size, in bytes (AMQP only).
    """
    scheme = urlsplit(url).scheme
    transport: Transport
    if scheme in ("amqp", "amqps"):
        transport = AmqpSender(url, queue, window, amqp_frame_size)
    elif scheme == "stomp":
        transport = StompSender(url, queue, window)
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

    ``url``: the broker, ``amqp://host:port`` or ``stomp://host:port``.
    """
    scheme = urlsplit(url).scheme
    if scheme in ("amqp", "amqps"):
        return AmqpConsumer(url, queue, max(prefetch, 2), amqp_frame_size)
    if scheme == "stomp":
        return StompConsumer(url, queue, prefetch)
    raise BrokerError(f"unknown broker URL scheme {scheme!r} (amqp://, amqps://, stomp://)", url=url)
