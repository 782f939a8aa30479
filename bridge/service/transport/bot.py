"""Bot mode: the bridge as an ordinary Matrix user on a sync loop.

The sync token is advanced only inside the pipeline's final commit, after
every answer of the batch is durable, so a crash replays the batch and the
processed-event table makes the replay change nothing.  The next long poll
is out while a batch is made durable (``nextpoll``); only its response
waits for the batch to be durable.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from nio import AsyncClient, LoginResponse, MessageDirection, SyncResponse, WhoamiResponse

from bridge.service.logs import why
from bridge.service.eventwait import any_set
from bridge.service.config import Config, ConfigError
from bridge.service.encryption.crypto import Crypto, available, crypto_dir
from bridge.service.encryption.devicenews import hand_to_nio
from bridge.service.encryption.keysmade import keys_lost, keys_made
from bridge.service.answering.notices import Notices
from bridge.service.transport.gapread import (GAP_AT, GapPage, GapsRead, forget_gaps_read, gaps_read, keep_gap_read,
                                              went_on_from)
from bridge.service.transport.invites import Invites, keep_invites
from bridge.service.transport.matrix import (MatrixError, StopRequested, TokenRefused, client_config, http_status,
                                             read_ahead, timeline_pages, token_refused)
from bridge.service.transport.nextpoll import FirstSync, NextPoll, drop_sync
from bridge.service.transport.syncbatch import SyncBatch, sync_batch
from bridge.service.storage.store import Store
from bridge.service.supervisor import Supervisor

log = logging.getLogger(__name__)

SYNC_TOKEN = "sync_token"
# + room id: the sync token a batch was asked from when the bridge was out of
# that room by it (kicked, banned).  Its sync token moves on while it is out;
# invited back, the room's gap is read from there, not from the token, which
# is past everything said meanwhile (lost, with more than a timeline's worth).
LEFT_AT = "left_at:"
# A generous timeline per room so a short outage needs no back-fill; longer
# ones are filled from the last token on (see ``gap_pages``).
SYNC_FILTER: dict[str, Any] = {
    "room": {"timeline": {"limit": 200}, "state": {"lazy_load_members": False},
             "account_data": {"not_types": ["*"]}, "ephemeral": {"not_types": ["*"]}},
    "presence": {"not_types": ["*"]},
    "account_data": {"not_types": ["*"]},
}
# Events per page of a back-fill: each page is judged while the homeserver
# reads the next, so smaller pages overlap more, at a request each.
GAP_PAGE = 250


def own_events_left_out(user_id: str) -> dict[str, Any]:
    """The sync filter without the bridge's own messages: it ignores them
    anyway, and after posting many questions they would otherwise make up
    the whole back-fill (held in memory, judged for nothing).

    Only for a sync that may span many of them (the start's, the posting's
    polls).  A long poll asks with ``SYNC_FILTER`` and leaves them out
    itself (``SyncBatch.events``): a timeline with an event left out is no
    longer a chain for the homeserver, so Synapse works out the room's
    whole state three times over for it, which put the bridge's response
    3.4 ms behind a bare client's for every answer that followed one of
    its acknowledgements."""
    room = {**SYNC_FILTER["room"], "timeline": {**SYNC_FILTER["room"]["timeline"], "not_senders": [user_id]}}
    return {**SYNC_FILTER, "room": room}


async def login(config: Config, store: Store) -> AsyncClient:
    """A client logged in as the bot: with the configured token, or with the
    password once, keeping the device and its token in the store.

    With encryption on, nio's store for that device (its keys and sessions)
    is loaded from ``<store.path>.crypto/``: the same device every start, so
    what people encrypted for it stays readable."""
    encrypt = config.encryption.enabled
    if encrypt and not available():
        raise ConfigError("encryption.enabled is true but matrix-nio was installed without its e2e extra "
                          "(pip install 'matrix-nio[e2e]'); or set encryption.enabled: false")
    store_path = ""
    if encrypt:
        folder = crypto_dir(config.store.path)
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        store_path = str(folder)
    client = AsyncClient(config.homeserver.url, config.bot.user_id, store_path=store_path,
                         config=client_config(encryption=encrypt))
    try:
        return await _logged_in(client, config, store, encrypt)
    except BaseException:  # refused, or cancelled (a stop while the homeserver does not answer)
        await client.close()
        raise


async def _logged_in(client: AsyncClient, config: Config, store: Store, encrypt: bool) -> AsyncClient:
    token = config.bot.access_token or store.get_meta("access_token")
    if token:
        client.access_token = token
        whoami = await _once_answered(client.whoami, config.homeserver.url)
        if isinstance(whoami, WhoamiResponse):
            if config.bot.user_id and whoami.user_id.casefold() != config.bot.user_id.casefold():
                # Run as another account, the bridge would answer as it and
                # name its log after bot.user_id.
                raise MatrixError(f"the access token belongs to {whoami.user_id}, not to bot.user_id "
                                  f"{config.bot.user_id}: give a token of {config.bot.user_id} (or set bot.user_id)",
                                  None)
            device_id = whoami.device_id or store.get_meta("device_id") or ""
            if encrypt and not device_id:
                raise MatrixError("the homeserver did not say which device the access token belongs to; "
                                  "encryption needs one (log in with bot.password)", None)
            known = store.get_meta("device_id")
            if encrypt and keys_lost(client.store_path, store, whoami.user_id, device_id):
                if config.bot.access_token or not config.bot.password:
                    # Exit 2, as a config refused: a restart in a loop does not mend it.
                    raise ConfigError(
                        f"the key folder {client.store_path} holds no keys of device {device_id}, whose keys the "
                        "homeserver has (the folder was lost, or the store restored without it): restore the "
                        "folder, or sign that session out and give the bridge a new access token (or "
                        "bot.password), docs/encryption.md")
                _say_new_device(client, device_id)
                return await _password_login(client, config, store, device_id="", encrypt=True)
            if device_id and known != device_id:
                if known:
                    log.info("the access token belongs to device %s, not %s as before: keys of the old "
                             "device are not used", device_id, known)
                with store.transaction():
                    store.set_meta("device_id", device_id)
            if encrypt:
                # Also loads nio's key store for this user and device.
                client.restore_login(whoami.user_id, device_id, token)
                keys_made(store, device_id)
            else:
                client.user_id, client.device_id = whoami.user_id, device_id
            return client
        if config.bot.access_token:
            raise MatrixError(_whoami_refused(config.homeserver.url, whoami), whoami)
    if not config.bot.password:
        raise MatrixError("no usable credentials (set bot.access_token or bot.password)", None)
    device_id = store.get_meta("device_id") or ""
    if encrypt and keys_lost(client.store_path, store, config.bot.user_id, device_id):
        _say_new_device(client, device_id)
        device_id = ""  # a new device
    return await _password_login(client, config, store, device_id=device_id, encrypt=encrypt)


async def _password_login(client: AsyncClient, config: Config, store: Store, *, device_id: str,
                          encrypt: bool) -> AsyncClient:
    """Logged in with bot.password as ``device_id`` (empty: a new device)."""
    client.device_id = device_id
    response = await _once_answered(lambda: client.login(config.bot.password, device_name=config.bot.device_name),
                                    config.homeserver.url)
    if not isinstance(response, LoginResponse):
        raise MatrixError("logging in with bot.password", response)
    with store.transaction():
        store.set_meta("access_token", response.access_token)
        store.set_meta("device_id", response.device_id)
    if encrypt:
        keys_made(store, response.device_id)
    return client


def _say_new_device(client: AsyncClient, lost: str) -> None:
    log.warning("the key folder %s holds no keys of device %s (lost, or the store restored without it): logging "
                "in with bot.password as a new device; sign %s out", client.store_path, lost, lost)


T = TypeVar("T")

# How long the first request to the homeserver may go unanswered before the
# log says so, and how often again: nio retries a refused connection or a
# failed TLS handshake (https:// to a plain-HTTP port) for ever, in silence.
SILENT_START_WARN = 10.0


# What a proxy answers while the homeserver behind it is down or restarting:
# not yet, not a wrong homeserver.url (the bridge exited 1, blaming the URL).
NOT_YET = frozenset({502, 503, 504})
NOT_YET_MAX_WAIT = 30.0


async def _once_answered(request: Callable[[], Awaitable[T]], url: str) -> T:
    """``request``'s answer once the homeserver itself gives one: while a
    proxy before it says it is unavailable, asked again, with backoff."""
    delay = 1.0
    while True:
        response = await _told_while_silent(request(), url)
        status = http_status(response)
        if status not in NOT_YET:
            return response
        log.warning("the homeserver at %s answered HTTP %s (a proxy whose homeserver is not up yet?); trying "
                    "again in %.0f s", url, status, delay)
        await asyncio.sleep(delay)
        delay = min(delay * 2, NOT_YET_MAX_WAIT)


async def _told_while_silent(request: Awaitable[T], url: str) -> T:
    """``request`` awaited; while the homeserver does not answer, a warning
    naming the URL every SILENT_START_WARN seconds."""
    task = asyncio.ensure_future(request)
    waited = 0.0
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=SILENT_START_WARN)
            if done:
                return task.result()
            waited += SILENT_START_WARN
            log.warning("the homeserver at %s has not answered for %.0f s (still trying): is homeserver.url "
                        "right (http or https, host, port), and is it up?", url, waited)
    finally:
        task.cancel()


def _whoami_refused(url: str, whoami: Any) -> str:
    """What a failed whoami means: a refused token only when the homeserver
    said so (401); a wrong homeserver.url answers anything else (a 404 of a
    web server, a page that is no JSON), and blaming the token sent the
    operator to fix what was right."""
    status = http_status(whoami)
    if status == 401 or getattr(whoami, "status_code", None) in ("M_UNKNOWN_TOKEN", "M_MISSING_TOKEN"):
        return "the configured access token was refused"
    if status == 500:
        return (f"{url} failed on whoami (HTTP 500): check bot.access_token (a homeserver can fail on a token "
                "that is no token at all) and homeserver.url")
    got = f"HTTP {status}" if status is not None else "no answer"
    return f"{url} did not answer as a Matrix homeserver ({got} to whoami): check homeserver.url"


async def prime_sync_token(client: AsyncClient, store: Store) -> None:
    """A new bridge takes its first sync token before it posts anything, so
    every answer to its questions comes after the token and is caught up on
    (history older than the bridge is not its business).

    The invites that first sync shows are kept with its token, and answered
    as any invite kept unanswered is (``Invites.resume``): the homeserver
    shows an invite older than the token in no sync after it, so an operator
    who invited the bot before its first start (an admin's direct message,
    a room it is to be asked into) saw it never join."""
    if store.get_meta(SYNC_TOKEN) is not None:
        return
    minimal = {"room": {"timeline": {"limit": 1}}, "presence": {"not_types": ["*"]}}
    while True:
        response = await client.sync(timeout=0, sync_filter=minimal)
        if isinstance(response, SyncResponse):
            break
        log.warning("first sync failed (%s); retrying", getattr(response, "message", response))
        await asyncio.sleep(1)
    with store.transaction():
        store.set_meta(SYNC_TOKEN, response.next_batch)
        keep_invites(store, first_invites(response, client.user_id), ())


def first_invites(response: SyncResponse, user_id: str) -> dict[str, str | None]:
    """Room id -> inviter of the invites in a sync nio read (the start's first)."""
    return {room_id: _inviter([getattr(event, "source", {}) for event in info.invite_state], user_id)
            for room_id, info in response.rooms.invite.items()}


async def gap_pages(client: AsyncClient, response: SyncBatch, since: str | None,
                    stop: asyncio.Event | None = None, left_at: dict[str, str] | None = None,
                    read: GapsRead | None = None) -> AsyncIterator[GapPage]:
    """The events a limited sync skipped, a page at a time and oldest first:
    each room's timeline read forward from ``since`` (``left_at``'s for a room
    the bridge is back in), or from where ``read`` says a read from there got
    to, up to where the sync's own timeline starts, so each page can be
    judged as it comes, in timeline order."""
    if since is None:
        return  # the first sync of a new bridge has no past to catch up on
    for room_id, prev_batch in response.gaps().items():
        count = 0
        origin = (left_at or {}).get(room_id, since)
        start = went_on_from(read, room_id, origin)
        if start != origin:
            log.info("reading the gap of %s on from where the last read of it got to", room_id)
        try:
            async for page in timeline_pages(client, room_id, start, prev_batch, stop, GAP_PAGE,
                                             MessageDirection.front):
                count += len(page.chunk)
                if page.chunk:
                    # The last page names no end: the read got to the sync's
                    # timeline, which the batch itself brings.
                    yield GapPage(page.chunk, room_id, origin, page.end or prev_batch)
        except MatrixError as exc:
            if not (exc.permanent and room_id in response.left):
                raise  # the batch is tried again from the durable token
            # A room the bridge is out of that the homeserver no longer shows
            # (deleted, purged): tried again, every batch after it waited for ever.
            log.warning("the gap of %s, a room the bridge is out of, can't be read (%s): what was said there "
                        "before it left and not in the sync (%d events read) is not judged", room_id, why(exc), count)
            continue
        log.info("filled a gap of %d events in %s", count, room_id)


def ask_first_sync(client: AsyncClient, store: Store) -> FirstSync:
    """The start's first sync, asked for at once, as ``SyncLoop`` would ask
    (its own messages left out, no long poll while the first posting is not
    done): the homeserver answers it while the bridge joins its rooms and
    reads their members, which its batch waits for (``SyncLoop`` runs once
    they are in)."""
    since = store.get_meta(SYNC_TOKEN)
    return since, asyncio.ensure_future(sync_batch(client, 0, own_events_left_out(client.user_id), since))


# A long poll's sync that brings the pipeline nothing (the bridge's own
# messages coming back, which it asks for: an acknowledgement after every
# answer) makes no store job; the token it brings is stored by the next batch
# that does, or by such a sync once this many seconds have passed, so a
# restart reads back at most that much of the bridge's own messages.
IDLE_TOKEN_EVERY = 30.0

# Until the first posting is done, the loop asks every POSTING_POLL seconds
# instead of long-polling: a pending long poll makes Synapse build a sync
# response for the bridge at every message it posts (the bridge's own,
# filtered out), which slowed a posting of 10,000 questions by three quarters.
POSTING_POLL = 1.0


class SyncLoop:
    def __init__(self, client: AsyncClient, store: Store, pipeline: Any, stop: asyncio.Event,
                 on_synced: Any = None, crypto: Crypto | None = None, invites: Invites | None = None,
                 posted: asyncio.Event | None = None,
                 first_sync: FirstSync | None = None, supervisor: Supervisor | None = None):
        self.client = client
        self.supervisor = supervisor or Supervisor()
        self.store = store
        self.pipeline = pipeline
        self.stop = stop
        self.on_synced = on_synced
        self.crypto = crypto
        # Invites: the bridge joins only its configured rooms (none here unless told).
        self.invites = invites or Invites(client, pipeline, [], (), None)
        self.posted = posted  # set once the first posting is done
        self._upkeep: asyncio.Future[None] | None = None  # the key chores running beside the sync
        self.first_sync = first_sync  # asked for before the loop started (``ask_first_sync``)
        self._wakes_at = 0.0  # the event loop's time when the last long poll asked returns at the latest
        # The last look at the kept events (``Crypto.sync_timeout_ms``) found
        # the loop needed back before the default timeout (none yet: look).
        self._wanted_sooner = True
        self._token_stored_at = 0.0  # time.monotonic() when a batch's commit last stored a sync token
        self._left_at: dict[str, str] | None = None  # room id -> ``LEFT_AT``'s token (read once, kept up)
        self._gaps_read: GapsRead = {}  # ``GAP_AT``'s marks (read with ``_left_at``, kept up)

    async def run(self) -> None:
        notices = Notices(self.pipeline, self.stop)
        self.pipeline.on_judged_apart = notices.wake
        notifier = self.supervisor.spawn("notices", notices.run, self.stop)
        try:
            # Invites kept unanswered (a stop before their join went through):
            # the homeserver does not send them again.
            await self.invites.resume()
            await self._loop(notices)
        except BaseException:
            # The loop failed (its supervisor starts it again, with a notifier
            # of its own): this one would wait for a stop that is not coming.
            notifier.cancel()
            await asyncio.gather(notifier, return_exceptions=True)
            raise
        else:
            notices.wake()
            await notifier
        finally:
            await self.invites.close()
            if self._upkeep is not None:
                self._upkeep.cancel()
                await asyncio.gather(self._upkeep, return_exceptions=True)

    async def _loop(self, notices: Notices) -> None:
        backoff = 0.5
        polled = own_events_left_out(self.client.user_id)
        # The next long poll, asked for while the last batch was made durable
        # (its since, its request): see ``nextpoll``.
        ahead: FirstSync | None = None
        try:
            while not self.stop.is_set():
                polling = self.posted is not None and not self.posted.is_set()
                self._start_upkeep()
                if self.first_sync is not None:
                    (since, sync), self.first_sync = self.first_sync, None
                elif ahead is not None:
                    (since, sync), ahead = ahead, None
                else:
                    try:
                        # On the store's thread: a database that stalls (a lock an
                        # operator holds) held the event loop, /health too.
                        since = await self.store.run(self.store.get_meta, SYNC_TOKEN)
                    except Exception as exc:  # noqa: BLE001 - tried again like a batch: the loop lives on
                        log.warning("the sync token can't be read (%s); retrying in %.1f s", exc, backoff)
                        await sleep_or_stop(self.stop, backoff)
                        backoff = min(backoff * 2, 30)
                        continue
                    sync = await self._ask(since, 0, polled) if polling else await self._ask(since, 30000)
                stopper = asyncio.ensure_future(self.stop.wait())
                done, _ = await asyncio.wait({sync, stopper}, return_when=asyncio.FIRST_COMPLETED)
                stopper.cancel()
                if sync not in done:
                    sync.cancel()  # nothing of this sync was handled: it is simply asked again next start
                    break
                upcoming: NextPoll | None = None
                try:
                    response = sync.result()
                    if self.crypto is not None:
                        await self._tell_nio(response)
                    if not polling:
                        upcoming = NextPoll(functools.partial(self._ask_ahead, response.next_batch))
                    if self._left_at is None:
                        self._gaps_read = gaps_read(await self.store.run(self.store.meta_with_prefix, GAP_AT))
                        self._left_at = dict((key[len(LEFT_AT):], value) for key, value in
                                             await self.store.run(self.store.meta_with_prefix, LEFT_AT))
                    if response.gaps():
                        await self._fill_gaps(notices, response, since)
                    invites = (self._invited(response), list(response.left))
                    await self._handle(response.events(leave_out=self.client.user_id), token=response.next_batch,
                                       then=upcoming, left=self._out_and_back(response, since), invites=invites)
                    if upcoming is not None:
                        ahead, upcoming = await upcoming.asked(), None
                    ahead = await self._wake_in_time(ahead)
                    if self.on_synced:
                        self.on_synced()
                    notices.homeserver_answered()
                    backoff = 0.5
                    await self._answer_invites(*invites)
                    if polling:
                        await sleep_or_stop(self.stop, POSTING_POLL, wake=self.posted)
                except StopRequested:
                    break
                except Exception as exc:  # noqa: BLE001 - the loop must outlive any one failure
                    if token_refused(exc):
                        # Retried every 30 s for ever, /health ready and saying
                        # only that the homeserver was silent.
                        raise TokenRefused(exc) from None  # type: ignore[arg-type]
                    # The batch is not durable: what was asked past it is dropped,
                    # and the retry goes from the token in the store.
                    ahead = await drop_sync(ahead)
                    log.warning("sync batch not handled (%s); retrying in %.1f s", why(exc), backoff)
                    await sleep_or_stop(self.stop, backoff)
                    backoff = min(backoff * 2, 30)
                finally:
                    if upcoming is not None:  # the batch was not made durable: nothing is asked past it
                        await upcoming.drop()
        finally:
            await drop_sync(ahead)

    async def _fill_gaps(self, notices: Notices, response: SyncBatch, since: str | None) -> None:
        """A long outage's gap first, page by page (read ahead while judged);
        the token moves only with the sync's own events, and each page's
        commit keeps how far the read got (``gapread``).  (Only when a
        timeline was cut short: reading ahead costs the answers in the
        sync's own a turn of the event loop.)"""
        notices.reading_gap = True
        try:
            async for page in read_ahead(gap_pages(self.client, response, since, self.stop, self._left_at,
                                                   self._gaps_read)):
                if self.crypto is not None:
                    self.crypto.note_events(page.events)
                await self._handle(page.events, gap=page)
        finally:
            notices.reading_gap = False

    def _start_upkeep(self) -> None:
        """Key chores run beside the sync, as nio's own sync loop runs them: a
        start queries every known person's keys, which a batch of plain
        answers need not wait for.  A batch with encrypted events waits for
        them (``_handle``)."""
        if self.crypto is not None and (self._upkeep is None or self._upkeep.done()):
            self._upkeep = asyncio.ensure_future(self._key_upkeep())

    async def _ask(self, since: str | None, timeout: int, sync_filter: dict[str, Any] = SYNC_FILTER,
                   look: bool = True) -> "asyncio.Future[Any]":
        """``look``: the timeout from a fresh look at the kept events (a job
        on the store's thread); else the default one."""
        if self.crypto is not None and look:
            # A long poll that wakes up in time for what kept events are waiting on.
            default, timeout = timeout, await self.crypto.sync_timeout_ms(timeout)
            self._wanted_sooner = timeout < default
        self._wakes_at = asyncio.get_running_loop().time() + timeout / 1000
        return asyncio.ensure_future(sync_batch(self.client, timeout, sync_filter, since))

    async def _wake_in_time(self, ahead: FirstSync | None) -> FirstSync | None:
        """The long poll asked ahead again, with a shorter timeout, when the
        batch just made durable needs the loop back sooner than it would
        return: an event kept for its key (its grace period, the key asked
        again) or a person whose devices are to be asked for again."""
        if ahead is None or self.crypto is None or ahead[1].done():
            return ahead
        timeout = await self.crypto.sync_timeout_ms(30000)
        self._wanted_sooner = timeout < 30000
        wanted = asyncio.get_running_loop().time() + timeout / 1000
        if wanted >= self._wakes_at - 0.05 or ahead[1].done():  # (answered while the store was looked at: kept)
            return ahead
        await drop_sync(ahead)
        return await self._ask_ahead(ahead[0])

    async def _ask_ahead(self, since: str) -> FirstSync:
        """The next long poll, asked for from the batch just received while
        that batch is made durable (``nextpoll``).  Synapse answers the long
        polls waiting on a room one after another, and a bridge that asked
        only once its batch was durable (and its acknowledgements queued)
        was often not waiting at all when the next answer came, so it was
        answered after every other client.

        It waits for no job on the store's thread: with nothing kept for its
        key at the last look it is asked with the default timeout at once
        (the thread is busy with the batch's commit: a look would wait for
        it), and ``_wake_in_time`` looks again once the batch is durable: a
        batch that kept an event has the long poll asked again with the
        timeout it needs."""
        sync = await self._ask(since, 30000, look=self._wanted_sooner)
        # Runs the request up to its first wait on the network (the request is sent).
        await asyncio.sleep(0)
        return since, sync

    def _out_and_back(self, response: SyncBatch, since: str | None) -> tuple[dict[str, str], list[str]]:
        """(room -> ``since``) for the rooms this batch puts the bridge out
        of, and the rooms it is back in: ``LEFT_AT`` kept, and forgotten,
        with the batch."""
        assert self._left_at is not None
        out = {room: since for room in response.left if since is not None and room not in self._left_at}
        back = [room for room in response.joined() if room in self._left_at]
        return out, back

    async def _handle(self, events: list[dict[str, Any]], token: str | None = None,
                      then: NextPoll | None = None,
                      left: tuple[dict[str, str], list[str]] | None = None,
                      invites: tuple[dict[str, str | None], list[str]] | None = None,
                      gap: GapPage | None = None) -> None:
        """Judge ``events`` and make them durable; with ``token``, the sync
        token moves to it in the same commit (the gaps read forgotten), and
        ``then`` is asked for while that commit is made; ``left``:
        ``_out_and_back``'s, and ``invites`` (the batch's invites, room id ->
        inviter; the rooms the bridge is out of, whose invites ended), kept
        in that commit; ``gap``: the page of a gap ``events`` are, whose
        end is kept with them."""
        resolved: list[str] = []
        if self.crypto is not None:
            if self.crypto.waits_for_chores(events):
                # The senders' devices are queried first, for the trust check
                # (a batch of plain events has nothing to check: it is not delayed).
                if self._upkeep is not None:
                    await self._upkeep
                await self.crypto.chores()
            # Events not decryptable yet are durably kept here, before the token can move.
            events, resolved = await self.crypto.screen(events, self.pipeline.own_users)
        if then is not None and not events and not resolved and not (invites and invites[0]) \
                and time.monotonic() - self._token_stored_at < IDLE_TOKEN_EVERY:
            # Nothing to judge or to make durable: the token waits for the next
            # batch.  Only with a long poll asked from it: a poll (while the
            # first posting goes on) is asked from the token in the store.
            return
        # Files people sent are fetched first: judging runs in one store
        # transaction and does no network I/O.
        events = await self.pipeline.prepare(events)
        # The marks this commit forgets (a list: ``_gaps_read`` is changed on
        # the event loop only, never while the store's thread reads it).
        passed = list(self._gaps_read) if token is not None else []
        # On the store's thread, the event loop serving /health and the agents
        # meanwhile; runs to completion even when a stop is asked for mid-batch.
        await self.store.run(self.pipeline.process, events,
                             commit=lambda: self._commit(token, resolved, then, left, invites, gap, passed))
        if token is not None:
            self._token_stored_at = time.monotonic()  # its COMMIT made: the token is in the store
        for room in passed:
            self._gaps_read.pop(room, None)
        if gap is not None:
            self._gaps_read[gap.room_id] = (gap.origin, gap.at)
        if left is not None and self._left_at is not None:
            self._left_at.update(left[0])
            for room in left[1]:
                self._left_at.pop(room, None)

    async def _tell_nio(self, response: SyncBatch) -> None:
        """What nio must know of a sync before its events are decrypted:
        the device's parts (a room key and the message it opens may come
        together) and what the rooms' events say of members and encryption."""
        assert self.crypto is not None
        await hand_to_nio(self.crypto.client, response.device, response.next_batch)
        self.crypto.note_events(response.events())

    async def _key_upkeep(self) -> None:
        assert self.crypto is not None
        try:
            await self.crypto.chores()
        except Exception as exc:  # noqa: BLE001 - key chores are retried beside the next sync
            log.warning("encryption key upkeep failed (%s); retrying beside the next sync", exc)

    def _invited(self, response: SyncBatch) -> dict[str, str | None]:
        return {room_id: _inviter(state, self.client.user_id) for room_id, state in response.invites.items()}

    async def _answer_invites(self, invited: dict[str, str | None], left: list[str]) -> None:
        # A room the bridge is out of now: its invite, if any, was withdrawn (or declined).
        self.invites.ended(left)
        for room_id, inviter in invited.items():
            await self.invites.answer(room_id, inviter)

    def _commit(self, token: str | None, resolved: list[str], then: NextPoll | None,
                left: tuple[dict[str, str], list[str]] | None = None,
                invites: tuple[dict[str, str | None], list[str]] | None = None, gap: GapPage | None = None,
                passed: list[str] | None = None) -> None:
        if token is not None:
            self.store.set_meta(SYNC_TOKEN, token)
        if passed:
            forget_gaps_read(self.store, passed)
        if gap is not None:
            keep_gap_read(self.store, gap)
        if invites and (invites[0] or invites[1]):
            # The homeserver sends an invite in one sync only: kept until
            # answered, as the token moves past it (``Invites``).
            keep_invites(self.store, *invites)
        for room, since in (left[0] if left else {}).items():
            self.store.set_meta(LEFT_AT + room, since)
        for room in left[1] if left else ():
            self.store.delete_meta(LEFT_AT + room)
        if resolved:
            # Kept events decrypted in this batch are now processed like any other.
            self.store.drop_undecrypted(resolved)
        if then is not None:
            then.now()  # sent by the event loop while this transaction's COMMIT waits


def _inviter(invite_state: list[dict[str, Any]], user_id: str) -> str | None:
    for event in invite_state:
        if event.get("type") == "m.room.member" and event.get("state_key") == user_id:
            return event.get("sender")
    return None


async def sleep_or_stop(stop: asyncio.Event, seconds: float, wake: asyncio.Event | None = None) -> None:
    """Sleep ``seconds``, or less when ``stop`` (or ``wake``) is set meanwhile."""
    await any_set([event for event in (stop, wake) if event is not None], seconds)
