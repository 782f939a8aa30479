"""Delivering the outbox: each row POSTed to its URL, signed, until the URL
takes it (any 2xx), retried with backoff across restarts, given up on after
``agent_api.webhook_drop_after`` with a log line and a metric.

The signature: ``X-Askwright-Signature: t=<unix seconds>,v1=<hex>`` where
hex is HMAC-SHA256 with the agent's webhook_secret over ``<t>.<body>``; a
receiver checks it and refuses an old ``t`` (replay).  ``Idempotency-Key``
is the same on every attempt: delivery is at least once, and the key lets a
receiver take each event once."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import random
import time
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

import aiohttp
from prometheus_client import Counter

from bridge.agents.outbox import Delivery, delivered, due, next_due, retry_at
from bridge.service.config import Agent
from bridge.service.operators.metrics import Metrics
from bridge.service.storage.store import Store

log = logging.getLogger(__name__)

MAX_BACKOFF_SECONDS = 300.0
IDLE_SECONDS = 5.0
PARALLEL = 8


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
    return min(MAX_BACKOFF_SECONDS, 2.0 ** max(0, attempts - 1)) * random.uniform(0.8, 1.2)


def host_of(url: str) -> str:
    # Logged instead of the URL, which may carry a token in its path or query.
    return urlsplit(url).netloc or "?"


class Deliverer:
    def __init__(self, store: Store, agents: Mapping[str, Agent], metrics: Metrics, *, drop_after: float,
                 timeout: float, clock: Callable[[], float] = time.time):
        self.store = store
        self.agents = agents
        self.drop_after = drop_after
        self.timeout = timeout
        self.clock = clock
        self.wake = asyncio.Event()
        self.in_flight: set[int] = set()
        r = metrics.registry
        self.sent = Counter("askwright_bridge_webhooks_delivered", "Webhook deliveries a URL took.", registry=r)
        self.failed = Counter("askwright_bridge_webhooks_failed", "Webhook attempts that failed (retried).",
                              registry=r)
        self.dropped = Counter("askwright_bridge_webhooks_dropped",
                               "Webhooks given up on after agent_api.webhook_drop_after.", registry=r)

    async def run(self, stop: asyncio.Event) -> None:
        semaphore = asyncio.Semaphore(PARALLEL)
        tasks: set[asyncio.Task[None]] = set()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout)) as http:
            try:
                while not stop.is_set():
                    self.wake.clear()
                    try:
                        rows = due(self.store, int(self.clock() * 1000))
                    except Exception:  # noqa: BLE001 - the store is busy or failing: try again shortly
                        log.exception("reading the webhook outbox failed")
                        rows = []
                    for row in rows:
                        if row.id in self.in_flight:
                            continue
                        self.in_flight.add(row.id)
                        task = asyncio.ensure_future(self._one(http, row, semaphore))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
                    await self._sleep(stop)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _sleep(self, stop: asyncio.Event) -> None:
        soonest = next_due(self.store)
        delay = IDLE_SECONDS if soonest is None else max(0.05, min(IDLE_SECONDS, soonest / 1000 - self.clock()))
        waits = [asyncio.ensure_future(self.wake.wait()), asyncio.ensure_future(stop.wait())]
        try:
            await asyncio.wait(waits, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def _one(self, http: aiohttp.ClientSession, row: Delivery, semaphore: asyncio.Semaphore) -> None:
        try:
            async with semaphore:
                await self._attempt(http, row)
        except Exception:  # noqa: BLE001 - one delivery's trouble is its own
            log.exception("webhook delivery %s failed unexpectedly", row.key)
        finally:
            self.in_flight.discard(row.id)

    async def _attempt(self, http: aiohttp.ClientSession, row: Delivery) -> None:
        agent = self.agents.get(row.agent)
        if agent is None or not agent.webhook_secret:
            self._drop(row, "its agent has no webhook_secret in the config any more")
            return
        now = self.clock()
        if now * 1000 - row.created_at > self.drop_after * 1000:
            self._drop(row, f"not taken after {row.attempts} attempts")
            return
        headers = {"Content-Type": "application/json", "Idempotency-Key": row.key,
                   "X-Askwright-Signature": signature(agent.webhook_secret, int(now), row.body),
                   "User-Agent": "askwright-bridge"}
        problem = None
        try:
            async with http.post(row.url, data=row.body, headers=headers, allow_redirects=False) as response:
                await response.read()
                if 200 <= response.status < 300:
                    delivered(self.store, row.id)
                    self.sent.inc()
                    log.info("webhook %s delivered to %s", row.key, host_of(row.url))
                    return
                problem = f"HTTP {response.status}"
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            problem = type(exc).__name__
        attempts = row.attempts + 1
        self.failed.inc()
        wait = backoff(attempts)
        log.warning("webhook %s to %s not taken (%s); attempt %d, next in %.0f s", row.key, host_of(row.url),
                    problem, attempts, wait)
        retry_at(self.store, row.id, attempts, int((self.clock() + wait) * 1000))

    def _drop(self, row: Delivery, why: str) -> None:
        delivered(self.store, row.id)
        self.dropped.inc()
        log.warning("webhook %s to %s dropped: %s", row.key, host_of(row.url), why)
