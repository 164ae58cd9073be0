"""The commit metadata: which offsets above a committed one are already settled.

A partition's commit stays at the first segment of the oldest unsettled message, so every message
settled above it is handled again after a restart. The record written beside the commit (Kafka
keeps a short text per committed partition, 4096 bytes by default) lists the settled offsets above
it as ranges, so a restarted consumer skips them: fewer duplicates, never a loss, because a range
that does not fit is left out (its messages come again) and a record that cannot be trusted is
ignored whole.

The text: ``sr1:`` and the standard base64 of unsigned LEB128 varints: the commit, the number of
ranges, then per range the gap from the previous end (from the commit for the first) and the
length. Ranges are inclusive ``(lo, hi)``, ascending, disjoint and not adjacent, all above the
commit.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence

from segmenter.errors import Reason, SegmentationError

__all__ = ["PREFIX", "decode", "encode"]

PREFIX = "sr1:"  # the record's format and version: anything else is not ours
# What a reader accepts at most: more ranges than the largest limit can hold is not ours.
_MAX_RANGES = 1 << 16


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _checked(commit: int, ranges: Sequence[tuple[int, int]]) -> None:
    if commit < 0:
        raise SegmentationError(f"a commit is an offset >= 0, not {commit}", reason=Reason.ARGUMENT_ERROR)
    previous = commit - 1  # the first range starts above the commit: lo >= previous + 2
    for lo, hi in ranges:
        if not (lo >= previous + 2 and hi >= lo):
            raise SegmentationError(
                f"ranges must be ascending, disjoint, not adjacent and above {commit}: {list(ranges)[:8]}",
                reason=Reason.ARGUMENT_ERROR,
            )
        previous = hi


def encode(commit: int, ranges: Sequence[tuple[int, int]], limit: int = 4000) -> tuple[str, int]:
    """The record of ``ranges`` (settled offsets above ``commit``) in at most ``limit`` bytes, and
    how many ranges it keeps.

    Ranges are dropped from the high end until the text fits: the lowest ones save the most work
    after a restart (the commit moves up through them first). A limit too small for even the empty
    record gives ``("", 0)``: no record. Ranges that are not ascending, disjoint, non-adjacent and
    above the commit are a caller's error (``SegmentationError`` 9020): the record would skip offsets that
    were never settled.
    """
    _checked(commit, ranges)
    head = _varint(commit)
    pairs: list[bytes] = []
    previous = commit - 1
    for lo, hi in ranges:
        pairs.append(_varint(lo - previous - 2) + _varint(hi - lo))
        previous = hi
    budget = limit - len(PREFIX)

    def size(kept: int) -> int:
        raw = len(head) + len(_varint(kept)) + sum(len(p) for p in pairs[:kept])
        return 4 * ((raw + 2) // 3)

    if budget < size(0):
        return "", 0
    # the size grows with the count kept: the longest prefix that fits, found by halving
    low, high = 0, len(pairs)
    while low < high:
        mid = (low + high + 1) // 2
        if size(mid) <= budget:
            low = mid
        else:
            high = mid - 1
    body = head + _varint(low) + b"".join(pairs[:low])
    return PREFIX + base64.b64encode(body).decode("ascii"), low


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data):
            raise ValueError("the record ends inside a number")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if byte == 0 and shift:
                raise ValueError("a number not written in its shortest form")  # not what encode writes
            return value, at
        shift += 7
        if shift > 63:
            raise ValueError("a number longer than 64 bits")


def decode(text: str | None, commit: int, log_end: int | None) -> tuple[list[tuple[int, int]], str | None]:
    """The settled ranges a record lists, or ``([], why)`` when it cannot be trusted.

    No record (``None`` or ``""``, what a commit without metadata carries) is ``([], None)``. A
    text written by another tool, malformed, written for another commit than the one it sits
    beside, or naming offsets at or past ``log_end`` (the partition's end: offsets that do not
    exist were never settled) is refused whole: skipping a message on a wrong record is a loss,
    reading it again is only a duplicate. Nothing but the two answers comes out, whatever the text.

    ``text``: the commit's metadata. ``commit``: the offset committed beside it. ``log_end``: the partition's end offset
    (None: not known, not checked).
    """
    if not text:
        return [], None
    if not isinstance(text, str) or not text.startswith(PREFIX):
        return [], "not a settled-offsets record (no 'sr1:' prefix): written by another tool"
    try:
        data = base64.b64decode(text[len(PREFIX) :].encode("ascii"), validate=True)
        written_for, at = _read_varint(data, 0)
        count, at = _read_varint(data, at)
        if count > _MAX_RANGES:
            raise ValueError(f"{count} ranges, more than a record holds")
        ranges: list[tuple[int, int]] = []
        previous = written_for - 1
        for _ in range(count):
            gap, at = _read_varint(data, at)
            length, at = _read_varint(data, at)
            lo = previous + 2 + gap
            ranges.append((lo, lo + length))
            previous = lo + length
        if at != len(data):
            raise ValueError(f"{len(data) - at} bytes after the last range")
    except (ValueError, UnicodeEncodeError, binascii.Error) as exc:
        return [], f"malformed settled-offsets record: {exc}"
    if written_for != commit:
        return [], f"the record was written for commit {written_for}, not for {commit}"
    if log_end is not None and ranges and ranges[-1][1] >= log_end:
        return [], f"the record names offset {ranges[-1][1]}, at or past the log end {log_end}"
    return ranges, None
