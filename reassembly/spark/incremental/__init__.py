"""``reassemble run INPUT OUTPUT --incremental --checkpoint DIR``: the batch job on what landed since its last run.

A schedule (cron, an orchestrator) calls the same command again and again. Each run reads only the
landing files no committed run read, reassembles them together with what the last run carried
over, and publishes its rows in ``run`` folders of the layout ``reassemble run`` writes:
``OUTPUT/messages/run=N/``, ``OUTPUT/quarantine/run=N/`` and ``OUTPUT/payloads/run=N/`` (large
messages), so ``spark.read.parquet(OUTPUT/messages)`` has a ``run`` column and
:func:`reassembly.spark.batch.output.read_output` reads committed runs only. User documentation:
docs/how-to/scheduling.md.

**Which files are new.** A landing file is known by its path (symlinks resolved), size and
modification time, recorded in the commit record of the run that read it. A recorded file whose
size or modification time changed is an error naming it (its rows were used: read again they
would be delivered twice, skipped they would be lost); a recorded file that is gone is fine
(retention). Directories are listed as Spark lists them (names starting with ``_`` or ``.`` are
skipped), so a landing writer renaming finished files in keeps its work files out.

**What carries over.** A message still ``incomplete`` at the end of a run (not yet expired) is not
written: every landing row of its group (the rows the reassembly routed by that GroupId:
routable framing, the GroupId read from the header, :func:`with_routing_key`) is written to the
checkpoint's carry folder, with the time a run first read it, and the next run reads those rows
back beside its new files. A message whose segments land in two runs is thus complete in the
later one, and a Unit-of-Work group is decided whole. The group's other output rows (its held
segments' quarantine rows, a complete message of the same group) are dropped from this run's
output with it, so every landing row is in exactly one place: ``rows in (new + carried in) = used +
quarantined + duplicates + carried out``, checked before the run commits. Rows that are not
segments and messages decided otherwise (corrupt, conflict, ...) are final and never carried.

**Bounds.** A carried group older than ``expire_after`` (since a run first read one of its
rows) is written as incomplete, with what the reassembly found missing, instead of carried; so
are the oldest groups while the carried segment bytes exceed ``carry_max_bytes``.

**Checkpoint layout** (``DIR``)::

    _incremental.json            the binding: layout, checkpoint id, OUTPUT, segment column, format
    .lock                        flock'ed by the run in progress (a second run is refused)
    runs/N.json                  commit record of run N: its files (path, size, mtime),
                                 counts, carry facts and its attempt's staging name
    carry/run=N/                 the landing rows run N carried over (Parquet, their own
                                 columns plus FIRST_SEEN), read by run N+1 only

and in ``OUTPUT``: ``_incremental.json`` (the checkpoint id it belongs to), ``_runs/N`` (run N is
published: what :func:`~reassembly.spark.batch.output.read_output` reads) and, while a run works, its
hidden staging folder ``.run=N.<attempt>.staging/``.

**Commit protocol.** A run stages everything under hidden names: its output in
``OUTPUT/.run=N.<attempt>.staging/`` (``messages``, ``quarantine``, ``payloads``), its carry in
``DIR/carry/.run=N.<attempt>.staging``. The commit point is the record ``DIR/runs/N.json``
(written to a temporary name, fsynced, renamed, directory fsynced). Then publication: the carry
and each output folder renamed to its ``run=N`` name, the marker ``OUTPUT/_runs/N`` written last,
the previous carry removed. A crash before the record leaves the previous committed state (the
next run removes the staging and does the work again, with the same files); a crash after it
leaves run N committed, and the next run finishes its publication first (every step is a
rename that is skipped once done). So no visible folder ever holds an uncommitted run, not
even after a crash. Each attempt stages under its own name: a killed run's JVM still finishing a
task can only write into a folder no later attempt uses. Ctrl-C and SIGTERM during the commit
(milliseconds) take effect once it is done.
"""

from reassembly.spark.incremental.carry import with_routing_key
from reassembly.spark.incremental.commit import check_binding, check_paths
from reassembly.spark.incremental.discovery import landing_files, new_files
from reassembly.spark.incremental.model import (
    CARRY,
    DEFAULT_CARRY_MAX_BYTES,
    DEFAULT_EXPIRE_AFTER,
    FIRST_SEEN,
    KILL_AT,
    KILL_POINTS,
    LAYOUT,
    MANIFEST,
    RECORDS,
    CarryAccounting,
    CarryFacts,
    IncrementalOptions,
    IncrementalReport,
    LandingFile,
)
from reassembly.spark.incremental.run import run_incremental

__all__ = [
    "CARRY",
    "DEFAULT_CARRY_MAX_BYTES",
    "DEFAULT_EXPIRE_AFTER",
    "FIRST_SEEN",
    "KILL_AT",
    "KILL_POINTS",
    "LAYOUT",
    "MANIFEST",
    "RECORDS",
    "CarryAccounting",
    "CarryFacts",
    "IncrementalOptions",
    "IncrementalReport",
    "LandingFile",
    "check_binding",
    "check_paths",
    "landing_files",
    "new_files",
    "run_incremental",
    "with_routing_key",
]
