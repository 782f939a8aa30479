"""The long-running bridge: wires the store, the homeserver, the poster, the
folder watcher and one transport (sync loop or appservice) together.

Both modes share one start-up path; a *front* supplies what differs: how the
client gets its credentials, which users are the bridge's own, and how events
arrive (``SyncLoop`` pulling, or the homeserver pushing transactions).
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import os
import signal
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Protocol, TypeVar

from nio import AsyncClient
from watchfiles import Change, awatch

from bridge.service.eventwait import any_set
from bridge.answers.file import remove_stray_temps
from bridge.questionset.setdir import QUESTIONS_FILE
from bridge.service.posting.sets import folders, load_set
from bridge.service.posting.insend import settle as settle_sent
from bridge.service.transport.bot import FirstSync, SyncLoop, ask_first_sync, login, prime_sync_token
from bridge.service.config import Config, ConfigError
from bridge.service.operators import taskdump
from bridge.service.transport.matrix import MatrixError, NioTransport, TokenRefused
from bridge.service.answering.pipeline import Pipeline
from bridge.service.storage.setpaths import SetsElsewhere, check_sets_where_known, warn_sets_outside
from bridge.service.transport.invites import Invites, admin_rooms
from bridge.service.transport.rooms import RoomIds, configured_rooms, join_rooms, keep_joining
from bridge.service.storage.heldback import format_held, held_back
from bridge.service.operators.operators import EARLY_HEALTH_SECONDS, Operators
from bridge.service.operators.metrics import Metrics
from bridge.service.storage.store import LogEntry, Store
from bridge.service.auditing.checkpoints import Checkpointer, open_log
from bridge.service.auditing.witness import witness_file
from bridge.service.auditing.keys import LogKeyError
from bridge.service.descriptors import raise_to_hard_limit
from bridge.service.supervisor import Supervisor
from bridge.wholefile import STRAY_SECONDS, TEMP_MARK, remove_stray_folders

# What only posting, the folder watch, encryption or appservice mode needs is
# imported where it is first used: the first sync (and the answers waiting in
# it) should not wait on code it does not run (docs/architecture.md, start-up).
if TYPE_CHECKING:
    from bridge.service.encryption.crypto import Crypto
    from bridge.service.storage.leader import Lease
    from bridge.service.posting.poster import Poster

log = logging.getLogger(__name__)
T = TypeVar("T")


class Front(Protocol):
    # Set once the first batch is handled: bot mode's first sync; at once in
    # appservice mode, where nothing comes until the homeserver pushes it.
    first_batch: asyncio.Event

    async def connect(self, stop: asyncio.Event) -> AsyncClient: ...

    def own_user(self, user_id: str) -> bool: ...

    async def open(self, pipeline: Pipeline) -> None:
        """Called once the pipeline exists, before rooms are joined."""

    async def run(self, pipeline: Pipeline, rooms: list[str], stop: asyncio.Event, posted: asyncio.Event,
                  room_ids: RoomIds | None = None) -> None:
        """Feed events to the pipeline until ``stop``; ``posted`` is set once
        the first posting is done; ``room_ids`` learns a configured alias's
        room when an invite joins it."""

    async def close(self) -> None: ...


class BotFront:
    """Bot mode: an ordinary account on a sync loop."""

    def __init__(self, config: Config, store: Store, on_synced: Callable[[], None] | None = None,
                 on_outcome: Callable[[LogEntry], None] | None = None, supervisor: Supervisor | None = None):
        self.config = config
        self.supervisor = supervisor
        self.store = store
        self.on_synced = on_synced
        self.on_outcome = on_outcome
        self.first_batch = asyncio.Event()
        self.client: AsyncClient | None = None
        self.crypto: Crypto | None = None  # set when the client encrypts; the transport uses it too
        self.first_sync: FirstSync | None = None

    async def connect(self, stop: asyncio.Event) -> AsyncClient:
        self.client = await login(self.config, self.store)
        if self.client.olm is not None:
            from bridge.service.encryption.crosssigning import CrossSigning, keys_file
            from bridge.service.encryption.crypto import Crypto

            signing = CrossSigning(self.client, keys_file(self.config.store.path, self.config.encryption.cross_signing_keys),
                                   self.config.bot.password)
            self.crypto = Crypto(self.client, self.store, self.config.encryption, on_outcome=self.on_outcome,
                                 cross_signing=signing)
        return self.client

    def own_user(self, user_id: str) -> bool:
        return self.client is not None and user_id == self.client.user_id

    async def open(self, pipeline: Pipeline) -> None:
        assert self.client is not None
        await prime_sync_token(self.client, self.store)
        if self.crypto is not None:
            await self.crypto.start()
        # Asked for now, answered while the rooms are joined and their members read.
        self.first_sync = ask_first_sync(self.client, self.store)

    async def run(self, pipeline: Pipeline, rooms: list[str], stop: asyncio.Event, posted: asyncio.Event,
                  room_ids: RoomIds | None = None) -> None:
        assert self.client is not None
        first_sync, self.first_sync = self.first_sync, None
        invites = Invites.of(self.client, pipeline, rooms, self.config, self.store, room_ids)
        await SyncLoop(self.client, self.store, pipeline, stop, on_synced=self._synced, crypto=self.crypto,
                       invites=invites, posted=posted, first_sync=first_sync, supervisor=self.supervisor).run()

    def _synced(self) -> None:
        self.first_batch.set()
        if self.on_synced is not None:
            self.on_synced()

    async def close(self) -> None:
        if self.first_sync is not None:  # stopped before the loop took it
            self.first_sync[1].cancel()
            await asyncio.gather(self.first_sync[1], return_exceptions=True)
        if self.crypto is not None:
            await self.crypto.close()


def make_front(config: Config, store: Store, ops: Operators) -> Front:
    if config.appservice.enabled:
        from bridge.service.transport.appservice import AppserviceFront

        return AppserviceFront(config, store, ops)
    return BotFront(config, store, on_synced=ops.synced, on_outcome=ops.on_outcome, supervisor=ops.supervisor)


async def serve(config: Config, stop: asyncio.Event, lease: Lease | None = None) -> None:
    """The bridge until ``stop``.  ``lease``: this instance leads a shared
    PostgreSQL store, and every write it makes is fenced by that lease."""
    store = Store(config.store.path, url=config.store.url, password=config.store.password)
    store.audit_enabled = config.audit.enabled
    checkpointer: Checkpointer | None = None
    try:
        # Sets moved without the store: posted again, every one (``setpaths``).
        open_folders = store.folders_with_open()
        check_sets_where_known(open_folders, config)
        warn_sets_outside(open_folders, config)
        if config.audit.enabled:
            log_plan = open_log(store, user_id=config.bot.user_id, store_path=config.store.path,
                                key_file=config.audit.key_file)
            checkpointer = Checkpointer(store, log_plan, config.audit.checkpoint_seconds,
                                        witness=witness_file(log_plan.path))
    except BaseException:
        store.close()
        raise
    metrics = Metrics()
    if lease is not None:
        lease.guard_store(store)
        metrics.follow_lease(lambda: lease.leading)
        metrics.store_trouble = lease.unreached
    ops = Operators(config, store, metrics)
    front = make_front(config, store, ops)
    client: AsyncClient | None = None
    media: Any = None  # the transport's own connections for files people send
    ops.count_errors()
    if not config.appservice.enabled:
        metrics.listening()
        ops.serve_while_starting(front.first_batch)
    try:
        # A homeserver that does not answer at start (nio asks again and
        # again) must not keep a stop waiting: SIGTERM ends the start too.
        client = await _connect_answering_health(config, front, stop)
        if client is None or stop.is_set():
            return
        transport = NioTransport(client, crypto=getattr(front, "crypto", None))
        media = transport.media
        if ops.agents is not None:  # an agent's media upload is told when the homeserver would refuse the file
            ops.agents.sets.upload_limit = transport.upload_limit
        if lease is not None:
            transport = lease.guard_transport(transport)
        pipeline = Pipeline(store=store, transport=transport, answerers=frozenset(config.answerers) or None,
                            own_users=front.own_user, on_outcome=ops.on_outcome, on_batch=ops.on_batch,
                            on_write=ops.on_write, is_command=ops.is_command, on_trouble=ops.on_trouble,
                            on_logged=ops.on_logged, on_set_written=ops.on_set_changed,
                            on_processed=ops.metrics.batch_ended,
                            attachment_max_bytes=config.attachments.max_bytes)
        ops.metrics.rooms_removed = lambda: dict(pipeline.removed)
        if lease is not None:
            pipeline.may_write = lease.check
        # An answers.json deleted while the bridge was down is written again
        # whole (the store holds every answer), before the first batch.
        try:
            rewritten = await store.run(pipeline.rewrite_missing)
        except Exception as exc:  # noqa: BLE001 - the answers stay in the store; the sets' next writes are whole
            log.warning("answers.json files missing at the start not written again (%s)", exc)
        else:
            if rewritten:
                log.info("answers.json written again whole in %d set folder(s) that had lost it", rewritten)
        await front.open(pipeline)
        if lease is not None and getattr(front, "server", None) is not None:
            front.server.fence = lease.check  # type: ignore[attr-defined]
        if lease is not None and ops.agents is not None:
            ops.agents.sets.fence = lease.check  # the agents' writes too: a set, a close, a media file
        room_ids = RoomIds()
        rooms, refused = await join_rooms(transport, configured_rooms(config), stop, room_ids,
                                         asking=[*store.rooms_with_open(), *admin_rooms(store, config.admins)])
        # The first batch waits for every room's members: asked for together.
        await asyncio.gather(*(pipeline.load_members(room) for room in rooms))
        # A question the last instance sent and did not record is recorded
        # before the first batch: answers to it may be in that batch.
        await unless_stopped(settle_sent(store, transport, on_closed=ops.on_closed), stop)
        # Heal a crash between the store commit and the folder write.  A set
        # that can't be written is held back on its own and a logged answer
        # that can't be projected any more is set aside: stored state never
        # stops the start.  On the store's thread: the front already answers
        # (/health, the homeserver's pushes), and a new leader may have many
        # sets to write.
        await store.run(pipeline.flush)
        # A writer killed mid-write (this instance, or the leader before it) left a temp file.
        await asyncio.to_thread(remove_strays, config.sets.root)
        try:
            held = format_held(await store.run(held_back, store))
        except sqlite3.Error as exc:  # the database away a moment: said at the next /health
            held = ""
            log.warning("what is held back could not be read at start (%s)", exc)
        if held:
            log.warning("started with things held back:\n%s", held.rstrip())
        # Answers are taken in while the sets are posted: a first posting of
        # thousands of questions takes minutes, and the first questions are
        # answered long before the last is sent.  Notices an earlier run left
        # unsent go out from the front's notifier, beside the first batch.
        posted = asyncio.Event()

        async def joined(room_id: str) -> None:
            if room_id not in rooms:  # joining again after a restart of the task
                rooms.append(room_id)  # the list the front holds: its events are bridged from now on
            # In again: cleared now, not only once its join event is read.
            pipeline.removed.pop(room_id, None)
            await pipeline.load_members(room_id)

        async def after_the_first_batch() -> None:
            # The answers waiting at start come first: the sets folder is
            # scanned (and the poster's code loaded), the operators' services
            # started, once the first batch is in.  Commands in it wait for them.
            await sleep_or_stop_event(stop, front.first_batch)
            if stop.is_set():
                return
            if checkpointer is not None and ops.agents is not None:
                # An agent asking right after its answer gets a checkpoint
                # covering it (not before the first batch: the answers waiting
                # at start come before the log is read to sign it).
                ops.agents.log.signer = checkpointer.sign_if_grown
            from bridge.service.posting.poster import Poster

            poster = Poster(store, transport, room_ids.resolving(config.room_for),
                            functools.partial(load_set, posted_revs_of=store.posted_revs_of,
                                              answerers=config.answerers),
                            on_posted=ops.on_posted, on_closed=ops.on_closed)
            from bridge.service.answering.deadlines import Deadlines

            # Deadlines, quorum decisions and escalations: a pass at once (what
            # expired while the bridge was down), then every second.
            poster.deadlines = Deadlines(store, transport, flush=pipeline.flush, on_decided=ops.on_decided,
                                         on_expired=ops.on_expired, on_closed=ops.on_closed)
            deadlines, logged = poster.deadlines, ops.on_logged

            def on_logged(entry: LogEntry) -> None:
                logged(entry)
                if entry.question_event_id:  # a vote may change what the deadline's edit must say
                    deadlines.touch(entry.question_event_id)

            pipeline.on_logged = on_logged
            await ops.start(send=transport.send, poster=poster, own_user=front.own_user, stop=stop,
                            serve_http=not config.appservice.enabled)
            # What start-up made (the code, the sets, the first sync's state)
            # lives as long as the bridge: kept out of the collector's full
            # passes, which walked it all (60 ms in the latency bench, every
            # thread stopped, a batch with them) and found nothing to free.
            gc.freeze()
            await asyncio.gather(supervise("joining", lambda: keep_joining(transport, refused, stop, joined, room_ids),
                                           stop),
                                 supervise("sets", lambda: keep_sets(poster, config.sets.root, stop, posted,
                                                                         ops.on_set_changed, room_ids.news), stop),
                                 supervise("deadlines", lambda: poster.deadlines.run(
                                     stop, after=getattr(front, "looked_back", None)), stop),
                                 supervise("strays", lambda: keep_removing_strays(config.sets.root, stop), stop),
                                 return_exceptions=True)

        # The transport, the folder watch and the joining run under the
        # operators' supervisor: one that raises is restarted and shown in /health.
        supervise = ops.supervisor.spawn
        after = asyncio.ensure_future(after_the_first_batch())
        transport_task = supervise("transport", lambda: front.run(pipeline, rooms, stop, posted, room_ids), stop)
        tasks = [transport_task, after,
                 # Files still coming when their batch went on, and those a stop cut short.
                 supervise("downloads", lambda: pipeline.downloads.run(stop, after=front.first_batch), stop)]
        if checkpointer is not None:
            checkpointer.put_state = transport.put_state
            checkpointer.rooms = lambda: rooms
            tasks.append(supervise("checkpoints", lambda: checkpointer.run(stop, after=front.first_batch), stop))
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait([stopped, after, transport_task], return_when=asyncio.FIRST_COMPLETED)
        failed = next((t for t in (after, transport_task)
                       if t.done() and not t.cancelled() and t.exception() is not None), None)
        if failed is not None:
            # The operators could not start (the metrics port taken, say), or
            # the transport met what no restart mends (its token refused): the
            # bridge stops with the reason.
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise failed.exception()  # type: ignore[misc]
        await stop.wait()
        await asyncio.gather(*tasks, stopped, return_exceptions=True)
    finally:
        await ops.close()
        await front.close()
        if media is not None:
            await media.close()
        if client is not None:
            await client.close()
        store.close()


async def _connect_answering_health(config: Config, front: Front, stop: asyncio.Event) -> AsyncClient | None:
    """The front's client, once the homeserver answers.  In appservice mode
    /health is the appservice listener's, which opens only after: a start
    waiting for the homeserver answered nothing there (an orchestrator's
    probe read a refused connection as dead, and restarted it), so after a
    moment the address answers 503, not ready, waiting for the homeserver."""
    connecting = asyncio.ensure_future(unless_stopped(front.connect(stop), stop))
    waiting = None
    if config.appservice.enabled:
        done, _ = await asyncio.wait([connecting], timeout=EARLY_HEALTH_SECONDS)
        if not done:
            from bridge.service.operators.starting import StartingHealth

            try:
                waiting = StartingHealth(config.appservice.listen_host_port)
                waiting.why = "homeserver"
            except OSError as exc:  # the port taken: the listener meets it again and says so
                log.warning("/health not served while the homeserver is waited for: %s", exc)
    try:
        return await connecting
    finally:
        if waiting is not None:
            await asyncio.to_thread(waiting.close)  # the address free for the appservice listener


async def unless_stopped(work: Awaitable[T], stop: asyncio.Event) -> T | None:
    """``work``'s result, or None once ``stop`` is set first (``work`` is then cancelled)."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    finally:
        stopped.cancel()
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return None
    return task.result()


