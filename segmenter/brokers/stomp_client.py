"""A minimal STOMP 1.2 client: a sans-I/O frame parser and one blocking socket in the caller's thread.

Why our own instead of stomp-py: stomp-py reads on a thread of its own, 16 KiB per ``recv``, and
rebuilds its receive buffer by concatenation after every read that contains a NUL byte (which
almost every 16 KiB of binary data does), so a 64 KiB message costs its reader thread about
230 us of CPU, several copies of the body, plus a GIL hand-off to the thread that processes it
(measured on loopback against ActiveMQ, bench/README.md "Broker"). Here the socket is read by
whoever calls :meth:`StompConnection.read`, up to 1 MiB at a time straight into the parser's
buffer (``recv_into``), and a body is copied exactly once, from that buffer into the ``bytes`` a
frame holds, or, when the parser was given a :class:`~segmenter.brokers.recycle.BufferPool` (the
consumer's connection is), into a pooled buffer lent as a read-only view and reused once nothing
refers to it: a consumer that holds bodies would otherwise pay a page fault per 4 KiB of each.
Either way immutable, so an assembler may keep views into it.

Only what :mod:`segmenter.brokers.stomp` needs: CONNECT, SEND (with receipts), SUBSCRIBE,
ACK/NACK, DISCONNECT; MESSAGE, RECEIPT, ERROR and CONNECTED frames in. No heart-beats (``0,0`` is
asked for: a consumer that stops reading must not be disconnected for it, and the broker's
inactivity monitor is off for STOMP clients that ask so). Frames from the broker are hostile
input like any other: a header block or a declared body over the limits raises
:class:`StompError` (which the adapters report as a ``BrokerError``) before anything is allocated
for it.
"""

from __future__ import annotations

import re
import socket
import time
from typing import NamedTuple
from urllib.parse import urlsplit

from ..errors import Reason, SegmentationError
from .recycle import BufferPool

MAX_HEADER_BLOCK = 64 << 10  # the command and headers of one frame
# The largest body accepted from the broker: ActiveMQ's own STOMP default (wireFormat.maxDataLength),
# so nothing the broker would take in is refused here, and a forged content-length cannot make the
# parser allocate more.
MAX_BODY = 100 << 20
_DIGITS = 20  # a content-length longer than this is refused before int() reads it
READ_SIZE = 1 << 20  # bytes asked of one recv_into

_HEADER_END = re.compile(rb"\r?\n\r?\n")
_UNESCAPE = re.compile(r"\\(.?)")  # a trailing backslash escapes nothing: refused
_ESCAPES = {"\\": "\\", "n": "\n", "r": "\r", "c": ":"}


class StompError(SegmentationError):
    """A STOMP protocol violation or a broker that went away (2009 CONNECTION_BROKEN)."""

    default_reason = Reason.CONNECTION_BROKEN


class StompFrame(NamedTuple):
    """One frame received: its command, headers (the first of repeated ones, unescaped) and body
    (read-only: ``bytes``, or a view of a pooled buffer when the parser has a pool)."""

    command: str
    headers: dict[str, str]
    body: bytes | memoryview


