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

    # No web UI: nobody looks at it, and its listener and port search cost every job and session.
    # Two shuffle partitions, one per core, instead of the library's 8: the tests' jobs are a few
    # kilobytes, where each further task is only overhead; what a job computes does not depend on
    # the number (tests/spark/test_differential.py runs on it). Measured with a per-test CPU count
    # over `pytest -p no:xdist tests/spark/test_lineage.py tests/spark/test_save.py
    # tests/spark/test_output_schema.py tests/spark/test_paths.py tests/spark/test_e2e.py`: about 10 %
    # less CPU.
    conf = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"}
    return get_session(SESSION_MASTER, app_name=SESSION_APP, conf=conf)


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
    local_fs, jvm_cwd = None, None
    if cwd is not None:
        os.chdir(cwd)
        if spark is not None:  # the JVM's relative paths too: Hadoop's local file system has its own
            local_fs = spark._jvm.org.apache.hadoop.fs.FileSystem.getLocal(spark._jsc.hadoopConfiguration())
            jvm_cwd = local_fs.getWorkingDirectory()
            local_fs.setWorkingDirectory(spark._jvm.org.apache.hadoop.fs.Path(str(Path(cwd).resolve())))
    try:
        yield
    finally:
        if local_fs is not None and spark.sparkContext._jsc is not None:
            local_fs.setWorkingDirectory(jvm_cwd)
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


# The shim a shell finds first on its PATH as ``reassemble``: it hands its arguments, working directory
# and environment to the test process (``shell``) over a Unix socket and replays the answer.
_SHIM = """\
import json, os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(os.environ["REASSEMBLE_IN_TEST"])
s.sendall(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ)}).encode())
s.shutdown(socket.SHUT_WR)
answer = json.loads(b"".join(iter(lambda: s.recv(65536), b"")))
sys.stdout.write(answer["stdout"]); sys.stdout.flush()
sys.stderr.write(answer["stderr"]); sys.stderr.flush()
sys.exit(answer["code"])
"""


def shell(code: str, cwd: Path, env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """Run ``code`` with ``bash -e`` in ``cwd``, each ``reassemble`` it calls run in this process.

    A shim named ``reassemble`` first on the shell's PATH sends its arguments, working directory and
    environment here over a Unix socket; this process runs them with :func:`reassemble` (the shared
    session, no JVM start) and sends back the exit code and output, which the shim replays. The loop
    waits on the socket and the shell's end (``selectors``), never on a clock: the shell waits for
    the answer, so the command runs exactly where the script calls it."""
    import json
    import selectors
    import socket

    with tempfile.TemporaryDirectory(prefix="shell-") as d:
        bin_dir = Path(d) / "bin"
        bin_dir.mkdir()
        shim = bin_dir / "reassemble"
        shim.write_text(f"#!{sys.executable}\n{_SHIM}")
        shim.chmod(0o755)
        address = str(Path(d) / "s")
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(address)
        server.listen()
        shell_env = {**env, "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", "REASSEMBLE_IN_TEST": address}
        out_file, err_file = Path(d) / "out", Path(d) / "err"
        with server, out_file.open("w") as out, err_file.open("w") as err, selectors.DefaultSelector() as sel:
            proc = subprocess.Popen(["bash", "-e", "-c", code], cwd=cwd, env=shell_env, stdout=out, stderr=err)
            ended = os.pidfd_open(proc.pid)  # readable once the shell has exited
            sel.register(server, selectors.EVENT_READ)
            sel.register(ended, selectors.EVENT_READ)
            try:
                while proc.poll() is None:
                    ready = sel.select(timeout=timeout)
                    if not ready:
                        raise subprocess.TimeoutExpired(code, timeout)
                    if any(key.fileobj is server for key, _ in ready):
                        conn, _addr = server.accept()
                        with conn:
                            ask = json.loads(_read_all(conn))
                            ran = reassemble(*ask["argv"], env=ask["env"], cwd=Path(ask["cwd"]))
                            answer = {"code": ran.returncode, "stdout": ran.stdout, "stderr": ran.stderr}
                            conn.sendall(json.dumps(answer).encode())
            finally:
                os.close(ended)
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        return subprocess.CompletedProcess(["bash", "-e", "-c", code], proc.returncode, out_file.read_text(),
                                           err_file.read_text())  # fmt: skip


def _read_all(conn: Any) -> bytes:
    chunks = []
    while chunk := conn.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)
