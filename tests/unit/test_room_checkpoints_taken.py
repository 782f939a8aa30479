"""Which checkpoint events ``verify --room`` takes from the rooms: a room
member's junk under the log's state key is ignored, not a failure for good;
a real checkpoint relayed by anyone counts; the bridge's own user signing as
another log is named; rooms holding none of the log fail the check."""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bridge.protocol import checkpoint as cp, merkle
from bridge.protocol.roomnotes import RoomNote, take

ORIGIN, OTHER = "example.org/askwright-bridge/a", "example.org/askwright-bridge/b"
BRIDGE = "@askbot:example.org"
KEY, OTHER_KEY = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
PUBLIC = cp.raw_public(KEY.public_key())


def _note(origin: str, key: Ed25519PrivateKey, size: int = 1) -> str:
    return cp.sign_checkpoint(cp.Checkpoint(origin, size, merkle.root([merkle.leaf_hash(b"x")] * size)), key)


def test_the_bridges_own_checkpoints_are_taken_and_a_members_junk_is_ignored_with_a_note():
    ours = _note(ORIGIN, KEY)
    taken = take([RoomNote("!r", BRIDGE, ORIGIN, ours, ""),
                  RoomNote("!r", "@mallory:example.org", ORIGIN, "junk", ""),
                  RoomNote("!r", "@mallory:example.org", ORIGIN, _note(ORIGIN, OTHER_KEY), "")], BRIDGE, ORIGIN, PUBLIC)
    assert taken.later == [ours] and taken.problems == []
    assert taken.notes == ["2 checkpoint event(s) sent by @mallory:example.org, not the bridge, are not signed by "
                           "the log's key: ignored"]


def test_a_real_checkpoint_relayed_by_a_member_counts_and_the_bridges_own_are_taken_even_when_bad():
    relayed, bad = _note(ORIGIN, KEY, 2), _note(ORIGIN, OTHER_KEY)
    taken = take([RoomNote("!r", "@ana:example.org", ORIGIN, relayed, ""), RoomNote("!r", BRIDGE, ORIGIN, bad, "")],
                 BRIDGE, ORIGIN, PUBLIC)
    assert taken.later == [relayed, bad]  # the bridge's own bad one is the log's problem, checked later


def test_rooms_holding_only_another_log_of_the_bridge_fail_and_name_that_log():
    """``key.txt`` swapped for a new key of a new origin: the rooms' checkpoints
    of the log the answers were given under were all left aside, and the
    verdict said all holds."""
    vkey = cp.verifier_key(OTHER, cp.raw_public(OTHER_KEY.public_key()))
    taken = take([RoomNote("!r", BRIDGE, OTHER, _note(OTHER, OTHER_KEY), vkey)] * 3, BRIDGE, ORIGIN, PUBLIC)
    assert taken.later == []
    assert taken.problems == [f"the rooms hold no checkpoint of the log {ORIGIN!r} signed by the key given: nothing "
                              "outside the bridge vouches for it (--room)"]
    assert taken.notes == [f"the rooms hold 3 checkpoint(s) the bridge ({BRIDGE}) signed as another log, {OTHER!r} "
                           f"(key {vkey}), not checked here: if the answers were given under that log, verify with "
                           "--key naming its key"]


def test_another_bridges_log_in_the_same_room_is_no_concern():
    ours = _note(ORIGIN, KEY)
    taken = take([RoomNote("!r", BRIDGE, ORIGIN, ours, ""), RoomNote("!r", "@otherbot:example.org", OTHER,
                                                                       _note(OTHER, OTHER_KEY), "")],
                 BRIDGE, ORIGIN, PUBLIC)
    assert (taken.later, taken.problems, taken.notes) == ([ours], [], [])
