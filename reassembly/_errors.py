"""The command's errors: one line each, never a stack trace.

A :class:`JobError` is reported in one line (exit code 1); a :class:`UsageError` is one that must
not run at all (exit code 2, nothing touched); :func:`first_line` makes that line from any
exception, Java's and Python workers' included; :func:`counted` writes a count with its noun.
"""

from __future__ import annotations

import re


class JobError(Exception):
    """A failure to report in one line (no stack trace)."""


class UsageError(JobError):
    """Arguments that must not run at all (an output overlapping the input): exit code 2, nothing touched."""


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


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``count`` and ``noun``, plural unless one ("1 incomplete group", "3 rows", "2 copies" with
    ``plural="copies"``): the command's lines read as sentences whatever the count."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"
