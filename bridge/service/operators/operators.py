"""The operator-facing parts of a running bridge in one place: metrics and
health, management commands and reminders, and the agents' way in (HTTP
API, MCP at /mcp, webhooks) when agents are configured.

``app.serve`` creates one ``Operators``, hands its hooks to the pipeline, the
poster and the transport, starts it once the transport and the poster exist
and closes it on the way out.  Every hook is safe to call at any time: a
metric that can't be recorded or a command that fails never touches the
answers' path.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from bridge.service.eventwait import set_within
from bridge.service.operators.admin import AdminContext, AdminDispatcher, is_command, poster_post_set
from bridge.service.config import Config, ConfigError, listen_refused
from bridge.service.storage.heldback import counts, held_back
from bridge.service.operators.metrics import Metrics
from bridge.service.transport.pacing import REFUSAL, priority
from bridge.service.operators.reminders import DEFAULT_TICK_SECONDS, remind_set_now, reminder_loop
from bridge.service.storage.store import LogEntry, Store
from bridge.service.supervisor import Supervisor

if TYPE_CHECKING:
    from aiohttp import web

log = logging.getLogger(__name__)

# Bot mode: a start that has not had its first sync by then serves /health on
# its own.  The usual start is well within it, and loads no HTTP server before
# its first sync.
EARLY_HEALTH_SECONDS = 2.0

Send = Callable[[str, str, dict[str, Any], str], Awaitable[str]]
# How old /health's held-back counts may be.
HELD_SECONDS = 1.0


class Operators:
    def __init__(self, config: Config, store: Store, metrics: Metrics | None = None):
        self.config = config
        self.store = store
        self.metrics = metrics or Metrics()
        self.admin: AdminDispatcher | None = None
        # Commands in batches handled before ``start`` (the first batch is
        # handled before the operators start): handed to the dispatcher then.
        self._early_commands: list[dict[str, Any]] = []
        self.runner: web.AppRunner | None = None
        # Bot mode's /health while the start waits on the homeserver (see ``serve_while_starting``).
        self._early: asyncio.Future[web.AppRunner | None] | None = None
        self.tasks: list[asyncio.Future[Any]] = []
        self._log_handler: logging.Handler | None = None
        self._nio_handler: logging.Handler | None = None
        self._read_held()  # before anything runs beside it: /health holds the counts from the start
        # Every long-lived background task of the bridge runs under this one.
        self.supervisor = Supervisor(self.metrics.registry)
        self.metrics.tasks_view = self.supervisor.view
        self.agents: Any = None
        if config.agents:
            from bridge.agents.front import AgentsFront  # the MCP SDK is only loaded when agents are configured

            self.agents = AgentsFront(config, store, self.metrics, self.supervisor)

    # -- hooks (synchronous, cheap) --------------------------------------------

    def on_batch(self, events: list[dict[str, Any]]) -> None:
        """Pipeline.process, before judging: counts and lag, and commands taken out."""
        self.metrics.observe_batch(events)
        if self.admin is not None:
            self.admin.collect(events)
        else:
            self._early_commands.extend(event for event in events if is_command(event))

    def on_outcome(self, entry: LogEntry) -> None:
        self.metrics.observe_outcome(entry)

    def on_trouble(self, kind: str, reason: str) -> None:
        self.metrics.observe_trouble(kind, reason)

    def on_logged(self, entry: LogEntry) -> None:
        """Pipeline, inside the batch's store transaction: the webhook outbox
        rows for the entry, committed with it.  A store error fails the batch
        (it is retried); any other trouble is logged and never refuses an answer."""
        if self.agents is None:
            return
        try:
            self.agents.outbox(entry)
        except sqlite3.Error:
            raise
        except Exception:  # noqa: BLE001 - a webhook must never cost an answer
            log.exception("queueing the webhook for %s failed", entry.event_id)

    def on_closed(self, question: Any, why: str) -> None:
        """Poster, inside the store transaction closing a question: its webhook rows."""
        if self.agents is None:
            return
        try:
            self.agents.outbox.closed(question, why)
        except sqlite3.Error:
            raise
        except Exception:  # noqa: BLE001 - a webhook must never stop a close
            log.exception("queueing the webhook for closing %s failed", getattr(question, "event_id", "?"))

    def on_set_changed(self, set_dir: str) -> None:
        """Pipeline (answers.json written) and folder watcher (questions.json
        changed): the agents' change feed, which their waits follow."""
        if self.agents is None:
            return
        try:
            self.agents.changes.publish(set_dir)
        except Exception:  # noqa: BLE001 - a wait's trouble never touches the answers' path
            log.exception("telling the waits of %s failed", set_dir)

    def on_decided(self, question: Any, record: dict[str, Any], again: int = 0) -> None:
        """Deadlines, inside the store transaction closing a decided question
        (or telling a decision that changed): ``question.decided``."""
        self._outbox("decided", question, record, again)

    def on_expired(self, question: Any, record: dict[str, Any] | None, again: int = 0) -> None:
        """Deadlines, inside the store transaction closing an expired question: ``question.expired``."""
        self._outbox("expired", question, record, again)

    def _outbox(self, what: str, question: Any, record: dict[str, Any] | None, again: int) -> None:
        if self.agents is None:
            return
        try:
            getattr(self.agents.outbox, what)(question, record, again)
        except sqlite3.Error:
            raise
        except Exception:  # noqa: BLE001 - a webhook must never stop a close
            log.exception("queueing the %s webhook for %s failed", what, getattr(question, "event_id", "?"))

    def on_write(self, seconds: float) -> None:
        self.metrics.observe_write(seconds)

    def on_posted(self, question: Any = None) -> None:
        self.metrics.observe_posted()
        if self.agents is None or question is None:
            return
        try:
            self.agents.outbox.posted(question)
        except Exception:  # noqa: BLE001 - remembering a set's owner must never stop a posting
            log.exception("noting the owner of the set of %s failed", getattr(question, "event_id", "?"))

    def mark_ready(self) -> None:
        """After the first sync batch or appservice transaction is handled."""
        self.metrics.mark_ready()

    def synced(self) -> None:
        """Bot mode, after every sync (one with nothing in it too)."""
        self.metrics.heard()
        self.metrics.mark_ready()

    @staticmethod
    def is_command(event: dict[str, Any]) -> bool:
        return is_command(event)

    def routes(self) -> list[web.AbstractRouteDef]:
        """/metrics and /health (and the agents' /v1/ and /mcp) for the appservice's own listener."""
        from bridge.service.operators.health import health_routes

        return [*health_routes(self.metrics), *(self.agents.routes() if self.agents is not None else ())]

    # -- lifetime ----------------------------------------------------------------

    def count_errors(self) -> None:
        """Errors logged from now on counted in ``errors_total``: from the start,
        so a homeserver down at start counts (its login or first sync retried)."""
        if self._log_handler is not None:
            return
        self._log_handler = self.metrics.error_counter()
        logging.getLogger("bridge").addHandler(self._log_handler)
        # The Matrix client library's own warnings (a homeserver timing out,
        # which it retries without end) are failures an operator must see too.
        self._nio_handler = self.metrics.error_counter(where="nio")
        logging.getLogger("nio").addHandler(self._nio_handler)

    def _serves_http(self) -> bool:
        return self.config.metrics.enabled or self.agents is not None

    def serve_while_starting(self, started: asyncio.Event) -> None:
        """Bot mode: /health (503, not ready) and /metrics served on their own
        when the start has not reached its first sync within
        EARLY_HEALTH_SECONDS, until ``start`` serves everything.  A homeserver
        down at start keeps the bridge retrying its login or first sync for as
        long as it is down; a probe meanwhile must see a bridge alive and not
        ready, not a refused connection (which an orchestrator's liveness
        probe takes as dead, and restarts)."""
        if self._serves_http():
            self._early = asyncio.ensure_future(self._serve_early(started))

    async def _serve_early(self, started: asyncio.Event) -> web.AppRunner | None:
        if await set_within(started, EARLY_HEALTH_SECONDS):
            return None  # the usual start: aiohttp's server is loaded only by ``start``
        from bridge.service.operators.health import start_http

        extra = self.agents.starting_routes() if self.agents is not None else ()
        try:
            return await start_http(self.config.metrics.listen_host_port, self.metrics, extra)
        except OSError as exc:  # the port taken: ``start`` meets it again and stops the bridge with it
            log.warning("/health not served while starting: %s", exc)
            return None

    async def _end_early(self) -> None:
        """The early listener closed, its port free for the whole one."""
        early, self._early = self._early, None
        if early is None:
            return
        early.cancel()
        runner = (await asyncio.gather(early, return_exceptions=True))[0]
        if runner is not None and not isinstance(runner, BaseException):
            await runner.cleanup()

    async def start(self, *, send: Send, poster: Any, own_user: Callable[[str], bool], stop: asyncio.Event,
                    serve_http: bool = True) -> None:
        """Start what runs alongside the bridge.  ``serve_http`` False when the
        routes are served by the appservice listener instead."""
        await self._end_early()
        self.count_errors()
        if self._serves_http() and serve_http:
            from bridge.service.operators.health import start_http  # aiohttp's server only when something is served

            extra = self.agents.routes() if self.agents is not None else ()
            try:
                self.runner = await start_http(self.config.metrics.listen_host_port, self.metrics, extra)
            except OSError as exc:  # the port taken, the address not this machine's: a config to change
                raise ConfigError(listen_refused("metrics.listen", self.config.metrics.listen, exc)) from None
        if self.agents is not None:
            await self.agents.start(stop, poster)
        self.tasks.append(self.supervisor.spawn("held-back", lambda: self._keep_held(stop), stop))
        ctx = AdminContext(admins=frozenset(self.config.admins), sets_root=self.config.sets.root, store=self.store,
                           post_set=poster_post_set(poster),
                           remind_set=lambda set_id: remind_set_now(self.store, send, set_id),
                           tasks=self.supervisor.view)
        admin = AdminDispatcher(ctx, send, own_user)
        await self.store.run(self._take_commands, admin)
        with priority(REFUSAL):  # replies go after the answers' acknowledgements and the questions
            self.tasks.append(self.supervisor.spawn("commands", lambda: admin.run(stop), stop))
        reminders = self.config.reminders
        if reminders.enabled:
            # Look often enough that a nudge is never much later than asked for.
            tick = min(DEFAULT_TICK_SECONDS, max(1.0, min(reminders.after_seconds, reminders.every_seconds) / 4))
            with priority(REFUSAL):  # nudges go after acknowledgements and questions (the task keeps it)
                self.tasks.append(self.supervisor.spawn("reminders", lambda: reminder_loop(
                    self.store, send, stop, after_seconds=reminders.after_seconds,
                    period_seconds=reminders.every_seconds, tick_seconds=tick), stop))

    def _read_held(self) -> None:
        """What is held back, for /health and /metrics; the last counts stay
        when the store can't be read now (PostgreSQL restarting)."""
        try:
            self.metrics.note_held(counts(held_back(self.store)))
        except sqlite3.Error as exc:
            log.debug("held-back counts not read (%s); the last ones stay", exc)

    async def _keep_held(self, stop: asyncio.Event) -> None:
        """The held-back counts read again every HELD_SECONDS, each time a job
        on the store's thread: /health answers from them at once, however
        far away the database is or however busy its connection."""
        while not await set_within(stop, HELD_SECONDS):
            await self.store.run(self._read_held)

    def _take_commands(self, admin: AdminDispatcher) -> None:
        """The dispatcher takes over the commands of the batches so far: a job
        on the store's thread, as each batch (and its ``on_batch``) is, so no
        command falls between the two."""
        self.admin = admin
        admin.collect(self._early_commands)
        self._early_commands.clear()

    async def close(self) -> None:
        await self._end_early()
        if self.agents is not None:
            await self.agents.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.tasks.clear()
        await self.supervisor.close()
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None
        if self._log_handler is not None:
            logging.getLogger("bridge").removeHandler(self._log_handler)
            logging.getLogger("nio").removeHandler(self._nio_handler)
            self._log_handler = None
