"""Fixtures of the command's tests that start something big once per test run: the library's wheel and a
loopback standalone cluster (tests/support/cluster.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import build_wheel, standalone_cluster


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The library's wheel, built by pip from a copy of the source."""
    return build_wheel(tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="session")
def cluster_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cluster's directory: its logs, and each worker's work directory ``w<i>`` (the executors' own,
    where an archive passed with ``--archives`` is unpacked)."""
    return tmp_path_factory.mktemp("cluster")


@pytest.fixture(scope="session")
def cluster(cluster_dir: Path) -> Iterator[str]:
    """A master and two one-core workers on 127.0.0.1, stopped by PID whatever happens: its URL."""
    with standalone_cluster(cluster_dir) as url:
        yield url
