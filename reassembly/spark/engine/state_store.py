"""The state store every stateful stream of this package needs: RocksDB, checked in one place.

The stateful processors (:class:`~reassembly.spark.stream.processor.Reassembler`,
:class:`~reassembly.spark.collect.processor.Batcher`,
:class:`~reassembly.spark.resequence.processor.ResequenceProcessor`) run under Spark's
``transformWithState``, which only works on the RocksDB state store provider. Without it the
query would fail only once it runs, deep in a Python worker; :func:`require_rocksdb` refuses the
session when the stream is set up instead, with the setting to change.
:func:`reassembly.spark.engine.environment.configure` sets it (with the other settings the library wants).
Nothing here imports pyspark: a session is only asked for its configuration.
"""

from __future__ import annotations

from typing import Any

PROVIDER = "spark.sql.streaming.stateStore.providerClass"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
# Each state commit uploads a small changelog instead of a RocksDB snapshot (snapshots are taken in the
# background): halves the commit time of a micro-batch here. Spark switches existing checkpoints either way.
CHANGELOG = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"


def require_rocksdb(spark: Any, what: str) -> None:
    """Refuse a session whose state store is not RocksDB: ``ValueError("<what> needs <PROVIDER>=<ROCKSDB>")``.

    ``what`` names the stream being set up, as the message's subject.

    ``spark``: the session checked.
    """
    if spark.conf.get(PROVIDER, "") != ROCKSDB:
        raise ValueError(f"{what} needs {PROVIDER}={ROCKSDB}")


__all__ = ["CHANGELOG", "PROVIDER", "ROCKSDB", "require_rocksdb"]
