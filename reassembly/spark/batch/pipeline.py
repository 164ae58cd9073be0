"""``reassemble``: segments DataFrame in, messages and quarantine out, every segment accounted for.

Data path (one scan, one shuffle, one aggregate; see ``grouping.py`` and ``judge.py``):

1. Headers are decoded in the JVM and each row gets its keys: its GroupId when
   its framing holds, else a hash of its bytes (``grouping.py``). Where the bundled
   jar runs, by its ``Decode`` (Java generated from ``segmenter.header_table``,
   ``bridge.decoded_in_jar``); elsewhere by SQL generated from the same table
   (``decode.py``, ``grouping.route``). Same columns (tests/spark/test_jvm_decode.py). With ``payload_dir``,
   rows at offsets from ``large_message_bytes`` on also get a per-offset key.
2. One shuffle by GroupId; one aggregate concatenates each message's (or MQ
   group's) data in the JVM and collects its headers.
3. A message that passes the JVM's narrow clean test (the common case) is
   written from the JVM: its bytes never cross into Python.
4. Everything else (gaps, duplicates, conflicts, bad checksums, zstd, MQ groups,
   rows that are not segments, NULL rows, large messages) goes to the same
   :class:`~reassembly.assembler.core.Assembler` the in-process consumer uses, in a
   scalar Arrow UDF: one implementation of the rules, so the Spark output is what
   a Python consumer would report, and ``jvm_fast_path=False`` (everything through
   the assembler) gives identical rows.

Why one branch: a plan split after the shuffle (clean rows written by a JVM-only
branch, the rest judged in a second branch over the same, reused, exchange) keeps
clean messages out of the Python operator and the explode, but Spark runs the
aggregate and the clean test once per branch, and that measured slower than the
Python operator it saves (``python -m bench.stages DATA --variants ours,split`` measures
both).

The JVM one pass (default; ``use_jar=False`` turns it off), with the bundled jar
(``engine/bridge.py``: ``fast_aggregate``): steps 2-3 as one walk over each message's
pieces, sorted within the shuffle's partitions, copying each piece once and
folding the segments' verified CRCs into the message CRC, with the per-row rules
from the header table as one SQL column. Same rows (tests/spark/test_jvm_jar.py). On
Spark Connect (no py4j), where the jar cannot be loaded, or under a digest policy
that demands a digest, the SQL path runs (``listagg`` + the SQL clean test).
The pass reads Spark's internal rows (no ``Row`` encoder) and stays lazy.
Measured by ``python -m bench.stages DATA --runs 3 --variants floor,listagg,onepass,ours``:
the one pass costs what the bare shuffle does; what remains over it in ``combined`` is the
Python operator after it (every row passes through it, clean ones with a NULL argument) and
the row explode.
:meth:`ReassemblyResult.save` (what ``reassemble run`` does) removes both: the clean
messages are written by a JVM-only job and the rest judged only when there is a rest: in
the driver when it is small (``driver_judge_bytes``), else by a second job (``save.py``).

Shuffle only what must meet (``save()``, ``assemble_in_splits``, the default): landers write a
message's segments together, so most messages are complete inside one scan task. Before the
shuffle, each scan task walks its rows in file order and assembles every run of consecutive rows
that is a complete clean message by the same rules (``Fold.java``, shared with the pass after the
shuffle); it stages the message's bytes in a file of its own under the output's side folder and
sends one reference row (the message's key, its last header, where its bytes are) across the
shuffle instead of its rows (``Stage.java``). Every other row crosses the shuffle as before. After
the shuffle a key holds every row that names it, from every split: a reference alone is delivered,
its bytes read back from the stage file; a reference with any other row (a duplicate, a
conflicting copy, a forged sibling, a far row's stub, a second whole copy) is rebuilt into its
rows and judged with all of them, as if nothing had been staged. So the rows are the same as with
``assemble_in_splits=False`` (tests/spark/test_split_layouts.py), and on a lander-shaped table the
shuffle carries the references and the few messages that straddle files
(``python -m bench.splits``). Where nothing is confined (a scattered table), a scan task stops
walking after its first rows (``bridge.STAGE_PROBE_ROWS``) and passes the rest straight through, as
``assemble_in_splits=False`` sends them; ``Saved.metrics`` counts the scan tasks by that choice
(``scan_tasks_staged``, ``scan_tasks_passed_through``). Lineage (``keep_columns``) keeps the plan
that shuffles every row.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from reassembly._errors import UsageError
from reassembly.assembler.core import Limits
from reassembly.spark.batch import grouping
from reassembly.spark.batch.decode import decode_segments
from reassembly.spark.batch.judge import make_judge, make_side_judge
from reassembly.spark.batch.save import Output, Saved, Split, save
from reassembly.spark.engine import bridge
from reassembly.spark.engine.environment import check_worker_python
from reassembly.spark.schema import (
    OUTPUT_FIELDS,
    SOURCE,
    SOURCES,
    ColumnNames,
    message_columns,
    quarantine_columns,
    spark_schema,
)
from segmenter.digest import NO_POLICY, REDACT_KEYS, DigestPolicy

STAGE = "stage"  # under save()'s side folder: the scan tasks' stage files (Stage.java)


@dataclass(frozen=True)
class ReassemblyOptions:
    """How to reassemble. Defaults suit a landing table of messages up to a few hundred MiB each."""

    unit_of_work: bool = True
    """MQ groups are a Unit of Work: deliver all messages of a group or none (the others ``group_failed``)."""
    max_message_size: int = 1 << 30
    """A message declaring more bytes than this (original or stored length) is rejected: ``too_big`` (2030)."""
    partitions: int | None = None
    """Shuffle partitions of the job; None: the session's ``spark.sql.shuffle.partitions``."""
    payload_dir: str | None = None
    """A directory every executor sees, for large messages' bodies. With it, segments at offsets of at
    least ``large_message_bytes`` travel in their own aggregates, and a message with any such segment is
    judged by its task's assembler, which streams a body declaring more than ``large_message_bytes`` (or
    deferring its length) into a file there; its row carries ``payload_path`` (relative to this
    directory). None: every message is built in memory (Spark caps a value at 2 GiB)."""
    large_message_bytes: int = 128 << 20
    """With ``payload_dir``: messages longer than this (or of unknown length) become files, the others
    stay in the ``payload`` column. Also what bounds a task's memory (docs/concepts/limits.md)."""
    jvm_fast_path: bool = True
    """Messages the JVM finds complete and clean are written without Python; False: every group goes
    through the Python assembler (same rows, slower)."""
    use_jar: bool = True
    """The bundled jar's one pass (``bridge.fast_aggregate``) where the session can load it (not on
    Connect); False: the SQL path (listagg and the SQL clean test). Same rows either way."""
    digest: DigestPolicy = NO_POLICY
    """SHA-256 / HMAC-SHA-256 digests demanded, and the keys to check them: verified in the JVM on the
    fast path, by the assembler otherwise. With a keyring its keys are literals in the plan:
    ``reassemble()`` sets ``REDACT_KEYS`` so Spark's UI and logs do not show them."""
    keep_columns: tuple[str, ...] = ()
    """Lineage: input columns carried unchanged into every output row (a quarantine row's ``source``,
    a message's ``sources``: one per segment used, in offset order). Empty: no such columns."""
    assemble_in_splits: bool = True
    """``save()`` with the jar's one pass: each scan task assembles the messages complete and clean
    among its own consecutive rows, stages their bytes under the output's ``_side`` folder and sends
    only a reference across the shuffle; a message with any other row anywhere is judged with all its
    rows. A task that finds nothing to stage in its first rows passes the rest through (``Saved.metrics``:
    ``scan_tasks_staged``, ``scan_tasks_passed_through``). False: every row crosses the shuffle. Same
    rows either way; no effect with ``keep_columns``."""
    driver_judge_bytes: int = 64 << 20
    """``save()``: the groups the one pass set aside are judged in the driver (no Spark job, no Python
    workers to start) when their side files total at most this many bytes and what they declare they
    decode does too; otherwise a Spark job judges them (same rows). 0: always a Spark job. With a
    ``payload_dir``, the driver must see it too."""

    def limits(self) -> Limits:
        # One group per assembler call: the group itself is the only thing buffered.
        return Limits(
            max_message_size=self.max_message_size,
            max_segment_size=min(self.max_message_size + 4096, 1 << 62),
            max_buffered_bytes=1 << 62,
            max_open_groups=1 << 30,
            digest=self.digest,
        )


