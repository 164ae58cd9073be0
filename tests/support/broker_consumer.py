"""A competing consumer process for tests/brokers/test_activemq.py: a BrokerReceiver feeding an idempotent sink.

    python tests/support/broker_consumer.py URL QUEUE NAME SINK.sqlite LOG

The sink is SQLite, keyed on (GroupId, MsgSeqNumber): a message delivered twice (a redelivery
after a consumer died between handing it over and acknowledging it) is stored once and the
second copy is counted in ``dups``. The log gets one line per settlement step, written
unbuffered so a SIGKILL loses nothing: ``R gid t seq:offset redelivered`` on receipt, ``A ...`` / ``J ...`` after
accept / reject (t = time.monotonic(), comparable across processes on Linux), and ``F - t``
after every fetch: both transports write the settlements made before a fetch when it starts, so
every ``A``/``J`` above an ``F`` is on the wire. On SIGTERM the consumer closes and prints its
ReceiverStats as JSON.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from reassembly import Assembler, GroupComplete, Limits, MessageComplete
from reassembly.brokers.receiver import BrokerReceiver
from segmenter.brokers import Consumer, Delivery, open_consumer
from segmenter.wire import decode_header


class _Log:
    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, kind: str, body: bytes, redelivered: bool) -> None:
        h = decode_header(body)
        line = f"{kind} {h.group_id.hex()} {time.monotonic():.6f} {h.msg_seq_number}:{h.offset} {int(redelivered)}\n"
        os.write(self.fd, line.encode())

    def fetched(self) -> None:
        os.write(self.fd, f"F - {time.monotonic():.6f}\n".encode())


class _LoggedDelivery:
    def __init__(self, inner: Delivery, log: _Log) -> None:
        self.inner, self.log = inner, log
        self.body, self.redelivered = inner.body, inner.redelivered
        log.write("R", self.body, self.redelivered)

    def accept(self) -> None:
        self.inner.accept()
        self.log.write("A", self.body, self.redelivered)

    def reject(self, reason: int, description: str) -> None:
        self.inner.reject(reason, description)
        self.log.write("J", self.body, self.redelivered)


class _LoggedConsumer:
    def __init__(self, inner: Consumer, log: _Log) -> None:
        self.inner, self.log = inner, log

    def fetch(self, timeout: float) -> list[Delivery]:
        got = self.inner.fetch(timeout)
        self.log.fetched()
        return [_LoggedDelivery(d, self.log) for d in got]

    def close(self) -> None:
        self.inner.close()


def main(url: str, queue: str, name: str, sink: str, log: str) -> None:
    db = sqlite3.connect(sink, timeout=30)
    db.execute("create table if not exists msgs (gid text, seq int, sha text, consumer text, primary key (gid, seq))")
    db.execute("create table if not exists dups (gid text, seq int, sha text, consumer text)")
    db.commit()

    def store(ev: MessageComplete | GroupComplete) -> None:
        for m in ev.messages if isinstance(ev, GroupComplete) else (ev,):
            row = (m.group_id.hex(), m.msg_seq_number, hashlib.sha256(bytes(m.payload)).hexdigest(), name)  # type: ignore[arg-type]
            if db.execute("insert or ignore into msgs values (?, ?, ?, ?)", row).rowcount == 0:
                db.execute("insert into dups values (?, ?, ?, ?)", row)
        db.commit()  # the message is safe before the handler returns (and its segments are acked)

    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    consumer = _LoggedConsumer(open_consumer(url, queue, prefetch=1000), _Log(log))
    receiver = BrokerReceiver(consumer, store, Assembler(Limits(expiry_seconds=600), clock=time.monotonic))
    print("ready", flush=True)
    stats: Any = receiver.run(lambda: bool(stopping))
    receiver.close()
    print(json.dumps(stats.as_dict()), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:6])
