"""The suite's own machinery: work handed out longest first (``tests/support/longest_first.py``) and
the tests' JVM options with their class-data archive (``tests/support/jvm_options.py``)."""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support import jvm_options, longest_first
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
