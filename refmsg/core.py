"""Sans-I/O receiver core: which byte ranges of an object are applied, and what a chunk may do.

No files, no clock: the receiver's file adapter and the pure
:func:`assemble_chunks` (for Spark) both drive :class:`ObjectState`. A chunk is
first *planned* (validated against what is known: the LAST chunk fixes the
object length, the integrity block may declare length and checksum), which
says which of its bytes overlap applied ranges (to compare) and which are new
(to write); the adapter then compares and writes and *commits*.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from segmenter.checksum import DEFAULT_ALGORITHM, ChecksumAlgorithm, checksum
from segmenter.coverage import RangeSet as RangeSet  # re-exported: refmsg's public name
from segmenter.coverage import Reference
from segmenter.coverage import Span as Span
from segmenter.digest import NO_DIGESTS, NO_POLICY, DigestPolicy, Digests, parse_extension
from segmenter.errors import (
    ChecksumError,
    ConflictError,
    IncompleteError,
    MessageTooBigError,
    OffsetError,
    OriginalLengthError,
    Reason,
    SegmentationError,
)

from .integrity import verify_object

DEFAULT_MAX_OBJECT_SIZE = 1 << 40  # 1 TiB


class Plan(NamedTuple):
    """What one chunk does: bytes to compare with applied data, bytes to write."""

    offset: int
    length: int
    compare: tuple[Span, ...]
    write: tuple[Span, ...]
    last: bool
    object_length: int | None
    object_checksum: int | None

    @property
    def is_duplicate(self) -> bool:
        """True when every byte is already applied (the adapter still compares)."""
        return not self.write


@dataclass
class ObjectState:
    """What is known about one object under transfer."""

    name: str
    """The object's name, as its reference messages give it (named in errors)."""
    algorithm: ChecksumAlgorithm = DEFAULT_ALGORITHM
    """The checksum algorithm of every chunk and of the whole object."""
    max_object_size: int = DEFAULT_MAX_OBJECT_SIZE
    """The largest object accepted, in bytes: a chunk reaching past it is refused."""
    applied: RangeSet = field(default_factory=RangeSet)
    """The byte ranges of the object applied so far."""
    object_length: int | None = None
    """The object's length once a chunk declared it (the LAST one, or any declaring chunk); None: not yet."""
    object_checksum: int | None = None
    """The whole object's checksum once a chunk declared it; None: not yet."""
    last_arrived: bool = False
    """Whether the chunk flagged LAST has arrived."""
    conflict: bool = False
    """Two verified chunks disagreed: the object is never delivered."""
    digests: Digests = NO_DIGESTS
    """SHA-256 / HMAC the LAST message declared."""

    @property
    def complete(self) -> bool:
        """LAST has arrived and every byte of [0, object length) is applied (and no conflict)."""
        return (
            not self.conflict
            and self.last_arrived
            and self.object_length is not None
            and self.applied.covers(0, self.object_length)
        )

    def gaps(self) -> list[Span]:
        """Missing ranges up to the known (or largest seen) end."""
        end = self.object_length if self.object_length is not None else self.applied.max_end
        return self.applied.missing(0, end)

    def plan(
        self,
        offset: int,
        length: int,
        *,
        last: bool,
        object_length: int | None = None,
        object_checksum: int | None = None,
    ) -> Plan:
        """Validate a chunk against the state (nothing changes); raise on any contradiction.

        ``offset``, ``length``: the chunk's byte range in the object. ``last``: the chunk carries LAST (the object's
        end). ``object_length``, ``object_checksum``: what the chunk declares about the whole object (None: nothing).
        """
        if self.conflict:
            raise ConflictError(
                f"object {self.name!r} is in conflict (two verified copies differ); nothing is delivered",
                offset=offset,
            )
        if offset < 0 or length < 0:
            raise OffsetError(f"chunk [{offset}, +{length}) out of range", offset=offset, length=length)
        end = offset + length
        if end > self.max_object_size or (object_length or 0) > self.max_object_size:
            raise MessageTooBigError(
                f"object {self.name!r} would exceed {self.max_object_size} bytes",
                end=end,
                object_length=object_length,
                limit=self.max_object_size,
            )
        if last and object_length is not None and object_length != end:
            raise OriginalLengthError(
                f"LAST chunk ends at {end}, object length {object_length}", end=end, object_length=object_length
            )
        if last:
            object_length = end
        # From here on the chunk is consistent in itself; what contradicts an earlier verified chunk
        # (its length, its end) is a conflict: whichever came first would otherwise win.
        known = self.object_length
        if object_length is not None and known is not None and object_length != known:
            raise ConflictError(
                f"object {self.name!r}: length {object_length} contradicts {known} declared by another chunk;"
                " nothing is delivered",
                object_length=object_length,
                known=known,
            )
        if object_length is not None and end > object_length:
            raise OffsetError(
                f"chunk [{offset}, {end}) runs past its own object length {object_length}",
                offset=offset,
                end=end,
                object_length=object_length,
            )
        if known is not None and end > known:
            raise ConflictError(
                f"chunk [{offset}, {end}) runs past the object length {known} declared by another chunk;"
                " nothing is delivered",
                offset=offset,
                end=end,
                known=known,
            )
        if last and self.applied.max_end > end:
            raise ConflictError(
                f"LAST chunk ends at {end}, another chunk applied bytes up to {self.applied.max_end};"
                " nothing is delivered",
                end=end,
                applied_end=self.applied.max_end,
            )
        if object_checksum is not None and self.object_checksum is not None and object_checksum != self.object_checksum:
            raise ConflictError(
                f"object {self.name!r}: checksum 0x{object_checksum:08x} contradicts 0x{self.object_checksum:08x}",
                object_checksum=object_checksum,
                known=self.object_checksum,
            )
        return Plan(
            offset,
            length,
            tuple(self.applied.covered(offset, end)),
            tuple(self.applied.missing(offset, end)),
            last,
            object_length,
            object_checksum,
        )

    def commit(self, plan: Plan) -> None:
        """Record a planned chunk as applied (its new bytes written and durable).

        ``plan``: what :meth:`plan` returned for the chunk.
        """
        for span in plan.write:
            self.applied.add(span.start, span.end)
        self.note(plan.last, plan.object_length, plan.object_checksum)

    def note_digests(self, digests: Digests) -> bool:
        """Record declared digests; True when they are new. Different digests from another copy
        of the LAST message: a conflict (which is genuine is not for a guess to say).

        ``digests``: the digests the chunk declares for the whole object.
        """
        if not digests or digests == self.digests:
            return False
        if self.digests:
            raise ConflictError(f"object {self.name!r}: digests differ from those declared before")
        self.digests = digests
        return True

    def note(self, last: bool, object_length: int | None, object_checksum: int | None) -> None:
        """Record what a chunk declared about the whole object.

        ``last``: the chunk carries LAST. ``object_length``, ``object_checksum``: what it declares (None: nothing).
        """
        if object_length is not None:
            self.object_length = object_length
        if object_checksum is not None:
            self.object_checksum = object_checksum
        self.last_arrived = self.last_arrived or last


