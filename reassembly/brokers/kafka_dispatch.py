"""Kafka for the group dispatcher: whole messages out, commits that never pass an unsettled one.

:class:`KafkaDispatchSource` is the runners' :class:`~reassembly.runtime.Source` over the
consumer loop :class:`~reassembly.brokers.kafka.KafkaReassembler`. The loop reassembles; the
dispatcher (:class:`~reassembly.dispatcher.Dispatcher`) decides who handles what; this module only
connects their positions:

* **Commits.** Per partition the offset committed is ``min(the assembler's next offset, the
  dispatcher's floor)``: at or below the first segment of every message handed out and not
  settled, and of every message still in assembly. The loop commits nothing by itself (a batch's
  messages must reach the dispatcher before anything passes them): :meth:`commit` does, when the
  runner calls it. Beside each commit goes the settled-offsets record
  (:mod:`reassembly.dispatcher.offsets`): the ranges above it whose messages all settled, within
  ``metadata_limit`` bytes (Kafka keeps 4096 per partition by default); the largest sent is
  ``stats.metadata_bytes_max``.
* **Refused commits.** The group coordinator refuses a commit while the group rebalances (and one
  from a generation that ended): the partition keeps its last committed offset. Such a commit is
  not counted as made: :attr:`KafkaDispatchSource.on_commit` sees it a second time with
  ``refused`` set, and :meth:`commit_wanted` asks the runner to commit again at its next interval,
  with no message settled meanwhile. So does a fetch that read records: records read again after
  a rebalance that only repeat settled messages (duplicates, skipped ranges) move the safe
  position without any settlement, and a commit that waited for one would leave the partition
  behind what its messages' handlers did until the next message settles, or for good if none comes.
* **Assignment.** The offset the group committed, read when a partition is assigned, is the
  partition's floor for this assignment: the fetch starts there, whatever is below it was settled
  by whoever committed it, and no commit of this member goes below it, nor below a commit it made
  in the assignment. A partition revoked and later given back (an eager rebalance revokes every
  partition, then gives most of them back to the same members) starts from the group's committed
  offset again, with nothing kept from before: the dispatcher forgot its floors and settled ranges
  (:meth:`~reassembly.dispatcher.Dispatcher.revoke`), work of it still in flight is fenced, and
  the assembler forgot it delivered the messages not settled. Only partitions currently assigned
  are committed: Kafka checks a commit's generation, not that the member owns the partition.
* **Restart.** On assignment the committed record is read back (``consumer.committed`` returns it)
  and checked against the commit it sits beside and the partition's log end; a record that is
  malformed, written by another tool or for another commit is ignored (logged, counted in
  ``stats.metadata_ignored``), never trusted. The records in a trusted record's ranges are not
  given to the assembler (``stats.skipped``): their messages were settled.
* **Back-pressure.** :meth:`pause` pauses every assigned partition (librdkafka stops fetching and
  drops what it prefetched of them; :meth:`resume` fetches again from the next record to read), and
  partitions assigned while paused are paused at the next fetch. The consumer is still polled, so
  the group's heartbeats and rebalances go on.
* **Revocation.** When partitions leave, their commit is tried first, with every message of them
  still counted unsettled (nothing settles during the rebalance callback: the runner's control loop
  is inside :meth:`fetch`); then, in the same callback, their work is fenced
  (:meth:`Dispatcher.revoke`: queued messages dropped, a result arriving later commits nothing).
  Fencing there, not after the fetch, matters: the same fetch may be given the partitions back and
  offer their messages anew, which a later revoke would drop. Their messages are read again by the
  next owner: a duplicate rather than a loss.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from reassembly.assembler.core import Assembler, Limits
from reassembly.assembler.events import GroupComplete, MessageComplete
from reassembly.brokers.kafka import (
    DEFAULT_EXPIRY_OFFSETS,
    DEFAULT_EXPIRY_SECONDS,
    KafkaEvent,
    KafkaReassembler,
    LoopHooks,
)
from reassembly.brokers.kafka_config import TP
from reassembly.dispatcher import offsets
from reassembly.runtime.base import Offered

if TYPE_CHECKING:
    import reassembly.dispatcher
    from reassembly.dispatcher import Dispatcher, Work

log = logging.getLogger(__name__)

_BIG = 1 << 63
DEFAULT_METADATA_LIMIT = 4000
"""Bytes of commit metadata per partition: under Kafka's ``offset.metadata.max.bytes`` (4096 by
default), so a commit is never refused for its record."""


@dataclass(frozen=True)
class CommitNote:
    """One partition's commit, as :attr:`KafkaDispatchSource.on_commit` sees it before it is sent."""

    topic: str
    """The topic of the partition committed."""
    partition: int
    """The partition committed, in ``topic``."""
    offset: int
    """The offset committed: the next record the group reads there."""
    metadata_bytes: int
    """The settled-offsets record's length in bytes (0: none sent)."""
    ranges: int
    """How many settled ranges that record keeps (0: none)."""
    refused: str | None = None
    """Why the cluster refused this commit, in the client's words, when :attr:`KafkaDispatchSource.on_commit`
    sees it again after the refusal (nothing of it was committed); ``None`` before it is sent."""


