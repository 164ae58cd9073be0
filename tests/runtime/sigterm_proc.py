"""A runner in a process of its own, for the SIGTERM test: prints ``started`` once its first
handlers run, then ``summary DONE UNFINISHED DRAINED`` when run() returned."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from reassembly.runtime import IterableSource, ThreadRunner, stop_on_signals
from tests.runtime.support import interleaved


def main() -> int:
    msgs = interleaved([5] * 40)
    lock = threading.Lock()
    started: list[int] = []

    def handler(m: Any) -> None:
        with lock:
            started.append(1)
            if len(started) == 4:
                print("started", flush=True)
        time.sleep(0.2)  # work in flight when the signal comes

    runner = ThreadRunner(IterableSource(msgs), handler, workers=4, prefetch=1, drain_timeout=20)
    with stop_on_signals(runner):
        s = runner.run()
    print(f"summary {s.done} {s.unfinished} {s.drained} {len(started)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