def escape(value: str) -> bytes:
    """A STOMP 1.2 header value, escaped (backslash, LF, CR, colon)."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace(":", "\\c").encode()


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    if "\\\\" not in value:  # no escaped backslash: the other three escapes cannot overlap
        out = value.replace("\\c", ":").replace("\\n", "\n").replace("\\r", "\r")
        if "\\" not in out:
            return out
    try:
        return _UNESCAPE.sub(lambda m: _ESCAPES[m.group(1)], value)
    except KeyError:
        raise StompError("undefined escape in a STOMP header", value=value[:100]) from None


class StompParser:
    """Bytes in, in any split; whole frames out. Sans-I/O: :meth:`space` gives the caller a buffer
    to read into (``recv_into``), :meth:`wrote` says how much it read, :meth:`frames` returns every
    frame complete so far. ``feed`` does both for bytes at hand (tests, other transports)."""

    def __init__(self, max_body: int = MAX_BODY, pool: BufferPool | None = None) -> None:
        self.max_body = max_body
        self.pool = pool
        self._buf = bytearray(READ_SIZE)
        self._start = 0  # first byte not yet parsed
        self._end = 0  # end of the bytes read
        self._need = 0  # bytes from _start that the frame begun there needs (0: unknown)
        self._head: tuple[str, dict[str, str], int] | None = None  # that frame's headers and body offset

    def space(self) -> memoryview:
        """Where the next read goes: at least :data:`READ_SIZE` bytes, or room for the whole frame
        begun (its declared length checked against ``max_body`` when its headers were parsed)."""
        held = self._end - self._start
        want = max(READ_SIZE, self._need - held)
        if len(self._buf) - self._end < want:
            # Move the unparsed tail to the front of a buffer large enough (a new one only if needed).
            size = max(len(self._buf), held + want)
            buf = self._buf if size == len(self._buf) else bytearray(size)
            buf[:held] = self._buf[self._start : self._end]
            self._buf, self._start, self._end = buf, 0, held
        return memoryview(self._buf)[self._end :]

    def wrote(self, n: int) -> None:
        """``n`` bytes were read into the last :meth:`space`."""
        self._end += n

    def feed(self, data: bytes) -> list[StompFrame]:
        """Take ``data`` (any length); return the frames it completed."""
        view = memoryview(data)
        while view:
            with self.space() as room:
                n = min(len(room), len(view))
                room[:n] = view[:n]
            self.wrote(n)
            view = view[n:]
        return self.frames()

    def frames(self) -> list[StompFrame]:
        """Every frame complete in the bytes read so far (heart-beat EOLs between frames skipped)."""
        out: list[StompFrame] = []
        buf, end = self._buf, self._end
        while True:
            start = self._start
            while start < end and buf[start] in (10, 13):  # EOLs between frames
                start += 1
            self._start = start
            if start == end:
                self._start = self._end = 0  # empty: the next read starts at the front again
                return out
            if self._head is None:  # parsed once, also when its body takes several reads
                m = _HEADER_END.search(buf, start, min(end, start + MAX_HEADER_BLOCK))
                if m is None:
                    if end - start >= MAX_HEADER_BLOCK:
                        raise StompError("STOMP header block too long", limit=MAX_HEADER_BLOCK)
                    return out
                self._head = (*_head(bytes(buf[start : m.start()])), m.end() - start)
            command, headers, body_offset = self._head
            body_start = start + body_offset
            declared = headers.get("content-length")
            if declared is not None:
                # ASCII digits only, at most _DIGITS of them (str.isdigit takes superscripts and other
                # scripts' digits; int() refuses 4300 digits): a StompError, never a ValueError
                if (
                    not (declared.isascii() and declared.isdigit() and len(declared) <= _DIGITS)
                    or int(declared) > self.max_body
                ):
                    raise StompError("STOMP content-length refused", declared=declared[:30], limit=self.max_body)
                body_end = body_start + int(declared)
                if end <= body_end:
                    self._need = body_end + 1 - start
                    return out
                if buf[body_end] != 0:
                    raise StompError("STOMP frame not terminated by NUL after its content-length")
            else:
                body_end = buf.find(0, body_start, end)
                if body_end < 0:
                    if end - body_start > self.max_body:
                        raise StompError("STOMP body without content-length too long", limit=self.max_body)
                    return out
            with memoryview(buf) as view:  # the one copy of a body
                part = view[body_start:body_end]
                body = bytes(part) if self.pool is None else self.pool.copy(part)
            out.append(StompFrame(command, headers, body))
            self._start, self._need, self._head = body_end + 1, 0, None


def _head(block: bytes) -> tuple[str, dict[str, str]]:
    try:
        text = block.decode()
    except UnicodeDecodeError:
        raise StompError("STOMP headers are not UTF-8") from None
    lines = text.split("\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        key, sep, value = line.rstrip("\r").partition(":")
        if not sep:
            raise StompError("STOMP header line without a colon", line=line[:100])
        headers.setdefault(_unescape(key), _unescape(value))
    return lines[0].rstrip("\r"), headers


def frame(command: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    """One encoded frame (for the rare frames: CONNECT, SUBSCRIBE, DISCONNECT)."""
    head = b"".join(escape(k) + b":" + escape(v) + b"\n" for k, v in headers.items())
    return command.encode() + b"\n" + head + b"\n" + body + b"\x00"


class StompConnection:
    """One connected STOMP 1.2 session over a blocking socket, used from one thread."""

    def __init__(
        self, url: str, *, timeout: float = 30.0, max_body: int = MAX_BODY, pool: BufferPool | None = None
    ) -> None:
        parts = urlsplit(url)
        self.url = url
        self.parser = StompParser(max_body, pool)
        host = parts.hostname or "127.0.0.1"
        try:
            self.sock = socket.create_connection((host, parts.port or 61613), timeout=timeout)
        except OSError as exc:
            raise StompError(f"cannot connect to {url}: {exc}", url=url) from exc
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.closed = False
        hello = {"accept-version": "1.2", "host": host, "heart-beat": "0,0"}
        if parts.username is not None:
            hello.update(login=parts.username, passcode=parts.password or "")
        self.write(frame("CONNECT", hello))
        deadline = time.monotonic() + timeout
        while True:
            got = self.read(deadline - time.monotonic())
            if got:
                break
            if time.monotonic() > deadline:
                raise StompError(f"no CONNECTED from {url} within {timeout} s", url=url)
        if got[0].command != "CONNECTED":
            raise StompError(f"cannot connect to {url}: {explain(got[0])}", url=url)

    def write(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError as exc:
            self.closed = True
            raise StompError(f"write to {self.url}: {exc}", url=self.url) from exc

    def read(self, timeout: float) -> list[StompFrame]:
        """The frames that arrive within ``timeout`` s: returns as soon as one read completed at
        least one frame (with every other frame that read completed), or empty at the deadline.
        An ERROR frame is returned like any other; a closed connection raises."""
        got = self.parser.frames()
        deadline = time.monotonic() + timeout
        while not got:
            left = deadline - time.monotonic()
            if left <= 0:
                return got
            self.sock.settimeout(left)
            try:
                with self.parser.space() as room:
                    n = self.sock.recv_into(room)
            except TimeoutError:
                return got
            except OSError as exc:
                self.closed = True
                raise StompError(f"read from {self.url}: {exc}", url=self.url) from exc
            if n == 0:
                self.closed = True
                raise StompError(f"{self.url} closed the connection", url=self.url)
            self.parser.wrote(n)
            got = self.parser.frames()
        return got

    def close(self, timeout: float = 5.0) -> None:
        """DISCONNECT (waiting up to ``timeout`` s for its receipt: everything written before it was
        processed), then close the socket. Unacknowledged messages go back to the broker."""
        if not self.closed:
            try:
                self.write(frame("DISCONNECT", {"receipt": "bye"}))
                deadline = time.monotonic() + timeout
                while time.monotonic() < deadline:
                    if any(f.command == "RECEIPT" and f.headers.get("receipt-id") == "bye" for f in self.read(0.5)):
                        break
            except StompError:
                pass  # gone already: the error that explains it was raised, not this one
        self.closed = True
        self.sock.close()


def explain(f: StompFrame) -> str:
    """What an ERROR (or unexpected) frame says."""
    text = f.headers.get("message") or bytes(f.body[:200]).decode(errors="replace")
    return f"{f.command}: {text}" if f.command != "ERROR" else text
