"""The ``reassemble`` command (also ``python -m reassembly``): the Spark reassembly job.

Subcommands:
  run INPUT OUTPUT   reassemble Parquet segments into OUTPUT/messages and OUTPUT/quarantine
                     (and OUTPUT/payloads/ for messages above --large-message-bytes)
  demo               generate a landing table with every fault, run the job on it, check it
  refmsg INPUT OUTPUT  rebuild objects from reference-message chunks (MQRMH rows)

The output appears atomically: the job writes a hidden sibling directory and
renames it into place only when everything succeeded.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from segmenter.errors import SegmentationError


class JobError(Exception):
    """A failure to report in one line (no stack trace)."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="reassemble", description="Reassemble segmented messages with Spark.")
    sub = p.add_subparsers(dest="command", required=True)

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument("--master", default="local[2]", help="Spark master (default local[2]; spark://host:port)")
        q.add_argument("--partitions", type=int, default=None, help="shuffle partitions (default: Spark's)")
        q.add_argument("--max-message-size", type=int, default=1 << 30, help="bytes; larger declared sizes: 2030")
        q.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None, help="live progress bar")

    def large(q: argparse.ArgumentParser) -> None:  # run and demo write messages; refmsg writes objects
        q.add_argument(
            "--large-message-bytes",
            type=int,
            default=128 << 20,
            help="messages above this (or of unknown size) are written to OUTPUT/payloads/ (default 128 MiB)",
        )

    run = sub.add_parser("run", help="reassemble a Parquet landing table")
    run.add_argument("input", help="Parquet file, directory or glob of segments")
    run.add_argument("output", help="directory to create with messages/ and quarantine/")
    run.add_argument("--input-format", choices=("encoded", "columns"), default="encoded")
    run.add_argument("--raw-column", default="segment", help="binary column holding encoded segments")
    run.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists")
    common(run)
    large(run)

    demo = sub.add_parser("demo", help="generate faulty data, reassemble it, check the result")
    demo.add_argument("--messages", type=int, default=200)
    demo.add_argument("--segments-per-message", type=int, default=8)
    demo.add_argument("--segment-size", type=int, default=16 * 1024)
    demo.add_argument("--keep", default=None, help="keep the data and output in this directory")
    common(demo)
    large(demo)

    ref = sub.add_parser("refmsg", help="rebuild objects from reference-message chunk rows")
    ref.add_argument("input", help="Parquet of encoded reference messages (binary column 'message')")
    ref.add_argument("output", help="directory to create with objects/ and quarantine/")
    ref.add_argument("--message-column", default="message")
    ref.add_argument("--overwrite", action="store_true")
    common(ref)

    from .spark.stream_job import add_stream_parser  # streaming job (issue 10): its own module

    add_stream_parser(sub)
    return p


def _inputs(pattern: str) -> list[str]:
    paths = sorted(glob.glob(pattern)) if any(c in pattern for c in "*?[") else [pattern]
    missing = [p for p in paths if not os.path.exists(p)]
    if not paths or missing:
        raise JobError(f"input not found: {pattern}")
    unreadable = [p for p in paths if not os.access(p, os.R_OK)]
    if unreadable:
        raise JobError(f"input not readable: {unreadable[0]}")
    return paths


def _claim_output(output: str, overwrite: bool) -> Path:
    out = Path(output)
    if out.exists() and not overwrite:
        raise JobError(f"output exists: {output} (use --overwrite)")
    if not out.parent.exists():
        raise JobError(f"output parent directory does not exist: {out.parent}")
    return out


@contextmanager
def _atomic_dir(out: Path) -> Iterator[Path]:
    """A hidden sibling to write into; renamed to ``out`` on success, removed on failure."""
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
        out.rename(old)
    tmp.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


class Progress:
    """A live bar on stderr from Spark's status tracker (stages and tasks done)."""

    def __init__(self, spark: Any, enabled: bool) -> None:
        self._sc = getattr(spark, "sparkContext", None) if enabled else None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Progress:
        if self._sc is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._sc is not None:
            self._thread.join()
            sys.stderr.write("\r" + " " * 78 + "\r")
            sys.stderr.flush()

    def _loop(self) -> None:
        tracker = self._sc.statusTracker()  # type: ignore[union-attr]
        start = time.monotonic()
        while not self._stop.wait(0.5):
            done = total = 0
            stages = []
            for sid in tracker.getActiveStageIds():
                info = tracker.getStageInfo(sid)
                if info is not None:
                    done += info.numCompletedTasks
                    total += info.numTasks
                    stages.append(str(sid))
            frac = done / total if total else 0.0
            bar = "#" * int(30 * frac) + "-" * (30 - int(30 * frac))
            label = f"stage {','.join(stages)}" if stages else "planning"
            sys.stderr.write(f"\r[{bar}] {done}/{total} tasks  {label}  {time.monotonic() - start:5.1f}s ")
            sys.stderr.flush()


