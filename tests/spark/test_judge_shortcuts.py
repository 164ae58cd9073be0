"""The receive path's shortcuts give exactly what the general code gives.

* a plain chain of pieces (``Message.chain``) is judged without the tiling search: its candidates
  must be the search's, for any multiset of pieces (copies, overlaps, gaps, forged facts);
* the message checksum is combined from the pieces' CRCs: it must equal the CRC of the bytes;
* a broker receiver hands the assembler the delivery's bytes and learns the header through
  ``seen``: the events are those of a plain ``receive``, and ``seen`` sees exactly the segments
  that decoded.
"""

from __future__ import annotations

import itertools
from dataclasses import fields, is_dataclass
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from reassembly import Assembler
from reassembly.assembler.build import _combined_checksum
from reassembly.assembler.model import Facts, Message, Piece
from reassembly.assembler.rules import _candidates, agree, canonical, fits
from reassembly.storage.filestore import FileBodyStore
from segmenter import ChecksumAlgorithm, Codec, MsgFlags, Segment, SegmentationError
from segmenter.checksum import checksum
from segmenter.coverage import tilings
from segmenter.wire import SegmentHeader, decode_segment, make_header

GID = bytes(range(24))


def cut(
    payload: bytes, bounds: list[int], algorithm: ChecksumAlgorithm, *, every_crc: bool = False, stored: int = -1
) -> list[Segment]:
    """``payload`` cut at ``bounds`` (sorted, inside it); the last piece LAST and carrying the message
    checksum (every piece with ``every_crc``); ``stored`` forges the stored length of the last piece."""
    edges = [0, *bounds, len(payload)]
    crc = checksum(algorithm, payload)
    out = []
    for i, (a, b) in enumerate(itertools.pairwise(edges)):
        last = i == len(edges) - 2
        h = make_header(
            group_id=GID,
            msg_seq_number=1,
            offset=a,
            data=payload[a:b],
            original_length=len(payload),
            stored_length=len(payload) if stored < 0 or not last else stored,
            msg_flags=MsgFlags.SEGMENT | (MsgFlags.LAST_SEGMENT if last else 0),
            codec=Codec.NONE,
            algorithm=algorithm,
            message_checksum=crc if last or every_crc else None,
        )
        out.append(Segment(h, payload[a:b]))
    return out


def message(segments: list[Segment]) -> Message:
    msg = Message(GID, 1)
    for s in segments:
        msg.add(Piece(s.header, s.data, s.header.pack()))
    return msg


def searched(msg: Message) -> tuple[list[tuple[tuple[Piece, ...], Facts]], bool]:
    """What the tiling search finds (the general path, no shortcut)."""
    pieces = canonical(msg)
    return tilings(pieces, fits, Facts(), agree=agree(pieces))


@st.composite
def piece_sets(draw: st.DrawFn) -> list[Segment]:
    """One or more cuts of one or two payloads, some pieces dropped or repeated."""
    n = draw(st.integers(1, 40))
    payloads = [draw(st.binary(min_size=n, max_size=n))]
    if draw(st.booleans()):
        payloads.append(draw(st.binary(min_size=n, max_size=n)))
    algorithm = draw(st.sampled_from(list(ChecksumAlgorithm)))
    segments: list[Segment] = []
    for _ in range(draw(st.integers(1, 3))):
        payload = draw(st.sampled_from(payloads))
        bounds = sorted(draw(st.sets(st.integers(1, n - 1), max_size=6))) if n > 1 else []
        stored = draw(st.sampled_from([-1, -1, -1, n + 1]))
        segments += cut(payload, bounds, algorithm, every_crc=draw(st.booleans()), stored=stored)
    kept = [s for s in segments if draw(st.integers(0, 5))]  # drop about one in six
    return kept + draw(st.lists(st.sampled_from(kept), max_size=2)) if kept else segments[:1]


@settings(max_examples=150, deadline=None)
@given(piece_sets())
def test_a_plain_chain_is_judged_as_the_search_would(segments: list[Segment]) -> None:
    msg = message(segments)
    assert _candidates(msg) == searched(msg)


