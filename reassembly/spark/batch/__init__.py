"""The batch job: a DataFrame of segments in, messages and quarantine out, written once.

:mod:`~reassembly.spark.batch.pipeline` plans it (decode, group, judge), :mod:`~.grouping` routes and
aggregates each message's rows, :mod:`~.judge` hands the rows the JVM cannot vouch for to the
assembler, :mod:`~.save` writes the result, :mod:`~.quarantine` keeps what was not delivered
readable, :mod:`~.job` opens a job on its claimed output and sums it up, :mod:`~.output` reads what
any job wrote, and :mod:`~.objects` is the reference-message job on the same plumbing.
"""
