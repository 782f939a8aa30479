"""Who may answer is judged by the room's members as the timeline has them
at each answer: the members read at start are the room's then, ahead of
the events read next after a downtime (``membership.MembersThen``)."""

from __future__ import annotations

import asyncio
from typing import Any

from helpers.timeline import BOT, MODERATOR, PEOPLE, ROOM, Room, Transport, answer, redact

ANA, BO, CY = PEOPLE
T0 = 1_800_000_000_000


class LeftTransport(Transport):
    """The room as read at start: Bo has left since.  ``event_context`` is
    the homeserver's ``/context`` of the events it has (``has``: event id ->
    the event as it has it, its sender joined there)."""

    def __init__(self, has: dict[str, dict[str, Any]]) -> None:
        super().__init__()
        self.has = has
        self.asked: list[tuple[str, str]] = []

    async def joined_members(self, room_id: str) -> set[str]:
        return {ANA, CY, MODERATOR, BOT}

    async def event_context(self, room_id: str, event_id: str) -> dict[str, Any] | None:
        event = self.has.get(event_id)
        self.asked.append((event_id, event["sender"] if event else "?"))
        if event is None:
            return None
        return {"event": event, "state": [member("$join", event["sender"], 0, "join")]}


def member(event_id: str, user: str, ts: int, membership: str) -> dict[str, Any]:
    return {"event_id": event_id, "room_id": ROOM, "sender": user, "origin_server_ts": ts,
            "type": "m.room.member", "state_key": user, "content": {"membership": membership}}


def handled(room: Room, transport: LeftTransport, events: list[dict[str, Any]]) -> dict[str, tuple]:
    """The events prepared and judged as a transport hands them over; event id -> (outcome, reason)."""
    room.pipeline.transport = transport
    asyncio.run(room.pipeline.load_members(ROOM))
    prepared = asyncio.run(room.pipeline.prepare([dict(e) for e in events]))
    room.pipeline.process(prepared)
    return {event_id: (outcome, reason) for event_id, outcome, reason in
            room.store.db.execute("SELECT event_id, outcome, reason FROM answer_log").fetchall()}


def test_an_answer_sent_before_its_sender_left_is_judged_as_from_a_member(tmp_path):
    room = Room(tmp_path)
    bos = answer("$bo", BO, T0, "main")
    transport = LeftTransport({"$bo": bos})
    outcomes = handled(room, transport, [bos, member("$left", BO, T0 + 1, "leave"),
                                         answer("$ana", ANA, T0 + 2, "stable")])
    assert outcomes["$bo"] == ("accepted", None)
    assert outcomes["$ana"] == ("accepted", None)
    assert transport.asked == [("$bo", BO)]  # the members are not asked after


def test_an_event_the_homeserver_does_not_place_there_is_refused(tmp_path):
    room = Room(tmp_path)
    transport = LeftTransport({})
    assert handled(room, transport, [answer("$forged", BO, T0, "main")])["$forged"] == \
        ("refused", "sender_not_allowed")


def test_a_push_reusing_the_id_of_a_real_event_of_someone_who_left_is_not_theirs(tmp_path):
    """A forged push (appservice: whoever holds the hs_token) of an answer
    from Bo, who left, under the id of his join or of a message of his: the
    homeserver has that id, from Bo, but not that event."""
    room = Room(tmp_path)
    join = member("$join", BO, T0, "join")
    chat = {**answer("$chat", BO, T0, "main"), "content": {"msgtype": "m.text", "body": "hello all"}}
    transport = LeftTransport({"$join": join, "$chat": chat})
    outcomes = handled(room, transport, [answer("$join", BO, T0 + 1, "stable"), answer("$chat", BO, T0 + 2, "stable")])
    assert outcomes == {"$join": ("refused", "sender_not_allowed"), "$chat": ("refused", "sender_not_allowed")}


def test_an_event_decrypted_here_is_his_when_the_homeserver_has_its_ciphertext(tmp_path):
    from bridge.service.encryption.marks import DEVICE

    room = Room(tmp_path)
    sealed = {"event_id": "$bo", "room_id": ROOM, "sender": BO, "origin_server_ts": T0, "type": "m.room.encrypted",
              "content": {"algorithm": "m.megolm.v1.aes-sha2", "ciphertext": "..."}}
    decrypted = {**answer("$bo", BO, T0, "main"), DEVICE: {"device_id": "D", "cross_signed": True}}
    assert handled(room, LeftTransport({"$bo": sealed}), [decrypted])["$bo"] == ("accepted", None)


def test_a_member_who_joined_earlier_in_the_batch_is_not_asked_after(tmp_path):
    room = Room(tmp_path)
    transport = LeftTransport({})
    outcomes = handled(room, transport, [member("$back", BO, T0, "join"), answer("$bo", BO, T0 + 1, "main")])
    assert outcomes["$bo"] == ("accepted", None)
    assert transport.asked == []


