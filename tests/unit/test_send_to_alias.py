"""A set mapped to a room alias the bridge could not join: its posting fails
saying so (status and the log showed the homeserver's "not in room #..."),
without asking the homeserver to send into an alias."""

from __future__ import annotations

import pytest

from bridge.service.transport.matrix import MatrixError, NioTransport


async def test_a_send_to_an_alias_not_joined_says_it_is_not_joined_and_asks_nothing() -> None:
    asked = []

    class Client:
        user_id = "@bot:hs"

        async def room_send(self, *args, **kwargs):
            asked.append(args)
            raise AssertionError("the homeserver was asked")

    with pytest.raises(MatrixError, match=r"the room #nosuch:hs is not joined yet .*log's join warnings") as caught:
        await NioTransport(Client()).send("#nosuch:hs", "m.room.message", {"body": "q"}, "txn1")
    assert caught.value.transient and asked == []  # tried again once the room is joined
