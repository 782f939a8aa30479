"""Delivering the outbox: each row POSTed to its URL, signed, until the URL
takes it (any 2xx), retried with backoff across restarts, given up on after
``agent_api.webhook_drop_after`` with a log line and a metric.

The signature: ``X-Askwright-Signature: t=<unix seconds>,v1=<hex>`` where
hex is HMAC-SHA256 with the agent's webhook_secret over ``<t>.<body>``; a
receiver checks it and refuses an old ``t`` (replay).  ``Idempotency-Key``
is the same on every attempt: delivery is at least once, and the key lets a
receiver take each event once.

Each agent's destination URL is a lane of its own (``outbox.Lane``; two
agents naming one URL are two lanes): at most ``circuit.PER_URL`` deliveries
in flight to it, and a circuit breaker (``circuit``) that stops sending to a
URL that keeps failing, or asked to be left alone (a 429's or 503's
``Retry-After``), and probes it again later.  The outbox is read per lane
(``due_by_url``), so a URL with thousands of rows pending never hides
another URL's one.  Nothing the store does ends the deliverer:
a read that fails is tried again with backoff.  Every connection is made
through ``callbacks.connector``, which refuses inward addresses at connect
time unless ``agent_api.allow_private_callbacks``."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import random
import string
from collections.abc import Callable, Mapping
from urllib.parse import quote, urljoin, urlsplit

import aiohttp
from prometheus_client import Counter

from bridge.agents.callbacks import connector, refused_reason
from bridge.agents.circuit import MAX_OPEN, PER_URL, Circuit, doubling
from bridge.agents.lookups import on_behalf_of
from bridge.agents.outbox import (Delivery, Lane, defer_lane, delivered, drop_unsigned, due_by_url, due_lanes,
                                  due_now, expired, follow_webhook_urls, hold_lane, lane_holds, next_due, retried_lanes, retry_at)
from bridge.protocol.graphemes import shorten
from bridge.protocol.retryafter import retry_after_seconds
from bridge.service.config import Agent
from bridge.service.operators.metrics import Metrics
from bridge.service.storage.store import Store

log = logging.getLogger(__name__)

MAX_BACKOFF_SECONDS = 300.0
IDLE_SECONDS = 5.0
MAX_IN_FLIGHT = 256          # deliveries in flight over all URLs
PER_AGENT = 64               # ... of one agent's URLs: however many URLs an agent names, others' go out too
# ... and of those, the share URLs that failed their last attempt may hold:
# the rest is kept for the agent's URLs that work, which otherwise waited
# out the timeouts of its dead callbacks (40 s behind eight silent ones).
FAILING_SHARE = 0.75
STORE_RETRY_MAX = 30.0       # seconds between tries of a failing store, at most
SWEEP_SECONDS = 60.0         # how often rows past webhook_drop_after are looked for
STOP_GRACE = 3.0             # seconds a stop waits for the deliveries in flight, at most


def signature(secret: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def verify(secret: str, header: str, body: bytes, now: float, tolerance: float = 300.0) -> bool:
    """What a receiver does (and the tests): the signature matches and is recent."""
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    try:
        timestamp = int(parts["t"])
    except (KeyError, ValueError):
        return False
    if abs(now - timestamp) > tolerance:
        return False
    return hmac.compare_digest(signature(secret, timestamp, body), f"t={timestamp},v1={parts.get('v1', '')}")


def backoff(attempts: int) -> float:
    """Seconds before the next attempt: doubling from 1 s up to 5 min, with jitter."""
    return doubling(attempts - 1, 1.0, MAX_BACKOFF_SECONDS) * random.uniform(0.8, 1.2)


def asked_to_wait(status: int, header: str | None, now: float) -> float:
    """Seconds a receiver's 429 or 503 asked to be left alone (``Retry-After``:
    seconds, or an HTTP date), at most the longest backoff; 0 when it asked nothing."""
    return retry_after_seconds(header, now, MAX_BACKOFF_SECONDS) if status in (429, 503) else 0.0


def fair_order(rows: list[Delivery], failing: Callable[[Lane], bool]) -> list[Delivery]:
    """The due rows, one of each lane in turn (URLs that work before those that
    failed last, then the oldest first): the first slots free go to every URL
    once, not to the oldest URL's whole fill."""
    by_lane: dict[Lane, list[Delivery]] = {}
    for row in rows:
        by_lane.setdefault(row.lane, []).append(row)
    lanes = sorted(by_lane.values(), key=lambda lane: (failing(lane[0].lane), lane[0].id))
    return [lane[k] for k in range(max(map(len, lanes), default=0)) for lane in lanes if k < len(lane)]


