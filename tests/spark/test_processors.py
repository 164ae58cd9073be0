"""The three Spark stateful processors are written one way: a module-level class, one RocksDB check.

Spark takes a processor as an instance made on the driver and pickles it to the workers; a class
defined at module level travels by reference (the worker imports it), with its constructor's
arguments as its state. Each stream refuses a session without the RocksDB state store before it
is set up, through :func:`reassembly.spark.engine.state_store.require_rocksdb` and nowhere else. No Spark
session here: the checks need none.
"""

from __future__ import annotations

import importlib
import pickle
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pyspark.sql.streaming.stateful_processor import StatefulProcessor
from pyspark.sql.types import LongType, StringType, StructField, StructType

from reassembly.assembler import Limits
from reassembly.resequencer.batch_model import BatchOptions
from reassembly.resequencer.model import EndWhen, ResequenceOptions, StartAt
from reassembly.spark.collect import SparkCollectOptions, collect_stream
from reassembly.spark.collect.processor import Batcher
from reassembly.spark.engine.state_store import PROVIDER, ROCKSDB, require_rocksdb
from reassembly.spark.resequence import resequence_stream
from reassembly.spark.resequence.processor import BatchResequenceProcessor, ResequenceProcessor
from reassembly.spark.stream.functions import reassemble_stream
from reassembly.spark.stream.processor import Reassembler
from reassembly.spark.stream.spool import Spool

REPO = Path(__file__).resolve().parents[2]


def _instances(tmp: Path) -> list[Any]:
    schema = StructType([StructField("grp", StringType()), StructField("seq", LongType())])
    return [
        Reassembler(
            limits=Limits(),
            unit_of_work=True,
            max_held_bytes=1 << 20,
            expire_ms=300_000,
            tombstone_ms=600_000,
            large_message_bytes=1 << 16,
            spool=Spool(str(tmp / "bodies"), 1 << 16, 1 << 30),
            profile=None,
        ),
        Batcher(rules=str(tmp / "rules.db"), max_segment_size=150),
        ResequenceProcessor(
            options=ResequenceOptions(start=StartAt(0), end=EndWhen("is_last")),
            columns=["grp", "seq"],
            value_schema=schema,
            group_column="grp",
        ),
        BatchResequenceProcessor(
            options=BatchOptions(batch_size=10, batch_timeout=1.0),
            columns=["grp", "seq"],
            value_schema=schema,
            group_column="grp",
        ),
    ]


CLASSES = [Reassembler, Batcher, ResequenceProcessor, BatchResequenceProcessor]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_each_processor_is_a_module_level_stateful_processor(cls: type) -> None:
    assert "<locals>" not in cls.__qualname__ and cls.__qualname__ == cls.__name__
    assert getattr(importlib.import_module(cls.__module__), cls.__name__) is cls
    assert issubclass(cls, StatefulProcessor)
    ours = [c for c in cls.__mro__ if issubclass(c, StatefulProcessor) and c is not StatefulProcessor]
    for method in ("init", "handleInputRows", "handleExpiredTimer", "close"):  # none left to Spark's defaults
        assert any(method in vars(c) for c in ours), (cls.__name__, method)


def test_each_processor_pickles_by_reference_with_its_arguments(tmp_path: Path) -> None:
    """Plain pickle (no cloudpickle): the class goes by name, only the instance's values travel."""
    for p in _instances(tmp_path):
        blob = pickle.dumps(p)
        assert type(p).__name__.encode() in blob
        copy = pickle.loads(blob)
        assert type(copy) is type(p)
        assert vars(copy).keys() == vars(p).keys()


class _Conf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)


def _df(conf: dict[str, str]) -> Any:
    return SimpleNamespace(sparkSession=SimpleNamespace(conf=_Conf(conf)), columns=["grp", "seq"])


STREAMS = [
    ("streaming reassembly", lambda df: reassemble_stream(df)),
    ("the streaming collector", lambda df: collect_stream(df, SparkCollectOptions(rules="rules.db"))),
    ("resequence_stream", lambda df: resequence_stream(df, group="grp", seq="seq")),
]


@pytest.mark.parametrize(("what", "stream"), STREAMS, ids=[w for w, _ in STREAMS])
def test_each_stream_refuses_a_session_without_rocksdb_in_the_same_words(what: str, stream: Any) -> None:
    other = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
    for conf in ({}, {PROVIDER: other}):
        with pytest.raises(ValueError, match=f"^{re.escape(f'{what} needs {PROVIDER}={ROCKSDB}')}$"):
            stream(_df(conf))


def test_require_rocksdb_passes_a_rocksdb_session() -> None:
    require_rocksdb(_df({PROVIDER: ROCKSDB}).sparkSession, "anything")


def test_the_state_store_setting_is_read_in_one_place() -> None:
    readers = [
        str(p.relative_to(REPO))
        for p in sorted((REPO / "reassembly").rglob("*.py"))
        if "stateStore.providerClass" in p.read_text()
    ]
    assert readers == ["reassembly/spark/engine/state_store.py"]
    for entry in ("spark/stream/functions.py", "spark/collect/functions.py", "spark/resequence/functions.py"):
        assert "require_rocksdb(df.sparkSession, " in (REPO / "reassembly" / entry).read_text(), entry


def test_pyspark_is_imported_only_when_a_stream_is_set_up() -> None:
    """The processors' modules import pyspark (their base class); the modules that set the streams up
    import those only inside the functions that build a stream."""
    code = (
        "import sys, reassembly.spark, reassembly.spark.stream, reassembly.spark.collect.functions,"
        " reassembly.spark.resequence.functions, reassembly.spark.engine.state_store;"
        " sys.exit('pyspark' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO, check=False).returncode == 0
