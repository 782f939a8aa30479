"""Bot mode reads a plain room's ``/sync`` itself (``SyncBatch``), not
through matrix-nio's response objects and schema checks: the bridge gets
what nio would have handed it, and a body nio would refuse or a part it
would drop does not stop the batch."""

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
    ours, nios = SyncBatch.from_dict(BODY), SyncBatch.from_nio(SyncResponse.from_dict(BODY))
    assert isinstance(ours, SyncBatch)
    assert ours.next_batch == nios.next_batch == "s9"
    assert ours.timelines == nios.timelines
    assert ours.invites == nios.invites
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