def _session(args: argparse.Namespace) -> Any:
    from .session import get_session

    spark = get_session(args.master, app_name="reassemble")
    if hasattr(spark, "sparkContext"):
        spark.sparkContext.setLogLevel("OFF")  # our own one-line errors replace Java stack traces
    return spark


def write_split(combined: Any, tmp: Path, folders: dict[str, str]) -> None:
    """Compute every kind of row in one pass (partitioned by ``kind``), then name each folder."""
    combined.write.partitionBy("kind").parquet(str(tmp / "_combined"))
    for kind, name in folders.items():
        src = tmp / "_combined" / f"kind={kind}"
        if src.exists():
            src.rename(tmp / name)
        else:
            (tmp / name).mkdir(parents=True)
    shutil.rmtree(tmp / "_combined")


def summarize(spark: Any, out: Path, input_bytes: int, seconds: float) -> str:
    """The end-of-job report: messages by status, bytes, throughput, quarantine by reason."""
    from pyspark.sql import functions as F

    lines = []
    msgs_dir, q_dir = out / "messages", out / "quarantine"
    by_status: list[Any] = []
    if any(msgs_dir.glob("*.parquet")):
        m = spark.read.parquet(str(msgs_dir))
        by_status = (
            m.groupBy("status")
            .agg(
                F.count("*").alias("n"),
                # a message written to payloads/ counts its original length
                F.sum(
                    F.coalesce(F.length("payload"), F.when(F.col("payload_path").isNotNull(), F.col("original_length")))
                ).alias("bytes"),
            )
            .orderBy(F.desc("n"))
            .collect()
        )
    by_reason: list[Any] = []
    if any(q_dir.glob("*.parquet")):
        q = spark.read.parquet(str(q_dir))
        by_reason = q.groupBy("reason", "reason_name").count().orderBy(F.desc("count")).collect()
    lines.append("messages by status")
    lines.append(f"  {'status':<14}{'messages':>10}{'bytes':>16}")
    for r in by_status:
        lines.append(f"  {r.status:<14}{r.n:>10}{(r.bytes or 0):>16,}")
    lines.append("quarantined segments by reason")
    lines.append(f"  {'reason':<34}{'segments':>10}")
    for r in by_reason:
        lines.append(f"  {f'{r.reason} {r.reason_name}':<34}{r['count']:>10}")
    if not by_reason:
        lines.append("  (none)")
    mib = input_bytes / (1 << 20)
    lines.append(f"input {mib:,.1f} MiB in {seconds:,.1f} s: {mib / max(seconds, 1e-9):,.1f} MiB/s")
    return "\n".join(lines)


def _input_bytes(paths: Sequence[str]) -> int:
    total = 0
    for p in paths:
        if os.path.isdir(p):
            total += sum(f.stat().st_size for f in Path(p).rglob("*.parquet"))
        else:
            total += os.path.getsize(p)
    return total


def open_job(args: argparse.Namespace, column: str | None) -> tuple[list[str], Path, Any, Any]:
    """Check input and output, start Spark, read the input: (paths, output, session, DataFrame)."""
    paths = _inputs(args.input)
    out = _claim_output(args.output, args.overwrite)
    spark = _session(args)
    try:
        df = spark.read.parquet(*paths)
    except Exception as exc:
        raise JobError(f"cannot read {args.input}: {first_line(exc)}") from None
    if column is not None:
        types = dict(df.dtypes)
        if column not in types:
            raise JobError(f"column {column!r} not in input (columns: {', '.join(df.columns)})")
        if types[column] != "binary":
            raise JobError(f"column {column!r} is {types[column]}, expected binary (encoded segments)")
    return paths, out, spark, df


