"""Leader and standby: several instances on one PostgreSQL store, one leads.

The lease is a row (``askwright_lease``) with an epoch, a holder and an
expiry in the database's own clock.  The leader renews it every second on a
connection of its own, on a thread of its own (a busy event loop does not
lose it).  A standby reads the row without a lock while the lease runs,
and takes it over once it has expired: it locks the row (``FOR UPDATE``),
raises the epoch and names itself holder.  So a standby frozen while the
lease runs holds nothing the leader's renewal would wait for: only one
that finds the lease lapsed, and may take it, locks the row.

Fencing: every write the leader makes is guarded by its epoch.
- Store transactions: right after ``BEGIN`` the leader reads its lease row
  ``FOR KEY SHARE`` (``fence``).  A takeover must lock that row first, so it
  waits for the old leader's open transaction, and after it no transaction
  of the old epoch can start.  A leader paused inside a transaction is cut
  off by ``idle_in_transaction_session_timeout`` (or, after a pipelined round
  trip, which leaves the server's limit unarmed, by the standby's first look
  once the lease ran out: ``Lease._idle_out``), so it cannot hold up the
  takeover either; nor can a standby paused between its ``FOR UPDATE`` and
  its commit (the lease's connection ends such a session after 1 s), and no
  wait for a lock lasts longer than ``lock_timeout`` (``pgconnect.connect``).
  A session no server limit ends (a process frozen while the server sends
  it a result) is ended by the standby once the lease ran out
  (``Lease._fence_out``).
  Expiries are computed and compared by the database's clock
  (``clock_timestamp()``), never by comparing two machines' clocks.
- Everything else (answers.json, posts, notices, appservice 200s): ``check``
  refuses once the lease may have expired by this machine's clock of
  elapsed time (``_clock``: it runs on through a suspend), which is never
  later than the database's expiry (the clock is read before the renewal is
  sent, and only durations are compared).  answers.json is checked under the file's lock, so a
  new leader cannot write the file between the check and the write.

A leader that finds it lost the lease (it was paused, or cut off from the
database) raises ``LeaseLost`` from every guarded write and steps down:
``standby.py`` stops what it runs and makes it a standby again.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import secrets
import socket
import threading
from typing import Any, Callable

import psycopg

from bridge.service.logs import in_a_line
from bridge.service.storage.dbclock import elapsed
from bridge.service.storage.pgconnect import STORE_LIMITS, WATCHDOG, connect
from bridge.service.storage.dialect import LeaseLost
from bridge.service.storage.pgdialect import PgConnection
from bridge.service.storage.schema import SCHEMA_VERSION

log = logging.getLogger(__name__)

TTL_SECONDS = 4.0  # a dead leader is replaced within this plus one standby poll
RENEW_SECONDS = 1.0
POLL_SECONDS = 0.5
MARGIN_SECONDS = 0.5  # the leader stops writing this long before the database lets a standby in
SEEN_SECONDS = 10.0  # an instance not heard from for this long is not listed

_TABLES = (
    "CREATE TABLE IF NOT EXISTS askwright_lease (name TEXT PRIMARY KEY, epoch BIGINT NOT NULL,"
    " holder TEXT NOT NULL, expires TIMESTAMPTZ NOT NULL)",
    "CREATE TABLE IF NOT EXISTS askwright_instance (id TEXT PRIMARY KEY, role TEXT NOT NULL,"
    " epoch BIGINT, seen TIMESTAMPTZ NOT NULL)",
)
# The lease's connection: its transactions last milliseconds, so a session
# idle inside one for a second is a paused instance (between its FOR UPDATE
# and its COMMIT): the server ends it and the row is free again, well before
# the leader's renewal gives up waiting (lock_timeout) and long before the
# lease runs out.  A wait for a lock ends after 2 s (before the statement's
# own limit, so the look that waited knows it was the lock: ``_fence_out``).
LEASE_LIMITS = {"statement_timeout": 3000, "lock_timeout": 2000, "idle_in_transaction_session_timeout": 1000}
ROUND_SECONDS = 4.0  # a renewal (or a look) and a heartbeat unanswered this long: the path is dead, reconnect


# Sessions of the bridge that hold a lock on the lease row, once the lease
# ran out: a store session's whatever its transaction's start (its BEGIN and
# fence reach the server with its first statement, which a starved machine
# may send after the expiry: spared, it stalled the takeover for good), a
# lease session's when begun before the lease ran out (later ones are other
# standbys' turns at taking it): see ``Lease._fence_out``.
_ON_THE_ROW = (
    "SELECT pg_terminate_backend(a.pid) FROM pg_stat_activity a, askwright_lease lease"
    " WHERE lease.name = 'leader' AND lease.expires < clock_timestamp() AND a.pid <> pg_backend_pid()"
    " AND a.datname = current_database()"
    " AND EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = a.pid AND l.relation = 'askwright_lease'::regclass)")
_FENCE_OUT = (_ON_THE_ROW + " AND a.application_name LIKE 'askwright-bridge %'"
              " AND (a.application_name = 'askwright-bridge store' OR a.xact_start < lease.expires)")
# Of those, the store sessions idle inside a transaction for longer than the
# store's own limit, which the server did not end: it arms that limit only
# when the last thing it read was a Sync, and psycopg ends a pipelined round
# trip (most of a batch's) with a flush request after it.  So a leader frozen
# inside a transaction held the row until a standby had waited out its lock
# (``_fence_out``); now it is ended at the first look after the lease ran out
# (``Lease._idle_out``), as the server would have ended it, while a
# transaction still at work keeps its wait.
_IDLE_OUT = (_ON_THE_ROW + " AND a.application_name = 'askwright-bridge store'"
             " AND a.state LIKE 'idle in transaction%%' AND a.state_change < clock_timestamp()"
             " - make_interval(secs => %s)")


# The oldest session holding a lock on the lease row that is no bridge's
# (a leader's write transaction holds it too, briefly: ``Lease._held_by_another``).
_HOLDERS = (
    "SELECT a.pid, a.application_name, a.usename, a.client_addr::text, a.xact_start FROM pg_stat_activity a"
    " WHERE a.pid <> pg_backend_pid() AND a.datname = current_database()"
    " AND a.application_name NOT LIKE 'askwright-bridge %'"
    " AND EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = a.pid AND l.relation = 'askwright_lease'::regclass"
    " AND l.granted) ORDER BY a.xact_start LIMIT 1")


# Seconds that run on while the machine is suspended (``dbclock.elapsed``).
_clock = elapsed


# The names ``instance_name`` gave in this process.  Its host and process id
# do not tell them: two containers on one machine (``--network host`` gives
# both its host name) each run the bridge as pid 1, and a new version started
# beside the old one took the old one's heartbeats for its own and migrated
# the store under it.
_NAMED_HERE: set[str] = set()


def instance_name() -> str:
    name = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
    _NAMED_HERE.add(name)
    return name


def of_this_process(name: str) -> bool:
    """Whether an instance name (``instance_name``) is this process's own."""
    return name in _NAMED_HERE


