"""An invite sent before the bridge's very first start is answered by it,
against a real Synapse: the usual order (an operator invites the bot, then
starts it).  The first sync of a new bridge showed the invite, only its
token was kept, and no sync after that token shows the invite again: the
bridge never joined.  An admin's direct message is the room nothing else
at a start joins (a configured room is joined by the start anyway)."""

from __future__ import annotations

import pytest

from helpers.attack import text_set
from helpers.harness import Bridge, unique
from helpers.direct import bridge_answers_in_direct

pytestmark = pytest.mark.integration


async def test_an_admins_invite_sent_before_the_first_start_is_joined(synapse, tmp_path, person):
    bot = synapse.register(unique("askbot"))
    alice = person()
    room = synapse.create_room(alice.token, invite=[bot["user_id"]])
    direct = synapse.create_room(alice.token, invite=[bot["user_id"]], is_direct=True)
    bridge = Bridge(synapse=synapse, workdir=tmp_path, room_id=room, bot=bot,
                    extra_config={"admins": [alice.user_id]})
    bridge.sets_root.mkdir()
    try:
        bridge.add_set(text_set("alpha", 1))
        bridge.start()  # its first start: no sync token in its store yet
        await bridge.wait_questions(alice, 1)

        await bridge_answers_in_direct(alice, bot["user_id"], direct)
        bridge.check_alive()
    finally:
        bridge.kill()
