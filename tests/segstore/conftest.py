"""Stores for the segment-store tests: SQLite in tmp_path, PostgreSQL on a throwaway server."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from reassembly.segstore import SegmentStore, open_store
from tests.support.pg_server import fresh_database, postgres_server

_names = itertools.count()


@pytest.fixture(scope="session")
def pg_server_url() -> Iterator[str]:
    """One PostgreSQL server for the session's segment-store tests."""
    with postgres_server() as url:
        yield url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.servers)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty store of each kind."""
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'segments.db'}"
    server: str = request.getfixturevalue("pg_server_url")
    return fresh_database(server, f"segstore_{next(_names)}")


@pytest.fixture
def open_member(store_url: str) -> Iterator[Callable[..., SegmentStore]]:
    """Open members of the store (closed at the end)."""
    opened: list[SegmentStore] = []

    def member(name: str, **options: object) -> SegmentStore:
        s = open_store(store_url, member=name, **options)
        opened.append(s)
        return s

    yield member
    for s in opened:
        s.close()
