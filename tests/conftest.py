"""Shared fixtures: one Spark session per test run, hypothesis profiles."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.register_profile("dev", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local Spark session shared by every test that asks for it."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from reassembly.spark.session import get_session

    session = get_session("local[2]", app_name="segmenter-tests")
    yield session
    session.stop()


# CI installs every server the tests need (PostgreSQL, ActiveMQ, Java), so there a skipped test
# means a broken set-up, not a missing optional tool: `.ci/run` sets REQUIRE_NO_SKIPS=1 and a
# run with any skip fails. On a developer's machine a missing server still only skips.
_skipped: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _skipped.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get("REQUIRE_NO_SKIPS") and _skipped and exitstatus == 0:
        sys.stderr.write(f"\nREQUIRE_NO_SKIPS: {len(_skipped)} test(s) skipped: {', '.join(_skipped[:20])}\n")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
