"""The code and the documentation speak of themselves as they are: no development history and no
development machine in them.

History lives in git and ``CHANGELOG.md``; a comment says why the code is as it is now and names the
command that measures a figure it quotes; a page says what the library does now. A path of a
developer's machine means nothing elsewhere.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HISTORY = re.compile(r"(?i)\b(session|stop|issue)s? [0-9]+")
# "until X it did Y" in prose: a past version named as a point in time, or what something used to do.
PAST = re.compile(
    r"\b[Uu]ntil (now|recently|lately|the fix|this (change|release|version)|(v|version )?[0-9]+\.[0-9]+)\b"
    r"|\b([Ii]t|[Tt]his|[Tt]hat|[Tt]hey) used to\b|\b([Pp]reviously|[Ff]ormerly)\b"
)
MACHINE = re.compile(r"(?<![\w.])/(work|root|home|Users)/[\w.-]+")
THIS = Path(__file__).resolve()


def _sources() -> list[Path]:
    roots = [REPO / "segmenter", REPO / "reassembly", REPO / "refmsg", REPO / "tests", REPO / "tools", REPO / "jvm"]
    files = [p for root in roots for p in root.rglob("*") if p.suffix in (".py", ".pyi", ".c", ".h", ".java")]
    return sorted({*files, *(REPO / "bench").glob("*.py")} - {THIS})


def _doc_pages() -> list[Path]:
    """The README, every page of the docs site (not a built copy) and the benchmarks' README."""
    build = REPO / "docs" / "_build"
    pages = [p for p in (REPO / "docs").rglob("*.md") if build not in p.parents]
    return sorted([REPO / "README.md", REPO / "bench" / "README.md", *pages])


def _hits(pattern: re.Pattern[str], files: list[Path] | None = None) -> list[str]:
    return [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in (_sources() if files is None else files)
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line)
    ]


def test_the_checked_tree_is_the_whole_library() -> None:
    names = {p.relative_to(REPO).parts[0] for p in _sources()}
    assert names == {"segmenter", "reassembly", "refmsg", "tests", "tools", "bench", "jvm"}
    assert any(p.suffix == ".java" for p in _sources())


def test_no_development_history_in_code_comments_or_tests() -> None:
    assert _hits(HISTORY) == []


def test_no_development_history_in_the_documentation() -> None:
    assert _hits(HISTORY, _doc_pages()) + _hits(PAST, _doc_pages()) == []


def test_the_documentation_checked_is_all_of_it() -> None:
    names = {p.relative_to(REPO).as_posix() for p in _doc_pages()}
    assert {"README.md", "bench/README.md", "docs/index.md"} <= names
    assert not any(n.startswith("docs/_build/") for n in names)


def test_no_path_of_a_development_machine() -> None:
    assert _hits(MACHINE) == []


def test_the_patterns_catch_what_they_are_for() -> None:
    assert HISTORY.search("# until stop 25 the store kept it") and HISTORY.search('"(issue 11)"')
    assert HISTORY.search("bench/README.md, Session 29") and not HISTORY.search("a SparkSession 4 times")
    assert MACHINE.search("see /work/shared/NOTES.md") and not MACHINE.search("s3://bucket/work/x")
    assert PAST.search("(it used to be refused as a ...)") and PAST.search("until 0.3 the store kept it")
    assert not PAST.search("segments used to build it") and not PAST.search("wait until the batch commits")
