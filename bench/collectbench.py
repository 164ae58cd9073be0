"""Collector throughput with durability, SQLite and PostgreSQL (the goal: at least 20,000 messages/s
through SQLite on one core, 10,000/s through PostgreSQL on loopback).

One collector process, one thread: messages are stored input by input (``--per-input``
messages in one transaction, the acknowledgement), batched by destination under rules in the
same database, and every batch is claimed, written as a Parquet file of segments (temporary
file, fsync, rename, fsync of the directory) and marked emitted. The clock runs from the first
store to the last batch marked, the final flush included.

    python -m bench.collectbench --messages 200000 --rounds 3            # SQLite and PostgreSQL
    python -m bench.collectbench --backend sqlite --messages 20000       # smoke

Commits: per input (``--per-input`` messages) one transaction storing the rows; per batch one
claim transaction, one file fsync + rename + directory fsync, one mark transaction. SQLite
runs in WAL mode with ``synchronous=FULL`` (each commit fsyncs the WAL); PostgreSQL is a
throwaway server on 127.0.0.1 started with ``fsync=on`` (each commit flushes its WAL) unless
``--pg URL`` names one.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from reassembly.collector import Rule
from reassembly.storage.collector import Storage, open_storage
from reassembly.storage.durable import DurableCollector

HERE = Path(__file__).resolve().parent


def _pg_server() -> Any:
    """tests/support/pg_server.py's throwaway server (one copy of the start-up rules)."""
    spec = importlib.util.spec_from_file_location("pg_server", HERE.parent / "tests" / "pg_server.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextmanager
def _database(backend: str, work: Path, pg: str | None) -> Iterator[str]:
    if backend == "sqlite":
        yield str(work / "collect.db")
    elif pg:
        yield pg
    else:
        with _pg_server().postgres_server(fsync=True) as url:
            yield url


def _inputs(messages: int, per_input: int, size: int, destinations: int) -> list[list[tuple[str, bytes]]]:
    body = os.urandom(size)
    rows = [(f"dest-{i % destinations}", body[: size - 8] + i.to_bytes(8, "big")) for i in range(messages)]
    return [rows[i : i + per_input] for i in range(0, messages, per_input)]


def run_once(
    storage: Storage, out: Path, inputs: list[list[tuple[str, bytes]]], batch: int, tag: str
) -> dict[str, Any]:
    for d in {d for rows in inputs for d, _ in rows}:
        storage.put_rule(Rule(d, f"t-{d}", max_messages=batch, max_wait=3600, stranded_after=7200))
    collector = DurableCollector(storage, out, lease=600)
    collector.sync()
    cpu, start = time.process_time(), time.perf_counter()
    for i, rows in enumerate(inputs):
        collector.ingest(f"{tag}-{i}", rows)
    collector.flush()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    n = sum(len(r) for r in inputs)
    counts = storage.counts()
    assert counts["held"] == 0 and counts["closed"] == counts["emitted"], counts
    collector.stop()
    return {"messages": n, "seconds": wall, "cpu_seconds": cpu, "msgs_per_s": n / wall, "batches": collector.emitted}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.collectbench", description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--size", type=int, default=200, help="payload bytes")
    p.add_argument("--destinations", type=int, default=10)
    p.add_argument("--batch", type=int, default=1000, help="max_messages of every rule")
    p.add_argument("--per-input", type=int, default=5000, help="messages per input file (one transaction)")
    p.add_argument(
        "--rounds", type=int, default=3, help="interleaved rounds per backend; the best and median are shown"
    )
    p.add_argument("--pg", default=None, help="a PostgreSQL URL (default: a throwaway server with fsync=on)")
    args = p.parse_args(argv)
    import pyarrow.parquet  # noqa: F401 - imported before the clock starts (write_batch imports it lazily)

    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    inputs = _inputs(args.messages, args.per_input, args.size, args.destinations)
    results: dict[str, list[dict[str, Any]]] = {b: [] for b in backends}
    work = Path(tempfile.mkdtemp(prefix="collectbench-"))
    try:
        with _database("postgres", work, args.pg) if "postgres" in backends else _nothing() as pg_url:
            for r in range(args.rounds):  # interleaved: a busy machine slows both alike
                for backend in backends:
                    url = pg_url if backend == "postgres" else str(work / f"collect-{r}.db")
                    storage = open_storage(url)
                    out = work / f"out-{backend}-{r}"
                    results[backend].append(run_once(storage, out, inputs, args.batch, f"r{r}"))
                    storage.close()
                    shutil.rmtree(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = {}
    for backend, runs in results.items():
        rates = sorted(x["msgs_per_s"] for x in runs)
        summary[backend] = {
            "best_msgs_per_s": round(rates[-1]),
            "median_msgs_per_s": round(rates[len(rates) // 2]),
            "cpu_s_per_100k": round(min(x["cpu_seconds"] for x in runs) / runs[0]["messages"] * 1e5, 3),
            # What one core does when it is ours: messages per second of this process's CPU time
            # (SQLite's work is in-process; PostgreSQL's server time is not counted here).
            "msgs_per_cpu_s": round(max(x["messages"] / x["cpu_seconds"] for x in runs)),
            "load_average": round(os.getloadavg()[0], 1),
            "batches": runs[0]["batches"],
        }
        print(
            f"{backend:9s} {runs[0]['messages']} msgs x {args.size} B, {args.destinations} destinations, "
            f"batches of {args.batch}, {args.per_input} per input: best {rates[-1]:,.0f} msgs/s, "
            f"median {rates[len(rates) // 2]:,.0f} msgs/s ({len(runs)} rounds); "
            f"{summary[backend]['msgs_per_cpu_s']:,} msgs per CPU second; load average {os.getloadavg()[0]:.1f}"
        )
    print(json.dumps(summary))
    return 0


@contextmanager
def _nothing() -> Iterator[None]:
    yield None


if __name__ == "__main__":
    raise SystemExit(main())
