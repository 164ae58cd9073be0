"""The sans-I/O STOMP frame parser (segmenter/brokers/stomp_client.py): any split of the byte stream gives
the same frames; hostile frames raise before anything is allocated for them. The client itself is
tested against a real ActiveMQ in tests/brokers/test_activemq.py and tests/brokers/test_drain.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from segmenter.brokers.recycle import BufferPool
from segmenter.brokers.stomp_client import MAX_HEADER_BLOCK, StompError, StompFrame, StompParser, escape, frame

_text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)
_frames = st.lists(
    st.tuples(
        st.sampled_from(["MESSAGE", "RECEIPT", "ERROR", "CONNECTED"]),
        st.dictionaries(_text.filter(lambda k: k not in ("", "content-length")), _text, max_size=4),
        st.binary(max_size=3000),
        st.booleans(),  # with a content-length (bodies may then hold NULs) or without
        st.sampled_from([b"", b"\n", b"\r\n\n"]),  # EOLs (heart-beats) after the frame
    ),
    max_size=6,
)


def _encode(command: str, headers: dict[str, str], body: bytes, length: bool) -> bytes:
    if length:
        headers = {"content-length": str(len(body)), **headers}
    return frame(command, headers, body)


@settings(max_examples=150, deadline=None)
@given(_frames, st.lists(st.integers(1, 5000), max_size=20), st.booleans())
def test_any_split_gives_the_same_frames(
    frames: list[tuple[str, dict[str, str], bytes, bool, bytes]], cuts: list[int], pool_all: bool
) -> None:
    """``pool_all``: every body through the buffer pool (by default only bodies of 16 KiB or more),
    the frames held to the end, so no buffer may be lent twice."""
    wire = b""
    want = []
    for command, headers, body, length, eols in frames:
        if not length:
            body = body.replace(b"\x00", b"")
        wire += _encode(command, headers, body, length) + eols
        expected = {"content-length": str(len(body)), **headers} if length else headers
        want.append(StompFrame(command, expected, body))
    parser = StompParser(pool=BufferPool(min_size=0)) if pool_all else StompParser()
    got: list[StompFrame] = []
    at = 0
    for cut in cuts:
        got += parser.feed(wire[at : at + cut])
        at += cut
    got += parser.feed(wire[at:])
    assert got == want


def test_a_body_larger_than_one_read_and_a_frame_across_reads() -> None:
    body = bytes(range(256)) * 5000  # NULs throughout, longer than READ_SIZE
    wire = _encode("MESSAGE", {"ack": "ID:1:2"}, body, True) * 3
    parser = StompParser()
    got = parser.feed(wire[:1_000_000]) + parser.feed(wire[1_000_000:])
    assert [f.body for f in got] == [body] * 3 and got[0].headers["ack"] == "ID:1:2"


def test_headers_are_unescaped_and_the_first_of_repeated_ones_wins() -> None:
    raw = b"MESSAGE\nk:a\\cb\\\\c\\nd\\re\nk:second\nplain:x\n\nz\x00"
    (f,) = StompParser().feed(raw)
    assert f.headers == {"k": "a:b\\c\nd\re", "plain": "x"} and f.body == b"z"
    assert escape("a:b\\c\nd\re") == b"a\\cb\\\\c\\nd\\re"


@pytest.mark.parametrize(
    ("wire", "words"),
    [
        (b"MESSAGE\ncontent-length:99999999999\n\n", "content-length refused"),
        (b"MESSAGE\ncontent-length:-1\n\n", "content-length refused"),
        ("MESSAGE\ncontent-length:\u00b2\n\nx\x00".encode(), "content-length refused"),  # str.isdigit: True
        ("MESSAGE\ncontent-length:\u0661\n\nx\x00".encode(), "content-length refused"),  # Arabic-Indic one
        (b"MESSAGE\ncontent-length:" + b"0" * 5000 + b"\n\nx\x00", "content-length refused"),  # int() refuses
        (b"MESSAGE\nk:abc\\\n\n\x00", "undefined escape"),  # a trailing backslash
        (b"MESSAGE\ncontent-length:2\n\nabc\x00", "not terminated by NUL"),
        (b"MESSAGE\nk:\\t\n\n\x00", "undefined escape"),
        (b"MESSAGE\nno colon\n\n\x00", "without a colon"),
        (b"MESSAGE\nk:\xff\n\n\x00", "not UTF-8"),
        (b"MESSAGE\nk:" + b"v" * MAX_HEADER_BLOCK, "header block too long"),
        (b"MESSAGE\n\n" + b"v" * 2000, "without content-length too long"),
    ],
)
def test_hostile_frames_raise(wire: bytes, words: str) -> None:
    with pytest.raises(StompError, match=words):
        StompParser(max_body=1000).feed(wire)


def test_no_broker_is_a_connection_broken_error() -> None:
    import socket

    from segmenter.brokers import BrokerError, open_consumer, open_sender
    from segmenter.errors import Reason

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once it is closed
    for opener in (open_sender, open_consumer):
        with pytest.raises(BrokerError) as err:
            opener(f"stomp://127.0.0.1:{port}", "q")
        assert err.value.reason == Reason.CONNECTION_BROKEN


@pytest.mark.parametrize(
    ("frame", "says"),
    [
        (b"MESSAGE\ndestination:/queue/q\nmessage-id:1\nsubscription:1\ncontent-length:1\n\nx\x00",
         "without an ack header"),
        # a body with a NUL and no content-length: its tail is read as the next frame's command
        (b"MESSAGE\ndestination:/queue/q\nmessage-id:1\nack:1\nsubscription:1\n\nab\x00cd"
         b"MESSAGE\ndestination:/queue/q\nmessage-id:2\nack:2\nsubscription:1\ncontent-length:1\n\nx\x00",
         "out of step"),
    ],
)  # fmt: skip
def test_a_frame_that_cannot_be_settled_is_a_broker_error_never_skipped(frame: bytes, says: str) -> None:
    """Our subscription asks for client-individual acks: a MESSAGE frame without an ``ack`` header
    (a broker bug or something else on the port) could never be settled; ``fetch`` says so. A frame
    a server may not send (the tail of a misframed body) means the stream is out of step: skipping
    it would lose a message without a word."""
    import socket
    import threading

    from segmenter.brokers import BrokerError, open_consumer

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def broker() -> None:
        conn, _ = server.accept()
        with conn:
            parser = StompParser()
            commands: list[str] = []
            while "SUBSCRIBE" not in commands:
                data = conn.recv(65536)
                if not data:
                    return
                new = [f.command for f in parser.feed(data)]
                if {"CONNECT", "STOMP"} & set(new):
                    conn.sendall(b"CONNECTED\nversion:1.2\nheart-beat:0,0\n\n\x00")
                commands += new
            conn.sendall(frame)
            conn.recv(65536)  # until the client goes away

    thread = threading.Thread(target=broker, daemon=True)
    thread.start()
    consumer = open_consumer(f"stomp://127.0.0.1:{server.getsockname()[1]}", "q")
    try:
        with pytest.raises(BrokerError, match=says):
            for _ in range(50):
                consumer.fetch(0.1)
    finally:
        consumer.close()
        server.close()