def _connect(url: str, password: str | None) -> psycopg.Connection:
    return connect(url, password, limits=LEASE_LIMITS, name="askwright-bridge lease", limits_win=True)


class Lease:
    def __init__(self, url: str, password: str | None = None, *, ttl: float = TTL_SECONDS,
                 name: str | None = None):
        self.url = url
        self.password = password
        self.ttl = ttl
        self.name = name or instance_name()
        self.role = "standby"
        self.epoch: int | None = None
        self.valid_until = 0.0
        self.on_lost: Callable[[], None] | None = None
        self.on_leading: Callable[[], None] | None = None
        self._hold_off_until = 0.0  # ``release``: no lease taken before this
        self._newer_schema: int | None = None  # a newer version migrated the store: this one never leads again
        self._unreached: tuple[float, str] | None = None  # (since, why) while the database can't be reached
        self._blocked: str | None = None  # why no instance can take the lease (``_held_by_another``)
        self._conn: psycopg.Connection | None = None
        self._halt = threading.Event()
        self._mutex = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="lease", daemon=True)

    # -- what the rest of the bridge asks ------------------------------------

    @property
    def leading(self) -> bool:
        return self.role == "leader" and _clock() < self.valid_until

    def unreached(self) -> tuple[float, str] | None:
        """(seconds, why) while the database has not answered the lease's last rounds."""
        trouble = self._unreached
        return None if trouble is None else (elapsed() - trouble[0], trouble[1])

    def check(self) -> None:
        """Raise ``LeaseLost`` unless this instance surely still leads."""
        if self.role != "leader":
            raise LeaseLost("this instance does not lead")
        if _clock() >= self.valid_until:
            self._lose("the lease ran out before it was renewed")
            raise LeaseLost("the lease ran out")

    # The store's fence (``pgdialect.Fence``): each write transaction holds the
    # lease row, read with its BEGIN, so a takeover waits for it to end; no
    # such row (another instance leads) divides by zero on the server, so
    # nothing sent with it, its COMMIT too, runs.
    def statement(self) -> tuple[str, tuple[Any, ...]]:
        self.check()
        return ("SELECT 1 / COUNT(*) FROM (SELECT 1 FROM askwright_lease WHERE name = 'leader' AND epoch = %s"
                " AND holder = %s FOR KEY SHARE) AS held", (self.epoch, self.name))

    def held(self, found: bool) -> None:
        if not found:
            self._lose("another instance took the lease over")
            raise LeaseLost("another instance leads now")

    def guard_store(self, store: Any) -> None:
        """Fence every transaction of ``store`` (a PostgreSQL Store) with this lease."""
        db: PgConnection = store.db
        db.fence = self

    def guard_transport(self, transport: Any) -> Any:
        return _Guarded(transport, self.check)

    # -- lifetime ---------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Hand the lease on at once (a clean stop), then stop renewing."""
        self._halt.set()
        self._thread.join(timeout=5)
        stuck = self._thread.is_alive()  # blocked on a dead network: its connection is no use
        with contextlib.suppress(psycopg.Error, OSError):
            conn = _connect(self.url, self.password) if stuck or self._conn is None else self._conn
            if self.role == "leader":
                conn.execute("UPDATE askwright_lease SET expires = now() - interval '1 second'"
                             " WHERE name = 'leader' AND epoch = %s AND holder = %s", (self.epoch, self.name))
            conn.execute("DELETE FROM askwright_instance WHERE id = %s", (self.name,))
            conn.close()
        self.role = "standby"

    def release(self, hold_off: float) -> None:
        """Hand the lease on at once and stand by: this instance could not
        serve (its store failed to open, say, while PostgreSQL restarted).
        It takes no lease for ``hold_off`` seconds, so another instance
        leads meanwhile if one can; alone, it leads again after that."""
        with self._mutex:
            leading, epoch = self.role == "leader", self.epoch
            self.role, self.valid_until = "standby", 0.0
            self._hold_off_until = _clock() + hold_off
        if not leading:
            return
        with contextlib.suppress(psycopg.Error, OSError):  # unreachable: the lease simply runs out
            conn = _connect(self.url, self.password)
            try:
                conn.execute("UPDATE askwright_lease SET expires = now() - interval '1 second'"
                             " WHERE name = 'leader' AND epoch = %s AND holder = %s", (epoch, self.name))
            finally:
                conn.close()

    # -- the thread -------------------------------------------------------

    def _run(self) -> None:
        while True:
            try:
                if self._conn is None or self._conn.closed or self._conn.broken:
                    self._conn = _connect(self.url, self.password)
                    for statement in _TABLES:
                        with contextlib.suppress(psycopg.errors.UniqueViolation):
                            self._conn.execute(statement)
                with WATCHDOG.limit(self._conn, ROUND_SECONDS):
                    if self.role == "leader":
                        self._renew(self._conn)
                    else:
                        self._try_take(self._conn)
                    self._heartbeat(self._conn)
                # Reached; but a session that is no bridge's may hold the lease row (``_try_take``).
                self._unreached = self._still(self._blocked)
            except Exception as exc:  # noqa: BLE001 - whatever failed, reconnect and go on: the thread never dies
                log.log(logging.DEBUG if isinstance(exc, psycopg.Error) else logging.WARNING,
                        "lease: database unreachable (%s); reconnecting", exc)
                # Since the first failure; why is the latest (a restart, then a refused password, say).
                self._unreached = self._still(in_a_line(exc))
                with contextlib.suppress(Exception):
                    self._conn.close()  # type: ignore[union-attr]
                self._conn = None
            if self.role == "leader" and _clock() >= self.valid_until:
                self._lose("the lease could not be renewed in time (the database unreachable?)")
            if self._halt.wait(RENEW_SECONDS if self.role == "leader" else POLL_SECONDS):
                return

    def _still(self, why: str | None) -> tuple[float, str] | None:
        """The lease's trouble now: ``why``, since the trouble began (None: none)."""
        if why is None:
            return None
        return (self._unreached[0] if self._unreached is not None else elapsed(), why)

    def _renew(self, conn: psycopg.Connection) -> None:
        started = _clock()
        cur = conn.execute("UPDATE askwright_lease SET expires = clock_timestamp() + make_interval(secs => %s)"
                           " WHERE name = 'leader' AND epoch = %s AND holder = %s", (self.ttl, self.epoch, self.name))
        if cur.rowcount != 1:
            self._lose("another instance took the lease over")
        elif self._outdated(conn):
            self._lose(f"a newer version migrated the store to schema {self._newer_schema} (this one knows "
                       f"{SCHEMA_VERSION}); stop this instance and run the new version")
        else:
            with self._mutex:
                if self.role == "leader":
                    self.valid_until = max(self.valid_until, started + self.ttl - MARGIN_SECONDS)

    def _outdated(self, conn: psycopg.Connection) -> bool:
        """The store's schema is newer than this version knows (a newer
        instance migrated it): what this one would write could be wrong there."""
        if self._newer_schema is None:
            if conn.execute("SELECT to_regclass('askwright_schema')").fetchone()[0] is None:
                return False
            row = conn.execute("SELECT version FROM askwright_schema WHERE id = 1").fetchone()
            if row is None or row[0] <= SCHEMA_VERSION:
                return False
            self._newer_schema = row[0]
            log.error("the store was migrated to schema %d by a newer version (this one knows %d): this instance "
                      "will not lead again; stop it and run the new version", row[0], SCHEMA_VERSION)
        return True

    def _try_take(self, conn: psycopg.Connection) -> None:
        started = _clock()
        if started < self._hold_off_until or self._outdated(conn):
            return
        # A look with no lock first: a standby that took the row's lock on
        # every look, paused inside one (SIGSTOP), held the leader's
        # renewal until the server ended its session.
        row = conn.execute("SELECT expires < clock_timestamp() FROM askwright_lease WHERE name = 'leader'").fetchone()
        if row is not None and not row[0]:
            self._blocked = None  # (the lease runs: nothing keeps the instances from leading)
            return
        if row is not None:
            self._idle_out(conn)
        try:
            with conn.transaction():
                conn.execute("INSERT INTO askwright_lease(name, epoch, holder, expires)"
                             " VALUES ('leader', 0, '', '-infinity') ON CONFLICT DO NOTHING")
                # Waits for every open transaction the old leader fenced (their
                # FOR KEY SHARE; an UPDATE of the row's other columns would
                # not), and reads again: the leader may have renewed since.
                expired = conn.execute("SELECT expires < clock_timestamp() FROM askwright_lease"
                                       " WHERE name = 'leader' FOR UPDATE").fetchone()[0]
                self._blocked = None  # (the row's lock was had)
                if not expired:
                    return
                epoch = conn.execute("UPDATE askwright_lease SET epoch = epoch + 1, holder = %s,"
                                     " expires = clock_timestamp() + make_interval(secs => %s) WHERE name = 'leader'"
                                     " RETURNING epoch", (self.name, self.ttl)).fetchone()[0]
        except psycopg.errors.LockNotAvailable:
            if not self._fence_out(conn):
                self._held_by_another(conn)
            return
        with self._mutex:
            self.epoch, self.role = epoch, "leader"
            self.valid_until = started + self.ttl - MARGIN_SECONDS
        log.warning("this instance leads now (epoch %d)", epoch)
        if self.on_leading is not None:
            self.on_leading()

    def _idle_out(self, conn: psycopg.Connection) -> None:
        """The lease ran out: end the bridge's store sessions idle inside a
        transaction that holds the row past the store's idle limit (``_IDLE_OUT``)."""
        idle = STORE_LIMITS["idle_in_transaction_session_timeout"] / 1000
        ended = conn.execute(_IDLE_OUT, (idle,)).fetchall()
        if ended:
            log.warning("ended %d session(s) of the instance that led before: idle inside a transaction on the"
                        " lease row for over %.0f s after its lease ran out (a frozen process)", len(ended), idle)

    def _fence_out(self, conn: psycopg.Connection) -> bool:
        """The lease row stayed locked past ``lock_timeout``.  Once the lease
        has run out, a bridge session whose transaction began before that
        and still holds a lock on the row is the old leader's, stuck: a
        process paused while the server was sending it a result stays
        "active" (no idle-in-transaction timeout applies) and a statement
        blocked writing to its client cannot be cancelled.  The server
        ends such sessions (their transactions roll back, nothing of them
        commits), so the next look takes the lease."""
        ended = conn.execute(_FENCE_OUT).fetchall()
        if ended:
            log.warning("ended %d session(s) of the instance that led before: its lease ran out while they"
                        " held the lease row", len(ended))
        return bool(ended)

    def _held_by_another(self, conn: psycopg.Connection) -> None:
        """The lease row stays locked by a session the bridge does not end
        (no instance's: an operator's psql left in a transaction, say): no
        instance can lead while it holds it, which ``/health`` says
        (``store_unreachable``) with the session, and the log once."""
        rows = conn.execute(_HOLDERS).fetchall()
        if not rows:
            return  # (ended meanwhile: the next look takes the lease)
        pid, application, user, address, since = rows[0]
        began = f", in a transaction since {since:%Y-%m-%d %H:%M:%S %Z}" if since is not None else ""
        why = (f"the lease row is locked by a session that is no bridge instance's (pid {pid}, application "
               f"{application or 'unnamed'!r}, user {user!r}{f', from {address}' if address else ''}{began}): "
               "no instance can lead until it ends")
        if why != self._blocked:
            log.warning("%s", why)
        self._blocked = why

    def _heartbeat(self, conn: psycopg.Connection) -> None:
        conn.execute("INSERT INTO askwright_instance(id, role, epoch, seen) VALUES (%s, %s, %s, now())"
                     " ON CONFLICT (id) DO UPDATE SET role = EXCLUDED.role, epoch = EXCLUDED.epoch, seen = now()",
                     (self.name, self.role, self.epoch))

    def _lose(self, why: str) -> None:
        with self._mutex:
            if self.role != "leader":
                return
            self.role, self.valid_until = "standby", 0.0
        log.warning("this instance no longer leads (epoch %s): %s; it writes nothing more and steps down",
                    self.epoch, why)
        if self.on_lost is not None:
            self.on_lost()


