"""Reading a log that other processes are still writing.

The test processes' logs get one ``os.write`` per line on an ``O_APPEND`` descriptor, so lines of
several writers never mix; but a reader may see a write half done (a read does not wait for a write
in progress on a regular file). :func:`complete_lines` leaves out a last line without its newline:
the writer is still on it, and the next poll reads it whole.
"""

from __future__ import annotations

from pathlib import Path


def complete_lines(path: Path) -> list[str]:
    """The lines of ``path`` its writers have finished (none if it does not exist yet)."""
    if not path.exists():
        return []
    text = path.read_text()
    return text[: text.rfind("\n") + 1].splitlines()
