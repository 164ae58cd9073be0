"""The streaming collector's core without Spark: which batches close, what state stays, which timer moves.

:class:`CollectCore` is what the Spark processor asks on every call; here it is driven with plain
values, as the processor would with what it read from state. Batches are read back through the
assembler (one complete Unit-of-Work group each), as a consumer of the output would.
"""

from __future__ import annotations

import pickle

import pytest

from reassembly import Assembler, GroupComplete
from reassembly.collector import Rule
from reassembly.spark.collect.core import NO_TIMER, CollectCore, OpenBatch, Out, Step

T = 1_700_000_000_000  # event ms
RULE = Rule("acme", "ftp-acme", max_messages=3, max_bytes=1000, max_wait=60)
WAIT = 60_000


def batches(rows: list[Out]) -> dict[str, tuple[str, str, list[bytes]]]:
    """Rows by batch id: (target, cause, members), each batch reassembled as one whole MQ group."""
    out: dict[str, tuple[str, str, list[bytes]]] = {}
    for batch_id in dict.fromkeys(r.batch_id for r in rows):
        mine = [r for r in rows if r.batch_id == batch_id]
        assert len({(r.target, r.destination, r.cause) for r in mine}) == 1
        asm = Assembler(unit_of_work=True)
        events = [e for r in mine for e in asm.receive(r.segment)] + asm.close()
        (group,) = events
        assert isinstance(group, GroupComplete)
        out[batch_id] = (mine[0].target, mine[0].cause, [bytes(m.payload) for m in group.messages])
    return out


def test_a_full_batch_leaves_and_the_rest_is_kept_with_its_timer() -> None:
    core = CollectCore(max_segment_size=150)
    new = [(b"a%d" % i, T) for i in range(4)] + [(b"z" * 400, T)]  # the long one: segmented at 150 bytes
    step = core.take("acme", RULE, OpenBatch(), new)
    assert batches(step.rows) == {"acme#0": ("ftp-acme", "full", [b"a0", b"a1", b"a2"])}
    assert step.keep == OpenBatch(((b"a3", T), (b"z" * 400, T)), batch_no=1, deadline=T + WAIT)
    assert (step.keep.first_ms, step.keep.held_bytes) == (T, 402)
    assert (step.cancel, step.register) == (None, T + WAIT)  # a new open batch: its timer is set


def test_within_a_call_members_are_ordered_by_event_time_then_bytes() -> None:
    """The order Spark hands rows over in does not matter: a replayed micro-batch decides the same."""
    core = CollectCore()
    new = [(b"b", T + 5), (b"c", T), (b"a", T)]
    assert core.take("acme", RULE, OpenBatch(), new) == core.take("acme", RULE, OpenBatch(), list(reversed(new)))
    (only,) = batches(core.take("acme", RULE, OpenBatch(), new).rows).values()
    assert only[2] == [b"a", b"c", b"b"]


def test_a_member_after_the_deadline_closes_the_open_batch_as_timeout_and_moves_the_timer() -> None:
    core = CollectCore()
    held = OpenBatch(((b"old", T),), batch_no=7, deadline=T + WAIT)
    step = core.take("acme", RULE, held, [(b"new", T + WAIT)])  # at the deadline: too late for the open batch
    assert batches(step.rows) == {"acme#7": ("ftp-acme", "timeout", [b"old"])}
    assert step.keep == OpenBatch(((b"new", T + WAIT),), batch_no=8, deadline=T + 2 * WAIT)
    assert (step.cancel, step.register) == (T + WAIT, T + 2 * WAIT)


def test_bytes_close_a_batch_before_a_member_that_would_pass_them_and_at_them() -> None:
    core = CollectCore()
    rule = Rule("acme", "t", max_messages=100, max_bytes=10, max_wait=60)
    step = core.take("acme", rule, OpenBatch(), [(b"123456", T), (b"78901", T + 1), (b"23456", T + 2)])
    got = batches(step.rows)
    assert got == {"acme#0": ("t", "full", [b"123456"]), "acme#1": ("t", "full", [b"78901", b"23456"])}
    assert step.keep == OpenBatch((), batch_no=2, deadline=NO_TIMER)
    assert (step.cancel, step.register) == (None, None)


