"""What a runner holds and did, made visible: gauges and counters, a log line, a Prometheus endpoint.

The control loop is the only reader of the dispatcher, so it *publishes*: every
``publish_interval`` seconds (and when the run ends) it computes a :class:`Gauges` record and
stores it here; the log line (INFO, every ``log_interval`` seconds) and the Prometheus endpoint
read the last record published, never the dispatcher itself (the endpoint serves from its own
thread). Counters (handled, retries, dead letters) are kept as they happen.

Gauges: groups held and owned (and on hold), messages and bytes held (the bytes include the
segments in assembly), messages in flight, the oldest unsettled message's age, fetch paused, and
the commit lag per partition when the source reports it (a ``commit_lag()`` method returning
``{partition: records between the committed offset and the log end}``).

The endpoint (``port``) needs ``prometheus_client``: the extra ``segment-reassembly[metrics]``;
it is imported only when a port is given.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from reassembly.dispatcher import Dispatcher
from segmenter.errors import Reason, SegmentationError

log = logging.getLogger("reassembly.runtime")

INSTALL = "pip install 'segment-reassembly[metrics]'"


@dataclass(frozen=True)
class Gauges:
    """One published reading of a runner."""

    at: float
    """When the reading was taken, by the runner's clock (seconds)."""
    groups: int
    """Groups with something held, or on hold."""
    groups_owned: int
    """Groups a worker holds now."""
    groups_on_hold: int
    """Groups waiting for ``release()`` after a dead message."""
    held_messages: int
    """Messages held: queued, retrying, on hold and in flight."""
    held_bytes: int
    """Bytes held: the messages held and the segments in assembly."""
    in_flight: int
    """Messages handed to workers and not settled."""
    oldest_age: float | None
    """Seconds since the oldest unsettled message was offered."""
    fetch_paused: bool
    """True while fetching is paused because the budget is full."""
    commit_lag: Mapping[Hashable, int] = field(default_factory=dict)
    """Records between the committed offset and the log end, per partition, when the source reports it."""


class Runner(Protocol):
    """What the metrics read of a runner (:class:`reassembly.runtime.base.Runner`), from its loop."""

    dispatcher: Dispatcher
    source: Any
    clock: Callable[[], float]
    summary: Any

    @property
    def fetch_paused(self) -> bool: ...


