"""Group lifecycle as data (after h11's ``_state.py``): states, inputs, and the one table between them.

A group is OPEN while segments arrive. It leaves OPEN exactly once, to one
terminal state; the assembler then forgets its bytes and remembers only the
terminal state (bounded), so late segments can be told apart from new groups.
Starting a group again (a revoked one, an expired or evicted one with the
assembler's ``second_chance``, one whose delivered message was forgotten) is
not a transition: its record is dropped and a new OPEN group takes its place.
"""

from __future__ import annotations

from enum import Enum

from segmenter.errors import Reason, SegmentationError


class GroupState(str, Enum):
    OPEN = "open"
    COMPLETE = "complete"  # delivered (MessageComplete / GroupComplete)
    FAILED = "failed"  # a message failed verification (MessageFailed / GroupFailed)
    EXPIRED = "expired"  # older than the expiry (Unfinished, cause=expired)
    EVICTED = "evicted"  # pushed out by a limit (Unfinished, cause=evicted)
    CLOSED = "closed"  # input ended first (Unfinished, cause=closed)
    REVOKED = "revoked"  # its partition was revoked (Unfinished, cause=revoked); may start again


class GroupInput(str, Enum):
    COMPLETE = "complete"
    FAIL = "fail"
    EXPIRE = "expire"
    EVICT = "evict"
    CLOSE = "close"
    REVOKE = "revoke"


TRANSITIONS: dict[tuple[GroupState, GroupInput], GroupState] = {
    (GroupState.OPEN, GroupInput.COMPLETE): GroupState.COMPLETE,
    (GroupState.OPEN, GroupInput.FAIL): GroupState.FAILED,
    (GroupState.OPEN, GroupInput.EXPIRE): GroupState.EXPIRED,
    (GroupState.OPEN, GroupInput.EVICT): GroupState.EVICTED,
    (GroupState.OPEN, GroupInput.CLOSE): GroupState.CLOSED,
    (GroupState.OPEN, GroupInput.REVOKE): GroupState.REVOKED,
}


def transition(state: GroupState, event: GroupInput) -> GroupState:
    """The next state, or a STATE_ERROR for a transition the table does not allow."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise SegmentationError(
            f"no transition from {state.value} on {event.value}", reason=Reason.STATE_ERROR
        ) from None