def test_with_answerers_configured_membership_is_never_asked_after(tmp_path):
    room = Room(tmp_path)
    room.pipeline.answerers = frozenset({BO})
    transport = LeftTransport({})
    assert handled(room, transport, [answer("$bo", BO, T0, "main")])["$bo"] == ("accepted", None)
    assert transport.asked == []


def test_what_was_asked_after_is_kept_for_events_judged_later_and_bounded(tmp_path):
    """Kept past the batch (a file's event is judged apart, later), the newest only."""
    room = Room(tmp_path)
    sent = [answer(f"$e{n}", BO, T0 + n, "main") for n in range(5000)]
    transport = LeftTransport({event["event_id"]: event for event in sent})
    room.pipeline.transport = transport
    asyncio.run(room.pipeline.load_members(ROOM))
    asyncio.run(room.pipeline.prepare(sent))
    assert len(room.pipeline.members_then) == 4096 and "$e4999" in room.pipeline.members_then


class OutTransport(LeftTransport):
    """The bridge was put out of the room before this start: its members can't be read."""

    async def joined_members(self, room_id: str) -> set[str]:
        raise PermissionError("not in the room")


def test_an_answer_in_a_room_the_bridge_was_put_out_of_before_the_start_is_judged_as_from_a_member(tmp_path):
    # Its members never read this run, the answer was refused as from no
    # member: for good, invited back or not.  Chatter there is not asked after.
    room = Room(tmp_path)
    anas = answer("$ana", ANA, T0, "main")
    chatter = {"event_id": "$chat", "room_id": ROOM, "sender": CY, "origin_server_ts": T0 + 1,
               "type": "m.room.message", "content": {"msgtype": "m.text", "body": "hello"}}
    transport = OutTransport({"$ana": anas, "$chat": chatter})
    room.pipeline.transport = transport
    room.pipeline.members.pop(ROOM, None)
    prepared = asyncio.run(room.pipeline.prepare([dict(anas), dict(chatter),
                                                  member("$kick", BOT, T0 + 2, "leave")]))
    room.pipeline.process(prepared)
    outcomes = {event_id: (outcome, reason) for event_id, outcome, reason in
                room.store.db.execute("SELECT event_id, outcome, reason FROM answer_log").fetchall()}
    assert outcomes["$ana"] == ("accepted", None)
    assert transport.asked == [("$ana", ANA)]


def test_what_a_batch_changed_while_the_members_were_read_is_not_undone_by_the_read(tmp_path):
    """A room's members and power levels are read at a join (an invite's, a
    room joined late) while transactions go on.  A batch judged meanwhile,
    with Bo made a moderator and Cy joining, was undone when the read the
    homeserver had answered before them came back: Bo's redaction of Ana's
    answer counted for nothing, and each of Cy's answers was asked after at
    the homeserver.  Now what came meanwhile is applied over the read."""
    room = Room(tmp_path)
    room.deliver([answer("$ana", ANA, T0, "main")])
    cys = answer("$cy", CY, T0 + 4, "stable")

    class ReadBefore(LeftTransport):
        """Answers the read as the room was before the batch (Bo no moderator, Cy not in)."""

        def __init__(self) -> None:
            super().__init__({"$cy": cys})
            self.reading, self.answered = asyncio.Event(), asyncio.Event()

        async def joined_members(self, room_id: str) -> set[str]:
            self.reading.set()
            await self.answered.wait()
            return {ANA, BO, MODERATOR, BOT}

        async def power_levels(self, room_id: str) -> dict[str, Any]:
            await self.answered.wait()
            return {"users": {MODERATOR: 50, BOT: 100}, "redact": 50}

    transport = ReadBefore()
    room.pipeline.transport = transport
    promoted = {"event_id": "$power", "room_id": ROOM, "sender": MODERATOR, "origin_server_ts": T0 + 1,
                "type": "m.room.power_levels", "state_key": "",
                "content": {"users": {MODERATOR: 50, BO: 50, BOT: 100}, "redact": 50}}

    async def joined_while_a_batch_goes_on() -> None:
        reading = asyncio.ensure_future(room.pipeline.load_members(ROOM))
        await transport.reading.wait()
        # A transaction judged meanwhile, on the store's thread as the bridge judges them.
        await room.store.run(room.pipeline.process, [promoted, member("$cy-in", CY, T0 + 2, "join")])
        transport.answered.set()
        await reading
        await room.store.run(room.pipeline.process, [redact("$r", BO, T0 + 3, "$ana")])
        withdrawn.append(room.record())
        await room.store.run(room.pipeline.process, await room.pipeline.prepare([dict(cys)]))

    withdrawn: list[Any] = []
    asyncio.run(joined_while_a_batch_goes_on())
    assert withdrawn == [None]  # Ana's answer withdrawn by Bo, a moderator now
    assert room.record()["source"]["sender"] == CY
    assert transport.asked == []  # Cy a member by the bridge's own count
