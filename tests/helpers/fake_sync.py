"""For fake homeservers at the client seam that answer ``/sync``: bot mode
reads a plain room's sync itself (``SyncBatch``, through nio's request path,
``client._send``) and lets nio read it when encryption is on
(``client.sync``).  A fake defines ``sync_body(timeout, sync_filter, since)``
returning the response's JSON body; both paths are answered from it, the
first from the query the bridge really sent."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from nio import SyncResponse


class SyncBodies:
    access_token = "fake-token"

    async def sync_body(self, timeout: int, sync_filter: Any, since: str | None) -> dict[str, Any]:
        raise NotImplementedError

    async def sync(self, timeout: int, sync_filter: Any, since: str | None) -> SyncResponse:
        return SyncResponse.from_dict(await self.sync_body(timeout, sync_filter, since))

    async def _send(self, response_class: Any, method: str, path: str, timeout: Any = None) -> Any:
        url = urlsplit(path)
        assert method == "GET" and url.path.endswith("/sync"), path
        query = dict(parse_qsl(url.query))
        body = await self.sync_body(int(query.get("timeout", 0)),
                                    json.loads(query["filter"]) if "filter" in query else None, query.get("since"))
        return response_class.from_dict(body)
