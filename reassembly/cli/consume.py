"""``reassemble consume URL TOPIC --handler MODULE:FUNCTION``: whole messages to parallel handlers.

A consumer service in one command: segments are read from a Kafka topic (``kafka://`` URL, with a
consumer ``--group``) or an AMQP/STOMP queue (``amqp://``, ``stomp://``), reassembled, and each whole
message is given to ``--workers`` handlers at once by the group dispatcher
(:mod:`reassembly.dispatcher`, :mod:`reassembly.runtime`): a group's messages one at a time and in
order, a failing one retried with backoff and then written to ``--dead-letter``, the offsets
committed never past a message not yet handled. The handler is a plain function taking the
delivered message (``MessageComplete``, or ``GroupComplete`` in unit-of-work mode); raising means
failure. docs/how-to/parallel.md describes the command.

With ``--share`` the command is one competing consumer of a Kafka share group (or of an AMQP/STOMP
queue read without message groups): the segments of a message may reach any member, each member
writes what it receives to the shared segment store ``--store`` (SQLite on one host, PostgreSQL
across hosts), and whichever member completes a message hands it to its handlers
(:mod:`reassembly.brokers.share_dispatch`; docs/how-to/competing-consumers.md).

SIGTERM or Ctrl-C drains: nothing new is handed out, the messages in flight finish within
``--drain-timeout``, the safe offsets are committed, and the command exits 0. A second signal stops
at once (exit 130): what was in flight is handled again by the group's next consumer.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from reassembly._errors import UsageError, counted, first_line
from reassembly._processes import on_interrupt
from reassembly.cli._common import at_least, seconds, summary_file

if TYPE_CHECKING:
    from reassembly.brokers.kafka_dispatch import CommitNote
    from reassembly.cli._common import Subparsers
    from reassembly.runtime.base import DeadLetter, Handler, Runner, Source

SCHEMES = ("kafka", "amqp", "amqps", "stomp")


def _size(text: str) -> int:
    """``1048576``, ``64k``, ``256m``, ``2g`` (KiB, MiB, GiB) -> bytes."""
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(t[-1:], 1)
    digits = t[:-1] if mult > 1 else t
    try:
        value = int(digits)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 1048576, 64k, 256m, 2g)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value * mult


def _handler_ref(text: str) -> str:
    module, sep, function = text.partition(":")
    if not sep or not module.strip() or not function.strip():
        raise argparse.ArgumentTypeError(f"expected MODULE:FUNCTION, got {text!r}")
    return text


def _pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def add_parser(sub: Subparsers) -> argparse.ArgumentParser:
    """The ``consume`` subcommand."""
    p = sub.add_parser(
        "consume",
        help="reassemble from Kafka, AMQP or STOMP and hand whole messages to parallel handlers",
        description="Reassemble segments from a Kafka topic or a broker queue and hand each whole message to a "
        "handler function, --workers at once: a group's messages one at a time and in order, failures retried "
        "then dead-lettered, offsets committed never past a message not yet handled. SIGTERM or Ctrl-C drains "
        "and exits 0.",
    )
    p.add_argument("url", help="kafka://HOST:PORT[,HOST:PORT], amqp://HOST:PORT or stomp://HOST:PORT")
    p.add_argument("topic", help="the Kafka topic (or the broker queue) to consume")
    p.add_argument(
        "--handler",
        required=True,
        type=_handler_ref,
        metavar="MODULE:FUNCTION",
        help="the function each whole message is given to (importable; raising means failure; an async def "
        "for --runner asyncio)",
    )
    p.add_argument("--group", default=None, help="Kafka consumer group id, or share group id with --share "
                   "(required for kafka:// URLs)")  # fmt: skip
    p.add_argument(
        "--share",
        action="store_true",
        help="be one competing consumer of a Kafka share group (or of a queue without message groups): "
        "segments go through the shared segment store --store, and whichever member completes a message "
        "hands it on",
    )
    p.add_argument(
        "--store",
        metavar="URL",
        default=None,
        help="with --share: the shared segment store, sqlite:///PATH (processes on one host) or "
        "postgresql://... (every member names the same one)",
    )
    p.add_argument("--member", default=None, help="with --share: this member's name in the store's claims and "
                   "counters, unique among live members (default HOST-PID)")  # fmt: skip
    p.add_argument(
        "--lease",
        type=seconds,
        default="30s",
        help="with --share: how long a claim stays this member's without a renewal (renewed every third of it "
        "while held) before another member takes the message over (default %(default)s)",
    )
    p.add_argument(
        "--delivery-limit",
        type=at_least(2),
        default=5,
        help="with --share on Kafka: the share group's share.delivery.count.limit; a record delivered that "
        "often is quarantined in the store and rejected (default %(default)s)",
    )
    p.add_argument("--workers", type=at_least(1), default=8, help="handlers running at once (default %(default)s)")
    p.add_argument(
        "--ordering",
        choices=("group", "key", "partition", "unordered"),
        default="group",
        help="what runs one at a time, in order: group: an MQ group's messages (a message outside one alone); "
        "key: messages with one Kafka record key (the broker group on a queue); partition: a partition's "
        "messages; unordered: nothing (default %(default)s)",
    )
    p.add_argument(
        "--unit-of-work",
        action="store_true",
        help="hand over an MQ group as one GroupComplete once all its messages are in (default: each message "
        "as it completes, a group's messages in order)",
    )
    p.add_argument(
        "--runner",
        choices=("threads", "asyncio", "processes"),
        default="threads",
        help="threads (I/O-bound handlers), asyncio (async def handlers), processes (CPU-bound handlers) "
        "(default %(default)s)",
    )
    p.add_argument(
        "--max-attempts",
        type=at_least(1),
        default=5,
        help="attempts per message before it goes to the dead letter (default %(default)s)",
    )
    p.add_argument(
        "--retry-delay",
        type=seconds,
        default="500ms",
        help="the first retry's delay; it doubles per attempt, with jitter (default %(default)s)",
    )
    p.add_argument(
        "--retry-max-delay", type=seconds, default="1m", help="the longest delay between attempts (default %(default)s)"
    )
    p.add_argument(
        "--dead-letter",
        metavar="DIR|kafka://HOST:PORT/TOPIC",
        default=None,
        help="where a message goes after its last failed attempt: a directory (Parquet files, like the "
        "quarantine) or a Kafka topic written segmented (default: none, logged at ERROR and settled)",
    )
    p.add_argument(
        "--after-dead",
        choices=("continue", "hold"),
        default="continue",
        help="after a dead message, its group's next messages go on (continue) or wait for an operator "
        "(hold) (default %(default)s)",
    )
    p.add_argument(
        "--budget-messages",
        type=at_least(1),
        default=10_000,
        help="messages held at most (waiting and in flight); fetching pauses above (default %(default)s)",
    )
    p.add_argument(
        "--budget-bytes",
        type=_size,
        default="256m",
        help="bytes held at most (segments in assembly, messages waiting and in flight); fetching pauses "
        "above (default %(default)s)",
    )
    p.add_argument(
        "--idle-exit",
        type=seconds,
        default=None,
        metavar="SECONDS",
        help="exit 0 after this long with nothing fetched and nothing held (default: run until stopped)",
    )
    p.add_argument("--drain-timeout", type=seconds, default="30s", help="how long a drain waits for handlers "
                   "in flight (default %(default)s)")  # fmt: skip
    p.add_argument(
        "--commit-interval", type=seconds, default="5s", help="Kafka: seconds between commits (default %(default)s)"
    )
    p.add_argument(
        "--commit-log",
        metavar="FILE",
        default=None,
        help="Kafka: append one JSON line per partition commit to FILE before it is sent, and one more with "
        "\"refused\" (the error) when the cluster refuses it (an audit of what was committed when; default: none)",
    )
    p.add_argument(
        "-X",
        "--kafka-config",
        type=_pair,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a librdkafka consumer setting (repeatable): security.protocol, sasl.*, session.timeout.ms, ...",
    )
    p.add_argument(
        "--prefetch",
        type=at_least(2),
        default=1000,
        help="amqp/stomp: deliveries the broker sends ahead; must exceed the segments of the messages held at "
        "once (default %(default)s)",
    )
    p.add_argument("--metrics-port", type=at_least(0), default=None, help="serve Prometheus metrics on "
                   "127.0.0.1:PORT (0: any free port; needs prometheus_client)")  # fmt: skip
    p.add_argument(
        "--summary-json",
        metavar="FILE",
        type=summary_file,
        default=None,
        help="also write the run's summary as JSON to FILE (replaced atomically; written on failure too)",
    )
    p.add_argument("--verbose", action="store_true", help="INFO logs and Python tracebacks")
    return p


def check_handler(args: argparse.Namespace, handler: Handler) -> None:
    """An ``async def`` handler for ``--runner asyncio``, a plain function for the others."""
    is_async = inspect.iscoroutinefunction(handler)
    if args.runner == "asyncio" and not is_async:
        raise UsageError(f"--runner asyncio needs an async def handler; {args.handler} is a plain function")
    if args.runner != "asyncio" and is_async:
        raise UsageError(f"--handler {args.handler} is an async def: use --runner asyncio")


def load_handler(ref: str) -> Handler:
    """``MODULE:FUNCTION`` imported; a UsageError (exit 2) naming what is wrong."""
    module_name, _, name = ref.partition(":")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # a handler beside the caller, as `python -m` would find it
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"--handler {ref}: cannot import {module_name}: {first_line(exc)}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise UsageError(f"--handler {ref}: {module_name} has no function {name}")
    handler: Handler = fn
    return handler


def _kafka_config(args: argparse.Namespace) -> dict[str, str]:
    from reassembly.brokers.kafka import bootstrap_servers
    from segmenter.errors import SegmentationError

    try:
        servers = bootstrap_servers(args.url)
    except SegmentationError as exc:
        raise UsageError(str(exc)) from None
    if not args.group:
        raise UsageError("--group is required for a kafka:// URL (the consumer group whose offsets are committed)")
    conf = {"bootstrap.servers": servers, "group.id": args.group}
    for key, value in args.kafka_config:
        if key in ("enable.auto.commit", "enable.auto.offset.store") and value.lower() in ("true", "1"):
            raise UsageError(f"-X {key}=true would commit offsets past messages not yet handled")
        if key in ("bootstrap.servers", "group.id"):
            raise UsageError(f"-X {key}: give it as the URL or --group")
        conf[key] = value
    return conf


def _dead_letter(spec: str | None) -> DeadLetter | None:
    if spec is None:
        return None
    if spec.startswith("kafka://"):
        from reassembly.brokers.kafka import bootstrap_servers
        from reassembly.runtime.deadletter import KafkaDeadLetter
        from segmenter.errors import SegmentationError

        parts = urlsplit(spec)
        topic = parts.path.strip("/")
        if not topic or "/" in topic:
            raise UsageError(f"--dead-letter {spec}: a Kafka dead letter is kafka://HOST:PORT[,HOST:PORT]/TOPIC")
        try:
            servers = bootstrap_servers(f"kafka://{parts.netloc}")
        except SegmentationError as exc:
            raise UsageError(f"--dead-letter: {exc}") from None
        return KafkaDeadLetter({"bootstrap.servers": servers}, topic)
    if "://" in spec:
        raise UsageError(f"--dead-letter {spec}: a directory or kafka://HOST:PORT/TOPIC")
    from reassembly.runtime.deadletter import ParquetDeadLetter

    return ParquetDeadLetter(Path(spec))


class _CommitLog:
    """``--commit-log``: one JSON line per partition commit, appended (``O_APPEND``) before it is sent,
    and the same line again with ``refused`` (the error) when the cluster refused it."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def __call__(self, note: CommitNote) -> None:
        line = {"time": time.time(), "pid": os.getpid(), **dataclasses.asdict(note)}
        os.write(self.fd, (json.dumps(line) + "\n").encode())

    def close(self) -> None:
        os.close(self.fd)


