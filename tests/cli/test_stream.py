"""The ``reassemble stream`` command's arguments and errors.

No Spark: every refusal here happens before Spark starts (the streaming runs are in test_stream.py).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from reassembly._errors import JobError, UsageError
from reassembly.cli._common import seconds
from reassembly.cli.stream import add_parser, age, check_args, landed, running_batch
from tests.support.command import reassemble as run_command


@pytest.mark.parametrize(
    ("text", "value"),
    [("90", 90), ("30s", 30), ("10m", 600), ("1h", 3600), ("2d", 172800), ("500ms", 0.5), ("10 minutes", 600)],
)
def test_durations(text: str, value: float) -> None:
    assert seconds(text) == value


@pytest.mark.parametrize("text", ["soon", "10 fortnights", "-1s", ""])
def test_bad_durations(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        seconds(text)


def reassemble(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The command as a real process (nothing imports the command module)."""
    done = run_command(*args, cwd=cwd, timeout=120)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("reassemble: error: "), done.stderr[-3000:]
    return done


def stream_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["stream", *argv])


def test_errors_are_one_line(tmp_path: Path) -> None:
    done = reassemble("stream", "missing", "out", "--checkpoint", "ck", cwd=tmp_path)
    assert done.returncode == 1 and "input not found" in done.stderr
    (tmp_path / "landing").mkdir()
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "something").touch()
    done = reassemble("stream", "landing", "taken", "--checkpoint", "ck", cwd=tmp_path)
    assert done.returncode == 1 and "not a stream output" in done.stderr
    done = reassemble("stream", "landing", "out", "--checkpoint", "ck", "--master", "nowhere", cwd=tmp_path)
    assert done.returncode == 2 and "not a Spark master URL" in done.stderr


