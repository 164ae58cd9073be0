"""The orphan sweep: delete the stored objects nobody will read again, and never one still on its way.

An object is deleted when

* ``settled``: its ledger row is settled (the consumer committed and said so), whatever its age; or
* ``unreferenced``: no ledger row names it and it is older than ``older_than`` (its producer
  died between the put and the record, or it was stored before there was a ledger).

An object a live row names (recorded, not settled) is never deleted, however old: such rows
are reported as stale live references once older than ``older_than`` (a consumer that is
behind, or a message lost before it was consumed). Live rows whose object is not in the
store are reported as missing (a payload deleted before its message was consumed).

The decision is :func:`plan_sweep`, a pure function of the listing, the rows, the time and
``older_than``; :func:`sweep` does the I/O around it, in this order:

1. **List the store, then read the ledger.** A producer puts before it records, so an object
   put and recorded while the sweep runs is either missing from the listing (not considered)
   or recorded by the time the rows are read (live: kept). Reading the ledger first would let
   an object put and recorded in between be listed with no row naming it; only its age would
   protect it. What remains is an object listed with no row because its producer records it
   more than ``older_than`` after the put: choose ``older_than`` longer than that can take.
2. **Before each delete, read that key's row again** and skip the object if it changed (recorded
   since, or recorded again under a reused key).
3. **Delete the object, then mark its settled row deleted** (kept, with ``deleted_at``). A crash
   in between leaves a settled row whose object is gone, which the next sweep marks; the other
   order could mark a row whose object is still there. Settled rows whose object is already
   gone (the consumer deleted it with :func:`refmsg.release`) are marked too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta, timezone
from enum import Enum
from typing import NamedTuple

from reassembly.claimcheck.ledger import Ledger, LedgerEntry
from refmsg import ListableStore, ObjectInfo
from segmenter.errors import Reason, SegmentationError
from segmenter.sources import argument_error

log = logging.getLogger(__name__)


class SweepRefused(SegmentationError):
    """The sweep would act on a store the ledger knows nothing of: refused before anything is deleted."""

    default_reason = Reason.ARGUMENT_ERROR


class Why(str, Enum):
    """Why an object is deleted."""

    SETTLED = "settled"  # its ledger row is settled: the consumer committed
    UNREFERENCED = "unreferenced"  # no ledger row names it, and it is older than older_than


class Deletion(NamedTuple):
    """One object the sweep deletes (or, in a dry run, would delete)."""

    key: str
    """The object's key in the store."""
    size: int
    """The object's size in bytes, as listed."""
    modified: datetime
    """When the store last wrote the object, as listed (timezone-aware)."""
    age: timedelta
    """How old the object was when the listing began: ``at - modified``."""
    why: Why
    """Why it is deleted: its ledger row is settled, or no row names it and it is old enough."""
    entry: LedgerEntry | None
    """The settled row; None for an unreferenced object."""


class SweepPlan(NamedTuple):
    """What :func:`plan_sweep` decided for one listing and one set of ledger rows."""

    deletions: tuple[Deletion, ...]
    """The objects to delete, sorted by key."""
    listed: int
    """Objects in the listing."""
    live: int
    """Listed objects kept because a live row names them."""
    young: int
    """Listed objects no row names, not older than older_than: kept."""
    stale: tuple[LedgerEntry, ...]
    """Live rows of listed objects recorded more than older_than ago, oldest first."""
    missing: tuple[LedgerEntry, ...]
    """Live rows recorded before the listing whose object it lacks."""
    gone: tuple[LedgerEntry, ...]
    """Settled rows whose object the listing lacks (marked deleted by the sweep)."""

    @property
    def bytes(self) -> int:
        """The bytes the deletions free."""
        return sum(d.size for d in self.deletions)


def plan_sweep(
    listing: Iterable[ObjectInfo], entries: Iterable[LedgerEntry], now: datetime, older_than: timedelta
) -> SweepPlan:
    """Decide, without I/O, what a sweep deletes (see the module): for any listing and rows, exactly
    the listed objects a settled row names plus those no row names that are older than ``older_than``.

    ``now`` is when the listing began: a live row recorded after it is not reported missing
    (its object may have been put after the listing). Swept rows (``deleted_at`` set) name no
    object: an object under such a key was put again without a record, and counts as unreferenced.

    ``listing``: the store's objects, as listed. ``entries``: the ledger's rows for the store. ``older_than``: how old
    an object no row names must be before it is deleted.
    """
    if now.tzinfo is None or now.utcoffset() is None:
        raise argument_error(f"now must be a timezone-aware datetime, not {now!r}")
    if older_than < timedelta(0):
        raise argument_error(f"older_than must not be negative, got {older_than}")
    rows = {e.key: e for e in entries if e.deleted_at is None}
    deletions: list[Deletion] = []
    stale: list[LedgerEntry] = []
    listed = live = young = 0
    seen: set[str] = set()
    for obj in listing:
        listed += 1
        seen.add(obj.key)
        entry = rows.get(obj.key)
        age = now - obj.modified
        if entry is not None and entry.live:
            live += 1
            if entry.stored_at is not None and now - entry.stored_at > older_than:
                stale.append(entry)
        elif entry is not None:
            deletions.append(Deletion(obj.key, obj.size, obj.modified, age, Why.SETTLED, entry))
        elif age > older_than:
            deletions.append(Deletion(obj.key, obj.size, obj.modified, age, Why.UNREFERENCED, None))
        else:
            young += 1
    unlisted = [e for key, e in sorted(rows.items()) if key not in seen]
    missing = [e for e in unlisted if e.live and e.stored_at is not None and e.stored_at <= now]
    gone = [e for e in unlisted if e.settled]
    return SweepPlan(
        tuple(sorted(deletions, key=lambda d: d.key)),
        listed,
        live,
        young,
        tuple(sorted(stale, key=lambda e: (e.stored_at or now, e.key))),
        tuple(missing),
        tuple(gone),
    )


