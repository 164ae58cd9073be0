"""A Kafka cluster for tests: librdkafka's mock cluster, held by a child process, and client processes.

Nothing to install beyond confluent-kafka (the ``kafka`` extra): the mock is a Kafka-protocol
cluster on 127.0.0.1 inside librdkafka (produce, fetch, consumer groups, commits, rebalances).
It lives as long as the client that created it, so a holder process (:mod:`tests.support.kafka_holder`,
run with ``sys.executable``) creates it, prints its bootstrap list and keeps it until its stdin
closes; producers and consumers in this process or in others connect to that list.

Use in a test module::

    from tests.support.kafka_cluster import MockCluster, kafka_cluster_fixture  # noqa: F401

    def test_x(kafka_cluster: MockCluster) -> None:
        topic = kafka_cluster.create_topic("t-x", partitions=3)
        Producer({"bootstrap.servers": kafka_cluster.bootstrap, ...})

* ``kafka_cluster`` (module scope: one mock cluster per test module, 3 brokers): ``.bootstrap``
  (``"127.0.0.1:PORT,..."``), ``.create_topic(name, partitions=3)`` (returns the name; each test
  takes its own topic: the cluster is shared by the module), ``.fail_produce(code, count)``
  (the next ``count`` produce requests answered with Kafka error ``code``; ``.clear_produce_errors()``
  forgets those not used yet), ``.fail_requests(api_key, code, count)`` (the same for any request
  type: 8 is OffsetCommit; ``.clear_request_errors(api_key)``), ``.broker_down(id)`` /
  ``.broker_up(id)``, ``.stop()``. Stopped after the module: stdin closed, then terminate and
  kill if it lingers, always waited for; the holder also dies with the test process
  (``PR_SET_PDEATHSIG``). For a cluster of your own: ``with mock_cluster(brokers=1) as c: ...``.
* The consumer group coordinator starts a new group's first rebalance at once here
  (``rebalance_delay_ms=0``; the mock's own default waits 3 s), so a test's first assignment is fast.
* A share group's members time out after 6 s without a heartbeat, and heartbeat every second
  (``share_session_ms=(6000, 1000)``; the mock's own defaults are 45 s and 5 s, and a client's
  ``session.timeout.ms`` does not change them): the records a SIGKILLed member held are delivered
  to another member about 6 s after the kill, and a new member's assignment settles within a
  second or two. Six missed heartbeats in a row (librdkafka sends them from its own threads, not
  from the application's polls) are far beyond what a loaded test machine delays.
* **Each partition of the mock keeps only its newest 5 MiB** (and 100,000 batches): librdkafka's
  mock drops the oldest batches past that (hard-coded in ``rd_kafka_mock_partition_init``, no API
  changes it), like a retention of 5 MiB, and the partition's low watermark moves up. A test that
  sends more than 5 MiB to one partition must consume while it produces, or spread the bytes over
  partitions (``partition=`` on the producer pins one); a record read late is simply gone
  (``OFFSET_OUT_OF_RANGE`` / a start offset above 0).
* Topics are auto-created on first use too (4 partitions, the mock's default); create them
  explicitly for a known partition count. ``AdminClient.create_topics`` does not work on the mock,
  nor does ``describe_configs`` (a topic's ``max.message.bytes`` cannot be read from it).
* Client processes: ``kafka_clients`` (function scope) yields a :class:`ClientProcesses`:
  ``kafka_clients.start([script, arg, ...], name="c1")`` runs ``sys.executable script arg ...``
  (or ``["-m", "module", ...]``, ``["-c", code]``) in the repository with it importable, stdout
  and stderr to files in a temp dir, dying with the test process; ``.kill()`` is SIGKILL (and
  waits), ``.terminate()`` SIGTERM, ``.wait(timeout)``, ``.output()`` / ``.errors()`` the text
  written so far. Whatever is still running at the end of the test is killed and waited for.
  ``client_env()`` is the environment those processes get, for a ``subprocess`` call of your own.
* A consumer SIGKILLed keeps its partitions until its ``session.timeout.ms`` passes (45 s by
  default): give test consumers ``session.timeout.ms=2000, heartbeat.interval.ms=300`` and a
  killed consumer's partitions reach the survivor about 3 s after the kill.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import pytest

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT = 30.0


def available() -> str | None:
    """Why no mock cluster can be started here, or None."""
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        return "confluent-kafka is not installed (pip install -e '.[kafka]')"
    return None


def client_env() -> dict[str, str]:
    """The environment for test client processes: this repository importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    return env


