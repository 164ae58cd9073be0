"""``reassemble claimcheck sweep`` as a real process: a dry run, then ``--delete``, over a directory store
and over S3 (moto's emulator on 127.0.0.1) with a SQLite or PostgreSQL ledger; every refusal exits 2
with one line and leaves the store and the ledger as they were."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from reassembly.claimcheck import Ledger
from refmsg import DirectoryStore, open_store
from tests.support.command import reassemble
from tests.support.pg_server import fresh_database, pg_url
from tests.support.s3_server import S3Bucket, s3_endpoint, s3_store_url

__all__ = ["pg_url", "s3_endpoint", "s3_store_url"]  # fixtures

DAY = timedelta(days=1)


def _put(store: DirectoryStore, key: str, age: timedelta, data: bytes = b"payload") -> None:
    store.put(key, data)
    when = (datetime.now(timezone.utc) - age).timestamp()
    os.utime(Path(store.root, key), (when, when))


def _populate(tmp_path: Path, ledger_url: str) -> tuple[Path, str]:
    """A store with one object of each kind, and its ledger: (store directory, ledger)."""
    root = tmp_path / "store"
    store = DirectoryStore(root, name="payloads")
    now = datetime.now(timezone.utc)
    with Ledger.open(ledger_url) as ledger:
        _put(store, "live/old", 30 * DAY)  # recorded long ago, never settled: kept, reported stale
        ledger.record(store, "live/old", "m-old", now - 30 * DAY)
        _put(store, "live/new", timedelta(0))
        ledger.record(store, "live/new", "m-new", now)
        _put(store, "done", 2 * DAY, b"x" * 300)  # settled: deleted
        ledger.record(store, "done", "m-done", now - 2 * DAY)
        ledger.settle(store, "done", now - DAY)
        _put(store, "orphan", 10 * DAY, b"o" * 12)  # no row, old: deleted
        _put(store, "fresh-orphan", timedelta(hours=1))  # no row, young: kept
        ledger.record(store, "lost", "m-lost", now - 3 * DAY)  # live row, no object: reported missing
    return root, ledger_url


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _dry_run_then_delete(root: Path, ledger_url: str) -> None:
    args = ("claimcheck", "sweep", str(root), "--ledger", ledger_url, "--older-than", "7d", "--store-name", "payloads")
    dry = reassemble(*args, timeout=120)
    assert dry.returncode == 0 and dry.stderr == "", dry.stderr
    assert dry.stdout.splitlines() == [
        "would delete: done (300 bytes, 2d old): settled",
        "would delete: orphan (12 bytes, 10d old): unreferenced",
        "missing: lost (live reference recorded 3d ago, message m-lost): not in the store",
        "sweep 'payloads': 5 objects listed; would delete 2 (312 bytes; 1 settled, 1 unreferenced); kept 2 live, "
        "1 unreferenced not older than 7d; 1 stale live references (unsettled for over 7d; oldest live/old, "
        "recorded 30d ago); 1 live references missing from the store; dry run: nothing deleted (--delete deletes)",
    ]
    assert _files(root) == ["done", "fresh-orphan", "live/new", "live/old", "orphan"]

    done = reassemble(*args, "--delete", timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert [line.split(" (")[0] for line in done.stdout.splitlines()[:2]] == ["deleted: done", "deleted: orphan"]
    assert "; deleted 2 (312 bytes; 1 settled, 1 unreferenced); kept 2 live" in done.stdout.splitlines()[-1]
    assert _files(root) == ["fresh-orphan", "live/new", "live/old"]
    with Ledger.open(ledger_url) as ledger:
        assert ledger.entry("payloads", "done").deleted_at is not None  # type: ignore[union-attr]
        assert all(ledger.entry("payloads", k).live for k in ("live/old", "live/new", "lost"))  # type: ignore[union-attr]


def test_a_dry_run_lists_and_delete_deletes_settled_and_old_unreferenced(tmp_path: Path) -> None:
    root, ledger_url = _populate(tmp_path, str(tmp_path / "ledger.db"))
    _dry_run_then_delete(root, ledger_url)


def test_the_ledger_on_postgresql(tmp_path: Path, pg_url: str) -> None:
    root, ledger_url = _populate(tmp_path, fresh_database(pg_url, "sweep_cli"))
    _dry_run_then_delete(root, ledger_url)


def test_a_store_on_s3_through_the_emulator(tmp_path: Path, s3_store_url: S3Bucket) -> None:
    bucket = s3_store_url
    store = open_store(bucket.url, name="s3-test", **bucket.options)
    ledger_url = str(tmp_path / "ledger.db")
    with Ledger.open(ledger_url) as ledger:
        for key in ("settled", "live", "unreferenced"):
            store.put(key, key.encode())
        ledger.record(store, "settled", "m1")
        ledger.settle(store, "settled")
        ledger.record(store, "live", "m2")
    args = [
        "claimcheck", "sweep", bucket.url, "--ledger", ledger_url, "--store-name", "s3-test", "--older-than", "1ms",
        "--store-option", f"endpoint_url={bucket.endpoint}", "--store-option", "key=testing",
        "--store-option", "secret=testing", "--store-option", 'client_kwargs={"region_name": "us-east-1"}',
    ]  # fmt: skip
    # A process: the emulator serves from this one, and its request log would join the command's stderr.
    dry = reassemble(*args, env=bucket.env, timeout=120, process=True)
    assert dry.returncode == 0 and dry.stderr == "", dry.stderr
    assert [line.split(" (")[0] for line in dry.stdout.splitlines()[:2]] == [
        "would delete: settled",
        "would delete: unreferenced",
    ]
    assert sorted(o.key for o in store.list()) == ["live", "settled", "unreferenced"]
    done = reassemble(*args, "--delete", env=bucket.env, timeout=120, process=True)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert "deleted 2 (19 bytes; 1 settled, 1 unreferenced); kept 1 live" in done.stdout
    keys = [o["Key"] for o in bucket.client().list_objects_v2(Bucket=bucket.bucket).get("Contents", [])]
    assert keys == ["payloads/live"]


def _refusal_cases(tmp_path: Path, root: Path, ledger: str) -> dict[str, tuple[list[str], str]]:
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database" * 100)
    inside = root / "ledger.db"
    return {
        "not a duration": (["--older-than", "7x"], "argument --older-than: unknown unit in '7x'"),
        "zero age": (["--older-than", "0"], "--older-than must be longer than 0"),
        "no ledger": (["--ledger", str(tmp_path / "nope.db")], "--ledger: no such database"),
        "not a database": (["--ledger", str(garbage)], "cannot open --ledger"),
        "unreachable server": (["--ledger", "postgresql://nobody:secret@127.0.0.1:1/x"], "cannot open --ledger"),
        "no directory": (["--store", str(tmp_path / "nowhere")], "STORE is not a directory"),
        "no such protocol": (["--store", "nosuchprotocol://bucket/x"], "cannot open STORE"),
        "bad option": (["--store-option", "novalue"], "argument --store-option: expected KEY=VALUE"),
        "ledger in the store": (["--ledger", str(inside)], "is inside STORE"),
    }


def test_every_refusal_exits_2_with_one_line_and_touches_nothing(tmp_path: Path) -> None:
    root, ledger = _populate(tmp_path, str(tmp_path / "ledger.db"))
    cases = _refusal_cases(tmp_path, root, ledger)
    shutil.copy(ledger, root / "ledger.db")
    before = _files(root)
    with Ledger.open(ledger) as opened:
        rows = opened.entries("payloads")
    running = {}
    for name, (change, _) in cases.items():
        options = {"--store": str(root), "--ledger": ledger, "--older-than": "1s", "--store-name": "payloads"}
        extra: list[str] = []
        for flag, value in zip(change[::2], change[1::2], strict=True):
            if flag in options:
                options[flag] = value
            else:
                extra += [flag, value]
        store = options.pop("--store")
        argv = ["claimcheck", "sweep", store, "--delete", *(x for kv in options.items() for x in kv), *extra]
        # all at once: each refusal is its own process, and none may touch what the others look at
        running[name] = subprocess.Popen(
            [sys.executable, "-m", "reassembly", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    for name, proc in running.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 2, (name, out, err)
        assert out == "" and err.count("\n") == 1 and cases[name][1] in err, (name, err)
        assert "secret" not in err  # the server's password is not repeated
    assert _files(root) == before
    assert not (tmp_path / "nowhere").exists() and not (tmp_path / "nope.db").exists()
    with Ledger.open(ledger) as opened:
        assert opened.entries("payloads") == rows


@pytest.mark.parametrize("allowed", [False, True])
def test_an_unknown_store_is_swept_only_when_allowed(tmp_path: Path, allowed: bool) -> None:
    root = tmp_path / "legacy"
    store = DirectoryStore(root)
    _put(store, "from-before-the-ledger", 40 * DAY)
    ledger = tmp_path / "ledger.db"
    Ledger.open(str(ledger)).close()
    argv = ["claimcheck", "sweep", str(root), "--ledger", str(ledger), "--older-than", "30d", "--delete"]
    done = reassemble(*argv, *(["--allow-unknown-store"] if allowed else []), timeout=120)
    if allowed:
        assert done.returncode == 0 and _files(root) == [], done.stderr
        assert done.stdout.startswith("deleted: from-before-the-ledger (7 bytes, 40d old): unreferenced\n")
    else:
        assert done.returncode == 2 and _files(root) == ["from-before-the-ledger"]
        assert done.stderr == (
            "reassemble: error: the ledger has no row for store 'dir' (it knows: none) and the store holds 1 objects:"
            " all older than 30d would be deleted; check STORE, --store-name and --ledger, or pass"
            " --allow-unknown-store\n"
        )
