"""Writes whose results nobody reads go out with the next statement that
waits (``PgConnection.defer``; on SQLite at once), and their errors stay
where they were made: a failed late write undoes its own savepoint's part
and no other, a part rolled back never sends its writes, and a COMMIT whose
writes fail leaves no transaction open.  On both backends alike."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from bridge.service.storage.store import Store

pytestmark = pytest.mark.usefixtures("store_backend")  # on SQLite and on PostgreSQL

INSERT = "INSERT INTO meta(key, value) VALUES (?, ?)"


def meta(store: Store) -> dict[str, str]:
    return dict(store.db.execute("SELECT key, value FROM meta WHERE key LIKE 't%'").fetchall())


def test_a_late_write_that_fails_undoes_its_own_part_only(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    with store.transaction():
        with store.savepoint():
            store.db.defer(INSERT, ("t1", "kept"))
        with pytest.raises(sqlite3.IntegrityError):
            with store.savepoint():
                store.db.defer(INSERT, ("t2", "undone with its part"))
                store.db.defer(INSERT, ("t1", "a clash"))
        with store.savepoint():
            store.db.defer(INSERT, ("t3", "after"))
    assert meta(store) == {"t1": "kept", "t3": "after"}


def test_a_part_rolled_back_keeps_none_of_its_writes_and_the_rest_goes_on(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    with store.transaction():
        store.db.defer(INSERT, ("t0", "before"))
        with pytest.raises(RuntimeError):
            with store.savepoint():
                store.db.defer(INSERT, ("t1", "gone"))
                with store.savepoint():
                    store.db.defer(INSERT, ("t2", "gone with the outer part"))
                raise RuntimeError("the event's handling failed")
        store.db.defer(INSERT, ("t3", "after"))
    assert meta(store) == {"t0": "before", "t3": "after"}


def test_a_commit_whose_writes_fail_ends_its_transaction(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    with store.transaction():
        store.set_meta("t1", "first")
    with pytest.raises(sqlite3.IntegrityError):
        with store.transaction():
            store.db.defer(INSERT, ("t2", "undone"))
            store.db.defer(INSERT, ("t1", "a clash"))
    with store.transaction():  # no transaction left open: this one begins and commits
        store.set_meta("t3", "next")
    assert meta(store) == {"t1": "first", "t3": "next"}


def test_a_late_write_of_a_value_no_store_can_encode_undoes_its_own_part(tmp_path: Path) -> None:
    """The driver refuses the value before the server sees it (a lone surrogate):
    still an error of that part, undone like one the server returns."""
    store = Store(tmp_path / "s.sqlite")
    with store.transaction():
        with pytest.raises((sqlite3.Error, UnicodeError)):
            with store.savepoint():
                store.set_meta("t1", "partial")
                store.set_meta("t2", "a\ud800b")
        with store.savepoint():
            store.set_meta("t3", "after")
    assert meta(store) == {"t3": "after"}


def test_reads_sent_with_the_commit_see_the_transaction_and_end_it(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    with store.transaction():
        store.set_meta("t1", "written")
        rows, = store.db.reads([("SELECT value FROM meta WHERE key=?", ("t1",))], commit=True)
        assert rows == [("written",)]
        assert not store.db.in_transaction
    # Committed: another connection to the same store sees it.
    assert Store.read_only(tmp_path / "s.sqlite").get_meta("t1") == "written"
    with store.transaction():  # and no transaction was left open
        store.set_meta("t2", "next")
    assert meta(store) == {"t1": "written", "t2": "next"}


def test_a_read_that_fails_before_the_commit_commits_nothing(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    with pytest.raises(sqlite3.Error):
        with store.transaction():
            store.set_meta("t1", "undone")
            store.db.reads([("SELECT value FROM meta WHERE key=?", ("t1",)), ("SELECT nothing FROM meta", ())],
                           commit=True)
    assert meta(store) == {}
    with store.transaction():
        store.set_meta("t2", "next")
    assert meta(store) == {"t2": "next"}
