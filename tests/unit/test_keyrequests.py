"""Which forwarded room keys the bridge takes besides nio's own rule: only
one its creator forwards itself, for a session the bridge asked for."""

from __future__ import annotations

from types import SimpleNamespace

from bridge.service.encryption.keyrequests import _from_creator

CREATOR_CURVE, CREATOR_ED = "curve-of-alice", "ed-of-alice"
SESSION, ROOM = "session-1", "!room:hs"


def olm(asked: bool = True) -> SimpleNamespace:
    device = SimpleNamespace(id="ALICE", deleted=False, ed25519=CREATOR_ED)
    devices = {("@alice:hs", CREATOR_CURVE): device}
    request = SimpleNamespace(room_id=ROOM, algorithm="m.megolm.v1.aes-sha2")
    return SimpleNamespace(outgoing_key_requests={SESSION: request} if asked else {},
                           device_store=SimpleNamespace(device_from_sender_key=lambda u, k: devices.get((u, k))))


def forwarded(**content: object) -> SimpleNamespace:
    body = {"room_id": ROOM, "session_id": SESSION, "sender_key": CREATOR_CURVE,
            "sender_claimed_ed25519_key": CREATOR_ED, "forwarding_curve25519_key_chain": [], **content}
    return SimpleNamespace(source={"content": body}, session_id=SESSION, room_id=ROOM,
                           algorithm="m.megolm.v1.aes-sha2")


def test_the_creator_forwarding_its_own_session_is_taken():
    assert _from_creator(olm(), "@alice:hs", CREATOR_CURVE, forwarded())


def test_a_key_passed_on_by_anyone_else_is_not():
    assert not _from_creator(olm(), "@alice:hs", CREATOR_CURVE, forwarded(forwarding_curve25519_key_chain=["x"]))
    assert not _from_creator(olm(), "@alice:hs", CREATOR_CURVE, forwarded(sender_key="curve-of-someone"))
    assert not _from_creator(olm(), "@mallory:hs", CREATOR_CURVE, forwarded())
    assert not _from_creator(olm(), "@alice:hs", CREATOR_CURVE, forwarded(sender_claimed_ed25519_key="ed-other"))


def test_a_session_never_asked_for_is_not():
    assert not _from_creator(olm(asked=False), "@alice:hs", CREATOR_CURVE, forwarded())
