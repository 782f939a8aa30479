"""A SQLite store copied into an empty PostgreSQL database, and the copy
verified: the same rows in every table, and the same answer log (a checksum
over every entry, in order).  The schema is made by the store's own
migrations, so both sides are at the same version before a row moves."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from bridge.service.storage.store import Store


class CopyRefused(Exception):
    """One sentence: why nothing was copied."""


@dataclass
class CopyReport:
    counts: dict[str, int] = field(default_factory=dict)  # table -> rows, equal on both sides
    log_checksum: str = ""
    nuls: dict[str, int] = field(default_factory=dict)  # table -> texts whose NULs were written as U+FFFD


def copy_store(source: Path, url: str, password: str | None) -> CopyReport:
    if not source.is_file():
        raise CopyRefused(f"{source}: there is no SQLite store to copy")
    Store(source).close()  # brings an older store to the current schema (or refuses a newer one)
    with sqlite3.connect(f"{source.resolve().as_uri()}?mode=ro", uri=True) as db:
        tables = _copied_tables(db)
        held = _rows_in(url, password, tables)
        if held:
            raise CopyRefused(f"the target database already has tables with rows ({', '.join(held[:5])});"
                              " migrate copies into an empty database only")
        target = Store("unused", url=url, password=password)
        try:
            # The copy is one transaction of any length, and its check reads
            # every row: the limits the store puts on every statement (5 s on
            # the server, 7 s here) and on an idle transaction do not apply.
            # (The check under them cut a large log's read short: "failed",
            # after the copy had committed, and a second try was refused.)
            with target.db.unlimited():
                nuls = _copy_rows(db, target, tables)
                report = _verified(db, target, tables)
            report.nuls = nuls
            return report
        finally:
            target.close()


def _verified(db: sqlite3.Connection, target: Store, tables: dict[str, list[str]]) -> CopyReport:
    """The same rows in every table on both sides, and the same answer log."""
    report = CopyReport()
    for table in tables:
        here = db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
        there = target.db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
        if here != there:
            raise CopyRefused(f"verification failed: {table} has {here} rows here and {there} there")
        report.counts[table] = here
    cols = ", ".join(tables["answer_log"])
    mine = log_checksum(storable(row)[0] for row in db.execute(f"SELECT {cols} FROM answer_log ORDER BY seq"))
    theirs = log_checksum(target.db.execute(f"SELECT {cols} FROM answer_log ORDER BY seq").fetchall())
    if mine != theirs:
        raise CopyRefused("verification failed: the answer log differs after the copy")
    report.log_checksum = mine
    return report


def log_checksum(rows: Iterable[tuple[Any, ...]]) -> str:
    digest = hashlib.sha256()
    for row in rows:
        digest.update(json.dumps(list(row), ensure_ascii=False).encode() + b"\n")
    return digest.hexdigest()


def _copied_tables(db: sqlite3.Connection) -> dict[str, list[str]]:
    names = [row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'"
                                          " AND name NOT LIKE 'sqlite_%' ORDER BY name")]
    return {name: [col[1] for col in db.execute(f"PRAGMA table_info({name})")] for name in names}


def storable(row: tuple[Any, ...]) -> tuple[tuple[Any, ...], bool]:
    """``row`` as PostgreSQL's text can hold it, and whether it had to
    change: a NUL (which SQLite kept, in a message echoing a person's option
    id before those were cleaned, say) as U+FFFD, as the bridge writes it
    now.  (JSON columns never hold one: their NULs are escaped.)"""
    if not any(isinstance(value, str) and "\x00" in value for value in row):
        return row, False
    return tuple(value.replace("\x00", "\ufffd") if isinstance(value, str) else value for value in row), True


def _copy_rows(db: sqlite3.Connection, target: Store, tables: dict[str, list[str]]) -> dict[str, int]:
    """Every row copied; by table, how many held a NUL (``storable``)."""
    nuls: dict[str, int] = {}
    conn = target.db.conn  # psycopg's own COPY: one stream per table, in one transaction
    with conn.transaction():
        with_rowid = {table for (table,) in conn.execute(
            "SELECT table_name FROM information_schema.columns WHERE table_schema = current_schema()"
            " AND column_name = 'rowid'").fetchall()}
        for table, columns in tables.items():
            # SQLite's rowid, where the table has no key of its own, is the order of insertion the store reads.
            columns = [*columns, "rowid"] if table in with_rowid else columns
            with conn.cursor().copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
                for row in db.execute(f"SELECT {', '.join(columns)} FROM {table}"):
                    row, changed = storable(row)
                    if changed:
                        nuls[table] = nuls.get(table, 0) + 1
                    copy.write_row(row)
        # Identity columns continue after the copied rows, not from 1.
        for table, column in conn.execute(
                "SELECT table_name, column_name FROM information_schema.columns"
                " WHERE table_schema = current_schema() AND is_identity = 'YES'").fetchall():
            conn.execute(f"SELECT setval(pg_get_serial_sequence('{table}', '{column}'),"
                         f" COALESCE((SELECT MAX({column}) FROM {table}), 0) + 1, false)")
    return nuls



def _rows_in(url: str, password: str | None, tables: dict[str, list[str]]) -> list[str]:
    """The target's tables that hold rows: none of the store's (a copy that
    failed left its empty schema, and a second run copies into it), and no
    table of anything else.  CopyRefused when a bridge runs on it."""
    from bridge.service.storage.leader import SEEN_SECONDS
    from bridge.service.storage.pgdialect import PgConnection

    db = PgConnection(url, password=password, read_only=True)
    try:
        names = [row[0] for row in db.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
            " ORDER BY table_name").fetchall()]
        if "askwright_schema" not in names:
            return names  # not a store at all: whatever it is, it is not ours to write into
        # An instance started on the target already (its tables are empty
        # while its sets folder is): the copy would change a store under it.
        heard = db.instances_heard(SEEN_SECONDS)
        if heard:
            raise CopyRefused(f"a bridge runs on the target database ({heard[0][0]} was heard from "
                              f"{heard[0][1]:.0f} s ago); stop every instance on it before migrating into it")
        return [name for name in names if name in tables
                and db.execute(f"SELECT EXISTS (SELECT 1 FROM {name})").fetchone()[0]]
    finally:
        db.close()
