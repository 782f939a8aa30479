"""An answer from a session nio knows nothing of waits for its owner's
devices to be read again before its trust is judged: what nio holds may be
from before they signed in on it (a device list change missed while the
bridge was down, as an appservice's can be), and an answer kept before a
restart lost the note that its sender's homeserver had not answered.  Both
were refused at once, the person told to verify a session they had verified."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from nio import AsyncClient
from nio.crypto import OlmDevice

from bridge.service.config import Encryption
from bridge.service.encryption.crypto import Crypto
from bridge.service.encryption.receiving import ORIGIN
from bridge.service.storage.store import Store
from bridge.service.transport.matrix import client_config

ROOM, PERSON = "!r:example.org", "@person:example.org"


class SignedByHer:
    """Her cross-signing keys, read: PHONE and LAPTOP are signed."""

    def known(self, user: str) -> bool:
        return user == PERSON

    def is_pending(self, user: str) -> bool:
        return False

    def is_cross_signed(self, user: str, device_id: str, ed25519: str) -> bool:
        return user == PERSON and device_id in ("PHONE", "LAPTOP")

    def due_in_ms(self) -> None:
        return None


def decrypted(event_id: str, session: str) -> dict[str, Any]:
    """An answer as the encryption layer has it once decrypted: with the session that sent it."""
    return {"type": "m.room.message", "event_id": event_id, "room_id": ROOM, "sender": PERSON,
            "origin_server_ts": int(time.time() * 1000), "content": {"msgtype": "m.text", "body": "yes"},
            ORIGIN: {"sender_key": session, "verified": False}}


@pytest.fixture
async def store(tmp_path: Path):
    """The bridge's store, and (closed after the test) every bridge started over it."""
    (tmp_path / "crypto").mkdir()
    made = Store(tmp_path / "bridge.sqlite")
    made.clients = []  # type: ignore[attr-defined]
    yield made
    for client in made.clients:  # type: ignore[attr-defined]
        await client.close()
    made.close()


def bridge(tmp_path: Path, store: Store) -> tuple[AsyncClient, Crypto]:
    client = AsyncClient("http://127.0.0.1:1", "@askbot:example.org", store_path=str(tmp_path / "crypto"),
                         config=client_config(encryption=True))
    client.restore_login("@askbot:example.org", "BRIDGE", "token")
    client.device_store.add(OlmDevice(PERSON, "PHONE", {"ed25519": "phone-ed", "curve25519": "phone-curve"}))
    crypto = Crypto(client, store, Encryption(trust="cross-signed"), cross_signing=SignedByHer())
    crypto.apply_trust()
    store.clients.append(client)  # type: ignore[attr-defined]
    return client, crypto


def kept(store: Store) -> list[str]:
    return [event["event_id"] for event, _seen in store.undecrypted()]


async def test_an_answer_from_a_session_nio_never_read_waits_for_her_devices_and_then_counts(
        tmp_path: Path, store: Store) -> None:
    client, crypto = bridge(tmp_path, store)
    batch, _ = await crypto.screen([decrypted("$a", "laptop-curve")], lambda user: False)
    assert batch == [] and kept(store) == ["$a"] and not store.is_processed("$a")
    assert PERSON in client.users_for_key_query  # her devices are asked for with the next chores
    # Still unanswered at the next look: it goes on waiting.
    batch, _ = await crypto.screen([], lambda user: False)
    assert batch == [] and kept(store) == ["$a"]
    # Her homeserver answers with the new laptop, which she cross-signed: the answer counts.
    client.device_store.add(OlmDevice(PERSON, "LAPTOP", {"ed25519": "laptop-ed", "curve25519": "laptop-curve"}))
    client.olm.users_for_key_query.discard(PERSON)
    crypto.apply_trust()
    batch, resolved = await crypto.screen([], lambda user: False)
    assert [event["event_id"] for event in batch] == ["$a"] and resolved == ["$a"]


async def test_a_session_still_unknown_once_her_devices_are_read_is_refused(tmp_path: Path, store: Store) -> None:
    client, crypto = bridge(tmp_path, store)
    await crypto.screen([decrypted("$a", "stranger-curve")], lambda user: False)
    client.olm.users_for_key_query.discard(PERSON)  # read: no such session of hers
    batch, _ = await crypto.screen([], lambda user: False)
    assert batch == [] and kept(store) == [] and store.is_processed("$a")


