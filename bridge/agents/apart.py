"""The agents' blocking set work (lint, the set's writes, listing) kept off
the event loop.

A questions.json may be 16 MB: linting one of tens of thousands of
questions takes seconds, and on the event loop that stopped everything it
serves (``/health``, every other agent, the transport) for as long.  So
that work runs in a small pool of threads, awaited, and an agent's calls
take their turn one at a time: one token holder's big sets queue behind
each other, not in front of every other agent's.  A thread still shares
the interpreter lock, and parsing and validating a big document holds it
for most of a second at a time: a big set is judged in a process of its
own (``in_a_process``), its thread waiting with the lock free.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import multiprocessing
import threading
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

WORKERS = 2  # agents at once; the others' calls wait for a thread, never for the loop


class Apart:
    def __init__(self, workers: int = WORKERS) -> None:
        self._workers = workers
        self._pool: ThreadPoolExecutor | None = None  # started by the first call
        self._turns: dict[str, asyncio.Lock] = {}

    async def run(self, agent: str, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` in the pool, after ``agent``'s calls before it."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix="agent-sets")
        turn = self._turns.setdefault(agent, asyncio.Lock())
        async with turn:
            return await asyncio.get_running_loop().run_in_executor(
                self._pool, functools.partial(fn, *args, **kwargs))


_processes: ProcessPoolExecutor | None = None  # started by the first big set
_starting = threading.Lock()


def in_a_process(fn: Callable[..., T], /, *args: Any) -> T:
    """``fn(*args)`` (a module-level function; its arguments and result cross
    by pickle) in a process of the pool, waited for; in this thread when the
    pool broke (a worker killed), which is started again for the next."""
    global _processes
    with _starting:
        if _processes is None:
            # Spawned, not forked: a fork of a process with threads may copy a lock held.
            _processes = ProcessPoolExecutor(max_workers=WORKERS, mp_context=multiprocessing.get_context("spawn"))
        pool = _processes
    try:
        return pool.submit(fn, *args).result()
    except BrokenProcessPool:
        log.warning("the processes judging big sets stopped; this one is judged here, and they start again")
        with _starting:
            if _processes is pool:
                _processes = None
        return fn(*args)
