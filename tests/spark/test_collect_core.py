"""The streaming collector's core without Spark: which batches close, what state stays, which timer moves.

:class:`CollectCore` is what the Spark processor asks on every call; here it is driven with plain
values, as the processor would with what it read from state. Batches are read back through the
assembler (one complete Unit-of-Work group each), as a consumer of the output would.
"""

from __future__ import annotations

import pickle
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reassembly import Assembler, GroupComplete
from reassembly.collector import Collector, Rule
from reassembly.collector.core import DEFAULT_RULE
from reassembly.spark.collect.core import NO_TIMER, CollectCore, Member, OpenBatch, Out, Step
from tests.support.collect_helpers import Clock

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


# idle_timeout: a quiet period counted from the newest member, beside max_wait from the oldest.
IDLE_RULE = Rule("acme", "ftp-acme", max_messages=100, max_bytes=1000, max_wait=60, idle_timeout=10)
IDLE = 10_000


def test_a_member_after_a_quiet_period_closes_the_open_batch_as_idle() -> None:
    core = CollectCore()
    step = core.take("acme", IDLE_RULE, OpenBatch(), [(b"a", T), (b"b", T + 9_999), (b"c", T + 9_999 + IDLE)])
    assert batches(step.rows) == {"acme#0": ("ftp-acme", "idle", [b"a", b"b"])}
    assert step.keep == OpenBatch(((b"c", T + 9_999 + IDLE),), batch_no=1, deadline=T + 9_999 + 2 * IDLE)


def test_the_timer_moves_to_the_newest_member_plus_idle_timeout_with_every_member() -> None:
    core = CollectCore()
    first = core.take("acme", IDLE_RULE, OpenBatch(), [(b"a", T)])
    assert (first.keep.deadline, first.cancel, first.register) == (T + IDLE, None, T + IDLE)
    second = core.take("acme", IDLE_RULE, first.keep, [(b"b", T + 4_000)])
    assert (second.keep.deadline, second.cancel, second.register) == (T + 4_000 + IDLE, T + IDLE, T + 4_000 + IDLE)
    assert second.keep.newest_ms == T + 4_000 and second.keep.first_ms == T


def test_max_wait_still_bounds_a_batch_that_never_goes_quiet_and_names_a_tie() -> None:
    core = CollectCore()
    trickle = [(b"%d" % i, T + i * 6_000) for i in range(9)] + [(b"9", T + 50_000)]  # never 10 s quiet
    step = core.take("acme", IDLE_RULE, OpenBatch(), trickle)
    assert step.rows == [] and step.keep.deadline == T + WAIT  # min(T + 60 s, T + 50 s + 10 s): a tie
    late = core.take("acme", IDLE_RULE, step.keep, [(b"x", T + 2 * WAIT)])  # both long passed: the tie's cause
    assert [c for _, c, _ in batches(late.rows).values()] == ["timeout"]
    fired = core.expire("acme", IDLE_RULE, step.keep, T + WAIT)
    assert fired is not None and [c for _, c, _ in batches(fired.rows).values()] == ["timeout"]


def test_the_timer_at_the_idle_deadline_closes_the_open_batch_as_idle() -> None:
    core = CollectCore()
    held = core.take("acme", IDLE_RULE, OpenBatch(batch_no=5), [(b"a", T), (b"b", T + 2_000)]).keep
    step = core.expire("acme", IDLE_RULE, held, T + 2_000 + IDLE)
    assert step is not None
    assert batches(step.rows) == {"acme#5": ("ftp-acme", "idle", [b"a", b"b"])}
    assert step.keep == OpenBatch((), batch_no=6, deadline=NO_TIMER)


def test_a_timer_set_under_a_rule_since_raised_moves_instead_of_closing() -> None:
    core = CollectCore()
    held = core.take("acme", IDLE_RULE, OpenBatch(), [(b"a", T)]).keep
    raised = Rule("acme", "ftp-acme", max_wait=60, idle_timeout=30)
    step = core.expire("acme", raised, held, T + IDLE)
    assert step == Step([], OpenBatch(held.members, 0, T + 30_000), cancel=None, register=T + 30_000)


