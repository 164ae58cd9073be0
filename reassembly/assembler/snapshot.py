"""Snapshot and restore of an assembler's open state: a JSON document, then every held segment's original bytes.

Framed by :mod:`reassembly._framing` (magic ``b"SGAS"``, version 1): the first
part is the JSON document (groups: id, age, duplicate counters, delivered
numbers with the fingerprints of their segments, the last number when known,
segment count, and where each segment was read when positions were given;
closed groups with the fingerprints they delivered, their last number and
whether they may start again; each partition's positions), then one part per
held segment, group after group, its original bytes; no tail.
Restore feeds the segments back through the assembler, so they are verified
again, and checks each group got exactly its own segments back. A group may
hold no segment at all: one of a logical group delivered message by message
(``unit_of_work=False``) between two messages; it is rebuilt from its record,
what it delivered and its last number included (without them a copy of a
delivered segment would be Late instead of a Duplicate, and the group would
never complete). Keys a document lacks take their defaults, so documents
written without them restore. Partitions and positions are stored as JSON:
they must be JSON values (``str``, ``int``, ``float``, tuples of them; tuples
come back as tuples).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

from reassembly._checks import check, integer, opt_integer, restoring, time
from reassembly._framing import LENGTH_SIZE, Reader, frame, unframe
from reassembly.assembler._state import GroupState
from reassembly.assembler.model import Closed, Fingerprint, Group
from reassembly.assembler.positions import Ledger, Origin, origin_from_json
from segmenter.errors import Reason, SegmentationError
from segmenter.flags import is_last_in_group
from segmenter.wire import decode_header

MAGIC = b"SGAS"
VERSION = 1


def encode(groups: Mapping[bytes, Group], closed: Mapping[bytes, Closed], ledger: Ledger) -> bytes:
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
                "fingerprints": [[*key, *fp] for key, fp in sorted(g.fingerprints.items())],
                "last_seq": g.last_seq,
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
        doc = json.dumps(meta).encode()
    except (TypeError, ValueError) as exc:
        raise SegmentationError(
            f"partitions and positions must be JSON values to be snapshotted: {exc}", reason=Reason.STATE_ERROR
        ) from None
    return frame(MAGIC, VERSION, doc, *(raw for group_raws in raws.values() for raw in group_raws))


def _origins(g: Group) -> list[list[object] | None]:
    """Where each segment of :meth:`Group.raws` was read (empty when no position was given); a third
    item ``false`` marks one read from a partition since revoked (it pins nothing until read again)."""
    pieces = [p for _, m in sorted(g.messages.items()) for p in sorted(m.pieces(), key=lambda p: p.key())]
    if all(p.origin is None for p in pieces):
        return []
    return [
        None if p.origin is None or p.track is None else [*p.origin] + ([] if p.track.live else [False]) for p in pieces
    ]


def decode(
    blob: bytes,
    feed: Callable[[bytes, Origin | None, bool], None],
    groups: MutableMapping[bytes, Group],
    ledger: Ledger,
) -> OrderedDict[bytes, Closed]:
    """Restore the partitions' positions, feed every saved segment back (``feed``, with where it was
    read and whether that partition is still assigned), restore the groups' counters; return the
    closed records."""
    with restoring("assembler snapshot"):
        parts = unframe(blob, MAGIC, (VERSION,))
        meta = json.loads(bytes(parts.part("document")))
        check(isinstance(meta, dict) and isinstance(meta["groups"], list), "document")
        ledger.load(meta.get("partitions", []))
        for g in meta["groups"]:
            check(isinstance(g, dict), "group")
            _group(parts, g, feed, groups)
        parts.end()
        return OrderedDict((bytes.fromhex(c[0]), _closed(c)) for c in meta["closed"])


def _group(
    parts: Reader,
    g: dict[str, Any],
    feed: Callable[[bytes, Origin | None, bool], None],
    groups: MutableMapping[bytes, Group],
) -> None:
    """Feed one group's segments (its next parts) back, then its record."""
    gid = bytes.fromhex(g["id"])
    count = integer(g["segments"], "segment count")
    check(0 <= count <= parts.left // LENGTH_SIZE, "segment count")  # each part needs its length: before any list
    check(gid not in groups, "group id repeated")
    origins = g.get("origins") or [None] * count
    check(isinstance(origins, list) and len(origins) == count, "origins")
    saved = []
    for o in origins:
        raw = bytes(parts.part("segment"))
        saved.append((raw, origin_from_json(o), o is None or len(o) == 2))
    # Segments flagged LAST_MSG_IN_GROUP go back last: streaming admitted every held segment in its
    # arrival order, which is not saved, and a segment of the last message without the flag is
    # refused once the flag fixed the last number. Fed after the others, every one is admitted again.
    for raw, origin, live in sorted(saved, key=lambda s: _last_in_group(s[0])):
        feed(raw, origin, live)
    group = groups.get(gid)
    if group is None:  # delivering message by message, nothing held between two messages
        check(count == 0, "segments of another group")
        group = groups[gid] = Group(gid, True, 0.0)
    check(sum(len(ps) for m in group.messages.values() for ps in m.at.values()) == count, "segments of the group")
    group.first_seen = time(g["first_seen"], "age")
    group.delivered = {integer(s, "delivered number") for s in g["delivered"]}
    group.fingerprints = _fingerprints(g.get("fingerprints", []))
    if "last_seq" in g:
        group.last_seq = opt_integer(g["last_seq"], "last number")
    for s, d in g["duplicates"].items():
        group.messages[int(s)].duplicates = integer(d, "duplicate count")


def _last_in_group(raw: bytes) -> bool:
    try:
        return is_last_in_group(decode_header(raw).msg_flags)
    except SegmentationError:
        return False  # fed in place: the assembler refuses it as corrupt


def _closed(c: list[Any]) -> Closed:
    """``[id, state, fingerprints, last number, may start again]`` (the last two absent in older snapshots)."""
    reopen = c[4] if len(c) > 4 else False
    check(type(reopen) is bool, "closed group")
    last = opt_integer(c[3], "last number") if len(c) > 3 else None
    return Closed(GroupState(c[1]), _fingerprints(c[2]), last, reopen)


def _fingerprints(rows: list[Any]) -> dict[tuple[int, int], Fingerprint]:
    """``[[seq, offset, length, checksum, flags], ...]`` of delivered segments."""
    out: dict[tuple[int, int], Fingerprint] = {}
    for row in rows:
        check(isinstance(row, list) and len(row) == 5, "fingerprint")
        seq, offset, length, checksum, flags = (integer(v, "fingerprint") for v in row)
        out[(seq, offset)] = (length, checksum, flags)
    return out
