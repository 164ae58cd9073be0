"""The ``reassemble stream`` command's arguments and errors.

No Spark: every refusal here happens before Spark starts (the streaming runs are in test_stream.py).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from reassembly.cli import main
from reassembly.spark.stream_job import seconds


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


def test_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ck = str(tmp_path / "ck")
    assert main(["stream", str(tmp_path / "missing"), str(tmp_path / "out"), "--checkpoint", ck]) == 1
    assert capsys.readouterr().err.strip().startswith("reassemble: error: input not found")
    (tmp_path / "landing").mkdir()
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "something").touch()
    assert main(["stream", str(tmp_path / "landing"), str(tmp_path / "taken"), "--checkpoint", ck]) == 1
    assert "not a stream output" in capsys.readouterr().err


@pytest.fixture
def landing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tmp_path/landing with a file in it, tmp_path/link -> landing, and tmp_path the working directory."""
    (tmp_path / "landing" / "sub").mkdir(parents=True)
    (tmp_path / "landing" / "part-0.parquet").write_bytes(b"not read: the check runs before Spark")
    (tmp_path / "link").symlink_to(tmp_path / "landing")
    monkeypatch.chdir(tmp_path)
    return tmp_path / "landing"


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize(
    ("output", "checkpoint", "says"),
    [
        ("landing", "ck", "output landing is the input"),
        ("landing/out", "ck", "output landing/out is inside the input"),
        (".", "elsewhere/ck", "output . contains the input"),  # the input inside the output
        ("link/out", "ck", "output link/out is inside the input"),  # via a symlink
        ("landing/sub/../out", "ck", "is inside the input"),  # via ..
        ("out", "landing/ck", "checkpoint landing/ck is inside the input"),
        ("out", "link", "checkpoint link is the input"),
        ("out", "out", "output out and checkpoint out overlap"),
        ("out", "out/ck", "overlap"),
        ("ck/out", "ck", "overlap"),
    ],
)
def test_output_and_checkpoint_must_lie_outside_the_input(
    landing: Path, output: str, checkpoint: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _tree(landing.parent)
    assert main(["stream", "landing", output, "--checkpoint", checkpoint]) == 2
    err = capsys.readouterr().err
    assert err.startswith("reassemble: error: ") and err.count("\n") == 1
    assert says in err
    assert _tree(landing.parent) == before  # nothing created, nothing removed


def test_input_given_through_the_symlink_is_the_same_input(landing: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stream", "link", "landing/out", "--checkpoint", "ck"]) == 2
    assert "is inside the input" in capsys.readouterr().err


def test_a_malformed_master_is_a_usage_error(landing: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stream", "landing", "out", "--checkpoint", "ck", "--master", "nowhere"]) == 2
    assert "not a Spark master URL" in capsys.readouterr().err


def test_the_refusal_as_a_real_process(landing: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "reassembly", "stream", str(landing), str(landing / "out"), "--checkpoint", "ck"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("reassemble: error: output ") and done.stderr.count("\n") == 1
    assert not (landing / "out").exists() and not (landing.parent / "ck").exists()
