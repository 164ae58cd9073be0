"""A throwaway PostgreSQL 15 server on 127.0.0.1 for tests (Debian's postgresql-15 package).

initdb and the postmaster run as the ``postgres`` user (they refuse root) in a temp dir under
/tmp (pytest's tmp_path is not traversable by that user); the Popen child is the postmaster
itself, stopped with SIGINT (fast shutdown). The package puts its binaries in
``/usr/lib/postgresql/15/bin`` and creates the ``postgres`` user; switching to that user needs
root (``.ci/run`` installs the package). The server trusts local connections (``initdb -A
trust``), listens on 127.0.0.1 at a free port and keeps its socket in the temp dir.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.lanes import refuse_server

BIN = Path("/usr/lib/postgresql/15/bin")


def available() -> str | None:
    """Why no server can be started here, or None."""
    if not (BIN / "postgres").exists():
        return "postgresql-15 is not installed (.ci/run installs it)"
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return "no postgres user"
    if os.geteuid() != 0:
        return "starting the server as the postgres user needs root"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@contextmanager
def postgres_server(*, fsync: bool = False) -> Iterator[str]:
    """Start a server, yield its URL, stop it and remove its directory.

    Tests run with ``fsync=off`` (speed; the crash tests kill collectors, not the server); the
    benchmark passes ``fsync=True`` so a commit is on disk when it returns.
    """
    refuse_server("PostgreSQL")
    why = available()
    if why:
        pytest.skip(why)
    base = Path(tempfile.mkdtemp(prefix="pg-test-"))
    shutil.chown(base, "postgres", "postgres")
    as_pg: dict[str, object] = {"user": "postgres", "group": "postgres", "extra_groups": []}
    subprocess.run(
        [
            BIN / "initdb",
            "-D",
            base / "data",
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C.UTF-8",
            "--no-sync",
        ],
        check=True,
        capture_output=True,
        **as_pg,  # type: ignore[call-overload]
    )
    port = _free_port()
    log = open(base / "server.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            BIN / "postgres",
            "-D",
            base / "data",
            "-p",
            str(port),
            "-k",
            base,
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            f"fsync={'on' if fsync else 'off'}",
            "-c",
            "max_connections=50",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=_die_with_parent,
        **as_pg,  # type: ignore[call-overload]
    )
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    try:
        import psycopg

        deadline = time.monotonic() + 30
        while True:
            try:
                psycopg.connect(url, connect_timeout=2).close()
                break
            except psycopg.OperationalError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((base / "server.log").read_text(errors="replace")) from None
                time.sleep(0.05)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    """One server per test module."""
    with postgres_server() as url:
        yield url


def fresh_database(url: str, name: str) -> str:
    """A new empty database on the server (one per test keeps tests independent)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    return url.rsplit("/", 1)[0] + "/" + name


def load_sqlite(url: str, path: Path, *, skip: tuple[str, ...] = ("collect_ids",)) -> None:
    """Every table and index of the SQLite database ``path`` (its own statements, with PostgreSQL's
    byte type) and their rows, into the database at ``url``: an old database as its code wrote it.
    ``destination_rules.enabled`` (SQLite's 0 / 1) goes in as a boolean."""
    import sqlite3

    import psycopg

    old = sqlite3.connect(path)
    try:
        found = old.execute("SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL").fetchall()
        tables = [t for t in found if t[0] not in skip]
        with psycopg.connect(url, autocommit=True) as conn:
            for name, sql in tables:
                conn.execute(sql.replace("BLOB", "BYTEA"))
                if sql.startswith("CREATE TABLE"):
                    rows = old.execute(f"SELECT * FROM {name}").fetchall()
                    marks = ", ".join(["%s"] * len(rows[0])) if rows else ""
                    for row in rows:
                        conn.execute(
                            f"INSERT INTO {name} VALUES ({marks})",
                            [bool(v) if name == "destination_rules" and i == 6 else v for i, v in enumerate(row)],
                        )
    finally:
        old.close()
