"""Streaming reassembly on Spark: the job (``reassemble``), its per-key core (``core``) and its spool.

``core`` decides, in plain Python, what each message key's rows do in a micro-batch (testable
without Spark); ``reassemble`` is the Spark side (the stateful processor that only reads and
writes Spark state, the sink, the checkpoint's manifest); ``spool`` keeps held segments' bodies
outside the state store.
"""

from reassembly.spark.stream.reassemble import (
    CHANGELOG,
    KIND_STATE,
    LAYOUT,
    MANIFEST,
    PROFILE,
    ROCKSDB,
    BatchWriter,
    CheckpointMismatch,
    SinkError,
    StreamOptions,
    batch_counts,
    bind_checkpoint,
    committed_batches,
    configure,
    file_source,
    read_committed,
    reassemble_stream,
    start,
    state_after,
)

__all__ = [
    "CHANGELOG",
    "KIND_STATE",
    "LAYOUT",
    "MANIFEST",
    "PROFILE",
    "ROCKSDB",
    "BatchWriter",
    "CheckpointMismatch",
    "SinkError",
    "StreamOptions",
    "batch_counts",
    "bind_checkpoint",
    "committed_batches",
    "configure",
    "file_source",
    "read_committed",
    "reassemble_stream",
    "start",
    "state_after",
]