def remove_strays(root: Path) -> None:
    """What writers that died left under the root: temp files in its folders
    (a set whose lock is held now is left for the next start), and folders
    the agents' API was making a set in (it makes them in the root only)."""
    for folder, files in folders(root):
        # The walk's own listing says whether a folder holds a temp file at all: most hold none.
        if any(TEMP_MARK in name for name in files) and (removed := remove_stray_temps(folder, wait=False)):
            log.info("removed %s, left in %s by a writer that died", ", ".join(removed), folder)
    if root.is_dir():
        for name in remove_stray_folders(root):
            log.info("removed the folder %s, left in %s by a writer that died", name, root)


async def keep_removing_strays(root: Path, stop: asyncio.Event) -> None:
    """``remove_strays`` every STRAY_SECONDS: a temp file another machine's
    writer left (a leader killed mid-write) is kept at the start, while that
    writer may still be alive, and was then left until the next start."""
    while not stop.is_set():
        await any_set([stop], STRAY_SECONDS)
        if not stop.is_set():
            await asyncio.to_thread(remove_strays, root)


async def keep_sets(poster: Poster, root: Path, stop: asyncio.Event, posted: asyncio.Event,
                    on_changed: Callable[[str], None] | None = None, joins: asyncio.Event | None = None) -> None:
    """Post what is not posted yet, then follow the folder.  The watcher starts
    first, so an edit made during a long first posting is not missed (the
    poster takes one set at a time, so both never post the same set at once).
    ``on_changed`` is told each set folder whose questions.json changed.  A
    set that could not be posted (its room refuses the bridge, say), at the
    start or after an edit, is tried again with backoff until it is, and at
    once when a room is joined (``joins``: the room it waited for, maybe)."""
    failed: set[Path] = set()
    more = asyncio.Event()

    def could_not_post(paths: list[Path]) -> None:
        failed.update(paths)
        more.set()

    watching, ended = asyncio.Event(), asyncio.Event()
    watcher = asyncio.ensure_future(watch_sets(poster, root, stop, watching, on_changed, could_not_post))
    watcher.add_done_callback(lambda _done: ended.set())
    could_not_post(await _post_sets(poster, root, stop))
    posted.set()
    # A set written after the first scan but before the watcher was up (an
    # agent asking as the bridge starts) is taken by a second scan; sets
    # already posted are skipped by their fingerprint.
    await any_set([stop, watching, ended])
    if watcher.done():  # the watcher failed before it was up: the supervisor starts this again
        await watcher
        return
    if not stop.is_set():
        failed.clear()
        could_not_post(await _post_sets(poster, root, stop))
    delay = 1.0
    while not (stop.is_set() or ended.is_set()):
        if not failed:
            delay = 1.0
            more.clear()
            await any_set([stop, more, ended])
            continue
        await any_set([stop, ended, *([joins] if joins is not None else [])], delay)
        if stop.is_set() or ended.is_set():
            break
        if joins is not None and joins.is_set():
            joins.clear()
            delay = 1.0
        else:
            delay = min(delay * 2, 300)
        again = sorted(failed)
        failed.clear()
        could_not_post(await _post_sets(poster, root, stop, None if root in again else again))
    await watcher


