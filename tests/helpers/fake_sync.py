"""For fake homeservers at the client seam that answer ``/sync``: bot mode
reads the sync itself (``SyncBatch``, through nio's request path,
``client._send``), with encryption on or off.  A fake defines
``sync_body(timeout, sync_filter, since)`` returning the response's JSON
body; it is answered from the query the bridge really sent."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qsl, urlsplit


class SyncBodies:
    access_token = "fake-token"

    async def sync_body(self, timeout: int, sync_filter: Any, since: str | None) -> dict[str, Any]:
        raise NotImplementedError

    async def _send(self, response_class: Any, method: str, path: str, timeout: Any = None) -> Any:
        url = urlsplit(path)
        assert method == "GET" and url.path.endswith("/sync"), path
        query = dict(parse_qsl(url.query))
        body = await self.sync_body(int(query.get("timeout", 0)),
                                    json.loads(query["filter"]) if "filter" in query else None, query.get("since"))
        return response_class.from_dict(body)
