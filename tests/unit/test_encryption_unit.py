"""The encryption settings and the store's keeping of undecryptable events."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.service.config import ConfigError, parse_config
from bridge.service.encryption.crypto import available, crypto_dir
from bridge.service.storage.store import Store
from helpers.config import GOOD


def config(**encryption):
    return parse_config({**GOOD, "encryption": encryption}, base_dir=Path("/srv/bridge"), environ={}).encryption


def test_encryption_is_on_by_default_trusting_cross_signed_devices():
    settings = parse_config(GOOD, base_dir=Path("/srv/bridge"), environ={}).encryption
    assert (settings.enabled, settings.trust, settings.grace_seconds) == (True, "cross-signed", 60.0)


def test_the_e2e_extra_is_installed():
    assert available()


def test_fingerprints_are_kept_without_elements_spaces():
    settings = config(trust="verified", verified_devices={"@a:hs": {"DEV": "abcd efgh ijkl"}}, grace="2m")
    assert settings.verified_devices == {"@a:hs": {"DEV": "abcdefghijkl"}}
    assert settings.grace_seconds == 120


@pytest.mark.parametrize("bad, key", [({"trust": "everyone"}, "encryption.trust"),
                                      ({"grace": "soon"}, "encryption.grace"),
                                      ({"unknown": 1}, "encryption.unknown")])
def test_a_bad_encryption_setting_names_its_key(bad, key):
    with pytest.raises(ConfigError, match=key):
        config(**bad)


def test_the_key_folder_sits_beside_the_store():
    assert crypto_dir(Path("/srv/bridge/bridge.sqlite")) == Path("/srv/bridge/bridge.sqlite.crypto")


@pytest.mark.usefixtures("store_backend")
def test_an_undecryptable_event_is_kept_once_and_dropped(tmp_path):
    store = Store(tmp_path / "bridge.sqlite")
    event = {"type": "m.room.encrypted", "event_id": "$e", "room_id": "!r", "sender": "@p:hs",
             "content": {"algorithm": "m.megolm.v1.aes-sha2", "session_id": "s"}}
    with store.transaction():
        assert store.keep_undecrypted(event, 1000) is True
        assert store.keep_undecrypted(event, 2000) is False  # a redelivery keeps the first sighting
    assert store.undecrypted() == [(event, 1000)]
    with store.transaction():
        store.drop_undecrypted(["$e"])
    assert store.undecrypted() == []
    store.close()


def test_key_store_keeps_encrypted_rooms_and_asks_nothing_of_its_database_when_there_are_none(tmp_path):
    """nio saves newly encrypted rooms after every sync; with none, the
    bridge's key store must not run a transaction on the answer's path."""
    from nio.crypto import OlmAccount

    from bridge.service.encryption.keystore import KeyStore

    store = KeyStore("@askbot:example.org", "BRIDGE", str(tmp_path))
    store.save_account(OlmAccount())
    statements: list[str] = []
    store.database.connection().set_trace_callback(statements.append)
    store.save_encrypted_rooms(set())
    assert statements == []
    store.save_encrypted_rooms({"!secret:example.org"})
    assert any("INSERT" in statement for statement in statements)
    reopened = KeyStore("@askbot:example.org", "BRIDGE", str(tmp_path))
    assert reopened.load_encrypted_rooms() == {"!secret:example.org"}


def test_the_cross_signing_key_file_sits_beside_the_store_unless_configured():
    from bridge.service.encryption.crosssigning import keys_file

    default = parse_config(GOOD, base_dir=Path("/srv/bridge"), environ={})
    assert keys_file(default.store.path, default.encryption.cross_signing_keys) == \
        default.store.path.with_name(default.store.path.name + ".cross-signing.json")
    moved = parse_config({**GOOD, "encryption": {"cross_signing_keys": "secrets/cs.json"}},
                         base_dir=Path("/srv/bridge"), environ={})
    assert keys_file(moved.store.path, moved.encryption.cross_signing_keys) == Path("/srv/bridge/secrets/cs.json")


def test_what_was_sent_in_the_clear_into_an_encrypted_room_follows_the_timeline():
    from bridge.service.encryption.receiving import sent_in_the_clear

    def event(n: int, room: str, kind: str = "m.room.message", **more: object) -> dict:
        return {"event_id": f"$e{n}", "room_id": room, "type": kind, "sender": "@p:hs", "content": {}, **more}

    events = [event(1, "!late"),  # before encryption was turned on: a plain room then
              event(2, "!late", "m.room.encryption", state_key=""),
              event(3, "!late", "m.reaction"),
              event(4, "!old"), event(5, "!old", "m.room.redaction"), event(6, "!old", "m.room.member", state_key="@p:hs"),
              event(7, "!old", "m.room.encrypted"), event(8, "!plain")]
    clear = sent_in_the_clear(events, {"!late", "!old"})
    assert [e["event_id"] for e in clear] == ["$e3", "$e4"]
