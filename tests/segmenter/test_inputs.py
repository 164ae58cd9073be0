"""What the producers take: odd arguments, typed buffers and sources that read short or not at all.

Each case here once produced wrong output without an error (a GroupId padded or cut on the wire,
a typed buffer counted in items, an object cut short at a pipe's short read and flagged complete,
a refused group member that used up its MsgSeqNumber) or let a foreign exception escape.
"""

from __future__ import annotations

import io
from array import array
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reassembly import reassemble, reassemble_all
from refmsg import Chunker, assemble_chunks, decode_message
from refmsg.claimcheck import DirectoryStore, offload, resolve
from refmsg.core import ChunkRow
from refmsg.header import FORMAT_REF_MSG_HEADER
from segmenter import Codec, SegmentationError, Segmenter, segment, segment_group
from segmenter.errors import HeaderError, Reason
from segmenter.flags import MsgFlags
from segmenter.properties import from_jms, from_kafka, jms_properties, kafka_headers
from segmenter.wire import check_prefix, decode_segment


class Trickle(io.RawIOBase):
    """A pipe or socket: at most ``step`` bytes per read, and ``None`` (no data yet) where asked."""

    def __init__(self, data: bytes, step: int, stall_at: int | None = None) -> None:
        self.data, self.step, self.pos, self.stall_at = data, step, 0, stall_at

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes | None:  # type: ignore[override]
        if self.stall_at is not None and self.pos >= self.stall_at:
            self.stall_at = None
            return None
        out = self.data[self.pos : self.pos + min(size, self.step)]
        self.pos += len(out)
        return out


def _reason(call: Any) -> Reason:
    with pytest.raises(SegmentationError) as err:
        call()
    return err.value.reason


@pytest.mark.parametrize("gid", [b"", b"abc", b"G" * 23, b"G" * 25, b"G" * 48, "G" * 24, 24, bytes(range(24))[::2]])
def test_a_group_id_of_another_length_or_type_is_refused_never_padded_or_cut(gid: Any) -> None:
    """b"abc" went out as b"abc" and 21 NULs; two 25-byte ids differing in the last byte became one group."""
    s = Segmenter(200)
    for call in (
        lambda: segment(b"x", 200, group_id=gid),
        lambda: list(s.segment(b"x", group_id=gid)),
        lambda: segment_group([b"a", b"b"], 200, group_id=gid),
        lambda: s.message_writer(group_id=gid),
        lambda: s.group_writer(group_id=gid),
    ):
        assert _reason(call) == Reason.GROUP_ID_ERROR


def test_a_group_id_given_as_any_buffer_of_24_bytes_is_taken() -> None:
    for gid in (b"G" * 24, bytearray(b"G" * 24), memoryview(b"G" * 24)):
        (seg,) = segment(b"payload", 200, group_id=gid)  # type: ignore[arg-type]
        assert decode_segment(seg.encode()).header.group_id == b"G" * 24


@pytest.mark.parametrize("seq", [0, -1, 10**9, 2.5, True, "1", None])
def test_a_sequence_number_outside_mq_range_or_not_whole_is_refused(seq: Any) -> None:
    assert _reason(lambda: Segmenter(200).segment(b"x", msg_seq_number=seq)) == Reason.MSG_SEQ_NUMBER_ERROR


@pytest.mark.parametrize(
    "flags", [MsgFlags.LAST_SEGMENT, MsgFlags.SEGMENT, MsgFlags.SEGMENTATION_ALLOWED, 0x100, -1, True]
)
def test_group_flags_hold_only_the_group_bits(flags: Any) -> None:
    """LAST_SEGMENT gave three segments the decoder refused (2252), 0x100 three refused as 2249."""
    assert _reason(lambda: Segmenter(200).segment(b"x" * 300, group_flags=flags)) == Reason.MSG_FLAGS_ERROR


@pytest.mark.parametrize("flags", [0, MsgFlags.MSG_IN_GROUP, MsgFlags.LAST_MSG_IN_GROUP])
def test_the_group_bits_travel_and_decode(flags: int) -> None:
    segs = list(Segmenter(200).segment(b"x" * 300, group_flags=flags))
    assert all(decode_segment(s.encode()).header.msg_flags & 0x18 == flags for s in segs)


