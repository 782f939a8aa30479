"""Transactions pushed as Synapse pushes them, run as its own process:
Twisted's connection pool set up as Synapse's HTTP client sets it up (a
persistent pool whose idle connections are dropped after
``cachedConnectionTimeout``; only bodiless idempotent requests tried again
on a fresh connection, so never a transaction's PUT).

    python -m helpers.synapse_push URL HS_TOKEN POOL_IDLE BUSY_FROM BUSY_FOR

pushes transaction 1, waits ``BUSY_FROM`` seconds, is busy elsewhere for
``BUSY_FOR`` seconds (its reactor blocked, as a loaded Synapse's is), then
pushes transaction 2 at once, and prints what each push got as a JSON list:
the status, or the name of the failure."""

from __future__ import annotations

import json
import sys
import time
from io import BytesIO

from twisted.internet import defer, task
from twisted.web.client import Agent, FileBodyProducer, HTTPConnectionPool, readBody
from twisted.web.http_headers import Headers


async def push(reactor, url: str, token: str, pool_idle: float, busy_from: float, busy_for: float) -> None:
    pool = HTTPConnectionPool(reactor)  # persistent, as Synapse's
    pool.cachedConnectionTimeout = pool_idle
    agent = Agent(reactor, pool=pool)

    async def put(txn: int) -> str:
        body = FileBodyProducer(BytesIO(json.dumps({"events": []}).encode()))
        headers = Headers({b"Authorization": [f"Bearer {token}".encode()],
                           b"Content-Type": [b"application/json"]})
        try:
            response = await agent.request(b"PUT", f"{url}/_matrix/app/v1/transactions/{txn}".encode(),
                                           headers, body)
            await readBody(response)
            return str(response.code)
        except Exception as exc:  # noqa: BLE001 - what Synapse's push_bulk counts as a failed push
            return type(exc).__name__

    said = [await put(1)]
    await task.deferLater(reactor, busy_from)
    time.sleep(busy_for)  # the reactor hears nothing meanwhile: a close from the bridge waits unread
    said.append(await put(2))
    print(json.dumps(said), flush=True)
    await pool.closeCachedConnections()


if __name__ == "__main__":
    url, token, pool_idle, busy_from, busy_for = sys.argv[1:6]
    task.react(lambda reactor: defer.ensureDeferred(
        push(reactor, url, token, float(pool_idle), float(busy_from), float(busy_for))))