def _member_name(args: argparse.Namespace) -> str:
    import socket

    return str(args.member or f"{socket.gethostname()}-{os.getpid()}")


def _share_source(args: argparse.Namespace, kafka: dict[str, str] | None) -> Source:
    """``--share``: a member of a share group (or a competing consumer of a queue) over the store."""
    from reassembly.brokers.share_dispatch import ON_MESSAGE, ShareDispatchSource
    from reassembly.segstore import open_store

    store = open_store(args.store, member=_member_name(args), lease_seconds=args.lease,
                       unit_of_work=args.unit_of_work)  # fmt: skip
    try:
        if kafka is not None:
            from reassembly.brokers.share import ShareGroupReceiver

            receiver: Any = ShareGroupReceiver(kafka, [args.topic], store, ON_MESSAGE,
                                               delivery_limit=args.delivery_limit)  # fmt: skip
        else:
            from reassembly.brokers.competing import CompetingReceiver
            from segmenter.brokers import open_consumer

            receiver = CompetingReceiver(open_consumer(args.url, args.topic, prefetch=args.prefetch), store, ON_MESSAGE)
    except BaseException:
        store.close()
        raise
    return ShareDispatchSource(receiver, store)


def _source(args: argparse.Namespace, kafka: dict[str, str] | None, commit_log: _CommitLog | None) -> Source:
    if args.share:
        return _share_source(args, kafka)
    if kafka is not None:
        from reassembly.brokers.kafka_dispatch import KafkaDispatchSource

        return KafkaDispatchSource(kafka, [args.topic], on_commit=commit_log, budget_bytes=args.budget_bytes,
                                   unit_of_work=args.unit_of_work)  # fmt: skip
    from reassembly.brokers.receiver_dispatch import BrokerDispatchSource
    from segmenter.brokers import open_consumer

    consumer = open_consumer(args.url, args.topic, prefetch=args.prefetch)
    return BrokerDispatchSource(consumer, unit_of_work=args.unit_of_work)


