"""Quarantined segments by reference: their original bytes in a file under ``payload_dir``, a pointer in the row.

Spark (and Arrow) cap a value, and the rows one Python call returns, at 2 GiB; a
large message judged from the file store is quarantined whole with the task's
last row, so in-row it would cost twice its size in the worker and, past 2 GiB,
could not leave at all. With a ``payload_dir`` such originals are copied block by
block (:data:`BLOCK`) into one file per task attempt, and the row carries
``raw_path`` (relative to ``payload_dir``), ``raw_offset`` and ``raw_length``
with ``raw`` NULL. Which rows go by reference is the judge's choice
(``judge.py``); :func:`read_quarantined` reads any quarantine row back.

The file is written under a temporary dot-name at the top of ``payload_dir`` (the
command line's clean-up removes those of failed attempts) and, when the task's
input ends, flushed, fsynced and renamed to ``quarantine/<token>.bin``: the token
names the task attempt and a random part, so a retried or speculative attempt,
or another job writing to the same directory, never writes over a file that
committed rows point at. A file of an attempt whose output was not committed is
referenced by no row: safe to delete (:func:`prune_unreferenced`, which ``reassemble run`` calls).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from reassembly.assembler.bodies import StoredOriginal
from segmenter.errors import Reason, SegmentationError

QUARANTINE_DIR = "quarantine"  # under payload_dir
BLOCK = 1 << 20  # what one copy step holds in memory


class QuarantineFile:
    """One task attempt's originals by reference, appended to one file (created on first use)."""

    def __init__(self, payload_dir: str | os.PathLike[str], token: str) -> None:
        self.directory = Path(payload_dir)
        self.name = f"{QUARANTINE_DIR}/{token}.bin"  # what rows point at
        self._part = self.directory / f".{QUARANTINE_DIR}-{token}.part"
        self._file: BinaryIO | None = None
        self._size = 0

    def put(self, original: bytes | StoredOriginal) -> tuple[str, int, int]:
        """Append one segment's original bytes: (raw_path, raw_offset, raw_length)."""
        if self._file is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._file = open(self._part, "wb")  # noqa: SIM115 (open until finish)
        at = self._size
        for block in original.blocks(BLOCK) if isinstance(original, StoredOriginal) else (original,):
            self._file.write(block)
        self._size += len(original)
        return self.name, at, len(original)

    def finish(self) -> None:
        """Make the file durable and visible under its name (nothing if nothing was written)."""
        if self._file is None:
            return
        f, self._file = self._file, None
        f.flush()
        os.fsync(f.fileno())
        f.close()
        final = self.directory / self.name
        final.parent.mkdir(exist_ok=True)
        os.replace(self._part, final)
        fd = os.open(final.parent, os.O_RDONLY)
        try:
            os.fsync(fd)  # the rename itself survives a crash
        finally:
            os.close(fd)


@dataclass(frozen=True)
class ByReference:
    """Where the rows of one assembler send originals (``rows.QuarantineSink``).

    ``every``: all of them (the task's large assembler, whose rows all leave with the task's
    last row); else only those left in a store (the rest stay in the row: no bigger than the
    input row they came from).
    """

    file: QuarantineFile
    every: bool

    def put(self, original: bytes | StoredOriginal) -> tuple[str, int, int] | None:
        if not self.every and not isinstance(original, StoredOriginal):
            return None
        return self.file.put(original)


def prune_unreferenced(payload_dir: str | os.PathLike[str], quarantine_parquet: str | os.PathLike[str]) -> None:
    """Delete the quarantine files that no row of a written quarantine table names.

    They come from task attempts whose output was discarded (failed after finishing their
    file, or the losing copy of a speculative task). Reads only the ``raw_path`` column.
    """
    import pyarrow.parquet as pq

    folder = Path(payload_dir) / QUARANTINE_DIR
    if not folder.exists():
        return
    named: set[str] = set()
    for part in Path(quarantine_parquet).glob("*.parquet"):
        named.update(p for p in pq.read_table(part, columns=["raw_path"]).column(0).to_pylist() if p is not None)
    for f in folder.iterdir():
        if f"{QUARANTINE_DIR}/{f.name}" not in named:
            f.unlink()
    if not any(folder.iterdir()):
        folder.rmdir()


def read_quarantined(row: Any, payload_dir: str | os.PathLike[str] | None = None) -> bytes | None:
    """The original bytes of a quarantine row (``raw``, or what ``raw_path`` points at); None for a NULL input row.

    ``row``: a Spark ``Row``, a dict (e.g. from ``pyarrow``'s ``to_pylist``) or anything indexable by
    column name. ``payload_dir``: the job's (needed only for rows by reference).
    """
    raw = row["raw"]
    if raw is not None:
        return bytes(raw)
    path = row["raw_path"]
    if path is None:
        return None
    if payload_dir is None:
        raise ValueError(f"quarantine row by reference ({path}): pass the job's payload_dir")
    base = Path(payload_dir).resolve()
    target = (base / path).resolve()
    if not target.is_relative_to(base):
        raise ValueError(f"raw_path {path!r} points outside {base}")
    offset, length = int(row["raw_offset"]), int(row["raw_length"])
    with open(target, "rb") as f:
        data = os.pread(f.fileno(), length, offset)
    if len(data) != length:
        raise SegmentationError(
            f"quarantine file {target} holds {len(data)} of the {length} bytes at {offset} the row points at",
            reason=Reason.TRUNCATED,
            length=length,
        )
    return data
