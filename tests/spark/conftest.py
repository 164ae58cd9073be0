"""Fixtures of the Spark tests beyond the one session of the run (tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from reassembly.spark.engine.state_store import CHANGELOG, PROVIDER, ROCKSDB


@pytest.fixture(scope="module")
def stream_spark(spark: Any) -> Iterator[Any]:
    """The run's session with the state store the streaming jobs need, and a state partition per core,
    as ``configure()`` sets them, for one module's tests; put back after.

    The partitions matter for time, not for what a stream computes: every micro-batch opens, commits
    and maintains one RocksDB store per state partition. With 8 state partitions on two cores
    ``pytest -p no:xdist tests/spark/test_stream.py -k "not sigkill and not ctrl_c"`` took 68 s; with
    2, 48 s. The shared session has two shuffle partitions already (tests/support/command.py); set
    here as ``configure()`` sets them, they stay the cores whatever the session has."""
    cores = str(spark.sparkContext.defaultParallelism)
    keys = {PROVIDER: ROCKSDB, CHANGELOG: "true", "spark.sql.shuffle.partitions": cores}
    before = {key: spark.conf.get(key, None) for key in keys}
    for key, value in keys.items():
        spark.conf.set(key, value)
    yield spark
    for key, value in before.items():  # set back, not unset: unset would give Spark's 200, not the session's 8
        if value is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, value)
