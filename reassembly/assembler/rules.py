"""The assembler's decisions: which pieces of a message win, why the others lose, what a group admits.

Pure functions over what :mod:`reassembly.assembler.model` holds. Arbitration is
:func:`segmenter.coverage.arbitrate` (the rule shared with ``refmsg``) fed with
the segment's header facts; :func:`decide` sorts its input canonically first,
so the outcome for a multiset of segments never depends on their order.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import TypeVar

from reassembly.assembler._state import GroupInput
from reassembly.assembler.model import Facts, Message, Piece
from segmenter.buffers import same_bytes
from segmenter.coverage import Arbitration, Outcome, Reference, arbitrate, tilings
from segmenter.digest import Digests, parse_extension
from segmenter.errors import (
    ConflictError,
    FlagsError,
    HeaderError,
    OffsetError,
    OriginalLengthError,
    Reason,
    SegmentationError,
    SequenceError,
)
from segmenter.flags import in_group, is_last_in_group
from segmenter.wire import UNKNOWN_LENGTH, SegmentHeader

P = TypeVar("P")

# How a message's outcome ends its group (non-grouped messages and Unit-of-Work groups).
OUTCOME_INPUT: dict[Outcome, GroupInput] = {
    Outcome.COMPLETE: GroupInput.COMPLETE,
    Outcome.CONFLICT: GroupInput.FAIL,
    Outcome.FAILED: GroupInput.FAIL,
}


def _agree(known: int, new: int) -> int | None:
    """Merge one length: UNKNOWN_LENGTH agrees with anything; ``None`` when they differ."""
    if new in (UNKNOWN_LENGTH, known):
        return known
    return new if known == UNKNOWN_LENGTH else None


def fits(facts: Facts, piece: Piece) -> Facts | None:
    """``facts`` merged with the piece's header, or ``None`` when they contradict each other."""
    own = piece.facts
    if own == facts or facts.codec is None:  # the common case: every segment says the same
        return own if facts.codec is None else facts
    h = piece.header
    if own[:4] != facts[:4]:
        return None
    stored = _agree(facts.stored_length, h.stored_length)
    original = _agree(facts.original_length, h.original_length)
    mcrc = facts.message_checksum
    if h.message_checksum is not None:
        if mcrc is not None and mcrc != h.message_checksum:
            return None
        mcrc = h.message_checksum
    if stored is None or original is None:
        return None
    codec, algorithm, group, deferred = own[:4]  # equal to the facts' (checked above)
    return Facts(codec, algorithm, group, deferred, stored, original, mcrc)  # _replace costs 3x this


def _offset(p: Piece) -> int:
    return p.offset


def _in_order(ps: list[Piece]) -> list[Piece]:
    return ps if len(ps) == 1 else sorted(ps, key=lambda p: (-p.header.data_length, p.raw))


def canonical(msg: Message) -> dict[int, list[Piece]]:
    """Pieces by offset, each list longest first, then by original bytes: arrival order erased."""
    return {offset: _in_order(msg.at[offset]) for offset in sorted(msg.at)}


class _Lazy(Mapping[int, list[Piece]]):
    """:func:`canonical`, each offset put in order only when the search reaches it: the search
    visits the offsets reachable from 0, and building the whole map at every arrival would make a
    message of n held pieces cost O(n) per segment."""

    def __init__(self, at: dict[int, list[Piece]]) -> None:
        self._at = at

    def __getitem__(self, offset: int) -> list[Piece]:
        return _in_order(self._at[offset])

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self._at))

    def __len__(self) -> int:
        return len(self._at)


def agree(by_offset: dict[int, list[Piece]]) -> bool:
    """Every piece agrees byte for byte with every piece it overlaps.

    Only pieces sharing a byte with another are read (and held by the reference): a body in a
    :class:`~reassembly.assembler.bodies.BodyStore` is not read back into memory when its pieces tile it.
    """
    ref = Reference()
    for p in _overlapping([p for ps in by_offset.values() for p in ps]):
        data = p.buffer()
        if ref.present.covered(p.offset, p.end) and ref.disagreement(p.offset, data) is not None:
            return False
        ref.add(p.offset, data)
    return True


