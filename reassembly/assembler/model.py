"""What the assembler holds: limits, pieces (segments as they arrived), messages, groups, closed records.

Plain records, no rules: the rules live in :mod:`reassembly.assembler.rules`, the
building in :mod:`reassembly.assembler.build`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, NamedTuple

from reassembly.assembler._state import GroupState
from reassembly.assembler.bodies import MessageKey, StoredOriginal
from reassembly.assembler.events import GapReport
from reassembly.assembler.positions import Origin, Track
from segmenter.buffers import same_bytes
from segmenter.checksum import ChecksumAlgorithm
from segmenter.coverage import RangeSet, Reference, gaps
from segmenter.digest import NO_POLICY, DigestPolicy
from segmenter.flags import Codec, group_bits, is_last_segment
from segmenter.wire import DEFAULT_MAX_SEGMENT_SIZE, UNKNOWN_LENGTH, Buffer, SegmentHeader

_tuple_new = tuple.__new__  # builds a NamedTuple without calling its (Python) __new__

MAX_MISSING_LISTED = 1000  # absent group members listed by number; the rest is implied by last_seq_number


def missing_numbers(present: set[int], top: int) -> tuple[int, ...]:
    """The lowest absent numbers in 1..``top``, at most :data:`MAX_MISSING_LISTED` of them.

    ``top`` comes from a header (a forged LAST message may say 999,999,999), so the walk is bounded
    by what is held plus the cap, never by the declared number: one hostile segment cannot make
    the report, or the rows made from it, large.
    """
    out: list[int] = []
    s = 1
    while s <= top and len(out) < MAX_MISSING_LISTED:
        if s not in present:
            out.append(s)
        s += 1
    return tuple(out)


@dataclass(frozen=True)
class Limits:
    """Bounds on what one assembler will hold. Defaults suit a single consumer process."""

    max_message_size: int = 1 << 30
    """A message declaring a longer original or stored length is refused: 2030 (``too_big``)."""
    max_segment_size: int = DEFAULT_MAX_SEGMENT_SIZE
    """An encoded segment longer than this is refused: 2218."""
    max_buffered_bytes: int = 2 << 30
    """Segment data held across all open groups at most; past it the oldest groups are evicted
    (reported unfinished, cause ``evicted``)."""
    max_open_groups: int = 100_000
    """Groups held open after a receive at most (one completed within the receive never counts);
    past it the oldest are evicted, as for ``max_buffered_bytes``."""
    expiry_seconds: float | None = None
    """Incomplete groups strictly older than this many seconds expire (needs a clock); None: never."""
    expiry_offsets: int | None = None
    """Incomplete groups holding a segment more than this many positions behind the newest position
    received on that segment's partition expire (int positions only; li-kafka's
    ``expiration.offset.gap``); None: never."""
    remember_closed: int = 100_000
    """Finished group ids kept to recognise late segments of them (as late, not as new messages)."""
    digest: DigestPolicy = NO_POLICY
    """SHA-256 / HMAC-SHA-256 digests demanded and the keys to check them; the default checks any
    SHA-256 a message declares and demands none."""


_BUFFERS = (bytes, bytearray, memoryview)  # a piece in memory (else: a handle on it in a store)


class Facts(NamedTuple):
    """What every segment of one message must agree on (``None`` / UNKNOWN_LENGTH: not yet known)."""

    codec: Codec | None = None
    algorithm: ChecksumAlgorithm | None = None
    group: int | None = None  # normalised group bits of MsgFlags
    deferred: bool | None = None  # LENGTH_DEFERRED
    stored_length: int = UNKNOWN_LENGTH
    original_length: int = UNKNOWN_LENGTH
    message_checksum: int | None = None


class Piece:
    """One segment as it arrived: its decoded header, its data, and its original header bytes.

    ``head`` keeps the header exactly as received (extension bytes included), so
    :attr:`raw` gives back the original segment, never a re-encoding. ``data`` is a
    view into the caller's buffer, or a :class:`~reassembly.assembler.bodies.BodyStore` handle
    (compares with buffers, converts with ``bytes()``).
    """

    __slots__ = ("data", "end", "facts", "head", "header", "last", "offset", "origin", "track")

    def __init__(
        self, header: SegmentHeader, data: Any, head: Buffer, origin: Origin | None = None, track: Track | None = None
    ) -> None:
        self.header, self.data, self.head = header, data, head
        self.origin, self.track = origin, track  # where it was read (None: no position given)
        # One unpack, and offset/end/last kept as plain slots: judging reads them of every piece
        # several times, and a property per read would be a measurable share of a 64 KiB segment's cost.
        _, _, offset, length, original, stored, flags, codec, algorithm, _, message_crc, _, deferred, _ = header
        self.offset: int = offset
        self.end: int = offset + length
        self.last: bool = is_last_segment(flags)
        # tuple.__new__: Facts' own __new__ is a Python function, and this runs per segment
        self.facts = _tuple_new(Facts, (codec, algorithm, group_bits(flags), deferred, stored, original, message_crc))

    @property
    def positions(self) -> tuple[Origin, ...]:
        return () if self.origin is None else (self.origin,)

    def hold(self) -> None:
        """It is held in an open group: its position stays unsettled until :meth:`release`."""
        if self.track is not None:
            assert self.origin is not None
            self.track.hold(self.origin.position)

    def release(self) -> None:
        """It leaves the assembler: its position settles (on a revoked track: nothing to do)."""
        if self.track is not None:
            assert self.origin is not None
            self.track.release(self.origin.position)

    def buffer(self) -> Buffer:
        """The data as a buffer (read from the store when it lives there)."""
        data = self.data
        return data if isinstance(data, _BUFFERS) else bytes(data)

    @property
    def raw(self) -> bytes:
        """The original bytes of the segment."""
        return b"".join((self.head, self.buffer()))

    def key(self) -> tuple[int, int, bytes]:
        """Canonical order of pieces: offset, length, then original bytes (arrival order never counts)."""
        return (self.header.offset, self.header.data_length, self.raw)

    def order(self) -> tuple[int, int, bytes]:
        """:meth:`key`, but by header bytes for a piece its store keeps past a failure (its data never read)."""
        if StoredOriginal.of(self.head, self.data) is None:
            return self.key()
        return (self.header.offset, self.header.data_length, bytes(self.head))

    def same_as(self, other: Piece) -> bool:
        """Byte-identical segments (header as received, and data: a store's handle compares itself)."""
        if self.header != other.header or not same_bytes(self.head, other.head):
            return False
        a, b = self.data, other.data
        if isinstance(a, _BUFFERS) and isinstance(b, _BUFFERS):
            return same_bytes(a, b)
        return bool(a == b)


@dataclass
class Message:
    """Every piece held for one logical message, in any order, conflicting copies included."""

    group_id: bytes
    seq: int
    stored: bool = False  # body kept in the BodyStore, not in memory
    decoded: bool = False  # stored and decompressed into the store's output
    at: dict[int, list[Piece]] = field(default_factory=dict)  # pieces by offset
    present: RangeSet = field(default_factory=RangeSet)  # union of every piece's range
    last_ends: set[int] = field(default_factory=set)  # ends of LAST pieces
    duplicates: int = 0
    count: int = 0  # pieces in ``at``
    search: bool = True  # the last piece held may change the streaming search's outcome
    # Whether every piece agrees byte for byte with every piece it overlaps, kept as pieces arrive
    # (None: not known, computed when asked: a stored body is not held in memory). Agreement does
    # not depend on the order pieces came in, so checking each against the bytes before it is
    # exact; recomputing it over every held piece at every arrival cost O(n) per segment (many
    # tiny overlapping segments: 9.7 ms per segment with 2,000 held).
    agrees: bool | None = True
    ref: Reference | None = None  # the bytes held, from the first overlap on, while ``agrees`` is kept

    # Offsets a chain of held pieces reaches from 0, each piece starting where the one before ends
    # (facts aside): the only offsets the tiling search visits.
    reach: set[int] = field(default_factory=lambda: {0})

    def add(self, piece: Piece) -> None:
        """Hold a piece: by offset, in the coverage, and in what the streaming search needs to
        know (reach, agreement: see ``search``)."""
        # Most pieces lie past everything held (a message arriving in order): nothing to compare.
        overlaps = piece.offset < self.present.max_end and bool(self.present.covered(piece.offset, piece.end))
        # A stored body: agreement is computed when asked, so any piece over bytes already held may
        # have ended it and counts as if it had.
        flipped = overlaps if self.agrees is None else self.agrees and self._note_bytes(piece, overlaps)
        was_ready = self.ready
        here = self.at.get(piece.offset)
        if here is None:
            self.at[piece.offset] = [piece]
        else:
            here.append(piece)
        self.count += 1
        self.present.add(piece.offset, piece.end)
        if piece.last:
            self.last_ends.add(piece.end)
        # The streaming search runs again only if this piece can change its outcome: one it never
        # visits (unreachable from 0) changes nothing unless it ends the pieces' agreement (the
        # search's mode) or makes the message ready (no search ran before). Searching at every
        # arrival would make a message of n held pieces O(n^2).
        self.search = self._note_reach(piece) or flipped or not was_ready

    def _note_bytes(self, piece: Piece, overlaps: bool) -> bool:
        """Compare a piece held in memory where it overlaps what is held, then remember it; True
        when it is the first piece to disagree. The reference of held bytes is built at the first
        overlap (until then the pieces overlap nothing, so they agree): a message arriving as one
        plain chain never pays for it (it cost the broker receive path 3 us per segment)."""
        ref = self.ref
        if not overlaps:
            if ref is not None:
                ref.add(piece.offset, piece.buffer())
            return False
        if ref is None:
            ref = self.ref = Reference()
            for held in self.pieces():
                ref.add(held.offset, held.buffer())
        data = piece.buffer()
        if ref.disagreement(piece.offset, data) is not None:
            self.agrees, self.ref = False, None  # no piece added later makes them agree again
            return True
        ref.add(piece.offset, data)
        return False

    @property
    def worth_searching(self) -> bool:
        """Whether a search can decide now. Without a reachable LAST end the search finds no
        candidate, but while pieces may disagree (or their agreement is not known: a stored body)
        it can still be cut off, which is a conflict decided at once as before; only pieces known
        to agree wait for a reachable LAST end."""
        return self.agrees is not True or any(end in self.reach for end in self.last_ends)

    def _note_reach(self, piece: Piece) -> bool:
        """A piece was added to ``at``: extend what is reachable; True when the piece is (when it
        is not, the search never visits it, so it cannot change the search's outcome)."""
        reach = self.reach
        if piece.offset not in reach:
            return False
        stack = [piece.end]
        while stack:
            x = stack.pop()
            if x not in reach:
                reach.add(x)
                after = self.at.get(x)
                if after:
                    stack.extend(p.end for p in after)
        return True

    def forget_bytes(self) -> None:
        """The pieces moved to the store (or left): agreement is computed when asked."""
        self.agrees, self.ref = None, None

    @property
    def key(self) -> MessageKey:
        return (self.group_id, self.seq)

    def pieces(self) -> Iterator[Piece]:
        for ps in self.at.values():
            yield from ps

    def raws(self) -> tuple[bytes, ...]:
        """Original bytes of every piece, in canonical order (offset, length, bytes)."""
        return tuple(k[2] for k in sorted(p.key() for p in self.pieces()))

    def originals(self) -> tuple[tuple[bytes, ...], tuple[StoredOriginal, ...]]:
        """:meth:`raws` of a failed message: pieces its store keeps past the failure as handles, never read."""
        raws: list[bytes] = []
        kept: list[StoredOriginal] = []
        for p in sorted(self.pieces(), key=Piece.order):
            handle = StoredOriginal.of(p.head, p.data)
            if handle is None:
                raws.append(p.raw)
            else:
                kept.append(handle)
        return tuple(raws), tuple(kept)

    def positions(self) -> tuple[Origin, ...]:
        """Where each piece was read, parallel to ``(*raws, *kept)`` of :meth:`originals` (empty without positions)."""
        raws, kept = self.split_positions()
        return (*raws, *kept)

    def split_positions(self) -> tuple[tuple[Origin, ...], tuple[Origin, ...]]:
        """The positions of :meth:`originals`' ``raws`` and of its ``kept``, each in their order."""
        if all(p.origin is None for p in self.pieces()):
            return (), ()
        raws: list[Origin] = []
        kept: list[Origin] = []
        for p in sorted(self.pieces(), key=Piece.order):
            (raws if StoredOriginal.of(p.head, p.data) is None else kept).extend(p.positions)
        return tuple(raws), tuple(kept)

    def declared(self) -> tuple[int | None, int | None]:
        """The stored and original lengths its pieces' headers declare, each where every piece
        declaring one agrees (None: none declares it, or they disagree): a fact of the headers, the
        same for any arrival order."""
        stored = {p.header.stored_length for p in self.pieces()} - {UNKNOWN_LENGTH}
        original = {p.header.original_length for p in self.pieces()} - {UNKNOWN_LENGTH}
        return (
            next(iter(stored)) if len(stored) == 1 else None,
            next(iter(original)) if len(original) == 1 else None,
        )

    def held_bytes(self) -> int:
        """Bytes held in memory (none for a stored body)."""
        return 0 if self.stored else sum(p.end - p.offset for ps in self.at.values() for p in ps)

    @property
    def ready(self) -> bool:
        """Some LAST piece's range is fully covered: worth looking for a complete candidate."""
        if not self.last_ends:  # every segment before the last one: no call, no generator
            return False
        return any(self.present.covers(0, end) for end in self.last_ends)

    def chain(self) -> tuple[Piece, ...] | None:
        """The pieces when they form one plain chain: one piece at each offset, each starting where
        the one before ends, from 0, only the last one LAST. Then the tiling search has one option
        at every position, so that chain is its only path (``None``: copies, overlaps, gaps)."""
        at = self.at
        n = len(at)
        pieces: list[Piece] = []
        pos = 0
        for i in range(n):
            here = at.get(pos)
            if here is None or len(here) != 1:
                return None
            p = here[0]
            if p.last != (i == n - 1):  # a LAST piece ends a chain; the others are never empty
                return None
            pieces.append(p)
            pos = p.end
        return tuple(pieces) if pieces else None

    def gap_report(self) -> GapReport:
        """Missing ranges of the union of every piece held, up to the stored length when every
        piece declaring one agrees (else an open tail): the same for any arrival order."""
        end, original = self.declared()
        plain = all(p.header.codec == Codec.NONE for p in self.pieces())
        return GapReport(
            msg_seq_number=self.seq,
            missing_ranges=gaps(self.present, end),
            stored_length=end,
            received_bytes=self.present.total,
            last_segment_seen=bool(self.last_ends),
            original_length=original,
            basis="original" if plain else "stored",
        )


class Run:
    """The first segments of a new message not in a group, arrived in order (each starting where the
    one before ends) and not yet filed in a :class:`Group`: the broker receiver's common case.

    Filing a waiting segment (group and message records, the group's rules, coverage, the search's
    bookkeeping, the limits) would be most of a 64 KiB segment's receive cost, and for such a prefix it
    decides nothing: no rule refuses it, nothing overlaps it, no limit is reached by it (the
    assembler checks each before extending a run) and no candidate exists before the LAST segment.
    So the assembler only collects it here and files the whole run, as one arrival after another
    would have, before anything else happens (another segment, a LAST one, expiry, a snapshot).
    """

    __slots__ = ("bytes", "end", "facts", "first_seen", "group_id", "pieces")

    def __init__(self, piece: Piece, first_seen: float) -> None:
        self.group_id: bytes = piece.header.group_id
        self.facts = piece.facts
        self.first_seen = first_seen
        self.pieces = [piece]
        self.end = piece.end
        self.bytes = piece.end - piece.offset

    @staticmethod
    def starts(piece: Piece) -> bool:
        """The piece can begin a run (its group is not known yet: the caller checks that)."""
        first = piece.offset == 0 < piece.end and not piece.last
        return first and not piece.facts.group and piece.header.msg_seq_number == 1

    def extend(self, piece: Piece) -> bool:
        """Add the piece if it is the next one of this run and not its last (a LAST piece is filed
        normally); False: it is not, and the run is unchanged. One call: it runs per segment."""
        h = piece.header
        end = piece.end
        if not (
            piece.offset == self.end < end
            and not piece.last
            and h.group_id == self.group_id
            and piece.facts == self.facts
            and h.msg_seq_number == 1
        ):
            return False
        self.pieces.append(piece)
        self.bytes += end - self.end
        self.end = end
        return True


Fingerprint = tuple[int, int, int]  # data_length, data_checksum, msg_flags

# What a delivered segment is recognised by; an itemgetter, not a function: it runs per segment.
fingerprint: Callable[[SegmentHeader], Fingerprint] = itemgetter(
    *(SegmentHeader._fields.index(name) for name in ("data_length", "data_checksum", "msg_flags"))
)


@dataclass
class Group:
    group_id: bytes
    grouped: bool
    first_seen: float
    messages: dict[int, Message] = field(default_factory=dict)
    last_seq: int | None = None
    delivered: set[int] = field(default_factory=set)  # non-UoW: messages already delivered
    fingerprints: dict[tuple[int, int], Fingerprint] = field(default_factory=dict)  # of delivered pieces
    buffered: int = 0
    state: GroupState = GroupState.OPEN

    def raws(self) -> tuple[bytes, ...]:
        return tuple(raw for _, m in sorted(self.messages.items()) for raw in m.raws())

    def originals(self) -> tuple[tuple[bytes, ...], tuple[StoredOriginal, ...]]:
        """:meth:`Message.originals` of every message, in MsgSeqNumber order."""
        both = [m.originals() for _, m in sorted(self.messages.items())]
        return tuple(r for raws, _ in both for r in raws), tuple(k for _, kept in both for k in kept)

    def positions(self) -> tuple[Origin, ...]:
        """Parallel to ``(*raws, *kept)`` of :meth:`originals`."""
        both = [m.split_positions() for _, m in sorted(self.messages.items())]
        return tuple(o for raws, _ in both for o in raws) + tuple(o for _, kept in both for o in kept)

    def tracks(self) -> set[Track | None]:
        """The partition tracks its held pieces were read from (``None``: given without a position)."""
        return {p.track for m in self.messages.values() for p in m.pieces()}


@dataclass
class Closed:
    """What is remembered of a finished group: its end state and what it delivered."""

    state: GroupState
    delivered: dict[tuple[int, int], Fingerprint]  # (MsgSeqNumber, Offset) of delivered pieces
    last_seq: int | None = None  # the group's last MsgSeqNumber, if known (carried into a restart)
    reopen: bool = False  # a segment of a message it did not deliver starts it again (revoked, forgotten)

    def delivered_seq(self, seq: int) -> bool:
        return any(s == seq for s, _ in self.delivered)
