"""The kept events (encrypted ones waiting for their keys) are looked at
before each long poll and in each batch, on the store's thread.  With none
kept, a batch of plain answers waits for no job but its own: the look after
one that found nothing, with nothing kept since, is not a job.  Once an
event is kept the looks read the store again, and find it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from nio import AsyncClient

from bridge.service.config import Encryption
from bridge.service.encryption.crypto import Crypto
from bridge.service.storage.store import Store
from bridge.service.transport.matrix import client_config

ROOM = "!r:example.org"


async def _unreachable(*_args: Any, **_kwargs: Any) -> None:
    raise OSError("the homeserver is unreachable")


def _plain(event_id: str) -> dict[str, Any]:
    return {"type": "m.room.message", "event_id": event_id, "room_id": ROOM, "sender": "@person:example.org",
            "origin_server_ts": int(time.time() * 1000), "content": {"msgtype": "m.text", "body": "yes"}}


def _sealed(event_id: str) -> dict[str, Any]:
    return {"type": "m.room.encrypted", "event_id": event_id, "room_id": ROOM, "sender": "@person:example.org",
            "origin_server_ts": int(time.time() * 1000),
            "content": {"algorithm": "m.megolm.v1.aes-sha2", "ciphertext": "AAAA", "sender_key": "key",
                        "session_id": "session", "device_id": "PHONE"}}


def _counted(tmp_path: Path) -> tuple[Store, AsyncClient, Crypto, list[str]]:
    """A store whose jobs are noted by name, and the encryption over it."""
    store = Store(tmp_path / "bridge.sqlite")
    (tmp_path / "crypto").mkdir()
    client = AsyncClient("http://127.0.0.1:1", "@askbot:example.org", store_path=str(tmp_path / "crypto"),
                         config=client_config(encryption=True))
    client.restore_login("@askbot:example.org", "BRIDGE", "token")
    client.to_device = _unreachable  # type: ignore[method-assign] - the key requests go nowhere
    jobs: list[str] = []
    run = store.run

    async def counted(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        jobs.append(getattr(fn, "__name__", "?"))
        return await run(fn, *args, **kwargs)

    store.run = counted  # type: ignore[method-assign]
    return store, client, Crypto(client, store, Encryption(grace="300s")), jobs


async def test_with_nothing_kept_a_plain_batch_makes_no_job_for_the_kept_events(tmp_path: Path) -> None:
    store, client, crypto, jobs = _counted(tmp_path)
    try:
        assert await crypto.sync_timeout_ms(30000) == 30000
        assert jobs == ["undecrypted"]  # the first look reads the store
        batch, resolved = await crypto.screen([_plain("$a")], lambda user: False)
        assert [e["event_id"] for e in batch] == ["$a"] and resolved == []
        assert await crypto.sync_timeout_ms(30000) == 30000
        batch, _ = await crypto.screen([_plain("$b")], lambda user: False)
        assert [e["event_id"] for e in batch] == ["$b"]
        assert jobs == ["undecrypted"]  # none kept since: no job for the looks after it
        # An event kept for its key: the looks read the store again and wait for it.
        batch, _ = await crypto.screen([_sealed("$secret")], lambda user: False)
        assert batch == [] and [e["event_id"] for e, _seen in store.undecrypted()] == ["$secret"]
        jobs.clear()
        assert 0 < await crypto.sync_timeout_ms(600_000) <= 300_000
        assert jobs == ["undecrypted"]
        batch, _ = await crypto.screen([_plain("$c")], lambda user: False)
        assert [e["event_id"] for e in batch] == ["$c"] and jobs == ["undecrypted", "undecrypted"]
    finally:
        await client.close()
        store.close()


async def test_sealed_events_that_decrypt_make_no_job_before_the_batchs_own(tmp_path: Path) -> None:
    """In appservice mode every event of an encrypted room comes sealed.
    Screening looks up in the store only what it would keep: events that
    decrypt go to the batch, whose own look-ups skip what was processed."""
    store, client, crypto, jobs = _counted(tmp_path)
    crypto._decrypt = lambda event: _plain(event["event_id"])  # type: ignore[method-assign] - as with its key
    try:
        await crypto.screen([_plain("$warm")], lambda user: False)  # the first look at the kept events
        jobs.clear()
        batch, _ = await crypto.screen([_sealed("$a"), _sealed("$b")], lambda user: False)
        assert [e["event_id"] for e in batch] == ["$a", "$b"] and jobs == []
    finally:
        await client.close()
        store.close()


async def test_what_screening_would_keep_is_kept_only_when_not_processed(tmp_path: Path) -> None:
    """An event judged before and delivered again (a transaction sent again)
    that does not decrypt now is not kept again: one job looks it up."""
    store, client, crypto, jobs = _counted(tmp_path)
    with store.transaction():
        store.mark_processed("$done", "accepted")
    try:
        jobs.clear()
        batch, _ = await crypto.screen([_sealed("$done"), _sealed("$new")], lambda user: False)
        assert batch == [] and [e["event_id"] for e, _seen in store.undecrypted()] == ["$new"]  # $done not kept
        assert jobs.count("processed_of") == 1
    finally:
        await client.close()
        store.close()


def _decrypted(event_id: str) -> dict[str, Any]:
    """An answer nio decrypted in the sync, as the sync loop hands it over."""
    from bridge.service.encryption.receiving import ORIGIN

    return {**_plain(event_id), ORIGIN: {"sender_key": "key", "verified": False}}


async def test_an_event_kept_and_delivered_again_is_judged_once(tmp_path: Path) -> None:
    # An answer decrypted while its sender's devices went unread is kept as
    # read; the bridge stopped before the token moved past it, so the next
    # sync brings it again while it is still kept.
    store, client, crypto, _jobs = _counted(tmp_path)
    crypto._devices_unanswered = {"@person:example.org"}  # their homeserver has not answered for their devices
    try:
        batch, resolved = await crypto.screen([_decrypted("$late")], lambda user: False)
        assert batch == [] and resolved == []
        assert [e["event_id"] for e, _seen in store.undecrypted()] == ["$late"]
        batch, resolved = await crypto.screen([_decrypted("$late")], lambda user: False)
        assert batch == [] and resolved == []  # still kept, once
        assert [e["event_id"] for e, _seen in store.undecrypted()] == ["$late"]
        crypto._devices_unanswered = set()
        crypto.settings.trust = "all"  # their devices answered for: judged, once
        batch, resolved = await crypto.screen([_decrypted("$late")], lambda user: False)
        assert [e["event_id"] for e in batch] == ["$late"] and resolved == ["$late"]
    finally:
        await client.close()
        store.close()


async def test_why_a_kept_event_stays_encrypted_is_said_once(tmp_path: Path, caplog: Any) -> None:
    # The storms' reports name what the log says of an answer; nio says
    # nothing of most reasons a decryption fails.
    store, client, crypto, _jobs = _counted(tmp_path)
    try:
        with caplog.at_level("INFO", logger="bridge.service.encryption.receiving"):
            for _pass in range(3):
                batch, _ = await crypto.screen([_sealed("$secret")], lambda user: False)
                assert batch == []
        said = [r.getMessage() for r in caplog.records if "$secret not decrypted" in r.getMessage()]
        assert len(said) == 1, said
    finally:
        await client.close()
        store.close()


async def test_appservice_modes_watch_of_the_kept_events_reads_the_store_off_the_event_loop(tmp_path: Path) -> None:
    """With no transaction coming, appservice mode wakes up for a kept
    event's grace period and looks whether any is kept before judging them
    again: that look was a statement on the event loop, which waits for
    the job in progress on the store's thread (a batch, a checkpoint) and
    holds /health, the homeserver's pushes and the agents meanwhile."""
    import asyncio

    from bridge.service.encryption.ascrypto import keep_up_kept
    from helpers.loopwatch import statements_on_the_loop

    store, client, crypto, _jobs = _counted(tmp_path)
    crypto.settings = Encryption(grace="1s")
    stop = asyncio.Event()
    fed: list[int] = []

    async def no_chores() -> None:
        return None

    async def feed_kept() -> None:
        fed.append(1)
        stop.set()

    crypto.maintain = no_chores  # type: ignore[method-assign] - no homeserver here
    try:
        with store.transaction():
            store.keep_undecrypted(_sealed("$secret"), int(time.time() * 1000))
        on_loop = statements_on_the_loop(store)
        await asyncio.wait_for(keep_up_kept(crypto, store, stop, feed_kept, asyncio.Event()), 30)
        assert fed == [1]  # woken at the grace period, and the kept event judged again
        assert on_loop == []
    finally:
        await client.close()
        store.close()
