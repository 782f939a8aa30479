"""Appservice mode, an encrypted room: an answer from someone whose devices
are known is not held up by the key chores of a newcomer (their devices
read after they joined); an answer from someone whose devices are not known
yet still waits for them, since the trust check needs them."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from bridge.service.encryption import ascrypto
from bridge.service.encryption.crypto import Crypto
from bridge.service.storage.store import Store
from bridge.service.transport.appservice import TransactionServer

from helpers.waiting import until
from test_appservice_endpoint import BEARER, ROOM, StandIn, config

PERSON, NEWCOMER = "@person:example.org", "@newcomer:example.org"


class _Keys:
    """Encryption whose chores (the newcomer's devices read) take until ``released``."""

    client = None  # nio's client: not reached here (the transactions carry no room keys)
    # The bridge's own rule and chores, over this stand-in's devices and members.
    waits_for_chores = Crypto.waits_for_chores
    chores = Crypto.chores

    def __init__(self) -> None:
        self.known = {PERSON}
        self.released = asyncio.Event()
        self.member_reads = 0

    def note_events(self, events: list[dict[str, Any]]) -> None:
        pass

    def devices_settled(self, senders: set[str]) -> bool:
        return senders <= self.known

    async def read_changed_members(self) -> None:
        self.member_reads += 1
        await self.released.wait()

    async def maintain(self) -> None:
        self.known.add(NEWCOMER)

    async def screen(self, events: list[dict[str, Any]], is_own: Any) -> tuple[list[dict[str, Any]], list[str]]:
        return events, []


def _encrypted(n: int, sender: str) -> dict[str, Any]:
    return {"type": "m.room.encrypted", "event_id": f"$e{n}", "room_id": ROOM, "sender": sender,
            "origin_server_ts": 1, "content": {"algorithm": "m.megolm.v1.aes-sha2", "ciphertext": "x"}}


async def _no_extensions(client: Any, body: dict[str, Any], txn_id: str) -> None:
    """The transactions here carry no room keys or device lists."""


async def _served(tmp_path: Path, monkeypatch: Any) -> tuple[TestClient, StandIn, TransactionServer, _Keys]:
    monkeypatch.setattr(ascrypto, "take_extensions", _no_extensions)
    store = Store(tmp_path / "bridge.sqlite")
    stand_in = StandIn(store)
    server = TransactionServer(config(tmp_path), store, stand_in)  # type: ignore[arg-type]
    server.open([ROOM], notices=None)  # type: ignore[arg-type]
    server.crypto = keys = _Keys()
    stand_in.own_users = lambda user_id: False  # type: ignore[attr-defined]
    client = TestClient(TestServer(server.app()))
    await client.start_server()
    return client, stand_in, server, keys


async def _put(client: TestClient, txn: str, events: list[dict[str, Any]]) -> int:
    response = await client.put(f"/_matrix/app/v1/transactions/{txn}", json={"events": events}, headers=BEARER)
    return response.status


async def test_an_answer_from_a_known_device_does_not_wait_for_a_newcomers_keys(tmp_path: Path, monkeypatch: Any) -> None:
    client, stand_in, server, keys = await _served(tmp_path, monkeypatch)
    try:
        status = await asyncio.wait_for(_put(client, "1", [_encrypted(1, PERSON)]), 5)
        assert status == 200 and [e["event_id"] for b in stand_in.batches for e in b] == ["$e1"]
        await until(lambda: keys.member_reads == 1, 5)  # they run after it
    finally:
        keys.released.set()
        await server.close()
        await client.close()


async def test_a_newcomers_chores_start_once_the_answers_batch_is_durable_not_while_it_is_made(
        tmp_path: Path, monkeypatch: Any) -> None:
    """The chores are work on the event loop (nio's checks, its key store):
    run while the store's thread makes the batch durable, they slowed each of
    its steps.  They start after it."""
    client, stand_in, server, keys = await _served(tmp_path, monkeypatch)
    seen: list[int] = []
    process = stand_in.process

    def watched(events: list[dict[str, Any]], **kwargs: Any) -> Any:
        time.sleep(0.05)  # the loop meanwhile runs whatever it was given to run
        seen.append(keys.member_reads)
        return process(events, **kwargs)

    stand_in.process = watched  # type: ignore[method-assign]
    try:
        assert await asyncio.wait_for(_put(client, "1", [_encrypted(1, PERSON)]), 5) == 200
        assert seen == [0]  # nothing of the chores ran while the batch was made durable
        await until(lambda: keys.member_reads == 1, 5)
    finally:
        keys.released.set()
        await server.close()
        await client.close()


async def test_an_answer_from_unknown_devices_waits_for_the_chores(tmp_path: Path, monkeypatch: Any) -> None:
    client, stand_in, server, keys = await _served(tmp_path, monkeypatch)
    try:
        put = asyncio.ensure_future(_put(client, "1", [_encrypted(1, NEWCOMER)]))
        await asyncio.sleep(0.5)
        assert not put.done() and stand_in.batches == []  # judged only once the newcomer's devices are read
        keys.released.set()
        assert await asyncio.wait_for(put, 5) == 200
        assert [e["event_id"] for b in stand_in.batches for e in b] == ["$e1"]
    finally:
        keys.released.set()
        await server.close()
        await client.close()


async def test_a_transaction_screening_keeps_nothing_of_makes_no_store_job_before_its_batch(
        tmp_path: Path, monkeypatch: Any) -> None:
    """An encrypting bridge screens every transaction.  Screening asks the
    store only about what it would keep (``test_kept_looks.py``): a plain
    room's transaction, or one whose sealed events all decrypt (as the
    stand-in's do), waits for its batch's job alone; a resend is found taken
    by the batch's own look-ups."""
    client, stand_in, server, keys = await _served(tmp_path, monkeypatch)
    jobs: list[str] = []
    run = server.store.run

    async def counted(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        jobs.append(getattr(fn, "__name__", "?"))
        return await run(fn, *args, **kwargs)

    server.store.run = counted  # type: ignore[method-assign]
    plain = {"type": "m.room.message", "event_id": "$p", "room_id": ROOM, "sender": PERSON, "origin_server_ts": 1,
             "content": {"msgtype": "m.text", "body": "yes"}}
    try:
        assert await _put(client, "1", [plain]) == 200
        assert jobs == ["process"]
        jobs.clear()
        assert await _put(client, "2", [_encrypted(2, PERSON)]) == 200
        assert jobs == ["process"]
        assert [e["event_id"] for b in stand_in.batches for e in b] == ["$p", "$e2"]
    finally:
        keys.released.set()
        await server.close()
        await client.close()
