"""STOMP 1.2 through our own client (:mod:`.stomp_client`): standard library only.

Our own client rather than stomp-py: stomp-py reads on a thread of its own and copies every body
several times (:mod:`.stomp_client` says what that costs); here the socket is read in the caller's
thread, in :meth:`StompConsumer.fetch` and while a :class:`StompSender` waits for receipts.
The broker fields each message carries are those of :mod:`segmenter.brokers` (``JMSXGroupID``,
``persistent:true``, no ``JMSXGroupSeq``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..wire import Buffer
from .base import BrokerError, Delivery
from .recycle import BufferPool
from .stomp_client import StompConnection, StompError, StompFrame, escape, explain
from .stomp_client import frame as stomp_frame


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


class StompSender:
    """The STOMP :class:`~segmenter.brokers.base.Transport`.

    Every SEND asks for a RECEIPT (ActiveMQ sends it once a persistent message is stored). The
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

    def __init__(self, owner: StompConsumer, f: StompFrame) -> None:
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


class StompConsumer:
    """The STOMP :class:`~segmenter.brokers.base.Consumer`.

    Settlements (ACK / NACK frames, one per message: ``client-individual``) are queued by
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
        # fresh memory for each would be page-faulted in 4 KiB at a time (segmenter/brokers/recycle.py).
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
