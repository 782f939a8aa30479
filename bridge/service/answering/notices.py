"""Telling people what became of their answers, room by room and person by
person, so nothing one room or one person does holds up anyone else.

* Acknowledgements go first, refusals after them, each in log order; a
  notice whose answer is not yet in answers.json (its set held back) waits.
  Answers of one person to one question not yet acknowledged (a catch-up)
  get one reply, for the answer that stands, saying how many it replaced.
* A room whose sends fail is backed off on its own; after a permanent
  error (forbidden, not in the room, room gone) its notice is dropped with a
  log line, a metric and a row in the store, never retried forever.
* Refusals to one person about one question are coalesced: at most
  ``REFUSAL_BURST`` replies per ``REFUSAL_WINDOW`` seconds; what comes on
  top is answered in one later reply saying how many more were refused.
* Under the homeserver's rate limit the transport sends by priority
  (``pacing``): acknowledgements, then questions, then refusals.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections import defaultdict, deque
from typing import Any, Callable

from bridge.service.eventwait import set_within
from bridge.protocol.outcome import coalesced, txn_id
from bridge.service.answering import quiz
from bridge.service.transport.matrix import MatrixError
from bridge.service.transport.pacing import ACK, REFUSAL, priority
from bridge.service.storage.store import COALESCED, SENT, LogEntry

# Meta key (+ the last entry's seq) of a notice whose send has begun.
SENDING = "notice-sending:"

log = logging.getLogger(__name__)

REFUSAL_WINDOW = 60.0
REFUSAL_BURST = 2
ROOM_BACKOFF_MAX = 300.0
# Notices of each kind worked out per pass, oldest first.
PASS = 1000
# Once the bridge is asked to stop, notices still going out get this long;
# what is left goes out at the next start (under the same transaction ids).
# A homeserver that is gone would otherwise hold the stop forever: nio
# retries a connection that fails without end.
STOP_GRACE = 10.0


class _OutOfTime(Exception):
    """Stopping, and the grace for notices is over."""


class Notices:
    """Sends the pending notices in the background, so telling people about
    one batch never delays receiving the next."""

    def __init__(self, pipeline: Any, stop: asyncio.Event, clock: Callable[[], float] = time.monotonic):
        self.pipeline = pipeline
        self.store = pipeline.store
        self.stop = stop
        self.clock = clock
        self.pending = asyncio.Event()
        # The first pass sends what an earlier run left unsent, beside the
        # first batch rather than ahead of it.
        self.pending.set()
        self.room_retry: dict[str, tuple[float, float]] = {}  # room -> (not before, last delay)
        # Rooms whose notices last failed for the homeserver's absence (no
        # answer, a 5xx, a proxy's page), not a rate limit: tried again as
        # soon as it answers.
        self._unreachable: set[str] = set()
        self.refusals_sent: dict[tuple[str, str, str | None], deque[float]] = defaultdict(deque)
        # Refusals held back by the burst (person, question): once their turn
        # comes, an answer of theirs recorded meanwhile makes them moot.
        self._held: set[tuple[str, str, str | None]] = set()
        self.next_due: float | None = None
        self._stop_seen: float | None = None  # when a pass first saw the stop (time.monotonic)
        # Set while a catch-up's gap is judged page by page: its answers are
        # told once the whole gap is in, one reply per person and question.
        self.reading_gap = False
        self.woken = 0  # wake-ups so far: a pass sees whether new entries came while it sent

    def wake(self) -> None:
        self.woken += 1
        self.pending.set()

    def homeserver_answered(self) -> None:
        """``wake``, after the homeserver answered (a sync, a transaction):
        a room's notices held back while it was away go now, not when their
        backoff (doubling to 5 minutes through the outage) ends."""
        for room in self._unreachable:
            self.room_retry.pop(room, None)
        self._unreachable.clear()
        self.wake()

    async def run(self) -> None:
        while True:
            timeout = None if self.next_due is None else max(0.05, self.next_due - self.clock())
            await set_within(self.pending, timeout)
            self.pending.clear()
            if self.reading_gap and not self.stop.is_set():
                continue  # the sync loop wakes it after the batch that ends the gap
            try:
                held = await self.store.run(self.pipeline.retry_held)
                await self.send_pending()
                if held:  # look again when the next held set is due
                    self._due(self.clock() + 1.0)
            except Exception as exc:  # noqa: BLE001 - unsent notices stay in the store for the next pass
                log.warning("notices not sent yet (%s); retrying", exc)
                self._due(self.clock() + 2.0)
            if self.stop.is_set():
                return

    async def send_pending(self) -> int:
        """One pass over the notices still to send (the oldest ``PASS`` of each
        kind); returns how many were sent."""
        self.next_due = None
        woken_at_start = self.woken
        now = self.clock()
        waiting = [room for room, (not_before, _delay) in self.room_retry.items() if not_before > now]
        for room in waiting:  # backed off: left out of this pass, looked at again when due
            self._due(self.room_retry[room][0])
        # An acknowledgement stands for every accepted answer of one person to
        # one question still untold (a catch-up after downtime): one reply, for
        # the answer that stands, counting the ones it replaced.
        sent = await self._resume_interrupted(waiting)
        acks, refusals = await self.store.run(
            lambda: (self.store.pending_acks(PASS, waiting), self.store.pending_refusals(PASS, waiting)))
        refused = 0
        with priority(ACK):
            for tried, (last, _count) in enumerate(acks):
                if self._out_of_time():
                    break
                if tried and self.woken != woken_at_start and not self.stop.is_set():
                    # New entries came while these were sent (at the homeserver's
                    # pace): the next pass puts their senders in turn with the
                    # rest, so one person's backlog delays nobody else's word.
                    # (Each pass sends one first: wake-ups faster than a pass
                    # never leave every notice unsent.)
                    break
                entry = await self._send(functools.partial(self._standing, last), self._ack_maker)
                if entry is not None:
                    sent += 1
                    if entry.outcome == "accepted":
                        await self._score(entry)
        with priority(REFUSAL):
            for last, _count, room_id, sender, question in refusals:
                if self._out_of_time():
                    break
                key = (room_id, sender, question)
                if not self._refusal_allowed(key):
                    self._held.add(key)
                    continue
                if key in self._held:
                    self._held.discard(key)
                    if await self.store.run(self._answered_since, last, sender, question):
                        continue
                if await self._send(functools.partial(self._standing, last), self._refusal_maker, refusal=True):
                    self.refusals_sent[key].append(self.clock())
                    sent += 1
                    refused += 1
        if len(acks) == PASS or (len(refusals) == PASS and refused):
            self.pending.set()  # more than one window was waiting: the next pass comes at once
        return sent

    def _answered_since(self, last: int, sender: str, question: str | None) -> bool:
        """Held refusals (up to ``last``) of ``sender`` about ``question``
        that an answer of theirs recorded since has made moot: told by its
        acknowledgement (marked so), not by a reply asking them to do again
        what they did.  False when none was recorded."""
        if question is None or not self.store.accepted_since(last, sender, question):
            return False
        with self.store.transaction(flush=False):
            for seq in self.store.notice_seqs(last):
                self.store.mark_acked(seq, COALESCED)
        return True

    def _standing(self, last: int) -> tuple[LogEntry, list[int]] | None:
        """The entry the notice of ``last`` is about (of the pending entries it
        stands for, the latest in the room's order) and those entries."""
        seqs = self.store.notice_seqs(last)
        entry = self.store.log_entry(seqs[-1])
        return None if entry is None else (entry, seqs)

    def _ack_maker(self, entry: LogEntry, seqs: list[int]) -> Callable[[], dict[str, Any]]:
        return lambda: self.pipeline.notice_for(entry, len(seqs) - 1)

    def _refusal_maker(self, entry: LogEntry, seqs: list[int]) -> Callable[[], dict[str, Any]]:
        return lambda: coalesced(self.pipeline.notice_for(entry), len(seqs) - 1)

    async def _resume_interrupted(self, waiting: list[str]) -> int:
        """Send again, with the same transaction id, each notice whose send an
        earlier run (or pass) began and did not see through.  It stands for
        the entries it stood for then: worked out anew, a later answer would
        make it a new reply counting again answers the first one told.  The
        homeserver answers a repeat with the event it already has.  A room
        whose notice is still unresolved joins ``waiting``."""
        sent = 0
        for key, value in await self.store.run(self.store.meta_with_prefix, SENDING):
            intent = json.loads(value)
            seqs, refusal = [int(seq) for seq in intent["seqs"]], bool(intent.get("refusal"))
            make = self._refusal_maker if refusal else self._ack_maker
            if await self._send(functools.partial(self._still_owed, key, seqs), make, refusal=refusal):
                sent += 1
            elif (room := await self.store.run(self._unresolved, key, seqs)) is not None and room not in waiting:
                waiting.append(room)  # its entries wait with it
        return sent

    def _still_owed(self, key: str, seqs: list[int]) -> tuple[LogEntry, list[int]] | None:
        """The entries an interrupted notice stood for, if it is still owed (its intent forgotten otherwise)."""
        entry = self.store.log_entry(seqs[-1]) if seqs else None
        if entry is None or not self.store.notice_pending(seqs):
            with self.store.transaction(flush=False):
                self.store.delete_meta(key)
            return None
        return entry, seqs

    def _unresolved(self, key: str, seqs: list[int]) -> str | None:
        """The room of an interrupted notice whose send is still unresolved."""
        entry = self.store.log_entry(seqs[-1]) if seqs and self.store.get_meta(key) is not None else None
        return entry.room_id if entry is not None else None

    def _refusal_allowed(self, key: tuple[str, str, str | None]) -> bool:
        times, now = self.refusals_sent[key], self.clock()
        while times and now - times[0] >= REFUSAL_WINDOW:
            times.popleft()
        if len(times) < REFUSAL_BURST:
            return True
        self._due(times[0] + REFUSAL_WINDOW)
        return False

    async def _send(self, find: Callable[[], tuple[LogEntry, list[int]] | None],
                    maker: Callable[[LogEntry, list[int]], Callable[[], dict[str, Any]]],
                    refusal: bool = False) -> LogEntry | None:
        """Send the notice ``maker`` builds for the entry ``find`` gives,
        standing for every entry of its ``seqs``; the entry when it was sent.
        What comes before the send is one job on the store's thread."""
        prepared = await self.store.run(self._prepare, find, maker, refusal)
        if prepared is None:
            return None
        entry, seqs, content, intent = prepared
        room = entry.room_id
        try:
            sent_id = await self._within_grace(self.pipeline.transport.send(
                room, "m.room.message", content, txn_id("ack", entry.event_id, str(seqs[-1]))))
        except _OutOfTime:
            return None  # still pending in the store
        except MatrixError as exc:
            if not exc.permanent:
                self._back_off(room, exc)
                return None
            log.warning("notice for %s dropped: %s can't be written to (%s)", entry.event_id, room, exc)
            await self.store.run(self._drop, seqs, room, exc.status or "refused")
            return None
        except Exception as exc:  # noqa: BLE001 - the network: this room waits, the others go on
            self._back_off(room, exc)
            return None
        self.room_retry.pop(room, None)
        self._unreachable.discard(room)
        await self.store.run(self._mark_sent, entry, seqs, intent, sent_id)
        return entry

    def _prepare(self, find: Callable[[], tuple[LogEntry, list[int]] | None],
                 maker: Callable[[LogEntry, list[int]], Callable[[], dict[str, Any]]],
                 refusal: bool) -> tuple[LogEntry, list[int], dict[str, Any], str] | None:
        """The entry, the notice made, and the intent to send it kept: one piece (a job)."""
        found = find()
        if found is None:
            return None
        entry, seqs = found
        not_before = self.room_retry.get(entry.room_id, (0.0, 0.0))[0]
        if not_before > self.clock():
            self._due(not_before)
            return None
        try:
            content = maker(entry, seqs)()
        except Exception:  # noqa: BLE001 - a notice that can't even be written is dropped, not retried
            log.exception("the notice for %s can't be made; dropped", entry.event_id)
            self._drop(seqs, entry.room_id, "unrenderable")
            return None
        intent = SENDING + str(seqs[-1])
        # Which entries this notice stands for, kept until they are marked:
        # a crash between the send and the mark resends exactly this notice.
        with self.store.transaction(flush=False):
            self.store.set_meta(intent, json.dumps({"seqs": seqs, "refusal": refusal}))
        return entry, seqs, content, intent

    def _mark_sent(self, entry: LogEntry, seqs: list[int], intent: str, sent_id: Any) -> None:
        # Not worth waiting for the disk (this runs between batches, on the
        # answers' path): a mark lost to a power cut re-sends the notice
        # with the same transaction id, which the homeserver answers with
        # the event it already has.
        with self.store.transaction(flush=False):
            for seq in seqs:
                self.store.mark_acked(seq, SENT if seq == seqs[-1] else COALESCED)
            self.store.delete_meta(intent)
            if isinstance(sent_id, str):  # a reply to this notice is about the same question
                self.store.record_sent(sent_id, entry.room_id, question_event_id=entry.question_event_id,
                                       about=entry.event_id)

    def _grace_left(self) -> float:
        if self._stop_seen is None:
            self._stop_seen = time.monotonic()
        return self._stop_seen + STOP_GRACE - time.monotonic()

    def _out_of_time(self) -> bool:
        return self.stop.is_set() and self._grace_left() <= 0

    async def _within_grace(self, send: Any) -> Any:
        """``send`` awaited; once a stop is asked for, for the rest of the grace only."""
        task = asyncio.ensure_future(send)
        stopping = asyncio.ensure_future(self.stop.wait())
        try:
            await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                await asyncio.wait({task}, timeout=max(0.0, self._grace_left()))
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                raise _OutOfTime()
            return task.result()
        finally:
            stopping.cancel()

    async def _score(self, entry: LogEntry) -> None:
        try:
            await quiz.send_score_if_complete(entry, self.store, self.pipeline.transport)
        except Exception as exc:  # noqa: BLE001 - the score is a courtesy; the answer is acknowledged
            log.warning("study score for %s not sent (%s)", entry.set_id, exc)

    def _back_off(self, room: str, exc: BaseException) -> None:
        if isinstance(exc, MatrixError) and exc.status == "M_LIMIT_EXCEEDED":
            self._unreachable.discard(room)  # the homeserver asked for the wait: it stands
        else:
            self._unreachable.add(room)
        delay = min(max(self.room_retry.get(room, (0.0, 0.0))[1] * 2, 0.5), ROOM_BACKOFF_MAX)
        self.room_retry[room] = (self.clock() + delay, delay)
        self._due(self.clock() + delay)
        log.warning("notices to %s not sent yet (%s); retrying in %.1f s", room, exc, delay)

    def _drop(self, seqs: list[int], room: str, reason: str) -> None:
        at = int(time.time() * 1000)
        with self.store.transaction(flush=False):
            for seq in seqs:
                self.store.drop_notice(seq, room, reason, at)
            self.store.delete_meta(SENDING + str(seqs[-1]))
        self.pipeline.report_trouble("notice", reason)

    def _due(self, when: float) -> None:
        self.next_due = when if self.next_due is None else min(self.next_due, when)
