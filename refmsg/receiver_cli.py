"""A receiver process: ``python -m refmsg.receiver_cli --root DIR`` applies framed messages from stdin.

Input is a stream of frames, each a 4-byte big-endian length and one encoded
reference message. For every frame one JSON line goes to stdout (flushed):
``{"outcome": ..., "name": ..., "offset": ..., "length": ..., "written": ...}``
or ``{"error": <reason code>, "reason": <name>, "message": ...}``. The process
exits 0 at end of input. It exists so tests (and operators) can run a real
receiver as its own process, kill it, and restart it on the same root.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import BinaryIO

from segmenter.errors import SegmentationError

from .receiver import Receiver


def frames(stream: BinaryIO) -> list[bytes] | None:
    """Read one frame; None at a clean end of input."""
    prefix = stream.read(4)
    if len(prefix) < 4:
        return None
    length = int.from_bytes(prefix, "big")
    body = stream.read(length)
    return [body] if len(body) == length else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m refmsg.receiver_cli", description=__doc__)
    parser.add_argument("--root", required=True, help="directory the objects are written under")
    parser.add_argument("--allow-plain", action="store_true", help="accept MQRMHs without the integrity block")
    args = parser.parse_args(argv)
    out = sys.stdout
    with Receiver(args.root, require_integrity=not args.allow_plain) as receiver:
        while True:
            frame = frames(sys.stdin.buffer)
            if frame is None:
                break
            try:
                receipt = receiver.receive(frame[0])
                line = {
                    "outcome": receipt.outcome.value,
                    "name": receipt.name,
                    "offset": receipt.offset,
                    "length": receipt.length,
                    "written": receipt.written,
                }
            except SegmentationError as exc:
                line = {"error": int(exc.reason), "reason": exc.reason.name, "message": str(exc)}
            out.write(json.dumps(line) + "\n")
            out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
