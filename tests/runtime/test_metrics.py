"""Gauges, the log line and the Prometheus endpoint of a runner."""

from __future__ import annotations

import logging
import sys
import threading
import urllib.request
from typing import Any

import pytest

from reassembly.runtime import IterableSource, Metrics, ThreadRunner
from segmenter.errors import Reason, SegmentationError
from tests.runtime.support import interleaved


class Lagging(IterableSource):
    """A source that reports a commit lag, as a Kafka source does."""

    def commit_lag(self) -> dict[str, int]:
        return {"p": 7}


def test_gauges_log_and_prometheus_while_running(caplog: pytest.LogCaptureFixture) -> None:
    msgs = interleaved([3, 3, 3])
    inside = threading.Event()
    go = threading.Event()

    def handler(m: Any) -> None:
        inside.set()
        assert go.wait(30)

    metrics = Metrics(port=0, publish_interval=0.0)
    runner = ThreadRunner(Lagging(msgs), handler, workers=2, prefetch=1, metrics=metrics)
    caplog.set_level(logging.INFO, logger="reassembly.runtime")
    t = threading.Thread(target=runner.run)
    t.start()
    try:
        assert inside.wait(30)
        views = runner.snapshot()  # answered by the loop: after it, the loop has published since
        assert sum(v.acquired for v in views) == 2
        assert metrics.bound_port is not None
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics.bound_port}/metrics", timeout=10).read().decode()
    finally:
        go.set()
        t.join(30)
    assert "reassembly_dispatch_in_flight 2.0" in text
    assert "reassembly_dispatch_groups_owned 2.0" in text
    assert 'reassembly_dispatch_commit_lag{partition="p"} 7.0' in text
    assert "reassembly_dispatch_held_bytes" in text and "reassembly_dispatch_fetch_paused 0.0" in text
    assert metrics.handled == 9 and metrics.latest is not None and metrics.latest.held_messages == 0
    assert any("runner finished: 9 offered, 9 done" in r.getMessage() for r in caplog.records)
    assert any(r.getMessage().startswith("held: ") for r in caplog.records)


def test_endpoint_without_prometheus_client_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails as if not installed
    runner = ThreadRunner(IterableSource([]), print, metrics=Metrics(port=0))
    with pytest.raises(SegmentationError, match=r"segment-reassembly\[metrics\]") as info:
        runner.run()
    assert info.value.reason is Reason.ENVIRONMENT_ERROR