@dataclass
class DispatchSourceStats:
    """What the source did beside the loop's own :class:`~reassembly.brokers.kafka.KafkaStats`."""

    commits: int = 0
    """Partitions' commits sent: a commit of several partitions counts each (refused ones too)."""
    metadata_bytes_max: int = 0
    """The length in bytes of the largest settled-offsets record sent."""
    ranges_dropped: int = 0
    """Settled ranges that did not fit in ``metadata_limit``: their messages come again after a restart."""
    metadata_loaded: int = 0
    """Settled-offsets records read back on assignment and trusted (their ranges are skipped)."""
    metadata_ignored: int = 0
    """Records read back on assignment and not trusted (malformed, foreign, stale, or no log end to
    check them against): logged, and their messages come again."""
    pauses: int = 0
    """Times :meth:`KafkaDispatchSource.pause` stopped fetching (the runner's budget was full)."""
    resumes: int = 0
    """Times :meth:`KafkaDispatchSource.resume` fetched again after a pause."""
    revoked: int = 0
    """Partitions revoked or lost, counted each time one leaves."""


def _identity(message: object) -> tuple[bytes, int]:
    """What the assembler knows a delivered message by: (GroupId, MsgSeqNumber); a Unit-of-Work
    group by its first message (forgetting it forgets the whole group)."""
    if isinstance(message, GroupComplete):
        return message.group_id, message.messages[0].msg_seq_number
    assert isinstance(message, MessageComplete)
    return message.group_id, message.msg_seq_number


