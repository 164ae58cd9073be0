"""Coverage and arbitration: the one rule for pieces of a message (or object) that may conflict.

Pure and shared: :class:`reassembly.assembler.Assembler` (segments) and
``refmsg`` (reference-message chunks) both decide with these functions, so
they agree on what "complete", "conflict" and "missing" mean.

The rule, over the *multiset* of verified pieces of one message:

1. A candidate is a chain of pieces tiling ``[0, end)`` contiguously, ending
   with exactly one LAST piece, whose header facts all agree (the caller's
   ``fits``). Candidates are enumerated in a canonical order (pieces sorted
   by offset, longest first, then bytes), so arrival order cannot matter.
2. Candidates with the same bytes (and facts) are one *class* (a
   re-segmentation of the same body); each class is verified once, through
   its first member in canonical order (at each offset the longest piece
   first, then the lowest bytes: few pieces, deterministic).
3. Exactly one class passes every check: COMPLETE, that member wins.
   Two or more pass: CONFLICT, nothing is delivered (a CRC cannot tell a
   forged copy from the real one). None passes: FAILED with the first error
   in canonical order. No candidate: INCOMPLETE.
4. The search is bounded (``limit`` candidates, ``limit`` steps per piece):
   beyond it the outcome is CONFLICT, whatever the order.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Generic, NamedTuple, Protocol, TypeVar

from .buffers import Buffer, same_bytes
from .errors import ConflictError, Reason, SegmentationError

MAX_CANDIDATES = 64  # complete candidates examined per message; more is a conflict


class Span(NamedTuple):
    """Half-open byte range [start, end)."""

    start: int
    end: int

    @property
    def length(self) -> int:
        return self.end - self.start


class RangeSet:
    """Disjoint, merged half-open ranges, kept sorted.

    ``spans``: the ranges to start with, ``(start, end)`` half-open pairs in any order.
    """

    __slots__ = ("_ends", "_starts")

    def __init__(self, spans: Iterable[tuple[int, int]] = ()) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        for start, end in spans:
            self.add(start, end)

    def add(self, start: int, end: int) -> None:
        if end <= start:
            return
        ends = self._ends
        if not ends or start > ends[-1]:  # the common case: pieces arriving in order
            self._starts.append(start)
            ends.append(end)
            return
        if start == ends[-1]:  # ... and touching the last range
            ends[-1] = end
            return
        i = bisect.bisect_left(ends, start)  # first range that ends at or after start
        j = bisect.bisect_right(self._starts, end)  # ranges [i, j) touch or overlap [start, end)
        if i < j:
            start = min(start, self._starts[i])
            end = max(end, ends[j - 1])
        self._starts[i:j] = [start]
        ends[i:j] = [end]

    def covered(self, start: int, end: int) -> list[Span]:
        """The parts of [start, end) already present.

        ``start``, ``end``: the half-open range asked about.
        """
        out: list[Span] = []
        i = bisect.bisect_right(self._ends, start)
        while i < len(self._starts) and self._starts[i] < end:
            out.append(Span(max(start, self._starts[i]), min(end, self._ends[i])))
            i += 1
        return out

    def missing(self, start: int, end: int) -> list[Span]:
        """The parts of [start, end) not yet present.

        ``start``, ``end``: the half-open range asked about.
        """
        out: list[Span] = []
        cursor = start
        for span in self.covered(start, end):
            if span.start > cursor:
                out.append(Span(cursor, span.start))
            cursor = span.end
        if cursor < end:
            out.append(Span(cursor, end))
        return out

    def covers(self, start: int, end: int) -> bool:
        if start >= end:
            return True
        i = bisect.bisect_right(self._starts, start) - 1
        return i >= 0 and self._ends[i] >= end

    def spans(self) -> tuple[Span, ...]:
        return tuple(Span(s, e) for s, e in zip(self._starts, self._ends, strict=True))

    @property
    def total(self) -> int:
        return sum(e - s for s, e in zip(self._starts, self._ends, strict=True))

    @property
    def max_end(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __len__(self) -> int:
        return len(self._starts)


def gaps(present: RangeSet, end: int | None) -> tuple[tuple[int, int | None], ...]:
    """Missing ranges of ``[0, end)``; with ``end`` unknown, an open tail ``(last covered, None)``.

    Computed from the union of every piece held, whatever their headers say, so the
    report is the same for any arrival order.
    """
    if end is not None:
        return tuple(tuple(s) for s in present.missing(0, end))  # type: ignore[misc]
    out: list[tuple[int, int | None]] = [tuple(s) for s in present.missing(0, present.max_end)]  # type: ignore[misc]
    out.append((present.max_end, None))
    return tuple(out)


class Reference:
    """The bytes seen so far, by position: every new piece is compared where it overlaps them.

    Holds views (no copies). When every piece agrees with the reference, all pieces agree
    pairwise, so every assembly of them has the same bytes: one candidate per set of facts.
    """

    __slots__ = ("_pieces", "_starts", "present")

    def __init__(self) -> None:
        self.present = RangeSet()
        self._starts: list[int] = []
        self._pieces: list[memoryview] = []

    def disagreement(self, offset: int, data: Buffer) -> Span | None:
        """The first overlapping range where ``data`` differs from what was seen, else ``None``."""
        view = memoryview(data).cast("B") if not isinstance(data, memoryview) else data
        for span in self.present.covered(offset, offset + len(view)):
            if not same_bytes(self.read(span.start, span.end), view[span.start - offset : span.end - offset]):
                return span
        return None

    def add(self, offset: int, data: Buffer) -> None:
        """Keep the parts of ``data`` not seen before."""
        view = memoryview(data).cast("B") if not isinstance(data, memoryview) else data
        for span in self.present.missing(offset, offset + len(view)):
            at = bisect.bisect_left(self._starts, span.start)
            self._starts.insert(at, span.start)
            self._pieces.insert(at, view[span.start - offset : span.end - offset])
        self.present.add(offset, offset + len(view))

    def read(self, start: int, end: int) -> bytes:
        """Bytes [start, end) (the range must be present)."""
        out: list[memoryview] = []
        i = bisect.bisect_right(self._starts, start) - 1
        while start < end:
            piece_start, piece = self._starts[i], self._pieces[i]
            take = min(end, piece_start + len(piece))
            out.append(piece[start - piece_start : take - piece_start])
            start = take
            i += 1
        return b"".join(out)


class Tile(Protocol):
    """What the search needs of a piece."""

    @property
    def offset(self) -> int: ...

    @property
    def end(self) -> int: ...

    @property
    def last(self) -> bool: ...


T = TypeVar("T", bound=Tile)
S = TypeVar("S")
P = TypeVar("P")


def tilings(
    by_offset: Mapping[int, Sequence[T]],
    fits: Callable[[S, T], S | None],
    start: S,
    *,
    agree: bool = False,
    limit: int = MAX_CANDIDATES,
    count: int | None = None,
) -> tuple[list[tuple[tuple[T, ...], S]], bool]:
    """Every chain of pieces tiling ``[0, end of a LAST piece)`` whose facts agree, with its merged
    facts; and whether the search was cut off (more than ``limit`` candidates, or ``limit`` steps per piece).

    ``by_offset`` lists the pieces starting at each offset in canonical order; ``fits``
    merges a piece's facts into the chain's (``None``: they disagree). With ``agree`` (every
    piece agrees with every overlapping one, see :class:`Reference`) chains reaching the same
    position with the same facts have the same bytes, so each such state is explored once:
    re-segmentations cost no combinations, only the first chain in canonical order is kept.
    ``count`` is the number of pieces when the caller knows it (the search then reads only the
    offsets it reaches: ``by_offset`` may put each in order on demand).
    """
    pieces = sum(len(v) for v in by_offset.values()) if count is None else count
    budget = limit * (1 + pieces)
    out: list[tuple[tuple[T, ...], S]] = []
    path: list[T] = []
    frames: list[tuple[int, S, int]] = [(0, start, 0)]  # (position, facts so far, next option)
    seen: set[tuple[int, S]] = set()
    steps = 0
    while frames:
        pos, facts, i = frames[-1]
        options = by_offset.get(pos, ())
        if i >= len(options):
            frames.pop()
            if frames:
                path.pop()
            continue
        frames[-1] = (pos, facts, i + 1)
        piece = options[i]
        steps += 1
        if steps > budget:
            return out, True
        merged = fits(facts, piece)
        if merged is None:
            continue
        if piece.last:
            out.append(((*path, piece), merged))
            if len(out) > limit:
                return out[:limit], True
        elif piece.end > pos:
            if agree:
                if (piece.end, merged) in seen:
                    continue
                seen.add((piece.end, merged))
            path.append(piece)
            frames.append((piece.end, merged, 0))
    return out, False


class Outcome(str, Enum):
    COMPLETE = "complete"
    CONFLICT = "conflict"
    FAILED = "failed"
    INCOMPLETE = "incomplete"


@dataclass(frozen=True)
class Arbitration(Generic[T, S, P]):
    """The decision for one message: its outcome, the winning chain, its facts and payload, or the error."""

    outcome: Outcome
    winner: tuple[T, ...] = ()
    facts: S | None = None
    payload: P | None = None
    error: SegmentationError | None = None


def arbitrate(
    candidates: list[tuple[tuple[T, ...], S]],
    cut_off: bool,
    *,
    verify: Callable[[tuple[T, ...], S], P],
    same: Callable[[tuple[T, ...], tuple[T, ...]], bool],
    what: str = "message",
) -> Arbitration[T, S, P]:
    """Apply the rule (module docstring) to candidates from :func:`tilings`.

    ``verify`` runs every check and returns the payload (raising a SegmentationError
    otherwise); ``same`` tells candidates with identical bytes apart from different ones
    (facts are compared here). A class is verified through its first member in canonical order.
    """
    if cut_off:
        return _conflict(
            f"{what}: more than {MAX_CANDIDATES} ways to assemble conflicting copies",
            candidates=len(candidates),
            limit=MAX_CANDIDATES,
        )
    if not candidates:
        return Arbitration(Outcome.INCOMPLETE)
    classes: list[list[tuple[tuple[T, ...], S]]] = []
    for c in candidates:
        for members in classes:
            if members[0][1] == c[1] and same(members[0][0], c[0]):
                members.append(c)
                break
        else:
            classes.append([c])
    passing: list[tuple[tuple[tuple[T, ...], S], P]] = []
    first_error: SegmentationError | None = None
    last_built: tuple[tuple[T, ...], S] | None = None
    for members in classes:
        best = last_built = members[0]
        try:
            passing.append((best, verify(*best)))
        except SegmentationError as exc:
            first_error = first_error or exc
            continue
        if len(passing) > 1:
            return _conflict(
                f"{what}: {len(passing)} assemblies with different bytes pass every check; none is delivered",
                candidates=len(candidates),
                distinct=len(classes),
            )
    if not passing:
        return Arbitration(Outcome.FAILED, error=first_error)
    winner, payload = passing[0]
    if last_built is not winner:  # a later class failed after the winner was built: build it again
        payload = verify(*winner)
    return Arbitration(Outcome.COMPLETE, winner[0], winner[1], payload)


def _conflict(message: str, **details: int) -> Arbitration[T, S, P]:
    return Arbitration(Outcome.CONFLICT, error=ConflictError(message, reason=Reason.CONFLICTING_DUPLICATE, **details))