def _overlapping(pieces: list[Piece]) -> list[Piece]:
    """The pieces (given in offset order) that share a byte with another piece, in that order.

    A piece overlapping an earlier one overlaps the earlier piece reaching furthest, so one
    sweep finds every pair's both sides.
    """
    shared: set[int] = set()
    reach: Piece | None = None  # of the pieces seen so far, the one ending furthest
    for p in pieces:
        if reach is not None and p.offset < reach.end and p.offset < p.end:
            shared.update((id(reach), id(p)))
        if reach is None or p.end > reach.end:
            reach = p
    return [p for p in pieces if id(p) in shared]


def _declared(last: Piece) -> Digests | bytes:
    """The digests a candidate's last piece declares (its raw extension when that does not parse)."""
    try:
        return parse_extension(last.header.extension)
    except SegmentationError:
        return last.header.extension


def _same(a: tuple[Piece, ...], b: tuple[Piece, ...]) -> bool:
    """Byte-identical bodies (a re-segmentation of the same body) declaring the same digests: a
    copy of the last segment declaring other digests is another candidate, verified too."""
    if a[-1].header.extension != b[-1].header.extension and _declared(a[-1]) != _declared(b[-1]):
        return False
    i = j = 0
    ia = ib = 0  # position inside a[i], b[j]
    while i < len(a) and j < len(b):
        va, vb = memoryview(a[i].buffer()), memoryview(b[j].buffer())
        n = min(len(va) - ia, len(vb) - ib)
        if not same_bytes(va[ia : ia + n], vb[ib : ib + n]):
            return False
        ia, ib = ia + n, ib + n
        if ia == len(va):
            i, ia = i + 1, 0
        if ib == len(vb):
            j, ib = j + 1, 0
    return True


def decide(msg: Message, verify: Callable[[tuple[Piece, ...], Facts], P]) -> Arbitration[Piece, Facts, P]:
    """The outcome for a message's pieces (see :mod:`segmenter.coverage` for the rule)."""
    candidates, cut_off = _candidates(msg)
    return arbitrate(candidates, cut_off, verify=verify, same=_same, what=f"message {msg.seq}")


def has_candidate(msg: Message) -> bool:
    """A complete candidate exists (or the search is cut off: a conflict, also a decision)."""
    candidates, cut_off = _candidates(msg)
    return bool(candidates) or cut_off


def _chain_candidates(chain: tuple[Piece, ...]) -> list[tuple[tuple[Piece, ...], Facts]]:
    """A plain chain is the tiling search's only path: its facts merged along it as the search would."""
    facts = Facts()
    for p in chain:
        merged = fits(facts, p)
        if merged is None:
            return []
        facts = merged
    return [(chain, facts)]


def _candidates(msg: Message) -> tuple[list[tuple[tuple[Piece, ...], Facts]], bool]:
    """:func:`~segmenter.coverage.tilings` of the pieces in canonical order. A plain chain (the
    common case: every segment once, no overlap) is the search's only path: its facts are merged
    along it as the search would, without the search."""
    chain = msg.chain()
    if chain is not None:
        return _chain_candidates(chain), False
    if msg.agrees is None:
        pieces = canonical(msg)
        return tilings(pieces, fits, Facts(), agree=agree(pieces))
    return tilings(_Lazy(msg.at), fits, Facts(), agree=msg.agrees, count=msg.count)


