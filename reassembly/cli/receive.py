"""``reassemble receive --root DIR``: a crash-safe refmsg receiver fed framed messages on stdin.

A receiver as its own process, so it can be killed and restarted on the same root. Each frame is
a 4-byte big-endian length and one reference message; for every frame one JSON line goes to
stdout (flushed): the receipt, or the error's reason code, name and message.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from reassembly._errors import JobError, UsageError
from reassembly._files import overlap
from segmenter.errors import Reason, SegmentationError

if TYPE_CHECKING:
    from reassembly.cli._common import Subparsers

MAX_FRAME = 100 << 20  # MQ's largest MAXMSGL: a reference message is one MQ message


def add_parser(sub: Subparsers) -> argparse.ArgumentParser:
    """The ``receive`` subcommand."""
    p = sub.add_parser("receive", help="a refmsg receiver: framed reference messages on stdin, JSON lines out")
    p.add_argument("--root", required=True, help="directory the objects are written under")
    p.add_argument("--allow-plain", action="store_true", help="accept MQRMHs without the integrity block")
    return p


def _frame(stream: BinaryIO) -> bytes | None:
    """One frame (4-byte big-endian length, then the message); None at the end of input. Input that
    ends inside a frame, or a length over :data:`MAX_FRAME`, is an error: no later boundary can be
    trusted. The body is read a megabyte at a time, so a forged length sizes nothing."""
    prefix = stream.read(4)
    if not prefix:
        return None
    length = int.from_bytes(prefix, "big") if len(prefix) == 4 else -1
    if length > MAX_FRAME:
        raise JobError(f"frame of {length} bytes declared, the limit is {MAX_FRAME}")
    parts, got = [], 0
    while 0 <= got < length:
        part = stream.read(min(1 << 20, length - got))
        if not part:
            break
        parts.append(part)
        got += len(part)
    if got != length:
        what = f"{got} of {length} bytes" if length >= 0 else f"{len(prefix)} bytes of a length prefix"
        raise JobError(f"input ends inside a frame ({what})")
    return b"".join(parts)


def _stdin_inside(root: str) -> str | None:
    """The file stdin reads, when it lies under ``root`` (the receiver could replace it by an object)."""
    try:
        if not stat.S_ISREG(os.fstat(sys.stdin.fileno()).st_mode):
            return None
        path = Path(os.readlink("/proc/self/fd/0")).resolve()
    except (OSError, ValueError):
        return None
    return str(path) if overlap(path, Path(root).resolve()) else None


def run(args: argparse.Namespace) -> int:
    """Receive every frame on stdin, one JSON line each; 0 at the end of input."""
    from refmsg import Receiver

    inside = _stdin_inside(args.root)
    if inside is not None:
        raise UsageError(f"input {inside} is inside --root {args.root}: an object could replace it")
    with Receiver(args.root, require_integrity=not args.allow_plain) as receiver:
        while (frame := _frame(sys.stdin.buffer)) is not None:
            line: dict[str, Any]
            try:
                receipt = receiver.receive(frame)
                line = {
                    "outcome": receipt.outcome.value,
                    "name": receipt.name,
                    "offset": receipt.offset,
                    "length": receipt.length,
                    "written": receipt.written,
                }
            except SegmentationError as exc:
                line = {"error": int(exc.reason), "reason": exc.reason.name, "message": str(exc)}
            # this frame's files failed (no descriptor left, a link planted in the root): report, go on
            except OSError as exc:
                reason = Reason.STORE_ERROR
                line = {"error": int(reason), "reason": reason.name, "message": f"{type(exc).__name__}: {exc}"}
            sys.stdout.write(json.dumps(line) + "\n")
            sys.stdout.flush()
    return 0
