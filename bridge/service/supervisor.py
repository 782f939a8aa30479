"""Every long-lived background task of the bridge runs under one supervisor.

A task that raises is logged with its traceback, counted
(``askwright_bridge_task_restarts_total{task}``) and started again after a
backoff (1 s doubling to 60 s; back to 1 s once it has run a minute without
failing), so one failure (a store that restarted, a bug hit by one input)
costs that task a pause, never the rest of the bridge its webhooks, its
reminders or its folder watch for good.  A task that returns is finished
and not restarted; one cancelled or stopped is stopped.  ``view`` is what
``/health`` and ``status`` show of each task.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter

from bridge.service.eventwait import set_within

log = logging.getLogger(__name__)

FIRST_DELAY = 1.0
MAX_DELAY = 60.0
HEALTHY_AFTER = 60.0  # seconds without failing that reset the backoff

RUNNING = "running"
RESTARTING = "restarting"  # raised; waiting for its backoff before running again
FINISHED = "finished"
STOPPED = "stopped"


@dataclass
class TaskState:
    state: str = RUNNING
    restarts: int = 0
    last_error: str | None = None
    failed_at: float | None = None  # unix seconds of the last failure

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state, "restarts": self.restarts}
        if self.last_error is not None:
            out["last_error"] = self.last_error
            out["failed_at"] = self.failed_at
        return out


class Fatal(Exception):
    """Raised by a task when nothing restarting it mends (the homeserver
    refuses the bridge's token): the bridge stops with it."""


class Supervisor:
    def __init__(self, registry: Any = None, *, first_delay: float = FIRST_DELAY, max_delay: float = MAX_DELAY,
                 clock: Callable[[], float] = time.monotonic):
        self.first_delay = first_delay
        self.max_delay = max_delay
        self.clock = clock
        self.states: dict[str, TaskState] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.restarts = Counter("askwright_bridge_task_restarts",
                                "Background tasks that raised and were started again, by task.", ["task"],
                                registry=registry) if registry is not None else None

    def spawn(self, name: str, run: Callable[[], Awaitable[Any]], stop: asyncio.Event | None = None) -> asyncio.Task[None]:
        """Run ``run()`` under supervision as the task ``name``; ``stop`` set:
        no more restarts.  The returned task ends when ``run`` returns, when
        it raises after ``stop`` is set, or when the task is cancelled."""
        state = self.states[name] = TaskState()
        task = asyncio.ensure_future(self._keep(name, state, run, stop or asyncio.Event()))
        self.tasks[name] = task
        task.add_done_callback(lambda done: self.tasks.pop(name, None) if self.tasks.get(name) is done else None)
        return task

    async def _keep(self, name: str, state: TaskState, run: Callable[[], Awaitable[Any]], stop: asyncio.Event) -> None:
        delay = self.first_delay
        while True:
            state.state = RUNNING
            started = self.clock()
            try:
                await run()
            except asyncio.CancelledError:
                state.state = STOPPED
                raise
            except Fatal as exc:
                state.last_error, state.failed_at, state.state = str(exc)[:500], time.time(), STOPPED
                raise
            except Exception as exc:  # noqa: BLE001 - the supervisor's whole job
                state.last_error = f"{type(exc).__name__}: {exc}"[:500]
                state.failed_at = time.time()
                if stop.is_set():
                    log.warning("background task %s failed while stopping: %s", name, state.last_error)
                    state.state = STOPPED
                    return
                if self.clock() - started >= HEALTHY_AFTER:
                    delay = self.first_delay
                state.state = RESTARTING
                state.restarts += 1
                if self.restarts is not None:
                    self.restarts.labels(task=name).inc()
                log.exception("background task %s failed; starting it again in %.0f s", name, delay)
                if await set_within(stop, delay):
                    state.state = STOPPED
                    return
                delay = min(delay * 2, self.max_delay)
                continue
            state.state = STOPPED if stop.is_set() else FINISHED
            return

    def view(self) -> dict[str, dict[str, Any]]:
        """Each task's state, restarts and last error (for /health and status)."""
        return {name: state.as_dict() for name, state in sorted(self.states.items())}

    def troubled(self) -> list[str]:
        return [name for name, state in self.states.items() if state.state == RESTARTING]

    async def close(self) -> None:
        tasks = list(self.tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def format_tasks(tasks: dict[str, dict[str, Any]], *, troubled_only: bool = False) -> str:
    """One line per task (as ``view`` gives them), for ``status`` and ``!ask
    status``; ``troubled_only``: just those that have failed."""
    lines = []
    for name, task in sorted(tasks.items()):
        if troubled_only and not task.get("restarts") and task.get("state") != RESTARTING:
            continue
        line = f"task {name}: {task.get('state')}"
        if task.get("restarts"):
            line += f", restarted {task['restarts']} time{'s' if task['restarts'] != 1 else ''}"
        if task.get("last_error"):
            line += f" (last error: {task['last_error']})"
        lines.append(line + "\n")
    return "".join(lines)
