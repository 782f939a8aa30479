"""How many MCP file reads run at once.

A read holds its file several times over until its response is sent (the
bytes, their base64, the JSON-RPC message, its encoding): sixteen reads of a
20 MB screenshot at once took the bridge from 107 MB to 1.2 GB.  A few run
at a time, and an agent gets only some of those turns, so one agent's burst
neither fills the bridge's memory nor keeps another agent's read waiting long.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

READS_AT_ONCE = 4
READS_PER_AGENT = 2


class ReadGate:
    def __init__(self, agent_key: str = "", at_once: int = READS_AT_ONCE, per_agent: int = READS_PER_AGENT):
        self.agent_key = agent_key  # where the request's scope names its agent
        self.per_agent = per_agent
        self._all = asyncio.Semaphore(at_once)
        self._agents: dict[Any, asyncio.Semaphore] = {}

    def turn(self, scope: Any) -> contextlib.AbstractAsyncContextManager[None]:
        """Held from the request's start until its response is sent."""
        return self.turn_of(scope.get(self.agent_key))

    @contextlib.asynccontextmanager
    async def turn_of(self, agent: Any) -> AsyncIterator[None]:
        """One of ``agent``'s turns, and one of everyone's."""
        mine = self._agents.setdefault(agent, asyncio.Semaphore(self.per_agent))
        async with mine, self._all:
            yield
