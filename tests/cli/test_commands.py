"""The command's table of subcommands, its shared argument types and its one interrupt behaviour.

No Spark: parsing (in this process), and a ``receive`` process waiting on stdin.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reassembly.cli._common import EXIT_INTERRUPTED, EXIT_USAGE, at_least
from reassembly.cli.main import COMMANDS, parser
from tests.support.command import reassemble


def test_the_table_names_each_subcommand_as_its_parser_does_in_help_order() -> None:
    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert list(sub.choices) == list(COMMANDS) == [
        *("run", "demo", "refmsg", "receive", "stream", "collect", "drain", "consume", "claimcheck", "store")
    ]
    assert {name: p.prog for name, p in sub.choices.items()} == {name: f"reassemble {name}" for name in COMMANDS}


@pytest.mark.parametrize(("text", "says"), [("x", "not an integer: 'x'"), ("0", "must be at least 1, got 0")])
def test_one_positive_integer_type_one_wording(text: str, says: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=says):
        at_least(1)(text)


@pytest.mark.spark  # demo: the in-process run opens the shared session
@pytest.mark.parametrize(("command", "option"), [("demo", "--messages"), ("drain", "--prefetch")])
def test_every_subcommand_words_a_bad_count_the_same(command: str, option: str) -> None:
    places = ["amqp://nowhere:1", "q", "landing"] if command == "drain" else []
    done = reassemble(command, *places, option, "x")
    assert done.returncode == EXIT_USAGE
    assert done.stderr == (
        f"reassemble: error: argument {option}: not an integer: 'x' (see: reassemble {command} --help)\n"
    )


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_and_sigterm_end_a_subcommand_as_one_interrupted_line(tmp_path: Path, signum: int) -> None:
    """``receive`` blocked on stdin: both signals are the command's interrupt, not a death by signal."""
    root = tmp_path / "root"
    proc = subprocess.Popen(
        [sys.executable, "-m", "reassembly", "receive", "--root", str(root)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not root.exists():  # the receiver runs: the handlers are in place
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == EXIT_INTERRUPTED and err == "reassemble: interrupted\n" and out == "", err


def test_an_unexpected_error_is_one_line_and_verbose_shows_the_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exception that is not one of ours (a bug, an unforeseen library error) ends the command with
    exit 1 and one line naming its type and first line; ``--verbose`` shows the traceback instead."""

    def broken(args: argparse.Namespace) -> int:
        raise RuntimeError("no such thing\nand a second line")

    monkeypatch.setitem(COMMANDS, "store", (COMMANDS["store"][0], broken))
    store = ("store", "list", "--store", str(tmp_path / "segments.db"))
    done = reassemble(*store)
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == ["reassemble: error: RuntimeError: no such thing (--verbose shows more)"]
    loud = reassemble(*store, "--verbose")
    assert loud.returncode == 1 and "Traceback" in loud.stderr and "and a second line" in loud.stderr, loud.stderr
