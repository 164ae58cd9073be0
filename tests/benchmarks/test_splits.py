"""``python -m bench.splits`` without Spark: the two landing layouts (real files, the same rows in both,
every message's rows where the layout says), the interleaving, and the table and JSON built from
records shaped as its child processes print them (Spark's REST stage fields)."""

from __future__ import annotations

import json
import random
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from segmenter.wire import decode_header

sys.path.insert(0, str(Path(__file__).parents[2]))  # bench/ is a directory of the repo, not installed
from bench import splits

KiB = 1 << 10


def _files(d: Path) -> list[list[bytes]]:
    return [pq.read_table(f).column("segment").to_pylist() for f in sorted(d.glob("*.parquet"))]


def test_the_lander_layout_keeps_messages_together_but_the_straddlers_and_duplicates() -> None:
    messages = [[f"m{i:03d}s{j}".encode() for j in range(8)] for i in range(300)]
    files, facts = splits.plan_lander(messages, 4, random.Random(1))
    assert facts == {"straddling": 6, "duplicates": 3}  # 2 % and 1 % of 300
    rows = Counter(r for f in files for r in f)
    assert set(rows) == {r for m in messages for r in m} and sum(rows.values()) == 300 * 8 + 3
    where: dict[int, list[int]] = {}
    for k, f in enumerate(files):
        for r in f:
            where.setdefault(int(r[1:4]), []).append(k)
    two = {i for i, ks in where.items() if len(set(ks)) == 2}
    duplicated = {int(r[1:4]) for r, n in rows.items() if n == 2}
    assert len(two) == 9 and len(duplicated) == 3 and duplicated <= two  # 6 straddlers, 3 with a copy elsewhere
    for i in two - duplicated:  # a straddler: its first part closes a file, the rest opens the next one
        k = min(where[i])
        head = [r for r in files[k] if r[1:4] == b"%03d" % i]
        tail = [r for r in files[k + 1] if r[1:4] == b"%03d" % i]
        assert head + tail == messages[i]
        assert files[k][-16:].count(head[-1]) == 1 and files[k + 1].index(tail[0]) < 8
    for i in set(where) - two:  # everyone else: consecutive, in order, in one file
        (k,) = set(where[i])
        at = files[k].index(messages[i][0])
        assert files[k][at : at + 8] == messages[i]


def test_both_layouts_hold_the_same_rows_and_are_made_once(tmp_path: Path) -> None:
    info = splits.make_layouts(tmp_path / "d", 200 * 1024, 4 * KiB, 8, 64 * KiB)
    lander, scattered = _files(tmp_path / "d" / "lander"), _files(tmp_path / "d" / "scattered")
    assert len(lander) == len(scattered) == info["lander"]["files"] > 1
    assert Counter(r for f in lander for r in f) == Counter(r for f in scattered for r in f)
    facts = info["lander"]
    assert facts["rows"] == sum(map(len, lander)) == facts["messages"] * 8 + facts["duplicates"]
    gids = [{decode_header(r).group_id for r in f} for f in lander]
    assert sum(len(g) for g in gids) == facts["messages"] + facts["straddling"] + facts["duplicates"]
    assert splits.make_layouts(tmp_path / "d", 1, 1, 1, 1) == info  # cached: the arguments are not looked at


def test_rounds_are_interleaved_after_the_warmup_round() -> None:
    got = list(splits.schedule([(1, "lander"), (1, "scattered")], ["a", "b", "c"], rounds=2, warmup_rounds=1))
    assert [(r, lay, c) for r, _, lay, c in got] == [
        *((0, lay, c) for lay in ("lander", "scattered") for c in "cab"),
        *((1, lay, c) for lay in ("lander", "scattered") for c in "abc"),
        *((2, lay, c) for lay in ("lander", "scattered") for c in "bca"),
    ]


def _stage(sid: int, tasks: int, **sums: int) -> dict[str, Any]:
    """A stage as Spark's REST API gives it."""
    return {
        "stageId": sid,
        "status": "COMPLETE",
        "name": "x",
        "numTasks": tasks,
        "executorRunTime": 2000,
        "executorCpuTime": 1_500_000_000,
        "submissionTime": "2026-01-01T00:00:00.000GMT",
        "completionTime": "2026-01-01T00:00:01.500GMT",
        **sums,
    }


def _run(case: str, layout: str, r: int, seconds: float, shuffled: int) -> dict[str, Any]:
    stages = [_stage(1, 16, inputRecords=100, shuffleWriteBytes=shuffled)]
    if shuffled:
        stages += [_stage(2, 8, shuffleReadBytes=shuffled, outputBytes=900), _stage(3, 1, shuffleReadBytes=5)]
    rec = splits.run_record(seconds, stages, cpu=3.0, python_cpu=1.0, partitions=16)
    return rec | {"error": None, "round": r, "segment": 65536, "layout": layout, "case": case, "landing_bytes": 1000}


def test_the_table_gives_medians_per_round_ratios_and_the_shuffle_share(tmp_path: Path) -> None:
    runs = [
        _run(case, "lander", r, s * k, shuffled)
        for r, k in ((1, 1.0), (2, 2.0), (3, 1.0))
        for case, s, shuffled in (("ours", 13.5, 1004), ("shuffle-floor", 12.0, 1001), ("copy-floor", 10.0, 0))
    ]
    summary = splits.summarize(runs)
    ours = summary[0]
    assert (ours["case"], ours["seconds"]) == ("ours", 13.5)
    assert (ours["ours/copy-floor"], ours["ours/shuffle-floor"]) == (1.35, 1.125)
    assert ours["shuffle_write_pct"] == 100.4 and ours["input_partitions"] == 16
    assert ours["stage_roles"][splits.SCAN_SHUFFLE]["tasks"] == 16 and ours["stage_roles"][splits.AFTER]["wall"] == 1.5
    assert ours["stage_roles"][splits.OTHER]["stages"] == 1  # the small job after: another job's stage
    assert summary[1]["shuffle-floor/copy-floor"] == 1.2
    results = {
        "machine": {"date": "2026-11-27 08:00 UTC", "cpu": "c", "cores": 2, "pyspark": "4"},
        "rounds": 3,
        "warmup_rounds": 1,
        "load_before": (1.0, 1.0, 1.0),
        "load_after": (2.0, 2.0, 2.0),
        "segments": [65536],
        "layouts": {
            "65536/lander": dict(
                layout="lander", segment=65536, messages=2, per_message=8, rows=17, files=16, file_bytes=1000,
                straddling=1, duplicates=1,
            ),
        },
        "summary": summary,
    }
    text = splits.table(results)
    assert "| 64 KiB | lander | 16 | 16 | ours | 13.5 | 13.5-27.0 | 1.35x | 1.12x | 1004 B | 100.4 % |" in text
    assert "| 64 KiB | lander | ours | scan+shuffle write | 1 | 16 | 1.5 | 2.0 | 1.5 | 3.0 |" in text
    assert "1 messages straddle two files" in text
    assert splits.results_name(results) == "2026-11-27-splits-64K"
    json.dumps(results)  # what --json writes
