"""Large messages in a stream: their segments' data on disk at their offsets, only headers in state.

A segment of a message declaring more than ``large_message_bytes`` (or deferring
its length) is held as its header bytes plus where its data lies: in the
message's *body file* at its own offset when that range of the body is still
unwritten, else (a copy overlapping what is written: a duplicate or a conflicting
copy) appended to the message's *aside file*. The state keeps which body ranges
are written and how long each aside file is (:class:`SpoolState`), so a
micro-batch replayed after a crash, starting again from the state of the last
committed batch, writes only where the crashed attempt wrote (ranges unwritten in
that state, the aside tail past its recorded length) and leaves everything the
state refers to as it was: a replay never corrupts a body.

When the key is judged, the held segments are read back one at a time
(:class:`HeldRows`) into the batch assembler with a
:class:`~reassembly.storage.filestore.FileBodyStore`, which builds each verified message in
a file of its own and renames it into place (``<GroupId hex>-<MsgSeqNumber>-<checksum>.bin``
under the directory), as the batch job does with ``payload_dir``. The spool files
of a message are removed only after the batch that wrote its row is committed
(:meth:`Spool.drop`, called by the sink): until then a replay may need them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

from segmenter.coverage import RangeSet
from segmenter.wire import UNKNOWN_LENGTH, SegmentHeader

IN_STATE = -1  # the row holds the whole segment
IN_BODY = -2  # the row holds the header; the data is in the body file at the segment's offset
# any other value >= 0: the data is in the aside file at that position

SPOOL = ".stream"  # under the body directory: files of messages still being received


@dataclass
class SpoolState:
    """What is on disk for the messages of one key: body ranges written, aside lengths (kept in state)."""

    written: dict[int, RangeSet] = field(default_factory=dict)
    """Byte ranges of each message's body file written so far, by MsgSeqNumber."""
    aside: dict[int, int] = field(default_factory=dict)
    """How long each message's aside file is, in bytes (copies overlapping what is written), by MsgSeqNumber."""

    def dump(self) -> dict[str, object]:
        return {
            "written": {s: [list(x) for x in r.spans()] for s, r in self.written.items()},
            "aside": self.aside,
        }

    @classmethod
    def load(cls, d: dict[str, Any]) -> SpoolState:
        """The state :meth:`dump` wrote, ``d`` (its JSON-ready dict)."""
        written = {int(s): RangeSet((a, b) for a, b in r) for s, r in d["written"].items()}
        return cls(written, {int(s): int(n) for s, n in d["aside"].items()})


