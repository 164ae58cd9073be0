"""``reassemble drain URL QUEUE LANDING-DIR``: land segments from a broker queue (AMQP or STOMP) or a
Kafka topic as Parquet files.

The subcommand's parsing and signals; the drain itself is :class:`reassembly.brokers.drain.Drain`
(what lands, when a file rolls, why a crash loses nothing), fed by a broker consumer or, for a
``kafka://`` URL, by :class:`reassembly.brokers.kafka.KafkaSource` (offsets committed once a file
is durable).
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reassembly._errors import UsageError, counted
from reassembly._processes import on_interrupt
from reassembly.brokers.drain import BROKER_LANDING, KAFKA_LANDING, Drain, Rolling
from reassembly.cli._common import at_least

if TYPE_CHECKING:
    from reassembly.cli._common import Subparsers


def add_parser(sub: Subparsers) -> argparse.ArgumentParser:
    """The ``drain`` subcommand."""
    p = sub.add_parser("drain", help="land segments from a broker queue or a Kafka topic as Parquet files")
    p.add_argument("url", help="broker URL: amqp://host:5672, stomp://host:61613 or kafka://host:9092[,host:9092]")
    p.add_argument("queue", help="queue (or Kafka topic) to drain")
    p.add_argument("landing", help="directory the Parquet files appear in (what `reassemble run` reads)")
    p.add_argument("--max-file-bytes", type=at_least(1), default=128 << 20, help="roll after this many bytes")
    p.add_argument("--max-file-seconds", type=float, default=60.0, help="roll a file this old (default 60)")
    p.add_argument(
        "--prefetch", type=at_least(1), default=1000, help="deliveries in flight; also the segments per file cap"
    )
    p.add_argument("--idle-exit", type=float, default=None, help="exit after this many seconds with nothing received")
    k = p.add_argument_group("Kafka (kafka:// URLs only)")
    k.add_argument("--group", default=None, help="consumer group id (default reassemble-drain-TOPIC)")
    k.add_argument(
        "--kafka-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a librdkafka consumer setting (repeatable): security.protocol, sasl.*, session.timeout.ms, ...",
    )
    return p


def _kafka_config(args: argparse.Namespace) -> dict[str, str]:
    """The consumer settings of a ``kafka://`` drain; a UsageError (exit 2) for a malformed one."""
    from reassembly.brokers.kafka import bootstrap_servers
    from segmenter.errors import SegmentationError

    try:
        servers = bootstrap_servers(args.url)
    except SegmentationError as exc:
        raise UsageError(str(exc)) from None
    conf = {"bootstrap.servers": servers, "group.id": args.group or f"reassemble-drain-{args.queue}"}
    for item in args.kafka_option:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise UsageError(f"--kafka-option wants KEY=VALUE, not {item!r}")
        if key.strip() in ("enable.auto.commit", "enable.auto.offset.store") and value.strip().lower() in ("true", "1"):
            raise UsageError(f"--kafka-option {key}=true would commit records before their file is durable")
        if key.strip() in ("bootstrap.servers", "group.id"):
            raise UsageError(f"--kafka-option {key}: give it as the URL or --group")
        conf[key.strip()] = value.strip()
    return conf


def run(args: argparse.Namespace) -> int:
    """Drain until stopped: Ctrl-C or SIGTERM finishes and publishes the current file, then exits 0.

    A second signal is the command's interrupt (exit 130): the open file is abandoned, and its
    segments, never acknowledged, are redelivered.
    """
    from segmenter.brokers import Consumer, open_consumer

    kafka = args.url.startswith("kafka://")
    if not kafka and (args.group is not None or args.kafka_option):
        raise UsageError("--group and --kafka-option are for kafka:// URLs")
    source: Consumer
    kafka_source = None
    if kafka:
        from reassembly.brokers.kafka import KafkaSource

        source = kafka_source = KafkaSource(_kafka_config(args), args.queue, prefetch=args.prefetch)
    else:
        source = open_consumer(args.url, args.queue, prefetch=args.prefetch)
    stopping: list[int] = []

    def on_signal(signum: int, frame: Any) -> None:
        if stopping:
            on_interrupt(signum, frame)  # raises KeyboardInterrupt: the open file is abandoned
        stopping.append(signum)
        print("reassemble drain: finishing the current file (Ctrl-C again to abandon it)", file=sys.stderr)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    rolling = Rolling(args.max_file_bytes, args.max_file_seconds, args.prefetch)
    drain = Drain(source, Path(args.landing), rolling, columns=KAFKA_LANDING if kafka else BROKER_LANDING)
    if kafka_source is not None:
        kafka_source.before_revoke = drain.publish  # a rebalance: what was read lands and is committed first

    def landed(path: Path, n: int) -> None:
        print(f"reassemble drain: {path.name}: {counted(n, 'segment')}", file=sys.stderr)

    drain.on_file = landed
    try:
        st = drain.run(lambda: bool(stopping), idle_exit=args.idle_exit)
    finally:
        drain.close()
        for s, h in old.items():
            signal.signal(s, h)
    print(f"drained {counted(st.segments, 'segment')} ({st.bytes / (1 << 20):.1f} MiB, {st.redelivered} redelivered) "
          f"into {counted(st.files, 'file')} in {args.landing}")  # fmt: skip
    return 0
