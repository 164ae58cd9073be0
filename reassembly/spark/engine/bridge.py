"""The bridge to the JVM: the bundled jar (``jars/segmenter-jvm.jar``, source in ``jvm/src``, built
by ``tools/build_jar.py``), loaded into a session, and the passes the jobs run in it.

The jar holds the header decoder (``segmenter.jvm.Decode``, :func:`decoded_in_jar`) and the one-pass
reassembly of the fast path (``segmenter.jvm.Reassemble``, :func:`fast_aggregate`), called through
py4j on the session's Dataset, so only a classic session (local or cluster, PySpark driver) can use
them. A Spark Connect client has no py4j: there the job runs the SQL path
(:mod:`reassembly.spark.batch.grouping`: ``listagg`` + the SQL clean test), which gives the same rows,
slower. So does a classic session where the jar cannot be loaded. What both paths share is here
too, as the jar reads it: the per-row facts of a message's rows (:data:`META`), where the header
starts in the sort key (:data:`SK_HEADER`) and the per-row rules (:func:`row_ok`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reassembly.assembler.core import Limits
from segmenter import header_table as table
from segmenter.checksum import ChecksumAlgorithm
from segmenter.flags import Codec
from segmenter.wire import MAX_HEADER_LENGTH

CLASS = "segmenter.jvm.Reassemble"
SRC = "src"  # inside the jobs: each landing row's kept columns as one struct (the jar carries it along)

# Per-row facts the clean test reads (all small); Python needs sk, plen, far and is_null.
META = (
    "sk",
    "plen",
    "far",
    "is_null",
    "header_ok",
    "data_ok",
    "is_last",
    "in_group",
    "codec",
    "algorithm",
    "msg_seq_number",
    "offset",
    "data_length",
    "stored_length",
    "original_length",
    "message_checksum",
    "length_deferred",
    "data_checksum",
)
_SEQ, _OFFSET = table.FIELD["msg_seq_number"], table.FIELD["offset"]
SK_HEADER = _SEQ.width + _OFFSET.width  # the header bytes start here in sk


def jar_path() -> str:
    """Absolute path of the bundled jar: pass it as ``spark.jars`` (or ``--jars``) to your session."""
    return str(Path(__file__).parent.parent / "jars" / "segmenter-jvm.jar")


def is_connect(spark: Any) -> bool:
    return type(spark).__module__.startswith("pyspark.sql.connect")


def reassembler(spark: Any) -> Any | None:
    """The jar's ``Reassemble`` class in ``spark``'s JVM (``ADD JAR`` first if needed), or None.

    None on Spark Connect (no py4j) and where the jar cannot be loaded: the caller takes the SQL path.
    """
    if is_connect(spark):
        return None
    jvm = spark.sparkContext._jvm
    if not _loadable(jvm):
        try:
            spark.sql(f"ADD JAR '{jar_path()}'")
        except Exception:  # a session that refuses to add jars: the SQL path
            return None
        if not _loadable(jvm):
            return None
    return jvm.segmenter.jvm.Reassemble


def _loadable(jvm: Any, name: str = CLASS) -> bool:
    """Whether ``name`` loads, asked first without a Java exception: pyspark converts one under an
    ``except BaseException: pass`` (``CapturedException.__str__``), so a Ctrl-C that lands while it does
    is lost, and the expected ClassNotFoundException before ``ADD JAR`` would make that window every job's."""
    from py4j.protocol import Py4JError  # type: ignore[import-untyped]

    loader = jvm.Thread.currentThread().getContextClassLoader()
    if loader.getResource(name.replace(".", "/") + ".class") is None:
        return False
    try:
        jvm.java.lang.Class.forName(name, True, loader)  # a class that is there but does not link: the SQL path
    except Py4JError:
        return False
    return True


# ------------------------------------------------------------------ the passes in the jar


