"""Streaming reassembly on Spark: the job (``reassemble``), its per-key core (``core``), its stateful
processor (``processor``), its state layout (``layout``) and its spool.

``core`` decides, in plain Python, what each message key's rows do in a micro-batch (testable
without Spark); ``processor`` is the stateful processor that only reads and writes Spark state
(the variables of ``layout``) and calls the core; ``reassemble`` sets the stream up and holds the
sink and the checkpoint's manifest; ``spool`` keeps held segments' bodies outside the state store.
The state store check is :mod:`reassembly.spark.engine.state_store`'s; the session settings
(``configure``, re-exported here) are :mod:`reassembly.spark.engine.environment`'s.
"""

from reassembly.spark.stream.functions import (
    CHANGELOG,
    KIND_STATE,
    LAYOUT,
    MANIFEST,
    OBSERVATION,
    PROFILE,
    ROCKSDB,
    BatchWriter,
    CheckpointMismatch,
    Halt,
    InputRefused,
    SinkError,
    StreamOptions,
    batch_counts,
    bind_checkpoint,
    committed_batches,
    configure,
    file_source,
    observed,
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
    "Halt",
    "InputRefused",
    "OBSERVATION",
    "SinkError",
    "StreamOptions",
    "batch_counts",
    "bind_checkpoint",
    "committed_batches",
    "configure",
    "file_source",
    "observed",
    "read_committed",
    "reassemble_stream",
    "start",
    "state_after",
]
