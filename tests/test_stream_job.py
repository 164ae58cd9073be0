"""The ``reassemble stream`` command's arguments and errors (no Spark: the streaming runs are in test_stream.py)."""

from __future__ import annotations

import argparse
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
