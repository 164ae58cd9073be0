"""A competing consumer in a process of its own, feeding a shared segment store, for the tests.

    python -m tests.support.store_member_proc kafka BOOTSTRAP TOPIC GROUP STORE NAME SINK LOG [options]
    python -m tests.support.store_member_proc queue URL QUEUE - STORE NAME SINK LOG [options]

``kafka`` runs a :class:`reassembly.brokers.share.ShareGroupReceiver`, ``queue`` a
:class:`reassembly.brokers.competing.CompetingReceiver`, until SIGTERM. Every message handed on is
written to SINK as a file named ``<GroupId hex>-<MsgSeqNumber>`` (temporary file, fsync, hard link:
a name already there is left as is and its bytes compared): a sink keyed by the message id, so a
message handed on again after a crash is written once.

LOG gets one line per fact, one ``write`` each (a SIGKILL loses no line written): ``start NAME``,
``w NAME GID SEQ OFFSET OUTCOME`` for each record once its write committed, ``sink GID SEQ`` /
``again GID SEQ`` once a message is in the sink, ``kill POINT`` just before a SIGKILL.

``--kill-at POINT --kill-after N`` SIGKILLs the process at the Nth time it reaches POINT:
``written`` (a batch committed to the store, before its records are acknowledged), ``claimed`` (a
write that claimed a unit committed, before the unit is delivered), ``assembling`` (a claimed unit
assembled and handed on, before the sink has it and before the store settles it).
"""

from __future__ import annotations

import signal
import threading

STOPPING = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: STOPPING.set())  # before the imports: a quick SIGTERM stops cleanly

import argparse  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402

from reassembly.assembler.events import GroupComplete, MessageComplete  # noqa: E402
from reassembly.segstore import open_store  # noqa: E402
from reassembly.segstore.records import Claim, Written  # noqa: E402
from reassembly.segstore.store import SegmentStore  # noqa: E402
from segmenter.wire import decode_header  # noqa: E402


class Log:
    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def line(self, *words: object) -> None:
        os.write(self.fd, (" ".join(str(w) for w in words) + "\n").encode())


class Killer:
    def __init__(self, log: Log, point: str | None, after: int) -> None:
        self.log, self.point, self.left = log, point, after

    def reached(self, point: str) -> None:
        if point != self.point:
            return
        self.left -= 1
        if self.left <= 0:
            self.log.line("kill", point)
            os.kill(os.getpid(), signal.SIGKILL)


def sink_writer(sink: Path, log: Log, killer: Killer):  # type: ignore[no-untyped-def]
    def put(gid: bytes, seq: int, payload: bytes) -> None:
        final = sink / f"{gid.hex()}-{seq}"
        tmp = sink / f".{gid.hex()}-{seq}.{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, final)
            log.line("sink", gid.hex(), seq)
        except FileExistsError:
            assert final.read_bytes() == payload, f"{final.name}: different bytes delivered again"
            log.line("again", gid.hex(), seq)
        finally:
            tmp.unlink()

    def on_message(event: MessageComplete | GroupComplete) -> None:
        killer.reached("assembling")
        messages = event.messages if isinstance(event, GroupComplete) else (event,)
        for m in messages:
            put(m.group_id, m.msg_seq_number, bytes(m.payload))  # type: ignore[arg-type]

    return on_message


def instrument(store: SegmentStore, name: str, log: Log, killer: Killer) -> None:
    """Log each committed write and reach the kill points around it."""
    write = store.write

    def logged(raws: Sequence[bytes | memoryview]) -> tuple[list[Written], list[Claim]]:
        written, claims = write(raws)
        for raw, w in zip(raws, written, strict=True):
            try:
                h = decode_header(raw)
                log.line("w", name, h.group_id.hex(), h.msg_seq_number, h.offset, w.outcome.value)
            except Exception:
                log.line("w", name, "-", 0, 0, w.outcome.value)
        if raws:
            killer.reached("written")
        if claims:
            killer.reached("claimed")
        return written, claims

    store.write = logged  # type: ignore[method-assign]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("kind", choices=("kafka", "queue"))
    p.add_argument("where")
    p.add_argument("topic")
    p.add_argument("group")
    p.add_argument("store")
    p.add_argument("name")
    p.add_argument("sink", type=Path)
    p.add_argument("log")
    p.add_argument("--kill-at", choices=("written", "claimed", "assembling"), default=None)
    p.add_argument("--kill-after", type=int, default=1)
    p.add_argument("--lease", type=float, default=3.0)
    p.add_argument("--delivery-limit", type=int, default=5)
    p.add_argument("--prefetch", type=int, default=10)
    a = p.parse_args(argv)
    log = Log(a.log)
    killer = Killer(log, a.kill_at, a.kill_after)
    store = open_store(a.store, member=a.name, lease_seconds=a.lease)
    instrument(store, a.name, log, killer)
    on_message = sink_writer(a.sink, log, killer)
    receiver: object
    if a.kind == "kafka":
        from reassembly.brokers.share import ShareGroupReceiver

        config = {"bootstrap.servers": a.where, "group.id": a.group, "log_level": 3}
        receiver = ShareGroupReceiver(
            config, [a.topic], store, on_message, delivery_limit=a.delivery_limit, take_over_every=0.5
        )
    else:
        from reassembly.brokers.competing import CompetingReceiver
        from segmenter.brokers import open_consumer

        receiver = CompetingReceiver(
            open_consumer(a.where, a.topic, prefetch=a.prefetch), store, on_message, take_over_every=0.5
        )
    log.line("start", a.name)
    try:
        receiver.run(STOPPING.is_set, timeout=0.2)  # type: ignore[attr-defined]
    finally:
        receiver.close()  # type: ignore[attr-defined]
        store.close()
        log.line("stop", a.name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
