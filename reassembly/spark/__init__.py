"""Spark reassembly: functions over DataFrames of segments (needs pyspark).

``reassemble(df)`` returns messages and quarantine; ``decode_segments(df)``
turns the encoded form into columns in the JVM. See README "Spark reassembly".
"""

from .decode import decode_segments
from .pipeline import ReassemblyOptions, ReassemblyResult, reassemble
from .schema import MESSAGE_COLUMNS, OUTPUT_ARROW, OUTPUT_DDL, QUARANTINE_COLUMNS, ColumnNames

__all__ = [
    "MESSAGE_COLUMNS",
    "OUTPUT_ARROW",
    "OUTPUT_DDL",
    "QUARANTINE_COLUMNS",
    "ColumnNames",
    "ReassemblyOptions",
    "ReassemblyResult",
    "decode_segments",
    "reassemble",
]
