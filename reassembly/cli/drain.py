"""``reassemble drain URL QUEUE LANDING-DIR``: land segments from a broker queue (AMQP or STOMP) as Parquet files.

The subcommand's parsing and signals; the drain itself is :class:`reassembly.brokers.drain.Drain`
(what lands, when a file rolls, why a crash loses nothing).
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reassembly._plumbing import on_interrupt
from reassembly.brokers.drain import Drain, Rolling
from reassembly.cli._common import at_least

if TYPE_CHECKING:
    from reassembly.cli._common import Subparsers


def add_parser(sub: Subparsers) -> argparse.ArgumentParser:
    """The ``drain`` subcommand."""
    p = sub.add_parser("drain", help="land segments from a broker queue as Parquet files (AMQP or STOMP)")
    p.add_argument("url", help="broker URL: amqp://host:5672 or stomp://host:61613")
    p.add_argument("queue", help="queue to drain")
    p.add_argument("landing", help="directory the Parquet files appear in (what `reassemble run` reads)")
    p.add_argument("--max-file-bytes", type=at_least(1), default=128 << 20, help="roll after this many bytes")
    p.add_argument("--max-file-seconds", type=float, default=60.0, help="roll a file this old (default 60)")
    p.add_argument(
        "--prefetch", type=at_least(1), default=1000, help="deliveries in flight; also the segments per file cap"
    )
    p.add_argument("--idle-exit", type=float, default=None, help="exit after this many seconds with nothing received")
    return p


def run(args: argparse.Namespace) -> int:
    """Drain until stopped: Ctrl-C or SIGTERM finishes and publishes the current file, then exits 0.

    A second signal is the command's interrupt (exit 130): the open file is abandoned, and its
    segments, never acknowledged, are redelivered.
    """
    from segmenter.brokers import open_consumer

    stopping: list[int] = []

    def on_signal(signum: int, frame: Any) -> None:
        if stopping:
            on_interrupt(signum, frame)  # raises KeyboardInterrupt: the open file is abandoned
        stopping.append(signum)
        print("reassemble drain: finishing the current file (Ctrl-C again to abandon it)", file=sys.stderr)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    rolling = Rolling(args.max_file_bytes, args.max_file_seconds, args.prefetch)
    drain = Drain(open_consumer(args.url, args.queue, prefetch=args.prefetch), Path(args.landing), rolling)

    def landed(path: Path, n: int) -> None:
        print(f"reassemble drain: {path.name}: {n} segments", file=sys.stderr)

    drain.on_file = landed
    try:
        st = drain.run(lambda: bool(stopping), idle_exit=args.idle_exit)
    finally:
        drain.close()
        for s, h in old.items():
            signal.signal(s, h)
    print(f"drained {st.segments} segments ({st.bytes / (1 << 20):.1f} MiB, {st.redelivered} redelivered) "
          f"into {st.files} files in {args.landing}")  # fmt: skip
    return 0
