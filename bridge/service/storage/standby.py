"""An instance on a PostgreSQL store: a standby until it holds the lease,
then the bridge, then a standby again if it loses the lease.

While it stands by it touches neither the homeserver nor the sets folder
(beyond looking, at its start, that the sets are where the store knows them).
It answers /health (503, ``"role": "standby"``) and /metrics
(``askwright_bridge_standby 1``) on its metrics listener, and in appservice
mode on the appservice listener, where every transaction gets 503 so the
homeserver (or the proxy in front) tries the leader.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Awaitable, Callable

from bridge.service.eventwait import any_set
from bridge.service.config import Config
from bridge.service.storage.dbclock import elapsed
from bridge.service.storage.leader import Lease
from bridge.service.storage.setpaths import check_sets_where_known, warn_sets_outside
from bridge.service.operators.metrics import Metrics

if TYPE_CHECKING:
    from aiohttp import web

log = logging.getLogger(__name__)

Serve = Callable[[Config, asyncio.Event, Lease], Awaitable[None]]
# A failed term as leader: how long this instance leaves the lease to others
# before it may lead again (doubling up to the last).
FIRST_BACKOFF = 1.0
LAST_BACKOFF = 30.0


class FailedTerms:
    """Terms as leader that failed on the store (its connection refused: the
    database out of connection slots, a role's connection limit, a changed
    password) while the lease's own connection went on working: the
    standby's /health says so (``store_unreachable``), as it does when the
    lease's connection fails, not only "standby"."""

    def __init__(self) -> None:
        self.since: float | None = None
        self.last = 0.0
        self.error = ""

    def failed(self, exc: BaseException) -> None:
        # (The store raises its connection's failures as sqlite3's, on either backend.)
        if not isinstance(exc, sqlite3.OperationalError) and not type(exc).__module__.startswith("psycopg"):
            return  # not the store's trouble (the log says what it was)
        self.last = elapsed()
        if self.since is None:
            self.since = self.last
        self.error = " ".join(f"the store could not be used while leading: {exc}".split())[:300]

    def served(self) -> None:
        self.since = None

    def trouble(self) -> tuple[float, str] | None:
        # Said while the failures go on (a term is tried again within the
        # longest backoff); older, another instance leads, or nobody tried.
        if self.since is None or elapsed() - self.last > 2 * LAST_BACKOFF:
            return None
        return elapsed() - self.since, self.error


async def run_with_standby(config: Config, stop: asyncio.Event, serve: Serve,
                           fatal: tuple[type[BaseException], ...] = ()) -> None:
    """``fatal``: what will not fix itself by trying again (a config or a key
    refused, credentials the homeserver refuses); it ends the instance, as it
    ends a bridge on SQLite, instead of handing the lease round for ever."""
    assert config.store.url
    await asyncio.to_thread(_could_lead, config)
    loop = asyncio.get_running_loop()
    lease = Lease(config.store.url, config.store.password)
    changed = asyncio.Event()
    lease.on_leading = lambda: loop.call_soon_threadsafe(changed.set)
    lease.on_lost = lambda: loop.call_soon_threadsafe(changed.set)
    lease.start()
    log.info("instance %s started as a standby", lease.name)
    backoff = FIRST_BACKOFF
    terms = FailedTerms()
    try:
        while not stop.is_set():
            runner = await _standby_listener(config, lease, terms)
            try:
                while not lease.leading and not stop.is_set():
                    changed.clear()
                    await any_set([stop, changed])
            finally:
                if runner is not None:
                    await runner.cleanup()
            if stop.is_set():
                break
            term = asyncio.Event()
            follow = asyncio.ensure_future(_until_lost(lease, stop, changed, term))
            try:
                await serve(config, term, lease)
                backoff = FIRST_BACKOFF
                terms.served()
            except fatal:
                raise
            except Exception as exc:  # noqa: BLE001 - an instance outlives a failed term as leader
                # The store could not be opened (PostgreSQL restarting) or the
                # bridge failed while leading: the lease goes to another
                # instance at once, and this one stands by, then tries again.
                log.exception("the bridge failed while leading; handing the lease on, trying again in %.0f s",
                              backoff)
                terms.failed(exc)
                # (It connects to hand the lease on: off the event loop, where
                # /health answers, with PostgreSQL perhaps away for seconds.)
                await asyncio.to_thread(lease.release, backoff)
                backoff = min(backoff * 2, LAST_BACKOFF)
            finally:
                follow.cancel()
            if not stop.is_set():
                log.warning("stepped down: standing by again")
    finally:
        lease.stop()


def _could_lead(config: Config) -> None:
    """A standby that could never lead says so at its start, not at the
    failover it stands by for: the log's key file must be where its config
    says when the log has leaves, and hold the key that signed it (LogKeyError), and the sets must be where
    the store knows them (ConfigError, ``sets_seen_elsewhere``).  A store not
    made yet, or not reachable now, is left to the term as leader."""
    from bridge.service.auditing.keys import check_present, check_same, key_file
    from bridge.service.storage.store import Store

    try:
        store = Store.read_only(config.store.path, url=config.store.url, password=config.store.password)
    except Exception as exc:  # noqa: BLE001 - no tables yet, or PostgreSQL away: the lease waits for it anyway
        log.info("what this instance needs to lead is checked when it leads (%s)", type(exc).__name__)
        return
    try:
        leaves = store.audit.size()
        signed_with = store.get_meta("audit_key")
        folders = store.folders_with_open()
    finally:
        store.close()
    if config.audit.enabled:
        path = key_file(Path(config.store.path), config.audit.key_file)
        check_present(path, leaves, made=signed_with is not None)
        check_same(path, signed_with)
    check_sets_where_known(folders, config)
    warn_sets_outside(folders, config)


async def _until_lost(lease: Lease, stop: asyncio.Event, changed: asyncio.Event, term: asyncio.Event) -> None:
    while lease.role == "leader" and not stop.is_set():
        changed.clear()
        await any_set([stop, changed])
    term.set()


def standby_metrics(lease: Lease | None = None, terms: FailedTerms | None = None) -> Metrics:
    metrics = Metrics()
    metrics.set_role("standby")
    if lease is not None:
        metrics.store_trouble = lambda: lease.unreached() or (terms.trouble() if terms is not None else None)
    return metrics


async def _standby_listener(config: Config, lease: Lease | None = None,
                            terms: FailedTerms | None = None) -> web.AppRunner | None:
    """/health and /metrics where the leader would serve them; in appservice
    mode every other request (a transaction) is answered 503."""
    from bridge.service.operators.starting import health_address

    address = health_address(config)
    if address is None:
        return None
    host, port = address
    # Loaded only here: an instance with no listener (bot mode without
    # metrics) never loads aiohttp's server, a sixtieth of a second at each start.
    from aiohttp import web

    from bridge.service.operators.health import health_routes, runner_for

    app = web.Application()
    app.add_routes(health_routes(standby_metrics(lease, terms)))

    async def not_leading(_request: web.Request) -> web.Response:
        return web.json_response({"errcode": "M_UNKNOWN", "error": "this instance stands by; another one leads"},
                                 status=503)

    app.router.add_route("*", "/{tail:.*}", not_leading)
    runner = runner_for(app)
    await runner.setup()
    for attempt in range(50):  # the port may still be held by the bridge this instance just stopped
        try:
            await web.TCPSite(runner, host, port, reuse_address=True).start()
            return runner
        except OSError:
            if attempt == 49:
                await runner.cleanup()
                raise
            await asyncio.sleep(0.1)
    return runner
