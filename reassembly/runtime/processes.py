"""ProcessRunner: handlers in worker processes, for CPU-bound work the GIL would serialize.

Workers are started with the ``forkserver`` context where the platform has it (else ``spawn``):
never ``fork``, which would copy the consumer's threads and sockets (librdkafka's among them) into
every worker. The forkserver preloads this module, so each worker starts with the library
imported. The handler is given as ``"module:function"`` or as a picklable top-level function.

Payloads: a message's payload of at least ``shared_min`` bytes is copied once into a
``multiprocessing.shared_memory`` segment and the worker's handler gets a ``memoryview`` of it
(the message is otherwise the same ``MessageComplete``): no pickling of the payload through a pipe
(a copy into the pipe, one out of it, one into the unpickled bytes). The segment is unlinked as
soon as the worker reports the message finished; a handler must not keep the view past its return.
Smaller payloads travel pickled, which is cheaper than a segment for them.

Each worker has its own input queue; it reports each message as it finishes it, so when a worker
process dies (a crash in native code, ``os._exit``) the message it was running is known: that one
counts as a failed attempt (a message that kills its worker every time ends in the dead letter),
the others it held go back to the dispatcher untouched, and a fresh worker takes its number.
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import multiprocessing.context
import pickle
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, replace
from multiprocessing import shared_memory
from typing import TYPE_CHECKING, Any

from reassembly.assembler import GroupComplete, MessageComplete, ScatteredPayload
from reassembly.dispatcher import Work
from reassembly.runtime.base import Failure, Handler, Result, Runner, RunnerOptions, Source
from segmenter.errors import Reason, SegmentationError

if TYPE_CHECKING:
    from typing_extensions import Unpack

SHARED_MIN = 64 << 10  # payloads at least this large go through shared memory
CHECK_EVERY = 0.2  # seconds between looks for dead workers


@dataclass(frozen=True)
class _Shared:
    """A payload left in a shared-memory segment: its name and length."""

    name: str
    length: int


def _context() -> multiprocessing.context.BaseContext:
    methods = multiprocessing.get_all_start_methods()
    if "forkserver" in methods:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload([__name__])
        return ctx
    return multiprocessing.get_context("spawn")


def resolve_handler(spec: str | Handler) -> Handler:
    """``"module:function"`` -> the function; a callable is returned as it is."""
    if callable(spec):
        return spec
    module, sep, name = str(spec).partition(":")
    if not sep or not module or not name:
        raise SegmentationError(f"handler {spec!r}: expected MODULE:FUNCTION", reason=Reason.ARGUMENT_ERROR)
    fn = importlib.import_module(module)
    for part in name.split("."):
        fn = getattr(fn, part)
    if not callable(fn):
        raise SegmentationError(f"handler {spec!r} is not callable", reason=Reason.ARGUMENT_ERROR)
    return fn  # type: ignore[no-any-return]


# ---------------------------------------------------------------- in the worker process


def _attach(message: Any, opened: list[shared_memory.SharedMemory]) -> Any:
    """The message with its shared payloads mapped (as memoryviews)."""
    if isinstance(message, GroupComplete):
        return replace(message, messages=tuple(_attach(m, opened) for m in message.messages))
    if isinstance(message, MessageComplete) and isinstance(message.payload, _Shared):
        # Attaching registers the name with the resource tracker the workers share with the runner
        # (a set: no second entry); the runner unlinks it, and so unregisters it, after the report.
        ref = message.payload
        shm = shared_memory.SharedMemory(ref.name)
        opened.append(shm)
        assert shm.buf is not None
        return replace(message, payload=shm.buf[: ref.length])
    return message


def _detach(opened: list[shared_memory.SharedMemory]) -> None:
    for shm in opened:
        with contextlib.suppress(BufferError):  # the handler kept a view: the mapping goes with it
            shm.close()
    opened.clear()


def worker_main(w: int, spec: str | Handler, inbox: Any, outbox: Any) -> None:
    """A worker process: batches in, one result per message out, until None."""
    handler = resolve_handler(spec)
    opened: list[shared_memory.SharedMemory] = []
    while (batch := inbox.get()) is not None:
        for blob in batch:
            ticket, message = pickle.loads(blob)
            failure: Failure | None = None
            started = time.perf_counter()
            try:
                handler(_attach(message, opened))
            except BaseException as exc:  # SystemExit in a handler is its failure too
                failure = Failure.of(exc)
            finally:
                _detach(opened)
            outbox.put((w, [(ticket, failure)], time.perf_counter() - started))


# ---------------------------------------------------------------- in the runner's process


class ProcessCarrier:
    """Worker processes, an input queue each; a thread moves their results to the runner's queue."""

    def __init__(self, handler: str | Handler, shared_min: int = SHARED_MIN) -> None:
        self.spec = handler
        self.shared_min = shared_min
        self.ctx = _context()
        self.results: Any = None
        self._local: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._procs: list[Any] = []
        self._inboxes: list[Any] = []
        self._running: list[deque[int]] = []  # per worker: tickets handed, in order, not yet reported
        self._shm: dict[int, list[shared_memory.SharedMemory]] = {}  # ticket -> its segments
        self._lock = threading.Lock()
        self._closing = False
        self._mover: threading.Thread | None = None
        self.shared_segments = 0  # segments made (the bench reports it)
        self._checked = float("-inf")

    def start(self, workers: int, results: queue.SimpleQueue[Any]) -> None:
        self._local = results
        self.results = self.ctx.Queue()
        for w in range(workers):
            self._running.append(deque())
            self._procs.append(None)
            self._inboxes.append(None)
            self._spawn(w)
        self._mover = threading.Thread(target=self._move, args=(results,), name="dispatch-results", daemon=True)
        self._mover.start()

    def _spawn(self, w: int) -> None:
        inbox = self.ctx.Queue()
        p = self.ctx.Process(  # type: ignore[attr-defined]
            target=worker_main, args=(w, self.spec, inbox, self.results), name=f"dispatch-{w}", daemon=True
        )
        p.start()
        self._procs[w], self._inboxes[w] = p, inbox

    def _move(self, results: queue.SimpleQueue[Any]) -> None:
        while (item := self.results.get()) is not None:
            w, out, _busy = item
            with self._lock:
                for ticket, _failure in out:
                    if self._running[w] and self._running[w][0] == ticket:
                        self._running[w].popleft()
                    else:
                        with contextlib.suppress(ValueError):
                            self._running[w].remove(ticket)
                    self._free(ticket)
            results.put(item)

    def _free(self, ticket: int) -> None:
        for shm in self._shm.pop(ticket, ()):
            shm.close()
            shm.unlink()

    def _share(self, ticket: int, message: Any) -> Any:
        if isinstance(message, GroupComplete):
            return replace(message, messages=tuple(self._share(ticket, m) for m in message.messages))
        if not isinstance(message, MessageComplete):
            return message
        p = message.payload
        if not isinstance(p, bytes | bytearray | memoryview | ScatteredPayload):
            return message
        if len(p) < self.shared_min:  # pickled; a view (of a Kafka record, a delivery) cannot be
            return message if isinstance(p, bytes) else replace(message, payload=bytes(p))
        n = len(p)
        shm = shared_memory.SharedMemory(create=True, size=n)
        assert shm.buf is not None
        at = 0
        for part in p.parts if isinstance(p, ScatteredPayload) else (p,):
            view = memoryview(part).cast("B")
            shm.buf[at : at + len(view)] = view
            at += len(view)
        self._shm.setdefault(ticket, []).append(shm)
        self.shared_segments += 1
        return replace(message, payload=_Shared(shm.name, n))  # type: ignore[arg-type]  # mapped back in the worker

    def hand(self, worker: int, batch: list[Work]) -> None:
        """Pickled here, not in the queue's feeder thread: a message that cannot be pickled is
        that message's failure (retried, then dead-lettered), never a silently lost batch."""
        items: list[bytes] = []
        failed: list[Result] = []
        with self._lock:
            for work in batch:
                try:
                    items.append(
                        pickle.dumps((work.ticket, self._share(work.ticket, work.message)), pickle.HIGHEST_PROTOCOL)
                    )
                except Exception as exc:
                    self._free(work.ticket)
                    failed.append((work.ticket, Failure(type(exc).__qualname__, f"not picklable: {exc}"[:2000])))
                else:
                    self._running[worker].append(work.ticket)
        if items:
            self._inboxes[worker].put(items)
        if failed:
            self._local.put((worker, failed, 0.0))

    def gone(self) -> list[tuple[int, int | None]]:
        """Workers that exited, looked at most every :data:`CHECK_EVERY` seconds (a ``waitpid`` each)."""
        now = time.monotonic()
        if self._closing or now - self._checked < CHECK_EVERY:
            return []
        self._checked = now
        out: list[tuple[int, int | None]] = []
        for w, p in enumerate(self._procs):
            if p.exitcode is None:
                continue
            with self._lock:
                running = self._running[w][0] if self._running[w] else None
                for ticket in self._running[w]:
                    self._free(ticket)
                self._running[w].clear()
            self._inboxes[w].close()
            self._spawn(w)
            out.append((w, running))
        return out

    def shutdown(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        self._closing = True
        for inbox in self._inboxes:
            inbox.put(None)
        for p in self._procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self._procs:
            if p.exitcode is None:
                p.terminate()
                p.join(2.0)
        if self.results is not None:
            self.results.put(None)
        if self._mover is not None:
            self._mover.join(max(1.0, deadline - time.monotonic()))
        with self._lock:
            for ticket in list(self._shm):
                self._free(ticket)
        for inbox in self._inboxes:
            inbox.close()
        if self.results is not None:
            self.results.close()


class ProcessRunner(Runner):
    """Parallel handlers in ``workers`` processes; see :class:`~reassembly.runtime.base.Runner`.
    ``handler``: ``"module:function"`` or a picklable top-level function. ``shared_min``: the
    smallest payload handed over through shared memory.

    ``source``: where the messages come from. ``**options``: the :class:`~reassembly.runtime.Runner` keywords (workers,
    ordering, retry, dead letter, budget, clock, metrics, drain timeout, prefetch).
    """

    def __init__(
        self,
        source: Source,
        handler: str | Handler,
        *,
        shared_min: int = SHARED_MIN,
        **options: Unpack[RunnerOptions],
    ) -> None:
        if isinstance(handler, str):
            resolve_handler(handler)  # a typo fails here, not in every worker
        super().__init__(
            source,
            ProcessCarrier(handler, shared_min),
            **options,
        )