@settings(max_examples=60, deadline=None)
@given(st.binary(min_size=1, max_size=3000), st.data(), st.sampled_from(list(ChecksumAlgorithm)))
def test_a_plain_chain_takes_the_shortcut(payload: bytes, data: st.DataObject, algorithm: ChecksumAlgorithm) -> None:
    bounds = sorted(data.draw(st.sets(st.integers(1, len(payload) - 1), max_size=9))) if len(payload) > 1 else []
    msg = message(cut(payload, bounds, algorithm))
    chain = msg.chain()
    assert chain is not None and [p.offset for p in chain] == [0, *bounds]
    assert _candidates(msg) == searched(msg)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(max_size=700), min_size=1, max_size=12), st.sampled_from(list(ChecksumAlgorithm)))
def test_the_combined_message_checksum_is_the_crc_of_the_bytes(pieces: list[bytes], algo: ChecksumAlgorithm) -> None:
    payload = b"".join(pieces)
    edges = [0]
    for p in pieces:
        edges.append(edges[-1] + len(p))
    segs = []
    for a, b in itertools.pairwise(edges):
        h: SegmentHeader = make_header(
            group_id=GID,
            msg_seq_number=1,
            offset=a,
            data=payload[a:b],
            original_length=len(payload),
            stored_length=len(payload),
            msg_flags=MsgFlags.SEGMENT,
            codec=Codec.NONE,
            algorithm=algo,
            message_checksum=None,
        )
        segs.append(Piece(h, payload[a:b], h.pack()))
    facts = Facts(Codec.NONE, algo)
    assert _combined_checksum(facts, tuple(segs)) == checksum(algo, payload)


def comparable(ev: object) -> tuple[object, ...]:
    """An event as plain values (a payload view as bytes, an error as its class and text)."""
    out: list[object] = [type(ev).__name__]
    for f in fields(ev):  # type: ignore[arg-type]
        v = getattr(ev, f.name)
        if isinstance(v, memoryview):
            v = bytes(v)
        elif isinstance(v, Exception):
            v = (type(v).__name__, str(v))
        elif isinstance(v, tuple) and v and is_dataclass(v[0]):
            v = tuple(comparable(x) for x in v)
        out.append(v)
    return tuple(out)


@settings(max_examples=60, deadline=None)
@given(piece_sets(), st.lists(st.binary(max_size=120), max_size=3))
def test_seen_reports_every_decoded_segment_and_changes_no_event(segments: list[Segment], junk: list[bytes]) -> None:
    raws = [s.encode() for s in segments] + junk
    plain, watched = Assembler(), Assembler()
    limits = plain.limits
    heard: list[SegmentHeader] = []
    for raw in raws:
        expected = plain.receive(raw)
        got = watched.receive(raw, seen=heard.append)
        assert [comparable(e) for e in got] == [comparable(e) for e in expected]
        try:
            header = decode_segment(
                raw, max_segment_size=limits.max_segment_size, max_message_size=limits.max_message_size
            ).header
        except SegmentationError:
            header = None
        assert heard == ([] if header is None else [header])  # once per decoded segment, never otherwise
        heard.clear()


def _two_byte_pieces(n: int, order: str) -> tuple[bytes, list[bytes]]:
    """A 2n+2-byte message as overlapping 2-byte pieces: odd ones covering it and the LAST piece
    first (the message is ready, no chain from 0), then the even ones that complete a chain."""
    end = 2 * n + 2
    payload = bytes(i % 251 for i in range(end))
    crc = checksum(ChecksumAlgorithm.CRC32, payload)

    def piece(offset: int, last: bool = False) -> bytes:
        flags = MsgFlags.SEGMENT | (MsgFlags.LAST_SEGMENT if last else 0)
        h = make_header(group_id=GID, msg_seq_number=1, offset=offset, data=payload[offset : offset + 2],
                        original_length=end, stored_length=end, msg_flags=flags, codec=Codec.NONE,
                        algorithm=ChecksumAlgorithm.CRC32, message_checksum=crc if last else None)  # fmt: skip
        return Segment(h, payload[offset : offset + 2]).encode()

    first = [piece(0), piece(end - 2, last=True), *(piece(o) for o in range(1, end - 2, 2))]
    evens = list(range(2, end - 2, 2))
    return payload, first + [piece(o) for o in (evens if order == "up" else evens[::-1])]


