"""Appservice mode: the homeserver pushes transactions to the bridge.

A transaction is answered 200 only after the pipeline's final commit, which
records the transaction in the same store transaction that clears the
answers it made durable (PROTOCOL section 5).  Anything short of that is a
5xx, so the homeserver keeps the transaction and sends it again; the
processed-event table makes the resend change nothing that already landed.

Unlike bridges that acknowledge first and keep their duplicate filter in
memory, nothing here is acknowledged before it is on disk, and nothing
remembered lives only in memory.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import re
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import aiohttp
from aiohttp import web
from nio import AsyncClient

from bridge.service.logs import why
from bridge.service.eventwait import set_within
from bridge.service.transport.bot import sleep_or_stop
from bridge.service.transport.invites import Invites, keep_invites, membership_news
from bridge.service.transport.catchup import CatchUp
from bridge.service.transport.hearing import keep_hearing
from bridge.service.config import Config, ConfigError, listen_refused
from bridge.service.transport.matrix import HttpReply, MatrixError, client_config
from bridge.service.answering.notices import Notices
from bridge.service.transport.rooms import RoomIds
from bridge.service.supervisor import Supervisor

if TYPE_CHECKING:  # the registration command imports this module and needs none of them
    from bridge.service.answering.pipeline import Pipeline
    from bridge.service.storage.store import Store

log = logging.getLogger(__name__)

# How long a transaction that arrives during start-up waits for the bridge to
# be ready (rooms joined, members loaded) before it is turned away with a 503.
# Synapse waits far longer than this for an answer.
READY_WAIT = 30.0

# Synapse keeps an idle connection to the bridge in its pool this long (its
# HTTP client's ``cachedConnectionTimeout``, two minutes) and puts the next
# transaction on it.  Closed by the bridge first, the connection can be
# taken by a transaction while the close is on its way (Synapse's reactor
# busy a moment is enough): the PUT fails, Synapse does not send a PUT again
# on a new connection, and its recoverer waits 2 s, then 4 s, ... to resend,
# dropping meanwhile the room keys it would have pushed.
HOMESERVER_KEEPS_IDLE = 120.0


def idle_limit(homeserver_keeps: float) -> float:
    """How long the transaction listener keeps an idle connection: longer
    than the homeserver keeps one, so the homeserver always closes first and
    never sends on a connection being closed under it."""
    return homeserver_keeps * 1.5


# How many event ids of recent transactions are kept in memory, so the safety
# net (``catchup``) does not feed again what a transaction already brought.
RECEIVED_KEPT = 20000


def user_namespace(config: Config) -> list[str]:
    """The users the bridge claims: its own user and, reserved for users it may
    act as later, every ``@<id>_...`` user of its server.  Anchored at both
    ends: Synapse matches a namespace from the start only (``re.match``),
    Conduit and its forks anywhere in the id, so ``@askbot:example\\.org`` also
    claimed ``@askbot:example.org-other.net``, and Synapse pushed the bridge
    what such a user of another server said in any room it saw."""
    server = re.escape(config.server_name)
    own = re.escape(config.appservice.sender_localpart)
    # A localpart holds no ":" (not even a historical one).
    return [f"^@{own}:{server}$", f"^@{re.escape(config.appservice.id)}_[^:]*:{server}$"]


def txn_key(txn_id: str, events: list[Any]) -> str:
    """What the store remembers of a transaction: its id plus a digest of the
    event ids in it.  The homeserver resends a failed transaction with the same
    events, so a resend matches; a homeserver whose database was reset counts
    transaction ids from 1 again, and its new transactions must not be mistaken
    for old ones."""
    ids = "\n".join(str(e.get("event_id")) for e in events if isinstance(e, dict))
    return f"{txn_id}:{hashlib.sha256(ids.encode()).hexdigest()[:24]}"


def _error(status: int, errcode: str, message: str) -> web.Response:
    return web.json_response({"errcode": errcode, "error": message}, status=status)


class TransactionServer:
    """The HTTP side the homeserver talks to."""

    def __init__(self, config: Config, store: Store, pipeline: Pipeline, ops: Any = None):
        self.ops = ops
        self.hs_token = config.appservice.hs_token or ""
        self.listen = config.appservice.listen_host_port
        self.store = store
        self.pipeline = pipeline
        self.rooms: list[str] = []  # shared with app.serve, which adds rooms joined later
        self.ready = asyncio.Event()
        self.notices: Notices | None = None  # woken when people have notices coming
        # Called with (room_id, inviter) for each invite of the bridge's user.
        self.on_invite: Callable[[str, str | None], Awaitable[None]] | None = None
        # Told of the invites that ended (withdrawn, declined): not tried again.
        self.on_invites_ended: Callable[[list[str]], None] | None = None
        self.one_at_a_time = asyncio.Lock()
        self.runner: web.AppRunner | None = None
        # The safety net for what the homeserver does not deliver (``catchup``).
        self.catchup: CatchUp | None = None
        self.crypto: Any = None  # bridge.service.encryption.crypto.Crypto when the bridge encrypts
        self.kept = asyncio.Event()  # set when encrypted events came: kept ones have a grace period to watch
        self._chores_lock = asyncio.Lock()
        self._chores_running: asyncio.Future[None] | None = None  # key chores run after a batch (``_screen``)
        self.last_txn: int | None = None
        self.received: OrderedDict[str, None] = OrderedDict()
        # Raises when this instance no longer leads a shared store: then no 200.
        self.fence: Callable[[], None] | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        known = []
        for prefix in ("/_matrix/app/v1", ""):  # "" = the legacy unprefixed paths
            known += [("PUT", prefix + "/transactions/{txn_id}", self.transaction),
                      ("GET", prefix + "/users/{user_id}", self.not_found),
                      ("GET", prefix + "/rooms/{alias}", self.not_found)]
        known.append(("POST", "/_matrix/app/v1/ping", self.ping))
        for method, path, handler in known:
            resource = app.router.add_resource(path)
            resource.add_route(method, handler)
            # Another method on a known endpoint: 405 M_UNRECOGNIZED, as the spec says (the catch-all said 404).
            resource.add_route("*", self.wrong_method)
        if self.ops is not None:
            app.add_routes(self.ops.routes())  # /metrics and /health, before the catch-all
        else:
            app.router.add_get("/health", self.health)
        app.router.add_route("*", "/{tail:.*}", self.unrecognised)
        return app

    async def start(self) -> None:
        from bridge.service.operators.health import runner_for

        self.runner = runner_for(self.app(), idle=idle_limit(HOMESERVER_KEEPS_IDLE))
        await self.runner.setup()
        host, port = self.listen
        try:
            await web.TCPSite(self.runner, host, port).start()
        except OSError as exc:  # the port taken, the address not this machine's: a config to change
            raise ConfigError(listen_refused("appservice.listen", f"{host}:{port}", exc)) from None
        log.info("listening for the homeserver on %s:%d", host, port)

    async def close(self) -> None:
        if self.runner:
            await self.runner.cleanup()
        if self._chores_running is not None:
            self._chores_running.cancel()
            await asyncio.gather(self._chores_running, return_exceptions=True)

    def open(self, rooms: list[str], notices: Notices) -> None:
        """Start accepting transactions; only events of ``rooms`` are bridged."""
        self.rooms = rooms
        self.notices = notices
        self.ready.set()

    # -- requests -----------------------------------------------------------

    def _denied(self, request: web.Request) -> web.Response | None:
        header = request.headers.get("Authorization", "")
        bearer = header[7:].strip() if header[:7].lower() == "bearer " else None
        given = [token for token in (bearer, request.query.get("access_token")) if token is not None]
        # Both forms given: both must match (the spec's word).  Bytes a header
        # can carry that are no UTF-8 (aiohttp keeps them as surrogates) are
        # compared as they came, never a 500 and a traceback for anyone to cause.
        if given and self.hs_token and all(
                hmac.compare_digest(token.encode("utf-8", "surrogateescape"), self.hs_token.encode())
                for token in given):
            return None
        # The issue asks for 403 whether the token is wrong or missing; the spec
        # would allow 401 for a missing one, and the homeserver treats both alike.
        return _error(403, "M_FORBIDDEN", "bad or missing hs_token")

    async def transaction(self, request: web.Request) -> web.Response:
        if denied := self._denied(request):
            return denied
        txn_id = request.match_info["txn_id"]
        try:
            body = await request.json()
        except (ValueError, RecursionError):  # not JSON, not UTF-8, nested past the parser, a 5000-digit number
            return _error(400, "M_NOT_JSON", "the body is not JSON")
        events = body.get("events", []) if isinstance(body, dict) else None
        if not isinstance(events, list):
            return _error(400, "M_BAD_JSON", "events must be a list")
        early = not self.ready.is_set() and self.crypto is not None and isinstance(body, dict) and self._leads()
        if early:
            # Its room keys and device lists now (the encryption is up before
            # the listener): turned away below, the transaction comes again
            # without them, as the homeserver does not send those twice.
            await self._take_extensions(body, txn_id)
        if not await set_within(self.ready, READY_WAIT):
            self._trouble()
            return _error(503, "M_UNKNOWN", "the bridge is still starting; try again")
        # Synapse sends one transaction at a time; a stray concurrent resend
        # must not download or judge the same events twice over.
        async with self.one_at_a_time:
            if not self._leads():
                return _error(503, "M_UNKNOWN", "this instance no longer leads; try again")
            response = await self._process(txn_id, events, None if early else body)
            if response.status == 200 and not self._leads():
                return _error(503, "M_UNKNOWN", "this instance no longer leads; try again")
            return response

    def _leads(self) -> bool:
        if self.fence is None:
            return True
        try:
            self.fence()
        except Exception:  # noqa: BLE001 - LeaseLost: a standby took over
            return False
        return True

    async def _process(self, txn_id: str, events: list[Any], body: dict[str, Any] | None = None) -> web.Response:
        key = txn_key(txn_id, events)
        if self.crypto is not None and body:
            # Room keys first: the events of this very transaction may need them.
            # (A transaction seen before had its keys taken the first time; taking
            # them again is harmless.)
            await self._take_extensions(body, txn_id)
        if self.ops is not None:
            self.ops.metrics.reached()  # a push came: the homeserver reaches us
            self.ops.metrics.heard()  # and it is up (``hearing``)
        if self.catchup is not None:
            self.catchup.heard()
            if self._skips(txn_id):
                # What went missing is judged before what came after it.
                await self.catchup.look_now({e["event_id"] for e in events
                                             if isinstance(e, dict) and isinstance(e.get("event_id"), str)})
        wanted = [e for e in events if isinstance(e, dict) and e.get("room_id") in self.rooms]
        # Synapse pushes an invite once: kept with the transaction, until
        # answered (``Invites``), as a stop before the join must not lose it.
        invited, ended = membership_news(events, self.pipeline.transport.user_id) if self.on_invite else ({}, [])

        def commit() -> None:
            self.store.mark_txn(key)
            if invited or ended:
                keep_invites(self.store, invited, ended)

        try:
            result = await self._feed(wanted, commit, delivery=key)
        except Exception as exc:  # noqa: BLE001 - anything here is worth a retry by the homeserver
            log.warning("transaction %s not processed (%s); the homeserver will send it again", txn_id, why(exc))
            self._trouble()  # the homeserver's recovery can strand a transaction
            return _error(500, "M_UNKNOWN", "not processed; send it again")
        log.debug("transaction %s: %d events, %s", txn_id, len(events),
                  "taken before" if result is None or result.repeated else result)
        if not (result is not None and result.repeated):
            # Answered once their transaction is durable (one taken before had
            # its invites kept then: answered, or answered at the start).
            self._answer_invites(invited, ended)
        if result is not None and result.repeated and wanted:
            # Sent again: the homeserver never had our 200 (it restarted, or
            # a proxy cut it), and what it queued meanwhile may be gone with
            # it: the timelines are looked into soon, not at the next period.
            self._trouble()
        self._remember(wanted)
        return web.json_response({})

    async def _feed(self, events: list[dict[str, Any]], commit: Callable[[], None],
                    delivery: str | None = None) -> Any:
        chores_after = False
        if self.crypto is not None:
            # A resend is screened again (what decrypts, decrypts again; what
            # would be kept is looked up first) and found taken by the batch's
            # own look-ups: no job before the batch's own, unless screening keeps.
            events, commit, chores_after = await self._screen(events, commit)
        events = await self.pipeline.prepare(events)
        # On the store's thread: the listener goes on answering meanwhile.
        # Whether the transaction was taken before is read with the batch's
        # other look-ups, not in a job of its own (a resend finds its files
        # kept, so preparing it fetched nothing).
        try:
            result = await self.store.run(self.pipeline.process, events, commit=commit, delivery=delivery)
        finally:
            if chores_after:
                self._chores_after()
        if self.ops is not None:
            self.ops.mark_ready()
        if self.notices is not None:
            self.notices.homeserver_answered()  # (it pushed this transaction)
        return result

    async def feed(self, events: list[dict[str, Any]], commit: Callable[[], None]) -> None:
        """Events that came in no transaction (``catchup``, which holds
        ``one_at_a_time``), handled as one."""
        await self._feed(events, commit)
        self._remember(events)

    async def _take_extensions(self, body: dict[str, Any], txn_id: str) -> None:
        from bridge.service.encryption.ascrypto import take_extensions  # noqa: PLC0415 - needs nio's e2e extra

        try:
            await take_extensions(self.crypto.client, body, txn_id)
        except Exception as exc:  # noqa: BLE001 - a resend would not bring them: the events go on
            # Synapse keeps a transaction's room events to send again, not
            # its to-device messages: refusing it (as this once did, "it
            # will come again") lost the room keys all the same, and held
            # the room events up.  An event whose key is missing waits for
            # it, and the key is asked for (``keyrequests``).
            log.warning("transaction %s: its encryption parts (to-device messages, device lists) could not be "
                        "taken (%s); the homeserver does not send them again: room keys they held are asked for "
                        "when an event needs them", txn_id, exc)

    async def _screen(self, events: list[dict[str, Any]], commit: Callable[[], None]
                      ) -> tuple[list[dict[str, Any]], Callable[[], None], bool]:
        """Encrypted events decrypted, or kept (durably, before the 200) until
        their keys come; kept ones that decrypt now join the batch.  Last,
        whether the key chores are to run once the batch is durable."""
        self.crypto.note_events(events)  # members, encryption turned on: nio reads no room events
        encrypted = any(event.get("type") == "m.room.encrypted" for event in events)
        chores_after = False
        if encrypted:
            if self.crypto.waits_for_chores(events):
                await self._chores()  # newcomers' devices queried first, for the trust check
            else:
                # The senders' devices are known: the chores (a newcomer's
                # devices read, say) run after this batch, not before it, nor
                # beside it: on the event loop while the store's thread makes
                # the batch durable, they slowed every step of it.
                chores_after = True
        events, resolved = await self.crypto.screen(events, self.pipeline.own_users)
        if encrypted:
            self.kept.set()  # after screen: what it kept is in the store for the watcher's reckoning

        def commit_all() -> None:
            commit()
            if resolved:
                self.store.drop_undecrypted(resolved)
        return events, commit_all, chores_after

    async def _chores(self) -> None:
        """Members read again where they changed (their devices are then
        queried), then the key chores; one run at a time."""
        async with self._chores_lock:
            await self.crypto.chores()

    def _chores_after(self) -> None:
        if self._chores_running is None or self._chores_running.done():
            self._chores_running = asyncio.ensure_future(self._chores_logged())

    async def _chores_logged(self) -> None:
        try:
            await self._chores()
        except Exception as exc:  # noqa: BLE001 - done again before the next batch that needs them
            log.warning("encryption key chores failed (%s); tried again with the next batch", exc)

    async def feed_kept(self) -> None:
        """Kept encrypted events whose keys came (or whose grace ran out): the
        encryption sync calls this, outside any transaction."""
        async with self.one_at_a_time:
            await self._feed([], lambda: None)

    def _remember(self, events: list[Any]) -> None:
        for event in events:
            if isinstance(event, dict) and isinstance(event.get("event_id"), str):
                self.received[event["event_id"]] = None
        while len(self.received) > RECEIVED_KEPT:
            self.received.popitem(last=False)

    def _skips(self, txn_id: str) -> bool:
        """Synapse numbers transactions 1, 2, 3...; one that skips a number
        means one went missing or is held back (or went to another
        appservice of the same homeserver: they share the numbering)."""
        if not (txn_id.isascii() and txn_id.isdigit()) or len(txn_id) > 19:
            return False  # ("²" is a digit to isdigit, no number to int; nor are 4,300 digits)
        number, last = int(txn_id), self.last_txn
        # Also when lower: a restarted Synapse counts on from what it still
        # holds, one whose database was reset from 1.
        self.last_txn = number
        if last is not None and number > last + 1:
            log.info("transaction %s after %s: looking for what did not arrive", txn_id, last)
            return True
        return False

    def _trouble(self) -> None:
        if self.catchup is not None:
            self.catchup.suspect_gap()

    def _answer_invites(self, invited: dict[str, str | None], ended: list[str]) -> None:
        # Answered off the request path: joining or leaving waits on the
        # homeserver, which is waiting on this transaction's 200.
        if self.on_invite is None:
            return
        if ended and self.on_invites_ended is not None:
            self.on_invites_ended(ended)
        for room_id, inviter in invited.items():
            # One into a room the bridge is in (the homeserver resends what the
            # bridge had not taken when it stopped) is told apart by the handler:
            # a room in ``rooms`` may be one the bridge was kicked from.
            asyncio.ensure_future(self._invited(room_id, inviter))

    async def _invited(self, room_id: str, inviter: str | None) -> None:
        assert self.on_invite is not None
        await self.on_invite(room_id, inviter)
        # Back in a room it was kicked from: what was said there meanwhile is
        # in its timeline, not pushed; looked into soon, not at the next period.
        self._trouble()

    async def ping(self, request: web.Request) -> web.Response:
        if denied := self._denied(request):
            return denied
        return web.json_response({})

    async def not_found(self, request: web.Request) -> web.Response:
        if denied := self._denied(request):
            return denied
        return _error(404, "M_NOT_FOUND", "the bridge creates no users or rooms on demand")

    async def health(self, _request: web.Request) -> web.Response:
        return web.json_response({"live": True, "ready": self.ready.is_set()})

    async def wrong_method(self, request: web.Request) -> web.Response:
        return _error(405, "M_UNRECOGNIZED", f"{request.method} is not a method of {request.path}")

    async def unrecognised(self, _request: web.Request) -> web.Response:
        return _error(404, "M_UNRECOGNIZED", "unrecognised request")


class AppserviceFront:
    """Appservice mode for ``app.serve``: the client acts as the bridge's user
    with the as_token; events arrive over HTTP."""

    def __init__(self, config: Config, store: Store, ops: Any = None):
        self.config = config
        self.store = store
        self.ops = ops
        self.namespace = [re.compile(regex) for regex in user_namespace(config)]
        self.server: TransactionServer | None = None
        self.client: AsyncClient | None = None
        self.crypto: Any = None  # set when the bridge encrypts; the transport uses it too
        self.first_batch = asyncio.Event()  # nothing to wait for: transactions come when they come
        self.first_batch.set()
        # Set once the rooms' timelines were first looked into (``CatchUp.looked``):
        # what a frozen or dead instance before this one left unread is judged
        # by then, so the deadlines' first pass does not call expired what a
        # vote placed in time decided.
        self.looked_back = asyncio.Event()

    async def connect(self, stop: asyncio.Event) -> AsyncClient:
        settings = self.config.appservice
        if not (settings.as_token and settings.hs_token):
            raise ConfigError("the appservice tokens are not set (keys as_token and hs_token); run "
                              "`askwright-bridge generate-registration` and load the registration in the homeserver")
        await ensure_user(self.config, stop)
        if self.config.encryption.enabled:
            self.client = await self._encrypting_client()
            return self.client
        client = AsyncClient(self.config.homeserver.url, self.config.bot.user_id, config=client_config())
        client.access_token = settings.as_token
        client.user_id = self.config.bot.user_id
        self.client = client
        return client

    async def _encrypting_client(self) -> AsyncClient:
        from bridge.service.encryption.ascrypto import device_client  # noqa: PLC0415 - needs nio's e2e extra
        from bridge.service.encryption.crosssigning import CrossSigning, keys_file  # noqa: PLC0415
        from bridge.service.encryption.crypto import Crypto  # noqa: PLC0415

        client = await device_client(self.config, self.store)
        signing = CrossSigning(client, keys_file(self.config.store.path, self.config.encryption.cross_signing_keys),
                               upload_token=self.config.appservice.as_token)
        self.crypto = Crypto(client, self.store, self.config.encryption, cross_signing=signing,
                             on_outcome=self.ops.on_outcome if self.ops is not None else None)
        return client

    def own_user(self, user_id: str) -> bool:
        return any(regex.fullmatch(user_id) for regex in self.namespace)

    async def open(self, pipeline: Pipeline) -> None:
        # Listen before joining: transactions that arrive meanwhile wait for ``run``.
        self.server = TransactionServer(self.config, self.store, pipeline, self.ops)
        self.server.crypto = self.crypto
        if self.crypto is not None:
            await self.crypto.start()
            # No sync loop here to run the key chores beside: the device's keys
            # are up before the first transaction, or nobody could encrypt for it.
            await self.crypto.maintain()
        await self.server.start()

    async def run(self, pipeline: Pipeline, rooms: list[str], stop: asyncio.Event, posted: asyncio.Event,
                  room_ids: RoomIds | None = None) -> None:
        # ``posted`` is not needed here: nothing long-polls, so posting costs the homeserver no extra work.
        assert self.server is not None and self.client is not None
        server = self.server
        # Notices go out off the request path: a 200 must not wait on the
        # homeserver, which may itself be waiting on that 200.
        notices = Notices(pipeline, stop)
        pipeline.on_judged_apart = notices.wake
        spawn = (self.ops.supervisor if self.ops is not None else Supervisor()).spawn
        notifier = spawn("notices", notices.run, stop)
        invites = Invites.of(self.client, pipeline, rooms, self.config, self.store, room_ids)
        server.on_invite, server.on_invites_ended = invites.answer, invites.ended
        # Back in a room (a try after the first, an invite kept through a stop): what was said there
        # meanwhile is in its timeline, not pushed; looked into soon, not at the next period.
        invites.on_joined = lambda _room: server._trouble()
        # What the homeserver never delivers is read from the rooms' timelines.
        catchup = CatchUp(self.client, self.store, rooms, server.feed, server.received.__contains__,
                          pipeline.load_members, server.one_at_a_time, stop)
        server.catchup = catchup
        catchup.looked = self.looked_back
        if self.ops is not None:
            catchup.on_caught_up = self.ops.mark_ready
        server.open(rooms, notices)
        tasks = [notifier]
        try:
            await invites.resume()  # kept unanswered through a stop: Synapse does not push them again
            unreached = await ping_failure(self.config)
            if unreached is not None and self.ops is not None:
                # Answers still come, from the timelines' look every 30 s;
                # monitoring must see that the pushes do not.
                self.ops.metrics.not_reached(unreached)
                tasks.append(spawn("ping", lambda: ping_until_reached(self.config, self.ops.metrics, stop), stop))
            tasks.append(spawn("catch-up", catchup.run, stop))
            if self.ops is not None:
                metrics = self.ops.metrics
                tasks.append(spawn("homeserver-watch", lambda: keep_hearing(self.client, metrics, stop), stop))
            if self.crypto is not None:
                from bridge.service.encryption.ascrypto import keep_up_kept  # noqa: PLC0415

                crypto = self.crypto
                tasks.append(spawn("kept-keys", lambda: keep_up_kept(crypto, self.store, stop, server.feed_kept,
                                                                      server.kept), stop))
        except BaseException:
            for task in tasks:  # started again, with tasks of their own, when this is
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await invites.close()
            raise
        await stop.wait()
        await invites.close()
        notices.wake()
        await asyncio.gather(*tasks)

    async def close(self) -> None:
        if self.crypto is not None:
            await self.crypto.close()
        if self.server:
            await self.server.close()


# -- calls to the homeserver that nio has no method for ---------------------------

async def _post(config: Config, path: str, body: dict[str, Any], within: float = 60.0) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {config.appservice.as_token}"}
    timeout = aiohttp.ClientTimeout(total=within)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async with session.post(config.homeserver.url + path, json=body, headers=headers) as response:
            try:
                reply = await response.json(content_type=None)
            except (json.JSONDecodeError, UnicodeDecodeError):
                reply = {}
            return response.status, reply if isinstance(reply, dict) else {}


REGISTER_RETRY_AT_MOST = 5.0


async def ensure_user(config: Config, stop: asyncio.Event) -> None:
    """Register the bridge's user through the appservice API unless it exists."""
    body = {"type": "m.login.application_service", "username": config.appservice.sender_localpart,
            "inhibit_login": True}
    delay = 1.0
    while True:
        try:
            status, reply = await _post(config, "/_matrix/client/v3/register", body)
        except (aiohttp.ClientError, TimeoutError) as exc:
            status, reply = 0, {"error": str(exc)}
        if status == 200:
            log.info("registered %s", config.bot.user_id)
            return
        if reply.get("errcode") == "M_USER_IN_USE":
            return
        if status and status < 500 and status != 429:
            raise MatrixError("registering the bridge's user (is the registration file loaded by the homeserver, "
                              "with the same as_token?)", HttpReply(status, reply))
        if stop.is_set():
            return  # asked to stop while waiting: ``serve`` goes no further
        log.warning("the homeserver is not reachable yet (%s); retrying in %.0f s", reply.get("error"), delay)
        await sleep_or_stop(stop, delay)
        # At most 5 s: asking costs nothing, and the bridge is up that much
        # sooner once the homeserver is (30 s left answers waiting 20 s more).
        delay = min(delay * 2, REGISTER_RETRY_AT_MOST)


