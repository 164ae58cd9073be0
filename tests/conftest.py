"""Shared fixtures: one Spark session per test process, hypothesis profiles; the markers and xdist groups
that split the suite into lanes (tests/README.md)."""

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

# The JVMs the tests launch through spark-submit (the shared sessions, the command's processes,
# spark-submit itself) compile with C1 only, collect with one thread and start no UI: the suite's
# jobs are small and short, where C2's compiler threads cost more CPU than they save. Measured with
# `/usr/bin/time reassemble demo --no-progress`: 29 s of CPU with the JVM's defaults, 15 s with
# these. What a job computes does not depend on them; users' JVMs keep Spark's defaults.
# Set SPARK_SUBMIT_OPTS to run the tests with other options (an empty value: the JVM's defaults).
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Dspark.ui.enabled=false"
os.environ.setdefault("SPARK_SUBMIT_OPTS", TEST_JVM_OPTIONS)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local Spark session shared by every test that asks for it, and by the command's in-process
    runs (tests/support/command.py)."""
    from tests.support.command import shared_session

    session = shared_session()
    yield session
    session.stop()


# Fixtures that start a server as a separate process: a test using one is marked `servers`.
SERVER_FIXTURES = frozenset({"pg_url", "kafka_cluster", "kafka_clients", "s3_endpoint", "broker", "limited"})


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks (--dist loadgroup)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests that start servers; group the tests of one xdist worker's kind.

    Under ``-n 2 --dist loadgroup`` a test without a group goes to whichever worker is free. A test
    that needs Spark, a server or a cluster is grouped by its module: the module's fixtures (a landing
    table, a server, a drained topic) are built once, on one worker. The cluster tests and those of
    the built wheel are one group: the session's cluster and wheel are built once, and two standalone
    clusters at once would fight for the machine's two cores.
    """
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if SERVER_FIXTURES & fixtures:
            item.add_marker(pytest.mark.servers)
        if "spark" in fixtures and not item.get_closest_marker("spark"):
            item.add_marker(pytest.mark.spark)
        if item.get_closest_marker("xdist_group"):
            continue
        if item.get_closest_marker("cluster") or {"cluster", "wheel"} & fixtures:
            item.add_marker(pytest.mark.xdist_group("cluster"))
        elif any(item.get_closest_marker(m) for m in ("spark", "servers", "sweep")):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


class _GroupsKept:
    """Refuse to run, under ``--dist loadgroup``, tests whose group pytest-xdist did not keep.

    pytest-xdist sends a group to one worker by adding ``@group`` to the test's id on the worker; a
    pytest whose ids ignore that (9.2: pytest-dev/pytest-xdist#1386) spreads every group over the
    workers without a word: module fixtures built twice, two standalone clusters at once.
    """

    @pytest.hookimpl(trylast=True)  # after pytest-xdist has added each test's group to its id
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        _check_groups_kept(config, items)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_GroupsKept(), "groups-kept")


def _check_groups_kept(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not (getattr(config.option, "loadgroup", False) and hasattr(config, "workerinput")):
        return  # only a worker under --dist loadgroup adds groups to ids
    lost = [item.nodeid for item in items if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
    if lost:
        raise pytest.UsageError(
            f"pytest-xdist did not keep the xdist_group of {len(lost)} test(s) ({lost[0]}): this pytest's node"
            " ids ignore it (pytest-dev/pytest-xdist#1386); install the dev extra's pytest (<9.2)"
        )


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
