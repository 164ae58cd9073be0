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


# ------------------------------------------------------------------ the layers
# From the bottom; a module may import its own room and any room below it, never one beside or above.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("segmenter",),
    ("refmsg",),
    ("reassembly._checks", "reassembly._errors", "reassembly._processes"),
    ("reassembly._framing", "reassembly._files", "reassembly._keyring", "reassembly._sqlite"),
    ("reassembly.assembler",),
    ("reassembly.resequencer", "reassembly.collector", "reassembly.segstore", "reassembly.dispatcher"),
    ("reassembly.storage",),  # the cores' storage and file adapters
    ("reassembly.runtime",),  # the runners: threads, tasks and processes around the dispatcher
    ("reassembly.spark.engine",),  # Spark itself: Java, the session, its settings, the bridge to the jar
    ("reassembly.spark", "reassembly.brokers", "reassembly.claimcheck"),  # the jobs: batch, streams
    ("reassembly.spark.incremental",),  # the batch job run again and again over what landed since
    ("reassembly.cli",),
    ("reassembly", "reassembly.__main__"),  # the public face and `python -m reassembly`
)


def _room(module: str) -> tuple[int, str] | None:
    """(floor, room) of a library module: the longest room name that is the module or a package above it."""
    best: tuple[int, str] | None = None
    for floor, rooms in enumerate(LAYERS):
        for room in rooms:
            if (module == room or module.startswith(room + ".")) and (best is None or len(room) > len(best[1])):
                best = (floor, room)
    return best


# The sans-I/O modules, by place: every module of the cores' rooms (state machines, models, rules, events,
# snapshot codecs) and each Spark processor's core. They take bytes and a clock and return events; files,
# sockets, processes, threads, clocks and Spark belong to the adapters above them (reassembly.storage
# holds the cores' storage and file adapters).
SANS_IO_ROOMS = (
    "reassembly._checks",
    "reassembly._framing",
    "reassembly.assembler",
    "reassembly.resequencer",
    "reassembly.collector",
    "reassembly.dispatcher",
)
SANS_IO = tuple(
    m
    for m in MODULES
    if any(m == room or m.startswith(room + ".") for room in SANS_IO_ROOMS)
    or m in ("reassembly.segstore.core", "reassembly.segstore.records")  # the segment store's decisions and
    # records; its SQL adapters share its folder
    or (m.startswith("reassembly.spark.") and m.rpartition(".")[2].endswith("core"))
)
IO_MODULES = (
    "os",
    "io",
    "pathlib",
    "shutil",
    "tempfile",
    "glob",
    "socket",
    "select",
    "selectors",
    "ssl",
    "subprocess",
    "signal",
    "threading",
    "multiprocessing",
    "asyncio",
    "time",
    "random",  # chance, like the clock, is passed in: a core answers the same to the same inputs
    "sqlite3",
    "psycopg",
    "pyspark",
    "py4j",
    "pyarrow",
    "proton",
    "confluent_kafka",
    "argparse",
    "reassembly.storage",  # every module of it, by place
    "reassembly._files",
    "reassembly._sqlite",
    "reassembly._processes",
    "reassembly._keyring",
    "segmenter.brokers",
)


def _offenders(roots: tuple[str, ...], forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{m}:{line} imports {name}"
        for m in MODULES
        if m.split(".")[0] in roots or m in roots or any(m.startswith(r + ".") for r in roots if "." in r)
        for name, line in _imports(m)
        if any(name == f or name.startswith(f + ".") for f in forbidden)
    ]


def _upward() -> list[str]:
    """Every import (lazy ones included) from a library module to a room beside or above its own."""
    found = []
    for m in MODULES:
        if m.split(".")[0] not in LIBRARY or (source := _room(m)) is None:
            continue
        for name, line in _imports(m):
            target = _room(_resolve(name)) if _resolve(name) else None
            if target is None or target[1] == source[1]:
                continue
            if target[0] >= source[0]:
                found.append(f"{m}:{line} imports {name} ({target[1]} is not below {source[1]})")
    return found


def test_the_graph_sees_the_modules_it_must_judge() -> None:
    expected = {
        "segmenter",
        "refmsg",
        "reassembly",
        "reassembly.cli.main",
        "reassembly.spark.batch.job",
        "reassembly._errors",
        "reassembly._files",
        "reassembly._processes",
        "reassembly._keyring",
        *SANS_IO,
    }
    assert expected - {"reassembly._framing"} <= MODULES.keys()
    cores = ("assembler.core", "resequencer.core", "collector.core", "spark.stream.core", "spark.resequence.core")
    assert {f"reassembly.{c}" for c in cores} <= set(SANS_IO)
    assert not [m for m in SANS_IO if m.startswith("reassembly.storage")]
    assert "reassembly.spark.batch.job" in GRAPH["reassembly.cli.run"]  # the command imports the plumbing
    assert all(_room(m) for m in MODULES if m.split(".")[0] in LIBRARY), [
        m for m in MODULES if m.split(".")[0] in LIBRARY and not _room(m)
    ]


