"""The commit-metadata codec: what it writes fits, what it reads is trusted only when it is ours,
for this commit and inside the log."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reassembly.dispatcher.offsets import PREFIX, decode, encode
from segmenter import SegmentationError


@st.composite
def commits_and_ranges(draw: st.DrawFn) -> tuple[int, list[tuple[int, int]]]:
    commit = draw(st.integers(0, 2**40))
    ranges = []
    at = commit + 1
    for gap, length in draw(st.lists(st.tuples(st.integers(0, 2**20), st.integers(0, 2**16)), max_size=400)):
        lo = at + gap
        ranges.append((lo, lo + length))
        at = lo + length + 2
    return commit, ranges


@given(commits_and_ranges(), st.integers(0, 5000))
def test_round_trip_within_the_limit_keeping_the_lowest_ranges(
    case: tuple[int, list[tuple[int, int]]], limit: int
) -> None:
    commit, ranges = case
    text, kept = encode(commit, ranges, limit)
    assert len(text.encode()) <= limit
    if text == "":
        assert kept == 0 and decode(text, commit, None) == ([], None)
        return
    assert decode(text, commit, None) == (ranges[:kept], None)
    end = ranges[kept - 1][1] + 1 if kept else commit
    assert decode(text, commit, end) == (ranges[:kept], None)
    if kept < len(ranges):  # one more would not have fitted
        assert len(encode(commit, ranges[: kept + 1], 10**9)[0]) > limit


def test_the_default_limit_fits_kafkas_metadata_and_reports_what_it_kept() -> None:
    ranges = [(10 + 3 * i, 11 + 3 * i) for i in range(5000)]
    text, kept = encode(9, ranges)
    assert len(text) <= 4000 < 4096 and 0 < kept < 5000
    assert decode(text, 9, 10**6) == (ranges[:kept], None)
    assert encode(9, [], 4000)[1] == 0
    assert encode(9, ranges, 3) == ("", 0)  # not even the prefix fits: no record


def test_a_record_for_another_commit_or_past_the_log_end_is_refused() -> None:
    text, _ = encode(100, [(102, 104), (110, 110)])
    assert decode(text, 100, 111) == ([(102, 104), (110, 110)], None)
    ranges, why = decode(text, 101, 111)
    assert ranges == [] and why is not None and "commit 100" in why
    ranges, why = decode(text, 100, 110)  # offset 110 does not exist yet: never settled
    assert ranges == [] and why is not None and "log end" in why


@pytest.mark.parametrize(
    "text",
    [
        "some other tool's metadata",
        "sr1:",
        "sr1:!!!!",
        "sr1:" + base64.b64encode(b"\x80").decode(),  # ends inside a number
        "sr1:" + base64.b64encode(b"\x05\x02\x00").decode(),  # two ranges promised, less than one there
        "sr1:" + base64.b64encode(b"\x05\x00\x00").decode(),  # bytes after the last range
        "sr1:" + base64.b64encode(b"\xff" * 12).decode(),  # a number past 64 bits
        "sr1:" + base64.b64encode(b"\x05\xff\xff\x7f").decode(),  # more ranges than any record holds
        "sr1:" + base64.b64encode(b"\x85\x00\x00").decode(),  # a number not in its shortest form
        "sr1:é",
    ],
)
def test_foreign_and_malformed_records_are_refused_with_a_reason(text: str) -> None:
    ranges, why = decode(text, 5, None)
    assert ranges == [] and why


@given(st.text(max_size=200), st.integers(0, 2**40), st.none() | st.integers(0, 2**40))
def test_any_text_gives_an_answer_never_an_error(text: str, commit: int, log_end: int | None) -> None:
    ranges, why = decode(text, commit, log_end)
    assert (ranges == [] and (why is not None or text == "")) or why is None


@given(st.binary(max_size=200), st.integers(0, 300), st.none() | st.integers(0, 10**6))
def test_any_bytes_behind_the_prefix_give_an_answer_never_an_error(
    body: bytes, commit: int, log_end: int | None
) -> None:
    ranges, why = decode(PREFIX + base64.b64encode(body).decode(), commit, log_end)
    if why is None:  # accepted: then it is a well-formed record of this commit inside the log
        assert encode(commit, ranges, 10**9)[0] == PREFIX + base64.b64encode(body).decode()
        assert log_end is None or not ranges or ranges[-1][1] < log_end
    else:
        assert ranges == []


def test_ranges_that_would_skip_unsettled_offsets_are_a_callers_error() -> None:
    for commit, ranges in ((5, [(5, 6)]), (5, [(7, 6)]), (5, [(7, 8), (9, 10)]), (5, [(9, 10), (7, 8)]), (-1, [])):
        with pytest.raises(SegmentationError):
            encode(commit, ranges)
