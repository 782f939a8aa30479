"""``askwright-bridge run -c CONFIG``: the long-running bridge."""

from __future__ import annotations

import argparse
import logging
import signal
import sqlite3
import sys
import threading
from typing import Any

from bridge.service.storage import runlock
from bridge.service.config import ConfigError, load_config, world_readable
from bridge.service.logs import setup_logging
from bridge.service.storage.store import MigrationBusy, Store, StoreVersionError

log = logging.getLogger("bridge.run")


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("run", help="run the bridge (bot mode, or appservice mode when enabled)")
    parser.add_argument("-c", "--config", required=True, help="the YAML config file")
    parser.add_argument("--log-format", choices=["text", "json"], default=None,
                        help="log lines as plain text or JSON (default: logging.format in the config)")


def run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"askwright-bridge: {exc}", file=sys.stderr)
        return 2
    if problem := config.sets.root_problem():
        print(f"askwright-bridge: {problem}", file=sys.stderr)
        return 2
    try:
        # One bridge per SQLite store, and none while ``store migrate`` copies
        # it; instances on PostgreSQL elect a leader in the database instead.
        lock = None if config.store.url else runlock.hold(config.store.path)
    except runlock.StoreBusy as exc:
        print(f"askwright-bridge: store.path: {exc}; is another bridge running?", file=sys.stderr)
        return 2
    except OSError as exc:  # its folder not writable by this user, a file where a folder should be
        print(f"askwright-bridge: store.path: {config.store.path}: can't be used ({exc.strerror or exc})",
              file=sys.stderr)
        return 2
    setup_logging(config.logging.level, args.log_format or config.logging.format)
    refused = _open_store(config)
    if refused is not None:
        if lock is not None:
            lock.close()
        return refused
    if world_readable(args.config):
        logging.getLogger("bridge").warning("%s is readable by other users and holds secrets; chmod 600 it",
                                            args.config)
    from bridge.service.app import run_forever

    try:
        return run_forever(config)
    except StoreVersionError as exc:  # the store was replaced under a starting bridge
        return _store_refused(exc)
    finally:
        if lock is not None:
            lock.close()


def _open_store(config: Any) -> int | None:
    """Migrate the store forward now, or refuse one from a newer bridge,
    before anything touches the network; the exit code when refused.  A
    PostgreSQL that can't be reached yet (starting with the machine,
    restarting) is waited for, as the bridge rides out one that goes away
    later; SIGTERM ends the wait (exit 0).  A store refused for good (a
    wrong password, no such database, an unreadable file) exits 2; one whose
    migration lock another session holds past the wait (``migratelock``), 1."""
    wait, stop = FIRST_WAIT, threading.Event()
    main = threading.current_thread() is threading.main_thread()  # where a signal handler can be set
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set()) if main else None
    health = None
    try:
        while True:
            try:
                Store(config.store.path, url=config.store.url, password=config.store.password).close()
                return None
            except StoreVersionError as exc:
                return _store_refused(exc)
            except MigrationBusy as exc:
                # Not refused for good (exit 2, which systemd does not restart):
                # a start after that migration, or after the session is ended, goes on.
                print(f"askwright-bridge: {' '.join(str(exc).split())}", file=sys.stderr)
                return 1
            except (sqlite3.Error, OSError) as exc:
                key = "store.url" if config.store.url else "store.path"
                if not (config.store.url and _not_reached(exc)):
                    print(f"askwright-bridge: {key}: cannot open {config.store.where} ({exc})", file=sys.stderr)
                    return 2
                said = " ".join(str(exc).split())
                log.warning("%s: %s can't be reached yet (%s); trying again in %.0f s", key, config.store.where,
                            said, wait)
                health = health or _serve_health_meanwhile(config)
                if health is not None:
                    health.why = f"{key} can't be reached yet ({said[:200]})"
            if stop.wait(wait):
                return 0
            wait = min(wait * 2, LAST_WAIT)
    finally:
        if health is not None:
            health.close()
        if main:
            signal.signal(signal.SIGTERM, previous)


def _serve_health_meanwhile(config: Any) -> Any:
    """/health (503, waiting) on the bridge's own address while the store is waited for; None when not served."""
    from bridge.service.operators.starting import StartingHealth, health_address

    address = health_address(config)
    if address is None:
        return None
    try:
        return StartingHealth(address)
    except OSError as exc:  # the address taken: the bridge's own listener will say so when it starts
        log.warning("/health not served while waiting for the store (%s)", exc)
        return None


# Waiting for a PostgreSQL that can't be reached at start: the first pause, doubling up to the last.
FIRST_WAIT, LAST_WAIT = 1.0, 30.0


def _not_reached(exc: BaseException) -> bool:
    """A PostgreSQL down or on its way (no answer, refused, starting up,
    shutting down, full), not one that refused the bridge (its password, its
    database, its rights) nor a URL no try mends.  libpq's words tell them
    apart: a connection that fails gives no SQLSTATE either way, a server
    that answered says FATAL, and a setting libpq can't take makes the
    connection "bad" before any try.  A statement the server refused (no
    right to create the store's tables) has a SQLSTATE: only a connection's
    or a server's coming back (08, 57P, 53300) is waited for, and a session
    the server ended because this process paused inside a transaction
    (25P03: a migration frozen past its idle limit, whose step rolled back)."""
    cause = exc.__cause__ or exc
    said = str(cause)
    sqlstate = getattr(cause, "sqlstate", None)
    if isinstance(sqlstate, str) and sqlstate:
        return sqlstate.startswith(("08", "57P")) or sqlstate in ("53300", "25P03")
    if "connection is bad:" in said:
        return False
    return "FATAL:" not in said or any(words in said for words in _SERVER_NOT_READY)


# What a server that answered says when it will take connections again soon.
_SERVER_NOT_READY = ("the database system is", "too many clients", "remaining connection slots",
                     "too many connections for")  # role or database: its CONNECTION LIMIT, full for now


def _store_refused(exc: StoreVersionError) -> int:
    print(f"askwright-bridge: {' '.join(str(exc).split())}", file=sys.stderr)
    return 2