class _Guarded:
    """A transport whose every call is refused once the lease is lost (posts,
    notices, redactions, uploads, downloads: whatever reaches the homeserver)."""

    def __init__(self, inner: Any, check: Callable[[], None]):
        self._inner = inner
        self._check = check

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if not callable(value) or name.startswith("_"):
            return value
        check = self._check

        if inspect.iscoroutinefunction(value):
            async def guarded(*args: Any, **kwargs: Any) -> Any:
                check()
                return await value(*args, **kwargs)
            return guarded
        if inspect.isasyncgenfunction(getattr(value, "__wrapped__", None)):
            # An async context manager (a download): refused before it opens,
            # so a leader that lost the lease writes no file either.
            def guarded_context(*args: Any, **kwargs: Any) -> Any:
                check()
                return value(*args, **kwargs)
            return guarded_context
        return value


def instances(url: str, password: str | None) -> list[dict[str, Any]]:
    """The instances heard from lately, leader first: for ``status``."""
    conn = _connect(url, password)
    try:
        if conn.execute("SELECT to_regclass('askwright_instance')").fetchone()[0] is None:
            return []
        # An instance leads when the lease says so, not when its last word did:
        # a leader killed or paused is still heard from for SEEN_SECONDS after
        # its lease ran out or went to another.
        # (Sorted outside: in an ORDER BY expression "role" is the table's, and a
        # paused old leader, its stored role still "leader", sorted beside the leader.)
        rows = conn.execute(
            "SELECT * FROM (SELECT i.id, CASE WHEN i.role <> 'leader' THEN i.role WHEN EXISTS (SELECT 1"
            " FROM askwright_lease l WHERE l.name = 'leader' AND l.holder = i.id AND l.epoch = i.epoch"
            " AND l.expires > now()) THEN 'leader' ELSE 'stale' END AS role, i.epoch,"
            " EXTRACT(EPOCH FROM now() - i.seen) AS ago FROM askwright_instance i"
            " WHERE i.seen > now() - make_interval(secs => %s)) AS heard"
            " ORDER BY role <> 'leader', id", (SEEN_SECONDS,)).fetchall()
    finally:
        conn.close()
    return [{"id": i, "role": role, "epoch": epoch, "seen_seconds_ago": round(float(ago), 1)}
            for i, role, epoch, ago in rows]
