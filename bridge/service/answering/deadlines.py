"""Deadlines, decisions and escalations of approval questions (PROTOCOL 2a), in the room.

The judge and the projection decide by the room's order alone; this is the
I/O that makes the room say so:

* at posting (``schedule``): the poll's end, the closing edit and the
  escalation's mention are handed to the homeserver as MSC4140 delayed
  events, so it closes the question on time while the bridge is down;
* a pass (``pass_once``, every ``tick`` seconds and at start): a quorum the
  votes reached closes the question ("decided") and cancels what was
  scheduled; a deadline reached closes it ("expired"), rewrites the
  record, and, where the homeserver could not be given the closing,
  ends the poll itself; an escalation due mentions its people.

What is owed to the room is kept in the store before it is sent, under
transaction ids made from what is sent, so a crash in between says it again
and the homeserver keeps one copy.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from bridge.service.eventwait import any_set
from bridge.protocol.approval_record import of_revision, told_outcome
from bridge.protocol.judge import CLOSED_DECIDED, CLOSED_EXPIRED
from bridge.protocol.outcome import display_names, in_thread, shown_title, txn_id
from bridge.protocol.poll import POLL_END, deadline_poll_end, poll_end
from bridge.protocol.question_event import closed_replacement, reopened_replacement
from bridge.protocol.quorum import PENDING, Tally, decision_line, decision_words, expiry_words, stood_words
from bridge.protocol.recorded import RecordedQuestion
from bridge.protocol.render import HTML_FORMAT, esc_people
from bridge.service.storage.store import Store

log = logging.getLogger(__name__)

TRACKED = "approval:"  # meta: a posting with a deadline, a quorum or an escalation still to watch
DELAYS = "delays:"  # meta: JSON {what: delay_id} handed to the homeserver
UNTOLD = "approval_untold:"  # meta: decided / expired, the room not told yet
ESCALATED = "escalated:"  # meta: the escalation's mention was sent (or handed to the homeserver)
CLOSING = "approval_closing:"  # meta: JSON {words, gen[, next]}: what the delayed closing edit says
TOLD = "approval_told:"  # meta: JSON {said, words, n}: what the room last heard, and how many tellings so far
RECORD = "approval_record:"  # meta: JSON, a replaced posting's record as it closed
KEYED = "delays_keyed:"  # meta: JSON {to: devices, gen}: who the room key of the delayed events went to
CLOSE_AGAIN = "approval_close_again:"  # meta: the homeserver's closing edit went out over a close otherwise: said again
OWED = "delays_owed:"  # meta: JSON {poll, epoch}: a handing over the homeserver failed, tried again by the pass
NOTICE_KEY = "dev.superpipeline.question.approval"
DEFAULT_TICK_SECONDS = 1.0
RESTATE_AGAIN_MS = 5000  # a refused restatement of the closing edit is tried again after this
# What the room is told when a decision it heard is undone (a vote it counted
# was taken back before it, read late): undecided again, open to votes.
UNDONE = "undone"


def wants_tracking(question: RecordedQuestion) -> bool:
    return question.quorum is not None or question.expires_ms is not None or question.escalation is not None


def keep_record(store: Store, replaced: RecordedQuestion, set_dir: str) -> None:
    """In the transaction that posts a new revision, before it is recorded:
    the record the replaced posting closes with (an approval's only)."""
    if wants_tracking(replaced) and replaced.qid:
        record = store.projection(set_dir, replaced.qid)
        if record is not None:
            store.set_meta(RECORD + replaced.event_id, json.dumps(record))


def escalation_content(question: RecordedQuestion) -> dict[str, Any]:
    _at, people = question.escalation or (0, ())
    title = shown_title(question.question.get("title", question.qid))
    text = f"{', '.join(people)}: \u201c{title}\u201d is still undecided; you may answer it now."
    return {"msgtype": "m.text", "body": text, "m.mentions": {"user_ids": list(people)},
            "m.relates_to": in_thread(question.event_id),
            NOTICE_KEY: {"question_event_id": question.event_id, "what": "escalated"}}


class Deadlines:
    def __init__(self, store: Store, transport: Any, flush: Callable[[], Any] = lambda: None,
                 on_decided: Callable[[RecordedQuestion, dict[str, Any], int], None] | None = None,
                 on_expired: Callable[[RecordedQuestion, dict[str, Any] | None, int], None] | None = None,
                 on_closed: Callable[[RecordedQuestion, str], None] | None = None,
                 clock: Callable[[], float] | None = None):
        self.store = store
        self.transport = transport
        self.flush = flush
        self.on_decided = on_decided
        self.on_expired = on_expired
        self.on_closed = on_closed
        # The store's clock: a deadline one instance set is judged by whichever leads when it passes.
        self.clock = clock or store.clock.seconds
        # Postings whose delayed events are being handed over right now (the
        # delay id not written down yet): the sweep leaves theirs alone.
        self._handing: set[str] = set()
        # Posting -> when a restatement the homeserver refused (or that could
        # not be encrypted) is tried again: not every second's pass.
        self._refused_until: dict[str, int] = {}
        # Postings an answer was just logged for (``touch``): looked at before
        # the next tick, so the homeserver's closing edit says a vote in tens
        # of milliseconds, not up to a tick later (a kill in that second left
        # the deadline's edit saying "no votes" over a decided approval).
        self._touched: set[str] = set()
        self._touched_lock = threading.Lock()
        self._woken = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    def _now(self) -> int:
        return int(self.clock() * 1000)

    # -- at posting --------------------------------------------------------

    async def schedule(self, question: RecordedQuestion, poll_id: str | None) -> None:
        """Track a posting with approval fields, and hand the homeserver what it must send on time."""
        if not wants_tracking(question):
            return
        # On the store's thread, as all the poster's store work: posting never holds the event loop.
        await self.store.run_written(self.store.set_meta, TRACKED + question.event_id, "1")
        send_delayed = getattr(self.transport, "send_delayed", None)
        if send_delayed is None:
            return
        self._handing.add(question.event_id)
        try:
            await self._schedule(question, poll_id, send_delayed)
        finally:
            self._handing.discard(question.event_id)

    async def _schedule(self, question: RecordedQuestion, poll_id: str | None, send_delayed: Any,
                        epoch: int = 0) -> bool:
        """``epoch``: scheduled again after a decision was undone (the room's
        ``n``-th telling): new transaction ids, the first ones' delays being
        cancelled at the decision (a homeserver hands a retried one its old delay id).

        False when the homeserver failed (a 5xx, a 429, no answer): what is
        left is owed, and the pass hands it over again in a while with the
        same transaction ids (one the homeserver took without a word comes
        back with its delay id).  Given up after one failure, the deadline
        closed nothing with the bridge down."""
        delays = await self.store.run(self._delays, question.event_id)
        planned, closing = await self._planned(question, poll_id, epoch, self._now())
        for what, event_type, content, at in planned:
            if what in delays:
                continue
            try:
                delay_id = await send_delayed(question.room_id, event_type, content,
                                              txn_id("delayed", what, question.event_id, *_epoch(epoch)),
                                              max(1, at - self._now()))
            except Exception as exc:  # noqa: BLE001 - the pass tries again; the bridge closes it itself at worst
                log.warning("delayed %s for %s not handed to the homeserver (%s); tried again in a while", what,
                            question.event_id, exc)
                await self.store.run_written(self.store.set_meta, OWED + question.event_id,
                                             json.dumps({"poll": poll_id, "epoch": epoch}))
                self._refused_until[question.event_id] = self._now() + RESTATE_AGAIN_MS
                return False
            if delay_id is None:
                return True  # no delayed events here (or not this one): the pass does it all
            delays[what] = delay_id
            log.info("delayed %s for %s handed to the homeserver (%s)", what, question.event_id, delay_id)
            await self.store.run_written(self._kept_delay, question.event_id, what, dict(delays), closing, epoch)
        recipients = self._recipients(question.room_id) if planned else None
        if recipients is not None:
            await self.store.run_written(self._keyed, question.event_id, recipients, None)
        return True

    async def _planned(self, question: RecordedQuestion, poll_id: str | None, epoch: int,
                       now: int) -> tuple[list[tuple[str, str, dict[str, Any], int]], str]:
        """What a scheduling hands to the homeserver ((what, type, content, when) each), and the closing line."""
        planned: list[tuple[str, str, dict[str, Any], int]] = []
        closing = ""
        if question.expires_ms is not None and question.expires_ms > now:
            if poll_id:
                planned.append(("poll_end", POLL_END, deadline_poll_end(poll_id, question.expires_ms), question.expires_ms))
            # The closing edit says what stands (nothing yet); restated as votes come (``_restate``).
            closing = await self.store.run(self._closing, question)
            planned.append(("edit", "m.room.message", closed_replacement(question.event_id, question.content, closing,
                                                                         question.expires_ms), question.expires_ms))
        if question.escalation is not None and question.escalation[0] > now and \
                (question.expires_ms is None or question.escalation[0] < question.expires_ms) and \
                not (epoch and await self.store.run(self.store.get_meta, ESCALATED + question.event_id)):
            # (One due at or after the deadline would call people in to a closed question.)
            planned.append(("escalate", "m.room.message", escalation_content(question), question.escalation[0]))
        return planned, closing

    async def _hand_owed(self, question: RecordedQuestion) -> None:
        """What a failed handing over left owed, handed over again once its wait is out."""
        raw = self.store.get_meta(OWED + question.event_id)
        send_delayed = getattr(self.transport, "send_delayed", None)
        if raw is None or send_delayed is None or self._now() < self._refused_until.get(question.event_id, 0):
            return
        owed = json.loads(raw)
        self._handing.add(question.event_id)
        try:
            if await self._schedule(question, owed.get("poll"), send_delayed, owed.get("epoch", 0)):
                with self.store.transaction(flush=False):
                    self.store.delete_meta(OWED + question.event_id)
        finally:
            self._handing.discard(question.event_id)

    async def _reclaim_owed(self, question: RecordedQuestion, wait: bool = True) -> None:
        """The question closes (decided, withdrawn, replaced) with a handing
        over owed: the homeserver may have taken it without a word (a timeout,
        a 502 from a proxy in front of it), and what it scheduled, its delay
        ids never learnt, would go out at its time over the closed question
        (the deadline's "expired undecided: no votes" over a decision).  The
        same requests again, with the same transaction ids, learn the ids (a
        homeserver answers a retried transaction with what it did the first
        time), and the cancel that follows takes them with the rest; one it
        never took is scheduled now and cancelled just as well.  What falls
        due within a second is left: too late to cancel either way.
        ``wait``: not before a refusal's wait is out."""
        raw = self.store.get_meta(OWED + question.event_id)
        send_delayed = getattr(self.transport, "send_delayed", None)
        if raw is None or send_delayed is None \
                or (wait and self._now() < self._refused_until.get(question.event_id, 0)):
            return
        owed = json.loads(raw)
        epoch = owed.get("epoch", 0)
        now = self._now()
        planned, _closing = await self._planned(question, owed.get("poll"), epoch, now)
        delays = self._delays(question.event_id)
        self._handing.add(question.event_id)
        try:
            for what, event_type, content, at in planned:
                if what in delays or at - now <= 1000:
                    continue
                try:
                    delay_id = await send_delayed(question.room_id, event_type, content,
                                                  txn_id("delayed", what, question.event_id, *_epoch(epoch)),
                                                  at - self._now())
                except Exception as exc:  # noqa: BLE001 - the pass tries again in a while
                    log.warning("delayed %s owed for %s, closed now, not looked up (%s); tried again in a while",
                                what, question.event_id, exc)
                    self._refused_until[question.event_id] = self._now() + RESTATE_AGAIN_MS
                    return
                if delay_id is None:
                    break  # no delayed events here: nothing was scheduled
                delays[what] = delay_id
                with self.store.transaction(flush=False):
                    self.store.set_meta(DELAYS + question.event_id, json.dumps(delays))
            with self.store.transaction(flush=False):
                self.store.delete_meta(OWED + question.event_id)
        finally:
            self._handing.discard(question.event_id)

    def _kept_delay(self, event_id: str, what: str, delays: dict[str, str], closing: str, epoch: int = 0) -> None:
        self.store.set_meta(DELAYS + event_id, json.dumps(delays))
        if what == "edit":
            self.store.set_meta(CLOSING + event_id, json.dumps({"words": closing, "gen": 0, "epoch": epoch}))
        if what == "escalate":
            self.store.set_meta(ESCALATED + event_id, "delayed")

    def _keyed(self, event_id: str, recipients: frozenset[tuple[str, str]], gen: int | None) -> None:
        """Who can read the posting's delayed events: those the room key in use went to."""
        if gen is None:
            raw = self.store.get_meta(KEYED + event_id)
            gen = json.loads(raw)["gen"] if raw else 0
        self.store.set_meta(KEYED + event_id, json.dumps({"to": sorted(recipients), "gen": gen}))

    def _recipients(self, room_id: str) -> frozenset[tuple[str, str]] | None:
        recipients = getattr(self.transport, "key_recipients", None)
        return recipients(room_id) if recipients is not None else None

    async def _rekey(self, question: RecordedQuestion, record: dict[str, Any] | None) -> None:
        """Someone came (or a device changed) since the posting's delayed
        events were encrypted: the room key changed, and the newcomer could
        never read the homeserver's poll end or closing edit (their client
        showed the question open for good).  Each is handed over again under
        the key in use now (MSC4140 has no update: a new one, then the old
        one cancelled); the new transaction ids are written down first, so a
        crash in between sends the same requests again."""
        now = self._recipients(question.room_id)
        delays = self._delays(question.event_id)
        if now is None or not delays:
            return
        if not now:
            # No room key in use (none after a restart, or a member came or
            # went): one is shared now, as the next send would, so who can
            # read is known; handing everything over again at every start
            # ran into the homeserver's limit on cancelling delayed events.
            share = getattr(self.transport, "share_room_key", None)
            if share is not None:
                await share(question.room_id)
            now = self._recipients(question.room_id)
            if not now:
                return
        raw = self.store.get_meta(KEYED + question.event_id)
        if raw is None:  # scheduled before who could read it was noted: taken as those who can now
            with self.store.transaction(flush=False):
                self._keyed(question.event_id, now, 0)
            return
        keyed = json.loads(raw)
        if now <= {tuple(device) for device in keyed["to"]} and not keyed.get("next"):
            return
        left = (question.expires_ms or 0) - self._now()
        gen = keyed.get("next") or keyed["gen"] + 1
        with self.store.transaction(flush=False):
            self.store.set_meta(KEYED + question.event_id, json.dumps({**keyed, "next": gen}))
        said = json.loads(self.store.get_meta(CLOSING + question.event_id) or "{}")
        epoch = said.get("epoch", 0)
        poll = self.store.poll_of(question.event_id)
        again = {"poll_end": (POLL_END, deadline_poll_end(poll, question.expires_ms), question.expires_ms)
                 if poll and question.expires_ms else None,
                 "escalate": ("m.room.message", escalation_content(question), question.escalation[0])
                 if question.escalation else None}
        for what, planned in again.items():
            if what not in delays or planned is None or planned[2] - self._now() <= 1000:
                continue
            event_type, content, at = planned
            self._handing.add(question.event_id)
            try:
                delay_id = await self.transport.send_delayed(question.room_id, event_type, content,
                                                             txn_id("delayed", what, question.event_id,
                                                                    *_epoch(epoch), f"key{gen}"), at - self._now())
            finally:
                self._handing.discard(question.event_id)
            delays = self._delays(question.event_id)
            # (The same id back: this generation's was handed over and noted
            # before a stop; the homeserver knew its transaction again.)
            if delay_id is not None and delay_id != delays.get(what):
                delays[f"{what}@key{gen}"], delays[what] = delays[what], delay_id
                with self.store.transaction(flush=False):
                    self.store.set_meta(DELAYS + question.event_id, json.dumps(delays))
        if "edit" in delays and said and left > 1000:
            with self.store.transaction(flush=False):  # said again, under the new key
                self.store.set_meta(CLOSING + question.event_id,
                                    json.dumps({**said, "next": said.get("next") or said["gen"] + 1}))
            await self._restate(question, record)
        with self.store.transaction(flush=False):
            self._keyed(question.event_id, self._recipients(question.room_id) or frozenset(), gen)
        stale = [what for what in self._delays(question.event_id) if "@" in what]
        if stale:  # the ones under the old key (a closing edit's were cancelled by ``_restate`` already)
            await self._cancel(question.event_id, keep=tuple(w for w in self._delays(question.event_id)
                                                            if w not in stale))
        log.info("delayed events of %s handed over again under the room's new key", question.event_id)

    def _closing(self, question: RecordedQuestion) -> str:
        """The closing line the question would get were its deadline now: what stands."""
        set_dir = self.store.set_dir_of(question.event_id)
        record = self.store.projection(set_dir, question.qid) if set_dir and question.qid else None
        return expiry_words(record, question.quorum[0] if question.quorum else None, question.expires_ms or 0,
                            display_names(question))[1]

    async def _restate(self, question: RecordedQuestion, record: dict[str, Any] | None) -> None:
        """The standing changed (a vote counted, changed or withdrawn): the
        homeserver's delayed closing edit is replaced by one that says so.

        MSC4140 has no update: a new one is scheduled for the time left, then
        the old one cancelled.  Each has its own generation's transaction id,
        written down before it is sent, so a crash after the homeserver took
        it sends the same request again and gets the same delay id back; the
        old one, once superseded, is kept as ``edit@<gen>`` until its cancel
        went through (and at the latest is cancelled with the rest when the
        question closes).  A crash between the two leaves both scheduled,
        never neither."""
        send_delayed = getattr(self.transport, "send_delayed", None)
        delays = self._delays(question.event_id)
        if send_delayed is None or question.expires_ms is None or "edit" not in delays:
            return
        closing = expiry_words(record, question.quorum[0] if question.quorum else None, question.expires_ms,
                               display_names(question))[1]
        raw = self.store.get_meta(CLOSING + question.event_id)
        said = json.loads(raw) if raw else {"words": None, "gen": 0}
        if said["words"] != closing or said.get("next"):
            left = question.expires_ms - self._now()
            if left <= 1000:
                return  # too late to restate: the bridge's own closing at the deadline says what stood
            if self._now() < self._refused_until.get(question.event_id, 0):
                return
            gen = said.get("next") or said["gen"] + 1
            if not said.get("next"):
                with self.store.transaction(flush=False):
                    self.store.set_meta(CLOSING + question.event_id, json.dumps({**said, "next": gen}))
            content = closed_replacement(question.event_id, question.content, closing, question.expires_ms)
            self._handing.add(question.event_id)
            try:
                delay_id = await send_delayed(question.room_id, "m.room.message", content,
                                              txn_id("delayed", "edit", question.event_id,
                                                     *_epoch(said.get("epoch", 0)), str(gen)), left)
            finally:
                self._handing.discard(question.event_id)
            if delay_id is None:
                # Refused (it could not be encrypted, say): the old edit stays
                # scheduled saying the old words, so the mark stays too.  It
                # is tried again in a while; at the deadline the bridge sends
                # its own edit after the homeserver's, which it then replaces.
                self._refused_until[question.event_id] = self._now() + RESTATE_AGAIN_MS
                (log.debug if said.get("next") else log.warning)(
                    "delayed closing edit of %s not restated; the bridge says it itself at the deadline unless a "
                    "later try goes through: %s", question.event_id, closing)
                return
            self._refused_until.pop(question.event_id, None)
            with self.store.transaction(flush=False):
                delays[f"edit@{said['gen']}"] = delays["edit"]
                delays["edit"] = delay_id
                self.store.set_meta(DELAYS + question.event_id, json.dumps(delays))
                self.store.set_meta(CLOSING + question.event_id, json.dumps({"words": closing, "gen": gen,
                                                                             "epoch": said.get("epoch", 0)}))
            log.info("delayed closing edit of %s restated (%s): %s", question.event_id, delay_id, closing)
        stale = tuple(what for what in self._delays(question.event_id) if "@" in what)
        if stale:
            await self._cancel(question.event_id, keep=tuple(w for w in self._delays(question.event_id)
                                                            if w not in stale))

    def _delays(self, event_id: str) -> dict[str, str]:
        raw = self.store.get_meta(DELAYS + event_id)
        return json.loads(raw) if raw else {}

    async def _cancel(self, event_id: str, keep: tuple[str, ...] = (),
                      then: Callable[[set[str]], None] | None = None) -> set[str]:
        """The posting's delayed events cancelled (but ``keep``); which of them
        were gone already: the homeserver sent them.  ``then``: called with
        those in the transaction that forgets them (what is owed for it is
        kept with the forgetting, through a crash)."""
        delays = self._delays(event_id)
        cancel = getattr(self.transport, "cancel_delayed", None)
        left = dict(delays)
        sent: set[str] = set()
        for what, delay_id in delays.items():
            if what in keep or cancel is None:
                continue
            try:
                if await cancel(delay_id) is False:
                    sent.add(what)
            except Exception as exc:  # noqa: BLE001 - tried again on the next pass
                log.warning("cancelling delayed %s of %s failed (%s)", what, event_id, exc)
                continue
            left.pop(what)
        with self.store.transaction(flush=False):
            if left:
                self.store.set_meta(DELAYS + event_id, json.dumps(left))
            else:
                self._no_delays_left(event_id)
            if "escalate" in delays and "escalate" not in left:
                # Cancelled before the homeserver sent it: nobody was called in
                # (a decision undone later still calls them at its time).
                if "escalate" in sent:
                    self.store.set_meta(ESCALATED + event_id, "sent")
                else:
                    self.store.delete_meta(ESCALATED + event_id)
            if then is not None:
                then(sent)
        return sent

    # -- the pass ------------------------------------------------------------

    def touch(self, event_id: str) -> None:
        """An answer to the posting ``event_id`` was logged (any thread: the
        pipeline's batch calls it in its store transaction)."""
        loop = self._loop
        if loop is None:
            return  # not running yet: the first pass looks at every posting
        with self._touched_lock:
            self._touched.add(event_id)
        loop.call_soon_threadsafe(self._woken.set)

    async def _look_at_touched(self) -> None:
        self._woken.clear()
        with self._touched_lock:
            touched, self._touched = self._touched, set()
        try:
            tracked = await self.store.run(lambda: [e for e in sorted(touched)
                                                    if self.store.get_meta(TRACKED + e) is not None])
        except Exception as exc:  # noqa: BLE001 - the next tick's pass looks at every posting
            log.warning("the postings just answered not looked at yet (%s); the next pass does", exc)
            return
        await self._each(tracked)

    def tracked(self) -> list[str]:
        """The postings the approvals pass looks at, in one order on both backends."""
        return [key[len(TRACKED):] for key, _value in self.store.meta_with_prefix(TRACKED)]

    async def pass_once(self) -> None:
        # Every second, answers flowing or not: a job on the store's thread, not a wait on the event loop.
        await self._each(await self.store.run(self.tracked))

    async def _each(self, event_ids: list[str]) -> None:
        for event_id in event_ids:
            try:
                await self._one(event_id)
            except Exception as exc:  # noqa: BLE001 - one question's trouble never stops the others
                log.warning("approval of %s not handled yet (%s); trying again", event_id, exc)

    async def _one(self, event_id: str) -> None:
        question = self.store.question_by_event(event_id)
        set_dir = self.store.set_dir_of(event_id)
        if question is None or set_dir is None or question.qid is None:
            with self.store.transaction(flush=False):
                self.store.delete_meta(TRACKED + event_id)
            return
        now = self._now()
        if question.open:
            # (Another revision's record stands while nothing stands on this
            # one: its decision or votes are none of this posting's.)
            record = of_revision(self.store.projection(set_dir, question.qid), question)
            if question.quorum is not None and record is not None and record.get("decided_by"):
                self._close(question, set_dir, CLOSED_DECIDED, record)
            elif question.expires_ms is not None and now >= question.expires_ms:
                self._close(question, set_dir, CLOSED_EXPIRED, record)
            elif self._escalation_due(question, now):
                await self._escalate(question)
                return
            else:
                # (Its first scheduling under way in the poster's task: looked
                # at once that is done, not beside it, whose writes would
                # undo what this pass hands over.)
                if question.event_id not in self._handing:
                    await self._hand_owed(question)
                    await self._rekey(question, record)
                    await self._restate(question, record)
                return
            self.flush()
            question = self.store.question_by_event(event_id) or question
        if question.expires_ms is not None and now >= question.expires_ms and question.closed_why == CLOSED_DECIDED \
                and not self.store.is_expired(event_id):
            # Decided, as far as the room was read; should an earlier event read
            # later undo that decision, the deadline still stands.
            with self.store.transaction():
                self.store.mark_expired(event_id, question.expires_ms)
                self.store.mark_dirty((set_dir, question.set_id, question.qid))
            self.flush()
        if not question.open and question.closed_why in (CLOSED_DECIDED, CLOSED_EXPIRED):
            # Closed as decided or expired, then an earlier event read late (a
            # vote from before the deadline, a redaction from before the
            # decision, an answer given in time) made it another outcome: the
            # room is told what it is now.
            record = self._record_of(question, set_dir)
            due = self._due(question, record)
            told = self._told(event_id)
            if due is not None and due == told.get("said"):
                # The same outcome, what stood changed: the room hears it again.
                # The agent heard each vote as it came; a decision that is
                # another one now (a veto read late) is a new question.decided.
                with self.store.transaction(flush=False):
                    self.store.set_meta(UNTOLD + event_id, question.closed_why or CLOSED_EXPIRED)
                    if due == CLOSED_DECIDED and told.get("decision") != _decision(record) \
                            and self.on_decided is not None:
                        self.on_decided(question, record or {}, told.get("n", 0))
            elif due == UNDONE:
                with self.store.transaction(flush=False):
                    self.store.set_meta(UNTOLD + event_id, UNDONE)
            elif due is not None:
                self._close(question, set_dir, CLOSED_DECIDED if due == CLOSED_DECIDED else CLOSED_EXPIRED, record)
                self.flush()
                question = self.store.question_by_event(event_id) or question
        elif not question.open and self._decided_unsaid(question, set_dir):
            # Decided by a vote the room placed before it was closed otherwise
            # (replaced by a new revision, say) and read just before that close:
            # the decision stands for this posting, and is announced.
            with self.store.transaction():
                self.store.set_meta(UNTOLD + event_id, CLOSED_DECIDED)
                if self.on_decided is not None:
                    self.on_decided(question, self._record_of(question, set_dir) or {}, 0)
        why = self.store.get_meta(UNTOLD + event_id)
        if why is not None:
            await self._tell(question, set_dir, why)
        elif question.closed_why not in (CLOSED_DECIDED, CLOSED_EXPIRED):
            # Closed otherwise (withdrawn, replaced): nothing more is due.
            await self._reclaim_owed(question)
            await self._cancel(event_id, then=lambda sent: self._edited_over(event_id, sent))
            if self.store.get_meta(CLOSE_AGAIN + event_id) is not None:
                await self._close_again(question)
        elif (self._delays(event_id) or self.store.get_meta(OWED + event_id) is not None) \
                and not self._reopened(question):
            # Told, and what the telling cancelled is still scheduled: its
            # cancel failed (a 429), or a handing over still owed was not
            # looked up yet.  Left, the deadline's "expired undecided" edit
            # overwrote the decision in the room.  Tried again each pass; one
            # the homeserver sent meanwhile is answered by telling again.
            await self._reclaim_owed(question)
            if "edit" in await self._cancel(event_id):
                with self.store.transaction(flush=False):
                    self.store.set_meta(UNTOLD + event_id, question.closed_why)
                await self._tell(question, set_dir, question.closed_why)
        if self._reopened(question):
            if question.event_id not in self._handing:
                # What the undo handed over again, refused (a 429, a 5xx): handed over again in a while.
                await self._hand_owed(question)
            if self._escalation_due(question, now):
                # Open to votes again: the escalation dropped with the decision still comes.
                await self._escalate(question)
            else:  # its closing edit, handed to the homeserver again at the undo, says what stands now
                await self._restate(question, self._record_of(question, set_dir))
        with self.store.transaction(flush=False):
            # Looked at again in the transaction that stops the watch: a vote
            # read while the room was being told (the flush then marks the
            # question to watch) is not forgotten with it.
            question = self.store.question_by_event(event_id) or question
            watching_deadline = question.closed_why == CLOSED_DECIDED and question.expires_ms is not None \
                and not self.store.is_expired(event_id) and self._latest(question, set_dir)
            watching_escalation = self._reopened(question) and question.escalation is not None \
                and self.store.get_meta(ESCALATED + event_id) is None
            if self.store.get_meta(UNTOLD + event_id) is None and not self._delays(event_id) \
                    and (question.open or self.store.get_meta(OWED + event_id) is None) \
                    and not watching_deadline and not watching_escalation \
                    and (question.open or question.qid is None
                         or self._due(question, self._record_of(question, set_dir)) is None):
                self.store.delete_meta(TRACKED + event_id)
                self.store.delete_meta(CLOSING + event_id)
                self.store.delete_meta(KEYED + event_id)
                self.store.delete_meta(OWED + event_id)
                self.store.delete_meta(CLOSE_AGAIN + event_id)

    def _edited_over(self, event_id: str, sent: set[str]) -> None:
        """In the transaction that forgets them: a closing edit of the
        homeserver's that went out before its cancel (the deadline came within
        a tick of the close) stands over the poster's "withdrawn" or
        "replaced", so that is said again."""
        if any(what == "edit" or what.startswith("edit@") for what in sent):
            self.store.set_meta(CLOSE_AGAIN + event_id, "1")

    async def _close_again(self, question: RecordedQuestion) -> None:
        """The poster's closing edit (its words, as of its close), sent again
        to stand over the homeserver's stale "expired undecided" one."""
        closed_at = self.store.closed_at(question.event_id)
        edit = closed_replacement(question.event_id, question.content, question.closed_why or "closed", closed_at)
        await self.transport.send(question.room_id, "m.room.message", edit,
                                  txn_id("close-edit", question.event_id, "again"))
        with self.store.transaction(flush=False):
            self.store.delete_meta(CLOSE_AGAIN + question.event_id)
        log.info("closing edit of %s said again: the homeserver's deadline edit went out after it",
                 question.event_id)

    def _escalation_due(self, question: RecordedQuestion, now: int) -> bool:
        return question.escalation is not None and now >= question.escalation[0] \
            and (question.expires_ms is None or now < question.expires_ms) \
            and self.store.get_meta(ESCALATED + question.event_id) is None

    async def _escalate(self, question: RecordedQuestion) -> None:
        await self.transport.send(question.room_id, "m.room.message", escalation_content(question),
                                  txn_id("escalate", question.event_id))
        with self.store.transaction(flush=False):
            self.store.set_meta(ESCALATED + question.event_id, "sent")

    def _reopened(self, question: RecordedQuestion) -> bool:
        """Closed as decided, and the room since told the decision is undone
        (no deadline passed): open to votes again."""
        return not question.open and question.closed_why == CLOSED_DECIDED \
            and self._told(question.event_id).get("said") == UNDONE and not self.store.is_expired(question.event_id)

    def _due(self, question: RecordedQuestion, record: dict[str, Any] | None) -> str | None:
        """The outcome (``told_outcome``) the room must hear now, when it heard
        another; None when what it heard (or is about to hear) stands."""
        now = told_outcome(record)
        if question.open or question.closed_why not in (CLOSED_DECIDED, CLOSED_EXPIRED):
            return None  # (closed otherwise, its record may be a later posting's)
        if now in (CLOSED_DECIDED, CLOSED_EXPIRED) and now != question.closed_why:
            return now
        if self.store.get_meta(UNTOLD + question.event_id) is not None:
            return None  # being told: the words are made from the record as it is then
        told = self._told(question.event_id)
        if now is None:
            # Heard "decided", and the decision is gone (its deciding vote taken
            # back before it, read late): the room hears it is undecided again.
            pending = record is not None and record.get("state") == PENDING
            return UNDONE if pending and told.get("said") == CLOSED_DECIDED else None
        if "said" not in told:
            return None  # told before the bridge kept what it said: taken to stand
        if now != told["said"]:
            return now
        # The same outcome, but what stood changed (a vote taken back before
        # the deadline, read after it; a veto read late): the room hears that too.
        words = outcome_words(question, record, question.closed_why or CLOSED_EXPIRED)[0]
        return now if "words" in told and words != told["words"] else None

    def _decided_unsaid(self, question: RecordedQuestion, set_dir: str) -> bool:
        """A posting closed otherwise whose own quorum decided it, not announced yet."""
        if question.quorum is None or question.closed_why in (CLOSED_DECIDED, CLOSED_EXPIRED) \
                or self._told(question.event_id) or self.store.get_meta(UNTOLD + question.event_id) is not None:
            return False
        record = self._record_of(question, set_dir)
        return told_outcome(of_revision(record, question)) == CLOSED_DECIDED

    def _latest(self, question: RecordedQuestion, set_dir: str) -> bool:
        latest = self.store.latest_posted(set_dir, question.qid or "")
        return latest is None or latest.event_id == question.event_id

    def _record_of(self, question: RecordedQuestion, set_dir: str) -> dict[str, Any] | None:
        """The posting's record: the question's, while it is the newest posting;
        a revision's posting after it was replaced is judged and told by the
        record kept as it closed (the question's is the new revision's then)."""
        if self._latest(question, set_dir):
            return self.store.projection(set_dir, question.qid or "")
        raw = self.store.get_meta(RECORD + question.event_id)
        return json.loads(raw) if raw else None

    def keep_record(self, replaced: RecordedQuestion, set_dir: str) -> None:
        keep_record(self.store, replaced, set_dir)

    def _told(self, event_id: str) -> dict[str, Any]:
        raw = self.store.get_meta(TOLD + event_id)
        return json.loads(raw) if raw else {}

    def _close(self, question: RecordedQuestion, set_dir: str, why: str, record: dict[str, Any] | None) -> None:
        with self.store.transaction():
            if why == CLOSED_EXPIRED:
                self.store.mark_expired(question.event_id, question.expires_ms or 0)
                self.store.mark_dirty((set_dir, question.set_id, question.qid))
            after = self.store.projection(set_dir, question.qid or "")
            # The deadline closes a question with no quorum that was answered
            # in time too; its answer stands, and it did not expire undecided.
            outcome = why if why == CLOSED_DECIDED or told_outcome(after) == CLOSED_EXPIRED else None
            self.store.close_question(question.event_id, why, outcome=outcome, record=after,
                                      at=question.expires_ms if why == CLOSED_EXPIRED else None)
            self.store.set_meta(UNTOLD + question.event_id, why)
            # A telling after the first is a new webhook (its own key), not the first one again.
            again = self._told(question.event_id).get("n", 0)
            if outcome == CLOSED_DECIDED and self.on_decided is not None:
                self.on_decided(question, after or record or {}, again)
            elif outcome == CLOSED_EXPIRED and self.on_expired is not None:
                self.on_expired(question, after, again)
            elif outcome is None and self.on_closed is not None:
                self.on_closed(question, "its deadline passed; the answer given before it stands")
        log.info("question %s: %s/%s rev %s", why, question.set_id, question.qid, question.rev)

    async def _tell(self, question: RecordedQuestion, set_dir: str, why: str) -> None:
        record = self._record_of(question, set_dir) or {}
        words, closing = outcome_words(question, record, why)
        delayed_poll_end = delayed_edit = False
        closed_at = self._now()
        if why == CLOSED_DECIDED:
            # Decided by a vote placed in time and read after the deadline: the
            # homeserver's poll end went out at it, too late to cancel.  A
            # second poll end from the bridge would only end it again.
            # (One still owed, maybe taken without a word, is looked up first, then cancelled with the rest.)
            await self._reclaim_owed(question, wait=False)
            delayed_poll_end = "poll_end" in await self._cancel(question.event_id)
        elif why == UNDONE:
            pass  # what was scheduled was cancelled at the decision; the poll stays ended
        else:
            closed_at = question.expires_ms or closed_at
            # The homeserver's own poll end (a delayed event) already closed it, or is about to.
            delays = self._delays(question.event_id)
            said = self.store.get_meta(CLOSING + question.event_id)
            # The homeserver's closing edit says just this (same words, same
            # time): a second, identical edit from the bridge would only flicker.
            delayed_edit = "edit" in delays and said is not None and json.loads(said).get("words") == closing \
                and not json.loads(said).get("next")
            # One that says otherwise (a vote too late to restate) is cancelled
            # before the bridge's own: fired after it, its stale words would stand.
            await self._cancel(question.event_id, keep=("poll_end", "edit") if delayed_edit else ("poll_end",))
            if "poll_end" in delays:
                self._forget_delay(question.event_id, "poll_end")
            if "edit" in delays:
                self._forget_delay(question.event_id, "edit")
            delayed_poll_end = "poll_end" in delays
        said = why if why in (CLOSED_DECIDED, UNDONE) else (told_outcome(record) or CLOSED_EXPIRED)
        told = self._told(question.event_id)
        # A telling after the first (the outcome changed since) is new to the
        # homeserver; a telling tried again after a crash is the same request.
        again = (str(told["n"]),) if told.get("n") else ()
        people = [v.get("sender", "") for v in record.get("votes") or []] + list(record.get("decided_by") or [])
        await self.transport.send(question.room_id, "m.room.message", {
            "msgtype": "m.notice", "body": words, "format": HTML_FORMAT, "formatted_body": esc_people(words, people),
            "m.mentions": {},  # the voters named are told, not pinged
            "m.relates_to": in_thread(question.event_id),
            NOTICE_KEY: {"question_event_id": question.event_id, "what": why, "record": _small(record)},
        }, txn_id("approval-notice", question.event_id, why, *again))
        if not delayed_edit:
            # Open again: the deadline and the escalation as they stand now, not as posted.
            edit = reopened_replacement(question.event_id, question.content, closing, closed_at) if why == UNDONE \
                else closed_replacement(question.event_id, question.content, closing, closed_at)
            await self.transport.send(question.room_id, "m.room.message", edit,
                                      txn_id("approval-edit", question.event_id, why, *again))
        poll = self.store.poll_of(question.event_id)
        # (A telling after the first: the poll was ended at the first, by the bridge or the homeserver.)
        if poll and not again and not delayed_poll_end:
            await self.transport.send(question.room_id, POLL_END, poll_end(poll, closing), txn_id("poll-end", poll))
        with self.store.transaction(flush=False):
            self.store.delete_meta(UNTOLD + question.event_id)
            self.store.set_meta(TOLD + question.event_id, json.dumps({"said": said, "words": words,
                                                                      "n": told.get("n", 0) + 1,
                                                                      "decision": _decision(record)}))
        send_delayed = getattr(self.transport, "send_delayed", None)
        if why == UNDONE and send_delayed is not None:
            # Open again: what the decision cancelled (the closing edit, the
            # escalation) is handed to the homeserver again, so the deadline
            # closes it on time with the bridge down (the poll stays ended).
            self._handing.add(question.event_id)
            try:
                await self._schedule(question, None, send_delayed, epoch=told.get("n", 0) + 1)
            finally:
                self._handing.discard(question.event_id)

    def _forget_delay(self, event_id: str, what: str) -> None:
        delays = self._delays(event_id)
        delays.pop(what, None)
        with self.store.transaction(flush=False):
            if delays:
                self.store.set_meta(DELAYS + event_id, json.dumps(delays))
            else:
                self._no_delays_left(event_id)

    def _no_delays_left(self, event_id: str) -> None:
        self.store.delete_meta(DELAYS + event_id)
        # Nothing left to restate: a refusal's hold on it goes too (kept, a
        # bridge running for months would hold one for every such question).
        self._refused_until.pop(event_id, None)

    # -- strays -------------------------------------------------------------

    async def sweep(self) -> int:
        """Cancel the bridge's delayed events the store no longer stands behind; how many.

        A delay id is known only once the homeserver's answer is written
        down; a crash in between is healed by sending the same transaction
        again, which gets the same id back only while the homeserver
        remembers the transaction (Synapse: about 30 minutes).  After a
        longer outage the retry schedules a second event and the first is
        nobody's: a closing edit that would overwrite the decided question,
        or an older generation's words.  So at start (and on taking over as
        leader: each is a start) the homeserver's list is read, and each of
        the bridge's poll ends, closing edits and escalations (told apart by
        what they relate to) whose question the store knows is cancelled
        unless its delay id is the one the store holds for it while it is
        open, or open to votes again (a decision undone: what the undo handed
        over again is held, though the store still says closed as decided).
        A question closed at its deadline is left alone: what is still
        scheduled for it is due now, and the bridge relies on the
        homeserver's poll end.  Encrypted ones can't be read: they are told
        by when they are due (``_sealed_candidates``).  An event for a
        question the store does not know is not this bridge's."""
        listing = getattr(self.transport, "list_delayed", None)
        cancel = getattr(self.transport, "cancel_delayed", None)
        if listing is None or cancel is None:
            return 0
        scheduled = await listing()
        cancelled = 0
        for event in scheduled or ():
            delay_id = event.get("delay_id")
            if not isinstance(delay_id, str):
                continue
            question = self._question_of(event)
            candidates = [question] if question is not None else self._sealed_candidates(event)
            if not candidates or not all(self._unheld(q, delay_id) for q in candidates):
                continue
            question = candidates[0]
            try:
                await cancel(delay_id)
            except Exception as exc:  # noqa: BLE001 - the next start tries again
                log.warning("stray delayed event %s of %s not cancelled (%s)", delay_id, question.event_id, exc)
                continue
            cancelled += 1
            log.info("stray delayed %s for %s (%s) cancelled: %s", event.get("type"), question.event_id, delay_id,
                     "the question is closed" if not self._live(question) else "the store holds another")
        return cancelled

    def _unheld(self, question: RecordedQuestion, delay_id: str) -> bool:
        """Whether ``delay_id``, if it is one of ``question``'s, is a stray to cancel."""
        if question.event_id in self._handing or question.closed_why == CLOSED_EXPIRED:
            return False  # being handed over; or due at the deadline, now: the homeserver's closing, relied on
        live = self._live(question)
        raw = self.store.get_meta(CLOSING + question.event_id)
        if live and raw and json.loads(raw).get("next"):
            return False  # a restated edit in flight: its retry comes first (the next pass)
        if live and self.store.get_meta(OWED + question.event_id) is not None:
            return False  # a handing over that failed (taken without a word, maybe): its retry comes first
        return not (live and delay_id in self._delays(question.event_id).values())

    def _live(self, question: RecordedQuestion) -> bool:
        """Whether the store stands behind the question's delayed events: open,
        or open to votes again (a decision undone: the store still says closed
        as decided, and what the undo handed over again is held)."""
        return question.open or self._reopened(question)

    def _sealed_candidates(self, event: dict[str, Any]) -> list[RecordedQuestion]:
        """An encrypted delayed event can't be read: the postings in its room
        with a deadline or an escalation due when it is (within 5 s; the
        bridge schedules nothing else) are what it may be.  It is a stray
        only when it is none of theirs that the store holds."""
        if event.get("type") != "m.room.encrypted" or not isinstance(event.get("room_id"), str):
            return []
        since, delay = event.get("running_since"), event.get("delay")
        if not isinstance(since, int) or not isinstance(delay, int):
            return []
        due = since + delay
        rows = self.store.db.execute("SELECT event_id FROM posted WHERE room_id=?", (event["room_id"],)).fetchall()
        found = []
        for (event_id,) in rows:
            question = self.store.question_by_event(event_id)
            if question is None or not wants_tracking(question):
                continue
            times = (question.expires_ms, question.escalation[0] if question.escalation else None)
            if any(t is not None and abs(due - t) <= 5000 for t in times):
                found.append(question)
        held = {d for q in found if self._live(q) for d in self._delays(q.event_id).values()}
        return [] if event.get("delay_id") in held else found

    def _question_of(self, event: dict[str, Any]) -> RecordedQuestion | None:
        """The posting a delayed event of the bridge's is about (a poll end, a
        closing edit, an escalation), or None (not one of those, or unknown)."""
        content = event.get("content")
        if not isinstance(content, dict):
            return None
        relates = content.get("m.relates_to") if isinstance(content.get("m.relates_to"), dict) else {}
        target = relates.get("event_id")
        if not isinstance(target, str):
            return None
        if event.get("type") == POLL_END:
            found = self.store.question_by_poll(target)
        elif event.get("type") == "m.room.message" and (relates.get("rel_type") == "m.replace"
                                                         or isinstance(content.get(NOTICE_KEY), dict)):
            found = self.store.question_by_event(target)
        else:
            return None
        return found if found is not None and found.room_id == event.get("room_id") else None

    async def run(self, stop: asyncio.Event, tick: float = DEFAULT_TICK_SECONDS,
                  after: asyncio.Event | None = None) -> None:
        """A pass at start (what expired while the bridge was down), the
        sweep of stray delayed events once, and a pass every ``tick`` until
        ``stop``.  ``after``: the first pass waits for it (appservice mode:
        the first look into the rooms' timelines)."""
        if after is not None:
            await any_set([after, stop], AFTER_AT_MOST)
        loop = asyncio.get_running_loop()
        self._loop = loop
        swept = False
        while not stop.is_set():
            try:
                await self.pass_once()
            except Exception as exc:  # noqa: BLE001 - tried again on the next tick
                log.warning("approvals pass failed (%s); trying again", exc)
            if not swept:
                try:
                    await self.sweep()
                    swept = True
                except Exception as exc:  # noqa: BLE001 - tried again on the next tick
                    log.warning("the homeserver's delayed events not read (%s); trying again", exc)
            next_pass = loop.time() + tick
            while not stop.is_set() and (left := next_pass - loop.time()) > 0:
                await any_set([stop, self._woken], left)
                if self._woken.is_set() and not stop.is_set():
                    await self._look_at_touched()
        # What the last second changed (a vote, so the homeserver's closing
        # edit must say it) is handed on before the bridge goes: the edit is
        # sent at the deadline by the homeserver, while the bridge may be down.
        last = asyncio.ensure_future(self.pass_once())
        done, _ = await asyncio.wait([last], timeout=FINAL_PASS_SECONDS)
        if not done:
            last.cancel()
        if not done or last.exception() is not None:  # the next start's first pass restates it
            log.warning("approvals' last pass before stopping not finished (%s)",
                        "out of time" if not done else last.exception())


# How long the first pass waits for ``after`` (a look the homeserver does not answer).
AFTER_AT_MOST = 30.0
# How long a stop waits for the last pass of approvals.
FINAL_PASS_SECONDS = 5.0


def outcome_words(question: RecordedQuestion, record: dict[str, Any], why: str) -> tuple[str, str]:
    """(the thread's notice, the closing line) for a question ``why`` closed, as ``record`` stands."""
    labels = display_names(question)
    if why == UNDONE:
        required = question.quorum[0] if question.quorum else 1
        stood = stood_words(Tally(PENDING, record.get("votes") or []), required, labels)
        return (f"The decision is undone: a vote it counted was taken back before it. Now {stood}; the question "
                "is open to votes again (reply to it to vote).", f"undecided again: {stood}")
    if why == CLOSED_DECIDED:
        tally = Tally(record.get("state"), record.get("votes") or [], record.get("choice"),
                      record.get("decided_by") or [],
                      veto=bool(question.quorum and record.get("choice") in question.quorum[1]))
        return decision_words(tally, labels), decision_line(tally, labels)
    return expiry_words(record, question.quorum[0] if question.quorum else None, question.expires_ms or 0, labels)


def _epoch(epoch: int) -> tuple[str, ...]:
    """The part of a delayed event's transaction id that tells a scheduling after an undo from the first."""
    return (f"again{epoch}",) if epoch else ()


def _decision(record: dict[str, Any] | None) -> list[Any] | None:
    """What an agent acts on in a decision: the option and who decided it."""
    if not record or not record.get("decided_by"):
        return None
    return [record.get("choice"), sorted(record["decided_by"])]


def _small(record: dict[str, Any]) -> dict[str, Any]:
    return {k: record[k] for k in ("state", "choice", "decided_by", "required") if k in record}
