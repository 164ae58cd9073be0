"""A reassembling Kafka consumer in a process of its own, writing an idempotent sink, for the tests.

``python tests/support/kafka_consumer_proc.py BOOTSTRAP TOPIC GROUP SINK LOG [options]`` runs a
:class:`reassembly.brokers.kafka.KafkaReassembler` until SIGTERM (then closes: commits and leaves
the group). Every message handed out is written to SINK as a file named ``<GroupId hex>-<MsgSeqNumber>``
(temporary file, fsync, rename, directory fsync: atomic; a name already there is left as is, its
bytes compared): a sink keyed by the message id, so a message handed out again after a crash is
written once.

LOG gets one line per fact, appended with one ``write`` each (a SIGKILL loses no line written):
``sink TIME GID SEQ`` once a message's file is in place (``again`` instead of ``sink`` when it was
already there), ``commit TIME TOPIC PARTITION OFFSET`` just *before* each commit is sent (a commit
is never made without its line), ``event TIME NAME`` for every other event, ``start``/``stop``.

Options: ``--kill-after-messages N`` SIGKILLs the process once N messages were handed out (before
writing the Nth with ``--kill-before-sink``, after it otherwise: the gap between the sink and the
commit); ``--kill-after-records R`` SIGKILLs it once R records were read (wherever the loop is);
``--session-ms`` (2000), ``--expiry-offsets``, ``--commit-every`` (50 records), ``--poll-timeout``
(0.2 s: the wait of one batch), and ``--idle-exit S`` (stop and close after S seconds without a
record, counted while it holds every partition of the topic, from the last change of its assignment).

``--snapshot FILE`` hands the loop an ``on_snapshot`` that writes each snapshot to FILE atomically
(temporary file, fsync, rename); with ``--resume`` the assembler is first restored from FILE and the
loop given ``resume=True``. ``--progress FILE`` keeps FILE (rewritten atomically after every batch)
as JSON: ``time``, ``records`` read, ``assigned`` partitions and ``read``: per partition the next
offset this process will read (one past the highest the assembler received in this assignment of
it; the committed offset for a partition assigned but not read yet), for a producer that paces
itself to the reader. An assignment change is also logged: ``assigned TIME P,P,...``.
"""

from __future__ import annotations

import signal
import threading

# Before the imports below (about a second): a test may SIGTERM a consumer it has just restarted,
# and a SIGTERM that arrives before the handler is set kills the process (-15) instead of stopping it.
STOPPING = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: STOPPING.set())

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from reassembly import Assembler, GroupComplete, Limits, MessageComplete  # noqa: E402
from reassembly.brokers.kafka import KafkaReassembler  # noqa: E402


class Log:
    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def line(self, *words: object) -> None:
        os.write(self.fd, (" ".join(str(w) for w in (words[0], repr(time.time()), *words[1:])) + "\n").encode())