def _runner(args: argparse.Namespace, source: Source, handler: Handler, dead: DeadLetter | None) -> Runner:
    from reassembly.dispatcher import AfterDead, Budget, Ordering, RetryPolicy
    from reassembly.runtime.metrics import Metrics

    options: dict[str, Any] = {
        "workers": args.workers,
        "ordering": Ordering(args.ordering),
        "retry": RetryPolicy(max_attempts=args.max_attempts, base=args.retry_delay, cap=args.retry_max_delay),
        "after_dead": AfterDead(args.after_dead),
        "dead_letter": dead,
        "budget": Budget(args.budget_messages, args.budget_bytes),
        "metrics": Metrics(port=args.metrics_port),
        "drain_timeout": args.drain_timeout,
        "commit_interval": args.commit_interval,
    }
    if args.runner == "asyncio":
        from reassembly.runtime.aio import AsyncRunner

        return AsyncRunner(source, handler, **options)  # type: ignore[arg-type]  # checked: an async def
    if args.runner == "processes":
        from reassembly.runtime.processes import ProcessRunner

        runner: Runner = ProcessRunner(source, handler, **options)
        return runner
    from reassembly.runtime.threads import ThreadRunner

    threads: Runner = ThreadRunner(source, handler, **options)
    return threads


def check_args(args: argparse.Namespace) -> str:
    """The URL's scheme, or a one-line usage error; touches nothing."""
    scheme = str(urlsplit(args.url).scheme)
    if scheme not in SCHEMES:
        raise UsageError(f"unknown URL scheme in {args.url!r} (kafka://, amqp://, amqps://, stomp://)")
    if scheme != "kafka":
        given = [o for o, v in (("--group", args.group), ("-X", args.kafka_config), ("--commit-log", args.commit_log))
                 if v]  # fmt: skip
        if given:
            raise UsageError(f"{', '.join(given)}: for kafka:// URLs only")
    if args.ordering == "partition" and (scheme != "kafka" or args.share):
        raise UsageError("--ordering partition: a queue or a share group has no partitions (use group, key or "
                         "unordered)")  # fmt: skip
    share_only = [o for o, v in (("--store", args.store), ("--member", args.member)) if v]
    if args.share:
        if not args.store:
            raise UsageError("--share needs --store URL (sqlite:///PATH or postgresql://...): the segment store "
                             "every member shares")  # fmt: skip
        if args.commit_log:
            raise UsageError("--commit-log: a share group commits no offsets (each record is acknowledged)")
    elif share_only:
        raise UsageError(f"{', '.join(share_only)}: with --share only")
    return scheme


