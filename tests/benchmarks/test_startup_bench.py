"""``python -m bench.startup``'s harness without Spark: the rounds interleaved and rotated, the
medians per case and phase, the table, and the cases that start no JVM run in fresh processes."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from bench import startup


def test_each_round_starts_with_the_next_case() -> None:
    rounds = startup.order(3, ("a", "b", "c"))
    assert rounds == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]


def test_medians_and_the_table_read_every_case_and_phase() -> None:
    runs = [
        {"case": "run", "wall": w, "phases": {"spark_start": s, "reassemble": 2.0}}
        for w, s in ((10.0, 5.0), (12.0, 7.0), (11.0, 6.0))
    ] + [{"case": "python", "wall": 0.05, "phases": {}}]
    m = startup.medians(runs)
    assert m["run"]["wall"] == {"median": 11.0, "min": 10.0, "max": 12.0}
    assert m["run"]["phases"]["spark_start"]["median"] == 6.0 and m["python"]["phases"] == {}
    text = startup.table({"medians": m})
    assert "| run | 11.00 (10.00-12.00) | spark_start 6.00, reassemble 2.00 |" in text
    assert "| python | 0.05 (0.05-0.05) | - |" in text


def test_the_cases_without_spark_run_in_fresh_processes(tmp_path: Path) -> None:
    data = startup.landing(tmp_path / "landing", segments=8, size=1024)
    assert pq.read_metadata(data / "part-0.parquet").num_rows == 8
    for case in ("python", "imports"):
        got = startup.run_case(case, tmp_path, data)
        assert got["case"] == case and got["wall"] > 0 and got["phases"] == {}