def test_state_written_without_idle_timeout_takes_the_idle_timer_at_the_next_member() -> None:
    """State from a rule with no idle_timeout is the same layout: its timer is oldest + max_wait, the next
    member replaces it with the earlier deadline, and if it fires first the deadline that passed first
    names the batch."""
    core = CollectCore()
    old = core.take("acme", RULE, OpenBatch(), [(b"a", T)]).keep
    assert old == OpenBatch(((b"a", T),), 0, T + WAIT)
    step = core.take("acme", IDLE_RULE, old, [(b"b", T + 1_000)])
    assert (step.keep.deadline, step.cancel, step.register) == (T + 1_000 + IDLE, T + WAIT, T + 1_000 + IDLE)
    fired = core.expire("acme", IDLE_RULE, old, T + WAIT)  # the old timer fires before any new member: idle is due
    assert fired is not None and [c for _, c, _ in batches(fired.rows).values()] == ["idle"]


def in_process(
    rule: Rule | dict[str, Rule], messages: list[tuple[str, bytes, int]], end: int
) -> list[tuple[str, str, list[bytes]]]:
    """The in-process collector over ``messages`` (destination, payload, event ms; in event-time order),
    ticked as a running collector is: at each of its deadlines (``next_deadline``) and at each message's
    time before it is added, up to ``end``. Its batches as (destination, cause, members) in the order they
    closed. Times are whole seconds (no float rounding at a deadline). ``rule`` is every destination's,
    or per destination with :data:`DEFAULT_RULE` for the others."""
    clock = Clock()
    if isinstance(rule, dict):
        rules = rule
        collector = Collector(lambda d: rules.get(d, DEFAULT_RULE), clock)
    else:
        only = rule
        collector = Collector(lambda d: replace(only, destination=d), clock)
    out = []

    def until(now: int) -> None:
        nonlocal out
        while (due := collector.next_deadline()) is not None and due <= now / 1000:
            clock.now = due
            out += collector.tick()
        clock.now = now / 1000
        out += collector.tick()

    for destination, payload, t in messages:
        until(t)
        out += collector.add(destination, 0, payload)
    until(end)
    return [(b.destination, b.cause.value, [m.payload for m in b.messages]) for b in out]


def by_destination(got: list[tuple[str, str, list[bytes]]], destination: str) -> list[tuple[str, list[bytes]]]:
    return [(cause, members) for d, cause, members in got if d == destination]


_gap = st.sampled_from([0, 1, 2, 5, 9, 10, 11, 30, 59, 60, 61, 120])  # seconds: at, before and after each limit


@given(
    sent=st.lists(st.tuples(_gap, st.binary(max_size=40), st.booleans(), st.booleans()), max_size=40),
    idle=st.sampled_from([None, 5, 10, 30]),
    max_messages=st.integers(2, 6),
)
def test_the_core_closes_what_the_in_process_collector_closes(
    sent: list[tuple[int, bytes, bool, bool]], idle: int | None, max_messages: int
) -> None:
    """Differential: the same messages, in random micro-batches, with a due timer fired before the next
    micro-batch or left to it (Spark handles a micro-batch's rows before its timers), give the same
    batches with the same causes as the in-process collector ticked at each message's time."""
    rule = Rule("acme", "t", max_messages=max_messages, max_bytes=100, max_wait=60, idle_timeout=idle)
    messages: list[tuple[str, bytes, int]] = []
    calls: list[tuple[bool, list[Member]]] = []
    t = T
    for i, (gap, body, new_call, fire) in enumerate(sent):
        t += gap * 1000
        messages.append(("acme", b"%03d:" % i + body, t))  # within one event time, in the order sent
        if new_call or not calls:
            calls.append((fire, []))
        calls[-1][1].append((messages[-1][1], t))
    end = t + 45_000
    core, state, rows = CollectCore(), OpenBatch(), list[Out]()

    def fire_until(now: int) -> None:
        nonlocal state, rows
        while state.deadline != NO_TIMER and state.deadline <= now:
            step = core.expire("acme", rule, state, state.deadline)
            assert step is not None
            rows, state = rows + step.rows, step.keep

    for fire, members in calls:
        if fire:
            fire_until(members[0][1])
        step = core.take("acme", rule, state, members)
        rows, state = rows + step.rows, step.keep
    fire_until(end)
    got = [(cause, members) for _, cause, members in batches(rows).values()]
    assert got == by_destination(in_process(rule, messages, end), "acme")
