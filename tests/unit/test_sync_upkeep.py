"""A start of bot mode does not make the answers waiting for it wait on more
than they need.  The key chores (every known person's devices queried) run
beside the sync, not before it: answers waiting in plain rooms are judged
without waiting on them; a batch holding encrypted events still waits while
this run has not settled their senders' devices, since its trust check needs
them, and one from senders whose devices are settled does not.  The first
sync is asked for before the loop starts (while the rooms are joined), and
the loop handles its batch once, from the token it was asked from."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from helpers.fake_sync import SyncBodies

from bridge.service.encryption.crypto import Crypto
from bridge.service.storage.store import Store
from bridge.service.transport.bot import SYNC_TOKEN, SyncLoop, ask_first_sync

ROOM = "!room:example.org"


def _sync_body(event_type: str) -> dict[str, Any]:
    event = {"type": event_type, "event_id": "$answer", "sender": "@alice:example.org", "origin_server_ts": 1,
             "content": {"msgtype": "m.text", "body": "yes"} if event_type == "m.room.message" else
             {"algorithm": "m.megolm.v1.aes-sha2", "ciphertext": "x", "sender_key": "k", "session_id": "s",
              "device_id": "D"}}
    return {"next_batch": "s2", "rooms": {"join": {ROOM: {"timeline": {
        "events": [event], "limited": False, "prev_batch": "p1"}}}}}


class _Client(SyncBodies):
    """The first sync returns the batch waiting since the stop; later ones long-poll."""

    user_id = "@askbot:example.org"

    def __init__(self, event_type: str):
        self.batch = _sync_body(event_type)
        self.syncs = 0
        self.asked: list[tuple[str | None, int]] = []  # (since, timeout) of each sync

    async def sync_body(self, timeout: int, sync_filter: Any, since: str | None) -> dict[str, Any]:
        self.syncs += 1
        self.asked.append((since, timeout))
        if self.syncs == 1:
            return self.batch
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")


class _SlowKeys:
    """A homeserver slow to answer the key queries of a start."""

    client = SimpleNamespace(olm=None)  # nio: the syncs here carry nothing for the device
    # The bridge's own rule and chores, over this stand-in's devices.
    waits_for_chores = Crypto.waits_for_chores
    chores = Crypto.chores

    def __init__(self, settled: bool = False) -> None:
        self.released = asyncio.Event()
        self.maintained = 0
        self.settled = settled  # what this run has read of the senders' devices settles their trust

    def devices_settled(self, senders: set[str]) -> bool:
        return self.settled

    def note_events(self, events: list[dict[str, Any]]) -> None:
        pass

    async def read_changed_members(self) -> None:
        pass

    async def maintain(self) -> None:
        self.maintained += 1
        await self.released.wait()

    async def sync_timeout_ms(self, default: int) -> int:
        return default

    async def screen(self, events: list[dict[str, Any]], is_own: Any) -> tuple[list[dict[str, Any]], list[str]]:
        return events, []


class _Pipeline:
    def __init__(self, store: Store):
        self.store = store
        self.processed = asyncio.Event()

    def own_users(self, user_id: str) -> bool:
        return False

    async def prepare(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return events

    def process(self, events: list[dict[str, Any]], *, commit: Any) -> None:
        with self.store.transaction():
            commit()
        self.processed.set()

    def retry_held(self) -> bool:
        return False


async def _run(tmp_path: Path, event_type: str, settled: bool = False) -> tuple[bool, _SlowKeys, Store]:
    store = Store(tmp_path / "bridge.sqlite")
    with store.transaction():
        store.set_meta(SYNC_TOKEN, "s1")
    keys, pipeline, stop = _SlowKeys(settled), _Pipeline(store), asyncio.Event()
    loop = asyncio.ensure_future(SyncLoop(_Client(event_type), store, pipeline, stop, crypto=keys).run())
    try:
        await asyncio.wait_for(pipeline.processed.wait(), 2)
        processed_before_keys = True
    except TimeoutError:
        processed_before_keys = False
    keys.released.set()
    await asyncio.wait_for(pipeline.processed.wait(), 10)
    stop.set()
    await asyncio.wait_for(loop, 10)
    return processed_before_keys, keys, store


async def test_plain_answers_waiting_at_start_do_not_wait_for_key_chores(tmp_path: Path) -> None:
    processed_before_keys, keys, store = await _run(tmp_path, "m.room.message")
    assert processed_before_keys, "the plain batch waited for the key queries"
    assert keys.maintained >= 1  # they ran, beside the sync
    assert store.get_meta(SYNC_TOKEN) == "s2"


async def test_a_batch_with_encrypted_events_waits_for_them(tmp_path: Path) -> None:
    processed_before_keys, _keys, store = await _run(tmp_path, "m.room.encrypted")
    assert not processed_before_keys, "an encrypted batch was judged before the senders' devices were known"
    assert store.get_meta(SYNC_TOKEN) == "s2"


async def test_an_encrypted_answer_from_settled_devices_does_not_wait(tmp_path: Path) -> None:
    # (After a restart nio's trust in a device is what the run before left:
    # unsettled until this run read the sender's keys, as above.)
    processed_before_keys, _keys, _store = await _run(tmp_path, "m.room.encrypted", settled=True)
    assert processed_before_keys, "an answer from devices already settled waited for the key chores"


async def test_the_first_sync_asked_before_the_loop_is_the_one_it_handles(tmp_path: Path) -> None:
    store = Store(tmp_path / "bridge.sqlite")
    with store.transaction():
        store.set_meta(SYNC_TOKEN, "s1")
    client, pipeline, stop = _Client("m.room.message"), _Pipeline(store), asyncio.Event()
    first = ask_first_sync(client, store)
    await asyncio.sleep(0)  # the request goes out before the loop exists (the rooms are joined meanwhile)
    assert client.asked == [("s1", 0)]  # no long poll: nothing is posted yet at a start
    loop = asyncio.ensure_future(SyncLoop(client, store, pipeline, stop, first_sync=first).run())
    await asyncio.wait_for(pipeline.processed.wait(), 10)
    await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(loop, 10)
    # Its batch handled once, and the loop went on from the token it brought.
    assert client.asked == [("s1", 0), ("s2", 30000)]
    assert store.get_meta(SYNC_TOKEN) == "s2"
