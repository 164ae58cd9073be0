"""Snapshot and restore of an assembler's open state: a JSON header, then every held segment's original bytes.

Layout: ``b"SGAS\\x01"``, u64 length of the JSON, the JSON (groups: id, age,
duplicate counters, delivered numbers, segment count; closed groups with the
fingerprints they delivered), then per group its segments as u64 length +
original bytes. Restore feeds the segments back through the assembler, so they
are verified again.
"""

from __future__ import annotations

import json
import struct
from collections import OrderedDict
from collections.abc import Callable, Mapping

from segmenter.errors import Reason, SegmentationError

from ._state import GroupState
from .model import Closed, Group

MAGIC = b"SGAS\x01"
_LEN = struct.Struct(">Q")


def snapshot(groups: Mapping[bytes, Group], closed: Mapping[bytes, Closed]) -> bytes:
    """Serialise open groups (with their segments' original bytes) and the closed records."""
    raws = {gid: g.raws() for gid, g in groups.items()}
    meta = {
        "groups": [
            {
                "id": g.group_id.hex(),
                "first_seen": g.first_seen,
                "duplicates": {str(s): m.duplicates for s, m in g.messages.items()},
                "delivered": sorted(g.delivered),
                "segments": len(raws[gid]),
            }
            for gid, g in groups.items()
        ],
        "closed": [
            [k.hex(), v.state.value, [[*key, *fp] for key, fp in v.delivered.items()]] for k, v in closed.items()
        ],
    }
    blob = json.dumps(meta).encode()
    parts = [MAGIC, _LEN.pack(len(blob)), blob]
    for group_raws in raws.values():
        for raw in group_raws:
            parts += [_LEN.pack(len(raw)), raw]
    return b"".join(parts)


def restore(blob: bytes, feed: Callable[[bytes], None], groups: Mapping[bytes, Group]) -> OrderedDict[bytes, Closed]:
    """Feed every saved segment back (``feed``), restore the groups' counters; return the closed records."""
    view = memoryview(blob)
    try:
        if bytes(view[: len(MAGIC)]) != MAGIC:
            raise SegmentationError("not an assembler snapshot", reason=Reason.STATE_ERROR)
        (n,) = _LEN.unpack_from(view, len(MAGIC))
        start = len(MAGIC) + _LEN.size
        meta = json.loads(bytes(view[start : start + n]))
        pos = start + n
        for g in meta["groups"]:
            for _ in range(g["segments"]):
                (size,) = _LEN.unpack_from(view, pos)
                feed(bytes(view[pos + _LEN.size : pos + _LEN.size + size]))
                pos += _LEN.size + size
            group = groups[bytes.fromhex(g["id"])]
            group.first_seen = g["first_seen"]
            group.delivered = set(g["delivered"])
            for s, d in g["duplicates"].items():
                group.messages[int(s)].duplicates = d
        return OrderedDict(
            (bytes.fromhex(k), Closed(GroupState(v), {(f[0], f[1]): (f[2], f[3], f[4]) for f in prints}))
            for k, v, prints in meta["closed"]
        )
    except (ValueError, KeyError, TypeError, struct.error) as exc:
        raise SegmentationError(f"corrupt snapshot: {exc}", reason=Reason.STATE_ERROR) from None
