"""For fake clients that answer ``room_messages``: the bridge reads timeline
pages through nio's request path (``client._send`` with a raw page class,
bridge.service.transport.matrix.TimelinePage), so the fake's ``_send`` turns that
request back into its ``room_messages`` call and hands the events over raw."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit


class RoomMessagesPages:
    access_token = "fake-token"

    async def _send(self, response_class: Any, method: str, path: str, response_data: tuple[Any, ...] = ()) -> Any:
        url = urlsplit(path)
        query = dict(parse_qsl(url.query))
        room_id = unquote(url.path.split("/rooms/", 1)[1].split("/", 1)[0])
        reply = await self.room_messages(  # type: ignore[attr-defined]
            room_id, start=query.get("from"), end=query.get("to"), direction=query.get("dir"),
            limit=int(query["limit"]), message_filter=json.loads(query["filter"]) if "filter" in query else None)
        raw = {"chunk": [getattr(event, "source", event) for event in reply.chunk], "start": reply.start}
        if reply.end:
            raw["end"] = reply.end
        return response_class.from_dict(raw, *response_data)
