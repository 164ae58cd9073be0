"""AsyncRunner: ``async def`` handlers, N worker tasks on one asyncio event loop.

The decision: the event loop runs in a thread of its own and the control loop (the only caller
of the Dispatcher and the Source) stays in the calling thread, as in the other runners. The
source's fetch blocks (librdkafka's poll, a broker receiver's wait) and so never runs on the event
loop: no executor round trip per fetch, no fetch with a zero timeout spinning, and the handlers'
loop is never stalled by a fetch. Work reaches a worker task through its own ``asyncio.Queue``
(``call_soon_threadsafe``, one wake-up per batch); results come back on the runner's results queue.

A handler that blocks the event loop (CPU work, a synchronous client) stalls every task on it:
use a :class:`~reassembly.runtime.ThreadRunner` or :class:`~reassembly.runtime.ProcessRunner`.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from reassembly.dispatcher import Work
from reassembly.runtime.base import Failure, Result, Runner, RunnerOptions, Source

if TYPE_CHECKING:
    from typing_extensions import Unpack

AsyncHandler = Callable[[Any], Awaitable[object]]


class AsyncCarrier:
    """N tasks on an event loop in its own thread."""

    def __init__(self, handler: AsyncHandler) -> None:
        self.handler = handler
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queues: list[asyncio.Queue[list[Work] | None]] = []
        self._thread: threading.Thread | None = None

    def start(self, workers: int, results: queue.SimpleQueue[Any]) -> None:
        ready = threading.Event()
        loop = asyncio.new_event_loop()
        self._loop = loop

        async def main() -> None:
            self._queues = [asyncio.Queue() for _ in range(workers)]
            tasks = [asyncio.create_task(self._work(w, q, results)) for w, q in enumerate(self._queues)]
            ready.set()
            await asyncio.gather(*tasks)

        def serve() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(main())
            finally:
                loop.close()

        self._thread = threading.Thread(target=serve, name="dispatch-asyncio", daemon=True)
        self._thread.start()
        ready.wait()

    async def _work(self, w: int, q: asyncio.Queue[list[Work] | None], results: queue.SimpleQueue[Any]) -> None:
        handler = self.handler
        clock = time.perf_counter
        while (batch := await q.get()) is not None:
            out: list[Result] = []
            started = clock()  # wall time: tasks interleave, so a batch's share of it is an upper bound
            for work in batch:
                try:
                    await handler(work.message)
                except Exception as exc:
                    out.append((work.ticket, Failure.of(exc)))
                else:
                    out.append((work.ticket, None))
            results.put((w, out, clock() - started))

    def hand(self, worker: int, batch: list[Work]) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._queues[worker].put_nowait, batch)

    def gone(self) -> list[tuple[int, int | None]]:
        return []

    def shutdown(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        if self._loop is None or self._thread is None:
            return
        for q in self._queues:
            try:
                self._loop.call_soon_threadsafe(q.put_nowait, None)
            except RuntimeError:  # the loop is closed already
                break
        self._thread.join(max(0.0, deadline - time.monotonic()))


class AsyncRunner(Runner):
    """Parallel ``async def`` handlers: ``workers`` tasks; see :class:`~reassembly.runtime.base.Runner`.

    ``source``: where the messages come from. ``handler``: the ``async def`` called with each message. ``**options``:
    the :class:`~reassembly.runtime.Runner` keywords (workers, ordering, retry, dead letter, budget, clock, metrics,
    drain timeout, prefetch).
    """

    def __init__(
        self,
        source: Source,
        handler: AsyncHandler,
        **options: Unpack[RunnerOptions],
    ) -> None:
        super().__init__(
            source,
            AsyncCarrier(handler),
            **options,
        )
