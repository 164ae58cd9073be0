"""The collector: messages in, batches by destination out (IBM's Collector node).

``core`` holds the sans-I/O :class:`Collector` and its rules; its adapters live in
:mod:`reassembly.storage`: ``collector`` (the rule tables and held batches in SQLite or
PostgreSQL) and ``durable`` (the durable collector job over a database and batch files).
"""

from reassembly.collector.core import (
    DEFAULT_DESTINATION,
    DEFAULT_RULE,
    BatchReady,
    Cause,
    Collector,
    Held,
    Rule,
    batch_segments,
    group_id_for,
)

__all__ = [
    "DEFAULT_DESTINATION",
    "DEFAULT_RULE",
    "BatchReady",
    "Cause",
    "Collector",
    "Held",
    "Rule",
    "batch_segments",
    "group_id_for",
]