def test_the_streaming_search_runs_only_when_a_piece_can_change_its_outcome() -> None:
    """Many tiny overlapping segments: run at every arrival once the LAST piece's range is covered,
    the search (and an agreement check over every held piece) would cost O(n) each. Agreement is
    kept as pieces arrive, and the search runs only when the new piece is reachable from offset 0
    and some LAST piece's end is: here once per message."""
    import reassembly.assembler.rules as rules

    calls = {"n": 0}
    search = rules.tilings

    def counted(*args: object, **kwargs: object) -> object:
        calls["n"] += 1
        return search(*args, **kwargs)  # type: ignore[arg-type]

    for order in ("up", "down"):
        payload, segments = _two_byte_pieces(2000, order)
        calls["n"] = 0
        rules.tilings = counted  # type: ignore[assignment]
        try:
            events = Assembler().receive_many(segments)
        finally:
            rules.tilings = search
        done = [e for e in events if type(e).__name__ == "MessageComplete"]
        assert len(done) == 1 and bytes(done[0].payload) == payload, order
        assert calls["n"] <= 2, (order, calls["n"])
        batch = Assembler(batch=True)
        judged = batch.receive_many(segments) + batch.close()
        assert [bytes(e.payload) for e in judged if type(e).__name__ == "MessageComplete"] == [payload]


def _overlapping_pieces(n: int) -> tuple[list[bytes], list[bytes]]:
    """(a message of n bytes in 2- and 4-byte pieces at even offsets whose LAST piece declares
    another checksum, so no assembly passes; one unreachable piece at offset 1 that disagrees),
    and (two disagreeing copies at every even offset but the last, the LAST end unreachable)."""
    payload = bytes(range(n))
    crc = checksum(ChecksumAlgorithm.CRC32, payload)

    def piece(offset: int, data: bytes, last: bool = False, mcrc: int | None = None) -> bytes:
        flags = MsgFlags.SEGMENT | (MsgFlags.LAST_SEGMENT if last else 0)
        h = make_header(group_id=GID, msg_seq_number=1, offset=offset, data=data, original_length=n, stored_length=n,
                        msg_flags=flags, codec=Codec.NONE, algorithm=ChecksumAlgorithm.CRC32,
                        message_checksum=mcrc)  # fmt: skip
        return Segment(h, data).encode()

    first = [piece(a, payload[a : a + w], mcrc=crc) for a in range(0, n - 2, 2) for w in (2, 4) if a + w <= n - 2]
    first += [piece(n - 2, payload[n - 2 :], last=True, mcrc=crc ^ 1), piece(1, bytes([payload[1] ^ 0xFF, payload[2]]))]
    second = [p for a in range(0, n - 2, 2) for p in (piece(a, payload[a : a + 2]), piece(a, bytes([a ^ 1, a + 1])))]
    second += [piece(n - 3, payload[n - 3 : n - 1]), piece(n - 1, payload[n - 1 :], last=True, mcrc=crc)]
    return first, second


def test_the_search_gate_decides_what_searching_at_every_arrival_would(tmp_path: Path) -> None:
    """The gate must not skip a search that could decide: an unreachable piece ending the agreement
    of a body in the store (agreement is not tracked there), and a piece making a message ready whose
    disagreeing copies cut the search off (a conflict). A skipped one would leave the message held (a
    snapshot its own restore refuses; at close an Unfinished labelled 2241). Both give batch mode's 9012."""
    for segments in _overlapping_pieces(40):
        batch = Assembler(batch=True)
        expected = [(type(e).__name__, e.reason) for e in batch.receive_many(segments) + batch.close()]
        assert expected == [("MessageFailed", 9012)]
        for store in (None, FileBodyStore(tmp_path / str(len(segments)), "t", threshold=0)):
            asm = Assembler(bodies=store)
            events = asm.receive_many(segments)
            assert [(type(e).__name__, e.reason) for e in events] == expected
            Assembler.restore(asm.snapshot(), bodies=store)  # restorable: nothing held
