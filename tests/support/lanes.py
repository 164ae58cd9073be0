"""CI's check that its lanes run the README command's tests: ``python -m tests.support.lanes ARGS
README_M LANE_M... --rest CI_M --all ALL_M``.

One collection of the whole suite with the README command's other pytest arguments (``ARGS``, one
shell-quoted string), then every ``-m`` expression evaluated on each collected test as pytest's own
``-m`` does (``Expression`` over ``MarkMatcher.from_markers(item.iter_markers())``), on the markers
as they stand once every ``pytest_collection_modifyitems`` hook has run (``tests/conftest.py`` adds
``spark`` and ``servers`` there). It replaces one collection per expression: each imports the suite,
about 8 s of CPU (``time .venv/bin/pytest --collect-only -q -m "not slow"``).

It checks that the lanes (``LANE_M...``) select exactly the README command's tests (``README_M``),
each once, and that the README command with CI's own lane (``CI_M``) selects every test ``ALL_M``
does, each once; it prints the counts, or what is missing or doubled, and exits 1.

:func:`refuse_server` keeps the quick lane's promise: ``.ci/run`` runs that lane with
:data:`NO_SERVERS` set, while it installs the Debian servers beside it, and a test that starts
PostgreSQL or ActiveMQ there fails naming the marker it lacks.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shlex
import sys
from typing import Any

import pytest
from _pytest.mark import MarkMatcher
from _pytest.mark.expression import Expression

# Set by `.ci/run` for its quick lane (`-m "not spark and not servers"`): no test there may start a
# server, the Debian ones being installed beside that lane.
NO_SERVERS = "REASSEMBLY_TEST_NO_SERVERS"


def refuse_server(what: str) -> None:
    """Fail the test starting ``what`` in a lane that starts no server (:data:`NO_SERVERS` set)."""
    if os.environ.get(NO_SERVERS):
        pytest.fail(
            f"{what} started in a lane that starts no server ({NO_SERVERS} set): mark the test `servers`"
            " (tests/conftest.py marks the users of SERVER_FIXTURES; a parameter that asks for a server"
            " at run time carries the mark itself)",
            pytrace=False,
        )


class _Markers:
    """Each collected test's id and markers, read after the other hooks have changed them."""

    def __init__(self) -> None:
        self.items: list[tuple[str, MarkMatcher]] = []

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        self.items = [(item.nodeid, MarkMatcher.from_markers(item.iter_markers())) for item in items]


def select(items: list[tuple[str, Any]], expr: str) -> list[str]:
    compiled = Expression.compile(expr)
    return [nodeid for nodeid, matcher in items if compiled.evaluate(matcher)]


def partition_errors(whole: list[str], parts: dict[str, list[str]], name: str) -> list[str]:
    """What keeps ``parts`` from being ``whole`` cut in pieces: tests in none or several, or in no whole."""
    errors = []
    wanted = set(whole)
    counts: dict[str, int] = {}
    for ids in parts.values():
        for nodeid in ids:
            counts[nodeid] = counts.get(nodeid, 0) + 1
    errors += [f"{name}: run by none of {', '.join(parts)}: {i}" for i in whole if i not in counts]
    errors += [f"{name}: run {n} times: {i}" for i, n in counts.items() if n > 1 and i in wanted]
    errors += [f"{name}: run, but not one of its tests: {i}" for i in counts if i not in wanted]
    return errors


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.support.lanes", description=__doc__)
    p.add_argument("args", help="the README command's pytest arguments without -m (one shell-quoted string)")
    p.add_argument("readme", help="the README command's -m")
    p.add_argument("lanes", nargs="+", help="each lane's -m")
    p.add_argument("--rest", required=True, help="CI's own lane's -m")
    p.add_argument("--all", required=True, help="what the README command and CI's own lane run together")
    a = p.parse_args(argv)
    markers = _Markers()
    listing = io.StringIO()  # the ids, one a line: printed only when the collection fails
    with contextlib.redirect_stdout(listing):
        code = pytest.main([*shlex.split(a.args), "--collect-only", "-q", "-p", "no:cacheprovider"], plugins=[markers])
    if code != 0 or not markers.items:
        print(listing.getvalue()[-5000:], f"the collection failed (pytest exit {code})", sep="\n", file=sys.stderr)
        return 1
    readme = select(markers.items, a.readme)
    lanes = {f"lane {i} (-m {expr!r})": select(markers.items, expr) for i, expr in enumerate(a.lanes, 1)}
    rest = select(markers.items, a.rest)
    errors = partition_errors(readme, lanes, f"the README command's tests (-m {a.readme!r})")
    together = {"the README command": readme, f"CI's own lane (-m {a.rest!r})": rest}
    errors += partition_errors(select(markers.items, a.all), together, f"-m {a.all!r}")
    if not readme or not rest or not all(lanes.values()):
        errors.append("a selection is empty")
    for line in errors[:20]:
        print(line, file=sys.stderr)
    if errors:
        return 1
    sizes = ", ".join(str(len(v)) for v in lanes.values())
    print(f"{len(readme)} tests of the README command in {len(lanes)} lanes ({sizes}), {len(rest)} in CI's own")
    return 0


if __name__ == "__main__":
    sys.exit(main())