@dataclass(frozen=True)
class ReassemblyResult:
    """The outputs of one reassembly. ``combined`` holds both kinds; compute it once with a write,
    or :meth:`save` it: faster where the jar's one pass runs, since clean messages are then written
    from the JVM and only the rest is judged in Python."""

    output: Output
    """What ``save()`` writes, as this call planned it."""

    @cached_property
    def combined(self) -> Any:
        """Every output row (``kind`` says which; both kinds' columns), one lazy DataFrame: built on
        first use, so that :meth:`save`, which does not need it where the one pass runs, never plans it."""
        return self.output.plan(None, None)

    @property
    def split(self) -> Split | None:
        """The two jobs of save(), where the jar's one pass runs."""
        return self.output.split

    @property
    def keep_columns(self) -> tuple[str, ...]:
        return self.output.keep_columns

    def save(self, directory: str | Any) -> Saved:
        """Write ``directory/messages`` and ``directory/quarantine`` (Parquet), the layout of
        ``reassemble run``, each with exactly its columns, and ``directory/_reassembly.json`` (the
        schema version): clean messages by a JVM-only job, the rest (if any) judged in the driver
        when small (``driver_judge_bytes``), else by a second job. With ``assemble_in_splits`` (the
        default) the messages complete in one scan task are assembled there and staged under
        ``directory``'s hidden side folder until they are delivered (module doc).
        ``Saved.metrics`` holds the counts the jobs published as Spark observed metrics."""
        return save(self.output, directory)

    @property
    def messages(self) -> Any:
        """One row per logical message: status, reason, payload, gaps, counts (``schema.MESSAGE_SCHEMA``)."""
        kept = bool(self.keep_columns)
        return self.combined.where("kind = 'message'").select(*[f"`{c}`" for c in message_columns(kept)])

    @property
    def quarantine(self) -> Any:
        """One row per input segment not used in a complete message, with its original bytes
        (``schema.QUARANTINE_SCHEMA``)."""
        kept = bool(self.keep_columns)
        return self.combined.where("kind = 'quarantine'").select(*[f"`{c}`" for c in quarantine_columns(kept)])

    @property
    def groups(self) -> Any:
        """Unit-of-Work view: one row per group, its messages in MsgSeqNumber order."""
        from pyspark.sql import functions as F

        m = self.messages
        return m.groupBy("group_id").agg(
            F.sort_array(F.collect_list(F.struct(*[F.col(c) for c in m.columns if c != "group_id"]))).alias("messages"),
            F.expr("bool_and(status = 'complete')").alias("complete"),
        )


