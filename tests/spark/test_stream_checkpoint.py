"""Checkpoints across versions and options: what a restart continues, and what it refuses.

A checkpoint's state only means something to the code and options that wrote it
(the state variables' schemas, what the header summary holds, Unit of Work, the
body directory held rows point into). ``bind_checkpoint`` records them at the first
start and refuses a restart that would misread them, with a one-line reason and
nothing touched, instead of continuing and losing or misjudging what is held.
Restarting with the same version after the process died is the SIGKILL test in
``test_stream.py``; here, a restart in the same process after a clean end.
"""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from reassembly.spark.batch.pipeline import ReassemblyOptions
from reassembly.spark.stream.functions import (
    LAYOUT,
    MANIFEST,
    CheckpointMismatch,
    StreamOptions,
    bind_checkpoint,
    file_source,
    read_committed,
    reassemble_stream,
    start,
)
from segmenter.producer import Segmenter
from tests.cli.test_stream import reassemble
from tests.spark.test_stream import T0, land


def _options(**reassembly: Any) -> StreamOptions:
    return StreamOptions(reassembly=ReassemblyOptions(**reassembly), expire_after=300, watermark=0)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_new_checkpoint_records_its_layout_and_options(tmp_path: Path) -> None:
    bind_checkpoint(str(tmp_path / "ck"), _options(payload_dir="bodies"))
    got = json.loads((tmp_path / "ck" / MANIFEST).read_text())
    assert got["layout"] == LAYOUT == 3 and set(got["state"]) == {"held", "key"}
    assert got["options"] == {"unit_of_work": True, "payload_dir": str(Path("bodies").resolve())}


def test_options_that_state_does_not_depend_on_may_change(tmp_path: Path) -> None:
    ck = str(tmp_path / "ck")
    bind_checkpoint(ck, _options())
    before = _files(tmp_path)
    changed = StreamOptions(
        reassembly=ReassemblyOptions(max_message_size=1 << 20), expire_after=60, watermark=5, tombstone=10
    )
    bind_checkpoint(ck, changed)  # timers already set keep their times; new keys use the new ones
    bind_checkpoint(ck)  # no options given: only the layout is checked
    assert _files(tmp_path) == before


@pytest.mark.parametrize(
    ("now", "says"),
    [
        ({"unit_of_work": False}, "unit_of_work=True (now False)"),
        ({"payload_dir": "elsewhere"}, "payload_dir=None (now "),
    ],
)
def test_a_state_bound_option_change_is_refused(tmp_path: Path, now: dict[str, Any], says: str) -> None:
    ck = str(tmp_path / "ck")
    bind_checkpoint(ck, _options())
    before = _files(tmp_path)
    with pytest.raises(CheckpointMismatch, match="other state-bound options") as refused:
        bind_checkpoint(ck, _options(**now))
    assert says in str(refused.value) and "\n" not in str(refused.value)
    assert _files(tmp_path) == before


@pytest.mark.parametrize(
    "edit",
    [
        lambda m: {**m, "layout": LAYOUT + 1},
        lambda m: {**m, "state": {**m["state"], "key": "first_ms long"}},
        lambda m: {k: v for k, v in m.items() if k != "state"},
    ],
    ids=["a later layout", "another state schema", "no state schemas"],
)
def test_a_checkpoint_of_another_layout_is_refused(tmp_path: Path, edit: Any) -> None:
    ck = tmp_path / "ck"
    bind_checkpoint(str(ck), _options())
    manifest = ck / MANIFEST
    manifest.write_text(json.dumps(edit(json.loads(manifest.read_text()))))
    before = _files(tmp_path)
    with pytest.raises(CheckpointMismatch, match="holds state of layout") as refused:
        bind_checkpoint(str(ck), _options())
    assert "start a new checkpoint" in str(refused.value) and "\n" not in str(refused.value)
    assert _files(tmp_path) == before


def test_a_checkpoint_begun_before_the_manifest_is_layout_1_and_refused(tmp_path: Path) -> None:
    (tmp_path / "ck" / "offsets").mkdir(parents=True)  # Spark's own files, written before there was a manifest
    before = _files(tmp_path)
    with pytest.raises(
        CheckpointMismatch, match=re.escape("holds state of layout 1 (no manifest: begun before it); this")
    ):
        bind_checkpoint(str(tmp_path / "ck"), _options())
    assert _files(tmp_path) == before and not (tmp_path / "ck" / MANIFEST).exists()


