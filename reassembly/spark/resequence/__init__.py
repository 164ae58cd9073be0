"""The resequencer on Spark, in the shape every stateful operator here takes.

``core`` decides (plain Python, the in-process :class:`~reassembly.resequencer.core.Resequencer`
per group key); ``processor`` is the Spark stateful processor that only reads and writes state
and asks the core; ``functions`` holds ``resequence`` (a finished table) and
``resequence_stream`` (Structured Streaming).
"""

from reassembly.spark.resequence.functions import resequence, resequence_stream

__all__ = ["resequence", "resequence_stream"]
