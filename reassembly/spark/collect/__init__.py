"""The collector on Spark Structured Streaming, in the shape every stateful operator here takes.

``core`` decides (plain Python: which batch closes, when, why); ``processor`` is the Spark
stateful processor that only reads and writes state and asks the core; ``functions`` builds the
streaming query users start (``collect_stream``, ``start``) and writes its output.
"""

from reassembly.spark.collect.functions import (
    OUTPUT_DDL,
    SparkCollectOptions,
    TargetWriter,
    collect_stream,
    message_source,
    start,
)

__all__ = ["OUTPUT_DDL", "SparkCollectOptions", "TargetWriter", "collect_stream", "message_source", "start"]
