"""Writing a reassembly's outputs: the clean messages by a JVM-only job, the rest judged by a second one.

Why two jobs: in one plan (``ReassemblyResult.combined``) every row, clean ones included, passes
the Python UDF operator after the JVM's one pass: Spark queues each row with its payload while
its argument (NULL for a clean message) goes to Python and back, the explode copies the payload
again, and every task starts Python workers whether or not a row needs them
(``python -m bench.stages`` compares the variants ``ours`` and ``save``). Here the one pass
(``Reassemble.split`` in the jar) writes the clean messages straight from the JVM, and every
other group to a side file (one per task, in the output's hidden ``_side`` folder,
``SideFile.java``); only if a side file exists does a second job judge those groups in Python
(the same per-task judge as the UDF, ``judge._Task``) and write its messages and quarantine rows
beside the first job's. Same rows as ``combined`` (tests/spark/test_save.py).

Where the split cannot run (Spark Connect, no jar, a digest policy that demands digests,
``jvm_fast_path=False``, an output that is not a local path), :func:`save` writes ``combined``
partitioned by kind in one job.

The side folder is inside the output, so it is wherever the output is: on a cluster the output
(like ``payload_dir``) must be a directory every executor sees.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from reassembly.spark.jobs import empty_folder, write_split
from reassembly.spark.writer import parquet_writer

FOLDERS = {"message": "messages", "quarantine": "quarantine"}
SIDE = "_side"
_JUDGED = "_judged"


@dataclass(frozen=True)
class Split:
    """The two jobs of a split write, bound to one ``reassemble()`` call."""

    clean: Callable[[str], Any]  # a side folder -> the clean messages (output columns but ``kind``)
    judge: Callable[[list[str]], Any]  # side files -> their groups' output rows (every column)


class Saved(NamedTuple):
    """How :func:`save` wrote: ``split`` (two jobs possible) and the side files the second job judged."""

    split: bool
    side_files: int


def side_files(folder: Path) -> list[str]:
    """One finished side file per partition (any two finished attempts of a partition hold the same groups)."""
    chosen: dict[str, Path] = {}
    for path in sorted(folder.glob("*.side")):
        chosen.setdefault(path.name.split("-", 1)[0], path)
    return [str(chosen[k]) for k in sorted(chosen)]


def _local(directory: str | Path) -> Path | None:
    text = str(directory)
    if "://" in text and not text.startswith("file://"):
        return None
    return Path(text.removeprefix("file://"))


def save(combined: Callable[[], Any], split: Split | None, directory: str | Path) -> Saved:
    """``directory/messages`` and ``directory/quarantine`` (Parquet; neither may exist yet).

    ``combined`` gives the one-plan DataFrame, asked for only where the split cannot run."""
    local = _local(directory)
    if split is None or local is None:
        write_split(combined(), Path(str(directory)), FOLDERS)
        return Saved(False, 0)
    side = local.resolve() / SIDE
    messages = local / FOLDERS["message"]
    parquet_writer(split.clean(str(side))).parquet(str(messages))
    files = side_files(side) if side.exists() else []
    if files:
        write_split(split.judge(files), local, {"message": _JUDGED, "quarantine": FOLDERS["quarantine"]})
        for part in (local / _JUDGED).iterdir():
            if not part.name.startswith(("_", "._")):  # not _SUCCESS (nor its .crc): messages/ has one
                part.rename(messages / part.name)
        shutil.rmtree(local / _JUDGED)
    else:
        empty_folder(local / FOLDERS["quarantine"])
    shutil.rmtree(side, ignore_errors=True)
    return Saved(True, len(files))
