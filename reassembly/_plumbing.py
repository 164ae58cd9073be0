"""Plumbing every job of the ``reassemble`` command shares, Spark or not.

Its errors (one line; a usage error exits 2 before anything is touched), the inputs it names
and the output it claims (never overlapping: a run must not read or replace its own input), an
atomic output directory (a hidden sibling renamed into place only on success, removed on failure
or Ctrl-C), the interrupt flag, one-line errors and the digest policy read from a keyring file.
The collector's job and the Spark jobs both import it; it imports neither.
"""

from __future__ import annotations

import fnmatch
import glob
import json
import os
import re
import shutil
import threading
import uuid
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from segmenter.digest import DigestPolicy, Keyring
from segmenter.errors import SegmentationError


class JobError(Exception):
    """A failure to report in one line (no stack trace)."""


class UsageError(JobError):
    """Arguments that must not run at all (an output overlapping the input): exit code 2, nothing touched."""


INTERRUPTED = threading.Event()
"""Set by Ctrl-C once a session is open. A terminal's Ctrl-C reaches the whole process group, so the
JVM may die before the driver raises KeyboardInterrupt and the error that surfaces is py4j's ("Answer
from Java side is empty"): the command reports such a failure as the interruption it is (exit 130)."""


def on_interrupt(signum: int, frame: Any) -> None:
    INTERRUPTED.set()
    raise KeyboardInterrupt


def inputs(pattern: str) -> list[str]:
    """The paths an input names (a file, a directory or a glob); JobError if none or unreadable."""
    paths = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
    missing = [p for p in paths if not os.path.exists(p)]
    if not paths or missing:
        raise JobError(f"input not found: {pattern}")
    unreadable = [p for p in paths if not os.access(p, os.R_OK)]
    if unreadable:
        raise JobError(f"input not readable: {unreadable[0]}")
    return paths


def overlap(out: Path, path: Path) -> str | None:
    """How ``out`` overlaps ``path`` ("is the input", "is inside the input", "contains the input"), or None.

    Compare resolved paths (``Path.resolve()``): symlinks, ``..`` and relative paths must not hide an overlap.
    """
    if out == path:
        return "is the input"
    if path in out.parents:
        return "is inside the input"
    if out in path.parents:
        return "contains the input"
    return None


def _link_targets(path: str) -> Iterator[tuple[str, Path]]:
    """Every symlink under a directory input, with its resolved target: Spark reads a linked file
    as part of the directory, so an output over the target would delete input it read."""
    if os.path.isdir(path):
        for root, dirs, files in os.walk(path):
            for name in (*dirs, *files):
                link = os.path.join(root, name)
                if os.path.islink(link):
                    yield link, Path(link).resolve()


def linked_overlap(real: Path, directory: str) -> str | None:
    """How ``real`` (resolved) overlaps the target of a symlink under ``directory`` ("is inside
    /x (linked from d/l)"), or None: Spark reads through those links."""
    for link, target in _link_targets(directory):
        why = overlap(real, target)
        if why:
            return f"{why} {target} (linked from {link})"
    return None


def hadoop_literal(path: str) -> str:
    """``path`` with Hadoop's glob characters escaped: Spark expands ``{a,b}``, ``[ab]``, ``*`` and
    ``?`` in the paths it reads, so a literal path naming such characters would read (and the
    output checks would miss) other paths than the one checked."""
    return re.sub(r"([\\{}\[\]*?])", r"\\\1", path)


def _matches(pattern: str, out: Path) -> bool:
    """Would ``pattern`` (its fixed leading directories resolved like the output) match ``out`` or a parent?"""
    parts = Path(os.path.abspath(pattern)).parts
    fixed = next(i for i, part in enumerate(parts) if glob.has_magic(part))
    resolved = str(Path(*parts[:fixed]).resolve().joinpath(*parts[fixed:]))
    candidates = {Path(os.path.abspath(out)), out.resolve()}
    return any(
        fnmatch.fnmatchcase(str(c), p)
        for p in (resolved, os.path.join(*parts))
        for o in candidates
        for c in (o, *o.parents)
    )