@pytest.fixture
def landing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tmp_path/landing with a file in it, tmp_path/link -> landing, and tmp_path the working directory."""
    (tmp_path / "landing" / "sub").mkdir(parents=True)
    (tmp_path / "landing" / "part-0.parquet").write_bytes(b"never read: the check runs before Spark starts")
    (tmp_path / "link").symlink_to(tmp_path / "landing")
    monkeypatch.chdir(tmp_path)
    return tmp_path / "landing"


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize(
    ("source", "output", "checkpoint", "says"),
    [
        ("landing", "landing", "ck", "output landing is the input"),
        ("landing", "landing/out", "ck", "output landing/out is inside the input"),
        ("landing", ".", "elsewhere/ck", "output . contains the input"),  # the input inside the output
        ("landing", "link/out", "ck", "output link/out is inside the input"),  # via a symlink
        ("link", "landing/out", "ck", "is inside the input"),  # the input via a symlink
        ("landing", "landing/sub/../out", "ck", "is inside the input"),  # via ..
        ("landing/sub/..", "out/../landing/x", "ck", "is inside the input"),
        ("landing", "out", "landing/ck", "checkpoint landing/ck is inside the input"),
        ("landing", "out", "link", "checkpoint link is the input"),
        ("landing/sub", "out", "landing", "checkpoint landing contains the input"),
        ("landing", "out", "out", "output out and checkpoint out overlap"),
        ("landing", "out", "out/ck", "overlap"),
        ("landing", "ck/out", "ck", "overlap"),
    ],
)
def test_output_and_checkpoint_must_lie_outside_the_input(
    landing: Path, source: str, output: str, checkpoint: str, says: str
) -> None:
    before = _tree(landing.parent)
    with pytest.raises(UsageError, match=says) as refused:
        check_args(stream_args(source, output, "--checkpoint", checkpoint))
    assert "\n" not in str(refused.value)
    assert _tree(landing.parent) == before  # nothing created, nothing removed


def test_apart_from_the_input_and_each_other_is_accepted(landing: Path) -> None:
    assert check_args(stream_args("landing", "out", "--checkpoint", "ck")) == Path("out")
    assert check_args(stream_args("link/sub", "landing/out", "--checkpoint", "landing/ck")) == Path("landing/out")
    (landing.parent / "out").mkdir()
    (landing.parent / "out" / "stray").touch()
    with pytest.raises(JobError, match="not a stream output") as refused:
        check_args(stream_args("landing", "out", "--checkpoint", "ck"))
    assert not isinstance(refused.value, UsageError)


def test_the_refusal_is_exit_code_2_and_touches_nothing(landing: Path) -> None:
    before = _tree(landing.parent)
    done = reassemble("stream", str(landing), str(landing / "out"), "--checkpoint", "ck", cwd=landing.parent)
    assert done.returncode == 2 and done.stderr.startswith("reassemble: error: output ")
    assert "is inside the input" in done.stderr
    done = reassemble("stream", "landing", "out", "--checkpoint", "link/ck", cwd=landing.parent)
    assert done.returncode == 2 and "checkpoint link/ck is inside the input" in done.stderr
    assert _tree(landing.parent) == before


def test_payload_dir_inside_the_input_or_the_checkpoint_is_refused(tmp_path: Path) -> None:
    (tmp_path / "landing").mkdir()
    args = stream_args(
        str(tmp_path / "landing"),
        str(tmp_path / "out"),
        "--checkpoint",
        str(tmp_path / "ck"),
        "--payload-dir",
        str(tmp_path / "landing" / "bodies"),
        "--large-message-bytes",
        "1000",
    )
    with pytest.raises(UsageError, match="payload dir"):
        check_args(args)
    for bodies, ck in (("ck/bodies", "ck"), ("ck", "ck"), ("bodies", "bodies/ck")):
        beside = stream_args(
            str(tmp_path / "landing"),
            str(tmp_path / "out"),
            "--checkpoint",
            str(tmp_path / ck),
            "--payload-dir",
            str(tmp_path / bodies),
        )
        with pytest.raises(UsageError, match=r"payload dir .* and checkpoint .* overlap"):
            check_args(beside)
    ok = stream_args(
        str(tmp_path / "landing"),
        str(tmp_path / "out"),
        "--checkpoint",
        str(tmp_path / "ck"),
        "--payload-dir",
        str(tmp_path / "bodies"),
    )
    assert check_args(ok) == tmp_path / "out" and ok.large_message_bytes == 128 << 20


@pytest.mark.parametrize(
    "options",
    [
        ("landing/ext/out", "--checkpoint", "ck"),
        ("elsewhere/out", "--checkpoint", "ck"),
        ("out", "--checkpoint", "elsewhere/ck"),
        ("out", "--checkpoint", "ck", "--payload-dir", "landing/ext/bodies"),
        ("out", "--checkpoint", "ck", "--payload-dir", "elsewhere"),
    ],
)
def test_nothing_is_written_where_a_link_inside_the_input_leads(landing: Path, options: tuple[str, ...]) -> None:
    """landing/ext -> elsewhere: Spark reads through the link, so an output there would be read back
    as input (the second run would fail for good: CONFLICTING_DIRECTORY_STRUCTURES). The stream
    refuses it, as `run` does."""
    (landing.parent / "elsewhere").mkdir()
    (landing / "ext").symlink_to(landing.parent / "elsewhere")
    with pytest.raises(UsageError, match=r"linked from .*landing/ext"):
        check_args(stream_args("landing", *options))


def test_an_idle_trigger_is_one_line_never_a_batch_that_did_not_run(tmp_path: Path) -> None:
    """Spark reports an idle trigger under the id of the batch still to run. That is one 'idle' line, never
    a status line; and once that batch has run, its line counts its own rows: taken from the idle report
    (0 rows in, found first for that id) it said "0 rows in" for a batch that read 8."""
    import io

    from reassembly.cli.stream_status import StatusLines

    out = io.StringIO()
    lines = StatusLines(out, tmp_path / "out")
    idle = SimpleNamespace(batchId=2, numInputRows=0, durationMs={"latestOffset": 3, "triggerExecution": 3})
    lines.flush(SimpleNamespace(recentProgress=[idle]))
    lines.flush(SimpleNamespace(recentProgress=[idle]))
    (tmp_path / "out" / "_commits").mkdir(parents=True)
    (tmp_path / "out" / "_commits" / "2").write_text("message:complete 2\nstate:groups 0\n")  # the sink committed it
    lines.flush(SimpleNamespace(recentProgress=[idle]))  # the batch's own report has not come yet: no line
    ran = SimpleNamespace(
        batchId=2,
        numInputRows=8,
        stateOperators=[],
        eventTime={"watermark": "1970-01-01T00:00:00.000Z"},
        timestamp="2026-01-02T03:04:05.678Z",
        durationMs={"addBatch": 900, "triggerExecution": 1234},
    )
    lines.flush(SimpleNamespace(recentProgress=[idle, ran]))
    lines.flush(SimpleNamespace(recentProgress=[idle, ran]))
    text = out.getvalue().splitlines()
    assert text[0] == "idle: no new input (batch 2 did not run)" and len(text) == 2
    assert text[1].startswith("2026-01-02T03:04:05.678Z batch 2 (1.2s): 8 rows in; messages complete 2; ")
    assert "; oldest held none; " in text[1]


@pytest.mark.parametrize(
    ("ms", "said"),
    [
        (-5, "0ms"),
        (850, "850ms"),
        (42_000, "42.0s"),
        (725_000, "12m05s"),
        (11_220_000, "3h07m"),
        (187_200_000, "2d04h"),
    ],
)
def test_ages_read_as_durations(ms: int, said: str) -> None:
    assert age(ms) == said


def test_every_option_of_stream_says_its_default() -> None:
    parser = argparse.ArgumentParser()
    p = add_parser(parser.add_subparsers(dest="command"))
    valued = [a for a in p._actions if a.option_strings and a.nargs != 0 and not a.required and a.dest != "conf"]
    assert {a.dest for a in valued} >= {"expire_after", "tombstone", "watermark", "trigger", "input_format"}
    for action in valued:
        assert action.help and "default" in action.help, action.dest
    shown = p.format_help()
    for said in ("(default 1h)", "(default 1d)", "(default 10m)", "(default available-now)", "(default encoded)"):
        assert said in " ".join(shown.split()), said
    args = stream_args("in", "out", "--checkpoint", "ck")
    assert (args.expire_after, args.tombstone, args.watermark) == (3600.0, 86400.0, 600.0)  # the defaults parsed


def test_the_batch_running_and_whether_anything_landed_are_read_from_files(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    assert running_batch(str(ck)) is None
    (ck / "offsets").mkdir(parents=True)
    (ck / "commits").mkdir()
    for name in ("0", "1", ".1.crc"):
        (ck / "offsets" / name).touch()
    (ck / "commits" / "0").touch()
    assert running_batch(str(ck)) == 1
    (ck / "commits" / "1").touch()
    assert running_batch(str(ck)) is None
    (tmp_path / "landing" / "_spark_metadata").mkdir(parents=True)
    (tmp_path / "landing" / ".part-0.parquet.crc").touch()
    (tmp_path / "landing" / "_spark_metadata" / "0").touch()
    assert not landed(str(tmp_path / "landing"))  # Spark skips names starting with . or _
    (tmp_path / "landing" / "day=1").mkdir()
    (tmp_path / "landing" / "day=1" / "part-0.parquet").touch()
    assert landed(str(tmp_path / "landing"))


def test_a_new_stream_on_an_empty_directory_has_nothing_to_do_and_starts_no_spark(tmp_path: Path) -> None:
    """Not an error (the files land later); with available-now it ends at once, leaving the output's folders."""
    (tmp_path / "landing").mkdir()
    (tmp_path / "landing" / ".part-0.parquet.inprogress").touch()  # hidden: not landed yet
    done = subprocess.run(
        [sys.executable, "-m", "reassembly", "stream", "landing", "out", "--checkpoint", "ck"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.splitlines()[0] == "idle: nothing has landed in landing yet"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "_commits", "_incoming", "duplicates", "messages", "quarantine"
    ]  # fmt: skip
    assert not running_batch(str(tmp_path / "ck")) and not (tmp_path / "ck" / "offsets").exists()
