"""The reference ledger on SQLite and on a real PostgreSQL server: record, settle, idempotence, refusals."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from reassembly.claimcheck import Ledger, LedgerEntry, Recorded, Settled, offload_recorded
from reassembly.storage.collector import SQLiteStorage
from refmsg import DirectoryStore, Message, offload, read_claim
from segmenter.errors import Reason, SegmentationError
from tests.support.pg_server import fresh_database, pg_url

__all__ = ["pg_url"]  # the module-scoped server fixture

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.servers)])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Ledger]:
    if request.param == "sqlite":
        url = str(tmp_path / "ledger.db")
    else:
        url = fresh_database(request.getfixturevalue("pg_url"), f"ledger_{abs(hash(request.node.name)) % 10**9}")
    with Ledger.open(url) as opened:
        yield opened


def test_record_then_settle_then_mark_deleted(ledger: Ledger) -> None:
    assert ledger.record("s3-main", "a/1", "msg-1", T0) is Recorded.NEW
    assert ledger.entry("s3-main", "a/1") == LedgerEntry("s3-main", "a/1", "msg-1", T0, None, None)
    assert ledger.entry("s3-main", "a/1").live  # type: ignore[union-attr]
    assert ledger.settle("s3-main", "a/1", T0 + timedelta(minutes=5)) is Settled.SETTLED
    settled = ledger.entry("s3-main", "a/1")
    assert settled is not None and settled.settled and not settled.live
    assert settled.settled_at == T0 + timedelta(minutes=5)
    assert ledger.mark_deleted("s3-main", "a/1", T0 + timedelta(hours=1))
    assert not ledger.mark_deleted("s3-main", "a/1", T0 + timedelta(hours=2))  # once
    swept = ledger.entry("s3-main", "a/1")
    assert swept is not None and swept.deleted_at == T0 + timedelta(hours=1) and not swept.settled and not swept.live


def test_record_and_settle_are_idempotent(ledger: Ledger) -> None:
    assert ledger.record("s", "k", "m", T0) is Recorded.NEW
    assert ledger.record("s", "k", "m", T0 + timedelta(seconds=9)) is Recorded.ALREADY
    assert ledger.entries("s") == [LedgerEntry("s", "k", "m", T0, None, None)]  # the first time stands
    assert ledger.settle("s", "k", T0 + timedelta(seconds=10)) is Settled.SETTLED
    assert ledger.settle("s", "k", T0 + timedelta(seconds=20)) is Settled.ALREADY
    assert ledger.entries("s") == [LedgerEntry("s", "k", "m", T0, T0 + timedelta(seconds=10), None)]


def test_settling_an_unknown_key_is_kept_and_logged(ledger: Ledger, caplog: pytest.LogCaptureFixture) -> None:
    assert ledger.settle("s", "never-recorded", T0) is Settled.UNKNOWN
    assert "no record" in caplog.text and "never-recorded" in caplog.text
    assert ledger.entries("s") == [LedgerEntry("s", "never-recorded", None, None, T0, None)]
    assert ledger.settle("s", "never-recorded", T0) is Settled.ALREADY
    # the producer's record arriving after the consumer settled fills the row in; it stays settled
    assert ledger.record("s", "never-recorded", "m", T0 - timedelta(seconds=1)) is Recorded.LATE
    assert ledger.entries("s") == [LedgerEntry("s", "never-recorded", "m", T0 - timedelta(seconds=1), T0, None)]


def test_a_key_recorded_again_is_live_again(ledger: Ledger, caplog: pytest.LogCaptureFixture) -> None:
    """A reused key holds a new payload: an old settlement or sweep must not get it deleted."""
    ledger.record("s", "k", "m1", T0)
    assert ledger.record("s", "k", "m2", T0 + timedelta(seconds=1)) is Recorded.REPLACED
    ledger.settle("s", "k", T0 + timedelta(seconds=2))
    assert ledger.record("s", "k", "m3", T0 + timedelta(seconds=3)) is Recorded.REOPENED
    entry = ledger.entry("s", "k")
    assert entry == LedgerEntry("s", "k", "m3", T0 + timedelta(seconds=3), None, None) and entry.live
    ledger.settle("s", "k", T0 + timedelta(seconds=4))
    ledger.mark_deleted("s", "k", T0 + timedelta(seconds=5))
    assert ledger.record("s", "k", "m3", T0 + timedelta(seconds=6)) is Recorded.REOPENED
    assert ledger.entry("s", "k").live  # type: ignore[union-attr]
    assert not ledger.mark_deleted("s", "k", T0)  # a live row is never marked
    assert caplog.text.count("recorded again") == 3


def test_stores_are_apart_and_counted(ledger: Ledger) -> None:
    ledger.record("a", "k", None, T0)
    ledger.record("b", "k", None, T0)
    ledger.record("b", "j", None, T0)
    ledger.settle("a", "k", T0)
    assert ledger.stores() == {"a": 1, "b": 2}
    assert [e.key for e in ledger.entries("b")] == ["j", "k"] and ledger.entry("b", "k").live  # type: ignore[union-attr]
    assert ledger.entries("c") == [] and ledger.entry("c", "k") is None


def test_message_ids_are_text_bytes_as_hex(ledger: Ledger) -> None:
    msg_id = bytes(range(24))  # an MQ MsgId
    ledger.record("s", "k", msg_id, T0)
    assert ledger.entry("s", "k").message_id == msg_id.hex()  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("call", "says"),
    [
        (lambda lg: lg.record("s", "k", "m", datetime(2024, 1, 1)), "timezone-aware"),
        (lambda lg: lg.record("", "k"), "store's name"),
        (lambda lg: lg.record("s", ""), "object key"),
        (lambda lg: lg.settle("s", 7), "object key"),
        (lambda lg: lg.record("s", "k", 12), "message id"),
    ],
)
def test_what_cannot_be_recorded_is_refused(tmp_path: Path, call: object, says: str) -> None:
    with Ledger.open(str(tmp_path / "l.db")) as ledger:
        with pytest.raises(SegmentationError, match=says) as caught:
            call(ledger)  # type: ignore[operator]
        assert caught.value.reason is Reason.ARGUMENT_ERROR
        assert ledger.stores() == {}


def test_offload_recorded_puts_then_records_and_the_consumer_settles_the_claim(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path / "store", name="payloads")
    with Ledger.open(str(tmp_path / "l.db")) as ledger:
        big = offload_recorded(b"x" * 300_000, store, ledger, message_id=b"\xab\xcd", at=T0)
        small = offload_recorded(b"tiny", store, ledger, message_id="inline")
        claim = read_claim(big.body)
        assert big.is_reference and not small.is_reference
        assert ledger.entries(store) == [LedgerEntry("payloads", claim.key, "abcd", T0, None, None)]
        assert (tmp_path / "store" / claim.key).stat().st_size == 300_000
        assert ledger.settle_claim(small) is None and ledger.settle_claim(b"tiny") is None  # nothing stored
        assert ledger.settle_claim(big.body, T0 + timedelta(seconds=1)) is Settled.SETTLED
        assert ledger.settle_claim(big) is Settled.ALREADY
        assert ledger.entry(store, claim.key).settled  # type: ignore[union-attr]


def test_offload_recorded_records_nothing_when_the_put_fails(tmp_path: Path) -> None:
    class Refusing(DirectoryStore):
        def put(self, key: str, data: bytes | bytearray | memoryview) -> None:
            raise OSError("disk full")

    with Ledger.open(str(tmp_path / "l.db")) as ledger:
        with pytest.raises(OSError, match="disk full"):
            offload_recorded(b"x" * 300_000, Refusing(tmp_path / "store"), ledger)
        assert ledger.stores() == {}


def test_a_damaged_reference_is_not_settled(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path / "store")
    body = bytearray(offload(b"x" * 300_000, store).body)
    body[-1] ^= 1
    with Ledger.open(str(tmp_path / "l.db")) as ledger:
        with pytest.raises(SegmentationError):
            ledger.settle_claim(Message("MQHREF  ", bytes(body)))
        assert ledger.stores() == {}


def test_a_collector_database_without_the_ledger_gets_its_table(tmp_path: Path) -> None:
    """The ledger may share the collector's database: it adds its table when it is opened."""
    path = tmp_path / "old.db"
    SQLiteStorage(str(path)).close()
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO destination_rules VALUES ('d', 't', 5, 100, 1.0, 60.0, 1, NULL, NULL)")
    with Ledger.open(str(path)) as ledger:
        ledger.record("s", "k", "m", T0)
        assert ledger.entries("s") == [LedgerEntry("s", "k", "m", T0, None, None)]
    storage = SQLiteStorage(str(path))
    assert "d" in storage.read_rules()  # the collector's rows untouched
    storage.close()
