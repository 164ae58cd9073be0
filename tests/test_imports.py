"""The import graph, read statically (AST, every import including those inside functions).

The rooms: ``segmenter`` is the ground floor and imports nothing of ours; ``refmsg`` is a codec
and receiver that knows nothing of ``reassembly``, Spark or the command line; the command
(``reassembly.cli.main``) imports the jobs and nothing imports it (only ``python -m reassembly``);
and no module of ours takes part in an import cycle, lazy imports included.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LIBRARY = ("segmenter", "reassembly", "refmsg")
OURS = (*LIBRARY, "bench", "tests")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources(roots: tuple[str, ...]) -> dict[str, Path]:
    """Every module by name: its ``.py``, or for a compiled one (``segmenter._fastwire``) its ``.pyi``."""
    paths = [p for root in roots for suffix in ("*.pyi", "*.py") for p in sorted((REPO / root).rglob(suffix))]
    return {_module_name(p): p for p in paths}  # a .py after its .pyi: the source wins


MODULES = _sources(OURS)


def _resolve(name: str) -> str:
    """The module a dotted name lands in: ``pkg.mod.func`` -> ``pkg.mod`` if that is a module of ours."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _imports(module: str) -> Iterator[tuple[str, int]]:
    """(imported name, line) for every import in ``module``; relative imports made absolute."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:  # `from pkg import mod` imports the module pkg.mod
                yield f"{base}.{alias.name}", node.lineno


def _edges(module: str) -> set[str]:
    return {target for name, _ in _imports(module) if (target := _resolve(name)) and target != module}


GRAPH = {m: _edges(m) for m in MODULES}


def _cycle() -> list[str] | None:
    """One import cycle among our modules (depth-first search), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(GRAPH[m]):
            if state.get(n) == 1:
                return [*path[path.index(n) :], n]
            if n not in state and (found := visit(n)):
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(GRAPH):
        if m not in state and (found := visit(m)):
            return found
    return None


def _offenders(roots: tuple[str, ...], forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{m}:{line} imports {name}"
        for m in MODULES
        if m.split(".")[0] in roots
        for name, line in _imports(m)
        if any(name == f or name.startswith(f + ".") for f in forbidden)
    ]


def test_the_graph_sees_the_modules_it_must_judge() -> None:
    assert {"segmenter", "refmsg", "reassembly", "reassembly.cli.main", "reassembly.spark.jobs"} <= MODULES.keys()
    assert "reassembly.spark.jobs" in GRAPH["reassembly.cli.main"]  # the command imports the plumbing


def test_no_import_cycles_among_our_modules() -> None:
    assert _cycle() is None, " -> ".join(_cycle() or [])


def test_nothing_imports_the_command() -> None:
    importers = {
        f"{m}:{line}" for m in MODULES for name, line in _imports(m) if _resolve(name) == "reassembly.cli.main"
    }
    assert {i.partition(":")[0] for i in importers} == {"reassembly.__main__"}, importers  # `python -m reassembly`


def test_segmenter_imports_nothing_of_ours() -> None:
    assert _offenders(("segmenter",), ("reassembly", "refmsg", "bench", "tests")) == []


def test_refmsg_knows_nothing_of_reassembly_spark_or_the_command_line() -> None:
    assert _offenders(("refmsg",), ("reassembly", "bench", "pyspark", "py4j", "argparse")) == []


@pytest.mark.parametrize("library", LIBRARY)
def test_the_library_imports_neither_tests_nor_bench(library: str) -> None:
    assert _offenders((library,), ("tests", "bench")) == []


def test_the_checker_resolves_relative_imports_and_finds_a_planted_cycle() -> None:
    assert "reassembly.cli.main" in GRAPH["reassembly.__main__"]  # `from .cli import main`
    GRAPH["reassembly.spark.jobs"].add("reassembly.cli.main")  # the command imports the plumbing: now a circle
    try:
        found = _cycle()
    finally:
        GRAPH["reassembly.spark.jobs"].discard("reassembly.cli.main")
    assert (
        found is not None and found[0] == found[-1] and {"reassembly.cli.main", "reassembly.spark.jobs"} <= set(found)
    )