# The per-row part of the clean test, over a row's columns (prefix "m.": over a meta struct):
# every header-table rule (header_ok) and CRC-32 data check (data_ok) holds, one plain message.
def row_ok(m: str = "", *, large_message_bytes: int | None = None) -> str:
    """The per-row part of the clean test. ``large_message_bytes`` (the threshold, when a ``payload_dir``
    is set): a segment of a message the assembler builds in a file (:func:`held_inline` false) is not
    clean, because the clean path delivers inline: which path ran must never decide the columns."""
    return (
        f"{m}header_ok AND NOT {m}far AND {m}data_ok AND NOT {m}in_group AND {m}codec = {int(Codec.NONE)}"
        f" AND {m}algorithm = {int(ChecksumAlgorithm.CRC32)} AND {m}msg_seq_number = 1"
        + ("" if large_message_bytes is None else f" AND {held_inline(m, large_message_bytes)}")
    )


def held_inline(m: str, large_message_bytes: int) -> str:
    """SQL: the row declares a message the assembler's body store keeps in memory, so in the row's
    ``payload``: its length known (not deferred) and at most ``large_message_bytes`` (the store's
    test, :meth:`reassembly.storage.filestore.FileBodyStore.wants`: more than that, or deferred, goes
    to a file under ``payload_dir``). The one statement of that threshold on the JVM side: the jar's
    pass and the SQL clean test both read it through :func:`row_ok`. A clean message is not compressed,
    so what it declares is its length."""
    return f"NOT {m}length_deferred AND {m}original_length BETWEEN 0 AND {int(large_message_bytes)}"


def decoded_in_jar(
    df: Any, raw_column: str, limits: Limits, large_message_bytes: int | None, keep: tuple[str, ...] = ()
) -> Any:
    """What :func:`route` gives over :func:`~reassembly.spark.batch.decode.decode_segments`, for the one pass:
    the jar's ``Decode`` (the header table's rules generated into Java, ``HeaderTable.java``) in one
    compiled function per row instead of some forty SQL expressions, which a fresh JVM generates,
    compiles and warms up in every query. When ``df`` is a columnar
    scan with nothing on top but the column's selection (a Parquet or ORC landing table), the decoder
    reads the scan's column batches, each segment a view of the reader's memory, instead of rows
    that hold two copies of it. Same values in every column the one pass and the judge read
    (``tests/spark/test_jvm_decode.py``, from rows and from batches). The jar must be loaded
    (:func:`reassembly.spark.engine.bridge.reassembler`). ``keep``: input columns carried along unchanged as one
    struct column ``src`` (lineage; the decoder then reads rows, not the scan's column batches)."""
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    decode = df.sparkSession.sparkContext._jvm.segmenter.jvm.Decode
    src = [F.struct(*[F.col(f"`{k}`") for k in keep]).alias(SRC)] if keep else []
    segments = df.select(F.col(raw_column).cast("binary"), *src)  # as decode_segments reads it
    far = -1 if large_message_bytes is None else large_message_bytes
    crc32 = int(ChecksumAlgorithm.CRC32)
    jdf = decode.run(segments._jdf, limits.max_message_size, MAX_HEADER_LENGTH, limits.max_segment_size, far, crc32)
    return DataFrame(jdf, df.sparkSession)


