"""Snapshot and restore of an assembler's open state: a JSON header, then every held segment's original bytes.

Layout: ``b"SGAS\\x01"``, u64 length of the JSON, the JSON (groups: id, age,
duplicate counters, delivered numbers, segment count, and where each segment
was read when positions were given; closed groups with the fingerprints they
delivered, their last number and whether they may start again; each
partition's positions), then per group its segments as u64 length + original
bytes. Restore feeds the segments back through the assembler, so they are
verified again. Keys absent from an older snapshot take their defaults.
Partitions and positions are stored as JSON: they must be JSON values
(``str``, ``int``, ``float``, tuples of them; tuples come back as tuples).
"""

from __future__ import annotations

import json
import struct
from collections import OrderedDict
from collections.abc import Callable, Mapping

from segmenter.errors import Reason, SegmentationError

from ._state import GroupState
from .model import Closed, Group
from .positions import Ledger, Origin, origin_from_json

MAGIC = b"SGAS\x01"
_LEN = struct.Struct(">Q")


def snapshot(groups: Mapping[bytes, Group], closed: Mapping[bytes, Closed], ledger: Ledger) -> bytes:
    """Serialise open groups (with their segments' original bytes and positions), the closed records
    and the partitions' positions."""
    raws = {gid: g.raws() for gid, g in groups.items()}
    meta = {
        "groups": [
            {
                "id": g.group_id.hex(),
                "first_seen": g.first_seen,
                "duplicates": {str(s): m.duplicates for s, m in g.messages.items()},
                "delivered": sorted(g.delivered),
                "segments": len(raws[gid]),
                "origins": _origins(g),
            }
            for gid, g in groups.items()
        ],
        "closed": [
            [k.hex(), v.state.value, [[*key, *fp] for key, fp in v.delivered.items()], v.last_seq, v.reopen]
            for k, v in closed.items()
        ],
        "partitions": ledger.state(),
    }
    try:
        blob = json.dumps(meta).encode()
    except (TypeError, ValueError) as exc:
        raise SegmentationError(
            f"partitions and positions must be JSON values to be snapshotted: {exc}", reason=Reason.STATE_ERROR
        ) from None
    parts = [MAGIC, _LEN.pack(len(blob)), blob]
    for group_raws in raws.values():
        for raw in group_raws:
            parts += [_LEN.pack(len(raw)), raw]
    return b"".join(parts)


def _origins(g: Group) -> list[list[object] | None]:
    """Where each segment of :meth:`Group.raws` was read (empty when no position was given); a third
    item ``false`` marks one read from a partition since revoked (it pins nothing until read again)."""
    pieces = [p for _, m in sorted(g.messages.items()) for p in sorted(m.pieces(), key=lambda p: p.key())]
    if all(p.origin is None for p in pieces):
        return []
    return [
        None if p.origin is None or p.track is None else [*p.origin] + ([] if p.track.live else [False]) for p in pieces
    ]


def restore(
    blob: bytes,
    feed: Callable[[bytes, Origin | None, bool], None],
    groups: Mapping[bytes, Group],
    ledger: Ledger,
) -> OrderedDict[bytes, Closed]:
    """Restore the partitions' positions, feed every saved segment back (``feed``, with where it was
    read and whether that partition is still assigned), restore the groups' counters; return the
    closed records."""
    view = memoryview(blob)
    try:
        if bytes(view[: len(MAGIC)]) != MAGIC:
            raise SegmentationError("not an assembler snapshot", reason=Reason.STATE_ERROR)
        (n,) = _LEN.unpack_from(view, len(MAGIC))
        start = len(MAGIC) + _LEN.size
        meta = json.loads(bytes(view[start : start + n]))
        pos = start + n
        ledger.load(meta.get("partitions", []))
        for g in meta["groups"]:
            origins = g.get("origins") or [None] * g["segments"]
            for i in range(g["segments"]):
                (size,) = _LEN.unpack_from(view, pos)
                o = origins[i]
                feed(
                    bytes(view[pos + _LEN.size : pos + _LEN.size + size]), origin_from_json(o), o is None or len(o) == 2
                )
                pos += _LEN.size + size
            group = groups[bytes.fromhex(g["id"])]
            group.first_seen = g["first_seen"]
            group.delivered = set(g["delivered"])
            for s, d in g["duplicates"].items():
                group.messages[int(s)].duplicates = d
        return OrderedDict(
            (
                bytes.fromhex(c[0]),
                Closed(GroupState(c[1]), {(f[0], f[1]): (f[2], f[3], f[4]) for f in c[2]}, *c[3:5]),
            )
            for c in meta["closed"]
        )
    except (ValueError, KeyError, TypeError, struct.error) as exc:
        raise SegmentationError(f"corrupt snapshot: {exc}", reason=Reason.STATE_ERROR) from None
