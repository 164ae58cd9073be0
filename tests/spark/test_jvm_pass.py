"""The jar's one pass over Spark's internal rows: lazy, and the same rows when the sort spills to disk
and when single records are larger than a sorter page (pieces read from the spill reader's reused buffer)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from reassembly.spark import ReassemblyOptions, reassemble
from reassembly.spark.engine.bridge import reassembler
from reassembly.spark.engine.environment import check_worker_python
from reassembly.spark.testdata import generate

pytestmark = pytest.mark.spark


def test_the_one_pass_runs_nothing_until_an_action_and_leaves_the_session_conf_alone(spark: Any) -> None:
    assert reassembler(spark) is not None
    ds = generate(n_messages=6, segments_per_message=3, segment_size=1024, groups=1, seed=3)
    df = spark.createDataFrame([(r,) for r in ds.rows], "segment binary")
    aqe = spark.conf.get("spark.sql.adaptive.enabled")
    check_worker_python(spark)  # its once-per-context probe job runs here, not inside reassemble() below
    tracker = spark.sparkContext.statusTracker()
    before = set(tracker.getJobIdsForGroup())
    result = reassemble(df, options=ReassemblyOptions(partitions=3))
    assert set(tracker.getJobIdsForGroup()) == before  # building the plan ran no job (no eager shuffle)
    assert spark.conf.get("spark.sql.adaptive.enabled") == aqe  # the pass plans in a clone of the session
    got = {(bytes(r.group_id), r.msg_seq_number): r.status for r in result.messages.collect()}
    assert got == {k: e.status for k, e in ds.expected.items()}


SPILL = """
import os, sys
sys.path.insert(0, {tests!r})
from tests.spark.test_jvm_jar import canonical, hostile_rows
from reassembly.spark.engine.session import get_session
from reassembly.spark import ReassemblyOptions, reassemble
from reassembly.spark.engine.bridge import reassembler
from segmenter import Segmenter

# Every sorter spills after 3 records, its pages are 1 MiB: the 1.5 MiB pieces below each need a page of
# their own, and the one pass reads every piece back from the spill reader's reused buffer.
spark = get_session("local[2]", conf={{
    "spark.shuffle.spill.numElementsForceSpillThreshold": "3",
    "spark.buffer.pageSize": "1m",
}})
assert reassembler(spark) is not None
big = [s.encode() for s in Segmenter(1536 * 1024).segment(os.urandom(5 << 20))]
rows = hostile_rows() + big + big[:1]  # one duplicate of a large segment
df = spark.createDataFrame([(r,) for r in rows] + [(None,)], "segment binary")
def run(**o):
    opts = ReassemblyOptions(max_message_size=16 << 20, partitions=3, **o)
    return reassemble(df, options=opts).combined.collect()
with_jar = run()
sc = spark.sparkContext  # what the one pass's sorts spilled (only it has run so far)
stages = sc._jsc.sc().statusStore().stageList(None, False, False, sc._gateway.new_array(sc._jvm.double, 0), None)
spilled = sum(stages.apply(i).diskBytesSpilled() for i in range(stages.size()))
assert spilled > 1 << 20, spilled
assert canonical(with_jar) == canonical(run(use_jar=False))  # the assembler's own: tests/spark/test_jvm_jar.py
payloads = [bytes(r.payload) for r in with_jar if r.kind == "message" and r.payload is not None]
assert sum(len(p) == 5 << 20 for p in payloads) == 1, sorted(len(p) for p in payloads)[-3:]
print("OK", spilled)
"""


@pytest.mark.slow  # minutes: its own Spark (Connect server, spill sizes); run with -m slow
def test_the_same_rows_when_the_sort_spills_and_records_outgrow_a_page() -> None:
    from tests.spark.test_jvm_jar import run_python  # tests/ is on sys.path (pytest's rootdir import mode)

    assert "OK" in run_python(SPILL.format(tests=os.path.dirname(os.path.abspath(__file__))))


def test_every_message_of_one_size_keeps_its_own_bytes_whatever_reads_the_pass(spark: Any, tmp_path: Any) -> None:
    """The pass hands out its buffer as the message and reuses it for the next group of that size
    (Reassemble.java): every reader of the result must see each message's own bytes, however it reads."""
    from segmenter import Segmenter

    assert reassembler(spark) is not None
    payloads = [os.urandom(3000) for _ in range(40)]  # one size: from the third on, each is the reused buffer
    rows = [s.encode() for p in payloads for s in Segmenter(1024).segment(p)]
    df = spark.createDataFrame([(r,) for r in rows], "segment binary").coalesce(1)
    result = reassemble(df, options=ReassemblyOptions(partitions=1))
    want = sorted(payloads)

    def got(rows: Any) -> list[bytes]:
        return sorted(bytes(r.payload) for r in rows)

    assert got(result.messages.collect()) == want
    assert got(result.messages.toLocalIterator()) == want
    assert got(result.messages.rdd.collect()) == want
    cached = result.combined.cache()
    assert cached.count() == len(payloads)
    assert got(cached.where("kind = 'message'").collect()) == want
    cached.unpersist()
    saved = reassemble(df, options=ReassemblyOptions(partitions=1)).save(tmp_path / "out")
    assert saved.split  # the JVM-only job wrote them
    assert got(spark.read.parquet(str(tmp_path / "out" / "messages")).collect()) == want
