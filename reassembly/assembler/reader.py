"""File adapter: read a stream of concatenated segments and yield the assembler's events."""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

from reassembly.assembler.core import Assembler
from reassembly.assembler.events import Event
from segmenter.sources import read_some
from segmenter.wire import SegmentStreamDecoder


def read_events(source: BinaryIO, assembler: Assembler | None = None, *, chunk_size: int = 1 << 20) -> Iterator[Event]:
    """Events for every segment in ``source``; at end of file, open groups come back as ``Unfinished``.

    A stream that cannot be framed (bad magic, truncated segment) raises the
    decoder's error: past that point no boundary can be trusted. A segment whose data fails its
    checksum is framed like any other and reported by the assembler (``ChecksumMismatch``).

    ``source``: a binary file object of concatenated segments, read to its end. ``assembler``: the assembler the
    segments go through (None: a new one with the default limits). ``chunk_size``: the bytes read at a time.
    """
    asm = assembler or Assembler()
    decoder = SegmentStreamDecoder(
        max_segment_size=asm.limits.max_segment_size, max_message_size=asm.limits.max_message_size, verify=False
    )
    while chunk := read_some(source, chunk_size):
        for seg in decoder.feed(chunk):
            yield from asm.receive(seg)
    decoder.close()
    yield from asm.close()
