"""The webhooks' DNS lookups, on threads of their own, each bounded, and
each agent's on threads of its own.

``getaddrinfo`` blocks a thread until the resolver gives up (10 to 40 s for
a name whose servers never answer), and asyncio runs it in the default
executor, the threads every ``asyncio.to_thread`` of the bridge shares (its
file writes, the poster loading sets, matrix-nio's reconnections).  An
agent naming callbacks on such a domain, at every ``ask`` and every
delivery, filled those threads: the wait on the coroutine was bounded, the
thread's was not.  Here lookups queue among themselves only, and a caller
waits ``LOOKUP_SECONDS`` at most.

Nor does one agent's lookup wait behind another's: all lookups once shared
four threads, and a caller's bound counted its time queued, so one agent's
deliveries to a few such names held all four, and every other agent's
lookup timed out in the queue ("no address"), three in a row opening its
circuit.  Each agent (``on_behalf_of``, at its deliveries, its asks and
the start's check of its callbacks; any lookup made for no agent as one
more) has ``PER_AGENT`` threads, and
apart from them ``SLOW_PER_AGENT`` for its names whose lookup outlasted
``LOOKUP_SECONDS`` lately, so those do not crowd out the agent's own names
that answer.  The same name looked up by the same agent at once is one
lookup, whoever waits for it: a name holds one thread, not one a delivery.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from aiohttp.abc import AbstractResolver, ResolveResult

LOOKUP_SECONDS = 5.0
PER_AGENT = 2          # threads for one agent's lookups
SLOW_PER_AGENT = 1     # ... and apart, for its names that outlasted LOOKUP_SECONDS within SLOW_FOR
SLOW_FOR = 300.0
SLOW_KEPT = 4096       # names remembered as slow, at most (the oldest forgotten first)
_NUMERIC = socket.AI_NUMERICHOST | socket.AI_NUMERICSERV

_WHOSE: ContextVar[str] = ContextVar("lookups_whose", default="")


@contextmanager
def on_behalf_of(agent: str) -> Iterator[None]:
    """Lookups made inside (and in the tasks started inside) are ``agent``'s:
    they take its threads, and wait behind its lookups only."""
    token = _WHOSE.set(agent)
    try:
        yield
    finally:
        _WHOSE.reset(token)


class _Share:
    """One agent's threads: for its names, and for its names lately slow."""

    def __init__(self) -> None:
        self.names = ThreadPoolExecutor(max_workers=PER_AGENT, thread_name_prefix="webhook-dns")
        self.slow = ThreadPoolExecutor(max_workers=SLOW_PER_AGENT, thread_name_prefix="webhook-dns-slow")


class _Running:
    def __init__(self, future: Future[list[tuple[Any, ...]]]) -> None:
        self.future = future
        self.waiters = 0


_lock = threading.RLock()  # (a future done already calls its callback at once, under the lock)
_shares: dict[str, _Share] = {}
_running: dict[tuple[Any, ...], _Running] = {}
_slow: OrderedDict[str, float] = OrderedDict()  # name -> when a lookup of it last outlasted LOOKUP_SECONDS


def _is_slow(host: str) -> bool:
    since = _slow.get(host)
    return since is not None and time.monotonic() - since < SLOW_FOR


def _look(host: str, port: int, options: dict[str, Any]) -> list[tuple[Any, ...]]:
    began = time.monotonic()  # from when the thread takes it: time queued is no fault of the name's
    try:
        return socket.getaddrinfo(host, port, **options)
    finally:
        ended = time.monotonic()
        with _lock:
            if ended - began >= LOOKUP_SECONDS:
                _slow[host] = ended
                _slow.move_to_end(host)
                while len(_slow) > SLOW_KEPT:
                    _slow.popitem(last=False)
            else:
                _slow.pop(host, None)


def _forget(key: tuple[Any, ...], running: _Running) -> None:
    with _lock:
        if _running.get(key) is running:
            del _running[key]


def _waiter(future: Future[list[tuple[Any, ...]]], loop: asyncio.AbstractEventLoop) -> asyncio.Future[Any]:
    """An asyncio future for one caller of a lookup others may wait for too:
    cancelling it (the caller's bound) leaves the lookup to the others."""
    waiter: asyncio.Future[Any] = loop.create_future()

    def settle() -> None:
        if waiter.done():
            return
        if future.cancelled():
            waiter.set_exception(asyncio.TimeoutError())
        elif future.exception() is not None:
            waiter.set_exception(future.exception())  # type: ignore[arg-type]
        else:
            waiter.set_result(future.result())

    def done(_future: Future[Any]) -> None:
        try:
            loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the loop closed meanwhile: nobody waits
            pass

    future.add_done_callback(done)
    return waiter


async def lookup(host: str, port: int, **options: Any) -> list[tuple[Any, ...]]:
    """``socket.getaddrinfo`` on the threads of the agent it is made for
    (``on_behalf_of``); TimeoutError past LOOKUP_SECONDS."""
    whose = _WHOSE.get()
    key = (whose, host, port, tuple(sorted(options.items())))
    with _lock:
        running = _running.get(key)
        if running is None:
            share = _shares.get(whose)
            if share is None:
                share = _shares[whose] = _Share()
            pool = share.slow if _is_slow(host) else share.names
            running = _running[key] = _Running(pool.submit(_look, host, port, dict(options)))
            running.future.add_done_callback(lambda _f, key=key, running=running: _forget(key, running))
        running.waiters += 1
        waiter = _waiter(running.future, asyncio.get_running_loop())
    try:
        return await asyncio.wait_for(waiter, LOOKUP_SECONDS)
    finally:
        with _lock:
            running.waiters -= 1
            if running.waiters == 0:
                running.future.cancel()  # still queued and nobody waits: never made (a running one runs out)


class LookupsApart(AbstractResolver):
    """aiohttp's resolver for the webhooks' connections, through ``lookup``."""

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        try:
            infos = await lookup(host, port, type=socket.SOCK_STREAM, family=family, flags=socket.AI_ADDRCONFIG)
        except asyncio.TimeoutError:
            raise OSError(f"no address for {host} within {LOOKUP_SECONDS:.0f} s") from None
        return [ResolveResult(hostname=host, host=address[0], port=address[1], family=found, proto=proto,
                              flags=_NUMERIC)
                for found, _type, proto, _name, address in infos
                if found in (socket.AF_INET, socket.AF_INET6) and len(address) >= 2]

    async def close(self) -> None:
        pass
