"""Snapshot and restore of a :class:`~reassembly.resequencer.batch.BatchResequencer`: versioned, checked field by field.

Framed by :mod:`reassembly._framing` (magic ``b"RSQB"``, version 1), as the sequence mode's
snapshot is: one part, a JSON document, then as the tail every held item's bytes back to back
(their lengths are in the document). The document::

    {"next": N, "windows": [{"group": G, "window": n, "opened": t, "duplicates": d,
                             "held": [[KEY, size, length], ...]}, ...]}

``next`` is the number the next window gets; the windows are in the order they opened (their
numbers ascending), their items in arrival order. A group id is tagged as in
:mod:`reassembly.resequencer.snapshot` (str, int, bytes or None). A key is tagged by its type, so
it reads back equal and of the same kind, never re-derived (a key function is not called again,
so a function that changed since cannot reorder what is held): ``["i", int]``, ``["f", float.hex()]``,
``["s", str]``, ``["b", hex]``, ``["t", isoformat]`` (a datetime; a timezone-aware one comes back
with a fixed UTC offset, the same instant), ``["d", isoformat]`` (a date), ``["u", [KEY, ...]]``
(a tuple). Deadlines are not stored: each is ``opened + batch_timeout`` of the options restored into,
and equal ones fire in window-number order, so the firing order needs no timer list.

Restore trusts nothing: every field is type-checked; every key goes through
:func:`~reassembly.resequencer.batch_model.sort_key` again (its kind one per window); window
numbers are distinct, ascending and below ``next``; a window holds at least one item and fewer
than ``batch_size`` (it would have been released), no equal keys unless duplicates are kept, and
nothing above the bounds of the options restored into; lengths are inside the blob and no bytes
trail. Anything wrong is a STATE_ERROR :class:`~segmenter.errors.SegmentationError`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import date, datetime
from typing import Any

from reassembly._checks import Corrupt, check, integer, restoring, time
from reassembly._framing import Reader, frame, unframe
from reassembly.resequencer.batch_model import BadKey, BatchOptions, DuplicatePolicy, sort_key
from reassembly.resequencer.snapshot import _bytes_of, _key_in, _key_out

MAGIC = b"RSQB"
VERSION = 1
VERSIONS = (1,)
_DEPTH = 4  # tuple keys nest at most this deep (as sort_key accepts them)

Entry = Sequence[Any]  # key, item, size
WindowState = tuple[Any, int, float, int, Sequence[Entry]]  # group, number, opened, duplicates, entries


def key_out(key: Any) -> list[Any]:
    """A key accepted by :func:`~reassembly.resequencer.batch_model.sort_key`, tagged by its type."""
    t = type(key)
    if t is int:
        return ["i", key]
    if t is str:
        return ["s", key]
    if t is bytes:
        return ["b", key.hex()]
    if t is datetime:
        return ["t", key.isoformat()]
    if t is float:
        return ["f", key.hex()]
    if t is date:
        return ["d", key.isoformat()]
    if t is tuple:
        return ["u", [key_out(k) for k in key]]
    raise AssertionError(f"sort_key accepted a {t.__name__}")  # pragma: no cover: sort_key decides


def key_in(v: Any, depth: int = 0) -> Any:
    check(isinstance(v, list) and len(v) == 2 and v[0] in ("i", "s", "b", "t", "f", "d", "u"), "key")
    tag, value = v
    if tag == "i":
        return integer(value, "key")
    if tag == "u":
        check(isinstance(value, list) and depth < _DEPTH, "tuple key")
        return tuple(key_in(k, depth + 1) for k in value)
    check(isinstance(value, str), "key")
    if tag == "s":
        return value
    if tag == "b":
        return bytes.fromhex(value)
    if tag == "f":
        return float.fromhex(value)
    if tag == "d":
        return date.fromisoformat(value)
    return datetime.fromisoformat(value)


def encode(next_window: int, windows: Sequence[WindowState], encode_item: Callable[[Any], bytes] | None) -> bytes:
    """The window counter and the open windows (opening order), each ``(group, number, opened,
    duplicates, [(key, item, size), ...])`` with its items in arrival order."""
    enc = encode_item or _bytes_of
    blobs: list[bytes] = []
    docs = []
    for group, number, opened, duplicates, entries in windows:
        held = []
        for key, item, size in entries:
            b = enc(item)
            blobs.append(b)
            held.append([key_out(key), size, len(b)])
        docs.append(
            {"group": _key_out(group), "window": number, "opened": opened, "duplicates": duplicates, "held": held}
        )
    doc = json.dumps({"next": next_window, "windows": docs}, separators=(",", ":")).encode()
    return frame(MAGIC, VERSION, doc, tail=b"".join(blobs))


def decode(
    blob: bytes, options: BatchOptions, decode_item: Callable[[bytes], Any] | None
) -> tuple[int, list[WindowState]]:
    """The window counter and the open windows as :func:`encode` took them."""
    with restoring("batch resequencer snapshot"):
        return _decode(unframe(blob, MAGIC, VERSIONS), options, decode_item)


def _decode(
    parts: Reader, opts: BatchOptions, decode_item: Callable[[bytes], Any] | None
) -> tuple[int, list[WindowState]]:
    meta = json.loads(bytes(parts.part("document")))
    check(isinstance(meta, dict) and set(meta) == {"next", "windows"}, "document")
    next_window = integer(meta["next"], "next")
    check(1 <= next_window < 1 << 62, "next")  # window numbers stay within a Spark bigint
    docs = meta["windows"]
    check(isinstance(docs, list) and len(docs) <= opts.max_items, "windows")
    windows: list[WindowState] = []
    groups: set[Any] = set()
    last = 0
    items = nbytes = 0
    for d in docs:
        w = _window(d, parts, opts, decode_item)
        check(w[0] not in groups, "duplicate group id")
        check(last < w[1] < next_window, "window number")
        groups.add(w[0])
        last = w[1]
        items += len(w[4])
        nbytes += sum(size for _, _, size in w[4])
        windows.append(w)
    parts.end()
    check(items <= opts.max_items and nbytes <= opts.max_bytes, "totals above the bounds")
    return next_window, windows


def _window(d: Any, parts: Reader, opts: BatchOptions, decode_item: Callable[[bytes], Any] | None) -> WindowState:
    """One open window; its items are the next bytes of the tail."""
    check(isinstance(d, dict) and set(d) == {"group", "window", "opened", "duplicates", "held"}, "window")
    group = _key_in(d["group"])
    number = integer(d["window"], "window number")
    opened = time(d["opened"], "opened")
    duplicates = integer(d["duplicates"], "duplicates")
    check(duplicates >= 0, "duplicates")
    held = d["held"]
    check(isinstance(held, list) and 1 <= len(held) <= opts.max_window_items, "held items")
    check(opts.batch_size is None or len(held) < opts.batch_size, "a window of batch_size items held")
    kinds = set()
    keys: set[Any] = set()
    entries: list[tuple[Any, Any, int]] = []
    for entry in held:
        check(isinstance(entry, list) and len(entry) == 3, "held item")
        try:
            kind, key = sort_key(key_in(entry[0]))
        except BadKey as exc:
            raise Corrupt(f"bad key: {exc}") from None
        size, length = integer(entry[1], "size"), integer(entry[2], "length")
        check(size >= 0, "size")
        kinds.add(kind)
        if opts.duplicates is not DuplicatePolicy.KEEP:
            check(key not in keys, "equal keys held where duplicates are not kept")
            keys.add(key)
        raw = bytes(parts.take(length, "held item"))
        try:
            item = decode_item(raw) if decode_item is not None else raw
        except Exception as exc:  # the caller's decoder: its failure is a corrupt snapshot, not a crash
            raise Corrupt(f"item does not decode: {exc}") from None
        entries.append((key, item, size))
    check(len(kinds) == 1, "keys of more than one kind in a window")
    check(sum(size for _, _, size in entries) <= opts.max_window_bytes, "held bytes above the bound")
    return group, number, opened, duplicates, entries
