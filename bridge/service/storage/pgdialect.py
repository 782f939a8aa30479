"""The store's SQL on PostgreSQL: a connection that speaks like ``sqlite3``.

The store's statements are one text for both backends (``dialect`` holds
the little each says its own way, the schema's types too), with ``?``
placeholders, and the store calls what ``sqlite3`` has (``PRAGMA
user_version``, ``BEGIN IMMEDIATE``).  Here:

- the parameter style: ``?`` becomes psycopg's ``%s`` (outside string
  literals) and every ``%`` is doubled; the SQL itself is sent as written;
- ``PRAGMA user_version`` is a row in ``askwright_schema``; ``PRAGMA
  synchronous`` is ``SET LOCAL synchronous_commit`` in the transactions
  that follow; other pragmas mean nothing here;
- ``BEGIN IMMEDIATE`` is ``BEGIN`` with the fence (the leader's lease
  check, see ``bridge/service/storage/leader.py``) when one is set, both
  sent with the transaction's first statement that waits.  The fence fails
  on the server when the lease is not held (a division by zero), so what
  was sent after it, a ``COMMIT`` too, does not run: a transaction whose
  first wait is its ``COMMIT`` waits once.  A transaction that sent
  nothing costs no round trip;
- ``total_changes`` is counted here;
- what only this backend has, for its round trips: ``reads`` (several
  reads sent at once), ``defer`` (a write whose result nobody reads,
  sent with the next statement that waits) and ``expect`` (what a batch
  took for granted instead of reading it, checked on the server with its
  writes: ``guesses``); see docs/architecture.md, "A batch's round trips";
- psycopg's errors are raised as the ``sqlite3`` classes the callers already
  catch (a lost connection is an ``OperationalError``: the store failed as a
  whole, the batch is retried), with psycopg's error as the cause.

The driver is psycopg 3: a synchronous API like the store's calls, binary
wheels, and it is the maintained PostgreSQL adapter.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
from typing import Any, Iterable, Iterator, Protocol, Sequence

import psycopg
from psycopg import errors as pgerrors
from psycopg.conninfo import conninfo_to_dict

from bridge.service.storage.dbclock import DatabaseClock
from bridge.service.storage.dialect import POSTGRESQL
from bridge.service.storage.pgconnect import STORE_DEADLINE, STORE_LIMITS, WATCHDOG, connect
from bridge.service.storage.store import GuessedWrong, PartsFailedTogether

_SCHEMA_TABLE = "askwright_schema"
_KEPT_CURSORS = 2000  # cursors kept for pipelines (each holds its last result until used again)
_LITERAL_OR_MARK = re.compile(r"'(?:[^']|'')*'|--[^\n]*|\?|%")
_PRAGMA = re.compile(r"^\s*PRAGMA\s+(\w+)\s*(?:=\s*(\w+))?\s*$", re.I)
_DDL = re.compile(r"^\s*(CREATE|ALTER)\s+TABLE", re.I)
_DML = re.compile(r"^\s*(INSERT|UPDATE|DELETE)\b", re.I)
# ``expect``: a condition that, false, fails the statement on the server (a
# subquery of two rows where one value is wanted: cardinality_violation, which
# nothing else the store sends can raise), so nothing sent after it runs.
_EXPECTED = "SELECT CASE WHEN {} THEN 1 ELSE (SELECT 1 UNION ALL SELECT 2) END"
_EXPECTED_PREFIX = _EXPECTED[:_EXPECTED.index("{")]


class StoreOperationalError(sqlite3.OperationalError):
    """PostgreSQL could not be reached, or a table is missing (as SQLite's "no such table")."""


class StoreIntegrityError(sqlite3.IntegrityError):
    pass


class StoreDatabaseError(sqlite3.DatabaseError):
    pass


def redact(url: str) -> str:
    """The store's URL without its password, for messages and logs: neither
    the one before the host (``user:pw@``, an ``@`` in it unencoded too) nor
    one in the query (``?password=``, as libpq also takes it)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    # The query starts at a "?name=" (a ? in a password is followed by no
    # parameter); a password in it may hold an unencoded @ too.
    found = _QUERY.search(rest)
    rest, query = (rest[:found.start()], rest[found.start():]) if found else (rest, "")
    # The last @ before it: a password may hold one unencoded (or a ? or /);
    # all before it but the user name goes, whatever it held.
    userinfo, at, rest = rest.rpartition("@")
    user = f"{userinfo.split(':', 1)[0].split('?', 1)[0]}@" if at else ""
    query = _SECRET_PARAM.sub(r"\1***", query)
    shown = f"{scheme}://{user}{rest}{query}"
    # And whatever libpq itself reads as the password, wherever it stands
    # ("u:a?b=c@host": a password that looks like the start of a query).
    try:
        password = conninfo_to_dict(url).get("password")
    except psycopg.Error:  # a URL libpq cannot read is refused elsewhere; shown as cut above
        password = None
    return shown.replace(password, "***") if password else shown


_QUERY = re.compile(r"\?[A-Za-z_]+=")
# The query parameters libpq reads a secret from.
_SECRET_PARAM = re.compile(r"((?:^|[?&])(?:password|sslpassword)=)[^&#]*", re.I)


class Fence(Protocol):
    """What each write transaction checks first (the leader's lease: ``leader.Lease``)."""

    def statement(self) -> tuple[str, Sequence[Any]]:
        """The read sent with BEGIN (psycopg's ``%s`` placeholders): a row
        when the transaction may write, a division by zero on the server when
        it must not (so nothing sent after it runs).  Raises when there is no
        need to ask (this instance surely no longer leads)."""

    def held(self, found: bool) -> None:
        """Whether that read found a row (False: it failed on the server);
        raises when the transaction must write nothing."""


class Result:
    """What ``sqlite3.Connection.execute`` returns, as far as the store uses it."""

    def __init__(self, rows: list[tuple] | None, rowcount: int):
        self._rows = rows or []
        self.rowcount = rowcount

    def fetchone(self) -> tuple | None:
        return self._rows.pop(0) if self._rows else None

    def fetchall(self) -> list[tuple]:
        rows, self._rows = self._rows, []
        return rows

    def __iter__(self):
        return iter(self.fetchall())


UNLIMITED = ("statement_timeout", "idle_in_transaction_session_timeout", "lock_timeout")


class PgConnection:
    """A PostgreSQL connection used through the ``sqlite3`` calls the store makes."""

    guesses = True  # a read costs a round trip here: a batch may take look-ups for granted (``expect``)
    dialect = POSTGRESQL

    def __init__(self, url: str, *, read_only: bool = False, password: str | None = None,
                 session: Sequence[str] = ()):
        self.url = url
        self.read_only = read_only
        self.password = password
        self.session = tuple(session)
        self.total_changes = 0
        self.fence: Fence | None = None
        self._plans: dict[str, tuple] = {}  # SQL as the store writes it -> what it is, what is sent (``_plan``)
        self._one: psycopg.Cursor | None = None  # ``_cursor``
        self._kept: list[psycopg.Cursor] = []  # ``_cursors``
        self._deferred: list[tuple[str, Any, bool]] = []  # ``defer``: (text, parameters, counts)
        self._unchecked: tuple[Fence, int] | None = None  # the fence deferred with BEGIN, its place in _deferred
        self._prelude = 0  # how many of _deferred are the BEGIN not sent yet and what goes with it
        self._together = False  # ``parts_together``
        self._commit_waits = True  # PRAGMA synchronous: FULL (True) or NORMAL (a commit that does not wait)
        self._open = False  # inside a BEGIN this connection issued
        self._deadline: float | None = STORE_DEADLINE  # None while migrating (no statement limit)
        self._one_at_a_time = False  # while migrating: no pipeline (``migrating``)
        # The store's clock: the server's, measured at each connect (see dbclock).
        self.clock = DatabaseClock()
        self.clock.refresh = self._measure_clock
        self.conn = self._connect()

    def _connect(self) -> psycopg.Connection:
        try:
            conn = connect(self.url, self.password, limits=STORE_LIMITS, name="askwright-bridge store")
            if self.read_only:
                conn.execute("SET default_transaction_read_only = on")
            for statement in self.session:
                conn.execute(statement)
            with WATCHDOG.limit(conn, STORE_DEADLINE):
                self.clock.measure(conn)
            return conn
        except psycopg.Error as exc:
            raise _as_sqlite(exc) from exc

    def close(self) -> None:
        self.conn.close()

    def _measure_clock(self) -> None:
        """Measure the server's clock again, but never inside a transaction
        (a failure there would abort it) nor on a lost connection (the
        reconnect measures)."""
        if self._open or self.conn.closed or self.conn.broken:
            return
        with WATCHDOG.limit(self.conn, STORE_DEADLINE):
            self.clock.measure(self.conn)

    @contextlib.contextmanager
    def migrating(self) -> Iterator[None]:
        """While migrating: instances starting together migrate one after the
        other (a lock of this session, waited for a bounded time), with no
        statement or lock limit (a migration may rewrite a large table), but
        with an idle one, so a migrator frozen holding the lock loses it
        (``migratelock``)."""
        from bridge.service.storage import migratelock

        with self.unlimited():
            limits = migratelock.idle_limits(self.conn.info.server_version)
            for setting in limits:
                self.execute(setting)
            # psycopg may end a pipeline with a flush request after its Sync
            # (answers still on their way), and the server arms its idle
            # limits only when it says it is ready for a query, which it does
            # not after a flush: a migrator frozen after a pipelined round
            # trip kept its lock for good.  One statement per round trip here.
            self._one_at_a_time = True
            try:
                migratelock.take(self.execute, redact(self.url))
                try:
                    yield
                finally:
                    if not self._gone():  # (a session ended holds no lock)
                        migratelock.let_go(self.execute)
            finally:
                self._one_at_a_time = False
                if len(limits) > 1 and not self._gone():  # (unlimited resets the other)
                    self.execute("RESET idle_session_timeout")

    def _gone(self) -> bool:
        return self.conn.closed or self.conn.broken

    @contextlib.contextmanager
    def unlimited(self) -> Iterator[None]:
        """No limit on a statement, a lock or an idle transaction, on the
        server or here (the watchdog): for work that takes as long as its
        data, a migration or ``store migrate``'s copy and its check."""
        for limit in UNLIMITED:
            self.execute(f"SET {limit} = 0")
        self._deadline = None
        try:
            yield
        finally:
            self._deadline = STORE_DEADLINE
            if not self._gone():  # (a new session starts with the limits)
                for limit in UNLIMITED:
                    self.execute(f"RESET {limit}")

    # -- the sqlite3 calls ----------------------------------------------

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Result:
        if self.conn.closed or self.conn.broken:
            if sql.strip().upper() == "ROLLBACK" and self._open:  # the transaction died with the connection
                self._open = False
                self._forget_deferred()
                return Result(None, -1)
            self._reconnect()
        plan = self._plan(sql)
        kind = plan[0]
        if kind == "PRAGMA":
            return self._pragma(plan[1], plan[2])
        if kind == "BEGIN":
            return self._begin()
        if kind == "ROLLBACK":
            begun = self._begun()
            self._forget_deferred()  # undone with the rest
            try:
                return self._rollback() if begun else Result(None, -1)
            finally:
                self._open = False
        if kind == "COMMIT":
            try:
                return self._run(kind, None) if self._ready_to_commit() else Result(None, -1)
            except BaseException:
                if self._open and not (self.conn.closed or self.conn.broken):
                    # A write sent with the COMMIT failed, so the COMMIT never ran: the
                    # transaction is still open (aborted), and ends here.
                    with contextlib.suppress(sqlite3.Error):
                        self._rollback()
                raise
            finally:
                self._open = False
        if kind == "DDL":
            return self._run(sql, None)
        _kind, text, counts, verb = plan
        if verb == "ROLLBACK TO":
            self._drop_deferred_after_savepoint()
        return self._run(text, _adapt(params), counts=counts)

    def defer(self, sql: str, params: Sequence[Any] = ()) -> None:
        """Inside a transaction: ``sql`` (a write whose result nobody reads,
        or a SAVEPOINT) sent with the next statement that waits for an
        answer, in one round trip.  Its error, if any, is raised by that
        statement; a RELEASE, a ROLLBACK TO or a COMMIT always waits, so an
        error stays within the transaction it was made in, and within its
        savepoint; with parts together, ``PartsFailedTogether``."""
        plan = self._plan(sql) if self._open else None
        if plan is None or plan[0] != "SQL":  # outside a transaction nothing comes to wait with: at once
            self.execute(sql, params)
            return
        self._deferred.append((plan[1], _adapt(params), plan[2]))

    @property
    def writes_waiting(self) -> int:
        """How many deferred statements change rows (not counted in
        ``total_changes`` until their round trip)."""
        return sum(1 for _text, _params, counts in self._deferred if counts)

    def expect(self, condition: str, params: Sequence[Any]) -> None:
        """Inside a transaction: ``condition`` (PostgreSQL's SQL, ``%s``
        placeholders), what the transaction took for granted instead of
        reading it, sent with the next statement that waits, ahead of what
        is written after it.  False, it fails on the server (nothing after it
        runs, the COMMIT neither) and that statement raises ``GuessedWrong``."""
        if not self._open:
            raise ValueError("nothing to expect outside a transaction")
        self._deferred.append((_EXPECTED.format(condition), _adapt(params), False))

    def _rollback(self) -> Result:
        """ROLLBACK, by psycopg's own call: it also forgets the statements it
        prepared.  A pipeline that failed skips the rest of its statements on
        the server, one psycopg was preparing too, which it may still count as
        prepared: every later use of it would then fail ("prepared statement
        ... does not exist")."""
        try:
            with WATCHDOG.limit(self.conn, self._deadline):
                self.conn.rollback()
        except psycopg.Error as exc:
            raise _as_sqlite(exc) from exc
        return Result(None, -1)

    def _begun(self) -> bool:
        """Whether the open transaction sent or will send anything but its BEGIN."""
        return self._prelude == 0 or len(self._deferred) > self._prelude

    def _ready_to_commit(self) -> bool:
        """Before a COMMIT: False when the transaction sent nothing since its
        BEGIN (nothing to end, nothing is sent).  A fence not read yet goes
        with the COMMIT: it fails on the server first when the lease is not
        held, and the COMMIT does not run."""
        if not self._begun():
            self._forget_deferred()
            return False
        return True

    def _forget_deferred(self) -> None:
        self._deferred.clear()
        self._unchecked, self._prelude = None, 0
        self._together = False

    def parts_together(self) -> None:
        """The open transaction's parts share round trips with no savepoint
        between them (``Store.savepoint(apart=False)``): a write that fails
        in it can't be told to its part (``PartsFailedTogether``)."""
        if self._open:
            self._together = True

    def _send(self, statements: Sequence[tuple[str, Sequence[Any] | None, bool]]) -> list[Result]:
        """What was deferred, then ``statements``, in one round trip: the
        results of ``statements``.  A fence deferred with BEGIN is checked
        on its answer (raising when this instance no longer leads; the
        transaction is then rolled back by its owner, nothing committed)."""
        waiting, self._deferred = self._deferred, []
        unchecked, self._unchecked, self._prelude = self._unchecked, None, 0
        try:
            results = self._pipelined([*waiting, *statements])
        except sqlite3.OperationalError:
            raise
        except sqlite3.DatabaseError as exc:
            if unchecked is not None and isinstance(exc.__cause__, pgerrors.DivisionByZero):
                unchecked[0].held(False)  # the fence failed on the server (the store never divides)
            if isinstance(exc.__cause__, pgerrors.CardinalityViolation) and any(
                    text.startswith(_EXPECTED_PREFIX) for text, _params, _counts in waiting):
                raise GuessedWrong(str(exc)) from exc
            if self._together and self._open:
                raise PartsFailedTogether(str(exc)) from exc
            raise
        if unchecked is not None:
            fence, index = unchecked
            fence.held(results[index].fetchone() is not None)
        return results[len(waiting):]

    def _drop_deferred_after_savepoint(self) -> None:
        """Before a ROLLBACK TO: what was deferred after the last SAVEPOINT is
        undone by it, so it is never sent (the SAVEPOINT itself is)."""
        for index in range(len(self._deferred) - 1, -1, -1):
            if self._deferred[index][0].startswith("SAVEPOINT"):
                del self._deferred[index + 1:]
                return
        del self._deferred[self._prelude:]  # the SAVEPOINT went out already: all of it came after

    def _plan(self, sql: str) -> tuple:
        """What ``sql`` is and what is sent for it, worked out once per text
        (every statement of a batch comes through here: looked up, not
        parsed again)."""
        plan = self._plans.get(sql)
        if plan is not None:
            return plan
        word = sql.strip().upper()
        pragma = _PRAGMA.match(sql)
        if pragma:
            plan = ("PRAGMA", pragma.group(1).lower(), pragma.group(2))
        elif word.startswith("BEGIN"):
            plan = ("BEGIN",)
        elif word in ("COMMIT", "ROLLBACK"):  # (ROLLBACK TO a savepoint is a statement like others)
            plan = (word,)
        elif _DDL.match(sql):
            return ("DDL",)  # run once (migrations): not kept
        else:
            plan = ("SQL", _LITERAL_OR_MARK.sub(_mark, sql), bool(_DML.match(sql)),
                    "ROLLBACK TO" if word.startswith("ROLLBACK TO") else None)
        self._plans[sql] = plan
        return plan

    def _begin(self) -> Result:
        """BEGIN, with what the transaction needs before its first statement
        (the commit not waiting for the disk, ``PRAGMA synchronous=NORMAL``
        before it, and the fence), deferred: it goes out with the first
        statement that waits."""
        fence = self.fence
        check = fence.statement() if fence is not None else None  # raises when this instance surely no longer leads
        self._forget_deferred()
        self._deferred.append(("BEGIN", None, False))
        if not self._commit_waits:
            self._deferred.append(("SET LOCAL synchronous_commit = off", None, False))
        if check is not None:
            self._unchecked = (fence, len(self._deferred))
            self._deferred.append((*check, False))
        self._prelude = len(self._deferred)
        self._open = True
        return Result(None, -1)

    def _reconnect(self) -> None:
        """The connection is gone: made again, unless a transaction died with it
        (one that sent nothing yet goes on, on the new connection)."""
        if self._open and self._begun():
            raise StoreOperationalError("PostgreSQL: the connection was lost inside a transaction")
        self.conn = self._connect()

    @property
    def in_transaction(self) -> bool:
        """Inside a BEGIN this connection issued (``sqlite3.Connection.in_transaction``)."""
        return self._open

    def reads(self, statements: Sequence[tuple[str, Sequence[Any]]], *, commit: bool = False) -> list[list[tuple]]:
        """The rows of each read, all sent at once: one round trip for the lot.
        ``commit``: inside a transaction, its COMMIT goes with them, last (it
        runs only when every read did; the transaction has ended on return)."""
        if self.conn.closed or self.conn.broken:
            self._reconnect()
        sent = []
        for sql, params in statements:
            plan = self._plan(sql)
            if plan[0] != "SQL" or plan[2]:
                raise ValueError(f"not a read: {sql!r}")
            sent.append((plan[1], _adapt(params), False))
        if not commit:
            return [result.fetchall() for result in self._send(sent)]
        if not self._open:
            raise ValueError("no transaction to commit")
        if not self._ready_to_commit():
            self._open = False
            return [result.fetchall() for result in self._send(sent)]
        results = self._send([*sent, ("COMMIT", None, False)])
        self._open = False
        return [result.fetchall() for result in results[:-1]]

    def _cursor(self) -> psycopg.Cursor:
        """One cursor for the statements run one at a time (each read whole
        before the next): making one per statement cost a third of a local
        round trip."""
        if self._one is None or self._one.connection is not self.conn:
            self._one = self.conn.cursor()
        return self._one

    def _pipelined(self, statements: Sequence[tuple[str, Sequence[Any] | None, bool]]) -> list[Result]:
        """Every statement (text, parameters, whether its changed rows count)
        sent before any answer is awaited; an error in one is raised after
        the lot (those after it did not run)."""
        try:
            with WATCHDOG.limit(self.conn, self._deadline):
                cursors = self._cursors(len(statements))
                with contextlib.nullcontext() if self._one_at_a_time else self.conn.pipeline():
                    for cursor, (text, params, _counts) in zip(cursors, statements):
                        cursor.execute(text, params)
                results = [Result(cursor.fetchall() if cursor.description is not None else None, cursor.rowcount)
                           for cursor in cursors]
        except psycopg.Error as exc:
            raise _as_sqlite(exc) from exc
        except (ValueError, TypeError) as exc:  # a value psycopg could not send (a lone surrogate)
            raise StoreDatabaseError(f"PostgreSQL: {exc}") from exc
        self.total_changes += sum(r.rowcount for r, (_t, _p, counts) in zip(results, statements)
                                  if counts and r.rowcount > 0)
        return results

    def _cursors(self, count: int) -> list[psycopg.Cursor]:
        """A cursor for each statement of a pipeline, kept for the next ones
        (up to ``_KEPT_CURSORS``): making a cursor cost as much as sending
        its statement, and a batch sends a thousand."""
        if self._kept and self._kept[0].connection is not self.conn:
            self._kept = []
        while len(self._kept) < min(count, _KEPT_CURSORS):
            self._kept.append(self.conn.cursor())
        return self._kept[:count] + [self.conn.cursor() for _ in range(count - len(self._kept))]

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> Result:
        text = self._plan(sql)[1]
        batch = [_adapt(row) for row in rows]
        if not batch:
            return Result(None, 0)
        if self._deferred:
            self._send([])
        try:
            cursor = self.conn.cursor()
            with WATCHDOG.limit(self.conn, self._deadline):
                cursor.executemany(text, batch)  # pipelined: one round trip for the lot
        except psycopg.Error as exc:
            raise _as_sqlite(exc) from exc
        if cursor.rowcount > 0:
            self.total_changes += cursor.rowcount
        return Result(None, cursor.rowcount)

    # -- translation ----------------------------------------------------

    def _run(self, text: str, params: Sequence[Any] | None, *, counts: bool = False) -> Result:
        """``params`` None: ``text`` is sent as it is; a sequence (empty too):
        its ``%s`` are filled and its ``%%`` are ``%``.  What was deferred goes first, with it."""
        if self._deferred:
            return self._send([(text, params, counts)])[0]
        try:
            with WATCHDOG.limit(self.conn, self._deadline):
                cursor = self._cursor()
                cursor.execute(text, params)
                rows = cursor.fetchall() if cursor.description is not None else None
        except psycopg.Error as exc:
            raise _as_sqlite(exc) from exc
        rowcount = cursor.rowcount
        if counts and rowcount > 0:
            self.total_changes += rowcount
        return Result(rows, rowcount)

    def _pragma(self, name: str, value: str | None) -> Result:
        if name == "user_version":
            if value is None:
                return Result([(self.schema_version(),)], -1)
            self._run(f"CREATE TABLE IF NOT EXISTS {_SCHEMA_TABLE}"
                      " (id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER NOT NULL)", None)
            self._run(f"INSERT INTO {_SCHEMA_TABLE}(id, version) VALUES (1, %s)"
                      " ON CONFLICT (id) DO UPDATE SET version = EXCLUDED.version", (int(value),))
        elif name == "synchronous" and value is not None:
            # NORMAL: the next transactions commit without waiting for the
            # disk; FULL: they wait (the default).  Said at each BEGIN (``_begin``).
            self._commit_waits = value.upper() not in ("NORMAL", "OFF", "0", "1")
        return Result(None, -1)

    def instances_heard(self, within: float) -> list[tuple[str, float]]:
        """The bridge instances heard from in the last ``within`` seconds
        (``leader.py``'s heartbeats), the latest first: (id, seconds ago)."""
        if self._run("SELECT to_regclass('askwright_instance')", None).fetchone()[0] is None:
            return []
        rows = self._run("SELECT id, EXTRACT(EPOCH FROM clock_timestamp() - seen) FROM askwright_instance"
                         " WHERE seen > clock_timestamp() - make_interval(secs => %s) ORDER BY seen DESC",
                         (within,)).fetchall()
        return [(name, float(ago)) for name, ago in rows]

    def schema_version(self) -> int:
        if self._run("SELECT to_regclass(%s)", (_SCHEMA_TABLE,)).fetchone()[0] is None:
            return 0
        row = self._run(f"SELECT version FROM {_SCHEMA_TABLE} WHERE id = 1", None).fetchone()
        return row[0] if row else 0


def _mark(match: re.Match[str]) -> str:
    """A "?" inside a string literal stays, and every "%" is doubled, inside one
    too (psycopg reads them all); a comment goes (an apostrophe or "?" in it
    is not SQL)."""
    found = match.group(0)
    if found.startswith("--"):
        return ""
    return {"?": "%s", "%": "%%"}.get(found, found.replace("%", "%%"))


def _adapt(params: Sequence[Any]) -> tuple:
    # SQLite stores a bool as 0/1 in an INTEGER column; PostgreSQL would send a boolean.
    return tuple(int(p) if isinstance(p, bool) else p for p in params)


def _as_sqlite(exc: psycopg.Error) -> sqlite3.Error:
    message = f"PostgreSQL: {str(exc).strip()}"
    if isinstance(exc, (psycopg.OperationalError, pgerrors.UndefinedTable, pgerrors.UndefinedColumn,
                        pgerrors.AdminShutdown, pgerrors.InFailedSqlTransaction)):
        return StoreOperationalError(message)
    if isinstance(exc, psycopg.IntegrityError):
        return StoreIntegrityError(message)
    return StoreDatabaseError(message)
