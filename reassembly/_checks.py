"""Field checks for restoring snapshots: a snapshot is hostile input like any other, every field is checked
before it is used. A failed check raises :class:`Corrupt`; each restore turns it into a STATE_ERROR
:class:`~segmenter.errors.SegmentationError` at its boundary."""

from __future__ import annotations

import math
from typing import Any


class Corrupt(Exception):
    """A check failed (never leaves a restore: it becomes a STATE_ERROR there)."""


def check(ok: Any, what: str) -> None:
    if not ok:
        raise Corrupt(f"bad {what}")


def integer(v: Any, what: str) -> int:
    check(type(v) is int, what)  # not bool, not float: JSON gives exactly what was written
    return int(v)


def opt_integer(v: Any, what: str) -> int | None:
    return None if v is None else integer(v, what)


def time(v: Any, what: str) -> float:
    """A clock value: a finite number."""
    check(type(v) in (int, float) and math.isfinite(v), what)
    return float(v)


def opt_time(v: Any, what: str) -> float | None:
    return None if v is None else time(v, what)