async def _post_sets(poster: Poster, root: Path, stop: asyncio.Event, only: list[Path] | None = None) -> list[Path]:
    """Post ``only`` those sets (all under ``root`` when None); the ones that could not be posted now."""
    try:
        report = await (poster.sync_dirs(only, stop) if only is not None else poster.sync_root(root, stop))
    except Exception:  # noqa: BLE001 - the folder itself could not be read: every set is tried again
        log.exception("reading the sets failed")
        return [root]
    return report.failed


async def sleep_or_stop_event(stop: asyncio.Event, event: asyncio.Event) -> None:
    await any_set([stop, event])


async def watch_sets(poster: Poster, root: Path, stop: asyncio.Event, watching: asyncio.Event | None = None,
                     on_changed: Callable[[str], None] | None = None,
                     could_not_post: Callable[[list[Path]], None] | None = None) -> None:
    """``watching`` is set once the watcher is up (its first wake-up);
    ``could_not_post`` is told the sets an edit could not post (tried again)."""
    async for changes in awatch(root, stop_event=stop, debounce=200, step=50, recursive=True,
                                watch_filter=_set_change, rust_timeout=1000, yield_on_timeout=True):
        if watching is not None:
            watching.set()
        if not changes:
            continue
        files = [path if path.endswith(QUESTIONS_FILE) else linked_questions(path) or os.path.join(path, QUESTIONS_FILE)
                 for _change, path in changes]
        if on_changed is not None:
            for folder in {os.path.dirname(path) for path in files}:
                on_changed(folder)
        try:
            # Only the sets that changed are read again, not every set under the root.
            report = await poster.sync_changed(root, files)
        except Exception:  # noqa: BLE001 - a bad edit must not stop the bridge
            log.exception("re-reading the sets failed")
            continue
        if report.failed and could_not_post is not None:
            could_not_post(report.failed)


