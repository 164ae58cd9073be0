"""What the streaming job decides for one GroupId per micro-batch: pure Python, no Spark, no clock.

The streaming job keeps, per GroupId, the raw segments received so far and
re-judges them, each time new ones arrive, with the same batch
:class:`~reassembly.assembler.Assembler` the batch job uses (``batch=True``:
order-independent). The key is *decided* when that judgment leaves nothing
open: its rows are then exactly the rows the batch job would write for the
same segments. Otherwise the segments stay held until more arrive, the key's
expiry (event time) passes, or its byte bound would be exceeded.

A decided key leaves a tombstone: the assembler's own snapshot once the group
has left it (its end state and the fingerprints of what it delivered, no
bytes). A segment arriving while the tombstone lives is judged by that
assembler's late rules: an identical copy of a delivered segment is a
duplicate, a different one a conflict, anything else ``late``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from segmenter.errors import SegmentationError
from segmenter.wire import decode_header

from ..assembler import Assembler, Limits
from ..events import (
    Cause,
    Duplicate,
    GroupComplete,
    GroupFailed,
    MessageComplete,
    MessageFailed,
    Rejected,
    Unfinished,
)
from .rows import GroupRows, Row, event_rows

KIND_DUPLICATE = "duplicate"  # an identical copy of a segment whose message already left (counted, no bytes)


@dataclass(frozen=True)
class Verdict:
    """A decided key: its output rows and the tombstone to keep."""

    rows: list[Row]
    tombstone: bytes  # Assembler.snapshot() after the group left
    state: str  # how it ended: complete, failed, expired, evicted (for late segments' detail)


def undecodable(raw: bytes) -> bool:
    """True if the row has no readable header: it belongs to no group and is quarantined at once."""
    try:
        decode_header(raw)
    except SegmentationError:
        return True
    return False


def reject_now(raws: Iterable[bytes], limits: Limits) -> list[Row]:
    """Quarantine rows for rows with no readable header (the assembler gives the exact reason)."""
    asm = Assembler(limits)
    return event_rows(ev for raw in raws for ev in asm.receive(raw))


def judge(raws: Sequence[bytes], limits: Limits, unit_of_work: bool, final: Cause | None = None) -> Verdict | None:
    """Judge every segment held for one key; ``None`` while it is undecided and ``final`` is not given.

    Decided early only by success: every message of the key complete (a
    message, or a Unit-of-Work group, as a whole). A failure (message
    checksum, decompression, a failed group) or segments that were only
    rejected wait for ``final``: a good copy may still arrive, and the batch
    job, seeing it, would use it. ``final`` (expired, evicted) decides the key
    whatever it holds: what is open leaves as ``Unfinished`` with that cause
    (exact gaps; segments to quarantine).
    """
    asm = Assembler(limits, batch=True, unit_of_work=unit_of_work)
    events = asm.receive_many(raws) + asm.close()
    failed = any(isinstance(e, (MessageFailed, GroupFailed)) for e in events)
    complete = any(isinstance(e, (MessageComplete, GroupComplete)) for e in events)
    settled = complete and not failed and not any(isinstance(e, Unfinished) for e in events)
    if final is None and not settled:
        return None
    if settled:
        state = "complete"
    else:
        assert final is not None
        state = final.value if any(isinstance(e, Unfinished) for e in events) or not failed else "failed"
        events = [replace(e, cause=final) if isinstance(e, Unfinished) else e for e in events]
    return Verdict(_plain(event_rows(events)), asm.snapshot(), state)


def take(
    held: Sequence[bytes],
    new: Sequence[bytes],
    held_bytes: int,
    max_held_bytes: int,
    limits: Limits,
    unit_of_work: bool,
) -> Verdict | None:
    """New segments for an undecided key: judged with what it holds, or, if holding them all would pass
    ``max_held_bytes``, decided at once as evicted (the bound is checked before anything is stored)."""
    over = held_bytes + sum(len(r) for r in new) > max_held_bytes
    return judge([*held, *new], limits, unit_of_work, Cause.EVICTED if over else None)


def late_rows(tombstone: bytes, state: str, raws: Iterable[bytes], limits: Limits, unit_of_work: bool) -> list[Row]:
    """Rows for segments of a decided key: duplicates (counted), conflicts and ``late`` (quarantined)."""
    asm = Assembler.restore(tombstone, limits, unit_of_work=unit_of_work)
    out: list[Row] = []
    for raw in raws:
        for ev in asm.receive(raw):
            if isinstance(ev, Duplicate):
                out.append(_duplicate_row(ev))
                continue
            acc = GroupRows(ev.header.group_id if isinstance(ev, Rejected) and ev.header else None)
            acc.add(ev)
            for row in acc.quarantine:
                if row["reason_name"] == "LATE_SEGMENT":
                    row["detail"] = f"segment after its group was {state} (tombstone kept)"
                out.append(row)
    return _plain(out)


def _duplicate_row(ev: Duplicate) -> Row:
    return {
        "kind": KIND_DUPLICATE,
        "group_id": ev.group_id,
        "msg_seq_number": ev.msg_seq_number,
        "offset": ev.offset,
        "reason": 0,
        "reason_name": "NONE",
        "detail": "identical copy of a segment already delivered",
    }


def _plain(rows: list[Row]) -> list[Row]:
    """Views become bytes: rows leave the Python worker through Spark's Row conversion."""
    for row in rows:
        for k, v in row.items():
            if isinstance(v, memoryview):
                row[k] = v.tobytes()
    return rows


__all__ = ["KIND_DUPLICATE", "Verdict", "judge", "late_rows", "reject_now", "take", "undecodable"]
