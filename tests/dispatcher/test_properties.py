"""The dispatcher against a plain model: every answer compared, step by step.

The model keeps a list of messages and recomputes every answer from scratch (no heaps, no lazy
deletion, no indexes): which message a worker gets, which groups are owned by whom, each
partition's floor and settled ranges. Hypothesis drives both with offers, hand-outs to random
workers, settles (done, retry at a time, dead), workers going away, revocations and releases, in
every ordering mode, and shrinks any difference to a short story. What it proves:

- no two workers ever hold one group (each group's owner is the single worker of its messages in
  flight);
- a group's messages go out in order (a retried one again before its successors);
- the oldest free ready group goes first;
- every message is settled exactly once (done or dead) unless its partition was revoked: a second
  settle is refused, and a final drain settles everything left;
- ``floor(p)`` is the lowest offset of an unsettled message there, ``settled_above`` the settled
  offsets above the commit;
- state is bounded: once everything is settled nothing is left but the settled ranges.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from reassembly import GroupComplete, MessageComplete
from reassembly.assembler.positions import Origin
from reassembly.dispatcher import AfterDead, Alone, Dispatcher, Fenced, Ordering, Outcome, Settled
from reassembly.dispatcher.core import MAX_SETTLED_RANGES
from segmenter import MsgFlags, SegmentationError
from segmenter.errors import Reason

PARTITIONS = ("p0", "p1")
WORKERS = ("w0", "w1", "w2", "w3")
GROUP_IDS = (b"g0", b"g1", b"g2")
KEYS = (None, "a", "b", "c")


@dataclass
class Msg:
    ticket: int
    group: Hashable
    order: int
    positions: tuple[tuple[str, int], ...]
    offered_at: float
    state: str = "queued"  # queued, flight, done, dead, dropped, gone (fenced, its worker gone)
    fenced: bool = False
    failures: int = 0
    retry_at: float | None = None
    worker: str | None = None


@dataclass
class Model:
    ordering: Ordering
    after_dead: AfterDead
    limit: int
    msgs: dict[int, Msg] = field(default_factory=dict)
    on_hold: set[Hashable] = field(default_factory=set)
    settled: dict[str, set[int]] = field(default_factory=dict)  # settled offsets above the last commit

    def group_of(self, message: object, key: Hashable | None, ticket: int) -> tuple[Hashable, int]:
        if self.ordering is Ordering.GROUP:
            if isinstance(message, MessageComplete):
                if message.msg_flags & (MsgFlags.MSG_IN_GROUP | MsgFlags.LAST_MSG_IN_GROUP):
                    return message.group_id, message.msg_seq_number
                return (message.group_id, message.msg_seq_number), ticket
            assert isinstance(message, GroupComplete)
            return message.group_id, 0
        if self.ordering is Ordering.KEY:
            return (Alone(ticket) if key is None else key), ticket
        if self.ordering is Ordering.PARTITION:
            return message.positions[0][0], ticket  # type: ignore[attr-defined]
        return Alone(ticket), ticket

    def live(self) -> list[Msg]:
        return [m for m in self.msgs.values() if m.state in ("queued", "flight")]

    def queued(self, group: Hashable) -> list[Msg]:
        return sorted(
            (m for m in self.msgs.values() if m.group == group and m.state == "queued"),
            key=lambda m: (m.order, m.ticket),
        )

    def flight(self, group: Hashable) -> list[Msg]:
        return [m for m in self.msgs.values() if m.group == group and m.state == "flight"]

    def groups(self) -> set[Hashable]:
        return {m.group for m in self.live()} | self.on_hold

    def expected_take(self, worker: str, now: float) -> int | None:
        def ready(m: Msg) -> bool:
            return m.retry_at is None or m.retry_at <= now

        heads = []
        for group in self.groups():
            queue, flight = self.queued(group), self.flight(group)
            if not queue or group in self.on_hold or not ready(queue[0]):
                continue
            if not flight:
                heads.append((1, queue[0].ticket))
            elif self.limit > 1 and len(flight) < self.limit and flight[0].worker == worker:
                heads.append((0, queue[0].ticket))  # its own group first
        return min(heads)[1] if heads else None

    def expected_wakeup(self) -> float | None:
        due = [
            q[0].retry_at
            for group in self.groups()
            if group not in self.on_hold and not self.flight(group) and (q := self.queued(group))
            if q[0].retry_at is not None
        ]
        return min(due, default=None)

    def floor(self, partition: str) -> int | None:
        offsets = [o for m in self.live() if not m.fenced for p, o in m.positions if p == partition]
        return min(offsets, default=None)


def _ranges(offsets: set[int]) -> list[tuple[int, int]]:
    ranges: list[tuple[int, int]] = []
    for o in sorted(offsets):
        if ranges and ranges[-1][1] == o - 1:
            ranges[-1] = (ranges[-1][0], o)
        else:
            ranges.append((o, o))
    return ranges


class DispatcherMachine(RuleBasedStateMachine):
    @initialize(
        ordering=st.sampled_from(Ordering),
        after_dead=st.sampled_from(AfterDead),
        limit=st.sampled_from((1, 1, 2)),
    )
    def start(self, ordering: Ordering, after_dead: AfterDead, limit: int) -> None:
        self.d = Dispatcher(ordering, after_dead=after_dead, max_in_flight_per_group=limit)
        self.m = Model(ordering, after_dead, limit)
        self.now = 0.0
        self.next_offset = dict.fromkeys(PARTITIONS, 0)
        self.revoked = 0

    # ---------------------------------------------------------------- steps

    @rule(dt=st.sampled_from((0.0, 0.5, 1.0, 3.0)))
    def advance(self, dt: float) -> None:
        self.now += dt

    @rule(data=st.data(), count=st.integers(1, 4))
    def offer(self, data: st.DataObject, count: int) -> None:
        """A fetch: a few whole messages, each with one to three segments in one or more partitions."""
        for _ in range(count):
            self._offer_one(data)

    def _offer_one(self, data: st.DataObject) -> None:
        segments = data.draw(
            st.lists(st.tuples(st.sampled_from(PARTITIONS), st.sampled_from((0, 0, 0, 1, 2))), min_size=1, max_size=3)
        )
        positions = []
        for partition, skip in segments:  # skipped offsets: records the dispatcher never sees
            self.next_offset[partition] += skip
            positions.append(Origin(partition, self.next_offset[partition]))
            self.next_offset[partition] += 1
        group_id = data.draw(st.sampled_from(GROUP_IDS))
        flags = data.draw(st.sampled_from((0, MsgFlags.MSG_IN_GROUP, MsgFlags.LAST_MSG_IN_GROUP)))
        seq = data.draw(st.integers(1, 5))
        message: object = MessageComplete(group_id, seq, b"x" * seq, int(flags), 1, 0, seq, seq, None, tuple(positions))
        if data.draw(st.integers(0, 9)) == 0:
            message = GroupComplete(group_id, (message,))  # type: ignore[arg-type]
        key = data.draw(st.sampled_from(KEYS))
        ticket = self.d.offer(message, now=self.now, key=key)
        assert ticket not in self.m.msgs and all(ticket > t for t in self.m.msgs)
        group, order = self.m.group_of(message, key, ticket)
        self.m.msgs[ticket] = Msg(ticket, group, order, tuple((p, o) for p, o in positions), self.now)

    @rule(workers=st.lists(st.sampled_from(WORKERS), min_size=1, max_size=4))
    def take(self, workers: list[str]) -> None:
        """Idle workers ask in turn; each answer is the model's."""
        for worker in workers:
            self._take_one(worker)

    def _take_one(self, worker: str) -> None:
        expected = self.m.expected_take(worker, self.now)
        work = self.d.take(worker, self.now)
        assert (work and work.ticket) == expected
        if work is None:
            assert self.d.next_wakeup() == self.m.expected_wakeup()
            return
        msg = self.m.msgs[work.ticket]
        assert work.group == msg.group and work.positions == msg.positions and work.attempt == msg.failures + 1
        msg.state, msg.worker, msg.retry_at = "flight", worker, None

    def _in_flight(self) -> list[int]:
        return sorted(t for t, m in self.m.msgs.items() if m.state == "flight")

    @precondition(lambda self: any(m.state == "flight" for m in self.m.msgs.values()))
    @rule(data=st.data())
    def settle(self, data: st.DataObject) -> None:
        """Workers finish, in any order: done, retry (now or later) or dead."""
        tickets = self._in_flight()
        data.draw(st.randoms(use_true_random=False)).shuffle(tickets)  # any order, not the simplest one
        for ticket in tickets[: data.draw(st.integers(1, 4))]:
            outcome = data.draw(st.sampled_from((Outcome.DONE, Outcome.DONE, Outcome.RETRY, Outcome.DEAD)))
            delay = data.draw(st.sampled_from((None, 0.0, 1.0, 2.0)))
            self._settle_one(ticket, outcome, delay)

    def _settle_one(self, ticket: int, outcome: Outcome, delay: float | None) -> None:
        msg = self.m.msgs[ticket]
        retry_at = None if delay is None else self.now + delay
        answer = self.d.settle(ticket, outcome, now=self.now, retry_at=retry_at)
        if msg.fenced:
            assert isinstance(answer, Fenced) and answer.ticket == ticket
            msg.state = "gone"
            return
        assert isinstance(answer, Settled) and answer.attempt == msg.failures + 1
        if outcome is Outcome.RETRY:
            msg.state, msg.failures, msg.retry_at, msg.worker = "queued", msg.failures + 1, retry_at, None
        else:
            msg.state = outcome.value
            for p, o in msg.positions:
                self.m.settled.setdefault(p, set()).add(o)
            if outcome is Outcome.DEAD and self.m.after_dead is AfterDead.HOLD:
                self.m.on_hold.add(msg.group)
        assert answer.group_free == (not self.m.flight(msg.group))
        assert answer.on_hold == (msg.group in self.m.on_hold)

    @rule(data=st.data())
    def settle_what_is_not_in_flight(self, data: st.DataObject) -> None:
        """A second settle (or one of a queued or unknown ticket) is refused and changes nothing."""
        candidates = [t for t, m in self.m.msgs.items() if m.state != "flight"] + [0, 10**9]
        ticket = data.draw(st.sampled_from(candidates))
        with pytest.raises(SegmentationError) as caught:
            self.d.settle(ticket, Outcome.DONE, now=self.now)
        assert caught.value.reason is Reason.STATE_ERROR

    @rule(worker=st.sampled_from(WORKERS))
    def worker_gone(self, worker: str) -> None:
        expected = []
        for m in self.m.msgs.values():
            if m.state == "flight" and m.worker == worker:
                if m.fenced:
                    m.state = "gone"
                else:
                    m.state, m.worker = "queued", None
                    expected.append(m.ticket)
        assert self.d.worker_gone(worker) == sorted(expected)

    @rule(partition=st.sampled_from(PARTITIONS))
    def revoke(self, partition: str) -> None:
        dropped, fenced = [], []
        for m in self.m.msgs.values():
            if m.state in ("queued", "flight") and not m.fenced and any(p == partition for p, _ in m.positions):
                if m.state == "queued":
                    m.state = "dropped"
                    dropped.append(m.ticket)
                else:
                    m.fenced = True
                    fenced.append(m.ticket)
        self.m.settled.pop(partition, None)
        answer = self.d.revoke(partition)
        assert (list(answer.dropped), list(answer.fenced)) == (sorted(dropped), sorted(fenced))
        self.revoked += 1

    @precondition(lambda self: bool(self.m.on_hold))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        group = data.draw(st.sampled_from(sorted(self.m.on_hold, key=repr)))
        self.m.on_hold.discard(group)
        assert self.d.release(group) == len(self.m.queued(group))

    @rule(partition=st.sampled_from(PARTITIONS))
    def commit(self, partition: str) -> None:
        """Commit the floor (or everything read when nothing is unsettled) and read the ranges."""
        commit = self.d.commit_offset(partition, self.next_offset[partition])
        floor = self.m.floor(partition)
        assert commit == (self.next_offset[partition] if floor is None else floor)
        kept = {o for o in self.m.settled.get(partition, set()) if o > commit}
        self.m.settled[partition] = kept
        assert self.d.settled_above(partition, commit) == _ranges(kept)

    # ---------------------------------------------------------------- always

    @invariant()
    def the_groups_are_as_the_model_says(self) -> None:
        if not hasattr(self, "d"):
            return
        seen = {}
        for view in self.d.groups():
            assert view.group not in seen, "a group listed twice"
            seen[view.group] = (view.queued, view.owner, view.acquired, view.on_hold)
        expected = {}
        for group in self.m.groups():
            flight = self.m.flight(group)
            owners = {m.worker for m in flight}
            assert len(owners) <= 1, "two workers hold one group"
            expected[group] = (
                len(self.m.queued(group)),
                owners.pop() if owners else None,
                len(flight),
                group in self.m.on_hold,
            )
        assert seen == expected

    @invariant()
    def floors_and_counts(self) -> None:
        if not hasattr(self, "d"):
            return
        for p in PARTITIONS:
            assert self.d.floor(p) == self.m.floor(p)
        live = self.m.live()
        assert self.d.held_messages() == len(live)
        stats = self.d.stats
        assert stats.in_flight == sum(m.state == "flight" for m in live)
        assert stats.groups_on_hold == len(self.m.on_hold)
        assert stats.groups_owned == sum(1 for g in self.m.groups() if self.m.flight(g))
        assert stats.done == sum(m.state == "done" for m in self.m.msgs.values())
        assert stats.dead == sum(m.state == "dead" for m in self.m.msgs.values())
        oldest = min((m.offered_at for m in live), default=None)
        assert self.d.oldest_offer() == oldest

    def teardown(self) -> None:
        """Drain: release every hold, let time pass, settle all; then nothing is left."""
        if not hasattr(self, "d"):
            return
        for group in list(self.m.on_hold):
            self.d.release(group)
        for worker in WORKERS:
            self.d.worker_gone(worker)  # fenced ones forgotten, the rest back in their groups
        done = 0
        while (work := self.d.take("drain", float("inf"))) is not None:
            assert isinstance(self.d.settle(work.ticket, Outcome.DONE, now=float("inf")), Settled)
            done += 1
        assert done == sum(m.state in ("queued", "flight") and not m.fenced for m in self.m.msgs.values())
        # every message offered was settled exactly once, dropped by a revocation, or fenced
        assert self.d.held_messages() == 0 and self.d.held_bytes() == 0 and self.d.groups() == []
        assert self.d.next_wakeup() is None and self.d.oldest_offer() is None
        d = self.d
        assert not d._entries and not d._groups and not d._by_gid and not d._owned and not d._order
        assert len(d._free) + len(d._waiting) <= 64
        for part in d._parts.values():
            assert not part.live and len(part.heap) <= 64 and len(part.los) <= MAX_SETTLED_RANGES


DispatcherMachine.TestCase.settings = settings(
    DispatcherMachine.TestCase.settings,
    max_examples=max(100, settings.default.max_examples),
    stateful_step_count=50,
    deadline=None,
)
test_the_dispatcher_matches_its_model = DispatcherMachine.TestCase