def verify_chunk(algorithm: ChecksumAlgorithm, data: Any, expected: int | None, offset: int) -> None:
    """Raise :class:`ChecksumError` when ``data`` does not match its chunk checksum."""
    if expected is None:
        return
    actual = checksum(algorithm, data)
    if actual != expected:
        raise ChecksumError(
            f"chunk at {offset}: checksum 0x{actual:08x}, expected 0x{expected:08x}",
            reason=Reason.DATA_CHECKSUM_ERROR,
            offset=offset,
            stored=expected,
            computed=actual,
        )


def incomplete_error(state: ObjectState) -> IncompleteError:
    """The error for an object that cannot be finished yet."""
    gaps = state.gaps()
    what = "LAST chunk missing" if not state.last_arrived else f"{len(gaps)} gap(s)"
    return IncompleteError(
        f"object {state.name!r} incomplete: {what}",
        reason=Reason.INCOMPLETE_MSG,
        gaps=[tuple(g) for g in gaps[:16]],
        last_arrived=state.last_arrived,
        applied=state.applied.total,
    )


class ChunkRow(NamedTuple):
    """One chunk of an object as a table row (the Spark helper's input)."""

    offset: int
    """Where the chunk starts in the object, in bytes (the header's DataLogicalOffset)."""
    length: int
    """Bytes of data the chunk carries (the header's DataLogicalLength)."""
    data: bytes | None
    """The chunk's bytes; None for a header-only message, which is refused here."""
    last: bool
    """True when the chunk's header carries the LAST flag."""
    chunk_checksum: int | None = None
    """The checksum of the chunk's data, verified before it is applied; None: not carried."""
    object_checksum: int | None = None
    """The whole object's checksum (on the LAST chunk); None: not carried."""
    digests: bytes | None = None
    """The integrity block's digest records (on the LAST chunk)."""
    object_length: int | None = None
    """The object length the integrity block declares (checked as the receiver does)."""