def host_of(url: str) -> str:
    # Logged instead of the URL, which may carry a token in its path or query,
    # or a user and password before its host (never logged).
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    return (f"{host}:{port}" if port is not None else host) or "?"


# A receiver's answers that point elsewhere.  Never followed (the URL is the
# one the operator or the agent named; docs/agents.md): the log says where
# each points, so the operator can name that URL instead.
REDIRECTS = (301, 302, 303, 307, 308)
# How much of where a redirect points is logged: the receiver writes it.
SHOWN_LOCATION = 120


def redirect_target(url: str, location: str | None) -> str:
    """Where a redirect from ``url`` points, for the log (pure): its
    ``Location`` read against ``url``, without what may be a secret there (a
    user and password, the query, shown as "?…", the fragment), anything
    unprintable percent-encoded (a line of the receiver's own is never
    written into the log), cut to ``SHOWN_LOCATION`` characters."""
    if not location or not location.strip():
        return "nowhere (no Location)"
    try:
        target = urlsplit(urljoin(url, location.strip()))
        host = host_of(target.geturl())
    except ValueError:  # "http://[::1" and the like
        return "an unreadable Location"
    shown = quote(f"{target.scheme}://{host}{target.path}", safe=string.punctuation)
    return shorten(shown, SHOWN_LOCATION) + ("?…" if target.query else "")