# A ping the homeserver could not make is asked for again, this often and
# this many times: Synapse's own ping can fail while it retries a held
# transaction itself (cancelling its back-off timer as that fires), and a
# proxy in front of a shared store may take a moment to route to this
# instance.  A refusal that says the homeserver has no ping (or refuses us)
# is not tried again.
PING_TRIES = 10
PING_INTERVAL = 0.5
# The start waits this long for the ping, its tries and each one's answer
# included (the rooms' timelines are looked into only after it): longer than
# Synapse takes to give up connecting to an address nothing answers at (15 s),
# so its reason is what is said.  Past it the start goes on, /health names the
# homeserver as not reaching the bridge, and ``ping_until_reached`` asks again.
PING_PATIENCE = 20.0
# A ping asked for after the start waits for Synapse's own verdict: it gives
# up on the bridge's address after 60 s (504 M_CONNECTION_TIMEOUT).  The
# bridge's 60 s ran out first, and the reason said was empty.
PING_ANSWER_WITHIN = 75.0


async def ping_failure(config: Config, patience: float | None = None) -> str | None:
    """Ask the homeserver to ping us; None when it did, else why not, within
    ``patience`` seconds (``PING_PATIENCE``).  Besides checking the
    whole path, a successful ping makes Synapse resend the transactions it
    holds for us at once instead of after its back-off (which doubles up to
    minutes): while it holds them it also drops what it would have pushed
    with them that is not a room event (the room keys people's clients send
    the bridge's device among it), so a start cannot wait for the back-off."""
    path = f"/_matrix/client/v1/appservice/{config.appservice.id}/ping"
    patience = PING_PATIENCE if patience is None else patience
    give_up = time.monotonic() + patience
    for attempt in range(PING_TRIES):
        try:
            status, reply = await _post(config, path, {}, within=max(give_up - time.monotonic(), 0.001))
            why = f"{status} {reply.get('error', reply)}"
        except TimeoutError:  # (before ClientError: aiohttp's timeouts are both, and say nothing)
            status, why = 0, f"no answer to the ping within {patience:g} s"
        except aiohttp.ClientError as exc:
            status, why = 0, str(exc)
        if status == 200:
            log.info("the homeserver reaches the bridge (%s ms)", reply.get("duration_ms"))
            return None
        if status and status < 500 and status != 429:
            break  # no ping on this homeserver, or not for us: asking again changes nothing
        if attempt + 1 < PING_TRIES and time.monotonic() + PING_INTERVAL < give_up:
            await asyncio.sleep(PING_INTERVAL)
        else:
            break
    log.warning("the homeserver's ping of the bridge failed: %s", why)
    return " ".join(why.split())[:200]


# A failed ping is asked for again this often, until one succeeds or the
# homeserver pushes a transaction: meanwhile /health says it can't reach us.
PING_AGAIN = 30.0


async def ping_until_reached(config: Config, metrics: Any, stop: asyncio.Event) -> None:
    """After a failed ping at start: ping again until the homeserver reaches the bridge."""
    while metrics.unreached is not None and not await set_within(stop, PING_AGAIN):
        if metrics.unreached is None:
            return  # a transaction came meanwhile
        why = await ping_failure(config, PING_ANSWER_WITHIN)
        if why is None:
            metrics.reached()
        else:
            metrics.not_reached(why)