def run(args: argparse.Namespace) -> int:
    """Consume until stopped (or ``--idle-exit``); 0 after a drain."""
    scheme = check_args(args)
    kafka = _kafka_config(args) if scheme == "kafka" else None
    handler = load_handler(args.handler)
    check_handler(args, handler)
    dead = _dead_letter(args.dead_letter)
    commit_log = _CommitLog(args.commit_log) if args.commit_log else None
    source: Source | None = None
    try:
        source = _source(args, kafka, commit_log)
        runner = _runner(args, source, handler, dead)
        bind = getattr(source, "bind", None)
        if bind is not None:
            bind(runner.dispatcher)
        stopping: list[int] = []

        def on_signal(signum: int, frame: Any) -> None:
            if stopping:
                on_interrupt(signum, frame)  # raises KeyboardInterrupt: stop at once (exit 130)
            stopping.append(signum)
            runner.stop()
            print("reassemble consume: draining (Ctrl-C again to stop at once)", file=sys.stderr)

        main_thread = threading.current_thread() is threading.main_thread()
        old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)} if main_thread else {}
        try:
            summary = runner.run(idle_exit=args.idle_exit)
        finally:
            for s, h in old.items():
                signal.signal(s, h)
        _record(args, runner, source, summary, "signal" if stopping else "idle")
        print(f"consumed {counted(summary.offered, 'message')}: {summary.done} handled, {summary.dead} dead-lettered, "
              f"{counted(summary.retries, 'retry', 'retries')}, {summary.unfinished} left unfinished")  # fmt: skip
    finally:
        try:
            if source is not None:
                source.close()
        finally:
            if dead is not None:
                dead.close()
            if commit_log is not None:
                commit_log.close()
    return 0


