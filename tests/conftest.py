"""Shared fixtures: one Spark session per test process, hypothesis profiles; the markers and xdist groups
that split the suite into lanes (tests/README.md)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from tests.support.jvm_options import TEST_JVM_OPTIONS, test_jvm_options

settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.register_profile("dev", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The tests' JVMs: C1 only, one GC thread, no UI, and Spark's classes mapped from an archive
# (tests/support/jvm_options.py says why). Set SPARK_SUBMIT_OPTS to run the tests with other options
# (an empty value: the JVM's defaults).
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
    _map_the_jvm_archive(config)
    if config.pluginmanager.hasplugin("xdist") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_LongestFirstHook(), "longest-first")
        if os.environ.get("REASSEMBLY_RECORD_DURATIONS") == "1":
            from tests.support.longest_first import Recorder

            config.pluginmanager.register(Recorder(), "record-durations")


class _LongestFirstHook:
    """``--dist loadgroup`` handing out the longest known work first (tests/support/longest_first.py)."""

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        if config.getvalue("dist") != "loadgroup":
            return None
        from tests.support.longest_first import LongestFirst

        return LongestFirst(config, log)


def _map_the_jvm_archive(config: pytest.Config) -> None:
    """The tests' JVM options with the class-data archive's, built first by a run with workers (whose
    JVMs it spares more than its build costs); a worker inherits its controller's options."""
    if os.environ.get("SPARK_SUBMIT_OPTS") != TEST_JVM_OPTIONS or hasattr(config, "workerinput"):
        return  # options of the user's, or a worker
    build_missing = bool(config.getoption("numprocesses", None)) and not config.option.collectonly
    os.environ["SPARK_SUBMIT_OPTS"] = test_jvm_options(build_missing=build_missing)


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
