"""A store whose disk fills up says so: the write that failed for want of
space is what the caller hears.  SQLite rolls such a transaction back
itself, and the ROLLBACK after it failed with "cannot rollback - no
transaction is active", which took the full disk's place in every log
line (a probe filled the store's disk: the bridge logged only that)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from bridge.service.storage.store import Store


def test_a_transaction_that_finds_the_disk_full_is_reported_as_a_full_disk(tmp_path: Path) -> None:
    store = Store(tmp_path / "bridge.sqlite")
    with store.transaction():
        store.set_meta("before", "kept")
    # The database may not grow: as a disk with no room left, SQLITE_FULL.
    pages = store.db.execute("PRAGMA page_count").fetchone()[0]
    store.db.execute(f"PRAGMA max_page_count = {pages + 2}")
    with pytest.raises(sqlite3.OperationalError, match="database or disk is full"):
        with store.transaction():
            for n in range(200):
                store.set_meta(f"key{n}", "v" * 2000)
    assert not store.db.in_transaction
    store.db.execute(f"PRAGMA max_page_count = {pages + 10_000}")  # room again: the store goes on
    with store.transaction():
        store.set_meta("after", "kept")
    assert store.get_meta("before") == store.get_meta("after") == "kept" and store.get_meta("key0") is None
    store.close()
