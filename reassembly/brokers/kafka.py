"""Kafka: a consumer loop that reassembles and commits only safe offsets, and the drain's Kafka source.

:class:`KafkaReassembler` is a thin adapter: it polls records, gives each record value (one
encoded segment, as the producer sent it) to an :class:`~reassembly.Assembler` with its
``(topic, partition)`` and offset, hands every completed message to the application, and commits
per partition the assembler's safe position (:func:`~reassembly.assembler.positions.next_offset`),
never past a segment of a message still incomplete. What to commit, what is a duplicate, what
expired: all of that is the assembler's decision; this module only moves records and offsets.

The guarantee, exactly: every message whose segments are in the log is handed to the application
*at least once*; the offsets committed never pass a segment that is not settled (delivered and
returned by the handler, handed back in an event, or counted a duplicate), so a crash, a rebalance
or a restart re-reads every unsettled segment. Within one running loop (one assembler) a message is
handed out *at most once*: a second copy (a producer retry that sent the whole message again, a
segment read again after a rebalance gave the partition back) is a :class:`~reassembly.Duplicate`,
as long as the message is among the last ``Limits.remember_closed`` finished groups. Across a crash
or a rebalance to another consumer, the messages whose segments lay above the committed offset are
handed out again: a sink keyed by the message id (GroupId, MsgSeqNumber) is then *effectively
once*.

:class:`KafkaSource` is the drain's consumer (:class:`reassembly.brokers.drain.Drain`): records
in, and the offsets of those landed in a durable file committed at the next fetch. It lives in
:mod:`reassembly.brokers.kafka_source` (it commits by a rule of its own) and is importable from here.

confluent-kafka (librdkafka) is imported only when a consumer is created: ``pip install
"segment-reassembly[kafka]"``.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from reassembly.assembler.core import Assembler, Limits
from reassembly.assembler.events import (
    Cause,
    Duplicate,
    Event,
    GroupComplete,
    GroupFailed,
    MessageComplete,
    MessageFailed,
    Rejected,
    Unfinished,
)
from reassembly.assembler.positions import next_offset
from reassembly.brokers.kafka_config import TP, _consumer_config, bootstrap_servers
from reassembly.brokers.kafka_source import KafkaRecord, KafkaSource
from segmenter.brokers import BrokerError
from segmenter.brokers.kafka import confluent
from segmenter.errors import Reason, SegmentationError

log = logging.getLogger(__name__)

DEFAULT_EXPIRY_OFFSETS = 10_000
"""``Limits.expiry_offsets`` of the assembler a loop builds when given none: an incomplete message
holding a segment more than this many offsets behind its partition's newest is handed back
(li-kafka's ``expiration.offset.gap``), so an abandoned message cannot pin the commit for ever."""
DEFAULT_EXPIRY_SECONDS = 600.0
"""``Limits.expiry_seconds`` of the assembler a loop builds when given none (on the loop's clock).
Offset distance cannot free what is held at the end of a partition, where nothing newer comes: the
tail of a message whose first segments lie below the committed offset (a producer's resend of a
message already delivered, read by a fresh loop started at that offset) would otherwise hold the
commit there for good. After ten quiet minutes such a group is handed back (``Unfinished``,
expired, with its gap report) and the commit moves on."""

Delivered = MessageComplete | GroupComplete


# ---------------------------------------------------------------------------------- events
@dataclass(frozen=True)
class Replay:
    """What :meth:`KafkaReassembler.seek` did.

    ``offset`` is where reading resumes: ``requested``, or lower when ``requested`` fell inside a
    message already delivered (its first segment lies below): reading then starts at that message's
    lowest segment, so it is read whole. ``messages``: the delivered messages (GroupId,
    MsgSeqNumber; ``None`` for a Unit-of-Work group) forgotten so that they are handed out again.
    ``exact`` is False when the loop cannot know every message the new position cuts through
    (``offset`` is below what this assignment read, its record of delivered messages no longer
    reaches it, or a forward seek skips records never read): a message whose first segments lie
    before ``offset`` and were not read then arrives without them, and is handed back as
    ``Unfinished`` (expired by offset distance) or its segments ``Late``, never silently.
    """

    topic: str
    """The topic of the partition read again."""
    partition: int
    """The partition read again, in ``topic``."""
    requested: int
    offset: int
    messages: tuple[tuple[bytes, int | None], ...]
    exact: bool


@dataclass(frozen=True)
class CommitFailed:
    """A commit the cluster refused, whole or for some of its partitions (a rebalance in progress,
    a lost coordinator, a generation that ended): nothing is lost, the next commit carries the same
    or higher safe offsets."""

    offsets: tuple[tuple[str, int, int], ...]
    """The ``(topic, partition, offset)`` that were not committed: every one of the commit when the
    whole commit was refused, else only the partitions the cluster refused (the others were
    committed)."""
    error: str
    """Why, in the client's words: the whole commit's error, or the refused partitions' errors
    joined by semicolons."""


KafkaEvent = Event | Replay | CommitFailed
"""What ``on_event`` receives: every assembler event that is not a delivery (duplicates, rejections,
failures, unfinished groups: expired, evicted, revoked), and the loop's own :class:`Replay` and
:class:`CommitFailed`."""


@dataclass
class KafkaStats:
    """What happened so far; ``unfinished`` counts groups handed back by cause (``expired``,
    ``evicted``, ``revoked``)."""

    records: int = 0
    """Records given to the assembler (those ``hooks.skip`` passed over are in ``skipped``)."""
    messages: int = 0
    """Messages handed to the application (a ``GroupComplete`` counts each of its messages)."""
    duplicates: int = 0
    """:class:`~reassembly.Duplicate` events: copies of segments already held or delivered, ignored."""
    rejected: int = 0
    """:class:`~reassembly.Rejected` events: bad, late or conflicting segments."""
    failed: int = 0
    """:class:`~reassembly.MessageFailed` and :class:`~reassembly.GroupFailed` events: nothing of
    those was delivered."""
    unfinished: dict[str, int] = field(default_factory=dict)
    commits: int = 0
    """Commits the cluster accepted, for one partition or more (a commit of several counts once)."""
    commit_failures: int = 0
    """Commits the cluster refused, whole or for some partitions: each is a :class:`CommitFailed` event."""
    replays: int = 0
    """Seeks made by :meth:`KafkaReassembler.seek`: each is a :class:`Replay` event."""
    stale: int = 0
    """Partitions whose restored snapshot state was older than the group's committed offset: that
    state was dropped and the partition read from the committed offset."""
    skipped: int = 0
    """Records ``hooks.skip`` said were settled before: not given to the assembler."""


def _log_event(ev: KafkaEvent) -> None:
    """The default ``on_event``: every event is logged (a duplicate or a revoked group at DEBUG and
    INFO: they are normal; anything handed back at WARNING)."""
    if isinstance(ev, Duplicate):
        log.debug("duplicate segment of %s/%d", ev.group_id.hex(), ev.msg_seq_number)
    elif isinstance(ev, Unfinished) and ev.cause == Cause.REVOKED:
        log.info("group %s left with its partition (its next owner reads it again)", ev.group_id.hex())
    elif isinstance(ev, Replay):
        log.info("seek %s[%d] to %d (asked %d), %d messages again", ev.topic, ev.partition, ev.offset,
                 ev.requested, len(ev.messages))  # fmt: skip
    else:
        log.warning("%s: %s", type(ev).__name__, ev)


class _Spans:
    """Per partition, the offsets of the recently delivered messages (lowest and highest segment
    there): what a seek needs to start at a message's first segment. Bounded by ``window``
    messages; ``lost_high`` is the highest offset of a forgotten entry (a seek at or below it may
    cut a message the loop no longer knows)."""

    __slots__ = ("entries", "first", "lost_high", "window")

    def __init__(self, window: int, first: int) -> None:
        self.window = window
        self.first = first  # the lowest offset read in this assignment
        self.lost_high = -1
        self.entries: OrderedDict[tuple[bytes, int | None], tuple[int, int]] = OrderedDict()

    def add(self, key: tuple[bytes, int | None], low: int, high: int) -> None:
        self.entries[key] = (low, high)
        self.entries.move_to_end(key)
        while len(self.entries) > self.window:
            _, (_, h) = self.entries.popitem(last=False)
            self.lost_high = max(self.lost_high, h)


@dataclass(frozen=True)
class LoopHooks:
    """What a caller that settles messages later than ``on_message`` returns (the group dispatcher's
    source, :mod:`reassembly.brokers.kafka_dispatch`) plugs into the loop; every hook is optional.

    ``plan(tp, next_offset)``: the offset to commit instead of the assembler's ``next_offset`` (never
    above it: messages handed out but not yet settled pin it lower), and the commit metadata to
    send with it (``None``: none). ``before_commit`` sees every ``(topic, partition, offset,
    metadata)`` about to be sent, before it is sent (a log a test checks commits against).
    ``revoking(partitions, commits)`` runs when partitions leave, in place of the loop's own
    commit of them (``commits``: whether they may be committed; False when they were lost): it
    commits them with :meth:`KafkaReassembler.commit` while what pins their offsets is still
    counted, then stops whatever it handed out of them. ``assigned(partitions)``
    runs after an assignment was taken. ``skip(tp, offset)``: True for a record known to be settled
    already (it is not given to the assembler; counted in ``stats.skipped``). ``commit_in_poll``:
    False leaves every commit to the caller's :meth:`KafkaReassembler.commit` (the messages of a
    batch must first reach whoever pins their offsets). ``refused(offsets, error)``: the
    ``(topic, partition, offset)`` the cluster refused to commit (a rebalance in progress, a
    generation that ended; the whole commit, or some of its partitions), before the
    :class:`CommitFailed` event: none of those was committed.
    """

    plan: Callable[[TP, int | None], tuple[int | None, str | None]] | None = None
    before_commit: Callable[[list[tuple[str, int, int, str | None]]], None] | None = None
    revoking: Callable[[list[TP], bool], None] | None = None
    assigned: Callable[[list[TP]], None] | None = None
    skip: Callable[[TP, int], bool] | None = None
    commit_in_poll: bool = True
    refused: Callable[[list[tuple[str, int, int]], str], None] | None = None


class KafkaReassembler:
    """Reassembles segments from Kafka topics; commits only offsets whose segments all settled.

    ``config``: librdkafka consumer settings (``bootstrap.servers``, ``group.id``, ...);
    ``enable.auto.commit`` is forced off. ``on_message`` receives every completed
    :class:`~reassembly.MessageComplete` (or :class:`~reassembly.GroupComplete` in Unit-of-Work mode)
    and must return only once the message is safe (written, committed downstream): offsets covering
    its segments are committed only after it returned. Without ``on_message``, iterate
    :meth:`messages` instead (a message counts as handled when the iterator is advanced past it).
    ``on_event`` receives every other event (:data:`KafkaEvent`) and must likewise return only once
    what it must keep (a quarantined segment's bytes) is safe: the commit then passes those segments.

    Offsets are committed synchronously every ``commit_every`` records or ``commit_interval``
    seconds (when they moved), when a partition is revoked (before its groups are handed back),
    when idle, and on :meth:`close`. ``on_snapshot`` receives :meth:`Assembler.snapshot` after every
    revocation and at :meth:`close`; with ``resume=True`` the partitions an assembler restored from
    one holds are read from just after their checkpoint's ``high`` instead of the committed offset.
    Where the group committed past what the snapshot's run committed (the snapshot is older than a
    later run's progress), the snapshot's state of that partition is dropped (``stats.stale``) and
    the partition read from the committed offset; a snapshot holding partitions of topics not in
    ``topics`` is refused (9016) before the consumer is created.

    ``assembler``: what the segments go through (``None``: one with
    :data:`DEFAULT_EXPIRY_OFFSETS` and :data:`DEFAULT_EXPIRY_SECONDS`, on ``clock``). ``batch``:
    the most records one poll reads. ``replay_window``: how many recently delivered messages per
    partition the loop remembers the offsets of, so that a :meth:`seek` into one starts at its
    first segment (a seek below what is remembered is not ``exact``). ``clock``: seconds, for
    ``commit_interval``, :meth:`close`'s ``timeout`` and the default assembler's expiry.
    ``hooks``: what a caller that settles messages later than ``on_message`` returns plugs into
    the loop (:class:`LoopHooks`; ``None``: none).
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        topics: Sequence[str],
        *,
        assembler: Assembler | None = None,
        on_message: Callable[[Delivered], None] | None = None,
        on_event: Callable[[KafkaEvent], None] | None = None,
        on_snapshot: Callable[[bytes], None] | None = None,
        resume: bool = False,
        commit_every: int = 1000,
        commit_interval: float = 5.0,
        batch: int = 500,
        replay_window: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
        hooks: LoopHooks | None = None,
    ) -> None:
        ck = confluent()
        self._ck = ck
        if assembler is None:
            limits = Limits(expiry_offsets=DEFAULT_EXPIRY_OFFSETS, expiry_seconds=DEFAULT_EXPIRY_SECONDS)
            assembler = Assembler(limits, clock=clock)
        self.assembler = assembler
        self.on_message = on_message
        self.on_event = on_event or _log_event
        self.on_snapshot = on_snapshot
        self.commit_every = commit_every
        self.commit_interval = commit_interval
        self.batch = batch
        self.replay_window = replay_window
        self.clock = clock
        self.hooks = hooks or LoopHooks()
        self.key: bytes | None = None  # the record key of the record being given to the assembler
        self.largest_record = 0  # bytes of the largest record value read
        self.stats = KafkaStats()
        self.assigned: set[TP] = set()
        self._committed: dict[TP, int] = {}
        self._spans: dict[Hashable, _Spans] = {}
        self._seeked: set[TP] = set()  # seeks made while a batch is handed out: the rest of it is stale
        self._resume = dict(self.assembler.checkpoints()) if resume else {}
        if resume:
            _check_resumable(self._resume, topics)
        self._restored: set[Hashable] = set(self.assembler.checkpoints())
        self._since_commit = 0
        self._last_commit = clock()
        self._closed = False
        # The Python client does not say which rebalance protocol is in use (librdkafka's
        # rd_kafka_rebalance_protocol has no binding): the assignment strategy decides it.
        strategy = str(config.get("partition.assignment.strategy", ""))
        self._cooperative = "cooperative" in strategy.lower()
        self.consumer = ck.Consumer(_consumer_config(config))
        self.consumer.subscribe(list(topics), on_assign=self._on_assign, on_revoke=self._on_revoke,
                                on_lost=self._on_lost)  # fmt: skip

    # ------------------------------------------------------------------ reading
    def messages(self, timeout: float = 1.0, stop: Callable[[], bool] | None = None) -> Iterator[Delivered]:
        """Yield completed messages until :meth:`close` or ``stop()``; every other event goes to
        ``on_event``. A message is handled once the iterator is advanced past it: offsets are
        committed only between batches, after every message of the batch was taken. ``timeout``:
        each poll's longest wait for a first record, in seconds."""
        while not self._closed and not (stop is not None and stop()):
            yield from self._batch(timeout)

    def poll(self, timeout: float = 1.0) -> int:
        """One batch: read up to ``batch`` records (waiting up to ``timeout`` s for the first), hand
        the completed messages to ``on_message``, commit when due; returns the records read."""
        if self.on_message is None:
            raise SegmentationError("poll() needs on_message; iterate messages() instead", reason=Reason.STATE_ERROR)
        before = self.stats.records
        for m in self._batch(timeout):
            self.on_message(m)
        return self.stats.records - before

    def one_batch(self, timeout: float = 1.0) -> Iterator[Delivered]:
        """One batch of :meth:`messages`: read up to ``batch`` records (waiting up to ``timeout`` s
        for the first) and yield the messages they complete; :attr:`key` is the record key of the
        record that completed the message yielded."""
        return self._batch(timeout)

    def run(self, stop: Callable[[], bool], timeout: float = 1.0) -> KafkaStats:
        """:meth:`poll` until ``stop()``; returns the stats (call :meth:`close` after). ``timeout``:
        each poll's longest wait for a first record, in seconds."""
        while not stop() and not self._closed:
            self.poll(timeout)
        return self.stats

    def _batch(self, timeout: float) -> Iterator[Delivered]:
        records = self.consumer.consume(num_messages=self.batch, timeout=timeout)
        self._seeked.clear()
        asm = self.assembler
        for rec in records:
            err = rec.error()
            if err is not None:
                self._record_error(err)
                continue
            tp = (rec.topic(), rec.partition())
            if tp in self._seeked or tp not in self.assigned:
                continue  # read before a seek (or a revocation) of its partition: read again later
            offset = rec.offset()
            skip = self.hooks.skip
            if skip is not None and skip(tp, offset):
                self.stats.skipped += 1
                continue
            spans = self._spans.get(tp)
            if spans is None:
                spans = self._spans[tp] = _Spans(self.replay_window, offset)
            elif offset < spans.first:
                spans.first = offset
            value = rec.value()
            if value is not None and len(value) > self.largest_record:
                self.largest_record = len(value)
            self.stats.records += 1
            self._since_commit += 1
            self.key = rec.key()
            for ev in asm.receive(b"" if value is None else value, position=offset, partition=tp):
                if isinstance(ev, MessageComplete | GroupComplete):
                    self._note(ev)
                    self.stats.messages += len(ev.messages) if isinstance(ev, GroupComplete) else 1
                    yield ev
                else:
                    self._report(ev)
        if not records:
            for ev in asm.expire():
                self._report(ev)
        now = self.clock()
        if not self.hooks.commit_in_poll:
            return
        if not records or self._since_commit >= self.commit_every or now - self._last_commit >= self.commit_interval:
            self.commit()

    def _record_error(self, err: Any) -> None:
        ck = self._ck
        if err.code() == ck.KafkaError._PARTITION_EOF:
            return
        if err.fatal():
            raise BrokerError(f"Kafka: {err.str()}", code=err.code())
        log.warning("Kafka: %s", err.str())

    def _note(self, ev: Delivered) -> None:
        """Remember where a delivered message's segments lie in each partition (for :meth:`seek`)."""
        key = (ev.group_id, None if isinstance(ev, GroupComplete) else ev.msg_seq_number)
        where: dict[Hashable, tuple[int, int]] = {}
        for o in ev.positions:
            lo, hi = where.get(o.partition, (o.position, o.position))
            where[o.partition] = (min(lo, o.position), max(hi, o.position))
        for tp, (lo, hi) in where.items():
            spans = self._spans.get(tp)
            if spans is not None:
                spans.add(key, lo, hi)

    def _report(self, ev: KafkaEvent) -> None:
        st = self.stats
        if isinstance(ev, Duplicate):
            st.duplicates += 1
        elif isinstance(ev, Rejected):
            st.rejected += 1
        elif isinstance(ev, MessageFailed | GroupFailed):
            st.failed += 1
        elif isinstance(ev, Unfinished):
            st.unfinished[ev.cause.value] = st.unfinished.get(ev.cause.value, 0) + 1
        self.on_event(ev)

    # ------------------------------------------------------------------ commits
    def commit(self, partitions: Collection[TP] | None = None) -> list[tuple[str, int, int]]:
        """Commit (synchronously) each assigned partition's safe offset that moved since the last
        commit; returns what was committed. Call it only when every message handed out was handled.
        ``partitions``: only these ``(topic, partition)`` (``None``: every assigned one)."""
        ck = self._ck
        todo: list[tuple[str, int, int]] = []
        metadata: dict[TP, str] = {}
        for tp, cp in self.assembler.checkpoints().items():
            if tp not in self.assigned or (partitions is not None and tp not in partitions):
                continue
            off = next_offset(cp)
            plan = self.hooks.plan
            meta: str | None = None
            if plan is not None:
                off, meta = plan(tp, off)  # type: ignore[arg-type]
            if off is not None and self._committed.get(tp) != off:  # type: ignore[call-overload]
                topic, part = tp  # type: ignore[misc]
                todo.append((topic, part, off))
                if meta is not None:
                    metadata[(topic, part)] = meta
        self._since_commit, self._last_commit = 0, self.clock()
        if not todo:
            return []
        if self.hooks.before_commit is not None:
            self.hooks.before_commit([(t, p, o, metadata.get((t, p))) for t, p, o in todo])
        try:
            tps = [ck.TopicPartition(t, p, o, metadata=metadata[(t, p)]) if (t, p) in metadata
                   else ck.TopicPartition(t, p, o) for t, p, o in todo]  # fmt: skip
            answer = self.consumer.commit(offsets=tps, asynchronous=False)
        except ck.KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if err is not None and hasattr(err, "code") and err.code() == ck.KafkaError._NO_OFFSET:
                return []
            self._refused(todo, str(err if err is not None else exc))
            return []
        # librdkafka raises only when every partition failed: one refused among others comes back
        # in the answer, and is not committed
        failed = {(tp.topic, tp.partition): str(tp.error) for tp in answer or () if tp.error is not None}
        if failed:
            self._refused([c for c in todo if (c[0], c[1]) in failed], "; ".join(sorted(set(failed.values()))))
        done = [c for c in todo if (c[0], c[1]) not in failed]
        for t, p, o in done:
            self._committed[(t, p)] = o
        if done:
            self.stats.commits += 1
        return done

    def _refused(self, offsets: list[tuple[str, int, int]], error: str) -> None:
        """A commit the cluster refused (a rebalance in progress, a generation that ended): the
        partitions keep their last committed offset, and the next :meth:`commit` tries again."""
        self.stats.commit_failures += 1
        if self.hooks.refused is not None:
            self.hooks.refused(offsets, error)
        self._report(CommitFailed(tuple(offsets), error))

    # ------------------------------------------------------------------ rebalance
    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        new = {(tp.topic, tp.partition) for tp in partitions}
        self.assigned |= new
        for tp in new:
            self._committed.pop(tp, None)
            self._spans.pop(tp, None)
        # An assembler restored from a snapshot: what it holds of partitions not given to us goes
        # back (their owner reads them from the committed offset); those given to us resume after
        # what the snapshot holds. One given back is read from its committed offset if it comes to
        # us later: nothing of the snapshot is left to resume it after.
        elsewhere = [p for p in self._restored if p not in self.assigned]
        self._restored.clear()
        for p in elsewhere:
            self._resume.pop(p, None)  # type: ignore[call-overload]
            for ev in self.assembler.revoke(p):
                self._report(ev)
        moved = False
        resumed = [tp for tp in partitions if (tp.topic, tp.partition) in self._resume]
        committed = self._committed_offsets(consumer, resumed)
        for tp in partitions:
            key = (tp.topic, tp.partition)
            cp = self._resume.pop(key, None)
            if cp is None:
                continue
            mine = next_offset(cp)
            theirs = committed.get(key)
            if theirs is not None and mine is not None and theirs > mine:
                # Committed past what the snapshot's run committed: a later run (which crashed
                # without a snapshot) settled more, so this state is stale. Everything at or after
                # the committed offset is read again; what lies below it settled.
                log.warning("%s[%d]: the snapshot is older than the committed offset %d (it would resume at %s):"
                            " its state of the partition is dropped, reading from %d", tp.topic, tp.partition,
                            theirs, mine, theirs)  # fmt: skip
                self.stats.stale += 1
                for ev in self.assembler.revoke(key):
                    self._report(ev)
                continue
            start = cp.restart if cp.high is None else cp.high + 1
            if start is not None:
                tp.offset, moved = int(start), True
        if moved:
            if self._cooperative:
                consumer.incremental_assign(partitions)
            else:
                consumer.assign(partitions)
        log.info("assigned %s", sorted(new))
        if self.hooks.assigned is not None:
            self.hooks.assigned(sorted(new))

    def _committed_offsets(self, consumer: Any, partitions: list[Any]) -> dict[TP, int]:
        """The group's committed offsets of ``partitions`` (those it has one for)."""
        if not partitions:
            return {}
        ck = self._ck
        try:
            got = consumer.committed([ck.TopicPartition(tp.topic, tp.partition) for tp in partitions], timeout=30)
        except ck.KafkaException as exc:
            raise BrokerError(f"Kafka: the committed offsets to check the snapshot against: {exc}") from None
        return {(tp.topic, tp.partition): tp.offset for tp in got if tp.offset >= 0}

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        gone = {(tp.topic, tp.partition) for tp in partitions}
        if self.hooks.revoking is not None:
            self.hooks.revoking(sorted(gone), True)  # commits them itself, then fences their work
        else:
            self.commit(gone)  # first: the groups about to be handed back still pin these offsets
        self._drop(gone)

    def _on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        gone = {(tp.topic, tp.partition) for tp in partitions}
        if self.hooks.revoking is not None:
            self.hooks.revoking(sorted(gone), False)
        self._drop(gone)  # no longer ours: nothing to commit

    def _drop(self, gone: set[TP]) -> None:
        for tp in gone:
            for ev in self.assembler.revoke(tp):
                self._report(ev)
            self._spans.pop(tp, None)
            self._committed.pop(tp, None)
        self.assigned -= gone
        # The revocation consumer.close() makes comes after close() handed over the state to resume
        # from: a snapshot here, with the held groups just revoked, would replace it.
        if self.on_snapshot is not None and gone and not self._closed:
            self.on_snapshot(self.assembler.snapshot())

    # ------------------------------------------------------------------ seek
    def seek(self, topic: str, partition: int, offset: int) -> Replay:
        """Read ``topic``/``partition`` again from ``offset`` (backwards or forwards).

        A message already delivered that has a segment at or after the new position is forgotten
        (handed out again when read again); if one also has a segment below it, reading starts at
        that message's lowest segment instead, so that it is read whole (repeated until no such
        message is left). The commit never passes the new position before it is read. Returns the
        :class:`Replay` (also given to ``on_event``). Call it between messages: from ``on_message``
        or between iterations."""
        tp = (topic, partition)
        if tp not in self.assigned:
            raise SegmentationError(f"{topic}[{partition}] is not assigned to this consumer", reason=Reason.STATE_ERROR)
        spans = self._spans.get(tp)
        high = self.assembler.checkpoint(tp).high
        at = offset
        forgotten: list[tuple[bytes, int | None]] = []
        if spans is not None:
            moved = True
            while moved:  # a message starting below ``at`` and reaching it moves ``at`` down to its start
                moved = False
                for lo, hi in spans.entries.values():
                    if lo < at <= hi:
                        at, moved = lo, True
            for key, (_, hi) in list(spans.entries.items()):
                if hi >= at:
                    gid, seq = key
                    self.assembler.forget(gid, 1 if seq is None else seq)
                    forgotten.append(key)
                    del spans.entries[key]
        exact = (
            spans is not None
            and at >= spans.first
            and at > spans.lost_high
            and (high is None or at <= high + 1)
        )
        self.assembler.rewind(tp, at)
        self.consumer.seek(self._ck.TopicPartition(topic, partition, at))
        self._seeked.add(tp)
        self.stats.replays += 1
        replay = Replay(topic, partition, offset, at, tuple(forgotten), exact)
        self.on_event(replay)
        return replay

    # ------------------------------------------------------------------ end
    def close(self, timeout: float = 10.0) -> None:
        """Commit what is safe, hand ``on_snapshot`` the state, leave the group. Segments of
        incomplete messages are not committed: the partitions' next reader reads them again.

        A commit refused because the group is rebalancing (another member left or joined) is tried
        again for up to ``timeout`` seconds while the rebalance goes on (the records fetched
        meanwhile are not read: nothing commits past them)."""
        if self._closed:
            return
        try:
            failures = self.stats.commit_failures
            self.commit()
            deadline = self.clock() + timeout
            while self.stats.commit_failures > failures and self.assigned and self.clock() < deadline:
                failures = self.stats.commit_failures
                self.consumer.consume(num_messages=self.batch, timeout=0.2)  # the rebalance's callbacks run
                self.commit()
            if self.on_snapshot is not None:
                self.on_snapshot(self.assembler.snapshot())
        finally:
            self._closed = True
            self.assigned.clear()  # the revocation close() triggers must not commit again
            self.consumer.close()

    def __enter__(self) -> KafkaReassembler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_resumable(checkpoints: Mapping[Hashable, Any], topics: Sequence[str]) -> None:
    """Refuse to resume from a snapshot that holds partitions of topics this loop does not read: the
    wrong snapshot file (or the wrong topics), whose state no assignment would ever match."""
    foreign = sorted(
        str(p) for p in checkpoints
        if not (isinstance(p, tuple) and len(p) == 2 and p[0] in topics and isinstance(p[1], int))
    )  # fmt: skip
    if foreign:
        raise SegmentationError(
            f"resume=True with a snapshot of partitions this loop does not read ({', '.join(foreign[:5])}"
            f"{', ...' if len(foreign) > 5 else ''}; topics {', '.join(topics)}): restore the snapshot of these topics,"
            " or start without resume",
            reason=Reason.STATE_ERROR,
            partitions=foreign[:20],
        )


__all__ = [
    "DEFAULT_EXPIRY_OFFSETS",
    "DEFAULT_EXPIRY_SECONDS",
    "CommitFailed",
    "KafkaEvent",
    "KafkaReassembler",
    "KafkaRecord",
    "KafkaSource",
    "KafkaStats",
    "LoopHooks",
    "Replay",
    "bootstrap_servers",
]