class Metrics:
    """Counters and gauges of one runner; ``port``: serve them to Prometheus on ``addr:port``.

    ``log_interval``: seconds between log lines of the gauges. ``publish_interval``: seconds between readings of the
    runner (what the Prometheus endpoint serves). ``addr``: the address the endpoint listens on.
    """

    def __init__(
        self,
        *,
        log_interval: float = 30.0,
        publish_interval: float = 1.0,
        port: int | None = None,
        addr: str = "127.0.0.1",
    ) -> None:
        self.log_interval = log_interval
        self.publish_interval = publish_interval
        self.port = port
        self.addr = addr
        self.handled = 0
        self.retries = 0
        self.dead_letters = 0
        self.handle_seconds = 0.0  # hand-out to settlement, summed over handled messages
        self.latest: Gauges | None = None
        self._published = float("-inf")
        self._logged = float("-inf")
        self._server: Any = None
        self.bound_port: int | None = None

    # ------------------------------------------------------------------ from the loop
    def handled_one(self, seconds: float) -> None:
        self.handled += 1
        self.handle_seconds += seconds

    def retried(self) -> None:
        self.retries += 1

    def dead(self) -> None:
        self.dead_letters += 1

    def started(self, runner: Runner) -> None:
        if self.port is not None and self._server is None:
            self._serve()
        self.tick(runner, runner.clock(), force=True)

    def finished(self, runner: Runner) -> None:
        self.tick(runner, runner.clock(), force=True)
        s = runner.summary
        log.info(
            "runner finished: %d offered, %d done, %d dead, %d retries, %d fenced, %d commits, %d unfinished",
            s.offered,
            s.done,
            s.dead,
            s.retries,
            s.fenced,
            s.commits,
            s.unfinished,
        )
        self.close()

    def tick(self, runner: Runner, now: float, *, force: bool = False) -> None:
        """Publish (and log) when due: called by the loop once per turn, cheap when not due.

        ``runner``: the runner read. ``now``: its clock's time. ``force``: True publishes and logs now, whatever the
        intervals.
        """
        if not force and now - self._published < self.publish_interval:
            return
        self._published = now
        self.latest = g = self.read(runner, now)
        if force or now - self._logged >= self.log_interval:
            self._logged = now
            log.info(
                "held: %d groups (%d owned, %d on hold), %d messages, %d bytes, %d in flight, oldest %s;"
                " handled %d, retries %d, dead letters %d%s",
                g.groups,
                g.groups_owned,
                g.groups_on_hold,
                g.held_messages,
                g.held_bytes,
                g.in_flight,
                "-" if g.oldest_age is None else f"{g.oldest_age:.1f} s",
                self.handled,
                self.retries,
                self.dead_letters,
                "; fetch paused" if g.fetch_paused else "",
            )

    @staticmethod
    def read(runner: Runner, now: float) -> Gauges:
        """The gauges of ``runner`` now (from the loop's thread: it reads the dispatcher).

        ``now``: the runner clock's time, to age the oldest held group.
        """
        d = runner.dispatcher
        st = d.stats
        oldest = min((g.oldest_offer for g in d.groups() if g.oldest_offer is not None), default=None)
        lag_of = getattr(runner.source, "commit_lag", None)
        lag: Mapping[Hashable, int] = dict(lag_of()) if callable(lag_of) else {}
        return Gauges(
            at=now,
            groups=st.groups,
            groups_owned=st.groups_owned,
            groups_on_hold=st.groups_on_hold,
            held_messages=st.held_messages,
            held_bytes=st.held_bytes + runner.source.held_bytes(),
            in_flight=st.in_flight,
            oldest_age=None if oldest is None else max(0.0, now - oldest),
            fetch_paused=runner.fetch_paused,
            commit_lag=lag,
        )

    # ------------------------------------------------------------------ Prometheus
    def _serve(self) -> None:
        try:
            import prometheus_client
            from prometheus_client.registry import CollectorRegistry
        except ImportError:
            raise SegmentationError(
                f"the metrics endpoint needs prometheus_client: {INSTALL}", reason=Reason.ENVIRONMENT_ERROR
            ) from None
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(self))  # type: ignore[arg-type]
        assert self.port is not None
        server, _thread = prometheus_client.start_http_server(self.port, addr=self.addr, registry=registry)
        self._server = server
        self.bound_port = int(server.server_address[1])
        log.info("metrics on http://%s:%d/metrics", self.addr, self.bound_port)

    def close(self) -> None:
        """Stop the endpoint (if any)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()


class _Collector:
    """Prometheus reads the last published gauges and the counters (from its own thread)."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        m = self.metrics
        yield CounterMetricFamily("reassembly_dispatch_handled", "messages handled (settled done)", value=m.handled)
        yield CounterMetricFamily("reassembly_dispatch_retries", "failed attempts retried", value=m.retries)
        yield CounterMetricFamily("reassembly_dispatch_dead_letters", "messages dead-lettered", value=m.dead_letters)
        g = m.latest
        if g is None:
            return
        for name, doc, value in (
            ("groups_held", "groups with messages held", g.groups),
            ("groups_owned", "groups a worker holds", g.groups_owned),
            ("groups_on_hold", "groups waiting for release after a dead message", g.groups_on_hold),
            ("held_messages", "messages held: queued, retrying, in flight", g.held_messages),
            ("held_bytes", "bytes held: messages and segments in assembly", g.held_bytes),
            ("in_flight", "messages handed to workers, not settled", g.in_flight),
            ("oldest_unsettled_seconds", "age of the oldest unsettled message", g.oldest_age or 0.0),
            ("fetch_paused", "1 while fetching is paused by the budget", int(g.fetch_paused)),
        ):
            yield GaugeMetricFamily(f"reassembly_dispatch_{name}", doc, value=value)
        lag = GaugeMetricFamily("reassembly_dispatch_commit_lag", "records past the commit", labels=["partition"])
        for p, v in g.commit_lag.items():
            lag.add_metric([str(p)], v)
        yield lag
