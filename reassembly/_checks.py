"""Field checks for restoring snapshots: a snapshot is hostile input like any other, every field is checked
before it is used. A failed check raises :class:`Corrupt`; :func:`restoring`, around each restore, turns
it into a STATE_ERROR :class:`~segmenter.errors.SegmentationError` at the restore's boundary, so a
caller sees one exception type with one machine-readable reason whatever was wrong."""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from segmenter.errors import Reason, SegmentationError


class Corrupt(Exception):
    """A check failed (never leaves a restore: it becomes a STATE_ERROR there); ``details`` are the
    numbers that explain it, passed on to the error."""

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.details = details


# What a hostile document provokes in the code that reads it (a string where a list belongs, a key
# missing, JSON nested past the recursion limit, a field out of an enum's range): damage, like a
# failed check, never a crash of the caller.
_DAMAGE = (Corrupt, ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError, struct.error)


@contextmanager
def restoring(what: str) -> Iterator[None]:
    """Around a restore: damage found inside is a STATE_ERROR naming ``what`` (its details kept);
    a :class:`~segmenter.errors.SegmentationError` raised inside passes as it is."""
    try:
        yield
    except _DAMAGE as exc:
        details = exc.details if isinstance(exc, Corrupt) else {}
        raise SegmentationError(f"corrupt {what}: {exc}", reason=Reason.STATE_ERROR, **details) from None


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
