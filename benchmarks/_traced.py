"""The bridge with one probe: the moment each sync response reaches it.

    python benchmarks/_traced.py run -c CONFIG    (ASKWRIGHT_BENCH_TRACE=<file>)

Writes "<event id> <perf_counter>" for every timeline event of every sync
response, taken right after matrix-nio hands the response over: the same
moment the latency bench's bare observer notes.  The bench splits the
bridge's overhead with it into what the homeserver's delivery costs (the
bridge's sync answered later than the observer's) and what the bridge itself
does (judging, the store, answers.json).  Nothing else of the bridge changes.
"""

from __future__ import annotations

import os
import sys
import time

from nio import AsyncClient

_sync = AsyncClient.sync
_out = open(os.environ["ASKWRIGHT_BENCH_TRACE"], "a", buffering=1)


async def _traced_sync(self: AsyncClient, *args, **kwargs):  # type: ignore[no-untyped-def]
    response = await _sync(self, *args, **kwargs)
    now = time.perf_counter()
    rooms = getattr(getattr(response, "rooms", None), "join", None) or {}
    _out.write("".join(f"{event.event_id} {now}\n" for room in rooms.values() for event in room.timeline.events))
    return response


AsyncClient.sync = _traced_sync  # type: ignore[method-assign]

from bridge.cli import main  # noqa: E402

raise SystemExit(main(sys.argv[1:]))
