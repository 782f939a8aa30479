"""Appservice mode's safety net: read the rooms' timelines for events the
homeserver never pushed.

Why it exists: a transaction the homeserver considers sent is not always one
the bridge received.  Synapse (seen with 1.163) decides whether to send a new
transaction by reading the appservice's state (up or down) before it writes
the transaction; its recoverer, draining what it held while the bridge was
unreachable, marks the appservice up once it finds nothing left.  When the two
interleave (state read "down", recoverer finds nothing and marks "up",
transaction written), the transaction is stored as one to retry but nothing is
retrying any more: later events go out in newer transactions, and the
stranded one is sent only at the next failure, to whatever listens then (after
a restart, perhaps nobody who cares).  The same hole opens when anything else
answers 200 on the bridge's address.  The bridge cannot make the homeserver
deliver, so it looks for itself: it pages each configured room's timeline
back to where its last look ended and feeds what no transaction brought into
the same pipeline: at start, every ``FAST_PERIOD`` seconds until the first
transaction after the start comes (a new leader's homeserver may still wait
on a transaction sent to the instance that froze), then every ``PERIOD``
seconds; before handling a
transaction whose id skips one (Synapse numbers them 1, 2, 3...), so what
went missing is judged before what came after it (until such looks keep
finding nothing: see ``IDLE_LOOKS``); and once the homeserver's
retries after a start or a refused transaction have gone quiet for
``GAP_DELAY`` seconds (a transaction stranded last has no later one to
reveal it).  The processed-event table makes anything seen twice harmless.

An event found only by the periodic look is judged after newer ones that
did arrive; it still takes its place in the room's timeline (the record is
projected in ``origin_server_ts`` order), so a stranded older answer does
not replace a newer one, and an edit that came before its stranded original
waits for it (tests/integration/test_timeline_appservice.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Collection

from nio import AsyncClient, MessageDirection

from bridge.service.logs import why
from bridge.service.transport.bot import sleep_or_stop
from bridge.service.transport.matrix import StopRequested, timeline_page, timeline_pages

if TYPE_CHECKING:
    from bridge.service.storage.store import Store

log = logging.getLogger(__name__)

PERIOD = 30.0  # seconds between two looks when nothing is suspected
# Until the first transaction after a start, the homeserver may be holding
# its one transaction in flight to an instance that froze (the leader this
# one took over from) or backing off after failures: nothing is pushed, so
# the timelines are looked into every FAST_PERIOD seconds, for FAST_FOR at
# most (longer than a proxy in front lets a transaction hang).
FAST_PERIOD = 1.5
FAST_FOR = 60.0
GAP_DELAY = 2.0  # a suspected gap is looked into once no transaction came for this long
QUIET_WAIT = 60.0  # ... or after this long at most
# A look before a transaction that skips an id holds that transaction up:
# never longer than LOOK_TIMEOUT, and at most LOOK_BURST times in LOOK_WINDOW
# seconds (ids skip all the time on a homeserver serving several appservices,
# which share the numbering); beyond that the look is left to ``run``.
LOOK_TIMEOUT = 10.0
LOOK_BURST = 3
LOOK_WINDOW = 10.0
# Beside other appservices an id skips at almost every transaction, and each
# look holds one up by a round trip to a busy homeserver (tens of ms).  After
# IDLE_LOOKS looks before transactions in a row found nothing, skips are left
# to the periodic look, until a look finds something that came in no
# transaction, the bridge refuses a transaction, or it starts again: the
# times Synapse strands one.
IDLE_LOOKS = 3
PAGE = 500
# Per room and look, read back from the newest; past it, a look that knows
# where the last one ended reads forward from there instead, a page at a time
# (``_read_forward``): a room the bot was kicked from gets no transactions
# while it is out, and what was said there, however much, comes this way.
MAX_EVENTS = 5000
# A room looked at for the first time is read back to its oldest open question
# (what came before cannot answer anything the bridge asked), less this margin
# for the clocks of the bridge and the homeserver disagreeing.
CLOCK_MARGIN_MS = 10 * 60 * 1000

TOKEN_KEY = "appservice_catchup:"  # + room id: where the last look ended (a /messages token)

# Feeds a room's events to the pipeline the way a transaction is fed (the
# caller holds ``lock``); ``commit`` runs in the final store transaction.
Feed = Callable[[list[dict[str, Any]], Callable[[], None]], Awaitable[None]]


class CatchUp:
    def __init__(self, client: AsyncClient, store: Store, rooms: list[str], feed: Feed,
                 received: Callable[[str], bool], on_members: Callable[[str], Awaitable[None]],
                 lock: asyncio.Lock, stop: asyncio.Event, clock: Callable[[], float] = time.monotonic):
        self.client = client
        self.store = store
        self.rooms = rooms  # shared with app.serve, which adds rooms joined later
        self.feed = feed
        self.received = received  # event ids a transaction already brought
        self.on_members = on_members  # reload a room's members after feeding membership changes
        self.lock = lock  # the transactions' lock: a look and a transaction never interleave
        self.stop = stop
        self.clock = clock
        self.suspected = asyncio.Event()
        self.activity = asyncio.Event()
        self.looks_now: deque[float] = deque(maxlen=LOOK_BURST)
        self.idle_looks = 0  # looks before a transaction in a row that found nothing
        self.pushed = asyncio.Event()  # a transaction came since this start
        # Set once the first look since this start is done (found or failed):
        # what the rooms hold that no transaction brought is judged by then.
        self.looked = asyncio.Event()
        # Told after the first look that read every room: the bridge is caught
        # up then, whether or not the homeserver pushes anything (a restart into
        # quiet rooms stayed "not ready" for good, waiting for a transaction).
        self.on_caught_up: Callable[[], None] | None = None
        self._failing: set[str] = set()  # rooms whose look failed last time (said once per run of failures)

    def suspect_gap(self) -> None:
        """Look again once transactions have gone quiet, off the request path;
        until then, a skipped id is looked into before its transaction again."""
        self.idle_looks = 0
        self.suspected.set()

    def heard(self) -> None:
        """A transaction came."""
        self.activity.set()
        self.pushed.set()

    async def look_now(self, arriving: Collection[str] = ()) -> None:
        """Before a transaction that skips an id (the caller holds the lock);
        ``arriving``: its events' ids (see ``_sweep``)."""
        if self.idle_looks >= IDLE_LOOKS:
            return  # the numbering is shared with other appservices: left to the periodic look
        now = self.clock()
        if len(self.looks_now) == LOOK_BURST and now - self.looks_now[0] < LOOK_WINDOW:
            self.suspected.set()
            return
        self.looks_now.append(now)
        try:
            _fed, stranded = await asyncio.wait_for(self._sweep(arriving), LOOK_TIMEOUT)
            if not stranded:
                self.idle_looks += 1
        except Exception as exc:  # noqa: BLE001 - the transaction goes on; the look is tried again soon
            log.warning("looking for what did not arrive failed (%s); trying again shortly",
                        why(exc))
            self.suspect_gap()

    async def run(self) -> None:
        # Right after start the homeserver sends what it held: look again when that is done.
        self.suspected.set()
        started = self.clock()
        while not self.stop.is_set():
            try:
                # The lock a room at a time: held for the whole look (every
                # room's timeline read, thousands of rooms), a transaction
                # waited past the proxy's timeout and Synapse marked the
                # bridge down, backing off for minutes.
                await self._sweep(lock=self.lock)
                if self.on_caught_up is not None:
                    self.on_caught_up()
            except Exception as exc:  # noqa: BLE001 - the next look tries again
                log.warning("looking for events the homeserver did not push failed (%s); trying again shortly",
                            why(exc))
            self.looked.set()
            if not self.pushed.is_set() and self.clock() - started < FAST_FOR:
                # Nothing pushed since the start: perhaps nothing can be yet.
                if not await self._wait(FAST_PERIOD, self.pushed):
                    continue
            if await self._wait(PERIOD, self.suspected):
                self.suspected.clear()
                quiet_by = self.clock() + QUIET_WAIT
                self.activity.clear()
                while await self._wait(GAP_DELAY, self.activity) and self.clock() < quiet_by:
                    self.activity.clear()

    async def _wait(self, seconds: float, also: asyncio.Event) -> bool:
        """Until ``seconds`` pass, stop is asked, or ``also`` is set (True then)."""
        await sleep_or_stop(self.stop, seconds, wake=also)
        return also.is_set() and not self.stop.is_set()

    async def sweep(self) -> int:
        """One look at every room; returns how many events were fed."""
        return (await self._sweep())[0]

    async def _sweep(self, arriving: Collection[str] = (), lock: asyncio.Lock | None = None) -> tuple[int, int]:
        """One look at every room: how many events were fed, and how many of
        them a transaction that never came must have held (``_stranded``).
        ``arriving``: the events of the transaction this look holds up.
        ``lock``: taken for each room's look (None: the caller holds it)."""
        fed = stranded = 0
        failed: list[Exception] = []
        rooms = list(dict.fromkeys(self.rooms))
        for room_id in rooms:
            if self.stop.is_set():
                break
            try:
                async with lock if lock is not None else contextlib.nullcontext():
                    room_fed, room_stranded = await self.sweep_room(room_id, arriving)
            except Exception as exc:  # noqa: BLE001 - one room the bridge can't read (banned, deleted) stops no other
                failed.append(exc)
                if room_id not in self._failing:
                    self._failing.add(room_id)
                    log.warning("looking into %s failed (%s); the other rooms are looked into, and it is at the "
                                "next look", room_id, why(exc))
                continue
            self._failing.discard(room_id)
            fed += room_fed
            stranded += room_stranded
        if failed and len(failed) == len(rooms):
            raise failed[0]  # none could be read (the homeserver away): the look failed
        if stranded:
            self.idle_looks = 0  # something was stranded: skips are worth a look again
        return fed, stranded

    async def sweep_room(self, room_id: str, arriving: Collection[str] = ()) -> tuple[int, int]:
        """One look at a room: how many events were fed (those no transaction
        brought), and how many of them were stranded."""
        key = TOKEN_KEY + room_id
        # Every store look of a look is a job on the store's thread: a look
        # comes every few seconds, and on the event loop each waited for the
        # database while /health and the transactions did.
        since, oldest_ts = await self.store.run(self._where_to_begin, room_id, key)
        if since is None and oldest_ts is None:
            # A first look at a room with no open question: nothing before now
            # can answer anything; only the position is wanted.
            page = await timeline_page(self.client, room_id, None, None, 1)
            if page.start:
                await self.store.run_written(self.store.set_meta, key, page.start, flush=False)
            return 0, 0
        def too_old(event: dict[str, Any]) -> bool:
            ts = event.get("origin_server_ts")
            return oldest_ts is not None and isinstance(ts, int) and ts < oldest_ts

        newest: list[dict[str, Any]] = []  # newest first
        token: str | None = None  # where this look began: the next one ends there
        try:
            async for page in timeline_pages(self.client, room_id, None, since, self.stop, PAGE):
                token = token or page.start
                newest.extend(e for e in page.chunk if not too_old(e))
                if len(newest) >= MAX_EVENTS:
                    if since is not None:
                        log.info("more than %d events in %s since the last look; read forward from it",
                                 MAX_EVENTS, room_id)
                        return await self._read_forward(room_id, key, since, arriving)
                    log.warning("more than %d events in %s since the last look; older ones are not looked at",
                                MAX_EVENTS, room_id)
                    break
                if any(too_old(e) for e in page.chunk):
                    break
        except StopRequested:
            return 0, 0  # nothing fed, nothing committed: the next start looks again
        in_order = [e for e in reversed(newest) if isinstance(e.get("event_id"), str)]
        unheard = [e for e in in_order if not self.received(e["event_id"])]
        # One job on the store's thread for them all: a query each on the
        # event loop held /health 1.1 s for 11 events with the database 100 ms away.
        processed = await self.store.run(self.store.processed_among, [e["event_id"] for e in unheard])
        missing = [e for e in unheard if e["event_id"] not in processed]

        def commit() -> None:
            if token:
                self.store.set_meta(key, token)

        if missing:
            log.info("%d events in %s came in no transaction; processing them now", len(missing), room_id)
            await self.feed(missing, commit)
            if any(e.get("type") == "m.room.member" for e in missing):
                await self.on_members(room_id)  # what the homeserver says now, not what was replayed
        elif token and token != since:
            await self.store.run_written(commit, flush=False)  # only progress: losing it means looking again
        return len(missing), _stranded(in_order, missing, arriving)

    async def _read_forward(self, room_id: str, key: str, since: str,
                            arriving: Collection[str]) -> tuple[int, int]:
        """``sweep_room``'s look for a room with too much since ``since`` to
        hold at once: a page at a time, oldest first, the position kept with
        each page's events, so nothing is skipped and a stop loses nothing."""
        fed = stranded = 0
        try:
            async for page in timeline_pages(self.client, room_id, since, None, self.stop, PAGE,
                                             MessageDirection.front):
                in_order = [e for e in page.chunk if isinstance(e.get("event_id"), str)]
                unheard = [e for e in in_order if not self.received(e["event_id"])]
                processed = await self.store.run(self.store.processed_among, [e["event_id"] for e in unheard])
                missing = [e for e in unheard if e["event_id"] not in processed]
                end = page.end

                def commit(end: str | None = end) -> None:
                    if end:
                        self.store.set_meta(key, end)

                if missing:
                    await self.feed(missing, commit)
                elif end:
                    await self.store.run_written(commit, flush=False)
                fed += len(missing)
                stranded += _stranded(in_order, missing, arriving)
        except StopRequested:
            pass  # the position kept so far stands: the next look goes on from there
        if fed:
            log.info("%d events in %s came in no transaction; processed, reading forward", fed, room_id)
            await self.on_members(room_id)
        return fed, stranded

    def _where_to_begin(self, room_id: str, key: str) -> tuple[str | None, int | None]:
        """(where the last look ended, or the oldest time worth a first look)."""
        since = self.store.get_meta(key)
        return since, None if since else self._oldest_wanted(room_id)

    def _oldest_wanted(self, room_id: str) -> int | None:
        posted = [q.posted_at for q in self.store.open_posted() if q.room_id == room_id]
        return min(posted) - CLOCK_MARGIN_MS if posted else None


def _stranded(in_order: list[dict[str, Any]], missing: list[dict[str, Any]], arriving: Collection[str]) -> int:
    """How many of a room's events no transaction brought (``missing``, of
    the look's events ``in_order``, oldest first) came before one that did
    come, in a transaction or in the one the look holds up (``arriving``).
    The homeserver pushes a room's events in order, so those were in a
    transaction that never came; one after the last that came may still be
    on its way (the held transaction's own events are in the timeline
    already, and on a busy room so are those sent after them).  Counting
    those too made every look find something, so beside other appservices
    every skip was looked into, never left to the periodic look."""
    missed = {event["event_id"] for event in missing} - set(arriving)
    last_came = max((n for n, event in enumerate(in_order) if event["event_id"] not in missed), default=0)
    return sum(1 for event in in_order[:last_came] if event["event_id"] in missed)
