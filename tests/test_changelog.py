"""CHANGELOG.md: each entry one to three lines that say what changed and link to the page that says
more (a page of ``docs/`` that exists, an anchor of it allowed)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\((docs/[\w./-]+\.md)(#[\w-]+)?\)")


def _entries() -> list[list[str]]:
    entries: list[list[str]] = []
    for line in (REPO / "CHANGELOG.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("- "):
            entries.append([line])
        elif line.startswith("  ") and entries:
            entries[-1].append(line)
        elif entries and entries[-1] and not line.startswith("  "):
            entries.append([])  # a heading or a blank line ends the entry
    return [e for e in entries if e]


def test_every_entry_is_one_to_three_lines_and_links_to_its_page() -> None:
    entries = _entries()
    assert len(entries) > 10
    too_long = [e[0] for e in entries if len(e) > 3 or any(len(line) > 120 for line in e)]
    assert too_long == []
    unlinked = [e[0] for e in entries if not LINK.search(" ".join(e))]
    assert unlinked == []
    missing = {m.group(1) for e in entries for m in LINK.finditer(" ".join(e)) if not (REPO / m.group(1)).is_file()}
    assert missing == set()
