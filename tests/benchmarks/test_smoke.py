"""The batch job's benchmark harness (``bench.jvmbench``) without Spark: medians over interleaved
runs, the section it writes, and the single-message generator and payload check (real files, a
real assembler).

The Spark runs themselves are exercised by ``python -m bench --quick`` in CI (same runner).
"""

from __future__ import annotations

import sys
import zlib
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from reassembly import Assembler, Limits

sys.path.insert(0, str(Path(__file__).parents[2]))  # bench/ is a directory of the repo, not installed
from bench import jvmbench, largecase, sparkbench, stompclient

MiB = 1 << 20


def _run(approach: str, seconds: float | None, r: int, segment: int = 65536) -> dict[str, Any]:
    return {
        "kind": "matrix",
        "round": r,
        "messages": 2,
        "bytes": 1 << 30,
        "segment": segment,
        "per_message": 8,
        "approach": approach,
        "seconds": seconds,
        "error": None if seconds else "boom",
        "peak_driver_rss": 1,
        "peak_jvm_rss": r,
        "peak_python_workers_rss": 3,
        "peak_python_worker_rss": 2,
    }


def _results(summary: list[dict[str, Any]]) -> dict[str, Any]:
    """A run's results as ``jvmbench.section`` reads them."""
    return {
        "machine": {"date": "d", "cpu": "c", "cores": 2, "ram_gib": 1, "python": "3", "pyspark": "4", "pyarrow": "2"},
        "rounds": 3,
        "load_before": (1.0, 1.0, 1.0),
        "load_after": (2.0, 2.0, 2.0),
        "seconds_total": 60,
        "summary": summary,
    }


def test_summary_takes_medians_and_the_section_states_the_goal(tmp_path: Path) -> None:
    ours, listagg, floor = jvmbench.OURS, jvmbench.LISTAGG, jvmbench.FLOOR
    runs = [
        _run(name, s, r)
        for r, times in enumerate(((10.0, 12.0, 9.0), (11.0, 30.0, 9.5), (10.5, 11.0, 9.2)), 1)
        for name, s in zip((ours, listagg, floor), times, strict=True)
    ]
    summary = sparkbench.summarize(runs)
    mine = next(s for s in summary if s["approach"] == ours)
    assert (mine["seconds"], mine["min"], mine["max"], mine["runs"]) == (10.5, 10.0, 11.0, [10.0, 11.0, 10.5])
    assert mine["peak_jvm_rss"] == 3  # the highest peak of its runs
    results = _results(summary)
    text = jvmbench.section(results)
    assert "| 1 GiB | 64 KiB | ours (validated) | 10.5 | 10.0-11.0 | 98 | 1.14x | 0.88x |" in text
    assert "goal **met**" in text
    slow = sparkbench.summarize([*runs, _run(ours, 20.0, 4), _run(ours, 20.0, 5)])
    assert "goal **not met**" in jvmbench.section(results | {"summary": slow})
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{jvmbench.BEGIN}\nold\n{jvmbench.END}\nafter\n")
    jvmbench.update_readme(readme, text)
    assert readme.read_text() == f"# x\n\n{jvmbench.BEGIN}\n{text}{jvmbench.END}\nafter\n"


def test_warmup_rounds_come_first_are_marked_and_no_approach_is_always_first(monkeypatch: Any) -> None:
    calls: list[str] = []

    def run_cases(src: Path, names: list[str], warmup: Path, out: Path) -> list[dict[str, Any]]:
        calls.extend(names)
        return [{"approach": n, "seconds": 1.0} for n in names]

    monkeypatch.setattr(sparkbench, "run_cases", run_cases)  # the order is the subject, not Spark
    sets = [("matrix", Path("a"), {"bytes": 1}), ("matrix", Path("b"), {"bytes": 2})]
    cases = list(sparkbench.interleaved(sets, ["x", "y", "z"], Path("w"), Path("o"), rounds=2, warmup_rounds=1))
    assert [(c["round"], c["warmup"], c["bytes"], c["approach"]) for c in cases] == [
        *((0, True, b, n) for b in (1, 2) for n in "zxy"),  # the warm-up round starts with the last approach
        *((1, False, b, n) for b in (1, 2) for n in "xyz"),
        *((2, False, b, n) for b in (1, 2) for n in "yzx"),
    ]
    assert calls == [c["approach"] for c in cases]
    results = _results([])
    assert "warm-up round" not in jvmbench.section(results)  # results files from before warm-up rounds
    assert "after 1 warm-up round not counted" in jvmbench.section(results | {"warmup_rounds": 1})


def test_the_single_message_generator_streams_one_message_its_crc_checks(tmp_path: Path) -> None:
    size = 3 * MiB + 17
    info = largecase.write_message(tmp_path / "one", size, 64 * 1024, rows_per_file=8)
    assert largecase.write_message(tmp_path / "one", size, 64 * 1024) == info  # cached
    rows = [r for f in sorted((tmp_path / "one").glob("*.parquet")) for r in pq.read_table(f).column(0).to_pylist()]
    assert len(rows) == info["per_message"]
    (event,) = Assembler(Limits(max_message_size=size)).receive_many(rows)
    payload = bytes(event.payload)  # type: ignore[attr-defined]
    assert len(payload) == size and zlib.crc32(payload) == info["crc32"]
    body = tmp_path / "body.bin"
    body.write_bytes(payload)
    assert largecase.file_crc32(body) == (size, info["crc32"])


def test_the_stomp_client_bench_runs_both_consumers_over_the_same_frames() -> None:
    """bench.stompclient: the floor and the segmented receiver over recorded frames (its own
    Receiver asserts every segment was used, none held or rejected)."""
    (line,) = stompclient.run(64 << 10, mib=1, read=16 << 10, rounds=1)
    assert "floor" in line and "segmented" in line and "ratio" in line
