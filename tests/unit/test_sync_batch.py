"""Bot mode reads its ``/sync`` itself (``SyncBatch``), not through
matrix-nio's response objects and schema checks: the bridge gets what nio
would have handed it, a body nio would refuse or a part it would drop does
not stop the batch, and what nio's encryption must see is kept for it."""

from __future__ import annotations

from typing import Any

from nio import SyncError, SyncResponse

from bridge.service.transport.syncbatch import SyncBatch

ROOM, OTHER = "!room:example.org", "!other:example.org"
BOT = "@askbot:example.org"


def _event(event_id: str, sender: str, **content: Any) -> dict[str, Any]:
    return {"type": "m.room.message", "event_id": event_id, "sender": sender, "origin_server_ts": 1,
            "content": {"msgtype": "m.text", "body": "yes", **content}}


BODY: dict[str, Any] = {
    "next_batch": "s9",
    "rooms": {
        "join": {
            ROOM: {"timeline": {"events": [_event("$a", "@alice:example.org"), _event("$ack", BOT)],
                                "limited": True, "prev_batch": "p3"},
                   "state": {"events": []}, "ephemeral": {"events": []}},
            OTHER: {"timeline": {"events": [_event("$b", "@bob:example.org", body="no")], "limited": False}},
        },
        "invite": {"!new:example.org": {"invite_state": {"events": [
            {"type": "m.room.member", "state_key": BOT, "sender": "@alice:example.org",
             "content": {"membership": "invite"}}]}}},
    },
    "to_device": {"events": []},
}


def test_it_reads_what_nio_would_hand_over() -> None:
    ours, nios = SyncBatch.from_dict(BODY), SyncResponse.from_dict(BODY)
    assert isinstance(ours, SyncBatch) and isinstance(nios, SyncResponse)
    assert ours.next_batch == nios.next_batch == "s9"
    for room_id, room in nios.rooms.join.items():
        assert ours.timelines[room_id].events == [{**event.source, "room_id": room_id}
                                                  for event in room.timeline.events]
        assert (ours.timelines[room_id].limited, ours.timelines[room_id].prev_batch) == \
            (bool(room.timeline.limited), room.timeline.prev_batch)
    assert ours.invites == {room_id: [event.source for event in info.invite_state]
                            for room_id, info in nios.rooms.invite.items()}
    assert [e["event_id"] for e in ours.events()] == ["$a", "$ack", "$b"]
    assert all(e["room_id"] == ROOM for e in ours.timelines[ROOM].events)
    assert (ours.timelines[ROOM].limited, ours.timelines[ROOM].prev_batch) == (True, "p3")
    assert (ours.timelines[OTHER].limited, ours.timelines[OTHER].prev_batch) == (False, None)


def test_the_bridge_s_own_events_are_left_out_when_asked() -> None:
    batch = SyncBatch.from_dict(BODY)
    assert isinstance(batch, SyncBatch)
    assert [e["event_id"] for e in batch.events(leave_out=BOT)] == ["$a", "$b"]


def test_an_error_body_is_nio_s_sync_error() -> None:
    refused = SyncBatch.from_dict({"errcode": "M_UNKNOWN_TOKEN", "error": "Invalid access token"})
    assert isinstance(refused, SyncError) and refused.status_code == "M_UNKNOWN_TOKEN"
    assert isinstance(SyncBatch.from_dict(["not", "an", "object"]), SyncError)


def test_malformed_parts_are_skipped_not_fatal() -> None:
    body = {"next_batch": "s2", "rooms": {
        "join": {ROOM: {"timeline": {"events": [_event("$a", "@alice:example.org"), "junk", 7],
                                     "limited": "yes", "prev_batch": 4}},
                 OTHER: "junk"},
        "invite": {"!x:example.org": {"invite_state": "junk"}},
        "leave": {"!gone:example.org": {}}}}
    batch = SyncBatch.from_dict(body)
    assert isinstance(batch, SyncBatch)
    assert [e["event_id"] for e in batch.events()] == ["$a"]
    assert (batch.timelines[ROOM].limited, batch.timelines[ROOM].prev_batch) == (False, None)
    assert batch.timelines[OTHER].events == [] and batch.invites == {"!x:example.org": []}
    assert isinstance(SyncBatch.from_dict({"next_batch": "s3"}), SyncBatch)  # nothing new at all


def test_a_gap_is_a_timeline_cut_short_with_a_place_to_read_back_from() -> None:
    batch = SyncBatch.from_dict({"next_batch": "s2", "rooms": {"join": {
        ROOM: {"timeline": {"events": [], "limited": True, "prev_batch": "p1"}},
        OTHER: {"timeline": {"events": [], "limited": True}},
        "!whole:example.org": {"timeline": {"events": [], "limited": False, "prev_batch": "p2"}}}}})
    assert isinstance(batch, SyncBatch)
    assert batch.gaps() == {ROOM: "p1"}


def test_what_the_bridges_device_must_see_is_kept_for_nio_in_the_shape_it_reads() -> None:
    room_key = {"type": "m.room.encrypted", "sender": "@alice:example.org",
                "content": {"algorithm": "m.olm.v1.curve25519-aes-sha2", "sender_key": "k", "ciphertext": {}}}
    body = {"next_batch": "s4", "to_device": {"events": [room_key, "junk"]},
            "device_lists": {"changed": ["@alice:example.org"], "left": ["@bob:example.org"]},
            "device_one_time_keys_count": {"signed_curve25519": 50}}
    batch = SyncBatch.from_dict(body)
    assert isinstance(batch, SyncBatch) and batch.events() == []
    nios = SyncResponse.from_dict({**batch.device, "next_batch": "s4"})
    assert isinstance(nios, SyncResponse)
    assert [event.source for event in nios.to_device_events] == [room_key]
    assert (nios.device_list.changed, nios.device_list.left) == (["@alice:example.org"], ["@bob:example.org"])
    assert nios.device_key_count.signed_curve25519 == 50
    empty = SyncBatch.from_dict({"next_batch": "s5", "to_device": "junk", "device_lists": 3})
    assert isinstance(empty, SyncBatch)
    assert empty.device["to_device"]["events"] == [] and empty.device["device_lists"] == {"changed": [], "left": []}


def test_a_room_left_keeps_its_gap_to_be_read() -> None:
    # (Said there before the bridge was put out, behind more than a timeline
    # of chatter: never read, the gap of a room left was dropped.)
    body = {"next_batch": "s2", "rooms": {"leave": {ROOM: {"timeline": {
        "events": [{"type": "m.room.member", "event_id": "$kick", "sender": "@owner:example.org",
                    "state_key": BOT, "content": {"membership": "leave"}}],
        "limited": True, "prev_batch": "p1"}}}}}
    batch = SyncBatch.from_dict(body)
    assert isinstance(batch, SyncBatch)
    assert batch.left == {ROOM} and batch.gaps() == {ROOM: "p1"}
