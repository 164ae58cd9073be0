"""The code speaks of itself as it is: no development history and no development machine in it.

History lives in git and ``CHANGELOG.md``; a comment says why the code is as it is now and names the
command that measures a figure it quotes. A path of a developer's machine means nothing elsewhere.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HISTORY = re.compile(r"(?i)\b(session|stop|issue)s? [0-9]+")
MACHINE = re.compile(r"(?<![\w.])/(work|root|home|Users)/[\w.-]+")
THIS = Path(__file__).resolve()


def _sources() -> list[Path]:
    roots = [REPO / "segmenter", REPO / "reassembly", REPO / "refmsg", REPO / "tests", REPO / "tools"]
    files = [p for root in roots for p in root.rglob("*") if p.suffix in (".py", ".pyi", ".c", ".h")]
    return sorted({*files, *(REPO / "bench").glob("*.py")} - {THIS})


def _hits(pattern: re.Pattern[str]) -> list[str]:
    return [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in _sources()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line)
    ]


def test_the_checked_tree_is_the_whole_library() -> None:
    names = {p.relative_to(REPO).parts[0] for p in _sources()}
    assert names == {"segmenter", "reassembly", "refmsg", "tests", "tools", "bench"}


def test_no_development_history_in_code_comments_or_tests() -> None:
    assert _hits(HISTORY) == []


def test_no_path_of_a_development_machine() -> None:
    assert _hits(MACHINE) == []


def test_the_patterns_catch_what_they_are_for() -> None:
    assert HISTORY.search("# until stop 25 the store kept it") and HISTORY.search('"(issue 11)"')
    assert HISTORY.search("bench/README.md, Session 29") and not HISTORY.search("a SparkSession 4 times")
    assert MACHINE.search("see /work/shared/NOTES.md") and not MACHINE.search("s3://bucket/work/x")