def _merge(ranges: Sequence[tuple[int, int]], above: int) -> list[tuple[int, int]]:
    """``ranges`` clipped to offsets above ``above``, sorted, overlapping and adjacent ones joined:
    what :func:`offsets.encode` takes."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        lo = max(lo, above + 1)
        if hi < lo:
            continue
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


class KafkaDispatchSource:
    """A :class:`~reassembly.runtime.Source` of whole messages from Kafka topics.

    ``config``: librdkafka consumer settings (``bootstrap.servers``, ``group.id``, ...). Each
    message is offered with its Kafka record key (that of the record that completed it; our producer
    keys every segment of a message alike) for :attr:`~reassembly.dispatcher.Ordering.KEY`.
    ``on_commit`` sees every partition's commit before it is sent (an audit log), and once more,
    with ``refused`` set, when the cluster refused it. ``batch``: records
    read per fetch; ``budget_bytes`` (the runner's byte budget) makes a fetch read no more records
    than fit in what is left of it. Without an ``assembler``, one like the loop's own is made,
    delivering each message of an MQ group as it completes (``unit_of_work=True``: the whole group
    as one ``GroupComplete``), so that the dispatcher hands a group's messages out one at a time,
    in order.

    ``topics``: the topics read. ``on_event``: every event that is not a whole message
    (:data:`~reassembly.brokers.kafka.KafkaEvent`: duplicates, rejections, unfinished groups,
    refused commits; ``None``: logged), like :class:`~reassembly.brokers.KafkaReassembler`'s.
    ``metadata_limit``: the most bytes of settled-offsets record sent per partition (under Kafka's
    ``offset.metadata.max.bytes``, 4096 by default, or the commit is refused); settled ranges
    beyond it are dropped (``stats.ranges_dropped``). ``clock``: seconds, for the default
    assembler's expiry and the loop's (:class:`~reassembly.brokers.KafkaReassembler`'s ``clock``).
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        topics: Sequence[str],
        *,
        assembler: Assembler | None = None,
        on_event: Callable[[KafkaEvent], None] | None = None,
        on_commit: Callable[[CommitNote], None] | None = None,
        metadata_limit: int = DEFAULT_METADATA_LIMIT,
        batch: int = 100,
        budget_bytes: int | None = None,
        unit_of_work: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.on_commit = on_commit
        self.batch = batch
        self.budget_bytes = budget_bytes
        self.metadata_limit = metadata_limit
        self.clock = clock
        self.stats = DispatchSourceStats()
        self._dispatcher: Dispatcher | None = None
        self._paused = False
        self._owed = False  # records read or a commit refused since the last commit: commit_wanted()
        self._base: dict[TP, int] = {}  # the group's committed offset when the partition was assigned
        self._sent: dict[TP, CommitNote] = {}  # the last commit sent per partition (for a refusal's note)
        self._revoked: list[Hashable] = []
        self._skip: dict[TP, list[tuple[int, int]]] = {}  # trusted settled ranges read back, per partition
        # messages offered and not settled, per partition of their segments: what a revocation makes
        # the assembler forget, so that they are delivered again if the partition comes back here
        self._unsettled: dict[TP, set[tuple[bytes, int]]] = {}
        self._parts_of: dict[tuple[bytes, int], set[Hashable]] = {}
        if assembler is None:
            limits = Limits(expiry_offsets=DEFAULT_EXPIRY_OFFSETS, expiry_seconds=DEFAULT_EXPIRY_SECONDS)
            assembler = Assembler(limits, clock=clock, unit_of_work=unit_of_work)
        hooks = LoopHooks(
            plan=self._plan,
            before_commit=self._before_commit,
            revoking=self._revoking,
            assigned=self._assigned,
            skip=self._skipped,
            commit_in_poll=False,
            refused=self._refused,
        )
        self.loop = KafkaReassembler(config, topics, assembler=assembler, on_event=on_event, batch=batch,
                                     clock=clock, hooks=hooks)  # fmt: skip

    def bind(self, dispatcher: Dispatcher) -> None:
        """The dispatcher whose floors the commits respect and whose work a revocation fences (the
        runner's ``dispatcher``). Bound before the first fetch, a revocation fences its partitions
        inside the rebalance callback; unbound, they are reported by :meth:`revoked` for the runner."""
        self._dispatcher = dispatcher

    # ------------------------------------------------------------------ Source
    def fetch(self, timeout: float) -> list[Offered]:
        """One batch of the loop: the messages it completed, each with its record key. ``timeout``:
        the longest wait for a first record, in seconds."""
        if self._paused:
            self._pause_all()  # partitions assigned since the pause
        self.loop.batch = self._batch_size()
        stats = self.loop.stats
        read = stats.records + stats.skipped
        out: list[Offered] = []
        for m in self.loop.one_batch(timeout):
            out.append(Offered(m, key=self.loop.key))
            key = _identity(m)
            parts = {o.partition for o in m.positions}
            self._parts_of[key] = parts
            for tp in parts:
                self._unsettled.setdefault(tp, set()).add(key)  # type: ignore[arg-type]
        if stats.records + stats.skipped != read:
            self._owed = True
        return out

    def _batch_size(self) -> int:
        """Records to read at once: ``batch``, or with ``budget_bytes`` no more than the room left
        in it holds of the largest records seen (at least one), so that one fetch cannot carry the
        held bytes far past the budget before the runner pauses: by one record at most. Until a
        record has been seen its size is unknown: one record (a first fetch of ``batch`` records
        that were all waiting would carry the held bytes up to ``batch`` records past the budget)."""
        d = self._dispatcher
        if self.budget_bytes is None or d is None:
            return self.batch
        if not self.loop.largest_record:
            return 1
        room = self.budget_bytes - d.held_bytes() - self.held_bytes()
        return max(1, min(self.batch, room // self.loop.largest_record))

    def settled(self, work: Work, outcome: reassembly.dispatcher.Outcome) -> None:
        """A settled message lifts the dispatcher's floor (the next :meth:`commit` moves past it);
        here it is only no longer one to hand out again after a revocation.

        ``work``: the message settled. ``outcome``: how (DONE or DEAD: either lets the commit pass it).
        """
        key = _identity(work.message)
        for tp in self._parts_of.pop(key, ()):
            keys = self._unsettled.get(tp)  # type: ignore[call-overload]
            if keys is not None:
                keys.discard(key)

    def commit(self, dispatcher: Dispatcher, force: bool = False) -> None:
        """Commit every assigned partition's safe offset that moved, with its settled-offsets record
        (the runner decides when: every so many settlements or seconds, and when it stops).

        ``dispatcher``: the runner's dispatcher, which knows what is settled (bound as by
        :meth:`bind`). ``force``: True for the runner's last commit, as it stops (committed like any
        other).
        """
        self._dispatcher = dispatcher
        self._owed = False  # a refusal sets it again
        self.loop.commit()

    def commit_wanted(self) -> bool:
        """Whether a :meth:`commit` may move an offset though no message settled since the last one:
        records were read since (duplicates and skipped ranges settle without a message; so do the
        records read again after a partition came back), or a commit was refused (during a
        rebalance, say) and must be made again. The runner then commits at its next interval."""
        return self._owed

    def pause(self) -> None:
        if not self._paused:
            self._paused = True
            self.stats.pauses += 1
            self._pause_all()
            log.info("fetching paused: the budget is full")

    def resume(self) -> None:
        if self._paused:
            self._paused = False
            self.stats.resumes += 1
            ck = self.loop._ck
            self.loop.consumer.resume([ck.TopicPartition(t, p) for t, p in sorted(self.loop.assigned)])
            log.info("fetching resumed")

    @property
    def paused(self) -> bool:
        return self._paused

    def held_bytes(self) -> int:
        return self.loop.assembler.buffered_bytes

    def commit_lag(self) -> dict[str, int]:
        """Per assigned partition (``topic[partition]``), the records between the committed offset
        and the log end the client last heard of (the metrics' commit lag)."""
        ck, lag = self.loop._ck, {}
        for t, p in sorted(self.loop.assigned):
            committed = self.loop._committed.get((t, p))
            if committed is None:
                continue
            try:
                _, high = self.loop.consumer.get_watermark_offsets(ck.TopicPartition(t, p), cached=True)
            except ck.KafkaException:
                continue
            if high is not None and high >= 0:
                lag[f"{t}[{p}]"] = max(0, high - committed)
        return lag

    def revoked(self) -> list[Hashable]:
        gone, self._revoked = self._revoked, []
        for tp in gone:
            if tp not in self.loop.assigned:
                self._skip.pop(tp, None)  # type: ignore[call-overload]
        return gone

    def close(self) -> None:
        """Commit what is safe (with the dispatcher's floors) and leave the group."""
        self.loop.close()

    # ------------------------------------------------------------------ hooks of the loop
    def _pause_all(self) -> None:
        if self.loop.assigned:
            ck = self.loop._ck
            self.loop.consumer.pause([ck.TopicPartition(t, p) for t, p in sorted(self.loop.assigned)])

    def _plan(self, tp: TP, assembler_next: int | None) -> tuple[int | None, str | None]:
        d = self._dispatcher
        off = assembler_next if d is None else d.commit_offset(tp, assembler_next)
        if off is None:
            return None, None
        loaded = self._skip.get(tp)
        for lo, hi in loaded or ():
            if lo <= off <= hi:  # settled before (its records skipped, never read here): commit past them
                off = hi + 1
        done = self.loop._committed.get(tp)
        if done is not None and off < done:  # what was committed in this assignment stays passed
            off = done
        base = self._base.get(tp)
        if base is not None and off < base:  # the group's commit read at assignment: settled before
            off = base
        ranges = list(d.settled_above(tp, off)) if d is not None else []
        if loaded:
            loaded[:] = [r for r in loaded if r[1] > off]  # passed by the commit: no longer needed
            ranges += loaded
        ranges = _merge(ranges, off)
        if not ranges:
            return off, None
        text, kept = offsets.encode(off, ranges, self.metadata_limit)
        self.stats.ranges_dropped += len(ranges) - kept
        return off, (text or None)

    def _before_commit(self, entries: list[tuple[str, int, int, str | None]]) -> None:
        for topic, part, off, meta in entries:
            note = CommitNote(topic, part, off, len(meta or ""), 0)
            if meta:
                got, _ = offsets.decode(meta, off, None)
                note = CommitNote(topic, part, off, len(meta), len(got))
            self._sent[(topic, part)] = note
            self.stats.commits += 1
            self.stats.metadata_bytes_max = max(self.stats.metadata_bytes_max, note.metadata_bytes)
            log.debug("commit %s[%d] at %d (%d bytes of settled ranges, %d ranges)", topic, part, off,
                      note.metadata_bytes, note.ranges)  # fmt: skip
            if self.on_commit is not None:
                self.on_commit(note)

    def _refused(self, refused: list[tuple[str, int, int]], error: str) -> None:
        self._owed = True  # the loop reports it too (a CommitFailed event, logged by default)
        if self.on_commit is not None:
            for topic, part, off in refused:
                sent = self._sent.get((topic, part))
                note = sent if sent is not None and sent.offset == off else CommitNote(topic, part, off, 0, 0)
                self.on_commit(replace(note, refused=error))

    def _revoking(self, partitions: list[TP], commits: bool) -> None:
        # Nothing settles while this runs (the runner's control loop is inside fetch): the commit is
        # planned with every message of these partitions still counted unsettled, then their work is
        # fenced at once, so no result arriving later and no queued message handed out later counts.
        # The commit may be refused (the coordinator of librdkafka's mock cluster refuses every
        # commit while the group is joining): then the next owner reads from the commit before it,
        # a duplicate rather than a loss. Nothing of the partition is kept for a later assignment.
        self.stats.revoked += len(partitions)
        if commits:
            self.loop.commit(set(partitions))
        self._forget(partitions)
        for tp in partitions:
            self._base.pop(tp, None)
        d = self._dispatcher
        if d is None:  # not bound yet: the runner fences them after this fetch
            self._revoked.extend(partitions)
            return
        for tp in partitions:
            d.revoke(tp)
            self._skip.pop(tp, None)

    def _forget(self, partitions: list[TP]) -> None:
        """The messages of revoked partitions not settled yet are dropped or fenced by the
        dispatcher: the assembler forgets it delivered them, so if the partition comes back to
        this consumer (the same rebalance often gives it back) their segments, read again from the
        commit, make them anew instead of counting as duplicates of a delivery that never settled."""
        asm = self.loop.assembler
        for tp in partitions:
            for key in self._unsettled.pop(tp, set()):
                asm.forget(*key)
                for other in self._parts_of.pop(key, ()):
                    keys = self._unsettled.get(other)  # type: ignore[call-overload]
                    if keys is not None:
                        keys.discard(key)

    def _assigned(self, partitions: list[TP]) -> None:
        """Read the group's committed offsets of the partitions just assigned: each is the floor of
        this assignment's commits (and what a commit must move past to be sent), and the
        settled-offsets record beside it is read back."""
        consumer, ck = self.loop.consumer, self.loop._ck
        for key in partitions:
            self._base.pop(key, None)
        try:
            got = consumer.committed([ck.TopicPartition(t, p) for t, p in partitions], timeout=30)
        except ck.KafkaException as exc:  # no record: the messages above the commit come again
            log.warning("Kafka: the committed offsets' records could not be read: %s", exc)
            return
        for tp in got:
            key = (tp.topic, tp.partition)
            self._skip.pop(key, None)
            if tp.offset >= 0 and tp.error is None:
                self._base[key] = tp.offset
                self.loop._committed[key] = tp.offset
            if tp.offset < 0 or not tp.metadata:
                continue
            try:
                _, end = consumer.get_watermark_offsets(ck.TopicPartition(tp.topic, tp.partition), timeout=10)
            except ck.KafkaException as exc:
                log.warning("%s[%d]: no log end to check its settled-offsets record against (%s): ignored",
                            tp.topic, tp.partition, exc)  # fmt: skip
                self.stats.metadata_ignored += 1
                continue
            ranges, why = offsets.decode(tp.metadata, tp.offset, end)
            if why is not None:
                log.warning("%s[%d]: the commit's metadata is ignored: %s", tp.topic, tp.partition, why)
                self.stats.metadata_ignored += 1
                continue
            self.stats.metadata_loaded += 1
            if ranges:
                self._skip[key] = ranges
                log.info("%s[%d]: %d settled ranges above the commit %d are skipped", tp.topic, tp.partition,
                         len(ranges), tp.offset)  # fmt: skip

    def _skipped(self, tp: TP, offset: int) -> bool:
        ranges = self._skip.get(tp)
        if not ranges:
            return False
        i = bisect.bisect_right(ranges, (offset, _BIG)) - 1
        return i >= 0 and ranges[i][0] <= offset <= ranges[i][1]


__all__ = ["DEFAULT_METADATA_LIMIT", "CommitNote", "DispatchSourceStats", "KafkaDispatchSource"]
