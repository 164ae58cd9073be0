"""Runners: whole messages handled in parallel by threads, asyncio tasks or processes.

The :class:`~reassembly.dispatcher.Dispatcher` (sans-I/O) decides who may take what; a runner
carries its decisions out: ``base`` holds the control loop the three share (the only caller of
the dispatcher and of the :class:`Source`), ``contracts`` the shapes of what the loop meets
(source, carrier, dead letter), ``threads``, ``aio`` and ``processes`` the carriers,
``sources`` the :class:`IterableSource` (any iterable of messages or segments), ``deadletter``
where messages go after their last attempt, ``metrics`` the gauges, log line and Prometheus
endpoint.
"""

from reassembly.runtime.aio import AsyncRunner
from reassembly.runtime.base import (
    DeadLetter,
    DeadRecord,
    Failure,
    Offered,
    Runner,
    RunSummary,
    Source,
    stop_on_signals,
)
from reassembly.runtime.deadletter import KafkaDeadLetter, ParquetDeadLetter, read_dead_letters
from reassembly.runtime.metrics import Gauges, Metrics
from reassembly.runtime.processes import ProcessRunner
from reassembly.runtime.sources import IterableSource
from reassembly.runtime.threads import ThreadRunner

__all__ = [
    "AsyncRunner",
    "DeadLetter",
    "DeadRecord",
    "Failure",
    "Gauges",
    "IterableSource",
    "KafkaDeadLetter",
    "Metrics",
    "Offered",
    "ParquetDeadLetter",
    "ProcessRunner",
    "RunSummary",
    "Runner",
    "Source",
    "ThreadRunner",
    "read_dead_letters",
    "stop_on_signals",
]