def claim_output(output: str, overwrite: bool, pattern: str, paths: Sequence[str]) -> Path:
    """Check that OUTPUT can be written and shares nothing with the input; JobError if not.

    OUTPUT is compared with every input path after resolving symlinks, ``..`` and relative
    paths, whatever ``--overwrite`` says: equal, inside or a parent of an input is refused
    (it would replace, re-read or delete the input). For a glob, OUTPUT must not match the
    glob either, or the next run with the same pattern would read it as input.
    """
    out = Path(os.path.abspath(output))  # "." and ".." by name: the rename into place needs one
    real = out.resolve()
    for p in paths:
        why = overlap(real, Path(p).resolve())
        if why:
            raise UsageError(f"output {output} {why} {p}: choose an output outside the input")
        why = linked_overlap(real, p)
        if why:
            raise UsageError(f"output {output} {why}: choose an output outside it")
    if glob.has_magic(pattern) and _matches(pattern, out):
        raise UsageError(f"output {output} matches the input pattern {pattern}: choose an output outside it")
    if out.exists() and not overwrite:
        raise JobError(f"output exists: {output} (use --overwrite)")
    if not out.parent.exists():
        raise JobError(f"output parent directory does not exist: {out.parent}")
    return out


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@contextmanager
def atomic_dir(out: Path, spark: Any = None) -> Iterator[Path]:
    """A hidden sibling to write into; renamed to ``out`` on success, removed on failure or Ctrl-C."""
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt) and spark is not None:
            # stop Spark so no task still writes into what is removed next; the same Ctrl-C may have
            # killed the JVM already, and pyspark's "Unable to cleanly shutdown" warning would then
            # print beside our one line: expected here, so not shown
            with suppress(Exception), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if out.exists() or out.is_symlink():
        old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
        out.rename(old)
    tmp.rename(out)
    if old is not None:
        _remove(old)


_PYTHON_ERROR = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Interrupt|Exit)\b:?")


def first_line(exc: BaseException) -> str:
    """One informative line: the message and its root cause, never py4j's call site or a bare colon.

    A Java error's text is a header line, ``: Message`` and ``Caused by:`` lines; a Python
    worker's is a header ending in a colon followed by a traceback whose last exception
    line is the cause. The line names the head and, after a colon, the deepest cause.
    """
    text = str(exc).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("\t")]
    if not lines:
        return type(exc).__name__
    java = [line[2:] for line in lines if line.startswith(": ")]
    causes = [line.removeprefix("Caused by: ") for line in lines if line.startswith("Caused by: ")]
    python = [line for line in lines[1:] if _PYTHON_ERROR.match(line) and not line.startswith("Traceback")]
    head = java[0] if java else lines[0]
    cause = python[-1] if python else causes[-1] if causes else None
    if cause and cause not in head:
        head = f"{head.rstrip(': ')}: {cause}" if head.endswith(":") else f"{head} (cause: {cause})"
    elif head.endswith(":"):
        rest = [line for line in lines if line != head]
        head = f"{head} {rest[-1]}" if rest else head.rstrip(":")
    return head[:400]


def load_keyring(path: str) -> Keyring:
    """A keyring file: JSON ``{"current": "<key id>", "keys": {"<key id>": "<hex key>", ...}}``.

    ``current`` (optional) names the signing key; every key in ``keys`` verifies. Errors name
    the file and the key id, never a key. Keep the file readable by the job's user only.
    """
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as exc:
        raise UsageError(f"keyring {path}: {type(exc).__name__}: {first_line(exc)}") from None
    keys = doc.get("keys") if isinstance(doc, dict) else None
    if not isinstance(keys, dict) or not keys or not all(isinstance(v, str) for v in keys.values()):
        raise UsageError(f'keyring {path}: expected {{"current": ID, "keys": {{ID: HEX, ...}}}}')
    raw: dict[str, bytes] = {}
    for key_id, text in keys.items():
        try:
            raw[str(key_id)] = bytes.fromhex(text)
        except ValueError:
            raise UsageError(f"keyring {path}: key {key_id!r} is not hex") from None
    try:
        return Keyring(raw, current=doc.get("current"))
    except SegmentationError as exc:
        raise UsageError(f"keyring {path}: {exc}") from None


def digest_policy(require_sha256: bool, keyring_path: str | None) -> DigestPolicy:
    """The reader's policy from the command line (``--require-sha256``, ``--hmac-keyring FILE``)."""
    return DigestPolicy(sha256=require_sha256, keyring=load_keyring(keyring_path) if keyring_path else None)
