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


async def test_a_send_to_a_room_without_the_slow_person_waits_for_none_of_their_query(tmp_path: Path) -> None:
    """Bob's homeserver takes 25 s to answer for his devices.  Every encrypted
    send (an acknowledgement in a room Bob never joined, too) waited for that
    query, and for the cross-signing query after it: 48 s.  A send waits only
    for its own room's people; Bob's query goes on behind it."""
    from nio.rooms import MatrixRoom

    store = Store(tmp_path / "bridge.sqlite")
    client = _Client()
    client.rooms = {}
    for room_id, members in (("!his:example.org", (PERSON, "@ana:example.org")), ("!hers:example.org",
                                                                                  ("@ana:example.org",))):
        room = MatrixRoom(room_id, client.user_id, encrypted=True)
        room.members_synced = True
        for member in members:
            room.add_member(member, None, None)
        client.rooms[room_id] = room
    crypto = Crypto(client, store, Encryption(trust="all"))  # type: ignore[arg-type]
    slow = asyncio.Event()
    client.answers = [(slow, KeysQueryResponse(device_keys={PERSON: {}}, failures={}))]
    try:
        assert await asyncio.wait_for(crypto.before_send("!hers:example.org"), 2) is True
        his = asyncio.ensure_future(crypto.before_send("!his:example.org"))
        await asyncio.sleep(0.1)
        assert not his.done()  # his room's send waits for his devices
        slow.set()
        assert await asyncio.wait_for(his, 2) is True
        assert not client.users_for_key_query
    finally:
        await crypto.close()
        store.close()
