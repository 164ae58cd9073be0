"""Snapshot and restore of a :class:`~reassembly.resequencer.core.Resequencer`: versioned, checked field by field.

Framed by :mod:`reassembly._framing` (magic ``b"RSEQ"``, version 3 or 2): one part,
a JSON document, then as the tail every held item's bytes back to back (their
lengths are in the document). The document has the open groups in age order
(each with its phase, start, end, next, position, counters, skipped ranges,
deadline and held ``[seq, size, length]``), the order in which groups began
waiting, the closed groups kept for their instance numbers, and the live
timers in firing order (``["o"|"c", index, armed]``): deadlines that are equal
fire in the order they were armed, so without them a restored resequencer
could report two groups' timeouts in the other order, and (version 3)
``"floor"``, the highest instance number forgotten (see
:attr:`~reassembly.resequencer.core.Resequencer.instance_floor`): without it a
restored resequencer could number a group's instance as one it had already
forgotten. Version 2 is the same document without ``"floor"``, and is what is
written while nothing has been forgotten (floor 0): the bytes are then those
the previous release wrote and reads, so a rollback keeps its checkpoints
until the state actually needs the floor. Version 1 is version 2 without the
timers. Older versions restore with floor 0, version 1's timers armed in age
order.

Restore trusts nothing: every field is type-checked, every number range- and
consistency-checked (held numbers above ``next`` and within start/end,
skipped ranges ascending and below ``next``, lengths inside the blob, no
trailing bytes, nothing above the limits of the options restored into), and
totals are recomputed, never read. Anything wrong is a STATE_ERROR
:class:`~segmenter.errors.SegmentationError`, never another exception.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from reassembly._checks import Corrupt, check, integer, opt_integer, opt_time, restoring
from reassembly._framing import Reader, frame, unframe
from reassembly.resequencer.model import Group, Phase, ResequenceLimits
from segmenter.errors import Reason, SegmentationError

Groups = dict[Any, Group]

MAGIC = b"RSEQ"
VERSION = 3
VERSIONS = (1, 2, 3)


def _key_out(key: Any) -> list[Any]:
    if key is None:
        return ["n"]
    if isinstance(key, bool):
        raise SegmentationError("group ids must be str, int, bytes or None to snapshot", reason=Reason.STATE_ERROR)
    if isinstance(key, str):
        return ["s", key]
    if isinstance(key, int):
        return ["i", key]
    if isinstance(key, bytes):
        return ["b", key.hex()]
    raise SegmentationError("group ids must be str, int, bytes or None to snapshot", reason=Reason.STATE_ERROR)


def _key_in(v: Any) -> Any:
    check(isinstance(v, list) and v and v[0] in ("n", "s", "i", "b"), "group id")
    tag = v[0]
    if tag == "n":
        check(len(v) == 1, "group id")
        return None
    check(len(v) == 2, "group id")
    if tag == "s":
        check(isinstance(v[1], str), "group id")
        return v[1]
    if tag == "i":
        return integer(v[1], "group id")
    check(isinstance(v[1], str), "group id")
    return bytes.fromhex(v[1])


def _bytes_of(item: Any) -> bytes:
    if isinstance(item, (bytes, bytearray, memoryview)):
        return bytes(item)
    raise SegmentationError("items are not bytes: give snapshot() an encode function", reason=Reason.STATE_ERROR)


def encode(
    open_groups: Groups,
    waiting: dict[Any, None],
    closed: Groups,
    timers: list[Group],
    floor: int,
    encode_item: Callable[[Any], bytes] | None,
) -> bytes:
    """The open groups (age order), the order they began waiting in, the closed groups, the groups
    whose timer is live in the order it fires (each group's ``armed`` is its time), the highest
    instance number forgotten."""
    enc = encode_item or _bytes_of
    blobs: list[bytes] = []
    groups = []
    for g in open_groups.values():
        held = []
        for seq, item in g.held.items():
            b = enc(item)
            blobs.append(b)
            held.append([seq, g.sizes.get(seq, 0), len(b)])
        groups.append(
            {
                "key": _key_out(g.key),
                "instance": g.instance,
                "phase": g.phase.value,
                "start": g.start,
                "end": g.end,
                "next": g.next,
                "expiring": g.expiring,
                "position": g.position,
                "counts": [g.position - g.n_expired, g.n_expired, g.n_missing, g.failed],
                "gaps": [list(p) for p in zip(g.gap_lo, g.gap_hi, strict=True)],
                "floor": g.floor,
                "deadline": g.deadline,
                "held": held,
            }
        )
    where = {k: i for i, k in enumerate(open_groups)}
    shut = {k: i for i, k in enumerate(closed)}
    meta = {
        "groups": groups,
        "waiting": [where[k] for k in waiting],
        "closed": [[_key_out(g.key), g.instance, g.deadline] for g in closed.values()],
        "timers": [["o", where[g.key], g.armed] if open_groups.get(g.key) is g else ["c", shut[g.key], g.armed]
                   for g in timers],
    }  # fmt: skip
    if floor:
        meta["floor"] = floor
    doc = json.dumps(meta, separators=(",", ":")).encode()
    return frame(MAGIC, VERSION if floor else 2, doc, tail=b"".join(blobs))


Loaded = tuple[Groups, dict[Any, None], Groups, list[Group], int]


def decode(
    blob: bytes, limits: ResequenceLimits, decode_item: Callable[[bytes], Any] | None, *, whole: bool = False
) -> Loaded:
    """Open groups, waiting order, closed groups, the timers in firing order (each group's
    ``armed`` set; push them in this order), the highest instance number forgotten; deadlines are in
    ``Group.deadline``. ``whole``: restored into all-or-nothing options, where a running group not
    yet moved on holds its ``next`` number too."""
    with restoring("resequencer snapshot"):
        return _decode(unframe(blob, MAGIC, VERSIONS), limits, decode_item, whole)


def _decode(parts: Reader, lim: ResequenceLimits, decode_item: Callable[[bytes], Any] | None, whole: bool) -> Loaded:
    groups: Groups = {}
    waiting: dict[Any, None] = {}
    closed_groups: Groups = {}
    meta = json.loads(bytes(parts.part("document")))
    names = {"groups", "waiting", "closed"} | ({"timers"} if parts.version > 1 else set())
    names |= {"floor"} if parts.version > 2 else set()
    check(isinstance(meta, dict) and set(meta) == names, "document")
    check(isinstance(meta["groups"], list) and len(meta["groups"]) <= lim.max_groups, "groups")
    for doc in meta["groups"]:
        g = _group(lim, doc, parts, decode_item, whole)
        check(g.key not in groups, "duplicate group id")
        groups[g.key] = g
    parts.end()
    held = sum(len(g.held) for g in groups.values())
    check(held <= lim.max_messages and sum(g.nbytes for g in groups.values()) <= lim.max_bytes, "totals")
    keys = list(groups)
    check(isinstance(meta["waiting"], list), "waiting")
    for i in meta["waiting"]:
        check(0 <= integer(i, "waiting") < len(keys) and keys[i] not in waiting, "waiting")
        waiting[keys[i]] = None
    check(set(waiting) == {k for k, g in groups.items() if g.held}, "waiting groups")
    closed = meta["closed"]
    check(isinstance(closed, list) and len(closed) <= lim.max_closed, "closed")
    for entry in closed:
        check(isinstance(entry, list) and len(entry) == 3, "closed group")
        key = _key_in(entry[0])
        check(key not in closed_groups and key not in groups, "closed group id")
        g = Group(key, integer(entry[1], "instance"), Phase.CLOSED, None, None)
        check(g.instance >= 1, "instance")
        g.deadline = opt_time(entry[2], "deadline")
        closed_groups[key] = g
    floor = integer(meta.get("floor", 0), "floor")
    # Version 2 is what is written for 0; above 2**62 an instance number could leave 64 bits (a Spark bigint).
    check(0 < floor < 1 << 62 if parts.version > 2 else floor == 0, "floor")
    timers = _timers(meta.get("timers", []), list(groups.values()), closed_groups)
    return groups, waiting, closed_groups, timers, floor


def _timers(doc: Any, opened: list[Group], closed: Groups) -> list[Group]:
    shut = list(closed.values())
    check(isinstance(doc, list) and len(doc) <= len(opened) + len(shut), "timers")
    timers: list[Group] = []
    for entry in doc:
        check(isinstance(entry, list) and len(entry) == 3 and entry[0] in ("o", "c"), "timer")
        among = opened if entry[0] == "o" else shut
        i = integer(entry[1], "timer")
        check(0 <= i < len(among) and among[i].armed is None, "timer")
        armed = opt_time(entry[2], "timer")
        check(armed is not None, "timer")
        deadline = among[i].deadline
        # A live timer is never later than its group's deadline (a deadline moved earlier re-arms):
        # one that is (a forged 1e300) would keep the timeout from ever firing.
        check(deadline is None or armed <= deadline, "timer later than its deadline")  # type: ignore[operator]
        among[i].armed = armed
        timers.append(among[i])
    return timers


def _group(
    lim: ResequenceLimits, d: Any, parts: Reader, decode_item: Callable[[bytes], Any] | None, whole: bool
) -> Group:
    """One open group; its held items are the next bytes of the tail."""
    fields = {"key", "instance", "phase", "start", "end", "next", "expiring", "position"}
    fields |= {"counts", "gaps", "floor", "deadline", "held"}
    check(isinstance(d, dict) and set(d) == fields, "group")
    phase = Phase(d["phase"])
    check(phase is not Phase.CLOSED, "phase")
    start, end = opt_integer(d["start"], "start"), opt_integer(d["end"], "end")
    g = Group(_key_in(d["key"]), integer(d["instance"], "instance"), phase, start, end)
    g.next = integer(d["next"], "next")
    check(g.instance >= 1 and (start is None or end is None or start <= end), "instance, start or end")
    check(type(d["expiring"]) is bool, "expiring")
    g.expiring = d["expiring"]
    g.position = integer(d["position"], "position")
    counts = d["counts"]
    check(isinstance(counts, list) and len(counts) == 4, "counts")
    released, g.n_expired, g.n_missing, g.failed = (integer(c, "count") for c in counts)
    check(min(g.position, *counts) >= 0 and g.position == released + g.n_expired, "position or counts")
    running = phase in (Phase.RUNNING, Phase.ENDING)
    gaps = d["gaps"]
    check(isinstance(gaps, list) and len(gaps) <= lim.max_gaps, "gaps")
    low = None if start is None else start
    for gap in gaps:
        check(isinstance(gap, list) and len(gap) == 2, "gap")
        lo, hi = integer(gap[0], "gap"), integer(gap[1], "gap")
        check(running and (low is None or lo >= low) and lo < hi <= g.next, "gap range")
        g.gap_lo.append(lo)
        g.gap_hi.append(hi)
        low = hi
    g.floor = opt_integer(d["floor"], "floor")
    check(running or g.floor is None, "floor")
    held = d["held"]
    check(isinstance(held, list) and len(held) <= lim.max_group_messages, "held")
    check(phase is not Phase.ENDING or not held, "held while ending")
    check(phase not in (Phase.GATHERING, Phase.WAITING) or held, "nothing held before the start")
    for entry in held:
        check(isinstance(entry, list) and len(entry) == 3, "held message")
        seq, size, length = (integer(v, "held message") for v in entry)
        check(size >= 0 and seq not in g.held, "held message")
        above = seq > g.next or (whole and not g.expiring and seq == g.next)  # all-or-nothing holds ``next``
        check((not running or above) and (start is None or seq >= start), "held number")
        check(end is None or seq <= end, "held number above the end")
        raw = bytes(parts.take(length, "held message"))
        try:
            g.held[seq] = decode_item(raw) if decode_item is not None else raw
        except Exception as exc:  # the caller's decoder: its failure is a corrupt snapshot, not a crash
            raise Corrupt(f"item does not decode: {exc}") from None
        if size:
            g.sizes[seq] = size
            g.nbytes += size
    check(g.nbytes <= lim.max_group_bytes, "held bytes above the limit")
    g.deadline = opt_time(d["deadline"], "deadline")
    check(phase is not Phase.GATHERING or g.deadline is not None, "gathering without a deadline")
    return g
