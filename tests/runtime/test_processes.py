"""ProcessRunner with a real pool of worker processes: order, one handler per group, payloads
through shared memory, a poisoned message to the dead letter, a worker that dies."""

from __future__ import annotations

import functools
import os
import zlib
from pathlib import Path
from typing import Any

from reassembly.dispatcher import RetryPolicy
from reassembly.runtime import IterableSource, ParquetDeadLetter, ProcessRunner, read_dead_letters
from reassembly.runtime.processes import ProcessCarrier, resolve_handler
from tests.runtime.support import check_log, interleaved, name, read_log, recording


def test_process_pool_handles_every_message_once_in_order(tmp_path: Path) -> None:
    log = str(tmp_path / "log")
    small = interleaved([5, 1, 3, 6, 2, 4])
    large = interleaved([2, 2], size=200_000, first=100)  # through shared memory
    before = _segments()
    msgs = small + large
    poison = frozenset({(3, 2)})
    handler = functools.partial(recording, log, poison=poison)
    retry = RetryPolicy(max_attempts=2, base=0.001)
    runner = ProcessRunner(
        IterableSource(msgs), handler, workers=3, retry=retry, dead_letter=ParquetDeadLetter(tmp_path)
    )
    summary = runner.run()
    check_log(log, [name(m) for m in msgs], poison, attempts=2)
    assert (summary.done, summary.dead) == (len(msgs) - 1, 1)
    crcs = {(g, s): rest.split()[0] for what, g, s, _t, rest in read_log(log) if what == "end"}
    for m in msgs:
        assert crcs[name(m)] == str(zlib.crc32(m.payload)), "the worker saw the payload exactly"
    assert isinstance(runner.carrier, ProcessCarrier) and runner.carrier.shared_segments == len(large)
    assert len({pid for *_x, pid in (line.split(" ")[:5] for line in Path(log).read_text().splitlines())}) > 1
    [row] = read_dead_letters(tmp_path)
    assert (row["msg_seq_number"], row["attempts"]) == (2, 2)
    assert _segments() - before == set(), "every shared segment unlinked"


def _segments() -> set[str]:
    return {f for f in os.listdir("/dev/shm") if f.startswith("psm_")}


def exit_on_first(marker: str, m: Any) -> None:
    """Kills its worker process the first time (a crash in native code), succeeds after. The marker is
    created atomically: two workers running their first messages at once, only one dies."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    os._exit(3)


def test_a_dead_worker_is_replaced_and_its_message_retried(tmp_path: Path) -> None:
    msgs = interleaved([3, 3])
    handler = functools.partial(exit_on_first, str(tmp_path / "died"))
    runner = ProcessRunner(IterableSource(msgs), handler, workers=2, retry=RetryPolicy(max_attempts=3, base=0.001))
    summary = runner.run()
    assert (summary.done, summary.dead, summary.workers_lost, summary.retries) == (6, 0, 1, 1)


def test_handler_by_name() -> None:
    assert resolve_handler("tests.runtime.support:recording") is recording


def test_views_travel_as_bytes_and_an_unpicklable_message_is_a_failure(tmp_path: Path) -> None:
    import threading
    from dataclasses import replace

    from reassembly.runtime import Offered

    log = str(tmp_path / "log")
    views = [replace(m, payload=memoryview(m.payload)) for m in interleaved([2, 2])]  # as a Kafka record gives it
    items: list[object] = [*views, Offered(threading.Lock(), key="lock")]
    dead = ParquetDeadLetter(tmp_path / "d")
    runner = ProcessRunner(IterableSource(items), functools.partial(recording, log), workers=2,
                           retry=RetryPolicy(max_attempts=2, base=0.001), dead_letter=dead)  # fmt: skip
    summary = runner.run()
    check_log(log, [name(m) for m in views])
    assert (summary.done, summary.dead) == (4, 1)
    [row] = read_dead_letters(tmp_path / "d")
    assert row["error_type"] == "TypeError" and "not picklable" in row["reason"] and row["payload"] is None