def _as_row(row: Any) -> ChunkRow:
    if isinstance(row, ChunkRow):
        return row
    if hasattr(row, "asDict"):  # pyspark.sql.Row
        row = row.asDict()
    if isinstance(row, Mapping):
        fields: dict[str, Any] = {k: row[k] for k in ChunkRow._fields if k in row}
        return ChunkRow(**fields)
    return ChunkRow(*row)


def assemble_chunks(
    rows: Iterable[ChunkRow | Mapping[str, Any] | tuple[Any, ...]],
    *,
    algorithm: ChecksumAlgorithm = DEFAULT_ALGORITHM,
    require_checksums: bool = True,
    max_object_size: int = 1 << 31,
    name: str = "",
    digest: DigestPolicy = NO_POLICY,
) -> bytes:
    """Validate the chunks of one object (any order, duplicates allowed) and return its bytes.

    Every chunk's data must match its checksum; overlapping chunks must agree
    byte for byte (two verified copies that differ are a conflict: nothing is
    delivered, whatever the order, as in the receiver); exactly one object
    length (from the LAST chunk) and one object checksum; no gaps. With ``require_checksums`` every chunk must
    carry a chunk checksum and some chunk the object checksum. The digests
    of the chunks' ``digests`` column are checked as ``digest`` says
    (:class:`~refmsg.integrity.ObjectCheck`). Raises the first
    :class:`SegmentationError` found.

    ``rows``: the chunks, as :class:`ChunkRow`, mappings or tuples of its fields. ``algorithm``: the checksum the chunk
    and object checksums are computed with. ``max_object_size``: the largest object accepted, in bytes. ``name``: the
    object's name in error messages.
    """
    algorithm = ChecksumAlgorithm.parse(algorithm)
    state = ObjectState(name, algorithm, max_object_size)
    seen = Reference()  # applied bytes: views into the rows, never copied
    # Copies at the same place that differ raise the same ConflictError in either order: no byte key needed.
    for row in sorted((_as_row(r) for r in rows), key=lambda r: (r.offset, -r.length)):
        if row.data is None:
            raise SegmentationError(
                f"chunk at {row.offset} carries no data (header-only)", reason=Reason.STATE_ERROR, offset=row.offset
            )
        data = memoryview(row.data).cast("B")
        if len(data) != row.length:
            raise OffsetError(
                f"chunk at {row.offset}: {len(data)} bytes, length {row.length}", offset=row.offset, length=row.length
            )
        if require_checksums and row.chunk_checksum is None:
            raise ChecksumError(f"chunk at {row.offset} has no checksum", offset=row.offset)
        verify_chunk(algorithm, data, row.chunk_checksum, row.offset)
        plan = state.plan(
            row.offset,
            row.length,
            last=bool(row.last),
            object_length=row.object_length,
            object_checksum=row.object_checksum,
        )
        if row.digests:
            state.note_digests(parse_extension(row.digests))
        span = seen.disagreement(row.offset, data)
        if span is not None:
            raise ConflictError(
                f"chunk at {row.offset}: bytes [{span.start}, {span.end}) differ from another verified copy;"
                " nothing is delivered",
                offset=row.offset,
                start=span.start,
                end=span.end,
            )
        seen.add(row.offset, data)
        state.commit(plan)
    if not state.complete:
        raise incomplete_error(state)
    assert state.object_length is not None
    out = seen.read(0, state.object_length)
    if state.object_checksum is None and require_checksums:
        raise ChecksumError("no chunk carries the object checksum", reason=Reason.MESSAGE_CHECKSUM_ERROR)
    verify_object([out], algorithm, state.object_checksum, state.digests, digest)
    return out