def check_keep_columns(df: Any, keep: tuple[str, ...], segment_column: str) -> tuple[str, ...]:
    """``keep`` as given, or UsageError (nothing has run): a column the input lacks, one named twice,
    or the segment column (its bytes are the row's ``raw`` already)."""
    keep = tuple(keep)
    missing = [k for k in keep if k not in df.columns]
    if missing:
        raise UsageError(f"cannot keep column {missing[0]!r}: not in the input (columns: {', '.join(df.columns)})")
    twice = sorted({k for k in keep if keep.count(k) > 1})
    if twice:
        raise UsageError(f"column {twice[0]!r} named twice in the columns to keep")
    if segment_column in keep:
        raise UsageError(f"cannot keep column {segment_column!r}: it is the segment column (its bytes are raw)")
    return keep


INPUT_FILE = "input_file"  # the column keep_input_file adds


def keep_input_file(df: Any, name: str = INPUT_FILE) -> Any:
    """``df`` with the path of each row's input file as column ``name``: from the file source's
    ``_metadata.file_path`` (any file source, batch or streaming), else ``input_file_name()``. Then
    keep it like any column (``ReassemblyOptions(keep_columns=(..., name))``). UsageError when the
    input has a column of that name already."""
    from pyspark.sql import functions as F

    if name in df.columns:
        raise UsageError(f"cannot add the input file as column {name!r}: the input has a column of that name")
    try:
        return df.select("*", F.col("_metadata.file_path").alias(name))
    except Exception:  # not a file source (no _metadata): Spark's per-task file name, where it has one
        return df.select("*", F.input_file_name().alias(name))


