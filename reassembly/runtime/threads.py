"""ThreadRunner: handlers on a pool of threads (I/O-bound work: a database write, a service call).

Each worker thread has its own queue (its identity is what the dispatcher's ownership speaks of),
runs the batch it is given in order and posts the batch's results at once: one wake-up of the
control loop per batch, not per message. A handler that sleeps or waits on a socket releases the
GIL, so N threads give N handlers at once; CPU-bound handlers belong in a
:class:`~reassembly.runtime.ProcessRunner`.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import TYPE_CHECKING, Any

from reassembly.dispatcher import Work
from reassembly.runtime.base import Failure, Handler, Result, Runner, RunnerOptions, Source

if TYPE_CHECKING:
    from typing_extensions import Unpack

_STOP = None  # a worker's queue item that ends it


class ThreadCarrier:
    """Worker threads, one queue each, one shared results queue."""

    def __init__(self, handler: Handler, name: str = "dispatch") -> None:
        self.handler = handler
        self.name = name
        self._queues: list[queue.SimpleQueue[list[Work] | None]] = []
        self._threads: list[threading.Thread] = []

    def start(self, workers: int, results: queue.SimpleQueue[Any]) -> None:
        for w in range(workers):
            q: queue.SimpleQueue[list[Work] | None] = queue.SimpleQueue()
            t = threading.Thread(target=self._work, args=(w, q, results), name=f"{self.name}-{w}", daemon=True)
            self._queues.append(q)
            self._threads.append(t)
            t.start()

    def _work(self, w: int, q: queue.SimpleQueue[list[Work] | None], results: queue.SimpleQueue[Any]) -> None:
        handler = self.handler
        clock = time.perf_counter
        while (batch := q.get()) is not _STOP:
            out: list[Result] = []
            started = clock()
            for work in batch:
                try:
                    handler(work.message)
                except BaseException as exc:  # SystemExit in a handler is its failure too
                    out.append((work.ticket, Failure.of(exc)))
                else:
                    out.append((work.ticket, None))
            results.put((w, out, clock() - started))

    def hand(self, worker: int, batch: list[Work]) -> None:
        self._queues[worker].put(batch)

    def gone(self) -> list[tuple[int, int | None]]:
        return []  # a thread does not die of its handler: an exception is a failure

    def shutdown(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for q in self._queues:
            q.put(_STOP)
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))  # a handler still running past the drain: daemon


class ThreadRunner(Runner):
    """Parallel handlers on ``workers`` threads; see :class:`~reassembly.runtime.base.Runner`.

    ``source``: where the messages come from. ``handler``: called with each message, on a worker thread. ``**options``:
    the :class:`~reassembly.runtime.Runner` keywords (workers, ordering, retry, dead letter, budget, clock, metrics,
    drain timeout, prefetch).
    """

    def __init__(
        self,
        source: Source,
        handler: Handler,
        **options: Unpack[RunnerOptions],
    ) -> None:
        super().__init__(
            source,
            ThreadCarrier(handler),
            **options,
        )
