"""/metrics and /health over HTTP: the routes, and bot mode's own listener
for them.  Apart from ``metrics`` so the bridge loads aiohttp's server only
when something is served (metrics or the agents' API on, or appservice mode)."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from bridge.service.operators.metrics import Metrics
from bridge.service.operators.stalled import StalledWrites

log = logging.getLogger(__name__)


class _ClientFaults(logging.Filter):
    """A request the client got wrong (not HTTP, a bad header, a Content-Length
    that is no number) is the client's fault: aiohttp answers it 400 and
    logs it at ERROR with a traceback; here it becomes one INFO line."""

    def filter(self, record: logging.LogRecord) -> bool:
        from aiohttp.http_exceptions import HttpProcessingError
        from aiohttp.web_protocol import RequestPayloadError

        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, RequestPayloadError):
            # A body that does not decode, logged again by aiohttp as it reads
            # what is left of it after the answer (400) went out: the fault is its cause.
            exc = exc.__cause__
        if isinstance(exc, HttpProcessingError) and 400 <= (exc.code or 400) < 500:
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg = f"{record.getMessage()}: {exc.code} {_fault_kind(exc.message)}"
            record.args, record.exc_info, record.exc_text = None, None, None
        return True


def _fault_kind(message: object) -> str:
    """What kind of fault, never what was sent: aiohttp's message quotes the
    offending bytes after a colon, and that may be an Authorization header."""
    kind = re.split(r"[:'\"]", " ".join(str(message).split()), maxsplit=1)[0].strip()
    return kind[:120] or "bad request"


# A connection that sends nothing (or nothing more) is closed after this:
# aiohttp's own default is an hour, so a thousand silent connections held
# every descriptor a service gets by default.  (A request being handled, a
# long poll, is not idle.)
IDLE_SECONDS = 75.0


def runner_for(app: web.Application, idle: float | None = None) -> web.AppRunner:
    """The runner of each of the bridge's listeners: client faults logged as
    one line, idle connections closed (after ``idle`` seconds, else
    ``IDLE_SECONDS``), and those whose client stopped reading a response cut
    off (``stalled``)."""
    quiet_client_faults()
    StalledWrites().install(app)
    return web.AppRunner(app, access_log=None, keepalive_timeout=IDLE_SECONDS if idle is None else idle)


def quiet_client_faults() -> None:
    """Install the filter on aiohttp's server logger, once (every listener of the bridge uses that logger)."""
    logger = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, _ClientFaults) for f in logger.filters):
        logger.addFilter(_ClientFaults())


def health_routes(state: Metrics) -> web.RouteTableDef:
    """GET /metrics (text exposition) and GET /health ({"live", "ready"}, what
    is held back and each background task's state; 200 when ready, 503
    before), to add to any aiohttp application."""
    routes = web.RouteTableDef()

    @routes.get("/metrics")
    async def metrics(_request: web.Request) -> web.Response:
        # CONTENT_TYPE_LATEST carries a charset, which aiohttp wants separately.
        content_type, _, params = CONTENT_TYPE_LATEST.partition(";")
        charset = params.partition("charset=")[2].strip() or "utf-8"
        return web.Response(body=state.exposition(), content_type=content_type.strip(), charset=charset)

    @routes.get("/health")
    async def health(_request: web.Request) -> web.Response:
        # Held-back items do not make the bridge unready: everything else goes on.
        body: dict[str, Any] = {"live": True, "ready": state.ready}
        if state.role is not None:
            body["role"] = state.role
        if state.held_now is not None:
            body["held"] = state.held_now
        if state.silent_seconds is not None:
            # Bot mode: a long poll comes back within 30 s, so much more says the homeserver is not answering.
            body["homeserver_silent_seconds"] = round(state.silent_seconds, 1)
        unreached = state.unreached
        if unreached is not None:
            # Appservice mode: answers still come, from a look into the rooms every 30 s.
            body["homeserver_cannot_reach_bridge"] = {"seconds": round(max(0.0, state.clock() - unreached[0]), 1),
                                                      "error": unreached[1]}
        removed = state.rooms_removed() if state.rooms_removed is not None else None
        if removed:
            # Kicked or banned: nothing is read or answered there until it is invited back.
            body["removed_from_rooms"] = removed
        trouble = state.store_trouble() if state.store_trouble is not None else None
        if trouble is not None:
            # No instance can lead while the shared store's database can't be reached: say so, not only "standby".
            body["store_unreachable"] = {"seconds": round(trouble[0], 1), "error": trouble[1]}
        failing = state.failing
        if failing is not None:
            # Events are not made durable now (retried meanwhile): answers wait.
            body["batches_failing"] = {"seconds": round(state.failing_seconds, 1), "error": failing[1]}
        if state.tasks_view is not None:
            # A task restarting does not make the bridge unready either: it is shown, counted and retried.
            body["tasks"] = state.tasks_view()
        return web.json_response(body, status=200 if state.ready else 503)

    return routes


def health_app(state: Metrics, extra: Iterable[web.AbstractRouteDef] = ()) -> web.Application:
    app = web.Application()
    app.add_routes(health_routes(state))
    app.add_routes(list(extra))
    return app


async def start_http(listen: str | tuple[str, int], state: Metrics,
                     extra: Iterable[web.AbstractRouteDef] = ()) -> web.AppRunner:
    """Serve /metrics and /health (and ``extra`` routes: the agents') on
    ``listen`` ("host:port"); bot mode's listener.  Stop it with ``await runner.cleanup()``."""
    if isinstance(listen, str):
        host, _, port = listen.rpartition(":")
        host, port_number = host or "127.0.0.1", int(port)
    else:
        host, port_number = listen
    runner = runner_for(health_app(state, extra))
    await runner.setup()
    site = web.TCPSite(runner, host, port_number)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    log.info("metrics and health on http://%s:%d/metrics and /health", host, port_number)
    return runner
