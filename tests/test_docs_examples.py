"""Every code block of the README and of the docs pages runs, as the page shows it.

The conventions a page follows (the docs site's house rules):

- A ```python block runs in a fresh namespace (``__name__ == "__main__"``), its working directory a
  fresh temporary directory. Its first comment lines may say:

  ``# fixture: spark, tmp_path, landing``
      names injected into the namespace: ``spark`` (the test run's local SparkSession),
      ``tmp_path`` (a ``pathlib.Path``, an empty directory), ``landing`` (a ``pathlib.Path``, the
      directory ``landing`` in the working directory: Parquet files of encoded segments in a
      binary column ``segment``, see :func:`_write_landing`);
  ``# continues the previous block``
      runs in the namespace and working directory of the page's previous block (which runs first
      if it was deselected; if it failed, this one is skipped). A page with such blocks is one
      ``xdist_group``: its blocks run on one worker, in the page's order; a block that already ran
      in this process, in a later block's chain, is not run again;
  ``# not run: <reason>``
      not run (e.g. it needs Spark's Kafka connector): it must still parse, its imports of our
      packages must resolve, and it is listed by ``test_blocks_not_run_say_why``, never skipped.

- A ```bash block runs only if the line before its fence is ``<!-- run -->``: then with
  ``bash -e`` in a fresh temporary directory holding ``landing/`` (as above), the venv's ``bin``
  first on ``PATH``. Each ``reassemble`` the block calls runs in the test process, on the shared
  session (``tests/support/command.py``'s ``shell``): the page shows what the command parses,
  writes and prints, which needs no JVM of its own; the process itself is tested in ``tests/cli``.
- Other fences (```text, ```json, ```console) are shown, not run.

A case is named after its page and the block's place among the page's collected blocks (python
blocks and run bash blocks, counted from 1): ``-k streaming.md`` runs one page's blocks. A failure
names the Markdown line of the block; a Python traceback points into the page itself.
``DOCS_EXAMPLES_README=PATH`` checks another README file in place of ``README.md`` (a draft).
"""

from __future__ import annotations

import ast
import importlib
import os
import re
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.command import shell

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
FIXTURES = ("spark", "tmp_path", "landing")
OURS = ("segmenter", "reassembly", "refmsg")

# Floors, so that a collector that silently finds nothing cannot pass: raise them as pages grow.
MIN_README_PYTHON_BLOCKS = 3
MIN_DOCS_BLOCKS_RUN = 60

_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\n]*?)\s*$")


@dataclass
class Block:
    """One collected code block: a page's python block or run bash block."""

    page: str  # "README.md" or the path below docs/, e.g. "how-to/streaming.md"
    path: Path
    number: int  # its place among the page's collected blocks, from 1
    line: int  # the Markdown line of its first code line
    lang: str  # "python" or "bash"
    code: str
    fixtures: tuple[str, ...] = ()
    continues: bool = False
    not_run: str | None = None  # the reason, if marked (or if it continues a block not run)
    previous: Block | None = field(default=None, repr=False)  # the page's previous python block

    @property
    def id(self) -> str:
        return f"{self.page}:{self.number}"


def _code_blocks(text: str) -> Iterator[tuple[str, int, str, str]]:
    """(info string, first code line number, code, the line before the opening fence) of each fenced block."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence, info = len(opening["indent"]), opening["fence"], opening["info"]
        before = lines[i - 1].strip() if i else ""
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            closing = _FENCE.match(lines[j])
            if (
                closing
                and closing["fence"][0] == fence[0]
                and len(closing["fence"]) >= len(fence)
                and not closing["info"]
            ):
                break
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
            j += 1
        yield info, i + 2, "\n".join(body) + "\n", before
        i = j + 1


def _header(code: str) -> tuple[tuple[str, ...], bool, str | None]:
    """The conventions the block's first comment lines state: (fixtures, continues, not-run reason)."""
    fixtures: tuple[str, ...] = ()
    continues = False
    not_run = None
    for raw in code.splitlines():
        line = raw.strip()
        if not line.startswith("#"):
            break
        comment = line.lstrip("#").strip()
        if m := re.fullmatch(r"fixtures?:\s*(.*)", comment):
            # "spark (a local SparkSession)": a name may be followed by what it is, in brackets
            fixtures += tuple(name.split("(")[0].strip() for name in m.group(1).split(",") if name.strip())
        elif re.fullmatch(r"continues the previous block\.?", comment):
            continues = True
        elif m := re.fullmatch(r"not run:\s*(.*)", comment):
            not_run = m.group(1).strip()
    return fixtures, continues, not_run


def _page_blocks(path: Path, page: str) -> list[Block]:
    blocks: list[Block] = []
    previous: Block | None = None
    for info, line, code, before in _code_blocks(path.read_text(encoding="utf-8")):
        lang = info.split()[0] if info else ""
        if lang == "python":
            fixtures, continues, not_run = _header(code)
            block = Block(page, path, len(blocks) + 1, line, "python", code, fixtures, continues, not_run)
            if continues:
                block.previous = previous
                if previous is not None and previous.not_run is not None and not_run is None:
                    block.not_run = f"continues a block not run ({previous.not_run})"
            blocks.append(block)
            previous = block
        elif lang in ("bash", "sh", "shell") and before == "<!-- run -->":
            blocks.append(Block(page, path, len(blocks) + 1, line, "bash", code))
    return blocks


