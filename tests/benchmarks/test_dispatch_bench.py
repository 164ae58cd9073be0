"""``python -m bench.dispatch --quick``: the whole harness (its own mock cluster, fresh processes per
case, the table) on a small data set; and the pure parts (schedule, summary) on made-up runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2]))  # bench/ is a directory of the repo, not installed
from bench import dispatch

REPO = Path(__file__).parents[2]


def test_quick_run_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "quick.json"
    proc = subprocess.run([sys.executable, "-m", "bench.dispatch", "--quick", "--json", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=180, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(out.read_text())
    rows = {(r["case"], r["work"]): r for r in results["summary"]}
    assert set(rows) == {("sequential", "0"), ("threads", "0"), ("sequential", "cpu"), ("threads", "cpu"),
                         ("processes", "cpu")}  # fmt: skip
    for r in rows.values():
        assert r["error"] is None and r["rate"] > 0
    assert all(run["handled"] > 0 for run in results["runs"])
    assert rows[("threads", "0")]["peak_held_bytes"] <= rows[("threads", "0")]["budget_bytes"] + 4096
    assert "| 1 KiB | 0 | threads | 2 |" in proc.stdout and "Goals" in proc.stdout


def test_schedule_interleaves_and_summary_takes_per_round_ratios() -> None:
    items = ["a", "b", "c"]
    order = list(dispatch.schedule(items, rounds=2, warmup_rounds=1))
    assert order == [(0, "c"), (0, "a"), (0, "b"), (1, "a"), (1, "b"), (1, "c"), (2, "b"), (2, "c"), (2, "a")]
    runs = []
    for rd, (seq0, thr0, seq_s, thr_s) in enumerate([(100, 80, 10, 60), (200, 140, 20, 100)], 1):
        for case, work, n, rate in [("sequential", "0", 1, seq0), ("threads", "0", 4, thr0),
                                    ("sequential", "sleep", 1, seq_s), ("threads", "sleep", 64, thr_s)]:  # fmt: skip
            runs.append({"segment": 1024, "case": case, "work": work, "workers": n, "round": rd, "rate": rate})
    rows = {(r["case"], r["work"]): r for r in dispatch.summarize(runs, cores=2)}
    assert rows[("threads", "0")]["vs_sequential"] == (0.8 + 0.7) / 2
    # at 1 ms of sleep with 64 workers the ideal is 64k/s: the bound is the sequential loop at 0 ms
    assert rows[("threads", "sleep")]["vs_bound"] == (60 / 100 + 100 / 200) / 2
    assert rows[("threads", "sleep")]["ideal"] == 64_000
