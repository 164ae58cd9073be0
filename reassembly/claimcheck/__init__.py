"""The claim check's reference ledger and orphan sweep (docs/how-to/claim-check.md, "Orphans").

``refmsg`` stores payloads and resolves references; it cannot tell an orphaned object from one
still on its way. Here the offloading producer records each stored object in a ledger
(:class:`Ledger`, its own table in a SQLite or PostgreSQL database, which may be the
collector's), the consumer settles it after its commit, and :func:`sweep` (``reassemble claimcheck sweep``) deletes the
settled objects and the old ones no row names, never one a live row names.
"""

from reassembly.claimcheck.ledger import Ledger, LedgerEntry, Recorded, Settled, offload_recorded
from reassembly.claimcheck.sweep import (
    Deletion,
    Outcome,
    SweepPlan,
    SweepRefused,
    SweepResult,
    Why,
    plan_sweep,
    sweep,
)

__all__ = [
    "Deletion",
    "Ledger",
    "LedgerEntry",
    "Outcome",
    "Recorded",
    "Settled",
    "SweepPlan",
    "SweepRefused",
    "SweepResult",
    "Why",
    "offload_recorded",
    "plan_sweep",
    "sweep",
]