@pytest.mark.parametrize(
    "options",
    [
        {"max_segment_size": 84},
        {"max_segment_size": 200.0},
        {"max_segment_size": True},
        {"max_segment_size": 84 + (1 << 32)},  # DataLength is 4 bytes: struct.error at pack time
        {"codec": 7},
        {"codec": Codec.ZSTD, "level": 30},
        {"codec": Codec.ZSTD, "level": 2.0},
        {"segmentation_allowed": "yes"},
        {"digest": "sha256"},
    ],
)
def test_options_the_wire_cannot_carry_are_refused_when_made(options: dict[str, Any]) -> None:
    with pytest.raises(SegmentationError) as err:
        Segmenter(**{"max_segment_size": 200, **options})
    assert err.value.reason == Reason.ARGUMENT_ERROR


@pytest.mark.parametrize("payload", ["text", 3, None, [b"a"], 2.5])
def test_a_payload_that_is_not_bytes_is_refused(payload: Any) -> None:
    assert _reason(lambda: segment(payload, 200)) == Reason.ARGUMENT_ERROR
    assert _reason(lambda: Segmenter(200).message_writer().write(payload)) == Reason.ARGUMENT_ERROR


@pytest.mark.parametrize("codec", [Codec.NONE, Codec.ZSTD])
def test_typed_and_strided_buffers_are_their_bytes_in_every_entry_point(codec: Codec) -> None:
    """An array('I') view counted 50 for 200 bytes in the writer (its message refused: 2252 / 9011);
    a strided view raised TypeError / BufferError."""
    s = Segmenter(120, codec=codec)
    for buf in (
        memoryview(array("I", range(50))),
        memoryview(bytes(range(200)))[::3],
        memoryview(array("d", [1.5] * 9)),
    ):
        expected = buf.tobytes()
        assert reassemble([x.encode() for x in s.segment(buf)]) == expected
        w = s.message_writer()
        segs = w.write(buf) + w.close()
        assert reassemble([x.encode() for x in segs]) == expected
        assert decode_segment(segs[-1].encode()).header.original_length == len(expected)


@pytest.mark.parametrize("step", [1, 7, 999])
def test_short_reads_are_not_the_end_of_a_source(step: int) -> None:
    """A pipe returning what it has: the Chunker took the first short read for the end and sent
    a LAST chunk whose object length and checksum vouched for the truncated object."""
    data = bytes(range(256)) * 40
    msgs = list(Chunker(max_length=1000).messages(Trickle(data, step), "o"))
    rows = []
    for m in msgs:
        assert m.integrity is not None
        rows.append(ChunkRow(m.offset, m.length, bytes(m.data), m.is_last, m.integrity.chunk_checksum,
                             m.integrity.object_checksum, object_length=m.integrity.object_length))  # fmt: skip
    assert assemble_chunks(rows) == data and sum(m.is_last for m in msgs) == 1
    assert reassemble([s.encode() for s in Segmenter(500).segment(Trickle(data, step))]) == data


def test_a_source_with_no_data_yet_is_an_error_never_the_end() -> None:
    """``read() -> None`` (a non-blocking source) ended the message: 1,000 of 2,000 bytes delivered
    as a complete, verified message."""
    data = b"z" * 2000
    with pytest.raises(SegmentationError) as err:
        list(Segmenter(300).segment(Trickle(data, 1000, stall_at=1000)))
    assert err.value.reason == Reason.ARGUMENT_ERROR
    with pytest.raises(SegmentationError):
        list(Chunker(max_length=1500).messages(Trickle(data, 1000, stall_at=1000), "o"))
    with pytest.raises(SegmentationError):  # a text file: str is not bytes
        list(Segmenter(300).segment(io.StringIO("text")))  # type: ignore[arg-type]


def test_a_refused_group_member_uses_up_no_sequence_number() -> None:
    gw = Segmenter(200).group_writer()
    segs = list(gw.add(b"first"))
    with pytest.raises(SegmentationError):
        gw.add("not bytes")  # type: ignore[arg-type]
    with pytest.raises(SegmentationError):
        gw.add(None, last=True)  # type: ignore[arg-type]
    segs += list(gw.add(b"second", last=True))  # the refused LAST did not end the group
    assert [s.header.msg_seq_number for s in segs] == [1, 2]
    assert reassemble_all([s.encode() for s in segs]) == [b"first", b"second"]


