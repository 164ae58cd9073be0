"""``python -m bench.segstore``'s cases without Kafka, on 8 MiB and SQLite: each runs, delivers every
message and reports its time; the table names every case with its ratio to the in-memory path."""

from __future__ import annotations

from pathlib import Path

from bench import segstore


def test_the_store_cases_run_and_the_table_reads_them(tmp_path: Path) -> None:
    msgs = segstore.records(8)
    assert len(msgs) == 2 and all(len(r) <= segstore.SEGMENT for m in msgs for r in m)
    memory = segstore.case_memory(msgs)
    floor = segstore.case_floor(msgs, str(tmp_path / "floor.db"), 64)
    store = segstore.case_store(msgs, str(tmp_path / "store.db"), 64)
    assert 0 < floor["write_seconds"] <= floor["seconds"] and 0 < store["write_seconds"] <= store["seconds"]
    rows = [
        {"case": case, "store": kind, "mib": 8.0, "mib_s": 8.0 / r["seconds"], **r}
        for case, kind, r in (("memory", "-", memory), ("db-floor", "sqlite", floor), ("store-1", "sqlite", store))
    ]
    text = segstore.table({"mib": 8.0, "messages": 2, "batch": 64, "rows": rows})
    assert "| memory | - |" in text and "| store-1 | sqlite |" in text and "| db-floor | sqlite |" in text
