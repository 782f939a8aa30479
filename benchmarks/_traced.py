"""The bridge with one probe: the moment each sync response (bot mode) or
transaction (appservice mode) reaches it.

    python benchmarks/_traced.py run -c CONFIG    (ASKWRIGHT_BENCH_TRACE=<file>)

Writes "<event id> <perf_counter>" for every timeline event of every sync
response, taken right after the response is read (``sync_batch`` returns):
the moment the latency bench's bare observer notes, once matrix-nio hands
the response over.  The bench splits the
bridge's overhead with it into what the homeserver's delivery costs (the
bridge's sync answered later than the observer's) and what the bridge itself
does (judging, the store, answers.json).  Nothing else of the bridge changes.
"""

from __future__ import annotations

import os
import sys
import time

from nio import AsyncClient

from bridge.service.transport import bot

_out = open(os.environ["ASKWRIGHT_BENCH_TRACE"], "a", buffering=1)


def _note(event_ids: list[str]) -> None:
    now = time.perf_counter()
    _out.write("".join(f"{event_id} {now}\n" for event_id in event_ids))


if hasattr(bot, "sync_batch"):
    _sync = bot.sync_batch

    async def _traced_sync(*args, **kwargs):  # type: ignore[no-untyped-def]
        response = await _sync(*args, **kwargs)
        _note([event.get("event_id") for event in response.events()])
        return response

    bot.sync_batch = _traced_sync  # type: ignore[assignment]
else:  # a bridge from before SyncBatch (``latency.py --against``): nio read every sync
    _nio_sync = AsyncClient.sync

    async def _traced_nio_sync(self: AsyncClient, *args, **kwargs):  # type: ignore[no-untyped-def]
        response = await _nio_sync(self, *args, **kwargs)
        rooms = getattr(getattr(response, "rooms", None), "join", None) or {}
        _note([event.event_id for room in rooms.values() for event in room.timeline.events])
        return response

    AsyncClient.sync = _traced_nio_sync  # type: ignore[method-assign]


def _trace_transactions() -> None:
    """Appservice mode: the moment each transaction's body is read, before any judging."""
    from aiohttp import web

    from bridge.service.transport.appservice import TransactionServer

    json_of = web.Request.json

    async def traced_json(self: web.Request, *args, **kwargs):  # type: ignore[no-untyped-def]
        body = await json_of(self, *args, **kwargs)
        if "/transactions/" in self.path and isinstance(body, dict):
            now = time.perf_counter()
            _out.write("".join(f"{event.get('event_id')} {now}\n" for event in body.get("events", [])
                               if isinstance(event, dict)))
        return body

    web.Request.json = traced_json  # type: ignore[method-assign]
    assert TransactionServer.transaction  # the handler that reads it, as the bridge runs


_trace_transactions()

if os.environ.get("ASKWRIGHT_BENCH_STAGES"):
    import _stages  # latency.py --stages: each batch's time, stage by stage

    _stages.install()

from bridge.cli import main  # noqa: E402

if os.environ.get("ASKWRIGHT_BENCH_PROFILE"):
    # Where the bridge's CPU goes (``latency.py --profile``): cProfile over
    # the whole run, written when SIGTERM has ended it.  The event loop's
    # thread's CPU time, not the wall clock: on a busy machine the wall clock
    # charges any call for the moments the process was not running.
    import cProfile

    profile = cProfile.Profile(time.thread_time)
    profile.enable()
    try:
        code = main(sys.argv[1:])
    finally:
        profile.disable()
        profile.dump_stats(os.environ["ASKWRIGHT_BENCH_PROFILE"])
    raise SystemExit(code)
raise SystemExit(main(sys.argv[1:]))
