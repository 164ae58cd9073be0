"""Spark itself, as the jobs use it: a Java runtime, the session (started, configured, checked and
stopped), spark-submit's entry file, the state store the stateful streams need, and the bridge to
the bundled jar. Nothing here knows a job: the jobs (:mod:`reassembly.spark.batch`, the streams,
:mod:`reassembly.spark.incremental`) import it, never the other way round.
"""
