"""One home for a job's output (:mod:`reassembly._files`): everything a job writes is claimed at once,
before anything starts, and its summary and commit records are written whole or not at all.

These call the functions directly (no Spark): the commands' refusals through a real process are in
test_cli.py, test_incremental.py, test_stream.py and test_orchestration.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reassembly._errors import JobError, UsageError
from reassembly._files import claim_output, discard, inputs, write_json


@pytest.fixture
def landing(tmp_path: Path) -> Path:
    folder = tmp_path / "landing"
    folder.mkdir()
    for i in range(2):
        (folder / f"part-{i}.parquet").write_bytes(b"PAR1")
    return folder


def test_a_claim_names_every_place_and_touches_nothing(landing: Path, tmp_path: Path) -> None:
    before = sorted(p.name for p in tmp_path.iterdir())
    claimed = claim_output(
        str(tmp_path / "out"),
        [str(landing)],
        apart=[("checkpoint", str(tmp_path / "ck"))],
        beside=[("payload dir", str(tmp_path / "out" / "payloads"))],  # inside OUTPUT: allowed
        summary=str(tmp_path / "s.json"),
    )
    assert claimed.out == tmp_path / "out" and claimed.paths == (str(landing),)
    assert claimed.place("checkpoint") == tmp_path / "ck" and claimed.summary == tmp_path / "s.json"
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize(
    ("name", "where", "said"),
    [
        ("output", "landing/out", "output {} is inside the input"),
        ("output", ".", "output {} contains the input"),
        ("checkpoint", "landing/ck", "checkpoint {} is inside the input"),
        ("payload dir", "landing", "payload dir {} is the input"),
    ],
)
def test_no_place_the_job_writes_overlaps_the_input(
    landing: Path, tmp_path: Path, name: str, where: str, said: str
) -> None:
    path = str(tmp_path / where)
    places = {"output": str(tmp_path / "out"), name: path}
    with pytest.raises(UsageError, match=said.format(path).replace(".", r"\.")):
        claim_output(
            places["output"],
            [str(landing)],
            may_exist=True,
            apart=[("checkpoint", places.get("checkpoint", str(tmp_path / "ck")))],
            beside=[("payload dir", places["payload dir"])] if "payload dir" in places else (),
        )


def test_a_link_under_the_input_or_the_glob_reaches_the_place(landing: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (landing / "linked").symlink_to(elsewhere)
    with pytest.raises(UsageError, match=r"checkpoint .* is inside .*elsewhere \(linked from"):
        claim_output(str(tmp_path / "out"), [str(landing)], apart=[("checkpoint", str(elsewhere / "ck"))])
    pattern = str(tmp_path / "land*")
    with pytest.raises(UsageError, match=r"checkpoint .* matches the input pattern"):
        claim_output(
            str(tmp_path / "out"), inputs(pattern), pattern=pattern, apart=[("checkpoint", str(tmp_path / "landed"))]
        )


def test_the_places_kept_apart_stay_apart(landing: Path, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"output .* and checkpoint .* overlap: keep them apart"):
        claim_output(str(tmp_path / "out"), [str(landing)], apart=[("checkpoint", str(tmp_path / "out" / "ck"))])
    with pytest.raises(UsageError, match=r"payload dir .* and checkpoint .* overlap: keep them apart"):
        claim_output(
            str(tmp_path / "out"),
            [str(landing)],
            apart=[("checkpoint", str(tmp_path / "ck"))],
            beside=[("payload dir", str(tmp_path / "ck" / "bodies"))],
        )


def test_the_summary_lands_in_no_place_the_job_reads_or_owns(landing: Path, tmp_path: Path) -> None:
    out, ck = str(tmp_path / "out"), str(tmp_path / "ck")
    for inside, name in ((landing, "input"), (tmp_path / "out", "output"), (tmp_path / "ck", "checkpoint")):
        with pytest.raises(UsageError, match=rf"--summary-json .* is inside the {name} "):
            claim_output(out, [str(landing)], apart=[("checkpoint", ck)], summary=str(inside / "s.json"))
    pattern = str(tmp_path / "land*")  # the next run's glob would read it
    with pytest.raises(UsageError, match=r"--summary-json .*landed\.json matches the input pattern"):
        claim_output(out, inputs(pattern), pattern=pattern, summary=str(tmp_path / "landed.json"))


def test_an_existing_output_is_refused_unless_it_may_exist(landing: Path, tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    with pytest.raises(JobError, match="output exists"):
        claim_output(str(tmp_path / "out"), [str(landing)])
    assert claim_output(str(tmp_path / "out"), [str(landing)], may_exist=True).out == tmp_path / "out"
    with pytest.raises(JobError, match="output parent directory does not exist"):
        claim_output(str(tmp_path / "no" / "out"), [str(landing)])


def test_write_json_replaces_the_file_whole_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "summary.json"
    target.write_text("old")
    write_json(target, {"exit_code": 0})
    assert json.loads(target.read_text()) == {"exit_code": 0}
    with pytest.raises(TypeError):
        write_json(target, {"not json": object()})
    assert json.loads(target.read_text()) == {"exit_code": 0}  # the failed write left the last one
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_discard_removes_every_path_once_the_writers_settled(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f").write_bytes(b"x")
    (tmp_path / "b").write_bytes(b"y")
    settled: list[bool] = []
    discard((tmp_path / "a", tmp_path / "b", tmp_path / "never"), lambda: settled.append(True) or True)
    assert settled == [True] and list(tmp_path.iterdir()) == []
