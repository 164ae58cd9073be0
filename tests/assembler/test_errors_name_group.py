"""An error the assembler reports about a segment names its message's GroupId (hex), in the message and
in ``details["group_id"]``: an offset alone cannot be traced back when several groups are in flight."""

from __future__ import annotations

import pickle

import pytest

from reassembly import Assembler, ChecksumMismatch, ConflictingDuplicate, Rejected, reassemble_all
from segmenter import HEADER_LENGTH, SegmentationError, segment

GID = bytes(range(24))
PAYLOAD = bytes(range(256)) * 4


def _damaged_data() -> list[bytes]:
    segs = [s.encode() for s in segment(PAYLOAD, max_segment_size=HEADER_LENGTH + 256, group_id=GID)]
    segs[1] = segs[1][:-1] + bytes([segs[1][-1] ^ 1])
    return segs


def test_a_data_checksum_error_names_the_offset_and_the_group() -> None:
    events = Assembler().receive_many(_damaged_data())
    bad = [e for e in events if isinstance(e, ChecksumMismatch)]
    assert len(bad) == 1
    text = str(bad[0].error)
    assert "offset 256" in text and f"(GroupId {GID.hex()})" in text
    assert bad[0].error.details["group_id"] == GID.hex() and bad[0].error.details["offset"] == 256


def test_the_one_shot_functions_raise_it_named() -> None:
    with pytest.raises(SegmentationError, match=f"offset 256 .*GroupId {GID.hex()}"):
        reassemble_all(_damaged_data())


def test_an_overlap_and_a_conflicting_copy_name_the_group() -> None:
    """Pieces of one message cut two ways (same GroupId): those not used overlap the winners or
    claim a used offset with other bytes."""
    small = segment(PAYLOAD, max_segment_size=HEADER_LENGTH + 256, group_id=GID)
    large = segment(PAYLOAD, max_segment_size=HEADER_LENGTH + 384, group_id=GID)
    asm = Assembler()
    events = asm.receive_many([s.encode() for s in (*small, large[1])]) + asm.close()
    refused = [e for e in events if isinstance(e, (Rejected, ConflictingDuplicate))]
    assert refused, events
    for e in refused:
        assert "offset" in e.error.details and e.error.details["group_id"] == GID.hex()
        assert str(e.error).endswith(f"(GroupId {GID.hex()})")


def test_other_bytes_after_delivery_name_the_group_and_the_name_survives_pickling() -> None:
    """A segment of a delivered message with other bytes at the same offset; Spark ships errors between
    processes by pickling them: the name goes along, once."""
    segs = [s.encode() for s in segment(PAYLOAD, max_segment_size=HEADER_LENGTH + 256, group_id=GID)]
    other = segment(PAYLOAD[::-1], max_segment_size=HEADER_LENGTH + 256, group_id=GID)
    asm = Assembler()
    asm.receive_many(segs)
    events = asm.receive_many([other[0].encode()])
    assert [type(e) for e in events] == [ConflictingDuplicate]
    err = events[0].error
    assert str(err).startswith("[9012 CONFLICTING_DUPLICATE] different bytes for offset 0 of delivered message 1")
    copy = pickle.loads(pickle.dumps(err))
    assert str(copy) == str(err) and str(err).count("GroupId") == 1
    assert copy.details["group_id"] == GID.hex()
    err.name_group(b"\xff" * 24)  # named once: a second name changes nothing
    assert str(err).count("GroupId") == 1 and err.details["group_id"] == GID.hex()
