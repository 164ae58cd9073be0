"""Judging held messages and groups: the rule's verdicts turned into events.

Every message is judged by one rule (:func:`reassembly.assembler.rules.decide`); what a verdict
means for its group (deliver it, fail it, fail the whole Unit-of-Work group, reject the copies that
lost) is decided here, apart from the intake of :mod:`reassembly.assembler.core`, which only holds
segments and asks for a judgement when a complete candidate may exist (or, in batch mode, at
the end of input). What a verdict lets go of leaves through :mod:`reassembly.assembler.leaving`.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter

from reassembly.assembler import rules
from reassembly.assembler._state import GroupInput, GroupState
from reassembly.assembler.bodies import MessageKey
from reassembly.assembler.build import Built, build
from reassembly.assembler.events import (
    Event,
    GroupComplete,
    GroupFailed,
    MessageComplete,
    MessageFailed,
)
from reassembly.assembler.leaving import _Leaving
from reassembly.assembler.model import Facts, Group, Message, Piece, fingerprint
from segmenter.coverage import Arbitration, Outcome
from segmenter.errors import SegmentationError
from segmenter.flags import Codec, in_group, is_last_in_group

Verdict = Arbitration[Piece, Facts, Built]
_origin = attrgetter("origin")


class _Judging(_Leaving):
    """The assembler's judging steps (the assembler sets up the options they read)."""

    batch: bool
    unit_of_work: bool
    join: bool

    def _decide(self, msg: Message) -> Verdict:
        return rules.decide(msg, self._verify(msg.key, msg.stored))

    def _verify(
        self, key: MessageKey, stored: bool
    ) -> Callable[[tuple[Piece, ...], Facts], Built]:
        """What checks a candidate and builds its payload (raising the first check that fails)."""
        bodies = self.bodies if stored else None
        limit, digest, join = self.limits.max_message_size, self.limits.digest, self.join
        return lambda chain, facts: build(key, facts, chain, limit, bodies, digest, join)

    def _progress(self, group: Group, msg: Message, events: list[Event]) -> None:
        """Streaming: judge as soon as a complete candidate exists (Unit-of-Work: for every message)."""
        if self.batch or group.state != GroupState.OPEN or not msg.search or not msg.ready or not msg.worth_searching:
            return
        if not group.grouped or not self.unit_of_work:
            verdict = self._decide(msg)
            if verdict.outcome != Outcome.INCOMPLETE:
                self._conclude(group, [(msg, verdict)], events)
        elif group.last_seq is not None and len(group.messages) == group.last_seq:
            members = [group.messages[s] for s in range(1, group.last_seq + 1)]
            if all(m.ready and rules.has_candidate(m) for m in members):
                judged = [(m, self._decide(m)) for m in members]
                if all(v.outcome != Outcome.INCOMPLETE for _, v in judged):
                    self._conclude(group, judged, events)

    def _judge_batch(self, group: Group, events: list[Event]) -> None:
        """Batch: judge every message, then the group's rules over the winners in MsgSeqNumber order."""
        verdicts = [(m, self._decide(m)) for _, m in sorted(group.messages.items())]
        grouped: bool | None = None
        admitted: list[int] = []
        last: int | None = None
        for m, v in verdicts:
            if v.outcome != Outcome.COMPLETE:
                continue
            flags = v.winner[-1].header.msg_flags
            if grouped is None:
                grouped = in_group(flags)
            err = rules.group_refusal(grouped, last, admitted, m.seq, flags)
            if err is not None:
                for p in sorted(m.pieces(), key=Piece.key):
                    self._reject(events, p, err)
                self._release(group, [m], delivered=False)
                del group.messages[m.seq]
                continue
            admitted.append(m.seq)
            if is_last_in_group(flags):
                last = m.seq
        if grouped is None:  # no winner to ask: grouped if any segment says so
            grouped = any(in_group(p.header.msg_flags) for m in group.messages.values() for p in m.pieces())
        for m, v in verdicts:  # messages without a winner answer to the winners' group rules too
            if v.outcome != Outcome.COMPLETE and m.seq in group.messages:
                self._refuse_unwon(group, m, grouped, last, admitted, events)
        group.grouped = grouped
        group.last_seq = last
        judged = [(m, v) for m, v in verdicts if m.seq in group.messages and v.outcome != Outcome.INCOMPLETE]
        # Length first: a forged last number (up to 999 999 999) must never size a list.
        whole = last == len(judged) and all(m.seq == n for n, (m, _) in enumerate(judged, 1))
        if not group.grouped or not self.unit_of_work or whole:
            self._conclude(group, judged, events)

    def _refuse_unwon(
        self, group: Group, m: Message, grouped: bool, last: int | None, admitted: list[int], events: list[Event]
    ) -> None:
        """Batch: a message without a winner (incomplete, failed, in conflict) whose every segment
        the group refuses by its own flags and number (one past the last message, a group flag
        the group does not have) is rejected segment by segment; kept, it would leave unreported
        with the group once the group's admitted messages conclude it. A message the group admits
        in part stays whole: its outcome reports all of its segments."""
        refusals = [(p, rules.group_refusal(grouped, last, admitted, m.seq, p.header.msg_flags)) for p in m.pieces()]
        if not refusals or any(err is None for _, err in refusals):
            return
        for p, err in sorted(refusals, key=lambda pe: Piece.key(pe[0])):
            assert err is not None
            self._reject(events, p, err)
        self._release(group, [m], delivered=False)
        del group.messages[m.seq]

    def _conclude(self, group: Group, judged: list[tuple[Message, Verdict]], events: list[Event]) -> None:
        """Events for judged messages: deliver, fail, or fail the whole Unit-of-Work group."""
        if not judged:
            return
        if group.grouped and not self.unit_of_work:
            for m, v in judged:
                if group.state != GroupState.OPEN:
                    return
                result = self._result(group, m, v, events)
                try:
                    self._release(group, [m], isinstance(result, MessageComplete))
                except SegmentationError:  # the store could not put it in place: not delivered, still held
                    for key in [k for k in group.fingerprints if k[0] == m.seq]:
                        del group.fingerprints[key]
                    raise
                group.delivered.add(m.seq)
                del group.messages[m.seq]
                if isinstance(result, MessageFailed):
                    raws, kept = group.originals()
                    events.append(
                        GroupFailed(
                            group.group_id, result.reason, (result,), raws, group.positions(), kept, group.last_seq
                        )
                    )
                    self._terminate(group, GroupInput.FAIL)  # after the raws: it discards stored bodies
                    return
                events.append(result)
                if group.last_seq is not None and len(group.delivered) == group.last_seq:
                    self._terminate(group, GroupInput.COMPLETE)
            return
        failed = [(m, v) for m, v in judged if v.outcome != Outcome.COMPLETE]
        if failed:
            results = [self._failure(m, v) for m, v in failed]
            bad = {m.seq for m, _ in failed}
            others = [m.originals() for m, _ in judged if m.seq not in bad]
            raws, kept = tuple(r for o in others for r in o[0]), tuple(k for o in others for k in o[1])
            at = [m.split_positions() for m, _ in judged if m.seq not in bad]
            where = tuple(o for a in at for o in a[0]) + tuple(o for a in at for o in a[1])  # parallel to raws, kept
            self._release(group, [m for m, _ in judged], delivered=False)
            if group.grouped:
                events.append(
                    GroupFailed(group.group_id, results[0].reason, tuple(results), raws, where, kept, group.last_seq)
                )
            else:
                events.append(results[0])
            self._terminate(group, GroupInput.FAIL)
            return
        completes = [self._result(group, m, v, events) for m, v in judged]
        self._release(group, [m for m, _ in judged], delivered=True)
        if group.grouped:
            events.append(GroupComplete(group.group_id, tuple(c for c in completes if isinstance(c, MessageComplete))))
        else:
            events.append(completes[0])
        self._terminate(group, rules.OUTCOME_INPUT[Outcome.COMPLETE])

    def _failure(self, m: Message, v: Verdict) -> MessageFailed:
        assert v.error is not None
        raws, kept = m.originals()
        stored, original = m.declared()
        return MessageFailed(m.group_id, m.seq, v.error.reason, v.error, raws, m.positions(), kept, stored, original)

    def _result(self, group: Group, m: Message, v: Verdict, events: list[Event]) -> MessageComplete | MessageFailed:
        """A complete message (its losing copies reported first), or its failure."""
        if v.outcome != Outcome.COMPLETE:
            return self._failure(m, v)
        assert v.payload is not None
        facts = v.facts
        assert facts is not None
        if sum(map(len, m.at.values())) > len(v.winner):  # copies or misfits held besides the winner
            used = {id(p) for p in v.winner}
            losers = sorted((p for p in m.pieces() if id(p) not in used), key=Piece.key)
            for p in losers:
                self._reject(events, p, rules.misfit(p, facts, v.winner))
        group.fingerprints.update(((m.seq, p.offset), fingerprint(p.header)) for p in v.winner)
        m.decoded = m.stored and facts.codec != Codec.NONE
        return self._complete(m.group_id, m.seq, facts, v.winner, v.payload, m.duplicates)

    @staticmethod
    def _complete(
        group_id: bytes,
        seq: int,
        facts: Facts,
        winner: tuple[Piece, ...],
        payload: Built,
        duplicates: int,
    ) -> MessageComplete:
        assert facts.stored_length is not None
        return MessageComplete(
            group_id=group_id,
            msg_seq_number=seq,
            payload=payload,
            msg_flags=winner[-1].header.msg_flags,
            segments=len(winner),
            duplicates=duplicates,
            stored_length=facts.stored_length,
            original_length=facts.original_length,
            checksum=facts.message_checksum,
            positions=tuple(filter(None, map(_origin, winner))),  # an Origin is a non-empty tuple
        )
