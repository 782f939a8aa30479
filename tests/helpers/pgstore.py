"""The store test suite on both backends.

A test module that makes stores with ``Store(path)`` runs once on SQLite and
once on PostgreSQL: on PostgreSQL every path it opens stands for a schema of
its own in the session's one server, so reopening the same path reopens the
same store, and tests never see each other's rows.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg

from bridge.devpostgres import Postgres
from bridge.service.storage.pgdialect import PgConnection
from bridge.service.storage.store import Store

BACKENDS = ("sqlite", "postgresql")


def fresh_schema(server: Postgres) -> str:
    """A URL whose tables land in a new empty schema."""
    name = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(server.url(with_password=True), autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    return server.url() + "?options=" + quote(f"-csearch_path={name}", safe="")


# A database whose text sorts by a language's rules, as one made on a host
# whose locale is en_US.UTF-8 does (the test server's own is C: byte order).
LINGUISTIC = "linguistic"


def linguistic_schema(server: Postgres) -> str:
    """A URL whose tables land in a new empty schema of a database that sorts text as English does."""
    with psycopg.connect(server.url(with_password=True), autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (LINGUISTIC,)).fetchone() is None:
            conn.execute(f"CREATE DATABASE {LINGUISTIC} TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US'"
                         " LOCALE 'C'")
    name = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(server.url(LINGUISTIC, with_password=True), autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    return server.url(LINGUISTIC) + "?options=" + quote(f"-csearch_path={name}", safe="")


def on_postgresql(monkeypatch: Any, server: Postgres) -> dict[str, str]:
    """Make ``Store(path)`` and ``Store.read_only(path)`` open PostgreSQL; returns path -> URL."""
    urls: dict[str, str] = {}
    make, read_only = Store.__init__, Store.read_only.__func__

    def key(path: Any) -> str:
        return str(Path(path).resolve())

    def url_for(path: Any) -> str:
        if key(path) not in urls:
            urls[key(path)] = fresh_schema(server)
        return urls[key(path)]

    def init(self: Store, path: Any, *, url: str | None = None, password: str | None = None) -> None:
        make(self, path, url=url or url_for(path), password=password or server.password)

    def opened(cls: type, path: Any, *, url: str | None = None, password: str | None = None) -> Store:
        if url is None and key(path) not in urls:
            raise FileNotFoundError(str(path))  # like a SQLite store never created
        return read_only(cls, path, url=url or urls[key(path)], password=password or server.password)

    monkeypatch.setattr(Store, "__init__", init)
    monkeypatch.setattr(Store, "read_only", classmethod(opened))
    monkeypatch.setenv("PGPASSWORD", server.password)
    return urls


def round_trips(monkeypatch: Any) -> list[int]:
    """A counter of each time a PostgreSQL store waits for its server (a
    pipeline, or one statement), from now on."""
    waits = [0]
    pipelined, cursor, rollback = PgConnection._pipelined, PgConnection._cursor, PgConnection._rollback

    def counted_pipelined(self: PgConnection, statements: Any) -> Any:
        waits[0] += 1
        return pipelined(self, statements)

    def counted_cursor(self: PgConnection) -> Any:
        waits[0] += 1  # taken for each statement sent on its own
        return cursor(self)

    def counted_rollback(self: PgConnection) -> Any:
        waits[0] += 1  # psycopg's own ROLLBACK
        return rollback(self)

    monkeypatch.setattr(PgConnection, "_pipelined", counted_pipelined)
    monkeypatch.setattr(PgConnection, "_cursor", counted_cursor)
    monkeypatch.setattr(PgConnection, "_rollback", counted_rollback)
    return waits
