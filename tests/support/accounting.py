"""Shared by the assembler tests: every segment that went in is accounted for by the events that came out."""

from __future__ import annotations

from collections import Counter

from reassembly import Duplicate, GroupComplete, GroupFailed, MessageComplete, MessageFailed, Rejected, Unfinished
from reassembly.assembler.events import Event


def accounted(arrived: list[bytes], events: list[Event]) -> None:
    """Every segment received is used, a duplicate, or handed back with its original bytes."""
    used = dup = 0
    back: list[bytes] = []
    for ev in events:
        if isinstance(ev, MessageComplete):
            used += ev.segments
        elif isinstance(ev, GroupComplete):
            used += sum(m.segments for m in ev.messages)
        elif isinstance(ev, Duplicate):
            dup += 1
        elif isinstance(ev, Rejected):
            back.append(ev.raw)
        elif isinstance(ev, MessageFailed):
            back += ev.segments
        elif isinstance(ev, GroupFailed):
            back += [*ev.segments, *(s for f in ev.failed for s in f.segments)]
        elif isinstance(ev, Unfinished):
            back += ev.segments
    assert used + dup + len(back) == len(arrived)
    assert not Counter(back) - Counter(arrived)  # nothing handed back that did not arrive, byte for byte
