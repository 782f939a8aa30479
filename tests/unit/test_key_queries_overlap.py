"""Two key chores at once (the sync loop's, and a send's) both query the
people nio wants to query.  When one answered for a person and the other,
begun before it, failed after it, she was marked unanswered again by the
late failure, and nio, settled by the answer, never asked about her again:
her answers waited as if her homeserver were down.  The queries now go one
at a time, so a failure is followed by a query that can settle her."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from nio import KeysQueryError, KeysQueryResponse

from bridge.service.config import Encryption
from bridge.service.encryption.crypto import Crypto
from bridge.service.storage.store import Store

PERSON = "@person:example.org"


class _Devices:
    users: set[str] = set()

    def items(self) -> list[Any]:
        return []


class _Client:
    """nio's side of the chores: ``users_for_key_query`` until a query answers for them."""

    user_id, device_id = "@askbot:example.org", "BRIDGE"
    olm = object()
    should_upload_keys = should_claim_keys = False
    outgoing_to_device_messages: list[Any] = []

    def __init__(self) -> None:
        self.users_for_key_query = {PERSON}
        self.device_store = _Devices()
        self.answers: list[tuple[asyncio.Event, Any]] = []

    @property
    def should_query_keys(self) -> bool:
        return bool(self.users_for_key_query)

    async def keys_query(self) -> Any:
        release, response = self.answers.pop(0)
        await release.wait()
        if isinstance(response, KeysQueryResponse):
            self.users_for_key_query -= set(response.device_keys)
        return response


async def test_a_late_failed_query_does_not_unsettle_someone_a_later_one_answered_for(tmp_path: Path) -> None:
    store = Store(tmp_path / "bridge.sqlite")
    client = _Client()
    crypto = Crypto(client, store, Encryption(trust="all"))  # type: ignore[arg-type]
    failed, answered = asyncio.Event(), asyncio.Event()
    client.answers = [(failed, KeysQueryError("the homeserver did not answer")),
                      (answered, KeysQueryResponse(device_keys={PERSON: {}}, failures={}))]
    try:
        first = asyncio.ensure_future(crypto.maintain())
        await asyncio.sleep(0)
        second = asyncio.ensure_future(crypto.maintain())
        await asyncio.sleep(0)
        # The answer comes first, the older query's failure after it.
        answered.set()
        await asyncio.sleep(0.05)
        failed.set()
        await asyncio.gather(first, second)
        assert not crypto._devices_unread(PERSON), "settled by an answer, unsettled by an older failure"
        assert not client.users_for_key_query  # nio will not ask about her again
    finally:
        store.close()
