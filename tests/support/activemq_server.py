"""A throwaway ActiveMQ Classic broker (Debian's ``activemq`` package) as a child process.

Started on 127.0.0.1 with random free ports (port 0; the real ports are read from the log),
in a temp dir, with the two AMQP jars vendored in ``third_party/activemq-amqp`` copied into
its ``lib/`` (Debian's build ships no AMQP transport). The JVM is the Popen child (no ``su``
wrapper: ``java -jar activemq.jar`` directly) and gets SIGTERM if the test process dies
(``PR_SET_PDEATHSIG``), so no broker outlives its test; SIGTERM stops it cleanly (exit 143).
The package puts the broker under ``/usr/share/activemq`` (``bin/activemq.jar``, the launcher
run here with ``start`` and an ``xbean:file:`` configuration); ``.ci/run`` installs it and a
JVM. What the two jars are, and how to rebuild them: ``third_party/activemq-amqp/README.md``.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.lanes import refuse_server

REPO = Path(__file__).resolve().parents[2]
JARS = REPO / "third_party" / "activemq-amqp"
HOME = Path("/usr/share/activemq")

_CONFIG = """<beans xmlns="http://www.springframework.org/schema/beans"
  xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
  xsi:schemaLocation="http://www.springframework.org/schema/beans http://www.springframework.org/schema/beans/spring-beans.xsd
    http://activemq.apache.org/schema/core http://activemq.apache.org/schema/core/activemq-core.xsd">
  <bean class="org.springframework.beans.factory.config.PropertyPlaceholderConfigurer"/>
  <broker xmlns="http://activemq.apache.org/schema/core" brokerName="test" useJmx="false"
          persistent="{persistent}" dataDirectory="${{activemq.data}}" schedulerSupport="false">
    <plugins><statisticsBrokerPlugin/></plugins>
    {store}
    <transportConnectors>
      <transportConnector name="amqp" uri="amqp://127.0.0.1:0{amqp_limit}"/>
      <transportConnector name="stomp" uri="stomp://127.0.0.1:0{limit}"/>
    </transportConnectors>
  </broker>
</beans>
"""

_LOG4J = """log4j.rootLogger=INFO, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=%d{HH:mm:ss,SSS} %-5p %m%n
log4j.logger.org.springframework=WARN
log4j.logger.org.apache.xbean=WARN
"""

_LISTENING = re.compile(r"Listening for connections at: (\w+)://[^:]+:(\d+)")
_CONNECTORS = {"amqp", "stomp"}


def available() -> bool:
    """Whether the Debian package and a JVM are installed (``.ci/run`` installs them)."""
    return (HOME / "bin" / "activemq.jar").exists() and shutil.which("java") is not None


def _die_with_parent() -> None:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class ActiveMQ:
    """One running broker; ``amqp_url`` / ``stomp_url`` point at its loopback connectors."""

    def __init__(
        self, base: Path, *, max_frame_size: int | None = None, amqp_frame_size: int | None = None, heap: str = "512m"
    ) -> None:
        self.base = base
        self.log = base / "broker.log"
        for d in ("conf", "lib", "data", "tmp"):
            (base / d).mkdir(parents=True, exist_ok=True)
        for jar in JARS.glob("*.jar"):
            shutil.copy(jar, base / "lib" / jar.name)
        # maxFrameSize: the largest message a connector accepts (both protocols). maxAmqpFrameSize:
        # the AMQP transfer frame size the broker offers (128 KiB by default); a message larger
        # than it travels as several frames, each one more pass through the client's event loop.
        opts = [f"wireFormat.maxFrameSize={max_frame_size}"] if max_frame_size else []
        amqp = opts + ([f"wireFormat.maxAmqpFrameSize={amqp_frame_size}"] if amqp_frame_size else [])
        (base / "conf" / "activemq.xml").write_text(
            _CONFIG.format(
                persistent="false",
                store="",
                limit="?" + "&amp;".join(opts) if opts else "",
                amqp_limit="?" + "&amp;".join(amqp) if amqp else "",
            )
        )
        (base / "conf" / "log4j.properties").write_text(_LOG4J)
        cmd = [
            "java", "-Xms64m", f"-Xmx{heap}",
            f"-Dactivemq.home={HOME}", f"-Dactivemq.base={base}", f"-Dactivemq.conf={base}/conf",
            f"-Dactivemq.data={base}/data", f"-Djava.io.tmpdir={base}/tmp",
            "-jar", str(HOME / "bin" / "activemq.jar"), "start", f"xbean:file:{base}/conf/activemq.xml",
        ]  # fmt: skip
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        self.ports = self._wait_started()

    def _wait_started(self, timeout: float = 60.0) -> dict[str, int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log.read_text(errors="replace")
            ports = {scheme: int(port) for scheme, port in _LISTENING.findall(text)}
            if ports.keys() >= _CONNECTORS and " started" in text and "Apache ActiveMQ" in text:
                return ports  # every connector listening (one can log "started" before another listens)
            if self.proc.poll() is not None:
                raise RuntimeError(f"ActiveMQ exited with {self.proc.returncode}:\n{text[-3000:]}")
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"ActiveMQ did not start within {timeout} s")

    @property
    def amqp_url(self) -> str:
        return f"amqp://127.0.0.1:{self.ports['amqp']}"

    @property
    def stomp_url(self) -> str:
        return f"stomp://127.0.0.1:{self.ports['stomp']}"

    def url(self, scheme: str) -> str:
        return self.amqp_url if scheme == "amqp" else self.stomp_url

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # clean shutdown, exit 143
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextmanager
def activemq(**kwargs: object) -> Iterator[ActiveMQ]:
    """A broker in a fresh temp dir, stopped and removed afterwards."""
    refuse_server("ActiveMQ")
    base = Path(tempfile.mkdtemp(prefix="activemq-"))
    broker = None
    try:
        broker = ActiveMQ(base, **kwargs)  # type: ignore[arg-type]
        yield broker
    finally:
        if broker is not None:
            broker.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module", name="broker")
def broker_fixture() -> Iterator[ActiveMQ]:
    """One broker per test module."""
    with activemq() as b:
        yield b


def free_env() -> dict[str, str]:
    """The environment for consumer processes: this repo importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    return env
