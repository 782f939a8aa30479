"""The webhooks' DNS lookups, on threads of their own, each bounded.

``getaddrinfo`` blocks a thread until the resolver gives up (10 to 40 s for
a name whose servers never answer), and asyncio runs it in the default
executor, the threads every ``asyncio.to_thread`` of the bridge shares (its
file writes, the poster loading sets, matrix-nio's reconnections).  An
agent naming callbacks on such a domain, at every ``ask`` and every
delivery, filled those threads: the wait on the coroutine was bounded, the
thread's was not.  Here lookups queue among themselves only, and a caller
waits ``LOOKUP_SECONDS`` at most.
"""

from __future__ import annotations

import asyncio
import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp.abc import AbstractResolver, ResolveResult

LOOKUP_SECONDS = 5.0
_LOOKERS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="webhook-dns")
_NUMERIC = socket.AI_NUMERICHOST | socket.AI_NUMERICSERV


async def lookup(host: str, port: int, **options: Any) -> list[tuple[Any, ...]]:
    """``socket.getaddrinfo`` on the lookups' own threads; TimeoutError past LOOKUP_SECONDS."""
    loop = asyncio.get_running_loop()
    return await asyncio.wait_for(loop.run_in_executor(
        _LOOKERS, lambda: socket.getaddrinfo(host, port, **options)), LOOKUP_SECONDS)


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
