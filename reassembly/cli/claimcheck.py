"""``reassemble claimcheck sweep STORE --ledger DB --older-than D``: delete orphaned claim-check payloads.

The job is :func:`reassembly.claimcheck.sweep`: it lists STORE, then reads the ledger's rows for
the store's name, and deletes the objects that are settled or that no row names and are older
than D; never an object a live (recorded, unsettled) row names. A dry run by default: one line
per object it would delete, then a summary line; ``--delete`` deletes.

Refused with exit 2 before anything is deleted: D not a positive duration, a ledger database
that does not exist or cannot be opened, a STORE that cannot be opened or listed (a local path
that is not a directory: never created), a SQLite ledger inside a local STORE (the sweep
would see the database as an unreferenced object), a ``--store-option`` that is not
``KEY=VALUE``, and a non-empty store whose name the ledger has no row for (a wrong
``--store-name`` or ledger would make every old object unreferenced) unless
``--allow-unknown-store``. A delete the store refuses is one line on stderr; the sweep goes on
and exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reassembly._errors import JobError, UsageError, first_line
from reassembly._files import overlap
from reassembly.claimcheck import Deletion, Ledger, Outcome, SweepRefused, SweepResult, Why, sweep
from reassembly.cli._common import conf_pair, seconds
from reassembly.storage.sql import is_postgres
from refmsg import DirectoryStore, ListableStore, StoreError, open_store
from segmenter.errors import SegmentationError

if TYPE_CHECKING:
    from reassembly.cli._common import Subparsers


def add_parser(sub: Subparsers) -> argparse.ArgumentParser:
    """The ``claimcheck`` subcommand and its actions (``sweep``)."""
    p = sub.add_parser(
        "claimcheck",
        help="claim-check housekeeping: sweep orphaned payloads out of an object store",
        description="Claim-check housekeeping over the reference ledger (docs/how-to/claim-check.md).",
    )
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    s = actions.add_parser(
        "sweep",
        help="list (dry run) or delete the settled and the old unreferenced objects of a store",
        description="List STORE, then read the ledger's rows for the store's name; delete the objects whose row "
        "is settled, and those no row names that are older than --older-than. An object a live (recorded, "
        "unsettled) row names is never deleted, whatever its age. A dry run unless --delete.",
    )
    s.add_argument(
        "store",
        metavar="STORE",
        help="the store: a directory (or file:// URL) or an fsspec URL such as s3://bucket/prefix, gs://, abfs://",
    )
    s.add_argument(
        "--ledger",
        required=True,
        metavar="DB",
        help="the reference ledger the producers record in: a SQLite file or a postgresql:// URL (required)",
    )
    s.add_argument(
        "--older-than",
        required=True,
        type=seconds,
        metavar="D",
        help="age (30m, 12h, 7d) beyond which an object no ledger row names is deleted; longer than a producer "
        "can take between its put and its record (required)",
    )
    s.add_argument(
        "--delete", action="store_true", help="delete the objects listed (default: off, a dry run that deletes nothing)"
    )
    s.add_argument(
        "--store-name",
        default=None,
        metavar="NAME",
        help="the store's name in references and ledger rows (default: dir for a directory, else the URL's "
        "protocol, e.g. s3)",
    )
    s.add_argument(
        "--store-option",
        type=conf_pair,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option for the store's file system, repeatable (e.g. endpoint_url=http://127.0.0.1:9000 for "
        "s3fs); a VALUE that is JSON (true, 3, {...}) is taken as JSON, anything else as text (default: none)",
    )
    s.add_argument(
        "--allow-unknown-store",
        action="store_true",
        help="sweep a non-empty store the ledger has no row for: every object older than D goes (default: refused)",
    )
    s.add_argument("--verbose", action="store_true", help="show INFO logs and Python tracebacks (default: off)")
    return p


def _option_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _open_store(args: argparse.Namespace) -> ListableStore:
    """STORE opened without creating anything: a local path must be an existing directory."""
    options = {key: _option_value(value) for key, value in args.store_option}
    scheme, sep, rest = args.store.partition("://")
    local = not sep or scheme in ("file", "local")
    if local and not Path(rest if sep else args.store).is_dir():
        raise UsageError(f"STORE is not a directory: {args.store}")
    try:
        return open_store(args.store, name=args.store_name, **options)
    except (SegmentationError, TypeError, ValueError, OSError) as exc:
        raise UsageError(f"cannot open STORE {args.store}: {first_line(exc)}") from None


def _check_ledger(args: argparse.Namespace, store: ListableStore) -> None:
    if is_postgres(args.ledger):
        return
    ledger = Path(args.ledger)
    if not ledger.is_file():
        raise UsageError(f"--ledger: no such database: {args.ledger}")
    if isinstance(store, DirectoryStore) and overlap(ledger.resolve(), Path(store.root).resolve()):
        raise UsageError(f"--ledger {args.ledger} is inside STORE {args.store}: the sweep would take it for an object")


def _open_ledger(args: argparse.Namespace) -> Ledger:
    try:
        return Ledger.open(args.ledger)
    except SegmentationError as exc:
        raise UsageError(f"cannot open --ledger: {first_line(exc)}") from None  # names the URL, password hidden


def run(args: argparse.Namespace) -> int:
    """Run the one action there is, ``sweep``."""
    if args.older_than <= 0:
        raise UsageError("--older-than must be longer than 0 (producers record a moment after they store)")
    older_than = timedelta(seconds=args.older_than)
    store = _open_store(args)
    _check_ledger(args, store)
    ledger = _open_ledger(args)
    try:
        try:
            result = sweep(
                store,
                ledger,
                older_than,
                delete=args.delete,
                allow_unknown_store=args.allow_unknown_store,
                on_object=_line,
            )
        except SweepRefused as exc:
            known = ", ".join(repr(s) for s in ledger.stores()) or "none"
            raise UsageError(
                f"the ledger has no row for store {store.name!r} (it knows: {known}) and the store holds"
                f" {exc.details.get('objects')} objects: all older than {age(older_than)} would be deleted;"
                " check STORE, --store-name and --ledger, or pass --allow-unknown-store"
            ) from None
        except StoreError as exc:  # deletes are caught one by one: this is the listing
            raise UsageError(f"cannot list STORE {args.store}: {first_line(exc)}") from None
    finally:
        ledger.close()
    for entry in result.plan.missing:
        recorded = age(result.at - entry.stored_at) if entry.stored_at else "?"
        mid = entry.message_id or "unknown"
        print(f"missing: {entry.key} (live reference recorded {recorded} ago, message {mid}): not in the store")
    print(summary(result, older_than))
    if result.failed:
        doomed, error = result.failed[0]
        raise JobError(f"{len(result.failed)} objects could not be deleted, e.g. {doomed.key}: {error}")
    return 0


def age(span: timedelta) -> str:
    """A duration in its two largest units: ``3d 2h``, ``7d``, ``5h 10m``, ``4m 30s``, ``12s``, ``250ms``."""
    sign, span = ("-", -span) if span < timedelta(0) else ("", span)
    if span < timedelta(seconds=1):
        return f"{sign}{span // timedelta(milliseconds=1)}ms"
    total = int(span.total_seconds())
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    for big, unit, small, next_unit in ((days, "d", hours, "h"), (hours, "h", minutes, "m"), (minutes, "m", secs, "s")):
        if big:
            return f"{sign}{big}{unit}" + (f" {small}{next_unit}" if small else "")
    return f"{sign}{secs}s"


def _line(doomed: Deletion, outcome: Outcome, error: str | None) -> None:
    """One line per object: what became of it, its key, size, age and why."""
    what = f"{doomed.key} ({doomed.size} bytes, {age(doomed.age)} old): {doomed.why.value}"
    if outcome is Outcome.FAILED:
        print(f"reassemble: error: cannot delete {what}: {error}", file=sys.stderr)
    elif outcome is Outcome.CHANGED:
        print(f"kept: {what}, but its ledger row changed during the sweep")
    else:
        print(f"{outcome.value}: {what}")
    sys.stdout.flush()


def summary(result: SweepResult, older_than: timedelta) -> str:
    """The last line: what was listed, deleted (or would be) and why, kept and why, what is wrong."""
    plan = result.plan
    done = plan.deletions if result.dry_run else result.deleted
    settled = sum(d.why is Why.SETTLED for d in done)
    verb = "would delete" if result.dry_run else "deleted"
    parts = [
        f"{plan.listed} objects listed",
        f"{verb} {len(done)} ({sum(d.size for d in done)} bytes; {settled} settled,"
        f" {len(done) - settled} unreferenced)",
        f"kept {plan.live} live, {plan.young} unreferenced not older than {age(older_than)}",
    ]
    if plan.stale:
        oldest = plan.stale[0]
        since = age(result.at - oldest.stored_at) if oldest.stored_at else "?"
        parts.append(
            f"{len(plan.stale)} stale live references (unsettled for over {age(older_than)}; oldest {oldest.key},"
            f" recorded {since} ago)"
        )
    else:
        parts.append("0 stale live references")
    parts.append(f"{len(plan.missing)} live references missing from the store")
    if plan.gone:
        gone = f"{len(plan.gone)} settled rows whose object is already gone"
        parts.append(gone + ("" if result.dry_run else f" ({result.marked} marked deleted)"))
    if result.changed:
        parts.append(f"{len(result.changed)} kept because their row changed during the sweep")
    if result.failed:
        parts.append(f"{len(result.failed)} failed")
    tail = "; dry run: nothing deleted (--delete deletes)" if result.dry_run else ""
    return f"sweep {result.store!r}: " + "; ".join(parts) + tail