def _set_change(change: Change, path: str) -> bool:
    """A questions.json, or a folder added or deleted: a set folder renamed or
    copied into place arrives whole (and the watch on a new folder may start
    after the files in it were written, so its questions.json is looked for
    too); one moved away takes its questions with it."""
    return path.endswith(QUESTIONS_FILE) or os.path.isdir(path) or \
        (change != Change.modified and _maybe_a_folder(path)) or linked_questions(path) is not None


def linked_questions(path: str) -> str | None:
    """The set's questions.json when it is a symlink to ``path``, a file
    beside it (an agent keeping revisions, ``questions.json`` -> ``v3.json``):
    a change of that file is a change of the set.  None otherwise."""
    questions = os.path.join(os.path.dirname(path), QUESTIONS_FILE)
    if os.path.basename(path) == QUESTIONS_FILE or not os.path.islink(questions):
        return None
    return questions if os.path.realpath(questions) == os.path.realpath(path) else None


def _maybe_a_folder(path: str) -> bool:
    """A path added or deleted that may be a set folder moved in, back or away
    (the poster then posts its questions, or closes them); not the files the
    bridge itself replaces or deletes in a set (answers.json's temporary
    file, its lock, attachments), nor any file the bridge writes whole while
    it is being written."""
    name = os.path.basename(path)
    return not name.startswith(("answers.json", ".")) and TEMP_MARK not in name \
        and "attachments" not in Path(path).parts


