"""The long-running bridge: wires the store, the homeserver, the poster, the
folder watcher and one transport (sync loop or appservice) together.

Both modes share one start-up path; a *front* supplies what differs: how the
client gets its credentials, which users are the bridge's own, and how events
arrive (``SyncLoop`` pulling, or the homeserver pushing transactions).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol

from nio import AsyncClient
from watchfiles import awatch

from bridge.questionset.load import LoadError
from bridge.questionset.model import QuestionSet
from bridge.questionset.setdir import load_set_dir
from bridge.service.appservice import AppserviceFront
from bridge.service.bot import SyncLoop, login, prime_sync_token, sleep_or_stop
from bridge.service.config import Config, ConfigError
from bridge.service.crypto import Crypto
from bridge.service.matrix import MatrixError, NioTransport
from bridge.service.pipeline import Pipeline
from bridge.service.poster import Poster
from bridge.service.rooms import configured_rooms, join_rooms, keep_joining
from bridge.service.heldback import format_held, held_back
from bridge.service.operators import Operators
from bridge.service.metrics import Metrics
from bridge.service.store import LogEntry, Store

if TYPE_CHECKING:
    from bridge.service.leader import Lease

log = logging.getLogger(__name__)


class Front(Protocol):
    async def connect(self, stop: asyncio.Event) -> AsyncClient: ...

    def own_user(self, user_id: str) -> bool: ...

    async def open(self, pipeline: Pipeline) -> None:
        """Called once the pipeline exists, before rooms are joined."""

    async def run(self, pipeline: Pipeline, rooms: list[str], stop: asyncio.Event, posted: asyncio.Event) -> None:
        """Feed events to the pipeline until ``stop``; ``posted`` is set once
        the first posting is done."""

    async def close(self) -> None: ...


class BotFront:
    """Bot mode: an ordinary account on a sync loop."""

    def __init__(self, config: Config, store: Store, on_synced: Callable[[], None] | None = None,
                 on_outcome: Callable[[LogEntry], None] | None = None):
        self.config = config
        self.store = store
        self.on_synced = on_synced
        self.on_outcome = on_outcome
        self.client: AsyncClient | None = None
        self.crypto: Crypto | None = None  # set when the client encrypts; the transport uses it too

    async def connect(self, stop: asyncio.Event) -> AsyncClient:
        self.client = await login(self.config, self.store)
        if self.client.olm is not None:
            self.crypto = Crypto(self.client, self.store, self.config.encryption, on_outcome=self.on_outcome)
        return self.client

    def own_user(self, user_id: str) -> bool:
        return self.client is not None and user_id == self.client.user_id

    async def open(self, pipeline: Pipeline) -> None:
        assert self.client is not None
        await prime_sync_token(self.client, self.store)
        if self.crypto is not None:
            await self.crypto.start()

    async def run(self, pipeline: Pipeline, rooms: list[str], stop: asyncio.Event, posted: asyncio.Event) -> None:
        assert self.client is not None
        await SyncLoop(self.client, self.store, pipeline, stop, on_synced=self.on_synced, crypto=self.crypto,
                       rooms=[*rooms, *configured_rooms(self.config)], inviters=self.config.inviters,
                       posted=posted).run()

    async def close(self) -> None:
        return None


def load_set(set_dir: Path) -> tuple[QuestionSet | None, list[str]]:
    """A set the bridge may post: it loads and lints without error."""
    try:
        result = load_set_dir(set_dir, probe=False)
    except LoadError as exc:
        return None, [exc.message]
    errors = [f"{finding.where}: {finding.message}" for finding in result.errors]
    if errors or result.model is None:
        return None, errors or ["the set could not be read"]
    return result.model, []


def make_front(config: Config, store: Store, ops: Operators) -> Front:
    if config.appservice.enabled:
        return AppserviceFront(config, store, ops)
    return BotFront(config, store, on_synced=ops.mark_ready, on_outcome=ops.on_outcome)


async def serve(config: Config, stop: asyncio.Event, lease: Lease | None = None) -> None:
    """The bridge until ``stop``.  ``lease``: this instance leads a shared
    PostgreSQL store, and every write it makes is fenced by that lease."""
    store = Store(config.store.path, url=config.store.url, password=config.store.password)
    metrics = Metrics()
    if lease is not None:
        lease.guard_store(store)
        metrics.set_role("leader")
    ops = Operators(config, store, metrics)
    front = make_front(config, store, ops)
    client: AsyncClient | None = None
    try:
        client = await front.connect(stop)
        if stop.is_set():
            return
        transport = NioTransport(client, crypto=getattr(front, "crypto", None))
        if lease is not None:
            transport = lease.guard_transport(transport)
        pipeline = Pipeline(store=store, transport=transport, answerers=frozenset(config.answerers) or None,
                            own_users=front.own_user, on_outcome=ops.on_outcome, on_batch=ops.on_batch,
                            on_write=ops.on_write, is_command=ops.is_command, on_trouble=ops.on_trouble)
        if lease is not None:
            pipeline.may_write = lease.check
        await front.open(pipeline)
        if lease is not None and getattr(front, "server", None) is not None:
            front.server.fence = lease.check  # type: ignore[attr-defined]
        rooms, refused = await join_rooms(transport, configured_rooms(config), stop)
        for room in rooms:
            await pipeline.load_members(room)
        # Heal a crash between the store commit and the folder write.  A set
        # that can't be written is held back on its own and a logged answer
        # that can't be projected any more is set aside: stored state never
        # stops the start.
        pipeline.flush()
        if held := format_held(held_back(store)):
            log.warning("started with things held back:\n%s", held.rstrip())
        poster = Poster(store, transport, config.room_for, load_set, on_posted=ops.on_posted)
        await ops.start(send=transport.send, poster=poster, own_user=front.own_user, stop=stop,
                        serve_http=not config.appservice.enabled)
        # Answers are taken in while the sets are posted: a first posting of
        # thousands of questions takes minutes, and the first questions are
        # answered long before the last is sent.  Notices an earlier run left
        # unsent go out from the front's notifier, beside the first batch.
        posted = asyncio.Event()


        async def joined(room_id: str) -> None:
            rooms.append(room_id)  # the list the front holds: its events are bridged from now on
            await pipeline.load_members(room_id)

        tasks = [asyncio.ensure_future(front.run(pipeline, rooms, stop, posted)),
                 asyncio.ensure_future(keep_joining(transport, refused, stop, joined)),
                 asyncio.ensure_future(keep_sets(poster, config.sets.root, stop, posted))]
        await stop.wait()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await ops.close()
        await front.close()
        if client is not None:
            await client.close()
        store.close()


async def keep_sets(poster: Poster, root: Path, stop: asyncio.Event, posted: asyncio.Event) -> None:
    """Post what is not posted yet, then follow the folder.  The watcher starts
    first, so an edit made during a long first posting is not missed (the
    poster takes one set at a time, so both never post the same set at once)."""
    watcher = asyncio.ensure_future(watch_sets(poster, root, stop))
    failed: list[Path] = []
    try:
        failed = (await poster.sync_root(root, stop)).failed
    except Exception:  # noqa: BLE001 - the folder itself could not be read: every set is tried again
        log.exception("reading the sets failed")
        failed = [root]
    posted.set()
    delay = 1.0
    while failed and not stop.is_set():
        # A set that could not be posted (its room refuses the bridge, say) is
        # tried again with backoff; the others are long posted.
        await sleep_or_stop(stop, delay)
        delay = min(delay * 2, 300)
        try:
            again = poster.sync_root(root, stop) if failed == [root] else poster.sync_dirs(failed, stop)
            failed = (await again).failed
        except Exception:  # noqa: BLE001 - as above
            log.exception("reading the sets failed")
    await watcher


async def watch_sets(poster: Poster, root: Path, stop: asyncio.Event) -> None:
    async for changes in awatch(root, stop_event=stop, debounce=200, step=50, recursive=True,
                                watch_filter=lambda _change, path: path.endswith("questions.json")):
        try:
            # Only the sets that changed are read again, not every set under the root.
            await poster.sync_changed(root, [path for _change, path in changes])
        except Exception:  # noqa: BLE001 - a bad edit must not stop the bridge
            log.exception("re-reading the sets failed")


def run_forever(config: Config) -> int:
    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if config.store.url:
            from bridge.service.standby import run_with_standby  # psycopg only when it is used

            await run_with_standby(config, stop, serve)  # several instances may share the store
        else:
            await serve(config, stop)

    try:
        asyncio.run(main())
    except (ConfigError, MatrixError) as exc:
        # Credentials the homeserver refuses will not fix themselves: say so and stop.
        log.error("cannot start: %s", exc)
        return 1
    return 0
