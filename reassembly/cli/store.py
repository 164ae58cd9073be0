"""``reassemble store list|expire|vacuum --store URL``: look after a shared segment store.

The store is the one competing consumers share (:mod:`reassembly.segstore`; a ``postgresql://``
URL, or a SQLite file given as ``sqlite:///path`` or a plain path). The actions:

* ``list``: the store's figures (units and bytes held, oldest incomplete, leases held and expired,
  duplicates, conflicts, quarantined) and every incomplete unit older than ``--older-than`` (default
  0: all) with its exact missing ranges, one line each;
* ``expire --older-than D``: quarantine the segments of every incomplete unit older than D
  (reason 2242, or 2241 when only whole messages of a group are missing), with the missing ranges
  in the quarantine row; the unit is remembered as expired so its late segments are quarantined too;
* ``vacuum --retention D``: drop the tombstones of units settled or expired more than D ago (a copy
  redelivered after that would be taken as new: keep D above the brokers' redelivery horizon), with
  ``--quarantine`` the quarantined segments as old too, then reclaim the space.

``--dry-run`` (``expire``, ``vacuum``) says what would change and changes nothing. ``--json``
prints one JSON document instead of lines. Refused with exit 2 before anything is opened: a SQLite
file that does not exist (never created by this command), a malformed duration.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reassembly._errors import UsageError, counted
from reassembly.cli._common import seconds
from reassembly.segstore import SegmentStore, UnitReport, open_store

if TYPE_CHECKING:
    from reassembly.cli._common import Subparsers


def add_parser(sub: Subparsers) -> argparse.ArgumentParser:
    """The ``store`` subcommand and its actions."""
    p = sub.add_parser(
        "store",
        help="shared segment store housekeeping: list incomplete messages, expire, vacuum",
        description="Look after the segment store competing consumers share (docs/how-to/competing-consumers.md).",
    )
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser(
        "list", help="the store's figures and its incomplete messages with their missing ranges"
    )
    expire = actions.add_parser("expire", help="quarantine incomplete messages older than --older-than")
    vacuum = actions.add_parser("vacuum", help="drop old tombstones (and old quarantined segments) and reclaim space")
    for q in (listing, expire, vacuum):
        q.add_argument(
            "--store",
            required=True,
            metavar="URL",
            help="the store: postgresql://... or a SQLite file (sqlite:///path or a path) (required)",
        )
        q.add_argument("--json", action="store_true", help="print one JSON document (default: lines)")
        q.add_argument("--verbose", action="store_true", help="show INFO logs and Python tracebacks (default: off)")
    listing.add_argument(
        "--older-than", type=seconds, default=0.0, metavar="D", help="only units older than D (default 0: all)"
    )
    expire.add_argument(
        "--older-than",
        type=seconds,
        required=True,
        metavar="D",
        help="age (30m, 12h, 7d) of the first segment beyond which an incomplete message expires (required)",
    )
    vacuum.add_argument(
        "--retention",
        type=seconds,
        default=7 * 86400.0,
        metavar="D",
        help="keep tombstones of units settled or expired within D (default 7d); a copy redelivered later is "
        "taken as new",
    )
    vacuum.add_argument(
        "--quarantine", action="store_true", help="also drop quarantined segments older than --retention"
    )
    for q in (expire, vacuum):
        q.add_argument("--dry-run", action="store_true", help="say what would change, change nothing")
    return p


def _open(url: str) -> SegmentStore:
    """The store, never created: a SQLite file must exist."""
    if not url.startswith(("postgresql://", "postgres://")):
        path = url.removeprefix("sqlite://") if url.startswith("sqlite://") else url
        if not Path(path).is_file():
            raise UsageError(f"--store {url}: no such SQLite file")
    return open_store(url, member="reassemble-store")


def _report(rep: UnitReport, now: float) -> dict[str, Any]:
    return {
        "group_id": rep.group_id.hex(),
        "unit": rep.unit,
        "age_seconds": round(max(0.0, now - rep.first_seen), 3),
        "segments": rep.segments,
        "bytes": rep.bytes,
        "missing": [
            {"msg_seq_number": g.msg_seq_number, "ranges": [list(r) for r in g.missing_ranges]} for g in rep.gaps
        ],
        "missing_seq_numbers": list(rep.missing_seq_numbers),
        "last_seq_number": rep.last_seq_number,
    }


def _line(r: dict[str, Any]) -> str:
    gaps = "; ".join(
        f"message {m['msg_seq_number']} missing "
        + ", ".join(f"[{a}, {'?' if b is None else b})" for a, b in m["ranges"])
        for m in r["missing"]
    )
    if r["missing_seq_numbers"]:
        gaps = "; ".join(filter(None, [gaps, "messages missing " + ",".join(map(str, r["missing_seq_numbers"]))]))
    unit = "" if r["unit"] == 0 else f" message {r['unit']}"
    held = f"{counted(r['segments'], 'segment')}  {counted(r['bytes'], 'byte')}"
    return f"{r['group_id']}{unit}  age {r['age_seconds']:.0f}s  {held}  {gaps}"


def run(args: argparse.Namespace) -> int:
    """Run the action; 0 when done."""
    store = _open(args.store)
    now = time.time()
    try:
        if args.action == "list":
            stats = store.stats().as_dict(now)
            units = [_report(r, now) for r in store.incomplete(args.older_than)]
            if args.json:
                print(json.dumps({"stats": stats, "incomplete": units}, indent=2))
            else:
                print(" ".join(f"{k}={v}" for k, v in stats.items()))
                for r in units:
                    print(_line(r))
        elif args.action == "expire":
            done = [_report(r, now) for r in store.expire(args.older_than, dry_run=args.dry_run)]
            verb = "would expire" if args.dry_run else "expired"
            if args.json:
                print(json.dumps({"dry_run": args.dry_run, "expired": done}, indent=2))
            else:
                for r in done:
                    print(f"{verb} {_line(r)}")
                print(f"{verb} {len(done)} incomplete unit(s)")
        else:
            v = store.vacuum(args.retention, dry_run=args.dry_run, quarantine_too=args.quarantine)
            verb = "would drop" if args.dry_run else "dropped"
            if args.json:
                print(json.dumps({"dry_run": args.dry_run, "tombstones": v.tombstones, "quarantined": v.quarantined}))
            else:
                dropped = f"{counted(v.tombstones, 'tombstone')} and {counted(v.quarantined, 'quarantined segment')}"
                print(f"{verb} {dropped}")
    finally:
        store.close()
    return 0
