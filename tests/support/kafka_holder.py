"""Holds one librdkafka mock cluster for tests: ``python -m tests.support.kafka_holder [BROKERS]``.

The mock cluster (a Kafka-protocol cluster on loopback, inside librdkafka) lives as long as the
client handle that created it, so this process creates one and keeps it until its stdin closes;
producers and consumers in other processes connect to the brokers it lists as to any cluster.
:mod:`tests.support.kafka_cluster` starts it and talks to it; nothing else should need to.

Why librdkafka's C API (``rd_kafka_mock_*``, through ctypes, from the librdkafka the confluent-kafka
wheel bundles) rather than ``Producer({"test.mock.num.brokers": N})``: the Python client can start
the mock but cannot configure it. The mock auto-creates a topic on first use with 4 partitions,
and ``AdminClient.create_topics`` does not work on it (it waits for a controller the mock does not
name, then reports ``_UNSUPPORTED_FEATURE``); ``rd_kafka_mock_topic_create`` creates a topic with
any partition count. The same API injects faults (produce errors, brokers down), which the Python
client has no call for.

Protocol, one line each way: on start the holder prints ``bootstrap HOST:PORT,...``; then for each
command line on stdin it answers ``ok`` or ``error TEXT``:

* ``topic NAME PARTITIONS``: create a topic (replication factor 1).
* ``produce-errors CODE COUNT``: the cluster answers the next COUNT produce requests with the Kafka
  error CODE (e.g. 29 TOPIC_AUTHORIZATION_FAILED, not retriable; 7 REQUEST_TIMED_OUT, retriable).
* ``clear-produce-errors``: forget the produce errors not yet used.
* ``request-errors API_KEY CODE COUNT``: the same for any request type (API_KEY 8: OffsetCommit, so
  that a test can have the group coordinator refuse commits as it does during a rebalance).
* ``clear-request-errors API_KEY``: forget those of that request type not yet used.
* ``down ID`` / ``up ID``: take broker ID (1..BROKERS) off the network or back.
* ``rebalance-delay MS``: the group coordinator's initial rebalance delay (the mock's default
  is 3000 ms before the first assignment of a new consumer group).
* ``share-session MS HEARTBEAT_MS``: the session timeout and heartbeat interval of the share groups
  created after it (the mock's defaults: 45,000 and 5,000 ms; the clients' own settings do not
  change them).

End of stdin (or ``quit``) destroys the cluster and exits 0.
"""

from __future__ import annotations

import ctypes
import sys

from bench.mockkafka import librdkafka, new_cluster

_PRODUCE_API_KEY = 0


def _librdkafka() -> ctypes.CDLL:
    """The bench holder's library (:func:`bench.mockkafka.librdkafka`) with the fault-injection calls typed."""
    lib = librdkafka("kafka_holder")
    vp, i32 = ctypes.c_void_p, ctypes.c_int32
    lib.rd_kafka_mock_push_request_errors_array.argtypes = [vp, ctypes.c_int16, ctypes.c_size_t, ctypes.c_void_p]
    lib.rd_kafka_mock_clear_request_errors.argtypes = [vp, ctypes.c_int16]
    lib.rd_kafka_mock_broker_set_down.argtypes = [vp, i32]
    lib.rd_kafka_mock_broker_set_up.argtypes = [vp, i32]
    for name in ("rd_kafka_mock_sharegroup_set_session_timeout", "rd_kafka_mock_sharegroup_set_heartbeat_interval"):
        getattr(lib, name).argtypes, getattr(lib, name).restype = [vp, ctypes.c_int], None
    lib.rd_kafka_err2name.restype = ctypes.c_char_p
    lib.rd_kafka_err2name.argtypes = [ctypes.c_int]
    return lib


def _answer(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _command(lib: ctypes.CDLL, cluster: int, words: list[str]) -> str:
    def status(err: int) -> str:
        return "ok" if err == 0 else f"error {lib.rd_kafka_err2name(err).decode()}"

    match words:
        case ["topic", name, partitions]:
            return status(lib.rd_kafka_mock_topic_create(cluster, name.encode(), int(partitions), 1))
        case ["produce-errors", code, count]:
            errors = (ctypes.c_int * int(count))(*([int(code)] * int(count)))
            lib.rd_kafka_mock_push_request_errors_array(cluster, _PRODUCE_API_KEY, int(count), errors)
            return "ok"
        case ["clear-produce-errors"]:
            lib.rd_kafka_mock_clear_request_errors(cluster, _PRODUCE_API_KEY)
            return "ok"
        case ["request-errors", api_key, code, count]:
            errors = (ctypes.c_int * int(count))(*([int(code)] * int(count)))
            lib.rd_kafka_mock_push_request_errors_array(cluster, int(api_key), int(count), errors)
            return "ok"
        case ["clear-request-errors", api_key]:
            lib.rd_kafka_mock_clear_request_errors(cluster, int(api_key))
            return "ok"
        case ["down", broker]:
            return status(lib.rd_kafka_mock_broker_set_down(cluster, int(broker)))
        case ["up", broker]:
            return status(lib.rd_kafka_mock_broker_set_up(cluster, int(broker)))
        case ["rebalance-delay", ms]:
            return status(lib.rd_kafka_mock_group_initial_rebalance_delay_ms(cluster, int(ms)))
        case ["share-session", ms, heartbeat_ms]:
            lib.rd_kafka_mock_sharegroup_set_session_timeout(cluster, int(ms))
            lib.rd_kafka_mock_sharegroup_set_heartbeat_interval(cluster, int(heartbeat_ms))
            return "ok"
    return f"error unknown command {' '.join(words)[:80]!r}"


def main(argv: list[str]) -> int:
    brokers = int(argv[0]) if argv else 3
    lib = _librdkafka()
    handle, cluster = new_cluster(lib, brokers, "kafka_holder")
    _answer("bootstrap " + lib.rd_kafka_mock_cluster_bootstraps(cluster).decode())
    for line in sys.stdin:
        words = line.split()
        if words == ["quit"]:
            break
        if words:
            try:
                _answer(_command(lib, cluster, words))
            except ValueError as exc:
                _answer(f"error {exc}")
    lib.rd_kafka_mock_cluster_destroy(cluster)
    lib.rd_kafka_destroy(handle)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
