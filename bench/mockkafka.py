"""A librdkafka mock cluster for the benches, held by a process of its own (as a real cluster is).

``python -m bench.mockkafka BROKERS`` creates the cluster through librdkafka's C API (the
librdkafka the confluent-kafka wheel bundles, through ctypes: the Python client can start a mock
but cannot create a topic with a chosen partition count on it), prints ``bootstrap HOST:PORT,...``
and then answers ``ok`` to each ``topic NAME PARTITIONS`` line on stdin; end of stdin destroys it.
The group coordinator's first-rebalance delay is set to 0 (the mock's default waits 3 s).

The minimal holder: the tests' (tests/support/kafka_holder.py) loads librdkafka and creates its
cluster with :func:`librdkafka` and :func:`new_cluster` and adds fault injection, so that the
benches import nothing from ``tests``. Each partition of the mock keeps only its newest 5 MiB:
spread a data set over enough partitions.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

RD_KAFKA_PRODUCER = 0


def librdkafka(who: str) -> ctypes.CDLL:
    """The librdkafka bundled in the confluent-kafka wheel (the one its ``Producer`` uses), else the
    system's, with the mock-cluster calls typed; ``who`` names the caller in its errors."""
    spec = importlib.util.find_spec("confluent_kafka")
    candidates: list[str] = []
    if spec is not None and spec.origin is not None:
        site = os.path.dirname(os.path.dirname(spec.origin))
        candidates = sorted(glob.glob(os.path.join(site, "confluent_kafka.libs", "librdkafka*.so*")))
    if not candidates and (found := ctypes.util.find_library("rdkafka")) is not None:
        candidates = [found]
    if not candidates:
        raise SystemExit(f"{who}: no librdkafka (pip install confluent-kafka)")
    lib = ctypes.CDLL(candidates[0])
    vp, cp = ctypes.c_void_p, ctypes.c_char_p
    lib.rd_kafka_conf_new.restype = vp
    lib.rd_kafka_conf_set.argtypes = [vp, cp, cp, cp, ctypes.c_size_t]
    lib.rd_kafka_new.restype = vp
    lib.rd_kafka_new.argtypes = [ctypes.c_int, vp, cp, ctypes.c_size_t]
    lib.rd_kafka_destroy.argtypes = [vp]
    lib.rd_kafka_mock_cluster_new.restype = vp
    lib.rd_kafka_mock_cluster_new.argtypes = [vp, ctypes.c_int]
    lib.rd_kafka_mock_cluster_destroy.argtypes = [vp]
    lib.rd_kafka_mock_cluster_bootstraps.restype = cp
    lib.rd_kafka_mock_cluster_bootstraps.argtypes = [vp]
    lib.rd_kafka_mock_topic_create.argtypes = [vp, cp, ctypes.c_int, ctypes.c_int]
    lib.rd_kafka_mock_group_initial_rebalance_delay_ms.argtypes = [vp, ctypes.c_int32]
    return lib


def new_cluster(lib: ctypes.CDLL, brokers: int, who: str) -> tuple[int, int]:
    """A client handle and the mock cluster of ``brokers`` brokers it holds (the cluster lives as long
    as the handle); ``who`` names the caller in its errors."""
    errstr = ctypes.create_string_buffer(512)
    conf = lib.rd_kafka_conf_new()
    lib.rd_kafka_conf_set(conf, b"log_level", b"4", errstr, len(errstr))
    handle = lib.rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, len(errstr))
    if not handle:
        raise SystemExit(f"{who}: rd_kafka_new: {errstr.value.decode()}")
    cluster = lib.rd_kafka_mock_cluster_new(handle, brokers)
    if not cluster:
        raise SystemExit(f"{who}: rd_kafka_mock_cluster_new failed")
    return handle, cluster


def hold(brokers: int) -> int:
    lib = librdkafka("bench.mockkafka")
    handle, cluster = new_cluster(lib, brokers, "bench.mockkafka")
    lib.rd_kafka_mock_group_initial_rebalance_delay_ms(cluster, 0)
    print("bootstrap " + lib.rd_kafka_mock_cluster_bootstraps(cluster).decode(), flush=True)
    for line in sys.stdin:
        match line.split():
            case ["topic", name, partitions]:
                err = lib.rd_kafka_mock_topic_create(cluster, name.encode(), int(partitions), 1)
                print("ok" if err == 0 else f"error {err}", flush=True)
            case _:
                print("error unknown command", flush=True)
    lib.rd_kafka_mock_cluster_destroy(cluster)
    lib.rd_kafka_destroy(handle)
    return 0


class MockCluster:
    """The holder process: ``bootstrap``, :meth:`topic`, :meth:`stop`, :meth:`cpu_seconds`."""

    def __init__(self, brokers: int = 1) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.mockkafka", str(brokers)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=Path(__file__).resolve().parent.parent,
        )
        first = self._line()
        if not first.startswith("bootstrap "):
            self.stop()
            raise RuntimeError(f"mock cluster holder said {first!r}")
        self.bootstrap = first.split(" ", 1)[1]

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"mock cluster holder exited with {self.proc.wait(5)}")
        return line.strip()

    def topic(self, name: str, partitions: int) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"topic {name} {partitions}\n")
        self.proc.stdin.flush()
        if (answer := self._line()) != "ok":
            raise RuntimeError(f"topic {name}: {answer}")
        return name

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> MockCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":
    raise SystemExit(hold(int(sys.argv[1]) if len(sys.argv) > 1 else 1))
