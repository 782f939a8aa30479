"""The lock a migration of a PostgreSQL store holds, and the limits on it.

Instances starting together migrate one after the other: each takes a
session-level advisory lock before it reads the schema's version, and lets
it go when done (or its session ends).  The migration runs with no
statement or lock limit (its work is as long as its data), so two other
limits keep one migrator from holding every other start for ever:

- The migrating session's idle limit.  A migration sends its statements
  back to back, so its session idle for ``IDLE_SECONDS`` (inside a step's
  transaction or between two) is a migrator frozen (SIGSTOP, a paused VM)
  or gone: the server ends it, its step rolls back and the lock is free.
  TCP keepalives do not end it: a stopped process's kernel still answers
  them, and the server's own keepalives are not the bridge's settings.
  Between two transactions the limit is ``idle_session_timeout``, which
  PostgreSQL has from 14 on; on 12 and 13 only the wait below bounds it.
- The wait for the lock.  A start waits ``WAIT_SECONDS`` (long past the idle
  limit, so a frozen migrator's session is ended first), saying which
  session holds it every ``SAY_EVERY`` seconds, then gives up with
  ``MigrationBusy``: ``run`` exits 1 naming that session, and a supervisor
  that restarts on failure starts it again.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from bridge.service.storage.store import MigrationBusy

log = logging.getLogger(__name__)

KEY = "hashtext('askwright-bridge migrate')"  # the advisory lock's key, one per database
IDLE_SECONDS = 30.0
WAIT_SECONDS = 120.0
SAY_EVERY = 10.0
TRY_EVERY = 0.25  # how soon a start waiting behind another's migration goes on once it is done

# Who holds the lock: pg_locks splits an advisory lock's bigint key in two oids.
_HOLDER = (
    "SELECT a.pid, a.application_name, host(a.client_addr), a.state, a.state_change"
    " FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
    " WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1"
    " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    f" AND l.classid = (({KEY}::bigint >> 32) & 4294967295)::oid AND l.objid = ({KEY}::bigint & 4294967295)::oid")

Execute = Callable[..., Any]


def idle_limits(server_version: int) -> list[str]:
    """The settings that end the migrating session once it idles (see the module)."""
    limit = int(IDLE_SECONDS * 1000)
    settings = [f"SET idle_in_transaction_session_timeout = {limit}"]
    if server_version >= 140000:
        settings.append(f"SET idle_session_timeout = {limit}")
    return settings


def take(execute: Execute, where: str) -> None:
    """Hold the migration's lock, or raise ``MigrationBusy`` after ``WAIT_SECONDS``."""
    began = time.monotonic()
    said: float | None = None
    while not execute(f"SELECT pg_try_advisory_lock({KEY})").fetchone()[0]:
        waited = time.monotonic() - began
        if said is None or waited - said >= SAY_EVERY or waited >= WAIT_SECONDS:
            holder, pid = _holder(execute)
            if waited >= WAIT_SECONDS:
                end = f"SELECT pg_terminate_backend({pid})" if pid is not None else "pg_terminate_backend"
                raise MigrationBusy(
                    f"{where}: the store's migration lock is still held after {waited:.0f} s, by {holder}: an "
                    f"instance migrating the store, or one frozen while it did; this start gives up. If that "
                    f"session's process is gone or stopped, end the session ({end}) and start again")
            # (A start beside another's is common, and waits for a moment only.)
            log.log(logging.INFO if said is None else logging.WARNING,
                    "%s: waiting for the store's migration lock, held by %s (%.0f s so far, up to %.0f s)",
                    where, holder, waited, WAIT_SECONDS)
            said = waited
        time.sleep(TRY_EVERY)


def let_go(execute: Execute) -> None:
    execute(f"SELECT pg_advisory_unlock({KEY})")


def _holder(execute: Execute) -> tuple[str, int | None]:
    """Who holds the lock, in words, and its pid."""
    row = execute(_HOLDER).fetchone()
    if row is None:
        return "a session that has just let it go", None
    pid, application, address, state, since = row
    said = f"session pid {pid}"
    if application:
        said += f", application {application!r}"
    if address:
        said += f", from {address}"
    if state:
        said += f", {state}" + (f" since {since:%Y-%m-%d %H:%M:%S %Z}" if since is not None else "")
    return said, pid