def run_job(args: argparse.Namespace) -> Path:
    from .spark import ReassemblyOptions, reassemble

    encoded = args.input_format == "encoded"
    paths, out, spark, df = open_job(args, args.raw_column if encoded else None)
    start = time.monotonic()
    with _atomic_dir(out) as tmp, Progress(spark, _progress_on(args)):
        options = ReassemblyOptions(
            max_message_size=args.max_message_size,
            partitions=args.partitions,
            payload_dir=str(tmp / "payloads"),
            large_message_bytes=args.large_message_bytes,
        )
        try:
            result = reassemble(df, encoded=encoded, raw_column=args.raw_column, options=options)
            write_split(result.combined, tmp, {"message": "messages", "quarantine": "quarantine"})
        except Exception as exc:
            raise JobError(f"job failed: {first_line(exc)}") from None
        _tidy_payloads(tmp / "payloads")
    print(summarize(spark, out, _input_bytes(paths), time.monotonic() - start))
    payloads = " " + str(out / "payloads") if (out / "payloads").exists() else ""
    print(f"output: {out}/messages  {out}/quarantine{payloads}")
    return out


def _tidy_payloads(directory: Path) -> None:
    """Drop work files of failed or speculative task attempts; drop the folder if no message needed it."""
    if not directory.exists():
        return
    for leftover in directory.glob(".*"):
        leftover.unlink()
    if not any(directory.iterdir()):
        directory.rmdir()


def _progress_on(args: argparse.Namespace) -> bool:
    return sys.stderr.isatty() if args.progress is None else bool(args.progress)


def first_line(exc: BaseException) -> str:
    """One informative line: for a Java error, its message and root cause, not py4j's call site."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip() and not line.startswith("\t")]
    if not lines:
        return type(exc).__name__
    java = [line[2:] for line in lines if line.startswith(": ")]
    causes = [line.removeprefix("Caused by: ") for line in lines if line.startswith("Caused by: ")]
    head = java[0] if java else lines[0]
    if causes and causes[-1] not in head:
        head = f"{head} (cause: {causes[-1]})"
    return head[:400]


def run_demo(args: argparse.Namespace) -> int:
    from .spark.testdata import generate, write_parquet

    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="reassemble-demo-"))
    base.mkdir(parents=True, exist_ok=True)
    ds = generate(args.messages, args.segments_per_message, args.segment_size)
    landing = write_parquet(ds, base / "landing", files=8)
    print(
        f"demo: {len(ds.expected)} logical messages ({ds.payload_bytes / (1 << 20):.1f} MiB) as {len(ds.rows)} "
        f"segment rows in {landing}, with duplicates, conflicting copies, dropped segments, bit flips in "
        "data and headers, truncated rows, a zstd bomb, garbage rows and an incomplete MQ group"
    )
    args.input, args.output, args.overwrite = str(landing), str(base / "out"), True
    args.input_format, args.raw_column = "encoded", "segment"
    out = run_job(args)
    spark = _session(args)
    rows = spark.read.parquet(str(out / "messages")).collect()
    got = {(bytes(r.group_id), r.msg_seq_number): r for r in rows}

    def payload(row: Any) -> bytes:
        return (out / "payloads" / row.payload_path).read_bytes() if row.payload_path else bytes(row.payload)

    wrong = [
        k
        for k, e in ds.expected.items()
        if k not in got or got[k].status != e.status or (e.payload is not None and payload(got[k]) != e.payload)
    ]
    q = spark.read.parquet(str(out / "quarantine")).count()
    used = sum(r.segments_used for r in rows)
    dups = sum(r.duplicates for r in rows)
    identity = used + q + dups == len(ds.rows)
    print(
        f"check: {len(ds.expected) - len(wrong)}/{len(ds.expected)} messages as expected "
        f"(complete ones byte-identical); segments: {len(ds.rows)} in = {used} used + {q} quarantined + "
        f"{dups} duplicates: {'holds' if identity else 'BROKEN'}"
    )
    if not args.keep:
        shutil.rmtree(base, ignore_errors=True)
    return 0 if not wrong and identity else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "run":
            run_job(args)
            return 0
        if args.command == "demo":
            return run_demo(args)
        if args.command == "stream":
            from .spark.stream_job import run_stream

            return run_stream(args)
        from .refmsg_job import run_refmsg

        return int(run_refmsg(args))
    except (JobError, SegmentationError) as exc:
        print(f"reassemble: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
