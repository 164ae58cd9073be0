"""The orphan sweep: the pure plan for any listing and ledger (hypothesis), and the sweep over a real
directory store and SQLite ledger: deletes exactly the settled and the old unreferenced objects, never
one a live row names, in the safe order, and re-checks each row before it deletes."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reassembly.claimcheck import (
    Ledger,
    LedgerEntry,
    Outcome,
    SweepRefused,
    Why,
    offload_recorded,
    plan_sweep,
    sweep,
)
from refmsg import DirectoryStore, ObjectInfo, StoreError
from segmenter.errors import SegmentationError

NOW = datetime(2024, 6, 1, 12, 0, tzinfo=timezone.utc)
DAY = timedelta(days=1)

# A row's state: none, live, settled (recorded or not), or swept (deleted_at set).
STATES = ("none", "live", "settled", "settled-unrecorded", "swept")


def _entry(key: str, state: str, stored: timedelta) -> LedgerEntry | None:
    at = NOW - stored
    if state == "live":
        return LedgerEntry("s", key, "m", at, None, None)
    if state == "settled":
        return LedgerEntry("s", key, "m", at, at + timedelta(seconds=1), None)
    if state == "settled-unrecorded":
        return LedgerEntry("s", key, None, None, at, None)
    if state == "swept":
        return LedgerEntry("s", key, "m", at, at, at + timedelta(seconds=2))
    return None


ages = st.integers(-3600, 20 * 86400).map(lambda s: timedelta(seconds=s))  # negative: a clock ahead of ours
objects = st.dictionaries(
    st.text("abc/", min_size=1, max_size=4),
    st.tuples(st.sampled_from(STATES), ages, ages),  # row state, object age, row age
    max_size=25,
)
unlisted = st.dictionaries(st.text("xyz", min_size=1, max_size=3), st.tuples(st.sampled_from(STATES), ages), max_size=8)


@given(objects, unlisted, st.integers(1, 15 * 86400).map(lambda s: timedelta(seconds=s)))
def test_the_plan_never_deletes_a_live_reference_and_deletes_exactly_settled_and_old_unreferenced(
    listed: dict[str, tuple[str, timedelta, timedelta]],
    others: dict[str, tuple[str, timedelta]],
    older_than: timedelta,
) -> None:
    listing = [ObjectInfo(k, len(k), NOW - age) for k, (_, age, _) in sorted(listed.items())]
    entries = [e for k, (state, _, stored) in listed.items() if (e := _entry(k, state, stored))]
    entries += [e for k, (state, stored) in others.items() if (e := _entry(k, state, stored))]
    plan = plan_sweep(listing, entries, NOW, older_than)

    deleted = {d.key: d for d in plan.deletions}
    live = {e.key for e in entries if e.live}
    assert not live & deleted.keys()  # never a live reference, whatever its age
    settled = {k for k, (state, _, _) in listed.items() if state in ("settled", "settled-unrecorded")}
    old_unreferenced = {k for k, (state, age, _) in listed.items() if state in ("none", "swept") and age > older_than}
    assert deleted.keys() == settled | old_unreferenced
    assert all(d.why is (Why.SETTLED if k in settled else Why.UNREFERENCED) for k, d in deleted.items())
    assert all(d.age == NOW - d.modified and d.size == len(k) for k, d in deleted.items())
    assert [d.key for d in plan.deletions] == sorted(deleted) and plan.bytes == sum(len(k) for k in deleted)
    # what is kept is counted, and every listed object is accounted for once
    assert plan.listed == len(listing) == len(deleted) + plan.live + plan.young
    assert plan.live == len(live & listed.keys())
    assert {e.key for e in plan.stale} == {k for k in live & listed.keys() if listed[k][2] > older_than}
    # live rows whose object is not listed are missing (if recorded before the listing); settled ones gone
    assert {e.key for e in plan.missing} == {k for k in live - listed.keys() if others[k][1] >= timedelta(0)}
    gone = {k for k, (state, _) in others.items() if state in ("settled", "settled-unrecorded")}
    assert {e.key for e in plan.gone} == gone - listed.keys()


def test_the_plan_refuses_a_naive_time_and_a_negative_age() -> None:
    with pytest.raises(SegmentationError, match="timezone-aware"):
        plan_sweep([], [], datetime(2024, 1, 1), DAY)
    with pytest.raises(SegmentationError, match="negative"):
        plan_sweep([], [], NOW, -DAY)


def _put(store: DirectoryStore, key: str, age: timedelta, data: bytes = b"payload") -> None:
    store.put(key, data)
    when = (datetime.now(timezone.utc) - age).timestamp()
    os.utime(Path(store.root, key), (when, when))


@pytest.fixture
def place(tmp_path: Path) -> Iterator[tuple[DirectoryStore, Ledger]]:
    with Ledger.open(str(tmp_path / "ledger.db")) as ledger:
        yield DirectoryStore(tmp_path / "store", name="s"), ledger


def test_a_dry_run_touches_nothing_and_delete_deletes_exactly_the_plan(
    place: tuple[DirectoryStore, Ledger],
) -> None:
    store, ledger = place
    now = datetime.now(timezone.utc)
    for key, age in [("live-old", 30 * DAY), ("live-new", timedelta(0)), ("settled", DAY), ("orphan", 8 * DAY)]:
        _put(store, key, age)
    _put(store, "young", DAY)
    ledger.record(store, "live-old", "m1", now - 30 * DAY)
    ledger.record(store, "live-new", "m2", now)
    ledger.record(store, "settled", "m3", now - DAY)
    ledger.settle(store, "settled", now - DAY)
    ledger.record(store, "lost", "m4", now - 2 * DAY)  # live, its object gone
    ledger.record(store, "released", "m5", now - 2 * DAY)  # settled, its object released by the consumer
    ledger.settle(store, "released", now - DAY)

    seen: list[tuple[str, Outcome]] = []
    dry = sweep(store, ledger, 7 * DAY, on_object=lambda d, o, _: seen.append((d.key, o)))
    assert seen == [("orphan", Outcome.WOULD_DELETE), ("settled", Outcome.WOULD_DELETE)]
    assert dry.dry_run and dry.deleted == () and dry.marked == 0
    assert sorted(os.listdir(store.root)) == ["live-new", "live-old", "orphan", "settled", "young"]
    assert ledger.entry(store, "settled").deleted_at is None  # type: ignore[union-attr]
    assert [e.key for e in dry.plan.stale] == ["live-old"] and [e.key for e in dry.plan.missing] == ["lost"]
    assert [e.key for e in dry.plan.gone] == ["released"] and (dry.plan.live, dry.plan.young) == (2, 1)

    seen.clear()
    done = sweep(store, ledger, 7 * DAY, delete=True, on_object=lambda d, o, _: seen.append((d.key, o)))
    assert seen == [("orphan", Outcome.DELETED), ("settled", Outcome.DELETED)]
    assert [d.why for d in done.deleted] == [Why.UNREFERENCED, Why.SETTLED] and done.marked == 1
    assert sorted(os.listdir(store.root)) == ["live-new", "live-old", "young"]
    assert ledger.entry(store, "settled").deleted_at is not None  # type: ignore[union-attr]
    assert ledger.entry(store, "released").deleted_at is not None  # type: ignore[union-attr]
    assert ledger.entry(store, "live-old").live  # type: ignore[union-attr]

    again = sweep(store, ledger, 7 * DAY, delete=True)  # nothing left to do
    assert again.plan.deletions == () and again.plan.gone == () and again.marked == 0


@settings(max_examples=12)
@given(objects, st.integers(1, 15 * 86400).map(lambda s: timedelta(seconds=s)))
def test_the_sweep_on_disk_deletes_what_the_plan_says_and_keeps_every_live_object(
    listed: dict[str, tuple[str, timedelta, timedelta]], older_than: timedelta
) -> None:
    listed = {k: v for k, v in listed.items() if all(part for part in k.split("/"))}  # valid keys only
    # no key may be a directory of another ("a" and "a/b")
    keys = sorted(listed, key=len)
    listed = {k: listed[k] for k in keys if not any(k.startswith(j + "/") for j in keys if j != k)}
    with tempfile.TemporaryDirectory() as tmp:
        store = DirectoryStore(Path(tmp, "store"), name="s", fsync=False)
        with Ledger.open(str(Path(tmp, "ledger.db"))) as ledger:
            now = datetime.now(timezone.utc)
            for key, (state, age, stored) in listed.items():
                _put(store, key, age + timedelta(seconds=5) if age > older_than else age - timedelta(seconds=5))
                if state in ("live", "settled", "swept"):
                    ledger.record(store, key, "m", now - stored)
                if state in ("settled", "settled-unrecorded", "swept"):
                    ledger.settle(store, key, now - stored)
                if state == "swept":
                    ledger.mark_deleted(store, key)
            result = sweep(store, ledger, older_than, delete=True, allow_unknown_store=True)
            left = {str(p.relative_to(store.root)) for p in Path(store.root).rglob("*") if p.is_file()}
    live = {k for k, (state, _, _) in listed.items() if state == "live"}
    settled = {k for k, (state, _, _) in listed.items() if state in ("settled", "settled-unrecorded")}
    old = {k for k, (state, age, _) in listed.items() if state in ("none", "swept") and age > older_than}
    assert live <= left
    assert {d.key for d in result.deleted} == settled | old == set(listed) - left


class Racing(DirectoryStore):
    """A store a producer writes to while it is listed: the object is put before the listing and recorded
    after it, before the sweep reads the ledger."""

    def __init__(self, root: Path, ledger: Ledger) -> None:
        super().__init__(root, name="s")
        self.ledger = ledger
        self.deleted: list[str] = []

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        super().put("late", b"x")
        yield from super().list(prefix)
        self.ledger.record(self, "late", "m-late")

    def delete(self, key: str) -> None:
        self.deleted.append(key)
        super().delete(key)


def test_an_object_listed_before_its_record_is_kept_once_recorded(tmp_path: Path) -> None:
    """List first, then read the ledger: a record made in between is seen, however old the object looks."""
    with Ledger.open(str(tmp_path / "l.db")) as ledger:
        store = Racing(tmp_path / "store", ledger)
        result = sweep(store, ledger, timedelta(seconds=1), delete=True, now=datetime.now(timezone.utc) + DAY)
        assert store.deleted == [] and (tmp_path / "store" / "late").exists()
        assert (result.plan.listed, result.plan.live) == (1, 1)


def test_a_row_that_changes_between_plan_and_delete_keeps_its_object(tmp_path: Path) -> None:
    """The plan says delete (settled; unreferenced), then a producer records the key (again): kept."""
    with Ledger.open(str(tmp_path / "l.db")) as ledger:
        store = DirectoryStore(tmp_path / "store", name="s")
        _put(store, "reused", timedelta(0))
        ledger.record(store, "reused", "m1")
        ledger.settle(store, "reused")
        _put(store, "orphan", 9 * DAY)
        read_rows = ledger.entries

        def rows_then_producer(name: object) -> list[LedgerEntry]:
            rows = read_rows(name)  # type: ignore[arg-type]
            ledger.record(store, "reused", "m2")  # the key reused after the sweep read the rows
            ledger.record(store, "orphan", "m3")  # a producer that records very late
            return rows

        ledger.entries = rows_then_producer  # type: ignore[method-assign]
        seen: list[tuple[str, Outcome]] = []
        result = sweep(store, ledger, 7 * DAY, delete=True, on_object=lambda d, o, _: seen.append((d.key, o)))
        assert seen == [("orphan", Outcome.CHANGED), ("reused", Outcome.CHANGED)]
        assert len(result.changed) == 2 and result.deleted == ()
        assert sorted(os.listdir(store.root)) == ["orphan", "reused"]


def test_a_store_the_ledger_does_not_know_is_refused_unless_allowed(place: tuple[DirectoryStore, Ledger]) -> None:
    store, ledger = place
    _put(store, "old", 30 * DAY)
    ledger.record("another-store", "k")
    with pytest.raises(SweepRefused, match=r"no row for store 's'.*'another-store'"):
        sweep(store, ledger, DAY, delete=True)
    assert os.listdir(store.root) == ["old"]
    assert [d.key for d in sweep(store, ledger, DAY, delete=True, allow_unknown_store=True).deleted] == ["old"]
    assert sweep(store, ledger, DAY, delete=True).plan.listed == 0  # an empty store: nothing to refuse


def test_a_failed_delete_is_reported_and_the_sweep_goes_on(tmp_path: Path) -> None:
    class Stubborn(DirectoryStore):
        def delete(self, key: str) -> None:
            if key == "a":
                raise StoreError(f"cannot delete {key!r}: permission denied", key=key)
            super().delete(key)

    with Ledger.open(str(tmp_path / "l.db")) as ledger:
        store = Stubborn(tmp_path / "store", name="s")
        for key in ("a", "b"):
            _put(store, key, timedelta(0))
            ledger.record(store, key, key)
            ledger.settle(store, key)
        result = sweep(store, ledger, DAY, delete=True)
        failed = [(d.key, e) for d, e in result.failed]
        assert failed == [("a", "[9018 STORE_ERROR] cannot delete 'a': permission denied")]
        assert [d.key for d in result.deleted] == ["b"]
        assert ledger.entry(store, "a").settled and not ledger.entry(store, "b").settled  # type: ignore[union-attr]


def test_record_settle_sweep_end_to_end(place: tuple[DirectoryStore, Ledger]) -> None:
    store, ledger = place
    messages = [offload_recorded(bytes([i]) * 300_000, store, ledger, message_id=f"m{i}") for i in range(3)]
    ledger.settle_claim(messages[0])
    result = sweep(store, ledger, DAY, delete=True)
    assert [d.why for d in result.deleted] == [Why.SETTLED] and result.plan.live == 2
    assert len(os.listdir(store.root)) == 2