def write_sink(sink: Path, gid: bytes, seq: int, payload: bytes) -> bool:
    """Put one message in place atomically; False when its name was already there (same bytes)."""
    final = sink / f"{gid.hex()}-{seq}"
    if final.exists():
        assert final.read_bytes() == payload, f"{final.name}: different bytes for one message id"
        return False
    tmp = sink / f".{final.name}.{os.getpid()}.tmp"
    with tmp.open("wb") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, final)
    dfd = os.open(sink, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return True


class LoggedConsumer:
    """The confluent Consumer with every commit logged before it is sent."""

    def __init__(self, consumer: Any, log: Log) -> None:
        self._c = consumer
        self._log = log

    def commit(self, *args: Any, offsets: Any = None, **kwargs: Any) -> Any:
        for tp in offsets or ():
            self._log.line("commit", tp.topic, tp.partition, tp.offset)
        return self._c.commit(*args, offsets=offsets, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._c, name)


def write_atomic(path: Path, data: bytes, durable: bool) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("wb") as f:
        f.write(data)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("bootstrap")
    ap.add_argument("topic")
    ap.add_argument("group")
    ap.add_argument("sink", type=Path)
    ap.add_argument("log")
    ap.add_argument("--kill-after-messages", type=int)
    ap.add_argument("--kill-before-sink", action="store_true")
    ap.add_argument("--kill-after-records", type=int)
    ap.add_argument("--session-ms", type=int, default=2000)
    ap.add_argument("--expiry-offsets", type=int)
    ap.add_argument("--idle-exit", type=float, help="stop after this many seconds without a record")
    ap.add_argument("--commit-every", type=int, default=50)
    ap.add_argument("--snapshot", type=Path)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--progress", type=Path)
    ap.add_argument("--poll-timeout", type=float, default=0.2)
    a = ap.parse_args(argv)
    log = Log(a.log)
    stopping = STOPPING
    handed = 0

    def kill() -> None:
        log.line("killed")
        os.kill(os.getpid(), signal.SIGKILL)

    def on_message(ev: MessageComplete | GroupComplete) -> None:
        nonlocal handed
        handed += 1
        if a.kill_after_messages is not None and handed >= a.kill_after_messages and a.kill_before_sink:
            kill()
        for m in ev.messages if isinstance(ev, GroupComplete) else (ev,):
            fresh = write_sink(a.sink, m.group_id, m.msg_seq_number, bytes(m.payload))
            log.line("sink" if fresh else "again", m.group_id.hex(), m.msg_seq_number)
        if a.kill_after_messages is not None and handed >= a.kill_after_messages:
            kill()

    limits = Limits(expiry_offsets=a.expiry_offsets)
    asm = Assembler.restore(a.snapshot.read_bytes(), limits) if a.resume else Assembler(limits)

    def on_snapshot(blob: bytes) -> None:
        write_atomic(a.snapshot, blob, durable=True)
        log.line("snapshot", len(blob))
    config = {
        "bootstrap.servers": a.bootstrap,
        "group.id": a.group,
        "session.timeout.ms": a.session_ms,
        "heartbeat.interval.ms": max(100, a.session_ms // 6),
        "fetch.wait.max.ms": 50,
    }
    r = KafkaReassembler(config, [a.topic], assembler=asm, on_message=on_message,
                         on_event=lambda ev: log.line("event", type(ev).__name__), commit_every=a.commit_every,
                         commit_interval=0.5, on_snapshot=on_snapshot if a.snapshot else None,
                         resume=a.resume)  # fmt: skip
    logged = LoggedConsumer(r.consumer, log)
    r.consumer = logged
    if a.kill_after_records is not None:
        limit = a.kill_after_records

        def watch() -> None:
            while r.stats.records < limit:
                time.sleep(0.0005)
            kill()

        threading.Thread(target=watch, daemon=True).start()
    log.line("start", os.getpid())
    last = [time.monotonic(), 0]

    assigned: set[int] = set()

    def report() -> None:
        from confluent_kafka import TopicPartition

        now = {p for t, p in r.assigned if t == a.topic}
        if now != assigned:
            assigned.clear()
            assigned.update(now)
            log.line("assigned", ",".join(map(str, sorted(now))) or "-")
        read: dict[int, int] = {}
        for p in now:  # the assembler's track of a partition starts anew with each assignment of it
            high = r.assembler.checkpoint((a.topic, p)).high
            if high is not None:
                read[p] = high + 1
        ask = [TopicPartition(a.topic, p) for p in now if p not in read]
        if ask:
            for tp in logged.committed(ask, timeout=10):
                read[tp.partition] = max(tp.offset, 0)
        state = {"time": time.time(), "records": r.stats.records, "assigned": sorted(now), "read": read}
        write_atomic(a.progress, json.dumps(state).encode(), durable=False)

    held: list[frozenset[tuple[str, int]]] = [frozenset()]
    everything: list[int] = []

    def alone() -> bool:
        """Whether this consumer holds every partition of the topic."""
        if not everything:
            everything.append(len(r.consumer.list_topics(a.topic, timeout=10).topics[a.topic].partitions))
        return sum(1 for t, _ in r.assigned if t == a.topic) == everything[0]

    def stop() -> bool:
        # The idle clock runs only while this consumer holds every partition, and restarts with every
        # change of them: the last consumer of a test may join while a killed member is still in the
        # group (until its session times out), and must not stop before it has read the partitions
        # that member held.
        now = frozenset(r.assigned)
        if r.stats.records != last[1] or now != held[0] or (a.idle_exit is not None and not alone()):
            last[:] = [time.monotonic(), r.stats.records]
            held[0] = now
        if a.progress is not None:
            report()
        return stopping.is_set() or (a.idle_exit is not None and time.monotonic() - last[0] > a.idle_exit)

    r.run(stop, timeout=a.poll_timeout)
    r.close()
    log.line("stop", r.stats.records, r.stats.messages, r.stats.duplicates)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
