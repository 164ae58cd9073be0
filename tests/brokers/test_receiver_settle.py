"""Every delivery a broker ``BrokerReceiver`` holds is settled once its message or group is decided.

The consumer here is an in-process list of deliveries (the ``Consumer`` protocol, no broker: the
settling is the BrokerReceiver's own logic; tests/brokers/test_activemq.py runs it against ActiveMQ). A store that
keeps failed bodies (``FileBodyStore(keep_failed=True)``) hands the events handles instead of
bytes: a BrokerReceiver matching held deliveries by bytes would never settle those, and they would
take prefetch slots until the consumer stalls, never dead-lettered.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reassembly import Assembler, Limits
from reassembly.brokers.receiver import BrokerReceiver
from reassembly.storage.filestore import FileBodyStore
from segmenter import MsgFlags, Segment, segment, segment_group
from segmenter.wire import decode_segment


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

    def fetch(self, timeout: float) -> list[_Delivery]:
        return [self.queue.pop(0)] if self.queue else []

    def close(self) -> None:
        pass


def _bad_message_checksum(seg: Segment) -> bytes:
    h = seg.header._replace(message_checksum=(seg.header.message_checksum or 0) ^ 1)
    return Segment(h, seg.data).encode()


def _cases() -> dict[str, tuple[list[bytes], bool]]:
    """Deliveries and whether the clock must pass the expiry; every one ends rejected."""
    single = [s.encode() for s in segment(os.urandom(5000), 1100)]
    failing = segment(os.urandom(3000), 1100)
    group = segment_group([os.urandom(2000), os.urandom(2000)], 1100)
    last = max(i for i, s in enumerate(group) if s.header.msg_flags & MsgFlags.LAST_SEGMENT)
    return {
        "expired": (single[:-1], True),
        "message failed": ([s.encode() for s in failing[:-1]] + [_bad_message_checksum(failing[-1])], False),
        "group failed": ([s.encode() for s in group[:last]] + [_bad_message_checksum(group[last])], False),
    }


@pytest.mark.parametrize("keep_failed", [False, True])
@pytest.mark.parametrize("case", ["expired", "message failed", "group failed"])
def test_every_held_delivery_is_settled_whatever_keeps_the_failed_bodies(
    tmp_path: Path, keep_failed: bool, case: str
) -> None:
    raws, expire = _cases()[case]
    deliveries = [_Delivery(r) for r in raws]
    now = [0.0]
    store = FileBodyStore(tmp_path / "bodies", token="t", threshold=0, keep_failed=keep_failed)
    assembler = Assembler(Limits(expiry_seconds=10), clock=lambda: now[0], bodies=store)
    quarantined: list[object] = []
    rx = BrokerReceiver(_Consumer(deliveries), lambda ev: None, assembler, on_quarantine=quarantined.append)
    for _ in deliveries:
        rx.poll(0)
    if expire:
        now[0] += 100
        rx.poll(0)
    assert quarantined and assembler.open_groups == 0
    assert all(d.settled.startswith("rejected") for d in deliveries), [d.settled for d in deliveries]
    assert rx.stats.held() == 0 and rx.stats.rejected == len(deliveries)
    assert {decode_segment(d.body).header.group_id for d in deliveries}  # they were segments
