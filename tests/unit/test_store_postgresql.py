"""The store on PostgreSQL: what only that backend has (a server, a URL, a password, a connection that can drop)."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import psycopg
import pytest
import yaml

from bridge.cli import main
from bridge.protocol.recorded import RecordedQuestion
from bridge.service.config import parse_config
from bridge.service.storage.leader import Lease
from bridge.service.storage.pgdialect import PgConnection, redact
from bridge.service.storage.dialect import POSTGRESQL
from bridge.service.storage.schema import migration
from bridge.service.storage.store import SCHEMA_VERSION, LogEntry, Store
from helpers.netcut import Cable
from helpers.pgstore import fresh_schema, linguistic_schema, round_trips

STORE_DEADLINE = 7.0  # the store's statement limit (5 s) and 2 s for the answer to come back


def test_an_older_store_migrates_forward_keeping_its_rows(postgres_server):
    url = fresh_schema(postgres_server)
    _older_store(url, postgres_server.password)
    db = PgConnection(url, password=postgres_server.password)
    db.execute("INSERT INTO meta(key, value) VALUES (?, ?)", ("sync_token", "s1"))
    db.execute("INSERT INTO webhook_outbox (key, agent, url, body, created_at, next_at) VALUES (?, ?, ?, ?, ?, ?)",
               ("k", "a", "https://h.example/in", "{}", 1, 1))
    db.close()
    store = Store("unused", url=url, password=postgres_server.password)
    assert store.get_meta("sync_token") == "s1"
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    # A row queued before it was recorded whether a set's callbacks named its URL: the agent's URL's, as it was.
    assert [tuple(r) for r in store.db.execute("SELECT key, callback FROM webhook_outbox").fetchall()] == [("k", 0)]


def test_the_log_keeps_millisecond_times_and_numbers_entries_in_order(postgres_server):
    store = Store("unused", url=fresh_schema(postgres_server), password=postgres_server.password)
    with store.transaction():
        first = store.append_log(LogEntry("$a", "!r", "@p:hs", "answer_event", "refused", ts=1_790_000_000_000))
        second = store.append_log(LogEntry("$b", "!r", "@p:hs", "answer_event", "refused", ts=1_790_000_000_001))
    assert second == first + 1
    # One refusal notice stands for both (same person, no question), the pending window found on PostgreSQL too.
    assert store.pending_refusals(10) == [(second, 2, "!r", "@p:hs", None)]
    assert [store.log_entry(seq).ts for seq in store.notice_seqs(second)] == [1_790_000_000_000, 1_790_000_000_001]


def test_a_dropped_connection_fails_the_transaction_and_the_next_one_reconnects(postgres_server):
    store = Store("unused", url=fresh_schema(postgres_server), password=postgres_server.password)
    with psycopg.connect(postgres_server.url(with_password=True), autocommit=True) as admin:
        pid = store.db.conn.info.backend_pid
        with pytest.raises(sqlite3.OperationalError):
            with store.transaction():
                store.mark_processed("$a", "accepted")
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
                store.mark_processed("$b", "accepted")
    with store.transaction():
        store.mark_processed("$c", "accepted")
    assert [store.is_processed(e) for e in ("$a", "$b", "$c")] == [False, False, True]


def test_a_statement_on_a_path_gone_silent_fails_within_seconds_and_the_store_carries_on(postgres_server):
    # Behind a relay (or a NAT that lost its state) the kernel's ACKs still
    # come: only the bridge's own deadline ends the wait for an answer.
    cable = Cable(postgres_server.port)
    url = fresh_schema(postgres_server).replace(f":{postgres_server.port}/", f":{cable.port}/")
    store = Store("unused", url=url, password=postgres_server.password)
    store.mark_processed("$before", "accepted")
    cable.sever()
    outcome: list[BaseException | None] = []

    def write() -> None:
        try:
            with store.transaction():
                store.mark_processed("$during", "accepted")
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - what the caller would see
            outcome.append(exc)

    began = time.monotonic()
    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    writer.join(STORE_DEADLINE + 5)
    assert outcome and isinstance(outcome[0], sqlite3.OperationalError), "the store waited on a silent path"
    assert time.monotonic() - began < STORE_DEADLINE + 5
    cable.mend()
    with store.transaction():  # a new connection
        store.mark_processed("$after", "accepted")
    assert [store.is_processed(e) for e in ("$before", "$during", "$after")] == [True, False, True]


def test_the_password_comes_from_the_environment_and_never_shows_in_messages(postgres_server, tmp_path):
    raw = {"homeserver": {"url": "http://127.0.0.1:9"}, "bot": {"user_id": "@a:hs", "access_token": "t"},
           "sets": {"root": "."}, "rooms": {"default": "!r"},
           "store": {"path": "bridge.sqlite", "url": fresh_schema(postgres_server)}}
    config = parse_config(raw, base_dir=tmp_path, environ={"ASKWRIGHT_BRIDGE_STORE_PASSWORD": postgres_server.password})
    assert config.store.password == postgres_server.password
    Store(config.store.path, url=config.store.url, password=config.store.password).close()
    assert redact("postgresql://bridge:s3cret@db:5432/bridge") == "postgresql://bridge@db:5432/bridge"


@pytest.mark.parametrize("url, shown", [
    ("postgresql://bridge:s3cret@db:5432/bridge", "postgresql://bridge@db:5432/bridge"),
    # libpq takes the password in the query too; and one with an unencoded @ or ? in it
    ("postgresql://bridge@db/b?password=Sekr1t%40Pw&sslmode=disable", "postgresql://bridge@db/b?password=***&sslmode=disable"),
    ("postgres://bridge@db/b?sslmode=require&SSLPASSWORD=keypass", "postgres://bridge@db/b?sslmode=require&SSLPASSWORD=***"),
    ("postgresql://bridge:Sekr1t@Pw@db/b", "postgresql://bridge@db/b"),
    ("postgresql://bridge:Se?kr1t@db/b", "postgresql://bridge@db/b"),
    ("postgresql://db/bridge", "postgresql://db/bridge"),
    # An unencoded @ in the query's password: all after it was shown as the host.
    ("postgresql://bridge@db/b?password=p@ssw0rd", "postgresql://bridge@db/b?password=***"),
    ("postgresql://db:5432/bridge?sslmode=require&password=Tr0ub@dor-horse",
     "postgresql://db:5432/bridge?sslmode=require&password=***"),
    ("postgresql://u:pa/ss@host/db?sslmode=require", "postgresql://u@host/db?sslmode=require"),
    ("postgresql://u:a?b=c@host/db", "postgresql://u:***@host/db"),
])
def test_the_store_url_is_never_shown_with_its_password(url, shown):
    assert redact(url) == shown


def test_a_wrong_password_is_one_line_naming_store_url_and_exit_2(postgres_server, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("PGPASSWORD", raising=False)
    url = postgres_server.url().replace("postgres@", "postgres:wrong-password@")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "homeserver": {"url": "http://127.0.0.1:9"}, "bot": {"user_id": "@a:hs", "access_token": "t"},
        "sets": {"root": "."}, "rooms": {"default": "!r"}, "store": {"path": "./bridge.sqlite", "url": url}}))
    config.chmod(0o600)
    assert main(["run", "-c", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("askwright-bridge: store.url: cannot open")
    assert "wrong-password" not in err


def test_status_before_the_first_start_on_a_new_empty_database_says_nothing_is_posted(postgres_server, tmp_path,
                                                                                    capsys):
    """The database made as docs/operators.md says, the bridge not run yet:
    status answers as on SQLite before the first start (it said "relation
    posted does not exist" and exited 2)."""
    (tmp_path / "sets" / "release").mkdir(parents=True)
    (tmp_path / "sets" / "release" / "questions.json").write_text(json.dumps({
        "askwright": 1, "id": "release", "title": "Release", "questions": [{
            "id": "go", "kind": "text", "title": "Go", "question": "Go?", "why": "To know."}]}))
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "homeserver": {"url": "http://127.0.0.1:9"}, "bot": {"user_id": "@a:hs", "access_token": "t"},
        "sets": {"root": str(tmp_path / "sets")}, "rooms": {"default": "!r"},
        "store": {"path": "./bridge.sqlite", "url": fresh_schema(postgres_server),
                  "password": postgres_server.password}}))
    config.chmod(0o600)
    assert main(["status", "-c", str(config), "--json"]) == 0, capsys.readouterr().err
    (release,) = json.loads(capsys.readouterr().out)["sets"]
    assert (release["set_id"], release["posted"]) == ("release", 0)


