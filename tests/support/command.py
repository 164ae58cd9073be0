"""The ``reassemble`` command as the tests run it, with its exit code, stdout and stderr.

Two ways, one result (a :class:`subprocess.CompletedProcess`):

- in this process (the default): ``reassembly.cli.main.main(argv)`` with stdout and stderr captured,
  on the test run's shared Spark session (the one ``tests/conftest.py``'s ``spark`` fixture holds).
  For what the command parses, refuses, writes and reports. A JVM start costs seconds; the
  command's own code runs in milliseconds.
- a real process (``process=True``: ``python -m reassembly``), where the process is what is tested:
  signals and Ctrl-C, the JVM it launches and what that JVM prints, ``--master`` and launch-time
  ``--conf`` settings, spark-submit, the wheel, the kill points of the incremental commit
  (``REASSEMBLY_INCREMENTAL_KILL_AT`` ends the process), and a Spark job that fails while it writes
  (the command then stops its session, the shared one here).

An in-process run leaves the test process as it found it: file descriptor 1, the signal handlers, the
root logger, the working directory, the environment, the session's runtime settings and log level,
and the ``INTERRUPTED`` flag are put back. A run that stopped the shared session is an error naming the fix
(``process=True``), not a silent loss of the session for every later test.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

# The session every in-process run shares with the ``spark`` fixture: the same builder call, so
# whichever asks first starts it and the other gets it (getOrCreate).
SESSION_MASTER = "local[2]"
SESSION_APP = "segmenter-tests"
# The subcommands that open a Spark session; the others (collect, drain, receive, claimcheck) start no JVM.
SPARK_COMMANDS = frozenset({"run", "demo", "refmsg", "stream"})


def shared_session() -> Any:
    """The test run's Spark session (started on first use; ``tests/conftest.py`` stops it at the end)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from reassembly.spark.engine.session import get_session

    return get_session(SESSION_MASTER, app_name=SESSION_APP)


def reassemble(
    *args: str,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: int = 900,
    process: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run ``reassemble ARGS`` to its end (``env`` over this process's environment, ``cwd`` as the
    working directory): in this process, or as a real one with ``process=True`` (``timeout`` applies
    to that only)."""
    if process:
        return subprocess.run(
            [sys.executable, "-m", "reassembly", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd,
            env={**os.environ, **(env or {})},
            check=False,
        )
    return _in_process(list(args), env or {}, cwd)


def _in_process(argv: list[str], env: dict[str, str], cwd: Path | None) -> subprocess.CompletedProcess[str]:
    from reassembly._processes import INTERRUPTED
    from reassembly.cli.main import main

    spark = shared_session() if argv[:1] and argv[0] in SPARK_COMMANDS else None
    err = io.StringIO()
    with _restored(spark, env, cwd), _stdout() as (out, read), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse: --help, --version, a usage error
            code = _exit_code(exc)
        except Exception:  # what a process shows with --verbose: the traceback, exit code 1
            traceback.print_exc()
            code = 1
        finally:
            INTERRUPTED.clear()
            out.flush()
        text = read()
    if spark is not None and spark.sparkContext._jsc is None:
        raise AssertionError(f"reassemble {' '.join(argv)} stopped the shared Spark session: run it with process=True")
    return subprocess.CompletedProcess(["reassemble", *argv], code, text, err.getvalue())


@contextlib.contextmanager
def _stdout() -> Iterator[tuple[TextIO, Callable[[], str]]]:
    """The command's stdout at the file-descriptor level, as a process's would be: ``stream`` writes its
    status lines to a duplicate of descriptor 1 and points 1 at /dev/null for Spark's children.
    ``sys.stdout`` writes to the same file, line by line, so the lines keep their order."""
    with tempfile.TemporaryFile() as captured:
        saved = os.dup(1)
        os.dup2(captured.fileno(), 1)
        out = open(os.dup(1), "w", buffering=1, encoding="utf-8")  # noqa: SIM115 - closed below

        def read() -> str:
            out.flush()
            captured.seek(0)
            return captured.read().decode("utf-8", errors="replace")

        try:
            with contextlib.redirect_stdout(out):
                yield out, read
        finally:
            out.close()
            os.dup2(saved, 1)
            os.close(saved)


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


@contextlib.contextmanager
def _restored(spark: Any | None, env: dict[str, str], cwd: Path | None) -> Iterator[None]:
    """Put back what ``main`` changes in its process: signal handlers, logging, working directory,
    environment, the session's runtime settings and log level."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    root = logging.getLogger()
    log_state = (list(root.handlers), root.level, logging.getLogger("py4j").level)
    saved_env = dict(os.environ)
    saved_cwd = os.getcwd()
    settings = {} if spark is None else dict(spark.conf.getAll)
    os.environ.update(env)
    if cwd is not None:
        os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        root.handlers[:], root.level = log_state[0], log_state[1]
        logging.getLogger("py4j").setLevel(log_state[2])
        if spark is not None and spark.sparkContext._jsc is not None:
            _put_back(spark, settings)


def _put_back(spark: Any, settings: dict[str, str]) -> None:
    """The session's runtime settings as they were (a run's ``--partitions`` and ``--conf`` included)."""
    now = dict(spark.conf.getAll)
    for key in now.keys() - settings.keys():
        with contextlib.suppress(Exception):
            spark.conf.unset(key)
    for key, value in settings.items():
        if now.get(key) != value:
            with contextlib.suppress(Exception):  # a static setting: the run could not change it either
                spark.conf.set(key, value)
    spark.sparkContext.setLogLevel("ERROR")