def _pages() -> list[tuple[Path, str]]:
    readme = Path(os.environ.get("DOCS_EXAMPLES_README") or REPO / "README.md")
    pages = [(readme, "README.md")] if readme.exists() else []
    build = DOCS / "_build"
    for path in sorted(DOCS.rglob("*.md")):
        if build not in path.parents:
            pages.append((path, path.relative_to(DOCS).as_posix()))
    return pages


def collect() -> list[Block]:
    return [block for path, page in _pages() for block in _page_blocks(path, page)]


BLOCKS = collect()
RUN = [b for b in BLOCKS if b.not_run is None]
NOT_RUN = [b for b in BLOCKS if b.not_run is not None]


# --- the landing table the pages use -------------------------------------------------------------

LANDING_FILES = 2


def _write_landing(directory: Path) -> Path:
    """20 messages (each fault kind of ``reassembly.spark.testdata.FAULTS`` twice) of 3 segments of
    1 KiB, plus 2 MQ groups of 4 messages (one missing its third), shuffled over 2 Parquet files."""
    from reassembly.spark.testdata import generate, write_parquet

    return write_parquet(generate(n_messages=20, segments_per_message=3, segment_size=1024), directory, LANDING_FILES)


@pytest.fixture(scope="module")
def landing(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The landing table, written once; each block that names it gets a copy in its own directory."""
    return _write_landing(tmp_path_factory.mktemp("docs-landing") / "landing")


# --- running a block -----------------------------------------------------------------------------


@dataclass
class _Ran:
    namespace: dict[str, Any]
    cwd: Path
    failed: bool = False


_RAN: dict[str, _Ran] = {}


def _venv_bin() -> Path:
    return Path(sys.executable).parent  # not resolved: the venv's bin, not the base interpreter's


def _run_python(block: Block, request: pytest.FixtureRequest) -> None:
    ran_before = _RAN.get(block.id)
    if ran_before is not None:
        # It ran in this process already, first in the chain of a later block this process ran
        # (`-k`, or a lane whose worker got the later block first): running it again in the same
        # namespace would meet its own first run's state (a consumer group's committed offsets, the
        # files it wrote). Its outcome then stands.
        if ran_before.failed:
            pytest.fail(f"{block.id} (line {block.line}) failed when a later block of its page ran it first")
        return
    if block.continues:
        if block.previous is None:
            pytest.fail(f"{block.id} (line {block.line}) continues the previous block, but it is the page's first")
        ran = _RAN.get(block.previous.id)
        if ran is None:  # deselected: run the page's chain up to here first
            _run_python(block.previous, request)
            ran = _RAN[block.previous.id]
        if ran.failed:
            pytest.skip(f"the block it continues ({block.previous.id}) failed")
        state = ran
    else:
        cwd = request.getfixturevalue("tmp_path_factory").mktemp("cwd")
        state = _Ran({"__name__": "__main__", "__builtins__": __builtins__}, cwd)
    for name in block.fixtures:
        if name == "landing":
            source = request.getfixturevalue("landing")
            target = state.cwd / "landing"
            if not target.exists():
                shutil.copytree(source, target)
            state.namespace["landing"] = target
        else:
            state.namespace[name] = request.getfixturevalue(name)
    _RAN[block.id] = state
    previous_cwd = Path.cwd()
    os.chdir(state.cwd)
    # Line numbers of the page, so that a traceback shows the page's own lines.
    code = compile("\n" * (block.line - 1) + block.code, str(block.path), "exec")
    try:
        exec(code, state.namespace)
    except BaseException:
        state.failed = True
        raise
    finally:
        os.chdir(previous_cwd)
        if "spark" in block.fixtures:
            for query in request.getfixturevalue("spark").streams.active:  # a block's stream never outlives it
                query.stop()


def _run_bash(block: Block, tmp_path: Path, landing: Path) -> None:
    shutil.copytree(landing, tmp_path / "landing")
    env = {**os.environ, "PATH": f"{_venv_bin()}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    done = shell(block.code, tmp_path, env)  # its `reassemble` runs in this process, on the shared session
    if done.returncode != 0:
        pytest.fail(
            f"{block.id} (line {block.line}) exited {done.returncode}\n"
            f"--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}",
            pytrace=False,
        )


def _starts_spark(block: Block) -> bool:
    """Whether a block runs Spark: it, or a block of the chain it continues, names the ``spark`` fixture,
    or it is a shell block running the command. Such a block is marked ``spark`` (CI's Spark lane)."""
    if block.lang == "bash":
        return "reassemble " in block.code
    chained: Block | None = block
    while chained is not None:
        if "spark" in chained.fixtures:
            return True
        chained = chained.previous if chained.continues else None
    return False


def _marks(block: Block) -> list[pytest.MarkDecorator]:
    """``spark`` for a block that runs Spark; a page whose blocks continue each other is one
    ``xdist_group``: its blocks run on one worker, in the page's order, each chain once."""
    marks = [pytest.mark.spark] if _starts_spark(block) else []
    if block.page in _CHAINED_PAGES:
        marks.append(pytest.mark.xdist_group(f"docs:{block.page}"))
    return marks


_CHAINED_PAGES = frozenset(b.page for b in BLOCKS if b.continues)


@pytest.mark.parametrize("block", [pytest.param(b, id=b.id, marks=_marks(b)) for b in RUN])
def test_block_runs(block: Block, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    unknown = set(block.fixtures) - set(FIXTURES)
    assert not unknown, f"{block.id} (line {block.line}) names fixtures that do not exist: {sorted(unknown)}"
    if block.lang == "bash":
        _run_bash(block, tmp_path, request.getfixturevalue("landing"))
    else:
        _run_python(block, request)


# --- what is not run, and the collection itself --------------------------------------------------


def _imports(code: str) -> list[tuple[str, str | None]]:
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found += [(node.module, alias.name) for alias in node.names]
    return [(module, name) for module, name in found if module.split(".")[0] in OURS]


def test_blocks_not_run_say_why() -> None:
    """Blocks marked ``# not run: <reason>`` are counted here (and shown with ``-s``), never skipped.

    Each still parses and its imports of our packages resolve, so it cannot rot unseen.
    """
    problems = []
    for block in NOT_RUN:
        if not block.not_run:
            problems.append(f"{block.id} (line {block.line}): '# not run:' without a reason")
        try:
            imports = _imports(block.code)
        except SyntaxError as exc:
            problems.append(f"{block.id} (line {block.line}): does not parse: {exc}")
            continue
        for module, name in imports:
            try:
                imported = importlib.import_module(module)
            except ImportError as exc:
                problems.append(f"{block.id} (line {block.line}): {module}: {exc}")
                continue
            if name is not None and name != "*" and not hasattr(imported, name):
                try:
                    importlib.import_module(f"{module}.{name}")
                except ImportError:
                    problems.append(f"{block.id} (line {block.line}): from {module} import {name}")
    print(f"\n{len(RUN)} blocks run, {len(NOT_RUN)} not run:")
    for block in NOT_RUN:
        print(f"  {block.id} (line {block.line}): {block.not_run}")
    assert problems == []


def test_python_examples_are_fenced_so_that_they_run() -> None:
    """Python shown under another fence (```py, ```{code-block} python, ```pycon) would escape this test."""
    odd = [
        f"{page}:{line}: ```{info}"
        for path, page in _pages()
        for info, line, _code, _before in _code_blocks(path.read_text(encoding="utf-8"))
        if re.fullmatch(r"(py|python3|pycon|ipython3?|\{code-block\}\s+py(thon)?3?|\{code\}\s+py(thon)?3?)\b.*", info)
    ]
    assert odd == []


def test_the_pages_hold_the_blocks_they_should() -> None:
    readme = [b for b in BLOCKS if b.page == "README.md" and b.lang == "python"]
    docs_run = [b for b in RUN if b.page != "README.md"]
    print(
        f"\nREADME: {len(readme)} python blocks; docs: {len(docs_run)} blocks run "
        f"({sum(b.lang == 'bash' for b in docs_run)} bash), {sum(b.page != 'README.md' for b in NOT_RUN)} not run"
    )
    assert len(readme) >= MIN_README_PYTHON_BLOCKS
    assert len(docs_run) >= MIN_DOCS_BLOCKS_RUN


def test_the_collector_reads_the_conventions(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n```python\n# fixture: spark, landing\nx = 1\n```\n\n"
        "text\n\n```python\n# continues the previous block\nprint(x)\n```\n\n"
        "```bash\nreassemble --help\n```\n\n<!-- run -->\n```bash\nreassemble --version\n```\n\n"
        "```text\nout\n```\n\n"
        "- a list\n\n  ```python\n  # not run: needs Spark's Kafka connector\n  spark.readStream\n  ```\n\n"
        "```python\n# continues the previous block\nprint(2)\n```\n"
    )
    blocks = _page_blocks(page, "page.md")
    assert [(b.id, b.lang, b.line) for b in blocks] == [
        ("page.md:1", "python", 4),
        ("page.md:2", "python", 11),
        ("page.md:3", "bash", 21),
        ("page.md:4", "python", 31),
        ("page.md:5", "python", 36),
    ]
    assert blocks[0].fixtures == ("spark", "landing") and not blocks[0].continues
    assert blocks[1].continues and blocks[1].previous is blocks[0] and blocks[1].not_run is None
    assert blocks[3].not_run == "needs Spark's Kafka connector" and blocks[3].code.startswith("# not run")
    assert blocks[4].not_run is not None and blocks[4].not_run.startswith("continues a block not run")


def test_the_landing_table_is_what_the_pages_say(landing: Path) -> None:
    import pyarrow.parquet as pq

    files = sorted(landing.glob("*.parquet"))
    assert len(files) == LANDING_FILES
    assert all(pq.read_schema(f).names == ["segment"] for f in files)
