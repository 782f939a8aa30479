"""The bare client of ``catchup.py``, as its own process: matrix-nio and the
standard library only, so its time from process start is the interpreter,
matrix-nio and the homeserver, and nothing of the bench or the bridge.

    python benchmarks/_bare_client.py URL USER_ID TOKEN SINCE COUNT FILTER_JSON PAGE LEAVE_OUT

It catches up from SINCE the way the bridge does (a sync with the bridge's
filter, then ``/messages`` forward from the token in pages of PAGE events,
without LEAVE_OUT's messages, when the timeline is limited)
until it has seen COUNT answer events, and prints when it did (wall clock,
so the bench can place it against the process start it noted).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from nio import AsyncClient, MessageDirection, RoomMessagesResponse, SyncResponse

ANSWER_TYPE = "dev.superpipeline.question.answer.v2"


async def bare_catch_up(client: AsyncClient, since: str, count: int, sync_filter: dict[str, Any],
                        page_size: int, leave_out: str) -> tuple[float, list[tuple[float, int]]]:
    """Seconds until a bare client has seen ``count`` answer events, and (t, seen) along the way."""
    seen: set[str] = set()
    curve: list[tuple[float, int]] = [(0.0, 0)]
    started = time.perf_counter()

    def note(events: list[Any]) -> None:
        for event in events:
            if event.source.get("content", {}).get("suite_event_type") == ANSWER_TYPE:
                seen.add(event.event_id)
        curve.append((time.perf_counter() - started, len(seen)))

    token = since
    while len(seen) < count:
        response = await client.sync(timeout=0, since=token, sync_filter=sync_filter)
        if not isinstance(response, SyncResponse):
            await asyncio.sleep(0.1)
            continue
        for room_id, room in response.rooms.join.items():
            note(room.timeline.events)
            start = token if room.timeline.limited else None
            while start:
                page = await client.room_messages(room_id, start=start, end=room.timeline.prev_batch,
                                                  direction=MessageDirection.front, limit=page_size,
                                                  message_filter={"not_senders": [leave_out]})
                if not isinstance(page, RoomMessagesResponse):
                    raise RuntimeError(f"/messages failed: {page}")
                note(page.chunk)
                if not page.chunk or not page.end or page.end == start:
                    break
                start = page.end
        token = response.next_batch
    return time.perf_counter() - started, curve


async def bare_client_main(url: str, user_id: str, token: str, since: str, count: int,
                           sync_filter: dict[str, Any], page_size: int, leave_out: str) -> None:
    client = AsyncClient(url, user_id)
    client.access_token = token
    sync_started = time.time()
    seconds, curve = await bare_catch_up(client, since, count, sync_filter, page_size, leave_out)
    await client.close()
    print(json.dumps({"done_at": sync_started + seconds, "sync_s": seconds,
                      "curve": [(sync_started + t, seen) for t, seen in curve[1:]]}))



if __name__ == "__main__":
    url, user_id, token, since, count, sync_filter, page_size, leave_out = sys.argv[1:9]
    asyncio.run(bare_client_main(url, user_id, token, since, int(count), json.loads(sync_filter), int(page_size),
                                 leave_out))
