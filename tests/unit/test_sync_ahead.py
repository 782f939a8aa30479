"""Bot mode keeps a long poll outstanding, as a bare client does: the next
/sync is out while its batch is made durable (Synapse answers the long polls
waiting on a room one after another; a bridge that asked only once its batch
was durable was often not waiting when the next answer came), asked from the
batch's commit so that the request's cost comes after its answers are in
their folders.  Only the request runs ahead: batches are made durable one
after another in the order they came, the token in the store moves only with
a durable batch, and a batch that fails is retried from that token, the sync
asked past it dropped."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from bridge.service.storage.store import Store
from bridge.service.transport import bot
from bridge.service.transport.bot import SYNC_TOKEN, SyncLoop
from helpers.fake_sync import SyncBodies
from helpers.waiting import until

ROOM = "!room:example.org"


def _batch(event_id: str | None, next_batch: str, *more: tuple[str, str]) -> dict[str, Any]:
    """A sync response with ``event_id`` from alice (if any) and ``more`` (event id, sender) after it."""
    events = [{"type": "m.room.message", "event_id": one, "sender": sender, "origin_server_ts": 1,
               "content": {"msgtype": "m.text", "body": "yes"}}
              for one, sender in [*([(event_id, "@alice:example.org")] if event_id else []), *more]]
    return {"next_batch": next_batch, "rooms": {"join": {ROOM: {"timeline": {
        "events": events, "limited": False, "prev_batch": "p"}}}}}


class _Homeserver(SyncBodies):
    """A fake homeserver at the transport seam: ``batches[since]`` answers a
    sync from ``since`` at once; any other since is a long poll with nothing
    new.  Notes each request with the token durable in the store as it came."""

    user_id = "@askbot:example.org"

    def __init__(self, store: Store, batches: dict[str, dict[str, Any]]):
        self.store = store
        self.batches = batches
        self.asked: list[tuple[str | None, str | None]] = []  # (since, the store's token then)
        self.timeouts: list[int] = []
        self.filters: list[Any] = []
        self.cancelled: list[str | None] = []
        self.new_request = asyncio.Event()

    def durable_token(self) -> str | None:
        """The token the store has committed, read beside the store's own
        connection (a request may come while the store's thread commits)."""
        with contextlib.closing(sqlite3.connect(self.store.path)) as db:
            row = db.execute("SELECT value FROM meta WHERE key=?", (SYNC_TOKEN,)).fetchone()
        return row[0] if row else None

    async def sync_body(self, timeout: int, sync_filter: Any, since: str | None) -> dict[str, Any]:
        self.asked.append((since, self.durable_token()))
        self.timeouts.append(timeout)
        self.filters.append(sync_filter)
        self.new_request.set()
        if since in self.batches:
            return self.batches[since]
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled.append(since)
            raise
        raise AssertionError("unreachable")


class _Pipeline:
    """Judges nothing; ``prepare`` waits for ``release`` (a slow batch) and
    fails ``failures`` times; ``process`` commits and notes what it made
    durable, its COMMIT waiting for ``commit_may_end`` when one is given and
    failing ``failed_commits`` times."""

    def __init__(self, store: Store, failures: int = 0, failed_commits: int = 0):
        self.store = store
        self.release = asyncio.Event()
        self.failures = failures
        self.failed_commits = failed_commits
        self.commit_may_end: threading.Event | None = None
        self.durable: list[str] = []  # event ids, in the order they were made durable
        self.jobs = 0  # batches handed to the store's thread

    def own_users(self, user_id: str) -> bool:
        return False

    async def prepare(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        await self.release.wait()
        if self.failures:
            self.failures -= 1
            raise RuntimeError("the store is away")
        return events

    def process(self, events: list[dict[str, Any]], *, commit: Any) -> None:
        self.jobs += 1
        with self.store.transaction():
            commit()
            if self.commit_may_end is not None:
                assert self.commit_may_end.wait(10)
            if self.failed_commits:
                self.failed_commits -= 1
                raise RuntimeError("the disk is full")
        self.durable += [e["event_id"] for e in events]

    def retry_held(self) -> bool:  # the notices' pass: nothing held here
        return False


def _store(tmp_path: Path) -> Store:
    store = Store(tmp_path / "bridge.sqlite")
    with store.transaction():
        store.set_meta(SYNC_TOKEN, "s1")
    return store


_until = partial(until, timeout=10, every=0.01)
async def _stopped(loop: asyncio.Future[Any], stop: asyncio.Event) -> None:
    stop.set()
    await asyncio.wait_for(loop, 10)


async def test_the_next_long_poll_is_out_while_the_batch_is_made_durable(tmp_path: Path) -> None:
    store = _store(tmp_path)
    homeserver, pipeline, stop = _Homeserver(store, {"s1": _batch("$a", "s2")}), _Pipeline(store), asyncio.Event()
    pipeline.commit_may_end = threading.Event()
    loop = asyncio.ensure_future(SyncLoop(homeserver, store, pipeline, stop).run())
    await _until(lambda: len(homeserver.asked) == 1)
    await asyncio.sleep(0.1)
    # Nothing is asked while the batch is prepared and judged: the request's
    # cost (the event loop's) would go before the batch's answers.
    assert len(homeserver.asked) == 1
    pipeline.release.set()
    # Asked from the batch just received, while its commit waits: nothing of it is durable yet.
    await _until(lambda: len(homeserver.asked) == 2)
    assert homeserver.asked[1] == ("s2", "s1") and pipeline.durable == []
    pipeline.commit_may_end.set()
    await _until(lambda: pipeline.durable == ["$a"])
    assert store.get_meta(SYNC_TOKEN) == "s2"
    assert len(homeserver.asked) == 2  # the long poll asked ahead is the one waited on: no second request
    await _stopped(loop, stop)
    assert homeserver.cancelled == ["s2"]


async def test_a_long_poll_asks_for_the_bridge_s_own_events_and_leaves_them_out_itself(tmp_path: Path) -> None:
    """A timeline with the bridge's own acknowledgement left out by the
    filter is no chain for Synapse, which then works out the room's whole
    state three times to answer the bridge: for each answer after an
    acknowledgement the bridge was answered 3.4 ms after a bare client.  The
    long poll takes every event; the batch is judged without the bridge's."""
    store = _store(tmp_path)
    homeserver = _Homeserver(store, {"s1": _batch("$a", "s2"), "s2": _batch("$b", "s3", ("$ack", _Homeserver.user_id),
                                                                         ("$c", "@bob:example.org"))})
    pipeline, stop = _Pipeline(store), asyncio.Event()
    pipeline.release.set()
    loop = asyncio.ensure_future(SyncLoop(homeserver, store, pipeline, stop).run())
    await _until(lambda: pipeline.durable == ["$a", "$b", "$c"] and len(homeserver.asked) == 3)
    long_polls = [f for f, timeout in zip(homeserver.filters, homeserver.timeouts) if timeout == 30000]
    assert len(long_polls) == 3
    assert all("not_senders" not in f["room"]["timeline"] for f in long_polls)
    await _stopped(loop, stop)


async def test_a_sync_of_the_bridge_s_own_messages_alone_makes_no_store_job(tmp_path: Path,
                                                                          monkeypatch: Any) -> None:
    """An acknowledgement after every answer comes back in a sync of its own:
    nothing to judge, so no job on the store's thread (on PostgreSQL two
    round trips) for it; its token is stored by the next batch, or by such
    a sync once ``IDLE_TOKEN_EVERY`` has passed."""
    store = _store(tmp_path)
    ack = (("$ack", _Homeserver.user_id),)
    homeserver = _Homeserver(store, {"s1": _batch("$a", "s2"), "s2": _batch(None, "s3", *ack),
                                     "s3": _batch("$b", "s4"), "s4": _batch(None, "s5", *ack)})
    pipeline, stop = _Pipeline(store), asyncio.Event()
    pipeline.release.set()
    gate, held = asyncio.Event(), asyncio.Event()
    sync = homeserver.sync_body

    async def held_at_s4(timeout: int, sync_filter: Any, since: str | None) -> dict[str, Any]:
        if since == "s4":
            held.set()
            await gate.wait()
        return await sync(timeout, sync_filter, since)

    homeserver.sync_body = held_at_s4  # type: ignore[method-assign]
    loop = asyncio.ensure_future(SyncLoop(homeserver, store, pipeline, stop).run())
    await _until(lambda: pipeline.durable == ["$a", "$b"] and held.is_set())
    assert pipeline.jobs == 2 and store.get_meta(SYNC_TOKEN) == "s4"
    monkeypatch.setattr(bot, "IDLE_TOKEN_EVERY", 0.0)  # the next such sync comes after the wait
    gate.set()
    await _until(lambda: store.get_meta(SYNC_TOKEN) == "s5")
    assert pipeline.jobs == 3 and pipeline.durable == ["$a", "$b"]
    await _stopped(loop, stop)


async def test_a_poll_while_the_first_posting_goes_on_stores_the_token_of_each_sync(tmp_path: Path,
                                                                                   monkeypatch: Any) -> None:
    """A poll is asked from the token in the store: a sync of the bridge's
    own messages alone still stores its token, or every poll would ask from
    the same one again, over more of the bridge's posted questions each time
    (an answer sent while 10,000 were posted waited 30 s)."""
    monkeypatch.setattr(bot, "POSTING_POLL", 0.01)
    store = _store(tmp_path)
    ack = ("$posted", _Homeserver.user_id)
    homeserver = _Homeserver(store, {"s1": _batch(None, "s2", ack), "s2": _batch(None, "s3", ack),
                                     "s3": _batch("$a", "s4")})
    pipeline, stop, posting = _Pipeline(store), asyncio.Event(), asyncio.Event()
    pipeline.release.set()
    loop = asyncio.ensure_future(SyncLoop(homeserver, store, pipeline, stop, posted=posting).run())
    await _until(lambda: pipeline.durable == ["$a"])
    assert [since for since, _ in homeserver.asked[:3]] == ["s1", "s2", "s3"]
    assert homeserver.timeouts[:3] == [0, 0, 0]
    await _until(lambda: store.get_meta(SYNC_TOKEN) == "s4")
    await _stopped(loop, stop)


async def test_a_batch_asked_ahead_is_made_durable_only_after_the_one_before(tmp_path: Path) -> None:
    store = _store(tmp_path)
    batches = {"s1": _batch("$a", "s2"), "s2": _batch("$b", "s3")}
    homeserver, pipeline, stop = _Homeserver(store, batches), _Pipeline(store), asyncio.Event()
    pipeline.commit_may_end = threading.Event()
    pipeline.release.set()
    loop = asyncio.ensure_future(SyncLoop(homeserver, store, pipeline, stop).run())
    await _until(lambda: len(homeserver.asked) == 2)
    await asyncio.sleep(0.1)  # the second batch has arrived; the first is still being committed
    assert pipeline.durable == [] and homeserver.durable_token() == "s1"
    pipeline.commit_may_end.set()
    await _until(lambda: pipeline.durable == ["$a", "$b"])
    assert store.get_meta(SYNC_TOKEN) == "s3"
    await _stopped(loop, stop)


@pytest.mark.parametrize("where, asked, cancelled", [
    # Failed before its commit: nothing was asked past it.
    ({"failures": 1}, ["s1", "s1", "s2"], []),
    # Failed in its commit: asked from it, then dropped.
    ({"failed_commits": 1}, ["s1", "s2", "s1", "s2"], ["s2"]),
])
async def test_a_failed_batch_is_retried_from_the_durable_token(tmp_path: Path, where: dict[str, int],
                                                                asked: list[str], cancelled: list[str]) -> None:
    store = _store(tmp_path)
    homeserver, pipeline, stop = _Homeserver(store, {"s1": _batch("$a", "s2")}), _Pipeline(store, **where), \
        asyncio.Event()
    pipeline.release.set()
    loop = asyncio.ensure_future(SyncLoop(homeserver, store, pipeline, stop).run())
    # The next long poll is asked once the batch is durable, by the event loop
    # the commit hands it to: wait for it too, not only for the batch.
    await _until(lambda: pipeline.durable == ["$a"] and len(homeserver.asked) >= len(asked))
    # The retry went from the store's token, and the batch was made durable once.
    assert [since for since, _ in homeserver.asked] == asked
    assert homeserver.cancelled[:len(cancelled)] == cancelled
    assert store.get_meta(SYNC_TOKEN) == "s2"
    await _stopped(loop, stop)


async def test_a_crash_with_a_sync_asked_ahead_replays_from_the_durable_token(tmp_path: Path) -> None:
    store = _store(tmp_path)
    homeserver = _Homeserver(store, {"s1": _batch("$a", "s2")})
    pipeline, stop = _Pipeline(store, failed_commits=1), asyncio.Event()
    pipeline.commit_may_end = threading.Event()
    pipeline.release.set()
    loop = asyncio.ensure_future(SyncLoop(homeserver, store, pipeline, stop).run())
    await _until(lambda: len(homeserver.asked) == 2)
    # The process dies with the batch's COMMIT not made and the next sync out.
    loop.cancel()
    pipeline.commit_may_end.set()
    await asyncio.gather(loop, return_exceptions=True)
    await _until(lambda: pipeline.failed_commits == 0)
    assert homeserver.durable_token() == "s1"
    # The next start asks from the last durable token and makes the batch durable.
    restarted = _Homeserver(store, {"s1": _batch("$a", "s2")})
    loop = asyncio.ensure_future(SyncLoop(restarted, store, pipeline, asyncio.Event()).run())
    await _until(lambda: pipeline.durable == ["$a"])
    assert restarted.asked[0] == ("s1", "s1")
    assert store.get_meta(SYNC_TOKEN) == "s2"
    loop.cancel()
    await asyncio.gather(loop, return_exceptions=True)


class _KeepingCrypto:
    """Encryption whose screening keeps an event for its key: from then on
    the loop must be back within 200 ms (its key asked again, say)."""

    client = SimpleNamespace(olm=None)  # nio: the syncs here carry nothing for the device

    def __init__(self) -> None:
        self.kept = False

    def note_events(self, events: list[dict[str, Any]]) -> None:
        pass

    def waits_for_chores(self, events: list[dict[str, Any]]) -> bool:
        return False

    async def chores(self) -> None:
        pass

    async def sync_timeout_ms(self, default: int) -> int:
        return min(default, 200) if self.kept else default

    async def screen(self, events: list[dict[str, Any]], is_own: Any) -> tuple[list[dict[str, Any]], list[str]]:
        self.kept = True
        return events, []


async def test_a_batch_that_keeps_an_event_asks_the_long_poll_again_to_wake_in_time(tmp_path: Path) -> None:
    store = _store(tmp_path)
    homeserver, pipeline, stop = _Homeserver(store, {"s1": _batch("$a", "s2")}), _Pipeline(store), asyncio.Event()
    pipeline.release.set()
    loop = asyncio.ensure_future(SyncLoop(homeserver, store, pipeline, stop, crypto=_KeepingCrypto()).run())
    await _until(lambda: pipeline.durable == ["$a"] and len(homeserver.asked) >= 3)
    # The long poll asked ahead (30 s) was asked again from the same token
    # with the timeout the kept event needs, then again as each returns.
    assert homeserver.timeouts[:3] == [30000, 30000, 200]
    assert [since for since, _ in homeserver.asked[:3]] == ["s1", "s2", "s2"]
    assert homeserver.cancelled[:1] == ["s2"]
    await _stopped(loop, stop)


class _LookAtTheStore(_KeepingCrypto):
    """Each look at the kept events after the first waits for ``free`` (a
    job on the store's thread behind a slow one): ``looks`` counts them."""

    def __init__(self, kept: bool = False) -> None:
        super().__init__()
        self.kept = kept
        self.looks = 0
        self.free = asyncio.Event()

    async def sync_timeout_ms(self, default: int) -> int:
        self.looks += 1
        if self.looks > 1:
            await self.free.wait()
        return await super().sync_timeout_ms(default)

    async def screen(self, events: list[dict[str, Any]], is_own: Any) -> tuple[list[dict[str, Any]], list[str]]:
        return events, []


async def test_the_long_poll_asked_ahead_waits_for_no_look_at_the_kept_events(tmp_path: Path) -> None:
    store = _store(tmp_path)
    homeserver, pipeline, stop = _Homeserver(store, {"s1": _batch("$a", "s2")}), _Pipeline(store), asyncio.Event()
    crypto = _LookAtTheStore()
    pipeline.commit_may_end = threading.Event()
    pipeline.release.set()
    loop = asyncio.ensure_future(SyncLoop(homeserver, store, pipeline, stop, crypto=crypto).run())
    # Nothing was kept at the first look: the next long poll is out from the
    # batch's commit, not after a second look (a job on the store's thread,
    # busy with that commit).
    await _until(lambda: len(homeserver.asked) == 2)
    assert crypto.looks == 1 and homeserver.timeouts == [30000, 30000]
    pipeline.commit_may_end.set()
    await _until(lambda: pipeline.durable == ["$a"])
    crypto.free.set()
    # Once the batch is durable the kept events are looked at again (it kept none: nothing asked again).
    await _until(lambda: crypto.looks == 2)
    assert len(homeserver.asked) == 2
    await _stopped(loop, stop)


async def test_with_an_event_kept_at_the_last_look_the_long_poll_asked_ahead_wakes_in_time(tmp_path: Path) -> None:
    store = _store(tmp_path)
    homeserver, pipeline, stop = _Homeserver(store, {"s1": _batch("$a", "s2")}), _Pipeline(store), asyncio.Event()
    crypto = _LookAtTheStore(kept=True)
    crypto.free.set()
    pipeline.release.set()
    loop = asyncio.ensure_future(SyncLoop(homeserver, store, pipeline, stop, crypto=crypto).run())
    await _until(lambda: pipeline.durable == ["$a"] and len(homeserver.asked) >= 2)
    assert homeserver.timeouts[:2] == [200, 200]
    await _stopped(loop, stop)


class _WaitsForTheLoop(_Pipeline):
    """Judging waits (up to 10 s) for the event loop to say it is free."""

    def __init__(self, store: Store):
        super().__init__(store)
        self.judging = threading.Event()
        self.loop_free = threading.Event()
        self.saw_the_loop = False

    def process(self, events: list[dict[str, Any]], *, commit: Any) -> None:
        self.judging.set()
        self.saw_the_loop = self.loop_free.wait(10)
        super().process(events, commit=commit)


async def test_a_batch_is_judged_while_the_event_loop_serves_everything_else(tmp_path: Path) -> None:
    store = _store(tmp_path)
    homeserver, pipeline, stop = _Homeserver(store, {"s1": _batch("$a", "s2")}), _WaitsForTheLoop(store), \
        asyncio.Event()
    pipeline.release.set()
    loop = asyncio.ensure_future(SyncLoop(homeserver, store, pipeline, stop).run())
    await _until(pipeline.judging.is_set)
    pipeline.loop_free.set()  # this coroutine runs while the batch is judged (/health would, too)
    await _until(lambda: pipeline.durable == ["$a"])
    assert pipeline.saw_the_loop
    await _stopped(loop, stop)


class _KeptAndSlowToLook(_KeepingCrypto):
    """Keeps an event, and its look after the batch (the store's thread
    busy) lasts until the long poll asked ahead has been answered."""

    def __init__(self, looking: asyncio.Event, answered: asyncio.Event) -> None:
        super().__init__()
        self.looking, self.answered = looking, answered

    async def sync_timeout_ms(self, default: int) -> int:
        if self.kept and not self.answered.is_set():
            self.looking.set()
            await self.answered.wait()
            await asyncio.sleep(0.05)  # its response in the loop's hands
        return await super().sync_timeout_ms(default)


async def test_a_long_poll_answered_while_the_kept_events_are_looked_at_is_kept(tmp_path: Path) -> None:
    store = _store(tmp_path)
    homeserver = _Homeserver(store, {"s1": _batch("$a", "s2"), "s2": _batch("$b", "s3")})
    pipeline, stop = _Pipeline(store), asyncio.Event()
    looking, answered = asyncio.Event(), asyncio.Event()
    sync_body = homeserver.sync_body

    async def answered_during_the_look(timeout: int, sync_filter: Any, since: str | None) -> dict[str, Any]:
        if since == "s2" and not answered.is_set():
            await looking.wait()
            body = await sync_body(timeout, sync_filter, since)
            answered.set()
            return body
        return await sync_body(timeout, sync_filter, since)

    homeserver.sync_body = answered_during_the_look  # type: ignore[method-assign]
    pipeline.release.set()
    loop = asyncio.ensure_future(SyncLoop(homeserver, store, pipeline, stop,
                                          crypto=_KeptAndSlowToLook(looking, answered)).run())
    await _until(lambda: pipeline.durable == ["$a", "$b"])
    # The answer to the long poll from s2 was handled, not dropped and asked for again.
    assert [since for since, _ in homeserver.asked].count("s2") == 1, homeserver.asked
    assert "s2" not in homeserver.cancelled
    await _stopped(loop, stop)


async def test_a_token_the_store_cannot_read_for_a_while_stops_neither_the_loop_nor_the_event_loop(
        tmp_path: Path, monkeypatch: Any) -> None:
    """With a table locked by an operator, reading the sync token waited
    for the lock on the event loop (/health stalled for seconds), and its
    error ended the transport task, restarted by the supervisor up to 60 s
    later: answers waited 23 s after the lock was gone."""
    store = _store(tmp_path)
    homeserver, pipeline, stop = _Homeserver(store, {"s1": _batch("$a", "s2")}), _Pipeline(store), asyncio.Event()
    pipeline.release.set()
    read_on: list[int] = []
    failures = [sqlite3.OperationalError("canceling statement due to lock timeout")]
    get_meta = store.get_meta

    def slow_get_meta(key: str) -> Any:
        if key == SYNC_TOKEN:
            read_on.append(threading.get_ident())
            if failures:
                raise failures.pop()
        return get_meta(key)

    monkeypatch.setattr(store, "get_meta", slow_get_meta)
    monkeypatch.setattr(bot, "sleep_or_stop", lambda stop, seconds, **kw: asyncio.sleep(0.01))
    loop = asyncio.ensure_future(SyncLoop(homeserver, store, pipeline, stop).run())
    await _until(lambda: pipeline.durable == ["$a"])
    assert not loop.done()
    assert read_on and threading.get_ident() not in read_on  # never on the event loop's thread
    await _stopped(loop, stop)