class Outcome(str, Enum):
    """What became of one planned deletion."""

    WOULD_DELETE = "would delete"  # a dry run
    DELETED = "deleted"
    CHANGED = "kept"  # its ledger row changed after it was planned: not deleted
    FAILED = "failed"  # the store refused the delete


class SweepResult(NamedTuple):
    """A sweep's plan and what was done with it."""

    store: str
    """The name of the store swept (as its ledger rows name it)."""
    at: datetime
    """When the listing began: the ages are counted to it."""
    plan: SweepPlan
    """What the sweep decided from the listing and the ledger."""
    dry_run: bool
    """True when nothing was deleted or marked: ``plan.deletions`` says what would have been."""
    deleted: tuple[Deletion, ...]
    """The objects deleted, in key order (empty in a dry run)."""
    changed: tuple[Deletion, ...]
    """Kept: recorded (again) while the sweep ran."""
    failed: tuple[tuple[Deletion, str], ...]
    """The deletions the store refused, each with its error (one line)."""
    marked: int
    """Settled rows marked deleted whose object was already gone."""


OnObject = Callable[[Deletion, Outcome, "str | None"], None]


def sweep(
    store: ListableStore,
    ledger: Ledger,
    older_than: timedelta,
    *,
    delete: bool = False,
    allow_unknown_store: bool = False,
    now: datetime | None = None,
    on_object: OnObject | None = None,
) -> SweepResult:
    """List ``store``, read ``ledger``'s rows for ``store.name``, plan, and (with ``delete``) delete.

    A dry run (the default) deletes nothing and marks nothing. ``on_object`` is called for each
    planned deletion as it is done (or would be), with its outcome and, for a failure, the
    error. A failed delete does not stop the sweep (see :attr:`SweepResult.failed`).

    Refused (:class:`SweepRefused`, nothing deleted): the store holds objects and the ledger has
    no row for its name: every unreferenced object older than ``older_than`` would go, which is
    almost always a wrong store name or ledger; ``allow_unknown_store`` sweeps it anyway (a store
    whose objects all predate the ledger).

    ``now``: when the listing begins (None: the time now, UTC).
    """
    started = now or datetime.now(timezone.utc)
    listing = list(store.list())  # first the store, then the ledger: see the module
    entries = ledger.entries(store.name)
    if listing and not entries and not allow_unknown_store:
        known = ", ".join(repr(s) for s in ledger.stores()) or "none"
        raise SweepRefused(
            f"the ledger {ledger.url} has no row for store {store.name!r} (it knows: {known}), which holds"
            f" {len(listing)} objects: sweeping would delete every one older than {older_than}; check the"
            " store's name and the ledger (allow_unknown_store sweeps such a store)",
            store=store.name,
            objects=len(listing),
        )
    plan = plan_sweep(listing, entries, started, older_than)
    deleted: list[Deletion] = []
    changed: list[Deletion] = []
    failed: list[tuple[Deletion, str]] = []
    for doomed in plan.deletions:
        if not delete:
            _tell(on_object, doomed, Outcome.WOULD_DELETE, None)
            continue
        if not _unchanged(ledger, store.name, doomed):
            changed.append(doomed)
            _tell(on_object, doomed, Outcome.CHANGED, None)
            continue
        try:
            store.delete(doomed.key)
        except (SegmentationError, OSError) as exc:
            error = " ".join(str(exc).split())
            log.warning("cannot delete %r from store %r: %s", doomed.key, store.name, error)
            failed.append((doomed, error))
            _tell(on_object, doomed, Outcome.FAILED, error)
            continue
        if doomed.why is Why.SETTLED:
            ledger.mark_deleted(store.name, doomed.key)  # after the object is gone: see the module
        deleted.append(doomed)
        _tell(on_object, doomed, Outcome.DELETED, None)
    marked = sum(ledger.mark_deleted(store.name, e.key) for e in plan.gone) if delete else 0
    return SweepResult(store.name, started, plan, not delete, tuple(deleted), tuple(changed), tuple(failed), marked)


def _unchanged(ledger: Ledger, store: str, doomed: Deletion) -> bool:
    """The key's row is still what the plan saw: settled (the same settlement), or none/swept."""
    row = ledger.entry(store, doomed.key)
    if doomed.why is Why.SETTLED:
        planned = doomed.entry.settled_at if doomed.entry is not None else None
        return row is not None and row.settled and row.settled_at == planned
    return row is None or row.deleted_at is not None


def _tell(on_object: OnObject | None, doomed: Deletion, outcome: Outcome, error: str | None) -> None:
    if on_object is not None:
        on_object(doomed, outcome, error)
