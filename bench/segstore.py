"""The shared segment store against the in-memory assembler and an ordinary consumer group.

Messages of 4 MiB on the wire in segments of 64 KiB (header included), ``--mib`` MiB in all. Cases:

* **memory**: the in-memory :class:`~reassembly.Assembler` fed every record, the messages
  interleaved (one segment of each in turn, as competing members see them), in one process;
* **db-floor**: the database write alone: the same records inserted as plain rows (an integer key
  and the bytes) in transactions of ``--batch`` records, then deleted a batch at a time; what no
  store can beat (its write share: the inserts);
* **store-1**: one :class:`~reassembly.segstore.StoreMember` in one process: the records written in
  batches of ``--batch`` (one transaction each, as one poll's records), every completed message
  delivered (read back, assembled, settled); the time in ``write`` is the store's share;
* **group**: Kafka (librdkafka's mock cluster): one consumer of an ordinary consumer group, every
  segment of a message on one partition, reassembled in memory, from the first record produced to
  the last message complete;
* **share-K** (K = 1, 2, 3): the same data through a share group of K member processes
  (:class:`~reassembly.brokers.ShareGroupReceiver`) over the store, each message's segments on four
  partitions (so they reach several members), timed the same way (the store's ``delivered``
  counter).

The Kafka topics have a partition per message (``group``) or four (``share-K``): the mock keeps only
the newest 5 MiB of a partition. Each case runs ``--rounds`` times; the table gives the median
MiB/s, and for ``store-1`` the share of its time spent writing.

    python -m bench.segstore --mib 64 --store sqlite postgres --rounds 3 --json FILE
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from reassembly import Assembler, MessageComplete
from reassembly.segstore import StoreMember, open_store
from segmenter import segment

HERE = Path(__file__).resolve().parent
MESSAGE = 4 << 20
SEGMENT = 64 << 10


def records(mib: int) -> list[list[bytes]]:
    """Per message, its encoded segments (each exactly SEGMENT bytes but the last)."""
    count = max(1, (mib << 20) // MESSAGE)
    return [[s.encode() for s in segment(os.urandom(MESSAGE - 64 * 84), SEGMENT)] for _ in range(count)]


def interleaved(msgs: list[list[bytes]]) -> list[bytes]:
    return [m[i] for i in range(max(map(len, msgs))) for m in msgs if i < len(m)]


def _mib(msgs: list[list[bytes]]) -> float:
    return sum(len(r) for m in msgs for r in m) / (1 << 20)


def case_memory(msgs: list[list[bytes]]) -> dict[str, float]:
    order = interleaved(msgs)
    t = time.perf_counter()
    a = Assembler()
    done = sum(isinstance(e, MessageComplete) for r in order for e in a.receive(r))
    assert done == len(msgs)
    return {"seconds": time.perf_counter() - t}


def case_floor(msgs: list[list[bytes]], url: str, batch: int) -> dict[str, float]:
    """Plain rows through the same database client, committed per batch, then deleted."""
    order = interleaved(msgs)
    store = open_store(url, member="floor")  # the same connection settings (WAL, synchronous) as the store
    conn, q = store.conn, store.placeholder
    blob = store.types["blob"]
    conn.execute(f"CREATE TABLE IF NOT EXISTS bench_floor (k BIGINT PRIMARY KEY, raw {blob} NOT NULL)")
    t = time.perf_counter()
    for start in range(0, len(order), batch):
        conn.execute("BEGIN")
        for k in range(start, min(start + batch, len(order))):
            conn.execute(f"INSERT INTO bench_floor (k, raw) VALUES ({q}, {q})", (k, order[k]))
        conn.execute("COMMIT")
    writing = time.perf_counter() - t
    for start in range(0, len(order), batch):  # and deleted, a batch per transaction, as a settlement does
        conn.execute(f"DELETE FROM bench_floor WHERE k >= {q} AND k < {q}", (start, start + batch))
    seconds = time.perf_counter() - t
    conn.execute("DROP TABLE bench_floor")
    store.close()
    return {"seconds": seconds, "write_seconds": writing}


def case_store(msgs: list[list[bytes]], url: str, batch: int) -> dict[str, float]:
    order = interleaved(msgs)
    got = []
    store = open_store(url, member="bench")
    member = StoreMember(store, got.append)
    writing = 0.0
    t = time.perf_counter()
    for start in range(0, len(order), batch):
        w = time.perf_counter()
        _, claims = member.write(order[start : start + batch])
        writing += time.perf_counter() - w
        member.deliver(claims)
    seconds = time.perf_counter() - t
    store.close()
    assert len(got) == len(msgs)
    return {"seconds": seconds, "write_seconds": writing}


# ---------------------------------------------------------------- Kafka cases
def _producer(bootstrap: str) -> Any:
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "message.max.bytes": 2 << 20, "log_level": 3})


def _prime(bootstrap: str, topic: str, group: str, partitions: int) -> None:
    from confluent_kafka import ShareConsumer

    c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, "share.acknowledgement.mode": "explicit",
                       "log_level": 3})  # fmt: skip
    p = _producer(bootstrap)
    c.subscribe([topic])
    seen: set[int] = set()
    deadline = time.monotonic() + 120
    while len(seen) < partitions:
        assert time.monotonic() < deadline, f"share group not primed: {len(seen)} of {partitions} partitions"
        for part in range(partitions):
            if part not in seen:
                p.produce(topic, b"probe", partition=part)
        p.flush(30)
        for m in c.poll(0.5) or []:
            part = m.partition()
            if m.error() is None and part is not None:
                seen.add(part)
                c.acknowledge(m)
    c.commit_sync()
    c.close()


def _spawn(args: list[str]) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen(
        [sys.executable, "-m", "bench.segstore", *args], stdout=subprocess.PIPE, text=True, cwd=HERE.parent, env=env
    )


def _ready(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "ready", line


def _produce(bootstrap: str, topic: str, msgs: list[list[bytes]], spread: int) -> None:
    p = _producer(bootstrap)
    for i, segs in enumerate(msgs):
        for j, r in enumerate(segs):
            p.produce(topic, r, partition=i * spread + j % spread)
        p.poll(0)
    assert p.flush(120) == 0


def case_share(msgs: list[list[bytes]], url: str, members: int, cluster: Any, run: int) -> dict[str, float]:
    topic = cluster.create_topic(f"share-bench-{run}", 4 * len(msgs))
    group = f"sg-{topic}"
    _prime(cluster.bootstrap, topic, group, 4 * len(msgs))
    procs = [_spawn(["--member", cluster.bootstrap, topic, group, url, f"m{i}"]) for i in range(members)]
    try:
        for p in procs:
            _ready(p)
        store = open_store(url, member="bench-watch")
        before = store.stats().counters.get("delivered", 0)
        t = time.perf_counter()
        _produce(cluster.bootstrap, topic, msgs, 4)
        while store.stats().counters.get("delivered", 0) - before < len(msgs):
            time.sleep(0.02)
        seconds = time.perf_counter() - t
        store.close()
    finally:
        for p in procs:
            p.terminate()
            p.wait(30)
    return {"seconds": seconds}


def case_group(msgs: list[list[bytes]], cluster: Any, run: int) -> dict[str, float]:
    topic = cluster.create_topic(f"group-bench-{run}", len(msgs))
    proc = _spawn(["--group-member", cluster.bootstrap, topic, str(len(msgs))])
    try:
        _ready(proc)
        t = time.perf_counter()
        _produce(cluster.bootstrap, topic, msgs, 1)
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "done"
        seconds = time.perf_counter() - t
    finally:
        proc.terminate()
        proc.wait(30)
    return {"seconds": seconds}


def member_main(bootstrap: str, topic: str, group: str, url: str, name: str) -> int:
    """A share-group member process: ``ready`` once it polled, then until SIGTERM."""
    import signal

    from reassembly.brokers import ShareGroupReceiver

    stop = [False]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    store = open_store(url, member=name)
    receiver = ShareGroupReceiver(
        {"bootstrap.servers": bootstrap, "group.id": group, "log_level": 3, "fetch.max.bytes": 16 << 20},
        [topic],
        store,
        lambda m: None,
    )
    receiver.poll(0.5)
    print("ready", flush=True)
    try:
        receiver.run(lambda: stop[0], timeout=0.2)
    finally:
        receiver.close()
        store.close()
    return 0


def group_member_main(bootstrap: str, topic: str, count: int) -> int:
    """A consumer-group member: ``ready`` once assigned, ``done`` once ``count`` messages are complete."""
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic}", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False, "log_level": 3, "max.partition.fetch.bytes": 8 << 20})  # fmt: skip
    c.subscribe([topic])
    while not c.assignment():
        c.poll(0.1)
    print("ready", flush=True)
    a = Assembler()
    done = 0
    while done < count:
        m = c.poll(1.0)
        if m is None or m.error() is not None:
            continue
        done += sum(isinstance(e, MessageComplete) for e in a.receive(m.value(), m.offset(), m.partition()))
    print("done", flush=True)
    c.close()
    return 0


@contextmanager
def _stores(kinds: list[str], work: Path) -> Iterator[dict[str, Callable[[str], str]]]:
    """Per kind, a function naming a fresh store for a case."""
    from tests.support.pg_server import fresh_database, postgres_server

    made: dict[str, Callable[[str], str]] = {}
    if "sqlite" in kinds:
        made["sqlite"] = lambda name: str(work / f"{name}.db")
    if "postgres" not in kinds:
        yield made
        return
    with postgres_server(fsync=True) as url:
        made["postgres"] = lambda name: fresh_database(url, name)
        yield made


def run(mib: int, kinds: list[str], rounds: int, batch: int, members: list[int], log: Any = print) -> dict[str, Any]:
    from tests.support.kafka_cluster import mock_cluster

    msgs = records(mib)
    size = _mib(msgs)
    rows: list[dict[str, Any]] = []
    n = 0

    def add(case: str, store: str, result: dict[str, float]) -> None:
        row = {"case": case, "store": store, "mib": size, "mib_s": size / result["seconds"], **result}
        rows.append(row)
        log(json.dumps(row))

    with (
        tempfile.TemporaryDirectory(prefix="segstore-bench-") as d,
        _stores(kinds, Path(d)) as stores,
        mock_cluster(3) as cluster,
    ):
        for r in range(rounds):
            add("memory", "-", case_memory(msgs))
            add("group", "-", case_group(msgs, cluster, r))
            for kind, fresh in stores.items():
                n += 1
                add("db-floor", kind, case_floor(msgs, fresh(f"floor_{n}"), batch))
                add("store-1", kind, case_store(msgs, fresh(f"store_{n}"), batch))
                for k in members:
                    add(f"share-{k}", kind, case_share(msgs, fresh(f"share_{n}_{k}"), k, cluster, n * 10 + k))
    return {"mib": size, "messages": len(msgs), "segment": SEGMENT, "batch": batch, "rows": rows}


def table(results: dict[str, Any]) -> str:
    """Median MiB/s per case and store, with each case's ratio to the in-memory assembler."""
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in results["rows"]:
        by.setdefault((row["case"], row["store"]), []).append(row)
    memory = statistics.median(r["mib_s"] for r in by[("memory", "-")])
    lines = [
        f"{results['messages']} messages of 4 MiB in 64 KiB segments ({results['mib']:.0f} MiB), "
        f"store writes in batches of {results['batch']} records",
        "",
        "| case | store | MiB/s (median) | x slower than memory | write share of the time |",
        "|---|---|---:|---:|---:|",
    ]
    for (case, store), rows in by.items():
        rate = statistics.median(r["mib_s"] for r in rows)
        timed = "write_seconds" in rows[0]
        share = statistics.median(r["write_seconds"] / r["seconds"] for r in rows) if timed else None
        lines.append(
            f"| {case} | {store} | {rate:.1f} | {memory / rate:.1f} | {'' if share is None else f'{share:.0%}'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--member":
        return member_main(*argv[1:6])
    if argv and argv[0] == "--group-member":
        return group_member_main(argv[1], argv[2], int(argv[3]))
    p = argparse.ArgumentParser(prog="python -m bench.segstore", description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=64, help="MiB of 4 MiB messages (default 64)")
    p.add_argument("--store", nargs="+", choices=("sqlite", "postgres"), default=["sqlite", "postgres"])
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--batch", type=int, default=64, help="records per store transaction in store-1 and db-floor")
    p.add_argument("--members", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    a = p.parse_args(argv)
    results = run(a.mib, a.store, a.rounds, a.batch, a.members)
    if a.json:
        a.json.write_text(json.dumps(results, indent=2))
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
