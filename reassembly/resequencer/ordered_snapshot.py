"""Snapshot and restore of :class:`~reassembly.resequencer.ordered.OrderedGroups`: its two parts side by side.

Framed by :mod:`reassembly._framing` (magic ``b"SGOG"``, version 1): one part,
the assembler's snapshot (:mod:`reassembly.assembler.snapshot`: the segments
of messages not yet whole, re-verified on restore), then as the tail the
resequencer's (:mod:`reassembly.resequencer.snapshot`: the whole messages
waiting for an earlier one, each an item encoded by :func:`encode_complete`).
Each snapshot is checked as its own codec checks it; anything wrong is a
STATE_ERROR :class:`~segmenter.errors.SegmentationError`, never another
exception.

A waiting message is kept whole (its bytes), not as segments: it was verified
once and is handed on as it was. A payload that lives in a
:class:`~reassembly.assembler.bodies.BodyStore` is kept by reference (its
:class:`~reassembly.assembler.bodies.StoredBody`): the store's file must still be there
when the snapshot is restored, as it must for the message to be read at all.
An item is not a snapshot of its own (no magic, no version: the resequencer's
snapshot frames it), so it keeps its compact layout, a u32 length of its JSON
fields, the fields, the payload.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from reassembly._checks import check, integer, opt_integer, restoring
from reassembly._framing import frame, unframe
from reassembly.assembler.bodies import StoredBody
from reassembly.assembler.events import MessageComplete
from reassembly.assembler.positions import origin_from_json
from segmenter.errors import Reason, SegmentationError

MAGIC = b"SGOG"
VERSION = 1
_HEAD = struct.Struct(">I")


def encode(assembler: bytes, resequencer: bytes) -> bytes:
    """The assembler's and the resequencer's snapshots as one."""
    return frame(MAGIC, VERSION, assembler, tail=resequencer)


def decode(blob: bytes) -> tuple[bytes, bytes]:
    """The assembler's and the resequencer's snapshots (each still to be checked by its own codec)."""
    with restoring("ordered-groups snapshot"):
        parts = unframe(blob, MAGIC, (VERSION,))
        return bytes(parts.part("assembler snapshot")), bytes(parts.rest())


def encode_complete(m: MessageComplete) -> bytes:
    """u32 length of a JSON list of the fields, the list, then the payload's bytes (none for a stored body)."""
    stored = m.payload if isinstance(m.payload, StoredBody) else None
    fields = [
        m.group_id.hex(),
        m.msg_seq_number,
        m.msg_flags,
        m.segments,
        m.duplicates,
        m.stored_length,
        m.original_length,
        m.checksum,
        [list(o) for o in m.positions],
        None if stored is None else [stored.location, stored.length, stored.checksum],
    ]
    try:
        doc = json.dumps(fields, separators=(",", ":")).encode()
    except (TypeError, ValueError) as exc:
        raise SegmentationError(
            f"partitions and positions must be JSON values to be snapshotted: {exc}", reason=Reason.STATE_ERROR
        ) from None
    payload = b"" if stored is not None else bytes(m.payload)  # type: ignore[arg-type]
    return b"".join([_HEAD.pack(len(doc)), doc, payload])


def decode_complete(raw: bytes) -> MessageComplete:
    """The inverse of :func:`encode_complete`; a failed check raises (the resequencer's restore makes
    it a STATE_ERROR)."""
    view = memoryview(raw)
    check(len(view) >= _HEAD.size, "message length")
    (n,) = _HEAD.unpack_from(view)
    check(n <= len(view) - _HEAD.size, "message length")
    doc = json.loads(bytes(view[_HEAD.size : _HEAD.size + n]))
    check(isinstance(doc, list) and len(doc) == 10, "message")
    gid, positions, stored = doc[0], doc[8], doc[9]
    check(isinstance(gid, str) and isinstance(positions, list), "message")
    seq, flags, segments, duplicates, stored_length, original_length = (integer(v, "message") for v in doc[1:7])
    payload: bytes | StoredBody = bytes(view[_HEAD.size + n :])
    if stored is not None:
        check(isinstance(stored, list) and len(stored) == 3 and isinstance(stored[0], str) and not payload, "body")
        payload = StoredBody(stored[0], integer(stored[1], "body"), integer(stored[2], "body"))
    checksum = opt_integer(doc[7], "checksum")
    origins = tuple(_origin(o) for o in positions)
    lengths = (stored_length, original_length)
    return MessageComplete(bytes.fromhex(gid), seq, payload, flags, segments, duplicates, *lengths, checksum, origins)


def _origin(o: Any) -> Any:
    check(isinstance(o, list) and len(o) == 2, "position")
    return origin_from_json(o)
