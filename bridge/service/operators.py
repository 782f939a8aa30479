"""The operator-facing parts of a running bridge in one place: metrics and
health, management commands and reminders.

``app.serve`` creates one ``Operators``, hands its hooks to the pipeline, the
poster and the transport, starts it once the transport and the poster exist
and closes it on the way out.  Every hook is safe to call at any time: a
metric that can't be recorded or a command that fails never touches the
answers' path.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from bridge.service.admin import AdminContext, AdminDispatcher, is_command, poster_post_set
from bridge.service.config import Config
from bridge.service.heldback import counts, held_back
from bridge.service.metrics import Metrics, health_routes, start_http
from bridge.service.pacing import REFUSAL, priority
from bridge.service.reminders import DEFAULT_TICK_SECONDS, remind_set_now, reminder_loop
from bridge.service.store import LogEntry, Store

log = logging.getLogger(__name__)

Send = Callable[[str, str, dict[str, Any], str], Awaitable[str]]


class Operators:
    def __init__(self, config: Config, store: Store, metrics: Metrics | None = None):
        self.config = config
        self.store = store
        self.metrics = metrics or Metrics()
        self.admin: AdminDispatcher | None = None
        self.runner: web.AppRunner | None = None
        self.tasks: list[asyncio.Future[Any]] = []
        self._log_handler: logging.Handler | None = None
        self.metrics.held_view = lambda: counts(held_back(store))

    # -- hooks (synchronous, cheap) --------------------------------------------

    def on_batch(self, events: list[dict[str, Any]]) -> None:
        """Pipeline.process, before judging: counts and lag, and commands taken out."""
        self.metrics.observe_batch(events)
        if self.admin is not None:
            self.admin.collect(events)

    def on_outcome(self, entry: LogEntry) -> None:
        self.metrics.observe_outcome(entry)

    def on_trouble(self, kind: str, reason: str) -> None:
        self.metrics.observe_trouble(kind, reason)

    def on_write(self, seconds: float) -> None:
        self.metrics.observe_write(seconds)

    def on_posted(self, _question: Any = None) -> None:
        self.metrics.observe_posted()

    def mark_ready(self) -> None:
        """After the first sync batch or appservice transaction is handled."""
        self.metrics.mark_ready()

    @staticmethod
    def is_command(event: dict[str, Any]) -> bool:
        return is_command(event)

    def routes(self) -> web.RouteTableDef:
        """/metrics and /health for the appservice's own listener."""
        return health_routes(self.metrics)

    # -- lifetime ----------------------------------------------------------------

    async def start(self, *, send: Send, poster: Any, own_user: Callable[[str], bool], stop: asyncio.Event,
                    serve_http: bool = True) -> None:
        """Start what runs alongside the bridge.  ``serve_http`` False when the
        routes are served by the appservice listener instead."""
        self._log_handler = self.metrics.error_counter()
        logging.getLogger("bridge").addHandler(self._log_handler)
        if self.config.metrics.enabled and serve_http:
            self.runner = await start_http(self.config.metrics.listen, self.metrics)
        ctx = AdminContext(admins=frozenset(self.config.admins), sets_root=self.config.sets.root, store=self.store,
                           post_set=poster_post_set(poster),
                           remind_set=lambda set_id: remind_set_now(self.store, send, set_id))
        self.admin = AdminDispatcher(ctx, send, own_user)
        self.tasks.append(asyncio.ensure_future(self.admin.run(stop)))
        reminders = self.config.reminders
        if reminders.enabled:
            # Look often enough that a nudge is never much later than asked for.
            tick = min(DEFAULT_TICK_SECONDS, max(1.0, min(reminders.after_seconds, reminders.every_seconds) / 4))
            with priority(REFUSAL):  # nudges go after acknowledgements and questions (the task keeps it)
                self.tasks.append(asyncio.ensure_future(reminder_loop(
                    self.store, send, stop, after_seconds=reminders.after_seconds,
                    period_seconds=reminders.every_seconds, tick_seconds=tick)))

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.tasks.clear()
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None
        if self._log_handler is not None:
            logging.getLogger("bridge").removeHandler(self._log_handler)
            self._log_handler = None