def fast_aggregate(
    routed: Any,
    partitions: int,
    max_message_size: int,
    reassembler: Any,
    clean: bool = True,
    dirty: bool = True,
    side: str | None = None,
    large_message_bytes: int | None = None,
    stage: str | None = None,
    tally: ScanTally | None = None,
) -> Any:
    """:func:`aggregate` plus the clean test's verdict (column ``clean``), in one JVM pass.

    One shuffle by ``pk``, a sort within each partition by key then ``sk``, then the jar's
    ``Reassemble`` (``reassembler``: :func:`reassembler`) walks each key's
    rows (Spark's internal rows, no ``Row`` encoder): copies each piece from the sorter's memory
    into a buffer the task reuses (emitted as the message when the message fills it exactly, else
    copied into an array of the pieces' summed length), folds the segments' verified CRCs into
    the message CRC and checks the cross-row rules.
    The sort key starts with ``pk`` (GroupIds: their first bytes, the sorter's prefix, decide
    most comparisons) rather than the boolean ``routable``; any order with the whole key first groups. The per-row
    rules reach it as one column, :func:`row_ok` (the header table's rules, in SQL), plus "no
    header extension": a message carrying digests is judged by the assembler, so the policy
    demanding nothing is the only one this path serves (``pipeline.reassemble`` decides).
    ``meta`` is built only for rows that are not clean (NULL otherwise: the judge's input).
    ``clean`` / ``dirty``: which rows to emit (the other kind is dropped in the pass). ``side``: a
    directory every executor sees: only clean rows are emitted and every other group is written
    there, one file per task, for ``save.py``'s judge (``SideFile.java``).
    ``large_message_bytes``: the threshold with a ``payload_dir`` set (see :func:`row_ok`), else None.
    ``stage`` (with ``side``, without kept columns): a directory every executor sees, where each scan
    task stages the messages complete and clean among its own consecutive rows and sends one
    reference row per message across the shuffle instead of its rows (``Stage.java``; runs of more
    than :data:`STAGE_CAP` bytes are not staged). A scan task that has staged nothing in its first
    :data:`STAGE_PROBE_ROWS` rows (or :data:`STAGE_PROBE_BYTES` bytes) passes the rest straight
    through, as the plan without staging sends them; ``tally`` (:class:`ScanTally`) counts the tasks
    by that choice.
    """
    from pyspark.sql import DataFrame

    kept = [SRC] if SRC in routed.columns else []  # lineage: each row's kept columns ride in its meta
    meta = f"struct({', '.join(f'`{c}`' for c in (*META, *kept))}) AS m"
    rules = row_ok(large_message_bytes=large_message_bytes)
    ok = f"coalesce({rules} AND header_length = {table.HEADER_LENGTH}, false) AS row_ok"
    selected = routed.selectExpr("routable", "pk", "bk", "piece", ok, meta)  # SQL text: one py4j call per column
    if stage is not None:
        if side is None or kept:
            raise ValueError("staging needs a side folder and no kept columns")
        staged, passed = (None, None) if tally is None else (tally.staged, tally.passed_through)
        probe = (STAGE_PROBE_ROWS, STAGE_PROBE_BYTES)
        jdf = reassembler.stage(selected._jdf, stage, max_message_size, STAGE_CAP, *probe, staged, passed)
        selected = DataFrame(jdf, routed.sparkSession)
    sorted_ = selected.repartition(partitions, "pk").sortWithinPartitions("pk", "routable", "bk", "m.sk", "m.plen")
    if side is None:
        jdf = reassembler.run(sorted_._jdf, max_message_size, clean, dirty)
    elif stage is None:
        jdf = reassembler.split(sorted_._jdf, max_message_size, side, SK_HEADER)
    else:
        jdf = reassembler.split(sorted_._jdf, max_message_size, side, SK_HEADER, stage)
    return DataFrame(jdf, routed.sparkSession)


# The largest message a scan task stages (Stage.java); a larger one crosses the shuffle.
STAGE_CAP = 64 << 20

# A scan task that has staged no message among its first this many rows, or this many bytes of pieces,
# passes the rest straight through (Stage.java): on a lander-shaped table the first rows hold whole
# messages (8-segment messages of 64 KiB segments: 32 in 256 rows; of 1 MiB segments: one or two in 16
# MiB), on a scattered one none, and a message still open at that point decides first.
STAGE_PROBE_ROWS = 256
STAGE_PROBE_BYTES = 16 << 20


@dataclass(frozen=True)
class ScanTally:
    """The staged plan's scan tasks by their choice (Stage.java), as Spark accumulators the tasks add
    to (named ``reassembly_scan_tasks_*``: Spark's UI shows them with the stage). A task run twice (a
    retry, a speculative copy) counts twice."""

    staged: Any  # the JVM LongAccumulator of the tasks that walked all their rows
    passed_through: Any  # of those that passed their rows through after their first ones

    @classmethod
    def create(cls, spark: Any) -> ScanTally:
        sc = spark.sparkContext._jsc.sc()
        return cls(
            sc.longAccumulator("reassembly_scan_tasks_staged"),
            sc.longAccumulator("reassembly_scan_tasks_passed_through"),
        )

    def counts(self) -> dict[str, int]:
        """``scan_tasks_staged`` and ``scan_tasks_passed_through`` so far."""
        return {
            "scan_tasks_staged": int(self.staged.value()),
            "scan_tasks_passed_through": int(self.passed_through.value()),
        }