def test_status_whose_instances_cant_be_read_still_shows_the_sets(postgres_server, tmp_path, capsys):
    """The store read, then the instances' table refused (a role granted the
    store's tables only, or the database gone in between): status printed a
    traceback instead of the table it had."""
    from bridge.service.storage.leader import _TABLES

    url = fresh_schema(postgres_server)
    Store(str(tmp_path / "unused"), url=url, password=postgres_server.password).close()
    schema = url.rpartition("search_path%3D")[2]
    role = f"reader_{time.monotonic_ns()}"
    with psycopg.connect(postgres_server.url(with_password=True), autocommit=True) as conn:
        conn.execute(f"SET search_path = {schema}")
        for table in _TABLES:
            conn.execute(table)
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw'")
        conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
        conn.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {role}")
        conn.execute(f"REVOKE SELECT ON askwright_instance FROM {role}")
    (tmp_path / "sets").mkdir()
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "homeserver": {"url": "http://127.0.0.1:9"}, "bot": {"user_id": "@a:hs", "access_token": "t"},
        "sets": {"root": str(tmp_path / "sets")}, "rooms": {"default": "!r"},
        "store": {"path": "./bridge.sqlite", "url": url.replace("postgres@", f"{role}:pw@")}}))
    config.chmod(0o600)
    assert main(["status", "-c", str(config)]) == 0
    said = capsys.readouterr()
    assert "instances: can't be read (" in said.out and "Traceback" not in said.err, said
    assert main(["status", "-c", str(config), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["instances"] is None and out["sets"] == []


def test_a_role_or_database_at_its_connection_limit_is_waited_for_like_a_full_server(postgres_server):
    # Its slots free up as other clients leave, like the server's own; exit 2
    # at start is never restarted by the shipped systemd unit.
    from bridge.commands.run import _not_reached

    role = f"limited_{time.monotonic_ns()}"
    with psycopg.connect(postgres_server.url(with_password=True), autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw' CONNECTION LIMIT 0")
    try:
        url = postgres_server.url().replace("postgres@", f"{role}:pw@")
        with pytest.raises(Exception) as full:
            Store("unused", url=url)
        assert "too many connections for role" in str(full.value.__cause__ or full.value)
        assert _not_reached(full.value)
        with pytest.raises(Exception) as refused:
            Store("unused", url=url.replace(":pw@", ":wrong@"))
        assert not _not_reached(refused.value)
    finally:
        with psycopg.connect(postgres_server.url(with_password=True), autocommit=True) as conn:
            conn.execute(f"DROP ROLE {role}")


def test_a_store_refused_for_good_is_exit_2_not_waited_for(postgres_server, tmp_path):
    """A role that may not create the store's tables (PostgreSQL 15: any role
    not owning the public schema), a setting libpq can't take: the bridge
    said "can't be reached yet" and waited for ever, where the docs say
    exit 2 for a store it can't use."""
    import subprocess
    import sys

    from bridge.commands.run import _not_reached

    role, database = f"nocreate_{time.monotonic_ns()}", f"ncdb_{time.monotonic_ns()}"
    with psycopg.connect(postgres_server.url(with_password=True), autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw'")
        conn.execute(f"CREATE DATABASE {database}")
        conn.execute(f"REVOKE CREATE ON DATABASE {database} FROM PUBLIC")
    with psycopg.connect(postgres_server.url(with_password=True).rsplit("/", 1)[0] + f"/{database}",
                         autocommit=True) as conn:
        conn.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    base = postgres_server.url().replace("postgres@", f"{role}:pw@").rsplit("/", 1)[0]
    try:
        with pytest.raises(Exception) as denied:
            Store("unused", url=f"{base}/{database}")
        assert not _not_reached(denied.value), denied.value
        with pytest.raises(Exception) as bad:
            Store("unused", url=f"{base}/{database}?sslmode=bogus")
        assert not _not_reached(bad.value), bad.value
        config = tmp_path / "config.yaml"
        config.write_text(yaml.safe_dump({
            "homeserver": {"url": "http://127.0.0.1:9"}, "bot": {"user_id": "@a:hs", "access_token": "t"},
            "sets": {"root": str(tmp_path)}, "rooms": {"default": "!r"},
            "store": {"path": "./bridge.sqlite", "url": f"{base}/{database}"}}))
        config.chmod(0o600)
        ran = subprocess.run([sys.executable, "-m", "bridge", "run", "-c", str(config)], capture_output=True,
                             text=True, timeout=30, cwd=tmp_path)
        assert ran.returncode == 2 and "permission denied" in ran.stderr, ran.stderr
    finally:
        with psycopg.connect(postgres_server.url(with_password=True), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
            conn.execute(f"DROP ROLE IF EXISTS {role}")


def test_a_store_url_libpq_cant_read_is_a_config_error_that_never_shows_the_password(tmp_path, capsys):
    # psycopg's words ('invalid percent-encoded token: "Hunter%2050%off"')
    # were printed by status, lint -c and store migrate, and logged by run.
    raw = {"homeserver": {"url": "http://127.0.0.1:9"}, "bot": {"user_id": "@a:hs", "access_token": "t"},
           "sets": {"root": str(tmp_path)}, "rooms": {"default": "!r"},
           "store": {"path": "x", "url": "postgresql://br:Hunter%2050%off@127.0.0.1:5/brdb"}}
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(raw))
    config.chmod(0o600)
    for command in (["status"], ["run"], ["lint", str(tmp_path)]):
        main([*command, "-c", str(config)])
        said = capsys.readouterr()
        assert "Hunter" not in said.out + said.err and "50%off" not in said.out + said.err
        assert "store.url: can't be read as a PostgreSQL URL" in said.out + said.err, said


def test_a_postgresql_not_reached_at_start_is_waited_for_and_sigterm_ends_the_wait(postgres_server, tmp_path):
    """PostgreSQL down when the bridge starts (the machine booting, a restart):
    the bridge waits for it and goes on once it answers, instead of exiting 2,
    which the shipped systemd unit never restarts.  SIGTERM meanwhile is exit 0."""
    import signal
    import subprocess
    import sys

    from helpers.agents import free_port

    cable = Cable(postgres_server.port)
    cable.sever()  # a network that says nothing: connecting times out
    url = fresh_schema(postgres_server).replace(f":{postgres_server.port}/", f":{cable.port}/")
    schema = url.rpartition("search_path%3D")[2]
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "homeserver": {"url": f"http://127.0.0.1:{free_port()}"}, "bot": {"user_id": "@a:hs", "access_token": "t"},
        "sets": {"root": str(tmp_path)}, "rooms": {"default": "!r"},
        "store": {"path": "./bridge.sqlite", "url": url, "password": postgres_server.password}}))
    config.chmod(0o600)
    log = tmp_path / "bridge.log"

    def made() -> bool:
        with psycopg.connect(postgres_server.url(with_password=True)) as conn:
            return conn.execute("SELECT 1 FROM information_schema.tables WHERE table_schema=%s AND table_name="
                                "'askwright_schema'", (schema,)).fetchone() is not None

    with open(log, "wb") as out:
        bridge = subprocess.Popen([sys.executable, "-m", "bridge", "run", "-c", str(config)], stdout=out,
                                  stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        time.sleep(5)
        assert bridge.poll() is None, log.read_text()
        assert "can't be reached yet" in log.read_text() and not made()
        cable.mend()
        time.sleep(3)
        assert bridge.poll() is None, log.read_text()
        until_made = time.monotonic() + 30
        while not made():
            assert time.monotonic() < until_made, log.read_text()
            time.sleep(0.2)
        bridge.send_signal(signal.SIGTERM)  # the homeserver is not there either: it is still starting
        assert bridge.wait(15) == 0, log.read_text()
    finally:
        bridge.kill()
        bridge.wait()


def test_store_url_must_be_postgresql(tmp_path):
    raw = {"homeserver": {"url": "http://127.0.0.1:9"}, "bot": {"user_id": "@a:hs", "access_token": "t"},
           "sets": {"root": "."}, "rooms": {"default": "!r"}, "store": {"path": "x", "url": "mysql://db/x"}}
    with pytest.raises(Exception, match="store.url: must start with postgresql://"):
        parse_config(raw, base_dir=tmp_path, environ={})


def test_placeholders_comments_and_percent_signs_mean_the_same_on_postgresql(postgres_server):
    # The store's SQL is one text for both backends, with SQLite's "?"
    # placeholders: a "?" or "%" inside a literal or a comment is not one.
    store = Store("unused", url=fresh_schema(postgres_server), password=postgres_server.password)
    db = store.db
    with store.transaction():
        db.execute("INSERT INTO dirty VALUES (?, 's', 'q1') ON CONFLICT DO NOTHING -- isn't this a comment? yes, 100%",
                   ("/sets/50%",))
        db.execute("INSERT INTO dirty VALUES (?, 's', 'q1?') ON CONFLICT DO NOTHING", ("/sets/50%",))
        db.execute("INSERT INTO dirty VALUES (?, 's', 'q1') ON CONFLICT DO NOTHING", ("/sets/50%",))
    assert db.execute("SELECT set_dir FROM dirty WHERE set_dir LIKE '%50\\%' ESCAPE '\\' AND qid='q1'"
                      ).fetchall() == [("/sets/50%",)]
    assert db.execute("SELECT COUNT(*) FROM dirty WHERE set_dir LIKE '/sets/%'").fetchone()[0] == 2
    before = store.changes()
    with store.transaction():
        store.clear_dirty([("/sets/50%", "s", "q1"), ("/nowhere", "s", "q9")])
    assert store.changes() - before == 1 and store.dirty() == [("/sets/50%", "s", "q1?")]


def test_text_is_ordered_byte_by_byte_as_on_sqlite_in_a_database_that_sorts_by_language(postgres_server):
    # Most databases sort text as their host's language does ("a" before "B");
    # SQLite compares bytes ("B" before "a"): which meta key comes first, which
    # of two redactions at one time counts and which parked edit is judged
    # first must not depend on the backend.
    store = Store("unused", url=linguistic_schema(postgres_server), password=postgres_server.password)
    with store.transaction():
        for key in ("k:a", "k:B", "k:\x1fz"):
            store.set_meta(key, key)
        for event_id in ("$a", "$B"):
            store.keep_redaction(event_id, "$target", "!r", "@p:hs", 5)
            store.park_edit({"event_id": event_id, "sender": "@p:hs"}, "$original", 7)
    assert [key for key, _value in store.meta_with_prefix("k:")] == ["k:\x1fz", "k:B", "k:a"]
    assert store.redaction_since("$target", 0) == ("$B", 5)
    with store.transaction():
        assert [edit["event_id"] for edit in store.unpark_edits("$original")] == ["$B", "$a"]


def test_dirty_questions_and_open_folders_come_in_one_order_whatever_the_table_s_layout(postgres_server):
    # Without an ORDER BY, PostgreSQL gave the table's own order (which a
    # vacuum changes: a new row takes a deleted one's place) and sorted a
    # DISTINCT by language; the flush logs outcomes and writes sets in the
    # order of dirty(), the poster closes removed sets in that of folders_with_open().
    store = Store("unused", url=linguistic_schema(postgres_server), password=postgres_server.password)
    with store.transaction():
        for event_id, folder in (("$q1", "/sets/one"), ("$q2", "/sets/Two")):
            content = {"elicitation_id": f"elc_{event_id}", "question": {"id": "q", "rev": 1}}
            store.record_posted(RecordedQuestion(event_id, "!r", "s", content), set_dir=folder, posted_at=1)
        for qid in ("a", "b", "c"):
            store.append_log(LogEntry(f"${qid}", "!r", "@p:hs", "answer_event", "accepted", set_id="s",
                                      set_dir="/sets/one", qid=qid, record={"qid": qid}))
    assert store.folders_with_open() == ["/sets/Two", "/sets/one"]  # in bytes "T" comes first, as on SQLite
    with store.transaction():
        store.clear_dirty([("/sets/one", "s", "a")])
    store.db.execute("VACUUM")
    with store.transaction():
        store.append_log(LogEntry("$d", "!r", "@p:hs", "answer_event", "accepted", set_id="s", set_dir="/sets/one",
                                  qid="d", record={"qid": "d"}))
    assert [qid for _dir, _set, qid in store.dirty()] == ["b", "c", "d"]


def test_a_deferred_write_does_not_wait_for_the_server(postgres_server):
    """Another session holds the row the write needs: the write is handed
    over at once, and the statement after it waits (for the lock, here)."""
    url = fresh_schema(postgres_server)
    store = Store("unused", url=url, password=postgres_server.password)
    with store.transaction():
        store.set_meta("t1", "first")
    holder = psycopg.connect(url, password=postgres_server.password)
    holder.execute("SELECT 1 FROM meta WHERE key='t1' FOR UPDATE")
    released = threading.Timer(1.0, holder.rollback)
    released.start()
    try:
        with store.transaction():
            started = time.monotonic()
            store.db.defer("UPDATE meta SET value=? WHERE key=?", ("second", "t1"))
            handed_over = time.monotonic() - started
            seen = store.get_meta("t1")  # a read: it waits, the write going first
            waited = time.monotonic() - started
    finally:
        released.join()
        holder.close()
    assert handed_over < 0.2 and waited >= 0.8
    assert seen == "second" and store.get_meta("t1") == "second"


def test_a_statement_after_the_connection_dropped_reconnects_even_one_never_run_before(postgres_server):
    """A statement never sent before is prepared for the new connection, not the dropped one."""
    db = PgConnection(fresh_schema(postgres_server), password=postgres_server.password)
    db.execute("CREATE TABLE t (x BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, y TEXT)")
    pid = db.execute("SELECT pg_backend_pid()").fetchone()[0]
    with psycopg.connect(postgres_server.url(with_password=True), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    with pytest.raises(sqlite3.OperationalError):
        db.execute("SELECT 1")  # finds the connection gone
    assert db.execute("INSERT INTO t(y) VALUES (?) RETURNING x", ("a",)).fetchone() == (1,)
    db.close()


def test_begin_and_its_fence_go_out_with_the_first_statement_that_waits(postgres_server, monkeypatch):
    class Fence:
        checked: list[bool] = []

        def statement(self):
            return ("SELECT 1", ())

        def held(self, found):
            self.checked.append(found)

    store = Store("unused", url=fresh_schema(postgres_server), password=postgres_server.password)
    with store.transaction():  # each statement's translation worked out (a first INSERT asks the server)
        store.set_meta("t0", "zero")
        store.get_meta("t0")
    store.db.fence = Fence()
    waits = round_trips(monkeypatch)
    with store.transaction():
        store.set_meta("t1", "one")  # handed over: nothing sent yet
        assert waits[0] == 0 and Fence.checked == []
        assert store.get_meta("t1") == "one"  # BEGIN, the fence, the write and the read: one round trip
        assert waits[0] == 1 and Fence.checked == [True]
    assert waits[0] == 2  # the COMMIT
    with store.transaction():
        pass  # sent nothing: costs nothing
    assert waits[0] == 2 and Fence.checked == [True]
    with store.transaction():
        store.set_meta("t2", "two")
    # A transaction that only writes: BEGIN, the fence, the write and the COMMIT in one round trip.
    assert waits[0] == 3 and Fence.checked == [True, True]
    assert store.get_meta("t1") == "one" and store.get_meta("t2") == "two"


@pytest.mark.parametrize("then_read", [False, True], ids=["only-writes", "writes-then-reads"])
def test_a_fence_not_held_commits_nothing_sent_with_it(postgres_server, monkeypatch, then_read):
    class Lost:
        checked: list[bool] = []

        def statement(self):
            return ("SELECT 1 / COUNT(*) FROM (SELECT 1 WHERE false) AS held", ())  # as the lease's, not held

        def held(self, found):
            self.checked.append(found)
            if not found:
                raise RuntimeError("another instance leads")

    store = Store("unused", url=fresh_schema(postgres_server), password=postgres_server.password)
    store.db.fence = Lost()
    waits = round_trips(monkeypatch)
    with pytest.raises(RuntimeError):
        with store.transaction():
            store.set_meta("t1", "written by an instance that no longer leads")
            if then_read:
                store.get_meta("t1")
    assert Lost.checked == [False]
    assert waits[0] == 2  # what was sent with the fence (its COMMIT too), then the ROLLBACK
    store.db.fence = None
    assert store.get_meta("t1") is None
    with store.transaction():  # no transaction was left open
        store.set_meta("t2", "next")
    assert store.get_meta("t2") == "next"


def test_a_pipeline_that_fails_leaves_no_statement_half_prepared(postgres_server):
    """psycopg prepares a statement on the server the sixth time it is sent.
    Sent in a pipeline after a statement that fails, its preparation is
    skipped with it; the ROLLBACK must make psycopg forget it, or every later
    use fails ("prepared statement ... does not exist") and the store with it."""
    db = PgConnection(fresh_schema(postgres_server), password=postgres_server.password)
    db.execute("CREATE TABLE t (k TEXT PRIMARY KEY)")
    for _ in range(2):  # a ROLLBACK psycopg has seen before (the first one it sees clears what it prepared)
        db.execute("BEGIN")
        assert db.execute("SELECT 1").fetchone() == (1,)
        db.execute("ROLLBACK")
    for n in range(5):
        db.execute("BEGIN")
        db.defer("INSERT INTO t(k) VALUES (?)", (f"a{n}",))
        db.execute("COMMIT")
    db.execute("BEGIN")
    db.defer("INSERT INTO t(k) SELECT ? WHERE 1 = 1", ("a0",))  # a key already there: refused on the server
    db.defer("INSERT INTO t(k) VALUES (?)", ("b",))  # its sixth time: prepared with it, but never run
    with pytest.raises(sqlite3.IntegrityError):
        db.execute("COMMIT")
    for key in ("c", "d"):
        db.execute("BEGIN")
        db.defer("INSERT INTO t(k) VALUES (?)", (key,))
        db.execute("COMMIT")
    assert [r[0] for r in db.execute("SELECT k FROM t ORDER BY k").fetchall()] == ["a0", "a1", "a2", "a3", "a4",
                                                                                    "c", "d"]
    db.close()


def _sent(monkeypatch) -> dict[str, str | None]:
    """From now on: each statement the store hands a PostgreSQL connection ->
    the text sent for it, or None when the connection speaks for it (BEGIN,
    COMMIT, ROLLBACK, a pragma, DDL)."""
    sent: dict[str, str | None] = {}
    plan = PgConnection._plan

    def recorded(self: PgConnection, sql: str) -> tuple:
        found = plan(self, sql)
        sent[sql] = found[1] if found[0] == "SQL" else None
        return found

    monkeypatch.setattr(PgConnection, "_plan", recorded)
    return sent


def test_the_store_s_sql_reaches_postgresql_as_written_but_for_its_placeholders(postgres_server, monkeypatch,
                                                                                tmp_path):
    # One text for both backends (``dialect``): what PostgreSQL runs is the
    # store's own statement, its "?" marks in psycopg's style, never a
    # statement rewritten into another (an INSERT OR IGNORE made an upsert).
    from helpers.pgstore import on_postgresql
    from helpers.timeline import Room, answer, edit, redact, vote

    on_postgresql(monkeypatch, postgres_server)
    sent = _sent(monkeypatch)
    ana, bo, t0 = "@alice:hs", "@bob:hs", 1_800_000_000_000
    room = Room(tmp_path, approval={"answerers": [ana, bo], "quorum": {"required": 2}, "expires": "45s"},
                posted_ms=t0)
    with room.store.transaction():
        room.store.set_meta("approval:$q", "1")
    room.deliver([vote("$v", ana, t0 + 1, ["main"]), answer("$x", bo, t0 + 2, "stable")])
    room.deliver([edit("$e", bo, t0 + 3, "$x", "main"), redact("$r", ana, t0 + 4, "$v"), vote("$c", ana, t0 + 5, [])])
    room.crash()
    room.deliver([answer("$late", ana, t0 + 6, "main")])
    assert room.record()["state"] == "answered"
    room.store.close()
    assert any(sql.startswith("INSERT") and "ON CONFLICT" in sql for sql in sent)
    assert {sql: text for sql, text in sent.items()
            if text is not None and text.replace("%s", "?").replace("%%", "%") != sql} == {}


def test_a_batch_s_events_share_round_trips_with_no_savepoint_between_them(postgres_server, monkeypatch, tmp_path):
    # Two statements an event fewer; a part that fails is found by handling
    # the batch again with its parts apart (test_parts_together.py).
    from helpers.pgstore import on_postgresql
    from helpers.timeline import Room, answer

    on_postgresql(monkeypatch, postgres_server)
    room = Room(tmp_path)
    sent = _sent(monkeypatch)
    t0 = 1_800_000_000_000
    room.deliver([answer(f"$a{n}", "@alice:hs", t0 + n, "main") for n in range(3)])
    assert room.record()["state"] == "answered"
    room.store.close()
    assert any(sql.startswith("INSERT INTO answer_log") for sql in sent)
    assert [sql for sql in sent if sql.split()[0] in ("SAVEPOINT", "RELEASE", "ROLLBACK")] == []


def test_instances_starting_together_migrate_one_after_the_other(postgres_server):
    # Each store takes the migration's lock only when its schema is behind,
    # and reads the version again under it: the second finds it done.
    url = fresh_schema(postgres_server)
    opened: list[Store] = []
    failed: list[BaseException] = []
    start = threading.Barrier(3)

    def open_one() -> None:
        start.wait()
        try:
            opened.append(Store("unused", url=url, password=postgres_server.password))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            failed.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert failed == [] and len(opened) == 3
    for store in opened:
        assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        store.close()


def store_config(postgres_server, tmp_path: Path, monkeypatch, url: str | None = None) -> Path:
    """A config whose store is tmp_path's bridge.sqlite, or the database at ``url``."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "homeserver": {"url": "http://127.0.0.1:9"}, "bot": {"user_id": "@a:hs", "access_token": "t"},
        "sets": {"root": str(tmp_path)}, "rooms": {"default": "!r"},
        "store": {"path": "./bridge.sqlite", **({"url": url} if url else {})}}))
    config.chmod(0o600)
    monkeypatch.setenv("ASKWRIGHT_BRIDGE_STORE_PASSWORD", postgres_server.password)
    return config


def migrating(postgres_server, tmp_path: Path, monkeypatch) -> tuple[Path, str]:
    """A config whose store is tmp_path's bridge.sqlite, and a fresh database to migrate it to."""
    return store_config(postgres_server, tmp_path, monkeypatch), fresh_schema(postgres_server)


def test_a_migrate_cut_short_can_be_run_again_and_says_why_in_one_line(postgres_server, tmp_path, capsys,
                                                                      monkeypatch):
    # A copy that failed (the 5 s statement limit on a large store's COPY, a
    # kill -9 halfway) left the target with the store's empty schema, and
    # every later run was refused "the target database already has tables";
    # PostgreSQL's failure itself came out as a traceback.
    from bridge.service.storage import storecopy

    store = Store(tmp_path / "bridge.sqlite")
    store.log(LogEntry("$a", "!r:hs", "@a:hs", "answer_event", "refused", layer="schema", reason="x", message="x",
                       ts=1))
    store.close()
    config, url = migrating(postgres_server, tmp_path, monkeypatch)
    real = storecopy._copy_rows

    def cut(db, target, tables):
        raise psycopg.errors.QueryCanceled("canceling statement due to statement timeout")

    monkeypatch.setattr(storecopy, "_copy_rows", cut)
    assert main(["store", "migrate", "-c", str(config), "--to", url]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "statement timeout" in err and "run again" in err
    monkeypatch.setattr(storecopy, "_copy_rows", real)
    assert main(["store", "migrate", "-c", str(config), "--to", url]) == 0, capsys.readouterr().err
    assert "verified" in capsys.readouterr().out
    assert main(["store", "migrate", "-c", str(config), "--to", url]) == 2  # now it holds rows
    assert "already has tables with rows" in capsys.readouterr().err


def test_a_migrates_check_of_every_row_is_not_cut_short_by_the_stores_statement_limit(postgres_server, tmp_path,
                                                                                    capsys, monkeypatch):
    """The check after the copy read the whole answer log under the store's
    7 s watchdog: on a large log it was cut, "failed" after the copy had
    committed, and a second run refused (the target held rows).  Here the
    limit is 0.3 s and the check takes 0.6 s."""
    from bridge.service.storage import pgdialect, storecopy

    Store(tmp_path / "bridge.sqlite").close()
    config, url = migrating(postgres_server, tmp_path, monkeypatch)
    monkeypatch.setattr(pgdialect, "STORE_DEADLINE", 0.3)
    real = storecopy._verified

    def slow(db, target, tables):
        target.db.execute("SELECT pg_sleep(0.6)")
        return real(db, target, tables)

    monkeypatch.setattr(storecopy, "_verified", slow)
    assert main(["store", "migrate", "-c", str(config), "--to", url]) == 0, capsys.readouterr().err
    assert "verified" in capsys.readouterr().out


def test_migrate_refuses_a_target_a_bridge_already_runs_on(postgres_server, tmp_path, capsys, monkeypatch):
    # An instance started on the new database before the move (its sets
    # folder empty, so its tables too): the copy went in under it, "verified".
    Store(tmp_path / "bridge.sqlite").close()
    config, url = migrating(postgres_server, tmp_path, monkeypatch)
    Store("unused", url=url, password=postgres_server.password).close()
    running = Lease(url, postgres_server.password, name="early-instance")
    running.start()
    try:
        deadline = time.monotonic() + 15
        while not running.leading:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert main(["store", "migrate", "-c", str(config), "--to", url]) == 2
        # (The lease's thread logs too, through whatever handler an earlier command left.)
        said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("askwright-bridge")]
        assert len(said) == 1 and "early-instance" in said[0] and "stop every instance" in said[0], said
    finally:
        running.stop()
    assert main(["store", "migrate", "-c", str(config), "--to", url]) == 0, capsys.readouterr().err


def test_migrate_on_a_bridge_already_on_postgresql_refuses_to_copy_the_stale_sqlite_file(postgres_server, tmp_path,
                                                                                        capsys, monkeypatch):
    # After the first move the docs say to keep the SQLite file a while: a
    # second migrate (to a new server, say) copied that stale file, said
    # "verified", and told the operator to point the bridge at it.
    Store(tmp_path / "bridge.sqlite").close()
    config = store_config(postgres_server, tmp_path, monkeypatch, url=fresh_schema(postgres_server))
    target = fresh_schema(postgres_server)
    assert main(["store", "migrate", "-c", str(config), "--to", target]) == 2
    err = capsys.readouterr().err
    assert "on PostgreSQL already" in err and "pg_dump" in err


def test_migrate_from_a_store_path_that_cannot_be_used_says_so_in_one_line_and_leaves_nothing(
        postgres_server, tmp_path, capsys, monkeypatch):
    """A store.path under a regular file came out as a traceback (exit 1,
    "copy failed"); a mistyped one left its folder and a .lock file behind."""
    config, url = migrating(postgres_server, tmp_path, monkeypatch)
    (tmp_path / "afile").write_text("not a folder")
    for path in ("./afile/bridge.sqlite", "./typo/bridge.sqlite"):
        settings = yaml.safe_load(config.read_text())
        settings["store"]["path"] = path
        config.write_text(yaml.safe_dump(settings))
        assert main(["store", "migrate", "-c", str(config), "--to", url]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "store.path" in err and "Traceback" not in err, err
    assert not (tmp_path / "typo").exists()


def test_status_on_a_database_the_bridge_has_not_made_its_tables_in_names_store_url(postgres_server, tmp_path,
                                                                                   capsys, monkeypatch):
    """It named the SQLite file and store.path, which the bridge does not use
    once store.url is set: the operator looked at the wrong key."""
    config = store_config(postgres_server, tmp_path, monkeypatch, url=fresh_schema(postgres_server))
    assert main(["status", "-c", str(config)]) == 0
    err = capsys.readouterr().err
    assert "no store at" in err and "store.url" in err and ".sqlite" not in err, err
    assert postgres_server.password not in err


def _older_store(url: str, password: str) -> None:
    db = PgConnection(url, password=password)
    for number in range(SCHEMA_VERSION - 1):
        db.execute("BEGIN IMMEDIATE")
        for statement in migration(number, POSTGRESQL):
            db.execute(statement)
        db.execute(f"PRAGMA user_version={number + 1}")
        db.execute("COMMIT")
    db.close()


def test_a_new_version_does_not_migrate_the_store_under_a_running_older_instance(postgres_server, monkeypatch):
    # A rolling upgrade: the new version started beside a leader of the
    # version before moved the shared schema on, and the old leader went on
    # writing into it (answers without the log's leaves) without a word.
    from bridge.service.storage import leader
    from bridge.service.storage.store import StoreVersionError

    monkeypatch.setattr(leader, "SEEN_SECONDS", 2.0)
    url = fresh_schema(postgres_server)
    _older_store(url, postgres_server.password)
    old = Lease(url, postgres_server.password, name="old-leader")  # its heartbeats, as any version's
    old.start()
    try:
        deadline = time.monotonic() + 15
        while not old.leading:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        began = time.monotonic()
        with pytest.raises(StoreVersionError, match="instance old-leader runs on this store"):
            Store("unused", url=url, password=postgres_server.password)
        assert time.monotonic() - began >= 2.0  # a heartbeat that stops (a kill) is waited out first
    finally:
        old.stop()
    db = PgConnection(url, password=postgres_server.password)
    assert db.schema_version() == SCHEMA_VERSION - 1  # untouched
    db.close()
    # Stopped (or killed, and not heard from since): the migration goes ahead.
    store = Store("unused", url=url, password=postgres_server.password)
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    store.close()


def test_an_older_instance_with_this_ones_host_name_and_pid_is_no_reason_to_migrate_under_it(postgres_server,
                                                                                               monkeypatch):
    # Two containers on one machine with ``--network host`` have its host
    # name, and each runs the bridge as pid 1: the new version took the old
    # one's heartbeats for its own lease's and migrated the store under it.
    import os
    import socket

    from bridge.service.storage import leader
    from bridge.service.storage.store import StoreVersionError

    monkeypatch.setattr(leader, "SEEN_SECONDS", 2.0)
    url = fresh_schema(postgres_server)
    _older_store(url, postgres_server.password)
    beside = f"{socket.gethostname()}:{os.getpid()}:0ld1"  # (the other container's process has this pid too)
    old = Lease(url, postgres_server.password, name=beside)
    old.start()
    try:
        deadline = time.monotonic() + 15
        while not old.leading:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with pytest.raises(StoreVersionError, match=f"instance {beside} runs on this store"):
            Store("unused", url=url, password=postgres_server.password)
    finally:
        old.stop()
    db = PgConnection(url, password=postgres_server.password)
    assert db.schema_version() == SCHEMA_VERSION - 1  # untouched
    db.close()


async def test_the_database_clock_is_measured_again_on_the_stores_thread_never_the_event_loop(postgres_server,
                                                                                             monkeypatch):
    # Read on the event loop (webhooks, sessions, deadlines), the clock's
    # minutely round trip ran there too, on the store's connection: with the
    # database stalled, up to the statement limit (5 s) of everything stopped.
    import asyncio

    from bridge.service.storage import dbclock

    store = Store("unused", url=fresh_schema(postgres_server), password=postgres_server.password)
    await store.run(store.get_meta, "warm")  # the store's thread is up, as in a running bridge
    measured_on: list[int] = []
    measure = dbclock.DatabaseClock.measure

    def noted(self, conn):
        measured_on.append(threading.get_ident())
        measure(self, conn)

    monkeypatch.setattr(dbclock.DatabaseClock, "measure", noted)
    monkeypatch.setattr(dbclock, "REMEASURE_SECONDS", 0.0)
    before = store.clock.now_ms()  # on the event loop: asks for a measure, does not make it
    for _ in range(100):
        if measured_on:
            break
        await asyncio.sleep(0.02)
    assert measured_on and threading.get_ident() not in measured_on
    assert abs(store.clock.now_ms() - before) < 5000
    store.close()


def test_the_instance_upgrading_is_not_held_up_by_its_own_lease(postgres_server):
    # A standby-enabled start runs its lease (heartbeats) before a term opens
    # the store: the migration heard this very process and refused for ever.
    url = fresh_schema(postgres_server)
    _older_store(url, postgres_server.password)
    mine = Lease(url, postgres_server.password)  # named as every instance is: this host and process
    mine.start()
    try:
        deadline = time.monotonic() + 15
        while not mine.leading:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        began = time.monotonic()
        Store("unused", url=url, password=postgres_server.password).close()
        assert time.monotonic() - began < 5
    finally:
        mine.stop()
    db = PgConnection(url, password=postgres_server.password)
    assert db.schema_version() == SCHEMA_VERSION
    db.close()


def _start_config(url: str, password: str) -> SimpleNamespace:
    """What a start (``run``'s opening of the store) reads of the config."""
    return SimpleNamespace(store=SimpleNamespace(url=url, password=password, path="unused", where=redact(url)),
                           appservice=SimpleNamespace(enabled=False), metrics=SimpleNamespace(enabled=False),
                           agents=None)


def _start(url: str, password: str, name: str) -> tuple[threading.Thread, list]:
    """A start opening the store, on a thread of its own; the list gets its exit code (None: it went on)."""
    from bridge.commands.run import _open_store

    outcome: list = []
    thread = threading.Thread(target=lambda: outcome.append(_open_store(_start_config(url, password))), name=name,
                              daemon=True)
    thread.start()
    return thread, outcome


def test_a_start_behind_a_migration_lock_never_let_go_gives_up_with_exit_1_naming_its_holder(postgres_server,
                                                                                            monkeypatch, capsys):
    # A session holding the migration's lock that the server does not end
    # (a migrator frozen between two steps on PostgreSQL 12 or 13, or a
    # session no instance owns): every other start waited for it for ever,
    # without a word.
    from bridge.service.storage import migratelock

    monkeypatch.setattr(migratelock, "WAIT_SECONDS", 2.0)
    url = fresh_schema(postgres_server)  # a store not made yet: a start migrates it
    holder = psycopg.connect(url, password=postgres_server.password, autocommit=True, application_name="held")
    holder.execute(f"SELECT pg_advisory_lock({migratelock.KEY})")
    pid = holder.info.backend_pid
    try:
        start, outcome = _start(url, postgres_server.password, "a start")
        start.join(30)
        assert not start.is_alive(), "the start still waits for the migration's lock"
    finally:
        holder.close()
        start.join(30)
    assert outcome == [1]  # (not 2: a supervisor starts it again)
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("askwright-bridge")]
    assert len(said) == 1 and "migration lock" in said[0] and f"session pid {pid}, application 'held'" in said[0]
    assert f"SELECT pg_terminate_backend({pid})" in said[0]


@pytest.mark.parametrize("where", ["between two steps", "inside a step"])
def test_a_migrator_frozen_holding_the_migration_lock_is_ended_and_the_next_start_migrates(postgres_server,
                                                                                         monkeypatch, where):
    # The migration ran with no idle limit, and its lock is its session's:
    # a migrator frozen (SIGSTOP) while it held it kept it for good (a stopped
    # process's kernel still answers TCP keepalives), and every other start
    # waited behind it.  Here the server ends the frozen session once it has
    # been idle for the (shortened) limit, its step rolls back, the next
    # start migrates, and the frozen one, resumed, starts on the store migrated.
    from bridge.service.storage import migratelock
    from bridge.service.storage import store as store_module

    monkeypatch.setattr(migratelock, "IDLE_SECONDS", 1.0)
    url = fresh_schema(postgres_server)
    frozen, resume = threading.Event(), threading.Event()
    real = store_module.migration

    def freezing(number: int, dialect):
        statements = real(number, dialect)
        if threading.current_thread().name != "frozen" or number != 1 or frozen.is_set():
            return statements
        if where == "between two steps":  # nothing of this step sent yet
            frozen.set()
            resume.wait(60)
            return statements

        def first_then_frozen():
            yield statements[0]  # sent: the step's transaction is open
            frozen.set()
            resume.wait(60)
            yield from statements[1:]
        return first_then_frozen()

    monkeypatch.setattr(store_module, "migration", freezing)
    first, first_outcome = _start(url, postgres_server.password, "frozen")
    try:
        assert frozen.wait(30)
        second, second_outcome = _start(url, postgres_server.password, "next")
        second.join(30)
        assert not second.is_alive(), "the next start still waits for the frozen migrator's lock"
        assert second_outcome == [None]
    finally:
        resume.set()
        first.join(30)
    assert first_outcome == [None]  # its session ended, it tried again, and found the store migrated
    db = PgConnection(url, password=postgres_server.password)
    assert db.schema_version() == SCHEMA_VERSION
    db.close()


def test_a_sqlite_store_holding_a_nul_is_copied_with_u_fffd_and_says_so(postgres_server, tmp_path, capsys,
                                                                        monkeypatch):
    # Older bridges kept a NUL of a person's option id in the refusal's
    # message; SQLite takes it, PostgreSQL's text does not: every run of
    # migrate failed, saying it could be run again.
    store = Store(tmp_path / "bridge.sqlite")
    store.log(LogEntry("$a", "!r:hs", "@a:hs", "answer_event", "refused", layer="recorded",
                       reason="option_not_offered", message="x", ts=1))
    store.db.execute("UPDATE answer_log SET message=? WHERE event_id='$a'", ("no option \u201ca\x00b\u201d",))
    store.close()
    config, url = migrating(postgres_server, tmp_path, monkeypatch)
    assert main(["store", "migrate", "-c", str(config), "--to", url]) == 0, capsys.readouterr().err
    said = capsys.readouterr().out
    assert "answer_log: 1 rows held a NUL character" in said and "verified" in said
    copied = Store("unused", url=url, password=postgres_server.password)
    try:
        assert copied.db.execute("SELECT message FROM answer_log").fetchone()[0] == "no option \u201ca\ufffdb\u201d"
    finally:
        copied.close()