def _die_with_parent() -> None:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _stop(proc: subprocess.Popen[bytes] | subprocess.Popen[str], grace: float = 10.0) -> None:
    """Terminate, kill if it lingers, and always reap."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
    proc.wait()


# A share group's session timeout and heartbeat interval, in ms (the module's docstring says why).
SHARE = (6000, 1000)


class MockCluster:
    """One running mock cluster: ``bootstrap`` and the holder's commands (see :mod:`tests.support.kafka_holder`)."""

    def __init__(
        self, brokers: int = 3, *, rebalance_delay_ms: int | None = 0, share_session_ms: tuple[int, int] | None = SHARE
    ) -> None:
        self.brokers = brokers
        self._dir = Path(tempfile.mkdtemp(prefix="kafka-mock-"))
        self.log = self._dir / "holder.log"
        with self.log.open("wb") as err:
            self.proc: subprocess.Popen[str] = subprocess.Popen(
                [sys.executable, "-m", "tests.support.kafka_holder", str(brokers)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                cwd=REPO,
                env=client_env(),
                preexec_fn=_die_with_parent,
            )
        try:
            first = self._line()
            if not first.startswith("bootstrap "):
                raise RuntimeError(f"kafka holder said {first!r}")
            self.bootstrap: str = first.split(" ", 1)[1]
            if rebalance_delay_ms is not None:
                self._ask(f"rebalance-delay {rebalance_delay_ms}")
            if share_session_ms is not None:
                self._ask("share-session {} {}".format(*share_session_ms))
        except BaseException:
            self.stop()
            raise

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # the holder answers at once; EOF if it died
        if not line:
            self.proc.wait(5)
            raise RuntimeError(
                f"kafka holder exited with {self.proc.returncode}: {self.log.read_text(errors='replace')[-2000:]}"
            )
        return line.strip()

    def _ask(self, command: str) -> None:
        stdin: IO[str] | None = self.proc.stdin
        assert stdin is not None
        stdin.write(command + "\n")
        stdin.flush()
        answer = self._line()
        if answer != "ok":
            raise RuntimeError(f"kafka holder: {command!r}: {answer}")

    def create_topic(self, name: str, partitions: int = 3) -> str:
        """Create ``name`` with ``partitions`` partitions (replication factor 1); return the name."""
        self._ask(f"topic {name} {partitions}")
        return name

    def fail_produce(self, code: int, count: int = 1) -> None:
        """Answer the next ``count`` produce requests (any client, any topic) with Kafka error ``code``."""
        self._ask(f"produce-errors {code} {count}")

    def clear_produce_errors(self) -> None:
        """Forget the produce errors :meth:`fail_produce` queued that were not used yet."""
        self._ask("clear-produce-errors")

    def fail_requests(self, api_key: int, code: int, count: int = 1) -> None:
        """Answer the next ``count`` requests of type ``api_key`` (any client) with Kafka error ``code``:
        ``fail_requests(8, 27, n)`` has the coordinator refuse ``n`` commits (OffsetCommit) with
        REBALANCE_IN_PROGRESS, as it does while a group rebalances."""
        self._ask(f"request-errors {api_key} {code} {count}")

    def clear_request_errors(self, api_key: int) -> None:
        """Forget the errors :meth:`fail_requests` queued for ``api_key`` that were not used yet."""
        self._ask(f"clear-request-errors {api_key}")

    def broker_down(self, broker_id: int) -> None:
        """Take broker ``broker_id`` (1..brokers) off the network: its connections close, new ones fail."""
        self._ask(f"down {broker_id}")

    def broker_up(self, broker_id: int) -> None:
        self._ask(f"up {broker_id}")

    def stop(self) -> None:
        """Close the holder's stdin (it destroys the cluster and exits), terminate it if it does not."""
        if self.proc.poll() is None and self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        _stop(self.proc)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        shutil.rmtree(self._dir, ignore_errors=True)


@contextmanager
def mock_cluster(
    brokers: int = 3, *, rebalance_delay_ms: int | None = 0, share_session_ms: tuple[int, int] | None = SHARE
) -> Iterator[MockCluster]:
    """A mock cluster for the ``with`` block, stopped (and its holder reaped) after it."""
    cluster = MockCluster(brokers, rebalance_delay_ms=rebalance_delay_ms, share_session_ms=share_session_ms)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module", name="kafka_cluster")
def kafka_cluster_fixture() -> Iterator[MockCluster]:
    """One 3-broker mock cluster per test module (import this fixture into the module)."""
    reason = available()
    if reason is not None:
        pytest.skip(reason)
    with mock_cluster(3) as cluster:
        yield cluster


class ClientProcess:
    """A client (producer, consumer) in a process of its own: ``sys.executable`` with ``argv``."""

    def __init__(self, argv: Sequence[str], name: str, directory: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.stdout_path = directory / f"{name}.out"
        self.stderr_path = directory / f"{name}.err"
        with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
            self.proc: subprocess.Popen[bytes] = subprocess.Popen(
                [sys.executable, *argv],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=REPO,
                env={**client_env(), **(env or {})},
                preexec_fn=_die_with_parent,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def kill(self) -> int:
        """SIGKILL (no cleanup, no flush, no commit in the client) and reap; the exit code (-9)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        return self.proc.wait()

    def terminate(self, grace: float = 10.0) -> int:
        """SIGTERM, SIGKILL after ``grace`` seconds, reap; the exit code."""
        _stop(self.proc, grace)
        return self.proc.returncode

    def wait(self, timeout: float | None = None) -> int:
        """The exit code; ``subprocess.TimeoutExpired`` if still running after ``timeout``."""
        return self.proc.wait(timeout)

    def output(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def errors(self) -> str:
        return self.stderr_path.read_text(errors="replace")


class ClientProcesses:
    """Starts :class:`ClientProcess` es and kills whatever is left when closed."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.started: list[ClientProcess] = []

    def start(
        self, argv: Sequence[str], *, name: str | None = None, env: dict[str, str] | None = None
    ) -> ClientProcess:
        client = ClientProcess(argv, name or f"client{len(self.started)}", self.directory, env)
        self.started.append(client)
        return client

    def close(self) -> None:
        for client in self.started:
            client.kill()


@pytest.fixture(name="kafka_clients")
def kafka_clients_fixture(tmp_path: Path) -> Iterator[ClientProcesses]:
    """Client processes for one test, logs under ``tmp_path/clients``; all killed and reaped after it."""
    directory = tmp_path / "clients"
    directory.mkdir()
    clients = ClientProcesses(directory)
    try:
        yield clients
    finally:
        clients.close()