async def test_an_answer_kept_before_a_restart_waits_for_her_devices_again(tmp_path: Path, store: Store) -> None:
    client, crypto = bridge(tmp_path, store)
    crypto._devices_unanswered = {PERSON}  # her homeserver did not answer
    await crypto.screen([decrypted("$a", "laptop-curve")], lambda user: False)
    assert kept(store) == ["$a"]
    await client.close()
    client, crypto = bridge(tmp_path, store)  # started again: nothing in memory says she was unanswered
    batch, _ = await crypto.screen([], lambda user: False)
    assert batch == [] and kept(store) == ["$a"] and not store.is_processed("$a")
    assert PERSON in client.users_for_key_query


async def test_the_next_look_comes_within_a_second_while_her_devices_are_to_be_asked_for(
        tmp_path: Path, store: Store) -> None:
    """A quiet room's long poll (30 s in bot mode, a minute for an
    appservice's kept events) would have left the answer waiting that long."""
    client, crypto = bridge(tmp_path, store)
    await crypto.screen([decrypted("$a", "laptop-curve")], lambda user: False)
    assert await crypto.sync_timeout_ms(30000) <= 1000
    crypto._devices_unanswered = {PERSON}  # asked, and her homeserver did not answer: paced as before
    assert await crypto.sync_timeout_ms(30000) == 30000


async def test_an_answer_whose_key_came_late_and_whose_senders_devices_wait_does_not_spin_the_sync(
        tmp_path: Path, store: Store, monkeypatch) -> None:
    """An answer kept for its key, whose key came after the grace period
    while her homeserver did not answer for her devices: it stayed kept as
    it came (encrypted), so its wait was still counted by the grace
    period, long gone, and every long poll was asked with timeout 0, back
    to back, until her homeserver answered or a day passed."""
    from bridge.service.config import Duration

    client, crypto = bridge(tmp_path, store)
    crypto.settings = Encryption(trust="cross-signed", grace=Duration("1s"))
    sealed = {"type": "m.room.encrypted", "event_id": "$a", "room_id": ROOM, "sender": PERSON,
              "origin_server_ts": int(time.time() * 1000), "content": {"algorithm": "m.megolm.v1.aes-sha2"}}
    with store.transaction():
        store.keep_undecrypted(sealed, crypto.clock() - 5000)
    crypto._first_look = crypto.clock() - 5000
    key_came = decrypted("$a", "laptop-curve")
    monkeypatch.setattr(crypto, "_decrypt", lambda event: dict(key_came) if event["event_id"] == "$a" else None)
    crypto._devices_unanswered = {PERSON}  # asked, and her homeserver did not answer
    batch, _ = await crypto.screen([], lambda user: False)
    assert batch == [] and kept(store) == ["$a"] and not store.is_processed("$a")
    assert await crypto.sync_timeout_ms(30000) == 30000
    # Still hers to judge once her homeserver answers: kept as decrypted, with its session.
    [(event, _seen)] = store.undecrypted()
    assert event[ORIGIN] == key_came[ORIGIN]


async def test_an_answer_judged_while_its_senders_devices_are_due_to_be_read_waits_for_them(
        tmp_path: Path, store: Store) -> None:
    """Her laptop was not cross-signed when the bridge last read her devices;
    she signed it while the bridge was down, and the homeserver said her
    devices changed.  Her answer, kept for its key and decrypting now, was
    judged on the stale trust before her devices were read again: refused,
    "verify this session", a session she had verified."""
    client, crypto = bridge(tmp_path, store)
    signed = {"PHONE"}
    crypto.cross_signing.is_cross_signed = lambda user, device_id, _ed: user == PERSON and device_id in signed
    client.device_store.add(OlmDevice(PERSON, "LAPTOP", {"ed25519": "laptop-ed", "curve25519": "laptop-curve"}))
    crypto.apply_trust()
    client.olm.users_for_key_query.add(PERSON)  # her device list changed: due to be read again
    batch, _ = await crypto.screen([decrypted("$a", "laptop-curve")], lambda user: False)
    assert batch == [] and kept(store) == ["$a"] and not store.is_processed("$a")
    assert await crypto.sync_timeout_ms(30000) <= 1000  # looked at again once they are read
    # Read: the laptop is signed now, and the answer counts.
    signed.add("LAPTOP")
    client.olm.users_for_key_query.discard(PERSON)
    crypto.apply_trust()
    batch, resolved = await crypto.screen([], lambda user: False)
    assert [event["event_id"] for event in batch] == ["$a"] and resolved == ["$a"]