def misfit(piece: Piece, facts: Facts, winner: tuple[Piece, ...]) -> SegmentationError:
    """Why a piece that is not part of the winning assembly does not fit it (a ConflictError when
    it claims the position of a used piece with the same facts)."""
    h = piece.header
    seq = h.msg_seq_number
    if fits(facts, piece) is None:
        return _header_mismatch(h, facts)
    end = winner[-1].end
    if h.offset >= end or h.end > end:
        return OffsetError(
            f"segment [{h.offset}, {h.end}) runs past the end {end} of message {seq}",
            offset=h.offset,
            end=h.end,
            stored_length=end,
        )
    i = max(bisect.bisect_right(winner, h.offset, key=_offset) - 1, 0)  # no list per refused piece
    used = winner[i].header
    if used.offset == h.offset:
        return ConflictError(
            f"different segment at offset {h.offset} of message {seq}; the verified assembly is kept",
            offset=h.offset,
            msg_seq_number=seq,
            held_length=used.data_length,
            new_length=h.data_length,
            held_checksum=used.data_checksum,
            new_checksum=h.data_checksum,
        )
    if h.is_last_segment:
        return FlagsError(
            f"LAST_SEGMENT at offset {h.offset}, the message ends at {end}", offset=h.offset, last_end=end
        )
    return OffsetError(
        f"segment [{h.offset}, {h.end}) overlaps [{used.offset}, {used.end})",
        offset=h.offset,
        end=h.end,
        other_offset=used.offset,
        other_end=used.end,
    )


def _header_mismatch(h: SegmentHeader, facts: Facts) -> SegmentationError:
    for name, known, new in (
        ("stored_length", facts.stored_length, h.stored_length),
        ("original_length", facts.original_length, h.original_length),
    ):
        if _agree(known, new) is None:
            return OriginalLengthError(
                f"{name} {new} differs from {known} in the message's other segments",
                field=name,
                expected=known,
                actual=new,
                offset=h.offset,
            )
    if h.message_checksum is not None and facts.message_checksum not in (None, h.message_checksum):
        return HeaderError(
            "message checksum differs from the message's other segments",
            reason=Reason.HEADER_MISMATCH,
            expected=facts.message_checksum,
            actual=h.message_checksum,
            offset=h.offset,
        )
    return HeaderError(
        "codec, checksum algorithm, group flags or LENGTH_DEFERRED differ from the message's other segments",
        reason=Reason.HEADER_MISMATCH,
        msg_seq_number=h.msg_seq_number,
        offset=h.offset,
    )


def group_refusal(
    grouped: bool, last_seq: int | None, seqs: Collection[int], seq: int, flags: int
) -> SegmentationError | None:
    """Why a group does not admit a message with these MsgFlags, given what it holds (``None``: admitted).

    Streaming applies it to each segment on arrival; batch mode to each message's
    winning flags in MsgSeqNumber order (the lowest number's flags decide ``grouped``).
    """
    if in_group(flags) != grouped:
        return FlagsError("MSG_IN_GROUP flags disagree within the group", msg_flags=flags, msg_seq_number=seq)
    if not grouped:
        if seq != 1:
            return SequenceError("a message not in a group must have MsgSeqNumber 1", msg_seq_number=seq)
        return None
    if last_seq is not None and seq > last_seq:
        return SequenceError(
            f"MsgSeqNumber {seq} is beyond the group's last message {last_seq}",
            msg_seq_number=seq,
            last_seq_number=last_seq,
        )
    if is_last_in_group(flags):
        if last_seq is not None and last_seq != seq:
            return FlagsError(
                f"LAST_MSG_IN_GROUP repeated: on {seq}, already on {last_seq}",
                msg_seq_number=seq,
                last_seq_number=last_seq,
            )
        beyond = max((s for s in seqs if s > seq), default=None)
        if beyond is not None:
            return SequenceError(
                f"LAST_MSG_IN_GROUP on {seq} but message {beyond} exists",
                msg_seq_number=seq,
                highest_seq_number=beyond,
            )
    elif last_seq == seq:
        return FlagsError("message is LAST_MSG_IN_GROUP in other segments", msg_seq_number=seq)
    return None


def lone_refusal(h: SegmentHeader) -> SegmentationError | None:
    """A segment of a message not in a group must have MsgSeqNumber 1 (judged alone, on arrival)."""
    if not in_group(h.msg_flags) and h.msg_seq_number != 1:
        return SequenceError("a message not in a group must have MsgSeqNumber 1", msg_seq_number=h.msg_seq_number)
    return None
