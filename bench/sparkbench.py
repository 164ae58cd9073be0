"""Spark reassembly (local mode) against what a user would write, and against the shuffle floor.

Every approach reads the same Parquet landing table and writes Parquet, so
the scan and the sink cost the same for all; only the reassembly differs.

Each data set runs in a fresh process (``python -m bench.sparkcase``): its own
JVM and Python workers, so the peak memory of one case is not inflated by
what an earlier case left behind (Python workers are reused and keep their
heap). The parent samples the child's process tree between the child's
BEGIN and END lines.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa
import pyarrow.parquet as pq

from segmenter import Segmenter
from segmenter.digest import NO_POLICY, DigestPolicy, Keyring

MiB = 1 << 20


# The digest options of `python -m bench --digests`: each signs its own copy of the data set.
DIGESTS = {
    "sha256": DigestPolicy(sha256=True),
    "hmac": DigestPolicy(keyring=Keyring({"bench": b"bench-key-not-a-secret"}, current="bench")),
}


def make_dataset(
    path: Path, total: int, segment_size: int, per_message: int, digest: DigestPolicy = NO_POLICY
) -> dict[str, Any]:
    """Clean encoded segments of ``total`` payload bytes, shuffled, in Parquet (generated once, cached)."""
    seg = Segmenter(segment_size, digest=digest)
    msg_size = seg.data_size * per_message
    n = max(1, total // msg_size)
    if not (path / "_DONE").exists():
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        blob = os.urandom(msg_size)
        batch: list[bytes] = []
        part = 0
        order = list(range(n))
        __import__("random").Random(1).shuffle(order)
        for i in order:
            payload = i.to_bytes(8, "big") + blob[8:]
            for s in seg.segment(payload):  # flushed every 128 MiB, even inside one huge message
                batch.append(s.encode())
                if len(batch) * segment_size >= 128 * MiB:
                    pq.write_table(
                        pa.table({"segment": pa.array(batch, pa.binary())}), path / f"part-{part:04d}.parquet"
                    )
                    batch, part = [], part + 1
            del payload
        if batch:
            pq.write_table(pa.table({"segment": pa.array(batch, pa.binary())}), path / f"part-{part:04d}.parquet")
        (path / "_DONE").touch()
    return {"messages": n, "bytes": n * msg_size, "segment": segment_size, "per_message": per_message}


APPROACHES = (
    "ours (validated)",
    "(a) SQL listagg, no validation",
    "(b) collect_list+aggregate concat, no validation",
    "(c) applyInPandas b''.join, no validation",
    "(d) floor: shuffle by message + write",
)
DIGEST_APPROACHES = {name: f"ours + {name}" for name in DIGESTS}  # ours, verifying (in the JVM) what it signs
# One message far above Spark's 2 GiB value cap: only the streamed path can build it, into a payload file.
LARGE = "ours, streamed to a payload file"
LARGE_MESSAGE_BYTES = 64 * MiB  # pieces at offsets past this travel alone and are written straight to the file


def approaches(spark: Any, payload_dir: Path) -> dict[str, Callable[[Any], Any]]:
    """Each maps the landing DataFrame to a DataFrame to write, or (ours) a result to ``save()``."""
    from pyspark.sql import functions as F

    from reassembly.spark import ReassemblyOptions, reassemble

    def keyed(df: Any) -> Any:
        return df.select(
            F.expr("substring(segment, 17, 28)").alias("key"),  # GroupId + MsgSeqNumber
            F.expr("conv(hex(substring(segment, 49, 8)), 16, 10)").cast("bigint").alias("offset"),
            F.expr("substring(segment, 85)").alias("data"),
        )

    def ours(df: Any) -> Any:  # as the reassemble command runs it: large messages streamed to files, save()
        return reassemble(df, options=ReassemblyOptions(payload_dir=str(payload_dir)))

    def listagg(df: Any) -> Any:
        return keyed(df).groupBy("key").agg(F.expr("listagg(data, X'') WITHIN GROUP (ORDER BY offset)").alias("p"))

    def collect_concat(df: Any) -> Any:
        return (
            keyed(df)
            .groupBy("key")
            .agg(F.expr("array_sort(collect_list(struct(offset, data)))").alias("s"))
            .select("key", F.expr("aggregate(s, X'', (acc, x) -> concat(acc, x.data))").alias("p"))
        )

    def pandas_udf(df: Any) -> Any:
        def join(pdf: Any) -> Any:
            import pandas as pd

            pdf = pdf.sort_values("offset")
            return pd.DataFrame({"key": [pdf["key"].iloc[0]], "p": [b"".join(pdf["data"])]})

        return keyed(df).groupBy("key").applyInPandas(join, "key binary, p binary")

    def floor(df: Any) -> Any:
        return df.select(F.expr("substring(segment, 17, 28)").alias("key"), "segment").repartition(
            int(spark.conf.get("spark.sql.shuffle.partitions")), "key"
        )

    def verifying(digest: DigestPolicy) -> Callable[[Any], Any]:
        def run(df: Any) -> Any:
            options = ReassemblyOptions(payload_dir=str(payload_dir), digest=digest)
            return reassemble(df, options=options)

        return run

    def streamed(df: Any) -> Any:  # saved as the command saves it (the one pass, the side files, the judge)
        options = ReassemblyOptions(
            payload_dir=str(payload_dir), large_message_bytes=LARGE_MESSAGE_BYTES, max_message_size=1 << 40
        )
        return reassemble(df, options=options)

    table = dict(zip(APPROACHES, (ours, listagg, collect_concat, pandas_udf, floor), strict=True))
    return table | {DIGEST_APPROACHES[name]: verifying(policy) for name, policy in DIGESTS.items()} | {LARGE: streamed}


def write_result(target: Any, out: Path | str) -> None:
    """An approach's result written as ``reassemble run`` writes: ours by ``save()``, every other one
    with the same Parquet writer settings (``parquet_writer``), so no approach pays for the writer's
    defaults where another does not."""
    from reassembly.spark import ReassemblyResult
    from reassembly.spark.writer import parquet_writer

    if isinstance(target, ReassemblyResult):
        target.save(out)  # messages/ and quarantine/
    else:
        parquet_writer(target).parquet(str(out))


class _Window:
    """Peak RSS, by kind of process, of one case."""

    def __init__(self) -> None:
        self.driver = self.jvm = self.python_workers = 0
        self.python_worker = 0  # the largest single Python process (the daemon or one worker)


def _sample(root: psutil.Process, window: _Window) -> None:
    jvm = workers = largest = 0
    try:
        driver = root.memory_info().rss
        children = root.children(recursive=True)
    except psutil.Error:
        return
    for p in children:
        try:
            name, rss = p.name(), p.memory_info().rss
        except psutil.Error:
            continue
        if name == "java":
            jvm += rss
        elif "python" in name:
            workers += rss
            largest = max(largest, rss)
    window.driver = max(window.driver, driver)
    window.jvm = max(window.jvm, jvm)
    window.python_workers = max(window.python_workers, workers)
    window.python_worker = max(window.python_worker, largest)


def run_cases(
    data: Path, names: list[str], warmup: Path, out: Path, *, keep: bool = False, conf: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """Time ``names`` on ``data`` in one fresh Spark process; peak memory per case.

    ``keep``: leave the last case's output (and payload files) for the caller to check.
    ``conf``: extra Spark settings for that process.
    """
    cmd = [sys.executable, "-m", "bench.sparkcase", "--data", str(data), "--warmup", str(warmup), "--out", str(out)]
    cmd += ["--keep"] if keep else []
    cmd += [f"--conf={k}={v}" for k, v in (conf or {}).items()]
    with open(out.parent / "sparkcase.log", "a") as log:  # Spark's start-up chatter, kept for a post-mortem
        proc = psutil.Popen(
            [*cmd, *names], stdout=subprocess.PIPE, stderr=log, text=True, cwd=Path(__file__).parent.parent
        )
    window = _Window()
    stop = threading.Event()

    def sampler() -> None:
        while not stop.wait(0.2):
            _sample(proc, window)

    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    results: list[dict[str, Any]] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        word, _, rest = line.strip().partition(" ")
        if word == "BEGIN":
            window = _Window()
        elif word in ("END", "FAIL"):
            name, _, value = rest.partition("\t")
            results.append(
                {
                    "approach": name,
                    "seconds": float(value) if word == "END" else None,
                    "error": value if word == "FAIL" else None,
                    "peak_driver_rss": window.driver,
                    "peak_jvm_rss": window.jvm,
                    "peak_python_workers_rss": window.python_workers,
                    "peak_python_worker_rss": window.python_worker,
                }
            )
    proc.wait()
    stop.set()
    thread.join()
    for name in names[len(results) :]:  # the process died: say so, do not drop the case
        results.append({"approach": name, "seconds": None, "error": f"bench process exited {proc.returncode}"})
    return results


def datasets(work: Path, kind: str, shapes: Iterable[tuple[int, int, int]]) -> list[tuple[str, Path, dict[str, Any]]]:
    """Generate (or reuse) the landing table of each (total, segment size, segments per message)."""
    out = []
    for total, ssize, per in shapes:
        src = work / f"data-{total // MiB}M-{ssize // 1024}K-{per}"
        out.append((kind, src, make_dataset(src, total, ssize, per)))
    return out


MATRIX = (
    (1024 * MiB, 64 * 1024, 8),
    (1024 * MiB, 64 * 1024, 64),
    (1024 * MiB, 16 * 1024, 8),
    (1024 * MiB, 1024 * 1024, 8),
    (4096 * MiB, 64 * 1024, 8),
)


def interleaved(
    datasets: Iterable[tuple[str, Path, dict[str, Any]]],
    names: Iterable[str],
    warmup: Path,
    out: Path,
    rounds: int,
    warmup_rounds: int = 0,
) -> Iterator[dict[str, Any]]:
    """Every (data set, approach) ``rounds`` times, round-robin: round 1 of all, then round 2, ...;
    round r starts with the r-th approach (mod their number), so no approach always comes first.

    Each case in its own fresh process; interleaving spreads the drift of a shared machine's
    load over every approach alike instead of charging it to whichever ran last.
    ``warmup_rounds`` whole rounds go first, numbered 0, -1, ... and marked ``warmup``: on a VM
    whose guest hands freed memory back to the host, the first processes to touch memory pay
    the host's page faults, and without a discarded round that cost falls on round 1, whose
    first case on every data set is always the same approach.
    """
    sets, approaches_ = list(datasets), list(names)
    for r in range(1 - warmup_rounds, rounds + 1):
        for kind, src, info in sets:
            turn = (r - 1) % len(approaches_)  # each approach first on a data set in turn, not ours always
            for name in approaches_[turn:] + approaches_[:turn]:
                for case in run_cases(src, [name], warmup, out):
                    yield {"kind": kind, "round": r, "warmup": r < 1, **info, **case}


PEAKS = ("peak_driver_rss", "peak_jvm_rss", "peak_python_workers_rss", "peak_python_worker_rss")


def summarize(cases: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (kind, data set, approach): median, min and max seconds over its runs, highest peaks."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for c in cases:
        groups.setdefault((c["kind"], c["bytes"], c["segment"], c["per_message"], c["approach"]), []).append(c)
    out = []
    for runs in groups.values():
        times = [c["seconds"] for c in runs if c["seconds"] is not None]
        first = runs[0]
        out.append(
            {
                **{k: first[k] for k in ("kind", "messages", "bytes", "segment", "per_message", "approach")},
                "seconds": statistics.median(times) if times else None,
                "min": min(times, default=None),
                "max": max(times, default=None),
                "runs": [c["seconds"] for c in runs],
                "error": next((c["error"] for c in runs if c["error"]), None),
                **{k: max(c.get(k, 0) for c in runs) for k in PEAKS},
            }
        )
    return out


def spark_cases(work: Path, quick: bool) -> Iterator[dict[str, Any]]:
    # Warm-up in every process before the timed run: Python worker start-up, and enough rows for
    # HotSpot to compile the hot paths (a 4 MiB warm-up left the first 1 GiB run 1.5x slower).
    warm = work / ("warmup" if quick else "warmup-32M")
    make_dataset(warm, (4 if quick else 32) * MiB, 64 * 1024, 8)
    out = work / "out"
    everything = list(APPROACHES)
    if quick:  # a smoke run of every approach and of the table, not a measurement: one process (one JVM)
        for kind, src, info in datasets(work, "matrix", [(16 * MiB, 64 * 1024, 8)]):
            for case in run_cases(src, everything, warm, out):
                yield {"kind": kind, "round": 1, "warmup": False, **info, **case}
        return
    yield from interleaved(datasets(work, "matrix", list(MATRIX)), everything, warm, out, rounds=1)
    ours, listagg, floor = everything[0], everything[1], everything[4]
    # One single 1 GiB message (1 MiB segments): ours streams it into a file.
    src = work / "data-1024M-1024K-1024"
    info = make_dataset(src, 1024 * MiB, 1024 * 1024, 1024)
    for name in (ours, listagg, floor):
        for case in run_cases(src, [name], warm, out):
            yield {"kind": "single_1g", **info, **case}
    # Scaling: data size (1 and 4 GiB come from the matrix), and segments per message at fixed size.
    for gib in (0.25, 0.5, 2.0):
        total = int(gib * 1024) * MiB
        src = work / f"data-{total // MiB}M-64K-8"
        info = make_dataset(src, total, 64 * 1024, 8)
        for case in run_cases(src, [ours, floor], warm, out):
            yield {"kind": "scale_size", **info, **case}
    for per in (2, 8, 32, 128):
        src = work / f"data-512M-64K-{per}"
        info = make_dataset(src, 512 * MiB, 64 * 1024, per)
        for case in run_cases(src, [ours, listagg, floor], warm, out):
            yield {"kind": "scale_per_message", **info, **case}


def digest_cases(work: Path, quick: bool) -> Iterator[dict[str, Any]]:
    """CRC only, each digest option and the floor on one data set (1 GiB, 64 KiB x 8), same run.

    Each option reads its own copy of the data, signed by the producer with that option (and a
    warm-up signed the same way, so the JVM's sha2 path is compiled before the timed run).
    """
    total = (64 if quick else 1024) * MiB
    plain = work / f"data-{total // MiB}M-64K-8"
    warm = work / "warmup-32M"
    make_dataset(warm, 32 * MiB, 64 * 1024, 8)
    out = work / "out"
    info = make_dataset(plain, total, 64 * 1024, 8)
    for name in (APPROACHES[0], APPROACHES[4]):
        for case in run_cases(plain, [name], warm, out):
            yield {"kind": "digests", **info, **case}
    for option, policy in DIGESTS.items():
        src = work / f"{plain.name}-{option}"
        signed_warm = work / f"warmup-32M-{option}"
        make_dataset(signed_warm, 32 * MiB, 64 * 1024, 8, policy)
        info = make_dataset(src, total, 64 * 1024, 8, policy)
        for case in run_cases(src, [DIGEST_APPROACHES[option]], signed_warm, out):
            yield {"kind": "digests", **info, **case}
