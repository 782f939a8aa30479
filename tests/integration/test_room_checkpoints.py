"""``verify --room``'s read of the checkpoints a room holds, against Synapse:
through a stretch of the room's history hidden from the bridge."""

from __future__ import annotations

from types import SimpleNamespace

from bridge.service.auditing.checkpoints import STATE_TYPE
from bridge.service.auditing.roomstate import read_room_checkpoints

ORIGIN = "example.org/askwright-bridge/a"


async def test_checkpoints_before_a_stretch_of_history_hidden_from_the_bridge_are_read(synapse, person) -> None:
    """The bridge was out of a room whose history members see only from
    their join while 250 checkpoint events were sent there (whole pages
    of them hidden from it, read 100 at a time: Synapse answers that page empty, with a token
    to go on from).  ``verify --room`` stopped at that page, and the
    checkpoints the bridge sent before never reached the check."""
    bot, owner = person(), person()
    room = synapse.create_room(bot.token, invite=[owner.user_id], initial_state=[
        {"type": "m.room.history_visibility", "state_key": "", "content": {"history_visibility": "joined"}}],
        power_level_content_override={"users": {owner.user_id: 100}})
    synapse.join(owner.token, room)

    async def checkpoint(who, note: str) -> None:
        sent = await who.client.room_put_state(room, STATE_TYPE, {"checkpoint": note}, state_key=ORIGIN)
        assert getattr(sent, "event_id", None), sent

    await checkpoint(bot, "before")
    left = await bot.client.room_leave(room)
    assert not hasattr(left, "status_code"), left
    for n in range(250):
        await checkpoint(owner, f"hidden {n}")
    synapse.invite(owner.token, room, bot.user_id)
    synapse.join(bot.token, room)
    await checkpoint(bot, "after")

    config = SimpleNamespace(homeserver=SimpleNamespace(url=synapse.url), appservice=SimpleNamespace(enabled=False),
                             bot=SimpleNamespace(access_token=bot.token, user_id=bot.user_id))
    cut: list[tuple[str, int]] = []
    user, notes = await read_room_checkpoints(config, on_cut=lambda room, read: cut.append((room, read)))
    assert user == bot.user_id
    assert [(note.sender, note.note) for note in notes if note.room == room] == [(bot.user_id, "after"),
                                                                                (bot.user_id, "before")]
    assert cut == []