# Checkpoints written by earlier layouts, each with one message decided (its tombstone) and one open (two
# of its four segments held), by tests/spark/fixtures/stream_layoutN/make.py.txt. Layout 1 (the code at
# 716bccb) kept three value states ``info``, ``summary``, ``tomb`` where later layouts keep one: reading
# it would see every open key as new (its held segments never judged again) and every tombstone as
# absent. Layout 2 (the code at 3c3c64b) stored held rows as binary where layout 3 reads base64 text:
# its held segments would be misread.
FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize(
    ("layout", "variables"),
    [(1, "held, info, summary, tomb"), (2, "held, key")],
    ids=["layout 1", "layout 2"],
)
def test_a_checkpoint_written_by_an_earlier_layout_is_refused_naming_both_layouts(
    tmp_path: Path, layout: int, variables: str
) -> None:
    """Refused before Spark starts, naming both layouts; nothing in the checkpoint or the output is touched."""
    shutil.copytree(FIXTURES / f"stream_layout{layout}", tmp_path, dirs_exist_ok=True)
    assert json.loads((tmp_path / "ck" / MANIFEST).read_text())["layout"] == layout
    assert (tmp_path / "ck" / "state" / "0" / "0").is_dir()  # Spark's RocksDB state, as that layout wrote it
    before = _files(tmp_path)
    with pytest.raises(CheckpointMismatch) as refused:
        bind_checkpoint(str(tmp_path / "ck"), _options())
    said = str(refused.value)
    assert f"holds state of layout {layout} (state variables {variables})" in said
    assert f"this version reads layout {LAYOUT} (state variables held, key)" in said
    assert f"let a version of layout {layout} finish it" in said and "\n" not in said
    done = reassemble("stream", "landing", "out", "--checkpoint", "ck", "--trigger", "available-now", cwd=tmp_path)
    assert done.returncode == 1 and f"holds state of layout {layout}" in done.stderr
    assert _files(tmp_path) == before and not (tmp_path / "out").exists()


def test_the_command_refuses_before_spark_starts(tmp_path: Path) -> None:
    (tmp_path / "landing").mkdir()
    bind_checkpoint(str(tmp_path / "ck"), StreamOptions(reassembly=ReassemblyOptions(payload_dir=str(tmp_path / "b"))))
    done = reassemble("stream", "landing", "out", "--checkpoint", "ck", cwd=tmp_path)
    assert done.returncode == 1 and "other state-bound options payload_dir=" in done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.spark
def test_a_real_checkpoint_resumes_with_its_options_and_refuses_others(
    stream_spark: Any,
    tmp_path: Path,
) -> None:
    """Spark keeps our manifest beside its own files; a message straddling two runs completes in the
    second; in between, a run with Unit of Work switched off is refused and changes nothing."""
    segs = [s.encode() for s in Segmenter(300).segment(random.Random(3).randbytes(1000))]
    (tmp_path / "landing").mkdir()
    ck, out = str(tmp_path / "ck"), tmp_path / "out"

    def run(options: StreamOptions) -> None:
        df = file_source(stream_spark, str(tmp_path / "landing"))
        query = start(reassemble_stream(df, options=options), out, ck, "available-now", options=options)
        assert query.awaitTermination(600) and query.exception() is None

    land(tmp_path / "landing", "a", segs[:2], T0)
    run(_options())
    assert (tmp_path / "ck" / MANIFEST).exists() and (tmp_path / "ck" / "offsets").is_dir()
    assert read_committed(out, "message") == []
    before = _files(tmp_path)
    with pytest.raises(CheckpointMismatch, match="unit_of_work=True"):
        run(_options(unit_of_work=False))
    assert _files(tmp_path) == before
    land(tmp_path / "landing", "b", segs[2:], T0 + 1)
    run(_options())
    (msg,) = read_committed(out, "message")
    assert msg["status"] == "complete" and msg["segments_used"] == len(segs)