def reassemble(
    df: Any,
    *,
    encoded: bool = True,
    raw_column: str = "segment",
    columns: ColumnNames | None = None,
    options: ReassemblyOptions | None = None,
) -> ReassemblyResult:
    """Reassemble a DataFrame of segments (encoded, or as columns: see :class:`ColumnNames`).

    ``df``: the segments, one per row (a batch DataFrame: a landing table as read). ``encoded``:
    True when each row holds one encoded segment in the binary column ``raw_column``; False when
    its header fields and data are columns, named by ``columns``. ``options``: how to reassemble
    (:class:`ReassemblyOptions`: limits, large messages, digests, the columns kept). Nothing runs
    until the result is written: :meth:`ReassemblyResult.save` writes every kind of row in one pass.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    opts = options or ReassemblyOptions()
    names = columns or ColumnNames()
    keep = check_keep_columns(df, opts.keep_columns, raw_column if encoded else names.data)
    check_worker_python(df.sparkSession)  # the one eager step: a worker Python without the library, in one line
    lineage = StructType([df.schema[k] for k in keep]) if keep else None
    if not encoded:
        from reassembly.spark.columns import encode_columns

        df = encode_columns(df, names, keep=keep)
        raw_column = "segment"
    threshold = opts.large_message_bytes if opts.payload_dir is not None else None
    limits = opts.limits()
    n = opts.partitions or int(df.sparkSession.conf.get("spark.sql.shuffle.partitions"))
    # The jar's one pass serves the policy that demands nothing (module doc); Connect: the SQL path.
    demands = opts.digest.sha256 or opts.digest.keyring is not None
    one_pass = bridge.reassembler(df.sparkSession) if opts.jvm_fast_path and opts.use_jar and not demands else None
    if one_pass is not None:  # the jar decodes too: no SQL decoding to plan, generate and compile
        routed = bridge.decoded_in_jar(df, raw_column, limits, threshold, keep)
    else:
        decoded = decode_segments(df, raw_column, limits.max_message_size, limits.max_segment_size, keep)
        routed = grouping.route(decoded, threshold)
    fields = [c for c, _, _ in OUTPUT_FIELDS] + ([SOURCES, SOURCE] if keep else [])

    def plan(pending: str | None, observe: Any) -> Any:
        if one_pass is not None:
            agg = bridge.fast_aggregate(routed, n, limits.max_message_size, one_pass, large_message_bytes=threshold)
            clean = F.col("clean")
            sources = SOURCES if keep else None  # the pass lists a clean row's kept columns
        else:
            agg = grouping.aggregate(routed, n)
            if opts.digest.keyring is not None and opts.jvm_fast_path:
                _redact_keys(df.sparkSession)
            fast = opts.jvm_fast_path
            clean = F.expr(grouping.clean(opts.digest, large_message_bytes=threshold)) if fast else F.lit(False)
            sources = "transform(meta, m -> m.src)" if keep else None
        if observe is not None:
            agg = observe(agg)
        judge = make_judge(limits, opts.unit_of_work, opts.payload_dir, threshold, lineage, pending)
        job = F.when(~clean, F.struct("routable", "pk", F.col("bk").isNotNull().alias("large"), "blob", "meta"))
        rows = agg.select("*", judge(job).alias("r"))
        # NULL element: the row's clean message, written from the JVM columns.
        out = rows.select("*", F.explode(F.coalesce("r", F.array(F.lit(None)))).alias("q"))
        sql = grouping.clean_row(sources)
        pick = [F.expr(f"CASE WHEN q IS NULL THEN {sql[c]} ELSE q.`{c}` END").alias(c) for c in fields]
        return out.select(*pick)

    split = None
    if one_pass is not None:
        spark = df.sparkSession
        ddl = {c: d for c, d, _ in OUTPUT_FIELDS}
        # SQL text, one selectExpr: a Column per expression costs some twenty py4j round trips each
        sql = grouping.clean_row(SOURCES if keep else None)
        clean_columns = [f"CAST({sql[c]} AS {ddl[c]}) AS `{c}`" for c in message_columns(False)]
        clean_columns += [f"{SOURCES} AS {SOURCES}"] if keep else []
        judged_schema = spark_schema(
            (("kind", "string"), *((c, ddl[c]) for c in message_columns(False))), lineage, SOURCES if keep else None
        )

        # Lineage keeps the plan that shuffles every row: a staged message's rows carry no kept columns.
        staging = opts.assemble_in_splits and not keep

        tallies: list[bridge.ScanTally] = []  # the scan tasks' choices of the last clean job planned

        def clean_messages(side: str) -> Any:
            stage = f"{side}/{STAGE}" if staging else None
            tallies[:] = [bridge.ScanTally.create(spark)] if staging else []
            agg = bridge.fast_aggregate(
                routed,
                n,
                limits.max_message_size,
                one_pass,
                side=side,
                large_message_bytes=threshold,
                stage=stage,
                tally=tallies[0] if tallies else None,
            )
            return agg.selectExpr(*clean_columns)

        def scan_tasks() -> dict[str, int]:
            return tallies[0].counts() if tallies else {}

        def side_judge(pending: str) -> Any:  # the judge of the side files, in a Spark job or in the driver
            return make_side_judge(limits, opts.unit_of_work, opts.payload_dir, threshold, pending)

        def judged(files: list[str], pending: str) -> Any:
            paths = spark.createDataFrame([(f,) for f in files], "path string").repartition(len(files))
            return paths.mapInArrow(side_judge(pending), judged_schema)

        split = Split(clean_messages, judged, side_judge, opts.driver_judge_bytes, scan_tasks)
    return ReassemblyResult(Output(df.sparkSession, plan, split, keep, lineage))


def _redact_keys(spark: Any) -> None:
    """Make Spark redact the padded HMAC keys from plans it prints (added to any regex already set)."""
    key = "spark.sql.redaction.string.regex"
    current = spark.conf.get(key, None)
    if not current:
        spark.conf.set(key, REDACT_KEYS)
    elif REDACT_KEYS not in current:
        spark.conf.set(key, f"{current}|{REDACT_KEYS}")
