"""Longest work first: pytest-xdist's ``loadgroup`` scheduling, handing out the longest known groups first.

pytest-xdist hands out a lane's work units (an ``xdist_group``, or a test without one) by their
number of tests, then in collection order. A lane whose longest unit is one test (a kill sweep of
90 s) then ends with that test alone on one worker while the other idles. Handed out longest first,
the units pack the workers evenly: the classic longest-processing-time rule, whose finish is within
a third of the best possible.

A unit's seconds are the sum of its tests' in ``tests/durations.json`` (a test's id to the seconds
of its setup, call and teardown, the tests of 1 s or more), which a run with
``REASSEMBLY_RECORD_DURATIONS=1`` updates with the tests it ran. A test it does not name counts as
0 s, and units of equal seconds keep xdist's order; a stale figure changes only the order, never
which tests run or that a group's tests run together on one worker.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadGroupScheduling

DURATIONS = Path(__file__).resolve().parents[1] / "durations.json"
RECORDED_FROM = 1.0  # seconds: shorter tests stay out of the file


def bare_id(nodeid: str) -> str:
    """A test's id without the ``@group`` pytest-xdist adds to it under ``--dist loadgroup``."""
    return nodeid.rsplit("@", 1)[0] if nodeid.rfind("@") > nodeid.rfind("]") else nodeid


def known_seconds() -> dict[str, float]:
    try:
        loaded = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in loaded.items()} if isinstance(loaded, dict) else {}


def longest(units: Mapping[str, Iterable[str]], seconds: Mapping[str, float]) -> str:
    """The unit whose tests' known seconds sum highest; of equals, the first (xdist's order)."""
    return max(units, key=lambda unit: sum(seconds.get(bare_id(nodeid), 0.0) for nodeid in units[unit]))


class LongestFirst(LoadGroupScheduling):
    """``--dist loadgroup``, its next unit the longest known one still waiting."""

    def __init__(self, config: pytest.Config, log: Any = None) -> None:
        super().__init__(config, log)
        self._seconds = known_seconds()

    def _assign_work_unit(self, node: Any) -> None:
        self.workqueue.move_to_end(longest(self.workqueue, self._seconds), last=False)
        super()._assign_work_unit(node)  # hands out the queue's first unit


class Recorder:
    """With ``REASSEMBLY_RECORD_DURATIONS=1``: each test's seconds in this run, merged into the file."""

    def __init__(self) -> None:
        self._seconds: defaultdict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._seconds[bare_id(report.nodeid)] += report.duration

    def pytest_sessionfinish(self) -> None:
        merged = {test: s for test, s in known_seconds().items() if test not in self._seconds}
        merged.update({test: round(s, 1) for test, s in self._seconds.items() if s >= RECORDED_FROM})
        DURATIONS.write_text(json.dumps(dict(sorted(merged.items())), indent=1) + "\n")
