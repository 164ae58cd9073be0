"""Fixtures of the Spark tests beyond the one session of the run (tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from reassembly.spark.engine.state_store import CHANGELOG, PROVIDER, ROCKSDB


@pytest.fixture(scope="module")
def stream_spark(spark: Any) -> Iterator[Any]:
    """The run's session with the state store the streaming jobs need, as ``configure()`` sets it, for
    one module's tests; put back after."""
    keys = {PROVIDER: ROCKSDB, CHANGELOG: "true"}
    for key, value in keys.items():
        spark.conf.set(key, value)
    yield spark
    for key in keys:
        spark.conf.unset(key)