def _counts(stats: object) -> dict[str, Any] | None:
    if stats is None or not dataclasses.is_dataclass(stats) or isinstance(stats, type):
        return None
    return dataclasses.asdict(stats)


def _record(args: argparse.Namespace, runner: Runner, source: Source, summary: Any, stopped: str) -> None:
    """The ``consume`` section of ``--summary-json``: the runner's summary, the last gauges, the source's counts."""
    gauges = runner.metrics.latest
    if gauges is not None:
        gauges = dataclasses.replace(gauges, commit_lag={})
    st = getattr(source, "stats", None)
    fields: dict[str, Any] = {
        "url": args.url,
        "topic": args.topic,
        "group": args.group,
        "workers": args.workers,
        "ordering": args.ordering,
        "runner": args.runner,
        "share": args.share,
        "stopped": stopped,
        "summary": dataclasses.asdict(summary),
        "budget": {"messages": args.budget_messages, "bytes": args.budget_bytes},
        "gauges": None if gauges is None else {k: v for k, v in dataclasses.asdict(gauges).items() },
        "source": _counts(st),
    }
    if args.share:  # the store as every member sees it: units held, leases, counters summed over members
        from reassembly.brokers.share_dispatch import ShareDispatchSource

        if isinstance(source, ShareDispatchSource):
            fields["store"] = source.store.stats().as_dict(time.time())
    loop = getattr(source, "loop", None)  # Kafka: the consumer loop's own counts (records, skipped, ...)
    if loop is not None:
        fields["loop"] = _counts(loop.stats)
    args.record.fields["consume"] = fields
