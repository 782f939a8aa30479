"""Opening a connection to PostgreSQL, and never waiting on one for ever.

Every connection of the bridge (the store's, ``pgdialect.PgConnection``,
and the lease's, ``leader.Lease``) is made by ``connect`` with the limits
below, and every call on one runs under ``WATCHDOG``'s deadline."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from typing import Iterator

import psycopg
from psycopg.conninfo import conninfo_to_dict

log = logging.getLogger(__name__)


# Every connection to PostgreSQL (the store's and the lease's) is opened by
# ``connect``: these limits travel in its startup packet, so a reconnect has
# them too.  Why each one:
# - keepalives and ``tcp_user_timeout``: a dead network or a frozen server
#   breaks the connection within about 3 s (libpq would otherwise wait for
#   TCP to give up, about 15 minutes), and the caller reconnects;
# - ``lock_timeout``: a statement never waits long behind a lock another
#   session holds (a paused instance's), it fails and is retried;
# - ``idle_in_transaction_session_timeout``: a session paused inside a
#   transaction (SIGSTOP, a frozen VM) is ended by the server, which frees
#   whatever it locked (the lease row, above all; after a pipelined round
#   trip the server leaves it unarmed, and a standby ends the session:
#   ``leader._IDLE_OUT``);
# - ``statement_timeout``: nothing runs on unbounded (migrations lift it).
# The values sit well within the lease (``leader.TTL_SECONDS``, 4 s): see
# docs/operators.md, "Timeouts" (an operator may set others in the URL's
# ``options``).
STORE_LIMITS = {"statement_timeout": 5000, "lock_timeout": 2000, "idle_in_transaction_session_timeout": 3000}
TCP = {"keepalives": 1, "keepalives_idle": 2, "keepalives_interval": 1, "keepalives_count": 2,
       "tcp_user_timeout": 3000}
CONNECT_SECONDS = 3


def connect(url: str, password: str | None, *, limits: dict[str, int], name: str,
            limits_win: bool = False) -> psycopg.Connection:
    """An autocommit connection with the TCP settings and session ``limits``
    (milliseconds); ``name`` is its application_name in pg_stat_activity.

    The URL's own options (a search_path, or these limits set otherwise by
    an operator) come last, so they win; unless ``limits_win``: the lease's
    connection, whose limits the takeover of a frozen leader is timed by (an
    operator's ``lock_timeout=5000`` for the store let the round's 4 s bound
    cut the standby's wait before it could fail as a lock's, and nobody led)."""
    given = conninfo_to_dict(url).get("options") or ""
    ours = [f"-c {setting}={value}" for setting, value in limits.items()]
    options = " ".join([given, *ours] if limits_win else [*ours, given]).strip()
    return psycopg.connect(url, password=password, autocommit=True, connect_timeout=CONNECT_SECONDS,
                           application_name=name, options=options, **TCP)


class Watchdog:
    """Ends a connection whose statement went unanswered for too long.

    With something between the bridge and the server (a proxy, a relay, a
    NAT that lost its state), or a server process stopped on a host that
    runs on, TCP's acknowledgements keep coming, so neither keepalives
    nor ``tcp_user_timeout`` see the path is dead, and the server's own
    ``statement_timeout`` cannot end a statement it never received: libpq
    would wait for the answer for ever.  One thread looks at the calls in
    progress four times a second and shuts the socket of any past its
    deadline (``shutdown``: the blocked read returns at once, the call fails
    as a lost connection, and the caller reconnects)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._due: dict[int, tuple[float, int]] = {}  # call -> (deadline, socket)
        self._count = 0
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def limit(self, conn: psycopg.Connection, seconds: float | None) -> Iterator[None]:
        if seconds is None or conn.closed:
            yield
            return
        with self._lock:
            self._count += 1
            key = self._count
            self._due[key] = (time.monotonic() + seconds, conn.fileno())
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="postgresql-watchdog", daemon=True)
                self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                self._due.pop(key, None)

    def _run(self) -> None:
        while True:
            time.sleep(0.25)
            now = time.monotonic()
            with self._lock:  # a call that ends meanwhile waits here, so its socket is never one reused
                for key in [k for k, (deadline, _fd) in self._due.items() if deadline <= now]:
                    _deadline, fd = self._due.pop(key)
                    log.warning("PostgreSQL did not answer in time (the network or the server is gone);"
                                " the connection is dropped and made again")
                    with contextlib.suppress(OSError):
                        shut = socket.socket(fileno=os.dup(fd))
                        try:
                            shut.shutdown(socket.SHUT_RDWR)
                        finally:
                            shut.close()


WATCHDOG = Watchdog()
# A store statement the server ends after 5 s (statement_timeout) answers
# within this unless the path to the server is dead.
STORE_DEADLINE = STORE_LIMITS["statement_timeout"] / 1000 + 2