def test_offload_counts_bytes_and_refuses_the_reference_format_inline(tmp_path: Any) -> None:
    """A typed view is measured in bytes, not items: an array('Q') of 100,000 items is 800,000 bytes,
    which its claim must declare (100,000 would make resolve refuse it, 9019), and 40,000 items
    (320,000 bytes) are past the 256 KiB inline threshold, so they go to the store too."""
    store = DirectoryStore(tmp_path, fsync=False)
    for n in (40_000, 100_000):
        buf = memoryview(array("Q", range(n)))
        msg = offload(buf, store)
        assert msg.format == FORMAT_REF_MSG_HEADER and resolve(msg, store) == buf.tobytes()
    small = memoryview(array("H", range(10)))
    assert resolve(offload(small, store), store) == small.tobytes()
    with pytest.raises(SegmentationError) as err:  # every inline payload would read as a reference
        offload(b"small", store, inline_format=FORMAT_REF_MSG_HEADER)
    assert err.value.reason == Reason.ARGUMENT_ERROR


def test_broker_properties_a_hostile_producer_can_send_give_our_error() -> None:
    (seg,) = segment(b"data", 200)
    headers, props = kafka_headers(seg), jms_properties(seg)
    assert from_kafka(headers, seg.data).data == b"data" and from_jms(props, seg.data).data == b"data"
    cases = [
        lambda: from_kafka([(k, None) for k, _ in headers], seg.data),  # a null header value (legal in Kafka)
        lambda: from_kafka(headers, None),  # a tombstone
        lambda: from_kafka([(k, v.decode("latin-1")) for k, v in headers], seg.data),  # type: ignore[misc]
        lambda: from_jms(props, "data"),  # type: ignore[arg-type]
        lambda: from_jms(props, None),
        lambda: check_prefix(b"SGMT"),
    ]
    for case in cases:
        with pytest.raises(HeaderError):
            case()


ANYTHING = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.text(max_size=30),
    st.binary(max_size=40),
    st.sampled_from([Codec.ZSTD, Codec.NONE, MsgFlags.MSG_IN_GROUP, b"G" * 24, 200, 1000]),
)


@settings(max_examples=300)
@given(ANYTHING, ANYTHING, ANYTHING, ANYTHING, ANYTHING, ANYTHING)
def test_any_arguments_either_round_trip_or_raise_our_error(
    payload: Any, size: Any, codec: Any, gid: Any, seq: Any, flags: Any
) -> None:
    """Whatever the producer is given: segments that decode back to the payload's bytes, or a
    SegmentationError with a reason, never another exception."""
    try:
        segs = [
            s.encode()
            for s in Segmenter(size, codec=codec).segment(payload, group_id=gid, msg_seq_number=seq, group_flags=flags)
        ]
    except SegmentationError as err:
        assert isinstance(err.reason, Reason)
        return
    assert all(len(s) <= size for s in segs)
    assert b"".join(decode_segment(s).data.tobytes() for s in segs if codec != Codec.ZSTD) in (b"", bytes(payload))
    if not flags:  # a message not in a group reassembles alone
        assert reassemble(segs) == bytes(payload)


def test_decode_message_of_a_chunk_from_a_trickling_source() -> None:
    """The chunk boundaries are the Chunker's, not the source's reads."""
    msgs = list(Chunker(max_length=1000).encode(Trickle(b"q" * 2500, 300), "o"))
    assert [decode_message(m).message.length for m in msgs] == [1000, 1000, 500]


def test_a_source_returning_more_than_asked_is_an_error_never_a_short_object() -> None:
    """read(n) returning n+3 bytes: the Chunker sent one chunk of 103 bytes flagged LAST (out of
    10,240), its checksums vouching for the truncated object."""

    class Overread(io.RawIOBase):
        def readable(self) -> bool:
            return True

        def read(self, size: int = -1) -> bytes:  # type: ignore[override]
            return b"o" * (size + 3)

    with pytest.raises(SegmentationError) as err:
        list(Chunker(max_length=100).messages(Overread(), "o"))
    assert err.value.reason == Reason.ARGUMENT_ERROR
