"""``reassemble store list|expire|vacuum`` as a real process over a SQLite segment store (and a list
over PostgreSQL): the figures, the exact missing ranges, a dry run that changes nothing, expiry into
the quarantine, vacuum of old tombstones, and the refusals."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from reassembly.segstore import open_store
from segmenter import Reason, segment
from tests.support.command import reassemble
from tests.support.pg_server import fresh_database, postgres_server

HOUR = 3600.0


def _fill(url: str) -> bytes:
    """A store holding one message missing two ranges (first segment an hour old) and one settled
    message (settled an hour ago); the incomplete message's GroupId returned."""
    gid = os.urandom(24)
    segs = [s.encode() for s in segment(os.urandom(5000), 1084, group_id=gid)]  # 1000 data bytes each
    with open_store(url, member="filler", clock=lambda: time.time() - HOUR) as store:
        store.write([segs[0], segs[2], segs[4]])
        _, claims = store.write([s.encode() for s in segment(os.urandom(3000), 1084)])
        store.deliver(claims[0], lambda m: None)
    return gid


@pytest.fixture
def sqlite_store(tmp_path: Path) -> str:
    return str(tmp_path / "segments.db")


def test_list_expire_vacuum(sqlite_store: str) -> None:
    gid = _fill(sqlite_store)
    listed = reassemble("store", "list", "--store", sqlite_store, timeout=120)
    assert listed.returncode == 0, listed.stderr
    figures, line = listed.stdout.splitlines()
    assert "units=1" in figures and "segments=3" in figures and "delivered=1" in figures
    assert line.startswith(gid.hex()) and line.endswith("message 1 missing [1000, 2000), [3000, 4000)")

    as_json = json.loads(reassemble("store", "list", "--store", sqlite_store, "--json", timeout=120).stdout)
    assert as_json["stats"]["oldest_incomplete_age_seconds"] >= HOUR - 60
    assert as_json["incomplete"][0]["missing"] == [{"msg_seq_number": 1, "ranges": [[1000, 2000], [3000, 4000]]}]

    young = reassemble("store", "expire", "--store", sqlite_store, "--older-than", "2h", timeout=120)
    assert young.returncode == 0 and young.stdout.splitlines() == ["expired 0 incomplete unit(s)"]
    dry = reassemble("store", "expire", "--store", sqlite_store, "--older-than", "30m", "--dry-run", timeout=120)
    assert dry.returncode == 0 and dry.stdout.splitlines()[-1] == "would expire 1 incomplete unit(s)"
    assert "units=1" in reassemble("store", "list", "--store", sqlite_store, timeout=120).stdout  # unchanged
    done = reassemble("store", "expire", "--store", sqlite_store, "--older-than", "30m", timeout=120)
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "expired 1 incomplete unit(s)"
    with open_store(sqlite_store, member="checker") as store:
        assert store.stats().units == 0
        quarantined = store.quarantined()
        assert [q[3] for q in quarantined] == [Reason.INCOMPLETE_MSG] * 3
        assert "message 1 missing [1000, 2000), [3000, 4000)" in quarantined[0][4]

    dry = reassemble("store", "vacuum", "--store", sqlite_store, "--retention", "30m", "--dry-run", timeout=120)
    assert dry.stdout.strip() == "would drop 1 tombstone and 0 quarantined segments"
    vac = reassemble("store", "vacuum", "--store", sqlite_store, "--retention", "30m", "--quarantine", timeout=120)
    assert vac.returncode == 0 and vac.stdout.strip() == "dropped 1 tombstone and 0 quarantined segments"


def test_a_missing_sqlite_file_is_refused_and_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "nope.db"
    done = reassemble("store", "list", "--store", str(missing), timeout=120)
    assert done.returncode == 2 and "no such SQLite file" in done.stderr
    assert not missing.exists()
    bad = reassemble("store", "expire", "--store", str(missing), "--older-than", "soon", timeout=120)
    assert bad.returncode == 2 and "not a duration" in bad.stderr


@pytest.fixture(scope="module")
def pg() -> Iterator[str]:
    with postgres_server() as url:
        yield url


@pytest.mark.servers
def test_list_on_postgres(pg: str) -> None:
    url = fresh_database(pg, "store_cli")
    gid = _fill(url)
    listed = reassemble("store", "list", "--store", url, "--json", timeout=120)
    assert listed.returncode == 0, listed.stderr
    [unit] = json.loads(listed.stdout)["incomplete"]
    assert unit["group_id"] == gid.hex() and unit["missing"][0]["ranges"] == [[1000, 2000], [3000, 4000]]
