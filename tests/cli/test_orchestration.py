"""What an orchestrator consumes: ``--summary-json``, ``--fail-on`` exit codes, ``--conf``, ``--version``,
logging on stderr, and no noise there. Real processes and real Spark."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reassembly.cli._common import EXIT_CODES, EXIT_CONDITION, EXIT_FAILED, EXIT_OK, EXIT_USAGE
from reassembly.cli.summary import IDENTITY_STREAM, SCHEMA, problems
from reassembly.spark.testdata import generate, write_parquet
from segmenter import segment
from tests.support.command import reassemble

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Incomplete and corrupt messages and quarantined segments (testdata's faults)."""
    ds = generate(n_messages=12, segments_per_message=3, segment_size=1024, groups=1)
    return write_parquet(ds, tmp_path_factory.mktemp("faulty"), files=2)


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Whole messages, every segment once: nothing for --fail-on to find."""
    rows = [s.encode() for i in range(6) for s in segment(os.urandom(3000 + i), max_segment_size=1024)]
    path = tmp_path_factory.mktemp("clean") / "clean.parquet"
    pq.write_table(pa.table({"segment": pa.array(rows, pa.binary())}), path)
    return path


def printed_counts(stdout: str) -> tuple[int, int, int, int]:
    m = re.search(r"^segments: (\d+) in = (\d+) used \+ (\d+) quarantined \+ (\d+) duplicates: holds$", stdout, re.M)
    assert m, stdout[-2000:]
    rows_in, used, quarantined, duplicates = map(int, m.groups())
    return rows_in, used, quarantined, duplicates


@pytest.mark.spark
def test_the_summary_json_of_a_run_matches_the_schema_the_printed_summary_and_fail_on(
    faulty: Path, tmp_path: Path
) -> None:
    """--fail-on incomplete: the run writes everything, then exits 3; the JSON says which conditions held."""
    out, summary = tmp_path / "out", tmp_path / "summary.json"
    done = reassemble("run", str(faulty), str(out), "--summary-json", str(summary), "--fail-on", "incomplete")
    assert done.returncode == EXIT_CONDITION, done.stderr[-3000:]
    assert re.fullmatch(r"reassemble: --fail-on: incomplete \(\d+ messages?\)\n", done.stderr), done.stderr
    assert (out / "messages").is_dir() and (out / "quarantine").is_dir()  # everything written first
    doc = json.loads(summary.read_text())
    assert problems(doc) == [], problems(doc)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # the JSON's temporary is gone too
    assert doc["outcome"] == "completed" and doc["exit_code"] == EXIT_CONDITION and doc["error"] is None
    assert doc["argv"][:2] == ["run", str(faulty)] and doc["command_line"].startswith("reassemble run ")
    rows_in, used, quarantined, duplicates = printed_counts(done.stdout)
    assert doc["accounting"] == {
        "identity": "rows_in = used + quarantined + duplicates",
        "rows_in": rows_in,
        "used": used,
        "quarantined": quarantined,
        "duplicates": duplicates,
        "holds": True,
    }
    counts = doc["counts"]
    assert (counts["rows_in"], counts["used"], counts["quarantined"], counts["duplicates"]) == (
        rows_in,
        used,
        quarantined,
        duplicates,
    )
    for status, n in counts["messages"].items():  # every status line of the printed table
        assert n == 0 or re.search(rf"^  {status}\s+{n}\s", done.stdout, re.M), (status, n)
    assert sum(r["segments"] for r in counts["quarantined_by_reason"]) == quarantined
    for r in counts["quarantined_by_reason"]:
        assert re.search(rf"^  {r['reason']} {r['reason_name']}\s+{r['segments']}$", done.stdout, re.M), r
    messages = pq.read_table(out / "messages").to_pylist()
    by_status = {s: sum(m["status"] == s for m in messages) for s in ("complete", "incomplete", "corrupt")}
    assert {s: counts["messages"][s] for s in by_status} == by_status
    assert doc["conditions"] == {"incomplete": True, "corrupt": True, "quarantine": True, "skipped": False}
    assert doc["fail_on"] == {"requested": ["incomplete"], "held": ["incomplete"]}
    assert doc["output"]["messages"] == str(out / "messages") and doc["output"]["payloads"] is None
    assert doc["input"]["pattern"] == str(faulty) and doc["input"]["bytes"] > 0
    assert doc["versions"]["spark"] and doc["versions"]["python"] == ".".join(map(str, sys.version_info[:3]))
    phases = {"total", "footers", "spark_start", "input", "jar", "read", "reassemble", "summary"}
    assert set(doc["durations_seconds"]) >= phases
    assert doc["durations_seconds"]["total"] >= doc["durations_seconds"]["reassemble"] > 0
    assert doc["started_at"] < doc["ended_at"] and doc["started_at"].endswith("+00:00")


@pytest.mark.spark
def test_a_clean_run_with_every_condition_exits_0_quietly_and_passes_conf_to_spark(clean: Path, tmp_path: Path) -> None:
    """Nothing held: exit 0. --conf reaches the session (seen in Spark's own event log). Nothing on
    stderr: no pyspark FutureWarning about pandas, no Spark start-up lines."""
    events = tmp_path / "events"
    events.mkdir()
    summary = tmp_path / "s.json"
    done = reassemble(
        "run", str(clean), str(tmp_path / "out"), "--summary-json", str(summary),
        "--fail-on", "incomplete,corrupt", "--fail-on", "quarantine",
        "--conf", "spark.eventLog.enabled=true", "--conf", f"spark.eventLog.dir={events.as_uri()}",
        "--conf", "spark.eventLog.compress=false", "--conf", "spark.reassemble.probe=a=b",
        process=True,  # launch-time settings and the launch's output: the process's own session
    )  # fmt: skip
    assert done.returncode == EXIT_OK, done.stderr[-3000:]
    assert done.stderr == ""
    doc = json.loads(summary.read_text())
    assert problems(doc) == []
    assert doc["conditions"] == {"incomplete": False, "corrupt": False, "quarantine": False, "skipped": False}
    assert doc["fail_on"] == {"requested": ["incomplete", "corrupt", "quarantine"], "held": []}
    assert doc["counts"]["messages"]["complete"] == 6 and doc["exit_code"] == EXIT_OK
    logs = "".join(p.read_text() for p in events.rglob("*") if p.is_file())  # a folder per application
    assert '"spark.reassemble.probe":"a=b"' in logs  # the value keeps its own '='


@pytest.mark.spark
def test_a_failed_run_still_writes_its_record(tmp_path: Path) -> None:
    """An orchestrator never reads an earlier run's file as this one's: a failure replaces it too."""
    summary = tmp_path / "s.json"
    summary.write_text("{}")
    done = reassemble("run", str(tmp_path / "nope"), str(tmp_path / "out"), "--summary-json", str(summary))
    assert done.returncode == EXIT_FAILED
    doc = json.loads(summary.read_text())
    assert problems(doc) == [], problems(doc)
    assert doc["outcome"] == "failed" and doc["exit_code"] == EXIT_FAILED
    assert doc["error"] == f"input not found: {tmp_path / 'nope'}"
    assert doc["counts"] is None and doc["accounting"] is None


@pytest.mark.spark
def test_the_summary_file_may_not_land_in_the_input(faulty: Path, tmp_path: Path) -> None:
    """A usage error (exit 2) touches nothing: neither OUTPUT nor the refused FILE is written."""
    done = reassemble("run", str(faulty), str(tmp_path / "out"), "--summary-json", str(faulty / "s.json"))
    assert done.returncode == EXIT_USAGE and "is inside the input" in done.stderr
    assert not (faulty / "s.json").exists() and not (tmp_path / "out").exists()


@pytest.mark.spark
def test_incremental_runs_write_their_summary_with_what_they_carried(tmp_path: Path) -> None:
    """--summary-json with --incremental: each run's counts, its identity with the rows carried in and
    out, the checkpoint's facts; a message cut over two runs is complete in the later, so --fail-on
    incomplete holds in neither; an idle run writes its record too, with nothing counted."""
    from tests.cli.test_incremental import land, split_by_message

    ds = generate(n_messages=10, segments_per_message=3, segment_size=1024, faults=False, groups=0)
    parts = split_by_message(ds.rows, 2)
    landing, out, ck, summary = tmp_path / "landing", tmp_path / "out", tmp_path / "ck", tmp_path / "s.json"
    landing.mkdir()
    command = ("run", str(landing), str(out), "--incremental", "--checkpoint", str(ck))
    command += ("--summary-json", str(summary), "--fail-on", "incomplete,corrupt")
    docs = []
    for i, part in enumerate(parts):
        land(landing, f"f{i}.parquet", part)
        done = reassemble(*command)
        assert done.returncode == EXIT_OK, done.stderr[-3000:]
        docs.append(json.loads(summary.read_text()))
        assert problems(docs[-1]) == [], problems(docs[-1])
        if i == 0:  # nothing new yet: an idle run, carrying what run 1 carried, says so in both forms
            idle = reassemble(*command)
            carried_out = docs[0]["incremental"]["carried_out"]
            rows, groups = carried_out["rows"], carried_out["groups"]
            said = f"{groups} incomplete group{'' if groups == 1 else 's'} ({rows} row{'' if rows == 1 else 's'})"
            assert idle.stdout.startswith(f"idle: no new input (last run 1; carrying {said})"), idle.stdout
            assert json.loads(summary.read_text())["incremental"]["carried_out"] == carried_out
    first, second = docs
    assert first["incremental"]["run"] == 1 and second["incremental"]["run"] == 2
    assert first["accounting"]["identity"] == "rows_in = used + quarantined + duplicates + carried_out"
    carried = first["incremental"]["carried_out"]["rows"]
    assert carried > 0 and first["accounting"]["carried_out"] == carried and first["accounting"]["holds"]
    assert second["incremental"]["carried_in"] == second["accounting"]["carried_in"] == carried
    assert second["accounting"]["carried_out"] == 0 and second["accounting"]["holds"]
    assert first["counts"]["rows_in"] == len(parts[0])
    assert second["counts"]["rows_in"] == len(parts[1]) + carried
    assert first["counts"]["messages"]["complete"] + second["counts"]["messages"]["complete"] == 10
    assert second["output"]["messages"] == str(out / "messages" / "run=2")
    size = (landing / "f1.parquet").stat().st_size
    assert second["input"] == {"pattern": str(landing), "paths": 1, "bytes": size, "skipped_files": []}
    assert second["fail_on"] == {"requested": ["incomplete", "corrupt"], "held": []}
    idle = reassemble(*command)
    assert idle.returncode == EXIT_OK, idle.stderr
    doc = json.loads(summary.read_text())
    assert problems(doc) == [] and doc["incremental"]["run"] is None and doc["counts"] is None
    refused = reassemble(*command[:6], "--summary-json", str(ck / "s.json"))
    assert refused.returncode == EXIT_USAGE and f"--summary-json {ck / 's.json'} is inside the checkpoint" in (
        refused.stderr
    )


@pytest.mark.spark
def test_a_stream_writes_its_summary_and_fails_on_what_its_batches_did(faulty: Path, tmp_path: Path) -> None:
    """``stream --summary-json``: counts summed over the batches this invocation ran, what state holds
    after them; --fail-on quarantine exits 3 once the batches are committed. The same command again
    finds no new input: no batch, exit 0."""
    landing = tmp_path / "landing"
    landing.mkdir()
    rows = 0
    for f in sorted(faulty.glob("*.parquet")):
        (landing / f.name).write_bytes(f.read_bytes())
        rows += pq.read_metadata(f).num_rows
    out, ck, summary = tmp_path / "out", tmp_path / "ck", tmp_path / "s.json"
    command = ("stream", str(landing), str(out), "--checkpoint", str(ck), "--summary-json", str(summary))
    done = reassemble(*command, "--fail-on", "quarantine")
    assert done.returncode == EXIT_CONDITION, done.stderr[-3000:]
    assert re.fullmatch(r"reassemble: --fail-on: quarantine \(\d+ segments?\)\n", done.stderr), done.stderr
    doc = json.loads(summary.read_text())
    assert problems(doc) == [], problems(doc)
    assert doc["command"] == "stream" and doc["outcome"] == "completed" and doc["exit_code"] == EXIT_CONDITION
    stream = doc["stream"]
    assert stream["batches"] and stream["stopped"] == "end of input" and stream["trigger"] == "available-now"
    assert doc["counts"]["rows_in"] == rows
    quarantined = sum(len(pq.read_table(p)) for p in (out / "quarantine").rglob("*.parquet"))
    assert doc["counts"]["quarantined"] == quarantined > 0
    messages = [m for p in (out / "messages").rglob("*.parquet") for m in pq.read_table(p).to_pylist()]
    for status in ("complete", "incomplete", "corrupt"):
        assert doc["counts"]["messages"][status] == sum(m["status"] == status for m in messages), status
    assert stream["held"] is not None and doc["fail_on"]["held"] == ["quarantine"]
    # duplicates mean what they mean in run: every identical copy, the late ones (after their message left) apart
    late = sum(len(pq.read_table(p)) for p in (out / "duplicates").rglob("*.parquet"))
    assert doc["counts"]["duplicates"] == sum(m["duplicates"] or 0 for m in messages) + late > 0
    assert stream["late_duplicates"] == late and doc["counts"]["used"] == sum(m["segments_used"] or 0 for m in messages)
    # the accounting identity, per batch and over them, as run has it
    a = doc["accounting"]
    assert a["identity"] == IDENTITY_STREAM
    assert a["holds"] and a["held_before"] == 0 and a["held_after"] == stream["held"]["segments"]
    assert (a["rows_in"], a["used"], a["quarantined"], a["duplicates"]) == tuple(
        doc["counts"][k] for k in ("rows_in", "used", "quarantined", "duplicates")
    )
    per_batch = stream["accounting_by_batch"]
    assert [b["batch"] for b in per_batch] == stream["batches"] and all(b["holds"] for b in per_batch)
    assert sum(b["rows_in"] for b in per_batch) == rows
    said = (
        f"segments: {rows} in + 0 held before = {a['used']} used + {a['quarantined']} quarantined +"
        f" {a['duplicates']} duplicates + {a['dropped_by_watermark']} dropped by watermark + {a['held_after']}"
        " held after: holds"
    )
    assert said in done.stdout, done.stdout
    again = reassemble(*command, "--fail-on", "quarantine")
    assert again.returncode == EXIT_OK, again.stderr[-3000:]
    doc = json.loads(summary.read_text())
    assert problems(doc) == [] and doc["stream"]["batches"] == [] and doc["counts"]["rows_in"] == 0
    assert doc["stream"]["held"] == stream["held"]  # known from the last committed batch: nothing changed it
    held = stream["held"]["segments"]  # and so is the identity over no batch: what was held still is
    assert doc["accounting"] | {"identity": ""} == {
        "identity": "", "rows_in": 0, "used": 0, "quarantined": 0, "duplicates": 0,
        "held_before": held, "dropped_by_watermark": 0, "held_after": held, "holds": True,
    }  # fmt: skip


def test_a_stream_that_never_ran_a_batch_says_state_holds_nothing(tmp_path: Path) -> None:
    """An available-now stream over a landing directory with nothing in it yet starts no Spark; what
    state holds is known all the same (nothing), and so is the identity."""
    landing = tmp_path / "landing"
    landing.mkdir()
    summary = tmp_path / "s.json"
    done = reassemble(
        "stream", str(landing), str(tmp_path / "out"), "--checkpoint", str(tmp_path / "ck"),
        "--summary-json", str(summary),
    )  # fmt: skip
    assert done.returncode == EXIT_OK, done.stderr
    doc = json.loads(summary.read_text())
    assert problems(doc) == [] and doc["stream"]["stopped"] == "no input" and doc["versions"]["spark"] is None
    assert doc["stream"]["held"] == {"groups": 0, "segments": 0, "held_bytes": 0, "spooled_bytes": 0}
    assert doc["stream"]["tombstones"] == 0 and doc["accounting"]["holds"] is True


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (
            ["run", "in", "out", "--conf", "spark.ui.enabled"],
            "argument --conf: expected KEY=VALUE, got 'spark.ui.enabled'",
        ),
        (["demo", "--conf", "=x"], "argument --conf: expected KEY=VALUE, got '=x'"),
        (["refmsg", "in", "out", "--conf", "nothing"], "expected KEY=VALUE"),
        (["stream", "in", "out", "--checkpoint", "ck", "--conf", "x"], "expected KEY=VALUE"),
        (["run", "in", "out", "--fail-on", "incomplete,late"], "unknown condition 'late'"),
        (["demo", "--summary-json", "/no/such/dir/s.json"], "directory does not exist: /no/such/dir"),
    ],
)
def test_malformed_orchestration_options_are_usage_errors(argv: list[str], says: str, tmp_path: Path) -> None:
    done = reassemble(*argv, cwd=tmp_path)
    assert done.returncode == EXIT_USAGE
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("reassemble: error: ") and says in lines[0], done.stderr
    assert list(tmp_path.iterdir()) == []


def test_version_names_the_library_spark_and_python() -> None:
    from importlib.metadata import version

    import pyspark

    done = reassemble("--version")
    assert done.returncode == 0 and done.stderr == ""
    python = sys.version.split()[0]
    expected = f"reassemble {version('segment-reassembly')} (Spark {pyspark.__version__}, Python {python})"
    assert done.stdout == expected + "\n"


def test_the_exit_codes_are_the_documented_ones() -> None:
    page = (REPO / "docs" / "reference" / "command-line.md").read_text()
    table = dict(re.findall(r"^\| (\d+) \| ([^|]+?) \|", page, re.M))
    assert {int(k) for k in table} == set(EXIT_CODES), table


def test_the_documented_schema_is_the_one_in_the_code() -> None:
    page = (REPO / "docs" / "reference" / "command-line.md").read_text()
    block = re.search(r"<!-- schema -->\n```json\n(.*?)\n```", page, re.S)
    assert block, "docs/reference/command-line.md holds the schema in a ```json block after <!-- schema -->"
    assert json.loads(block.group(1)) == SCHEMA


def test_the_validator_finds_what_is_wrong() -> None:
    """The small validator the schema test relies on does see a wrong document."""
    doc: dict[str, Any] = {"summary_version": 1, "command": "run", "extra": 1, "exit_code": True}
    found = problems(doc)
    assert "$: 'extra' is not expected" in found and "$: 'argv' is missing" in found
    assert any(p.startswith("$.exit_code: bool") for p in found)  # JSON true is no integer


def test_pandas_3_is_kept_out() -> None:
    """pyspark[connect] installs pandas and pyspark warns on pandas 3 (FutureWarning on every command):
    the main dependencies keep it below 3 (the run above shows stderr stays empty)."""
    tomllib = pytest.importorskip("tomllib")
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(re.fullmatch(r"pandas\b.*<\s*3", d.replace(" ", "")) for d in deps), deps
    import pandas

    assert int(pandas.__version__.split(".")[0]) < 3


def _writes_to_the_terminal(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id == "print":
                found.append(f"{path.relative_to(REPO)}:{node.lineno} print")
            if (
                isinstance(f, ast.Attribute)
                and f.attr == "write"
                and isinstance(f.value, ast.Attribute)
                and f.value.attr in ("stdout", "stderr")
            ):
                found.append(f"{path.relative_to(REPO)}:{node.lineno} sys.{f.value.attr}.write")
    return found


def test_the_library_logs_and_never_prints() -> None:
    """Only the command (reassembly/cli) writes to the terminal; the library logs through ``logging``."""
    files = [p for root in ("segmenter", "refmsg", "reassembly") for p in sorted((REPO / root).rglob("*.py"))]
    library = [p for p in files if "cli" not in p.relative_to(REPO).parts and p.name != "__main__.py"]
    assert [w for p in library for w in _writes_to_the_terminal(p)] == []
    assert _writes_to_the_terminal(REPO / "reassembly" / "cli" / "_common.py")  # the checker does see writes


def test_the_command_shows_the_library_warnings_and_with_verbose_its_info(tmp_path: Path) -> None:
    """Logging goes to stderr as ``reassemble: LEVEL: LOGGER: message``: WARNING by default, INFO with
    --verbose (here: the hidden temporary of an ended run, removed by the next run's start)."""
    code = (
        "import logging, sys\n"
        "from reassembly.cli._common import configure_logging\n"
        "configure_logging(sys.argv[1] == 'verbose')\n"
        "logging.getLogger('reassembly._files').info('removed x')\n"
        "logging.getLogger('reassembly.spark.batch.job').warning('tasks still running')\n"
        "logging.getLogger('py4j.clientserver').error('a py4j traceback')\n"
    )
    quiet = subprocess.run([sys.executable, "-c", code, "quiet"], capture_output=True, text=True, timeout=60)
    assert quiet.stderr == "reassemble: warning: reassembly.spark.batch.job: tasks still running\n"
    loud = subprocess.run([sys.executable, "-c", code, "verbose"], capture_output=True, text=True, timeout=60)
    assert loud.stderr.splitlines() == [
        "reassemble: info: reassembly._files: removed x",
        "reassemble: warning: reassembly.spark.batch.job: tasks still running",
        "reassemble: error: py4j.clientserver: a py4j traceback",
    ]


@pytest.mark.spark
def test_the_progress_bar_is_the_commands_and_follows_the_active_session(
    spark: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The bar finds the session the job starts (none when it begins), draws on stderr and clears its line."""
    from collections.abc import Iterator

    from reassembly.cli._common import Progress

    def slow(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import time

        for batch in batches:
            time.sleep(1.5)
            yield batch

    with Progress(True):
        spark.range(0, 2, numPartitions=2).mapInArrow(slow, "id long").collect()
    err = capsys.readouterr().err
    assert re.search(r"\r\[[#-]{30}\] \d+/\d+ tasks  (stage \d+|planning)", err), err
    assert err.endswith("\r" + " " * 78 + "\r")
    with Progress(False):
        spark.range(0, 2, numPartitions=2).mapInArrow(slow, "id long").collect()
    assert capsys.readouterr().err == ""
