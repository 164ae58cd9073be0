"""The group dispatcher: whole messages handed to parallel workers, one group at a time.

``core`` holds the sans-I/O :class:`Dispatcher` (group ownership, settlement, commit floors),
``model`` its enums and records, ``policy`` the retry and budget decisions, ``offsets`` the
commit-metadata codec. The runners that carry work to threads, tasks and processes are in
``reassembly.runtime``.
"""

from reassembly.dispatcher.core import Dispatcher
from reassembly.dispatcher.model import (
    AfterDead,
    Alone,
    DispatchStats,
    Fenced,
    GroupView,
    Ordering,
    Outcome,
    Revoked,
    Settled,
    Work,
)
from reassembly.dispatcher.policy import Budget, RetryPolicy

__all__ = [
    "AfterDead",
    "Alone",
    "Budget",
    "DispatchStats",
    "Dispatcher",
    "Fenced",
    "GroupView",
    "Ordering",
    "Outcome",
    "RetryPolicy",
    "Revoked",
    "Settled",
    "Work",
]
