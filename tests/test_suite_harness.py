"""The suite's own machinery: work handed out longest first (``tests/support/longest_first.py``), the
tests' JVM options with their class-data archive (``tests/support/jvm_options.py``), and CI's check
that its lanes run the README command's tests (``tests/support/lanes.py``)."""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _pytest.mark import MarkMatcher

from tests.support import jvm_options, longest_first
from tests.support.lanes import partition_errors, select
from tests.support.longest_first import Recorder, bare_id, longest


def test_the_longest_known_unit_goes_first_and_equals_keep_their_order() -> None:
    units = {
        "tests/a.py::t1": ["tests/a.py::t1"],
        "grp": ["tests/b.py::t1@grp", "tests/b.py::t2[x@y]@grp"],
        "tests/c.py::t[a@b]": ["tests/c.py::t[a@b]"],
    }
    assert longest(units, {"tests/b.py::t1": 2.0, "tests/b.py::t2[x@y]": 2.0, "tests/c.py::t[a@b]": 3.5}) == "grp"
    assert longest(units, {"tests/c.py::t[a@b]": 5.0, "tests/b.py::t1": 4.0}) == "tests/c.py::t[a@b]"
    assert longest(units, {}) == "tests/a.py::t1"  # nothing known: xdist's own order
    assert bare_id("tests/b.py::t2[x@y]@grp") == "tests/b.py::t2[x@y]"
    assert bare_id("tests/c.py::t[a@b]") == "tests/c.py::t[a@b]"  # an @ in a parameter is no group


def test_a_recording_run_updates_the_tests_it_ran_and_keeps_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    durations = tmp_path / "durations.json"
    durations.write_text(json.dumps({"tests/a.py::kept": 9.0, "tests/a.py::now_quick": 7.0, "tests/a.py::t": 1.5}))
    monkeypatch.setattr(longest_first, "DURATIONS", durations)
    recorder = Recorder()
    for nodeid, seconds in [("tests/a.py::t@grp", 2.0), ("tests/a.py::t@grp", 1.25), ("tests/a.py::now_quick", 0.2)]:
        recorder.pytest_runtest_logreport(_Report(nodeid, seconds))  # type: ignore[arg-type]
    recorder.pytest_sessionfinish()
    assert json.loads(durations.read_text()) == {"tests/a.py::kept": 9.0, "tests/a.py::t": 3.2}


class _Report:
    def __init__(self, nodeid: str, duration: float) -> None:
        self.nodeid, self.duration = nodeid, duration


@pytest.mark.parametrize("archive", ["missing", "garbage"])
def test_a_jvm_the_archive_does_not_fit_runs_without_it_and_without_a_word(tmp_path: Path, archive: str) -> None:
    path = tmp_path / "spark.jsa"
    if archive == "garbage":
        path.write_bytes(b"\x00not an archive" * 1000)
    options = shlex.split(jvm_options.with_archive(jvm_options.TEST_JVM_OPTIONS, path))
    done = subprocess.run([jvm_options._java(), *options, "-version"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and "warning" not in done.stderr.lower(), done.stderr


def test_the_session_s_jvm_runs_with_the_tests_options(spark: Any) -> None:
    """Each option of ``SPARK_SUBMIT_OPTS`` (the archive's too, when this run maps one) reaches the JVM."""
    bean = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    arguments = set(bean.getInputArguments())
    expected = shlex.split(os.environ.get("SPARK_SUBMIT_OPTS", ""))
    assert expected and set(expected) <= arguments, (expected, arguments)


def test_a_run_that_finds_the_archive_being_built_goes_on_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REASSEMBLY_TEST_JVM_CACHE", str(tmp_path))
    with open(tmp_path / "lock", "w") as building:  # another process building it
        fcntl.flock(building, fcntl.LOCK_EX)
        assert jvm_options.build(jvm_options.TEST_JVM_OPTIONS, wait=False) is None
        assert jvm_options.test_jvm_options(build_missing=True) == jvm_options.TEST_JVM_OPTIONS
    assert list(tmp_path.iterdir()) == [tmp_path / "lock"]  # nothing built, nothing half-written


def test_the_lanes_check_evaluates_m_as_pytest_does_and_names_a_test_lost_or_doubled() -> None:
    items = [
        ("t::spark", MarkMatcher.from_markers([pytest.mark.spark.mark])),
        ("t::slow_spark", MarkMatcher.from_markers([pytest.mark.slow.mark, pytest.mark.spark.mark])),
        ("t::plain", MarkMatcher.from_markers([])),
    ]
    assert select(items, "not slow") == ["t::spark", "t::plain"]
    assert select(items, "(not slow) and (spark or servers)") == ["t::spark"]
    whole = ["a", "b", "c"]
    assert partition_errors(whole, {"one": ["a"], "two": ["b", "c"]}, "w") == []
    assert partition_errors(whole, {"one": ["a"], "two": ["b"]}, "w") == ["w: run by none of one, two: c"]
    assert partition_errors(whole, {"one": ["a", "b"], "two": ["b", "c", "x"]}, "w") == [
        "w: run 2 times: b",
        "w: run, but not one of its tests: x",
    ]


def _lanes(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tests.support.lanes", *argv], capture_output=True, text=True)


def _collected(paths: str, expr: str) -> int:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *paths.split(), "--collect-only", "-q", "-p", "no:cacheprovider", "-m", expr],
        capture_output=True,
        text=True,
    )
    return sum("::" in line for line in done.stdout.splitlines())


def test_the_lanes_check_counts_what_pytest_m_collects() -> None:
    """On modules holding every kind (their Spark and servers' tests are marked by tests/conftest.py's
    hook, not in the file): its counts are real collections' counts (partition_errors is tested above)."""
    path, readme = "tests/brokers/test_drain.py tests/cli/test_interrupts.py", "not slow and not cluster and not sweep"
    quick, spark = f"({readme}) and (not spark and not servers)", f"({readme}) and (spark or servers)"
    done = _lanes(path, readme, quick, spark, "--rest", "not slow and (cluster or sweep)", "--all", "not slow")
    assert done.returncode == 0, done.stderr
    counts = [_collected(path, e) for e in (readme, spark)]
    assert done.stdout.startswith(f"{counts[0]} tests of the README command in 2 lanes ({counts[0] - counts[1]}, ")
    assert done.stdout.strip().endswith(f", {counts[1]}), 1 in CI's own") and 0 < counts[1] < counts[0], done.stdout