def run_forever(config: Config) -> int:
    raise_to_hard_limit()

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        # "Reload", or the terminal gone: by default it killed the bridge
        # silently, and systemd counts that a clean exit, never restarted.
        loop.add_signal_handler(signal.SIGHUP, lambda: log.warning(
            "SIGHUP: nothing to reload (the configuration is read at start); restart the bridge to apply a "
            "change. Running on"))
        taskdump.install(loop)
        if config.store.url:
            from bridge.service.storage.standby import run_with_standby  # psycopg only when it is used

            # Several instances may share the store.
            await run_with_standby(config, stop, serve, fatal=(ConfigError, MatrixError, LogKeyError))
        else:
            await serve(config, stop)

    try:
        asyncio.run(main())
    except TokenRefused as exc:
        log.error("stopping: %s", exc)
        return 1
    except (MatrixError, SetsElsewhere) as exc:
        # Credentials the homeserver refuses will not fix themselves: say so and stop.
        log.error("cannot start: %s", exc)
        return 1
    except (ConfigError, LogKeyError) as exc:
        # Found once started (an appservice without its tokens, a webhook that
        # leads to this machine): a config refused, as at reading it (exit 2,
        # which a service manager does not restart in a loop).
        log.error("cannot start: %s", exc)
        return 2
    return 0
