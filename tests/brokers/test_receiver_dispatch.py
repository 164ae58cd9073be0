"""The group dispatcher over AMQP/STOMP: a message's deliveries are settled only when it is.

In-process, over a list of deliveries (the ``Consumer`` protocol; the settling is the source's
own logic): a whole message's deliveries stay unsettled until the runner settles it, DONE and DEAD
both accept them, and a failed group of the same GroupId never touches the deliveries of a message
already handed out. Against ActiveMQ (``servers``): ``reassemble consume stomp://...`` with
parallel handlers and poisoned messages, then the queue is empty, every message was handled and
exactly the poisoned ones are in the dead letter folder.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from reassembly import Assembler, Limits
from reassembly.brokers.receiver_dispatch import BrokerDispatchSource
from reassembly.dispatcher import Dispatcher, Ordering, Outcome
from reassembly.runtime.deadletter import read_dead_letters
from segmenter import segment, segment_group
from tests.support.activemq_server import activemq, available
from tests.support.command import reassemble


class _Delivery:
    def __init__(self, body: bytes) -> None:
        self.body, self.redelivered, self.settled = body, False, ""

    def accept(self) -> None:
        assert not self.settled
        self.settled = "accepted"

    def reject(self, reason: int, text: str) -> None:
        assert not self.settled
        self.settled = f"rejected {reason}"


class _Consumer:
    def __init__(self, deliveries: list[_Delivery]) -> None:
        self.queue = list(deliveries)

    def fetch(self, timeout: float) -> list[Any]:
        got, self.queue = self.queue, []
        return got

    def close(self) -> None:
        pass


def test_deliveries_wait_for_the_message_to_settle() -> None:
    a = [_Delivery(s.encode()) for s in segment(os.urandom(5000), max_segment_size=1024)]
    b = [_Delivery(s.encode()) for s in segment(os.urandom(3000), max_segment_size=1024)]
    source = BrokerDispatchSource(_Consumer(a + b))
    d = Dispatcher(Ordering.UNORDERED)
    for o in source.fetch(0.0):
        d.offer(o.message, now=0.0, key=o.key)
    wa, wb = d.take(0, 0.0), d.take(1, 0.0)
    assert wa is not None and wb is not None
    assert not any(x.settled for x in a + b)  # handed out: nothing settled yet
    assert source.stats.held() == len(a + b)
    d.settle(wa.ticket, Outcome.DONE, now=0.0)
    source.settled(wa, Outcome.DONE)
    d.settle(wb.ticket, Outcome.DEAD, now=0.0)
    source.settled(wb, Outcome.DEAD)  # after the dead letter was written: accepted too
    assert {x.settled for x in a + b} == {"accepted"}
    assert source.stats.held() == 0 and source.stats.messages == 2


def test_a_failed_group_leaves_the_handed_out_message_of_its_group_alone() -> None:
    now = [0.0]
    gid = os.urandom(24)
    group = segment_group([os.urandom(2000), os.urandom(2000)], max_segment_size=1024, group_id=gid)
    first = [s for s in group if s.header.msg_seq_number == 1]
    second = [s for s in group if s.header.msg_seq_number == 2][:1]  # never completes
    deliveries = [_Delivery(s.encode()) for s in first + second]
    asm = Assembler(Limits(expiry_seconds=5), clock=lambda: now[0], unit_of_work=False)
    source = BrokerDispatchSource(_Consumer(deliveries), asm)
    offered = source.fetch(0.0)
    assert len(offered) == 1
    now[0] = 10.0  # the group expires: its held segments are rejected, the delivered message's are not
    assert source.fetch(0.0) == []
    assert all(x.settled.startswith("rejected") for x in deliveries[len(first) :])
    assert not any(x.settled for x in deliveries[: len(first)])
    d = Dispatcher(Ordering.UNORDERED)
    d.offer(offered[0].message, now=0.0)
    w = d.take(0, 0.0)
    assert w is not None
    source.settled(w, Outcome.DONE)
    assert all(x.settled == "accepted" for x in deliveries[: len(first)])


@pytest.mark.servers
@pytest.mark.skipif(not available(), reason="ActiveMQ (Debian package activemq) or java missing")
def test_consume_over_stomp_with_poisoned_messages(tmp_path: Path) -> None:
    from segmenter.brokers import open_consumer, open_sender

    queue = "q.consume.stomp"
    payloads = [(b"POISON" if i % 7 == 3 else b"OK") + os.urandom(1000 + 300 * i) for i in range(30)]
    log, dead = tmp_path / "handled.log", tmp_path / "dead"
    with activemq() as broker:
        url = broker.url("stomp")
        with open_sender(url, queue) as s:
            for p in payloads:
                for seg in segment(p, max_segment_size=2048):
                    s.send(seg)
        r = reassemble(
            "consume", url, queue, "--handler", "tests.support.dispatch_handler:handle", "--workers", "4",
            "--max-attempts", "3", "--retry-delay", "10ms", "--dead-letter", str(dead), "--idle-exit", "2s",
            "--summary-json", str(tmp_path / "s.json"),
            env={"DISPATCH_LOG": str(log), "DISPATCH_FAIL_RATE": "0", "DISPATCH_SLEEP_MS": "10",
                 "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
            timeout=120,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        left = open_consumer(url, queue, prefetch=100)
        try:
            assert left.fetch(2.0) == []  # every delivery was accepted: handled or dead-lettered
        finally:
            left.close()
    events = [json.loads(line) for line in log.read_text().splitlines()]
    ok = [e for e in events if e["kind"] == "end" and e["ok"]]
    assert len(ok) == sum(1 for p in payloads if p.startswith(b"OK"))
    rows = read_dead_letters(dead)
    assert sorted(bytes(r["payload"]) for r in rows) == sorted(p for p in payloads if p.startswith(b"POISON"))
    assert all(r["attempts"] == 3 for r in rows)
    doc = json.loads((tmp_path / "s.json").read_text())
    assert doc["exit_code"] == 0 and doc["consume"]["summary"]["dead"] == len(rows)
    assert doc["consume"]["source"]["used"] == doc["consume"]["source"]["received"]
