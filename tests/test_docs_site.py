"""The docs site: its API pages document every public name, its generated tables follow the code,
and it renders offline.

The API pages and the reason-code table are generated when Sphinx reads them, by
``docs/_ext/reference.py``; these tests check that extension against the source (every module
that assigns ``__all__``, found by reading the files, not by the extension's own walk) and against
a built site (its inventory names every public name; its pages load nothing from the network).
The site is built once, without ``-W``: a warning fails ``test_the_site_builds_without_a_warning``
(CI's docs check), and a page in progress elsewhere does not hide what the other tests check.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
PACKAGES = ("segmenter", "reassembly", "refmsg")

pytest.importorskip("sphinx", reason='the docs extra: pip install -e ".[docs]"')

pytestmark = pytest.mark.xdist_group("docs-site")  # one worker builds the site once, for every test here


def _extension() -> ModuleType:
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        return importlib.import_module("reference")
    finally:
        sys.path.remove(str(DOCS / "_ext"))


ref = _extension()


def _targets(node: ast.Assign | ast.AnnAssign | ast.AugAssign) -> list[ast.expr]:
    return node.targets if isinstance(node, ast.Assign) else [node.target]


def _modules_assigning_all() -> set[str]:
    """Every module of ours whose source assigns ``__all__`` (read from the files, nothing imported)."""
    found = set()
    for top in PACKAGES:
        for path in (REPO / top).rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            assigns = any(
                isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign))
                and any(isinstance(t, ast.Name) and t.id == "__all__" for t in _targets(node))
                for node in tree.body
            )
            if assigns:
                parts = path.relative_to(REPO).with_suffix("").parts
                found.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


def test_the_api_pages_cover_every_module_with_all() -> None:
    assert set(ref.public_modules()) == _modules_assigning_all()
    groups = {ref.group_of(m) for m in ref.public_modules()}  # every module falls in a page's group
    assert groups == set(ref.GROUPS)


def test_every_name_of_every_all_has_an_entry() -> None:
    listed = {(e.module, e.name) for e in ref.entries()}
    for module in ref.public_modules():
        names = importlib.import_module(module).__all__
        assert {(module, n) for n in names} <= listed, module
    # each canonical path is documented once, by an entry that is its own canonical
    homes = {e.canonical for e in ref.entries() if e.path == e.canonical}
    assert {e.canonical for e in ref.entries()} == homes


def test_each_group_has_its_page_and_the_api_index_lists_them() -> None:
    index = (DOCS / "reference" / "api.md").read_text()
    for group in ref.GROUPS:
        page = DOCS / "reference" / "api" / f"{group}.md"
        assert f"<!-- api: {group} -->" in page.read_text(), page
        assert f"api/{group}\n" in index and f"(api/{group}.md)" in index


def test_the_generated_markdown_names_every_entry() -> None:
    text = "\n".join(ref.api_markdown(group) for group in ref.GROUPS)
    for e in ref.entries():
        if e.path == e.canonical:
            assert re.search(rf"^\.\. auto\w+:: {re.escape(e.path)}$", text, re.M), e.path
        else:
            assert f"- `{e.name}`: {{py:obj}}`{e.canonical}`" in text, e.path


def test_the_reason_table_has_every_member_with_mq_name_and_meaning() -> None:
    from segmenter import Reason

    rows = ref.reason_rows()
    assert [code for code, *_ in rows] == sorted(int(r) for r in Reason)
    for code, name, mq, meaning in rows:
        assert Reason(code).name == name
        assert bool(mq) == (code < 9000), f"{name}: MQ's name for MQ's codes only ({mq!r})"
        assert meaning, f"Reason.{name} needs a '# what it means' comment in segmenter/errors.py"
    assert ("MSG_TOO_BIG", "MQRC_MSG_TOO_BIG_FOR_Q") in {(n, mq) for _, n, mq, _ in rows}
    assert "<!-- reason-codes -->" in (DOCS / "reference" / "reason-codes.md").read_text()


# --- the built site --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The site, built once for the module (its tests share one worker: the module's xdist group), and
    what Sphinx wrote on stderr (``-q``: its warnings only)."""
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-q", "-b", "html", "-d", str(out / ".doctrees"), str(DOCS), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return out, done.stderr


@pytest.fixture(scope="module")
def site(built: tuple[Path, str]) -> Path:
    return built[0]


def test_the_site_builds_without_a_warning(built: tuple[Path, str]) -> None:
    """CI's docs check (``sphinx-build -W`` would stop at the first): every warning, a broken link or
    reference included, fails this test, and only this one."""
    assert built[1].strip() == "", built[1][-4000:]


def _inventory(site: Path) -> dict[str, str]:
    """name -> role of every object in the site's objects.inv."""
    raw = (site / "objects.inv").read_bytes()
    body = zlib.decompress(raw.split(b"\n", 4)[4]).decode()
    found = {}
    for line in body.splitlines():
        m = re.match(r"(\S+)\s+(\w+:\w+)\s+-?\d+\s+(\S+)", line)
        if m:
            found[m.group(1)] = m.group(2)
    return found


def test_the_built_api_documents_every_public_name(site: Path) -> None:
    objects = _inventory(site)
    missing = sorted({e.canonical for e in ref.entries()} - set(objects))
    assert missing == []
    assert {m for m in ref.public_modules() if not any(e.canonical == m for e in ref.entries())} <= set(objects)


def test_the_api_shows_field_meanings_not_field_numbers(site: Path) -> None:
    """A NamedTuple's field shows its attribute docstring (or nothing, its record's docstring naming
    it), never ``collections``' "Alias for field number N"."""
    api = site / "reference" / "api"
    pages = {p.name: p.read_text(encoding="utf-8") for p in api.glob("*.html")}
    assert [name for name, html in pages.items() if "Alias for field number" in html] == []
    assert "24-byte identifier (MQ" in pages["segmenter.html"]  # SegmentHeader.group_id's docstring


def test_the_command_line_page_has_every_subcommand(site: Path) -> None:
    import argparse

    from reassembly.cli.main import parser

    actions = [a for a in parser()._actions if isinstance(a, argparse._SubParsersAction)]
    commands = set(actions[0].choices)
    text = (site / "reference" / "cli.html").read_text()
    assert commands and {c for c in commands if f'id="reassemble-{c}"' not in text} == set()
    assert "--raw-column" in text  # options as typed: no "--" turned into a dash


def _html_and_css(site: Path) -> Iterator[tuple[Path, str]]:
    for path in site.rglob("*"):
        if path.suffix in (".html", ".css", ".js") and "_sources" not in path.parts:
            yield path, path.read_text(encoding="utf-8", errors="replace")


def test_the_site_renders_offline(site: Path) -> None:
    """Nothing a page loads comes from the network: no web fonts, styles, scripts or images."""
    loads = re.compile(
        r"<(?:link|script|img|iframe|source)\b[^>]*\b(?:href|src)=[\"'](?:https?:)?//"
        r"|@import\s+(?:url\()?[\"']?(?:https?:)?//"
        r"|url\([\"']?(?:https?:)?//"
        r"|@font-face[^}]*(?:https?:)?//",
        re.I,
    )
    hits = [
        f"{path.relative_to(site)}: {m.group(0)}" for path, text in _html_and_css(site) for m in loads.finditer(text)
    ]
    assert hits == []


def test_the_pages_link_no_page_that_is_not_there(site: Path) -> None:
    assert (site / "index.html").exists() and (site / "reference" / "reason-codes.html").exists()
    text = (site / "reference" / "reason-codes.html").read_text()
    assert "MQRC_INCOMPLETE_MSG" in text and "9001" in text
