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
import ctypes
import functools
import logging
import multiprocessing
import signal
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


def in_a_process(fn: Callable[..., T], /, *args: Any) -> T:
    """``fn(*args)`` (a module-level function; its arguments and result cross
    by pickle) in a process of its own, waited for.  One process a call,
    gone after it: none sits idle holding memory, and a bridge killed
    meanwhile takes it along (``_die_with_parent``).  Its start costs a few
    tenths of a second, against the seconds a big set lints.  A process
    that could not do it (killed) leaves the call to this thread."""
    try:
        # Spawned, not forked: a fork of a process with threads may copy a lock held.
        with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                 initializer=_die_with_parent) as pool:
            return pool.submit(fn, *args).result()
    except BrokenProcessPool:
        log.warning("the process judging a big set stopped; it is judged here instead")
        return fn(*args)


PR_SET_PDEATHSIG = 1  # prctl(2)


def _die_with_parent() -> None:
    """Linux: this process is killed when the bridge dies, however it dies."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: it ends with its call anyway
        pass