def test_a_lowered_rule_splits_the_held_batch_at_once() -> None:
    core = CollectCore()
    held = OpenBatch(((b"a3", T), (b"long", T)), batch_no=1, deadline=T + WAIT)
    lowered = Rule("acme", "ftp-acme", max_messages=2, max_wait=60)
    step = core.take("acme", lowered, held, [(b"b0", T + 10)])
    assert batches(step.rows) == {"acme#1": ("ftp-acme", "full", [b"a3", b"long"])}
    assert step.keep == OpenBatch(((b"b0", T + 10),), batch_no=2, deadline=T + 10 + WAIT)
    assert (step.cancel, step.register) == (T + WAIT, T + 10 + WAIT)


def test_a_member_joining_the_open_batch_leaves_its_timer_alone() -> None:
    core = CollectCore()
    held = OpenBatch(((b"a", T),), batch_no=0, deadline=T + WAIT)
    step = core.take("acme", RULE, held, [(b"b", T + 1)])
    assert step.rows == [] and step.keep == OpenBatch(((b"a", T), (b"b", T + 1)), 0, T + WAIT)
    assert (step.cancel, step.register) == (None, None)


def test_the_open_batch_leaving_full_cancels_its_timer() -> None:
    core = CollectCore()
    held = OpenBatch(((b"a", T), (b"b", T)), batch_no=4, deadline=T + WAIT)
    step = core.take("acme", RULE, held, [(b"c", T + 1)])
    assert batches(step.rows) == {"acme#4": ("ftp-acme", "full", [b"a", b"b", b"c"])}
    assert step == Step(step.rows, OpenBatch((), 5, NO_TIMER), cancel=T + WAIT, register=None)


def test_the_timer_of_the_open_batch_closes_it_as_timeout() -> None:
    core = CollectCore()
    held = OpenBatch(((b"a", T), (b"b", T + 3)), batch_no=2, deadline=T + WAIT)
    step = core.expire("acme", RULE, held, T + WAIT)
    assert step is not None
    assert batches(step.rows) == {"acme#2": ("ftp-acme", "timeout", [b"a", b"b"])}
    assert step.keep == OpenBatch((), batch_no=3, deadline=NO_TIMER)
    assert (step.keep.first_ms, step.keep.held_bytes) == (-1, 0)  # what state's value holds then
    assert (step.cancel, step.register) == (None, None)  # the fired timer is gone by itself


@pytest.mark.parametrize(
    "state",
    [None, OpenBatch((), batch_no=3), OpenBatch(((b"a", T),), batch_no=2, deadline=T + 2 * WAIT)],
    ids=["no state", "no open batch", "another deadline"],
)
def test_a_timer_the_open_batch_no_longer_has_does_nothing(state: OpenBatch | None) -> None:
    assert CollectCore().expire("acme", RULE, state, T + WAIT) is None


def test_batch_ids_follow_the_counter_in_state_so_a_replay_names_them_alike() -> None:
    core = CollectCore()
    state = OpenBatch(batch_no=41)
    new = [(b"%d" % i, T + i) for i in range(7)]
    first, replay = core.take("d", RULE, state, new), core.take("d", RULE, state, new)
    assert first == replay
    assert list(batches(first.rows)) == ["d#41", "d#42"] and first.keep.batch_no == 43


def test_the_core_pickles_as_it_is() -> None:
    """The processor carries its core to the workers."""
    core = CollectCore(max_segment_size=150)
    copy = pickle.loads(pickle.dumps(core))
    new = [(b"x" * 300, T)]
    assert copy.take("acme", RULE, OpenBatch(), new) == core.take("acme", RULE, OpenBatch(), new)
