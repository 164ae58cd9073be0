"""The retry and budget decisions: numbers in, the same answer every time."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reassembly.dispatcher import Budget, RetryPolicy
from segmenter import SegmentationError
from segmenter.errors import Reason


def test_backoff_doubles_up_to_the_cap_and_the_last_attempt_is_dead() -> None:
    policy = RetryPolicy(max_attempts=5, base=0.5, cap=3.0, jitter=0.0)
    assert [policy.decide(a, 100.0, 0.3) for a in range(1, 6)] == [100.5, 101.0, 102.0, 103.0, None]
    assert RetryPolicy(max_attempts=1).decide(1, 0.0, 0.0) is None  # one attempt: no retry at all


def test_jitter_shortens_the_delay_by_up_to_its_share() -> None:
    policy = RetryPolicy(base=4.0, cap=60.0, jitter=0.5)
    assert policy.decide(1, 0.0, 0.0) == 4.0
    assert policy.decide(1, 0.0, 0.5) == 3.0
    assert policy.decide(1, 0.0, 0.999999) == pytest.approx(2.0, abs=1e-5)


@given(st.integers(1, 10_000), st.floats(0, 1, exclude_max=True), st.floats(0, 1e9))
def test_a_retry_is_never_before_now_nor_past_the_cap(attempt: int, rnd: float, now: float) -> None:
    policy = RetryPolicy(max_attempts=10_001, base=0.25, cap=30.0, jitter=0.5)
    at = policy.decide(attempt, now, rnd)
    assert at is not None and now <= at <= now + 30.0


@pytest.mark.parametrize(
    "kwargs", [{"max_attempts": 0}, {"base": -1.0}, {"cap": -1.0}, {"jitter": 1.5}, {"jitter": -0.1}]
)
def test_impossible_policies_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(SegmentationError) as caught:
        RetryPolicy(**kwargs)  # type: ignore[arg-type]
    assert caught.value.reason is Reason.ARGUMENT_ERROR


def test_the_budget_pauses_at_either_limit_and_resumes_under_both_low_marks() -> None:
    budget = Budget(max_messages=100, max_bytes=1000, low_water=0.5)
    assert budget.update(10, 100) is None and not budget.paused
    assert budget.update(100, 0) is True and budget.paused  # the message limit reached
    assert budget.update(100, 0) is None  # on the same side: nothing to do
    assert budget.update(60, 100) is None  # between the marks: stays paused
    assert budget.update(49, 600) is None  # the bytes still over their low mark
    assert budget.update(49, 499) is False and not budget.paused
    assert budget.update(60, 900) is None  # between the marks: stays running
    assert budget.update(1, 1000) is True  # the byte limit reached
    assert "paused" in repr(budget)


def test_with_no_message_held_the_budget_never_pauses_and_a_pause_ends() -> None:
    """Bytes with no message held are segments still in assembly: only fetching completes them."""
    budget = Budget(max_messages=100, max_bytes=1000, low_water=0.5)
    assert budget.update(0, 5000) is None and not budget.paused
    assert budget.update(1, 5000) is True
    assert budget.update(1, 4000) is None  # one message still to settle: the pause holds
    assert budget.update(0, 4000) is False and not budget.paused  # settled: nothing else can end it


@given(st.lists(st.tuples(st.integers(0, 200), st.integers(0, 2000)), max_size=50))
def test_the_budget_alternates_and_always_answers_its_state(steps: list[tuple[int, int]]) -> None:
    budget = Budget(max_messages=100, max_bytes=1000, low_water=0.3)
    answers = []
    for messages, bytes_ in steps:
        was = budget.paused
        answer = budget.update(messages, bytes_)
        if answer is not None:
            answers.append(answer)
            assert answer == budget.paused != was
        over = messages > 0 and (messages >= 100 or bytes_ >= 1000)
        under = messages == 0 or (messages < 30 and bytes_ < 300)
        assert budget.paused == (over or (was and not under))
    assert all(a != b for a, b in pairwise(answers))  # pause, resume, pause...


def test_impossible_budgets_are_refused() -> None:
    for args in ((0, 10, 0.5), (10, 0, 0.5), (10, 10, 0.0), (10, 10, 1.5)):
        with pytest.raises(SegmentationError):
            Budget(*args)