class Deliverer:
    def __init__(self, store: Store, agents: Mapping[str, Agent], metrics: Metrics, *, drop_after: float,
                 timeout: float, allow_private: bool = False, clock: Callable[[], float] | None = None):
        self.store = store
        self.agents = agents
        self.drop_after = drop_after
        self.timeout = timeout
        self.allow_private = allow_private
        # The store's clock: the next_at written here is judged by whichever instance leads then.
        self.clock = clock or store.clock.seconds
        self.wake = asyncio.Event()
        self.in_flight: dict[Lane, set[int]] = {}  # lane -> ids of its rows being sent
        self.agent_in_flight: dict[str, int] = {}  # agent -> its rows being sent
        self.agent_failing: dict[str, int] = {}    # ... of them to URLs whose last attempt failed
        self.circuits: dict[Lane, Circuit] = {}
        # Lanes whose rows had failed before this start: the first delivery
        # such a URL takes brings the rest forward, whichever row it was.
        self.backlogged: set[Lane] = set()
        self._store_failures = 0
        self._swept_at = 0.0
        r = metrics.registry
        self.sent = Counter("askwright_bridge_webhooks_delivered", "Webhook deliveries a URL took.", registry=r)
        self.failed = Counter("askwright_bridge_webhooks_failed", "Webhook attempts that failed (retried).",
                              registry=r)
        self.dropped = Counter("askwright_bridge_webhooks_dropped",
                               "Webhooks given up on after agent_api.webhook_drop_after.", registry=r)

    async def run(self, stop: asyncio.Event) -> None:
        try:
            unsigned = await self.store.run(drop_unsigned, self.store, self.agents)
        except Exception:  # noqa: BLE001 - they are dropped as they come due instead
            log.warning("the webhooks waiting for agents no longer configured could not be dropped now", exc_info=True)
            unsigned = {}
        for agent, rows in unsigned.items():
            self.dropped.inc(rows)
            log.warning("%d webhook(s) of agent %s dropped: the agent, or its webhook_secret, is no longer in the "
                        "config", rows, agent)
        try:
            changes = await self.store.run(follow_webhook_urls, self.store, self.agents)
        except Exception:  # noqa: BLE001 - the store failing now: followed at the next start
            log.warning("the webhooks waiting for a changed webhook_url could not be moved to it now", exc_info=True)
            changes = []
        try:
            holds = await self.store.run(lane_holds, self.store, int(self.clock() * 1000))
        except Exception:  # noqa: BLE001 - the rows' own times still hold them
            log.warning("the webhook URLs that asked to be left alone could not be read", exc_info=True)
            holds = {}
        for lane, until_ms in holds.items():
            self.circuits.setdefault(lane, Circuit()).held_until = until_ms / 1000
        try:
            self.backlogged = await self.store.run(retried_lanes, self.store)
        except Exception:  # noqa: BLE001 - a retried row's take still brings its lane's rest forward
            log.warning("the webhook URLs with deliveries waiting to be tried again could not be read", exc_info=True)
        for agent, old, new, rows in changes:
            if rows:
                log.warning("agent %s's webhook_url changed from %s to %s: the %d webhooks waiting for the old one %s",
                            agent, host_of(old), host_of(new) if new else "none", rows,
                            "go to the new one" if new else "are dropped")
        tasks: set[asyncio.Task[None]] = set()
        session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout),
                                        connector=connector(self.allow_private, MAX_IN_FLIGHT))
        async with session as http:
            try:
                while not stop.is_set():
                    self.wake.clear()
                    delay = await self._pass(http, tasks)
                    await self._sleep(stop, delay)
            finally:
                try:
                    if tasks and stop.is_set():
                        # The deliveries in flight get a moment to end: cut off
                        # at once, one the receiver was taking went again after
                        # the restart.  None starts meanwhile.
                        await asyncio.wait(set(tasks), timeout=min(STOP_GRACE, self.timeout))
                finally:
                    for task in tasks:
                        task.cancel()
                    await asyncio.gather(*tasks, return_exceptions=True)
                    self.in_flight.clear()
                    self.agent_in_flight.clear()
                    self.agent_failing.clear()

    async def _pass(self, http: aiohttp.ClientSession, tasks: set[asyncio.Task[None]]) -> float:
        """Start what may start now; the seconds until the next pass is needed.
        A store that fails is tried again with backoff, never the end of the task.
        The outbox is read in jobs on the store's thread, not on the event loop."""
        now = self.clock()
        try:
            due = await self.store.run(self._due, now, self._unavailable(now))
            for row in fair_order(due, self._failing):
                if sum(map(len, self.in_flight.values())) >= MAX_IN_FLIGHT:
                    break
                lane = self.in_flight.setdefault(row.lane, set())
                circuit = self.circuits.setdefault(row.lane, Circuit())
                failing = self._failing(row.lane)
                if row.id in lane or circuit.room(now, len(lane)) <= 0 or not self._agent_room(row.agent, failing):
                    continue
                circuit.started(now)
                lane.add(row.id)
                self.agent_in_flight[row.agent] = self.agent_in_flight.get(row.agent, 0) + 1
                self.agent_failing[row.agent] = self.agent_failing.get(row.agent, 0) + failing
                task = asyncio.ensure_future(self._one(http, row, failing))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            soonest = await self.store.run(next_due, self.store, int(now * 1000), self._unavailable(now))
        except Exception:  # noqa: BLE001 - the store is busy, restarting or failing: try again shortly
            self._store_failures += 1
            delay = doubling(self._store_failures - 1, 0.5, STORE_RETRY_MAX)
            log.warning("reading the webhook outbox failed; trying again in %.1f s", delay,
                        exc_info=self._store_failures == 1)
            return delay
        if self._store_failures:
            log.info("the webhook outbox is readable again")
            self._store_failures = 0
        self._forget_idle(now)
        times = [soonest / 1000] if soonest is not None else []
        times += [t for c in self.circuits.values() if (t := c.reopens_at(now)) is not None]
        return max(0.05, min([IDLE_SECONDS, *(t - now for t in times)]))

    def _failing(self, lane: Lane) -> bool:
        circuit = self.circuits.get(lane)
        return circuit is not None and circuit.failures > 0

    def _agent_room(self, agent: str, failing: bool) -> bool:
        if self.agent_in_flight.get(agent, 0) >= PER_AGENT:
            return False
        return not failing or self.agent_failing.get(agent, 0) < max(1, int(PER_AGENT * FAILING_SHARE))

    def _due(self, now: float, unavailable: list[Lane]) -> list[Delivery]:
        if now - self._swept_at >= SWEEP_SECONDS:
            self._sweep(now)
            self._swept_at = now
        # Only the lanes that may start one now are read, never an agent's
        # whose share is in flight: an agent naming 6,000 URLs that never
        # answer had every pass read 48,000 rows (5 s on the store's thread,
        # which answers and other agents' webhooks wait for) to start none.
        full = [agent for agent, n in self.agent_in_flight.items() if n >= PER_AGENT]
        lanes = due_lanes(self.store, int(now * 1000), unavailable, full)
        return due_by_url(self.store, int(now * 1000), 2 * PER_URL, self._may_start(lanes))

    def _may_start(self, lanes: list[tuple[Lane, int]]) -> list[Lane]:
        """Of the lanes with rows due (oldest first), those the free slots
        can take, in ``fair_order``'s order: working URLs before failing
        ones, no agent given more than its free share."""
        free = MAX_IN_FLIGHT - sum(map(len, self.in_flight.values()))
        taken: dict[str, int] = {}
        chosen: list[Lane] = []
        for lane, _first in sorted(lanes, key=lambda item: (self._failing(item[0]), item[1])):
            if len(chosen) >= free:
                break
            agent = lane[0]
            if taken.get(agent, 0) < PER_AGENT - self.agent_in_flight.get(agent, 0):
                taken[agent] = taken.get(agent, 0) + 1
                chosen.append(lane)
        return chosen

    def _unavailable(self, now: float) -> list[Lane]:
        """Lanes that can take nothing more now: their circuit is open or their fill is in flight."""
        return [lane for lane, circuit in self.circuits.items()
                if circuit.room(now, len(self.in_flight.get(lane, ()))) <= 0]

    def _forget_idle(self, now: float) -> None:
        # A URL with nothing in flight and nothing against it needs no lane;
        # nor does one that last failed long ago and was not asked for since
        # (a URL with rows pending is probed as soon as it may be).  One that
        # failed lately keeps its count, or one delivery at a time to a dead
        # URL never added up to opening its circuit.  One held (a Retry-After
        # running) is kept until its hold ends, whatever its count: a hold
        # read at a start has no failures, and forgetting it at the first
        # pass let the next event go to the URL at once.
        for lane in [k for k, c in self.circuits.items() if not self.in_flight.get(k) and now >= c.held_until and
                     (c.failures == 0 or now > max(c.open_until, c.held_until, c.failed_at) + MAX_OPEN)]:
            del self.circuits[lane]
            self.in_flight.pop(lane, None)

    def _sweep(self, now: float) -> None:
        """Drop what is past webhook_drop_after, even to a URL whose circuit
        is open: all at once, in one transaction (one by one, 500 syncs of the
        disk held the store's thread, which answers wait for, for seconds),
        said once a URL."""
        rows = [row for row in expired(self.store, int((now - self.drop_after) * 1000))
                if row.id not in self.in_flight.get(row.lane, ())]
        if not rows:
            return
        delivered(self.store, *(row.id for row in rows))
        self.dropped.inc(len(rows))
        by_url: dict[str, list[Delivery]] = {}
        for row in rows:
            by_url.setdefault(host_of(row.url), []).append(row)
        for host, dropped in by_url.items():
            log.warning("%d webhook(s) to %s dropped: not taken after %d attempts or more (%s%s)", len(dropped), host,
                        min(row.attempts for row in dropped), ", ".join(row.key for row in dropped[:3]),
                        ", …" if len(dropped) > 3 else "")

    async def _sleep(self, stop: asyncio.Event, delay: float) -> None:
        waits = [asyncio.ensure_future(self.wake.wait()), asyncio.ensure_future(stop.wait())]
        try:
            await asyncio.wait(waits, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def _one(self, http: aiohttp.ClientSession, row: Delivery, failing: bool) -> None:
        taken: bool | None = False
        asked = 0.0
        try:
            taken, asked = await self._attempt(http, row)
        except Exception:  # noqa: BLE001 - one delivery's trouble is its own
            log.exception("webhook delivery %s failed unexpectedly", row.key)
        finally:
            self.in_flight.get(row.lane, set()).discard(row.id)
            self.agent_in_flight[row.agent] -= 1
            self.agent_failing[row.agent] -= failing
            circuit = self.circuits.setdefault(row.lane, Circuit())
            if taken:
                circuit.taken()
            elif taken is False:
                circuit.failed(self.clock(), hold=asked)
            else:  # dropped without an attempt: the URL was not tried
                circuit.probing = False
            self.wake.set()  # its lane has room again
        if taken is False and asked:
            await self._keep_hold(row.lane, self.circuits[row.lane].held_until)
        elif taken is False and self.circuits[row.lane].open_until > self.clock():
            try:
                await self.store.run(defer_lane, self.store, row.lane, int(self.circuits[row.lane].open_until * 1000))
            except Exception:  # noqa: BLE001 - they stay due, left out while the circuit is open
                log.warning("the webhooks waiting for %s not put off", host_of(row.url), exc_info=True)
        if taken and (row.attempts or row.lane in self.backlogged):
            # The URL takes deliveries again (after an outage, or a restart
            # of the bridge during one): the rest follow now, in order; or,
            # while a hold it asked for runs (this one was sent before it
            # asked), when the hold ends, never sooner.  After a restart the
            # row taken may be a new one (the backlog all put off for
            # minutes): the older ones came minutes after it.
            self.backlogged.discard(row.lane)
            now = self.clock()
            held = self.circuits[row.lane].held_until
            try:
                waiting = await self.store.run(due_now, self.store, row.lane, int(max(now, held) * 1000))
            except Exception:  # noqa: BLE001 - they go at their own times then
                log.warning("the webhooks waiting for %s not brought forward", host_of(row.url), exc_info=True)
            else:
                if waiting and held > now:
                    log.info("%s takes webhooks again: the %d waiting go when its hold ends in %.0f s",
                             host_of(row.url), waiting, held - now)
                elif waiting:
                    log.info("%s takes webhooks again: the %d waiting go now", host_of(row.url), waiting)
                    self.wake.set()

    async def _keep_hold(self, lane: Lane, until: float) -> None:
        try:
            await self.store.run(hold_lane, self.store, lane, int(until * 1000))
        except Exception:  # noqa: BLE001 - held in memory still; a restart then forgets it
            log.warning("the hold %s asked for was not kept in the store", host_of(lane[1]), exc_info=True)

    async def _attempt(self, http: aiohttp.ClientSession, row: Delivery) -> tuple[bool | None, float]:
        """True: the URL took it; False: it did not (retried later); None:
        dropped, not sent.  With the seconds the URL asked to be left alone."""
        agent = self.agents.get(row.agent)
        if agent is None or not agent.webhook_secret:
            await self.store.run(self._drop, row, "its agent has no webhook_secret in the config any more")
            return None, 0.0
        now = self.clock()
        if now * 1000 - row.created_at > self.drop_after * 1000:
            await self.store.run(self._drop, row, f"not taken after {row.attempts} attempts")
            return None, 0.0
        headers = {"Content-Type": "application/json", "Idempotency-Key": row.key,
                   "X-Askwright-Signature": signature(agent.webhook_secret, int(now), row.body),
                   "User-Agent": "askwright-bridge"}
        problem, asked = None, 0.0
        try:
            with on_behalf_of(row.agent):  # its name looked up on its agent's threads, behind no other's
                async with http.post(row.url, data=row.body, headers=headers, allow_redirects=False) as response:
                    if 200 <= response.status < 300:
                        # Recorded as its status comes, before the rest of the
                        # answer is read (up to the timeout): a bridge stopped
                        # or killed meanwhile sent the event again.
                        self.sent.inc()
                        log.info("webhook %s delivered to %s", row.key, host_of(row.url))
                        try:
                            await self.store.run(delivered, self.store, row.id)
                        except Exception:  # noqa: BLE001 - sent; the store forgot: it goes again (at least once)
                            log.warning("webhook %s delivered, but the store could not record it: it will be sent "
                                        "again", row.key, exc_info=True)
                        await _drain(response)
                        return True, 0.0
                    await _drain(response)  # never raises: the status already says what the URL did
                    problem = f"HTTP {response.status}"
                    if response.status in REDIRECTS:
                        problem += f" to {redirect_target(row.url, response.headers.get('Location'))}, not followed"
                    asked = asked_to_wait(response.status, response.headers.get("Retry-After"), now)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
            # ValueError: a host no name can be made of ("label too long"), queued before it was refused at ask.
            refused = refused_reason(exc)
            problem = f"refused ({refused})" if refused else type(exc).__name__
        attempts = row.attempts + 1
        self.failed.inc()
        # A receiver that said how long to leave it alone is not asked sooner.
        wait = max(backoff(attempts), asked)
        log.warning("webhook %s to %s not taken (%s); attempt %d, next in %.0f s", row.key, host_of(row.url),
                    problem, attempts, wait)
        try:
            await self.store.run(retry_at, self.store, row.id, attempts, int((self.clock() + wait) * 1000))
        except Exception:  # noqa: BLE001 - a lost retry time only means trying again sooner
            log.warning("could not record the retry of webhook %s", row.key, exc_info=True)
        return False, asked

    def _drop(self, row: Delivery, why: str) -> None:
        delivered(self.store, row.id)
        self.dropped.inc()
        log.warning("webhook %s to %s dropped: %s", row.key, host_of(row.url), why)


# What of a receiver's answer is read: its status says all, and a body read
# whole would let a receiver make the bridge hold gigabytes.
ANSWER_READ = 64 * 1024


async def _drain(response: aiohttp.ClientResponse) -> None:
    """Read a short answer to its end (its connection can be used again);
    close the connection instead on a longer one, or on one that stalls or
    breaks before its end: a 2xx whose body came slowly is still taken, not
    sent again and again."""
    left = ANSWER_READ
    try:
        while left > 0:
            chunk = await response.content.read(left)  # what has come, up to ``left``
            if not chunk:
                return
            left -= len(chunk)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        pass
    response.close()