class Spool:
    """The body files of a stream's large messages under ``directory`` (one both workers see).

    ``directory``: the spool directory, on storage every worker sees. ``large_message_bytes``: a message declaring more
    than this many bytes has its segments' data spooled. ``max_message_size``: the largest message accepted, in bytes (a
    segment declaring a larger one is never spooled).
    """

    def __init__(self, directory: str, large_message_bytes: int, max_message_size: int) -> None:
        self.directory = directory
        self.large = large_message_bytes
        self.max = max_message_size
        self.unsynced: set[Path] = set()  # written since the last sync()

    def wants(self, raw: bytes, h: SegmentHeader) -> bool:
        """Spool a whole segment (exactly its header and declared data: a row shorter or longer
        stays in state as it came, to be quarantined with its own bytes; spooled, a longer one
        would overwrite the next range of the body and a shorter one come back padded with zeros) of a
        large message whose range lies inside what it declares (anything else stays in state,
        whatever its size, and is rejected by the judgment).

        ``raw``: the segment's bytes as received. ``h``: its decoded header.
        """
        if len(raw) != h.header_length + h.data_length:
            return False
        if h.length_deferred:
            return h.end <= self.max
        return (
            self.large < h.original_length <= self.max
            and h.stored_length != UNKNOWN_LENGTH
            and (h.end <= h.stored_length)
        )

    def _path(self, group_id: bytes, seq: int, kind: str) -> Path:
        return Path(self.directory) / SPOOL / f"{group_id.hex()}-{seq}.{kind}"

    def put(self, raw: bytes, h: SegmentHeader, state: SpoolState) -> tuple[bytes, int]:
        """Write the data of a wanted segment; the held row: (header bytes, where its data is).

        ``raw``: the segment's bytes. ``h``: its header. ``state``: the key's :class:`SpoolState`, updated with what is
        written.
        """
        head, data = raw[: h.header_length], memoryview(raw)[h.header_length :]
        seq = h.msg_seq_number
        written = state.written.setdefault(seq, RangeSet())
        unwritten = not written.covered(h.offset, h.end)
        path = self._path(h.group_id, seq, "body" if unwritten else "aside")
        at = h.offset if unwritten else state.aside.get(seq, 0)
        if not path.parent.is_dir():
            path.parent.mkdir(parents=True, exist_ok=True)
            self.unsynced.add(path.parent.parent)  # the new directory's own name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)  # never through a planted link
        try:
            os.pwrite(fd, data, at)
        finally:
            os.close(fd)
        self.unsynced.add(path)
        if unwritten:
            written.add(h.offset, h.end)
            return head, IN_BODY
        state.aside[seq] = at + len(data)
        return head, at

    def sync(self) -> None:
        """Make what put() wrote durable: each file written since the last call, then the directory
        (new files' names). Called before the state that points into these files can commit, so a
        machine crash after that commit finds every byte the state refers to (once per file and
        call, not per segment: a message's segments arriving in one micro-batch cost one fsync)."""
        if not self.unsynced:
            return
        for path in (*sorted(self.unsynced), Path(self.directory) / SPOOL):
            fd = os.open(path, os.O_RDONLY)  # Linux fsyncs a file's data through any descriptor
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self.unsynced.clear()

    def read(self, head: bytes, at: int, h: SegmentHeader) -> bytes:
        """The whole segment back (header as received, then its data).

        ``head``: the header bytes held in state. ``at``: where the data is (IN_BODY: in the body file at the segment's
        offset; else the offset in the message's aside file). ``h``: the decoded header.
        """
        kind, position = ("body", h.offset) if at == IN_BODY else ("aside", at)
        fd = os.open(self._path(h.group_id, h.msg_seq_number, kind), os.O_RDONLY | os.O_NOFOLLOW)
        try:
            data = os.pread(fd, h.data_length, position)
        finally:
            os.close(fd)
        return head + data

    def drop(self, group_id: bytes, seq: int) -> None:
        """The message's row is committed: its spool files are no longer needed.

        ``group_id``, ``seq``: the message, by GroupId and MsgSeqNumber.
        """
        for kind in ("body", "aside"):
            self._path(group_id, seq, kind).unlink(missing_ok=True)


class HeldRows(Sequence[bytes]):
    """Held rows as whole segments, read from the spool one at a time (never all in memory at once).

    ``rows``: the held rows, each (the bytes kept in state, where its data is, its header). ``spool``: where spooled
    data is read from (None: every row is a whole segment in state).
    """

    def __init__(self, rows: list[tuple[bytes, int, SegmentHeader]], spool: Spool | None) -> None:
        self.rows, self.spool = rows, spool

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, i: int) -> bytes: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[bytes]: ...
    def __getitem__(self, i: int | slice) -> bytes | Sequence[bytes]:
        if isinstance(i, slice):
            return HeldRows(self.rows[i], self.spool)
        head, at, h = self.rows[i]
        if at == IN_STATE:
            return head
        assert self.spool is not None
        return self.spool.read(head, at, h)

    def __iter__(self) -> Iterator[bytes]:
        for i in range(len(self.rows)):
            yield self[i]


__all__ = ["IN_BODY", "IN_STATE", "SPOOL", "HeldRows", "Spool", "SpoolState"]
