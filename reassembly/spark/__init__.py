"""Spark reassembly: functions over DataFrames of segments (needs pyspark).

``reassemble(df)`` returns messages and quarantine (``.save(dir)`` writes both, as the job does);
``reassemble_stream(df)``
does the same on a streaming DataFrame (README "Streaming reassembly"); ``decode_segments(df)``
turns the encoded form into columns in the JVM. See README "Spark reassembly".
``resequence(df)`` / ``resequence_stream(df)`` put whole messages back in sequence order
(README "Resequencer"). ``read_quarantined(row, payload_dir)`` gives back the original
bytes of any quarantine row, in-row or by reference. ``configure(spark)`` readies a session you
built yourself (settings, the jar, the workers' Python: docs/how-to/own-session.md).
``read_output(spark, OUTPUT)`` reads the committed rows of ``run``, ``run --incremental`` or
``stream`` output as a DataFrame (docs/how-to/scheduling.md).
"""

from reassembly.spark.batch.decode import decode_segments
from reassembly.spark.batch.output import read_output
from reassembly.spark.batch.pipeline import ReassemblyOptions, ReassemblyResult, reassemble
from reassembly.spark.batch.quarantine import read_quarantined
from reassembly.spark.batch.save import Saved
from reassembly.spark.engine.environment import Configured, WorkerPythonError, configure
from reassembly.spark.engine.session import SparkEnvironmentError
from reassembly.spark.resequence import resequence, resequence_stream
from reassembly.spark.schema import MESSAGE_COLUMNS, OUTPUT_ARROW, OUTPUT_DDL, QUARANTINE_COLUMNS, ColumnNames
from reassembly.spark.stream.functions import StreamOptions, reassemble_stream  # streaming

__all__ = [
    "MESSAGE_COLUMNS",
    "OUTPUT_ARROW",
    "OUTPUT_DDL",
    "QUARANTINE_COLUMNS",
    "ColumnNames",
    "Configured",
    "ReassemblyOptions",
    "ReassemblyResult",
    "Saved",
    "SparkEnvironmentError",
    "StreamOptions",
    "WorkerPythonError",
    "configure",
    "decode_segments",
    "read_output",
    "read_quarantined",
    "reassemble",
    "reassemble_stream",
    "resequence",
    "resequence_stream",
]