def test_no_import_cycles_among_our_modules() -> None:
    assert _cycle() is None, " -> ".join(_cycle() or [])


def test_every_import_points_down_the_layers() -> None:
    assert _upward() == []


def test_nothing_imports_the_command() -> None:
    importers = {
        f"{m}:{line}"
        for m in MODULES
        for name, line in _imports(m)
        if _resolve(name).startswith("reassembly.cli") and not m.startswith(("reassembly.cli", "tests."))
    }
    # `python -m reassembly`; the command's own tests may call its functions in-process
    assert {i.partition(":")[0] for i in importers} == {"reassembly.__main__"}, importers


def test_the_cores_import_no_adapter() -> None:
    cores = ("reassembly.assembler", "reassembly.resequencer", "reassembly.collector", "reassembly.dispatcher")
    adapters = ("reassembly.storage", "reassembly.runtime", "reassembly.spark", "reassembly.brokers", "reassembly.cli")
    adapters += ("pyspark",)
    assert _offenders(cores, adapters) == []


def test_the_sans_io_modules_import_no_io() -> None:
    present = tuple(m for m in SANS_IO if m in MODULES)
    assert _offenders(present, IO_MODULES) == []


def test_segmenter_imports_nothing_of_ours() -> None:
    assert _offenders(("segmenter",), ("reassembly", "refmsg", "bench", "tests")) == []


def test_refmsg_knows_nothing_of_reassembly_spark_or_the_command_line() -> None:
    assert _offenders(("refmsg",), ("reassembly", "bench", "pyspark", "py4j", "argparse")) == []


@pytest.mark.parametrize("library", LIBRARY)
def test_the_library_imports_neither_tests_nor_bench(library: str) -> None:
    assert _offenders((library,), ("tests", "bench")) == []


def test_the_checker_resolves_relative_imports_and_finds_a_planted_cycle() -> None:
    assert "reassembly.cli.main" in GRAPH["reassembly.__main__"]
    GRAPH["reassembly.spark.batch.job"].add("reassembly.cli.run")  # the plumbing imports the command: a circle
    try:
        found = _cycle()
    finally:
        GRAPH["reassembly.spark.batch.job"].discard("reassembly.cli.run")
    assert found is not None and found[0] == found[-1]
    assert {"reassembly.cli.run", "reassembly.spark.batch.job"} <= set(found)


def test_the_checker_finds_a_planted_upward_import(tmp_path: Path) -> None:
    """A lazy import from the assembler up to Spark is caught, as is one between rooms on one floor."""
    assert _room("reassembly.assembler.core") == (4, "reassembly.assembler")
    assert _room("reassembly.dispatcher.core") == (5, "reassembly.dispatcher")
    assert _room("reassembly.runtime.threads") == (7, "reassembly.runtime")
    assert _room("reassembly.spark.engine.session") == (8, "reassembly.spark.engine")
    assert _room("reassembly.spark.stream.core") == (9, "reassembly.spark")
    assert _room("reassembly.spark.batch.pipeline") == (9, "reassembly.spark")
    assert _room("reassembly.spark.incremental.run") == (10, "reassembly.spark.incremental")
    source = (
        "def f():\n    from reassembly.spark.batch.job import open_job\n    from reassembly.collector import Rule\n"
    )
    planted = tmp_path / "planted.py"
    planted.write_text(source)
    MODULES["reassembly.resequencer.planted"] = planted
    try:
        found = _upward()
    finally:
        del MODULES["reassembly.resequencer.planted"]
    assert [f.split(" (")[0] for f in found if f.startswith("reassembly.resequencer.planted")] == [
        "reassembly.resequencer.planted:2 imports reassembly.spark.batch.job.open_job",
        "reassembly.resequencer.planted:3 imports reassembly.collector.Rule",
    ]


# The one module written by a tool (tools/render.py, from the header table): its length is the table's.
GENERATED = ("segmenter._decoder",)


def test_no_module_of_the_library_is_over_700_lines() -> None:
    """A module past 700 lines holds more than one concern: split it by what it does."""
    long = {
        m: n
        for m, path in MODULES.items()
        if m.startswith(LIBRARY) and m not in GENERATED and (n := len(path.read_text().splitlines())) > 700
    }
    assert long == {}
