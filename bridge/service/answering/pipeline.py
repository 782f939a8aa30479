"""One pipeline for both transports: a batch of room events in, durable
answers out.

The order of durability is the bridge's promise (PROTOCOL section 5):
1. judge every event and commit the outcomes to the store in one transaction
   (the answer log is the source of truth; touched questions are marked dirty);
2. project the dirty questions into each set's ``answers.json`` (one locked
   atomic write per set per batch);
3. only then let the transport advance (sync token / transaction 200);
4. tell people what happened (``notices``); notices not yet sent are retried.
A crash between 1 and 2 is healed by ``flush`` on the next start.

Faults stay where they belong: an event that can't be handled is set aside
(refused with a reason), a set whose folder can't be written is held back on
its own, and neither stops the batch, the other sets or the transport.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sqlite3
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from bridge.protocol import annotate
from bridge.protocol.authorship import edit_target
from bridge.protocol.fit import fit_id, timestamp, unfit
from bridge.protocol.judge import (CLOSED_DECIDED, Accepted, IncomingAnswer, JudgeContext, check_identity,
                                  closed_refusal, judge, poll_ended_refusal)
from bridge.protocol.normalize import (Annotation, Candidate, PollEnd, Unplaced, Unreadable, VoteWithdrawal,
                                      Withdrawal, is_empty_vote, normalize, poll_votes, posting_keys)
from bridge.protocol.withdrawn import unplaced_message
from bridge.protocol.recorded import RecordedQuestion
from bridge.protocol.to_record import to_record
from bridge.protocol.file_problems import file_problem as file_problem_words
from bridge.service.answering.attachments import DEFAULT_MAX_BYTES
from bridge.service.answering.downloads import Downloads
from bridge.answers.document import utc_of_ms
from bridge.service.answering.folderflush import FolderFlush
from bridge.service.answering.membership import MembersThen, is_power_levels, member_change, members_over_read
from bridge.service.answering.timeline import NOT_NOW, Timeline
from bridge.service.answering.wordback import WordBack
from bridge.service.encryption.marks import DEVICE
from bridge.service.storage.meta import ROOM_REFUSED_POLLS
from bridge.service.storage.store import FlushView, GuessedWrong, LogEntry, PartsFailedTogether, Store

log = logging.getLogger(__name__)


class Transport(Protocol):
    user_id: str

    async def send(self, room_id: str, event_type: str, content: dict[str, Any], txn_id: str) -> str: ...

    async def joined_members(self, room_id: str) -> set[str]: ...


def utc_now() -> str:
    """Now, to the millisecond, from one reading of the clock: seconds and
    milliseconds read apart straddle a second once in a while (a thread
    descheduled between them), and the time went back by one, so an agent
    waiting for an answer ``after`` the last one missed the next."""
    return utc_of_ms(int(time.time() * 1000))


class _StoreLookup:
    """The normaliser's view of the past, backed by the store."""

    def __init__(self, store: Store):
        self.store = store

    def question_by_event(self, event_id: str) -> RecordedQuestion | None:
        return self.store.question_by_event(event_id)

    def question_by_elicitation(self, elicitation_id: str) -> RecordedQuestion | None:
        return self.store.question_by_elicitation(elicitation_id)

    def question_by_poll(self, poll_event_id: str) -> RecordedQuestion | None:
        return self.store.question_by_poll(poll_event_id)

    def answer_reference(self, event_id: str) -> str | None:
        entry = self.store.accepted_answer(event_id)
        return entry.question_event_id if entry else None

    def logged_question(self, event_id: str) -> tuple[str, str] | None:
        return self.store.logged_question(event_id)

    def has_answered(self, question: RecordedQuestion, sender: str) -> bool:
        set_dir = self.store.set_dir_of(question.event_id)
        return bool(set_dir and question.qid and self.store.has_answered(set_dir, question.qid, question.event_id,
                                                                        sender))

    def attachment(self, event_id: str) -> tuple[str | None, str | None] | None:
        return self.store.attachment(event_id)

    def reply_target(self, event_id: str) -> tuple[str, str | None] | None:
        question = self.store.sent_question(event_id)
        return (question, None) if question else self.store.gesture_at(event_id)


@dataclass
class BatchResult:
    accepted: int = 0
    refused: int = 0
    withdrawn: int = 0
    skipped: int = 0
    written_sets: int = 0
    repeated: bool = False  # the delivery was taken before: nothing was handled


@dataclass
class Pipeline(FolderFlush):
    store: Store
    transport: Transport
    answerers: frozenset[str] | None
    own_users: Callable[[str], bool]
    # The time an answer is recorded (``updated``).  None: the store's clock,
    # which every instance of a cluster shares: agents wait for an answer
    # ``after`` the last one by it, and a new leader whose machine's clock ran
    # 2 minutes behind stamped the next answers before the last, missed by
    # every such wait.
    clock: Callable[[], str] | None = None
    members: dict[str, set[str]] = field(default_factory=dict)
    # Rooms the bridge was kicked or banned from, until it joins again: room
    # id -> who removed it, how and why (``/health``'s ``removed_from_rooms``).
    removed: dict[str, dict[str, Any]] = field(default_factory=dict)
    power: dict[str, dict[str, Any]] = field(default_factory=dict)  # room -> m.room.power_levels content
    on_outcome: Callable[[LogEntry], None] | None = None
    on_batch: Callable[[list[dict[str, Any]]], None] | None = None
    on_write: Callable[[float], None] | None = None
    is_command: Callable[[dict[str, Any]], bool] | None = None
    # (kind, reason) of each thing held back or set aside: event, set, notice, download.
    on_trouble: Callable[[str, str], None] | None = None
    # Runs inside the store transaction of each entry logged: what it writes commits with the entry.
    on_logged: Callable[[LogEntry], None] | None = None
    # Raises when this instance may no longer write (a standby took over the
    # shared store); called under each answers.json's lock, before the write.
    may_write: Callable[[], None] | None = None
    # Told the folder of each answers.json written (the agents' waits follow it).
    on_set_written: Callable[[str], None] | None = None
    # Told how each batch ended: None when it was made durable, else why not
    # (a store that refuses, a lock an operator holds): /health shows it.
    on_processed: Callable[[BaseException | None], None] | None = None
    # The largest file a person may send (``attachments.max_bytes``).
    attachment_max_bytes: int = DEFAULT_MAX_BYTES
    # Told when events were judged apart from the transport's batches (a file
    # that came late): the transport's notifier says what they did.
    on_judged_apart: Callable[[], None] | None = None

    def __post_init__(self) -> None:
        self.lookup = _StoreLookup(self.store)
        self.words = WordBack(self.store)
        self._first_flush = True
        self._had_answers: set[str] = set()  # set folders seen with their answers.json (``FolderFlush``)
        self._thread: tuple[str | None, str | None] = (None, None)  # the event being judged, its thread
        self._device: tuple[str | None, dict[str, Any] | None] = (None, None)  # ... and the device that sent it
        # While a batch is handled: the room state it began with (``_keep_before``).
        self._before: dict[tuple[str, str], Any] | None = None
        # What a batch's handling observed for the metrics (outcomes, trouble),
        # told once its transaction is kept: a batch handled again, or one that
        # failed, counts nothing twice.
        self._observed: list[Callable[[], None]] | None = None
        # Senders members when they sent an event, though no longer by the members read last.
        self.members_then = MembersThen(self.own_users)
        # room -> for each read of its members under way, the member and
        # power-level events judged meanwhile (``load_members``).
        self._reads: dict[str, list[list[dict[str, Any]]]] = {}
        self.timeline = Timeline(self.store, self.power)
        self.downloads = Downloads(self.store, getattr(self.transport, "download", None), self._may_answer,
                                   self.report_trouble, self.attachment_max_bytes, self._judge_later,
                                   flush=lambda: self.store.run(self.flush))

    async def load_members(self, room_id: str) -> None:
        """The room's joined members, and its power levels (who may redact
        others): asked for together, as the first batch waits for both."""
        levels = getattr(self.transport, "power_levels", None)
        reads = [self.transport.joined_members(room_id), *([levels(room_id)] if levels is not None else [])]
        # A batch judged while the read is out (a join's, a transaction's) may
        # change what the homeserver answered before it: its changes are
        # applied again over the read, on the store's thread, where batches
        # are judged, so none comes between.  (One of a batch that then fails
        # is applied early: the batch comes again with it.)
        arrived: list[dict[str, Any]] = []
        self._reads.setdefault(room_id, []).append(arrived)
        settled = False

        def settle(members: set[str], power: list[Any]) -> None:
            nonlocal settled
            settled = True
            self._stop_noting(room_id, arrived)
            self.members[room_id] = members_over_read(members, arrived)
            if power and not any(is_power_levels(e) for e in arrived):
                self.power[room_id] = power[0]

        try:
            members, *power = await asyncio.gather(*reads, return_exceptions=True)
            if isinstance(members, BaseException):
                raise members
            for found in power:
                if isinstance(found, Exception):  # without them, only a sender's own redaction counts
                    log.warning("power levels of %s not read (%s); only people's own redactions count there",
                                room_id, found)
                elif isinstance(found, BaseException):
                    raise found  # cancelled
            await self.store.run(settle, set(members), [p for p in power if not isinstance(p, BaseException)])
        finally:
            if not settled:
                self._stop_noting(room_id, arrived)

    def _stop_noting(self, room_id: str, arrived: list[dict[str, Any]]) -> None:
        reads = [kept for kept in self._reads.get(room_id, []) if kept is not arrived]  # (== holds for any two empty)
        if reads:
            self._reads[room_id] = reads
        else:
            self._reads.pop(room_id, None)

    async def prepare(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The I/O a batch needs before ``process``, and the events to judge
        now: senders the members read last no longer hold are asked after at
        their events (``membership``); files people sent into a question's
        thread are downloaded into the set folder (``process`` runs inside a
        store transaction and must not wait on the network); one still coming
        after a few seconds goes on apart, its event judged when it is in
        (``downloads.py``)."""
        if self.answerers is None:  # (with ``answerers`` configured, membership decides nothing)
            await self.members_then.ask_after(events, self.members, getattr(self.transport, "event_context", None))
        return await self.downloads.prefetch(events)

    async def _judge_later(self, events: list[dict[str, Any]]) -> None:
        await self.store.run(self.process, events)
        if self.on_judged_apart is not None:
            self.on_judged_apart()

    def _own(self, event: dict[str, Any]) -> bool:
        """The bridge's own event (or one with no sender): never judged."""
        sender = event.get("sender")
        return not isinstance(sender, str) or self.own_users(sender)

    def _may_answer(self, sender: str, room_id: str, event_id: str | None = None) -> bool:
        if self.own_users(sender):
            return False
        if self.answerers is not None:
            return sender in self.answerers
        return sender in self.members.get(room_id, ()) or event_id in self.members_then

    # -- the batch ---------------------------------------------------------

    def process(self, events: list[dict[str, Any]], *, commit: Callable[[], None] | None = None,
                delivery: str | None = None) -> BatchResult:
        """Steps 1-3.  ``commit`` runs in the final store transaction, after the
        folder writes: that is where a transport records its progress (in the
        batch's own, when the batch changed nothing: ``_handle``).  A
        ``delivery`` (an appservice transaction's key, which ``commit`` marks
        taken) taken before is not handled again: ``BatchResult.repeated``."""
        try:
            result = self._process(events, commit=commit, delivery=delivery)
        except BaseException as exc:
            if self.on_processed is not None:
                self.on_processed(exc)
            raise
        if self.on_processed is not None:
            self.on_processed(None)
        return result

    def _process(self, events: list[dict[str, Any]], *, commit: Callable[[], None] | None,
                 delivery: str | None) -> BatchResult:
        now = self.now()
        before = self.store.changes()
        self._before = {}
        try:
            try:
                try:
                    result, view, left = self._handle(events, now, delivery, commit, before)
                except GuessedWrong:
                    # What the batch took from the batch before instead of
                    # reading it (``guesses``) had changed on the server:
                    # nothing of it was kept; it is handled again, reading first.
                    log.info("a batch of %d events took for granted what had changed; handling it again, read",
                             len(events))
                    self._restore_before()
                    result, view, left = self._handle(events, now, delivery, commit, before, again=True)
            except PartsFailedTogether as exc:
                # Rare: an event's part failed (a write, sent with other
                # events' in one round trip, or its handling), and the parts
                # had no savepoints between them.  Nothing of the batch was
                # kept; it is handled again from the room state it began with,
                # each part apart, so the failure is set aside with its event.
                log.warning("a part of a batch of %d events failed (%s); handling it again event by event",
                            len(events), exc)
                self._restore_before()
                result, view, left = self._handle(events, now, delivery, commit, before, apart=True, again=True)
            observed = self._observed or []
        finally:
            self._before = None
            self._observed = None
        for observe in observed:
            observe()
        if result.repeated:
            return result
        # A commit the batch's own transaction took was taken because it was idle.
        idle = left is not commit or self.store.changes() == before
        result.written_sets = self.flush(commit=left, idle=idle, view=view)
        return result

    def _handle(self, events: list[dict[str, Any]], now: str, delivery: str | None,
                commit: Callable[[], None] | None, before: int, *, apart: bool = False,
                again: bool = False) -> tuple[BatchResult, FlushView | None, Callable[[], None] | None]:
        """The batch judged in one store transaction; what the flush starts
        from is read last in it, with its COMMIT.  ``apart``: each event's
        part ends in a round trip of its own (``Store.savepoint``).  ``again``:
        the batch is handled a second time, its look-ups read, not guessed.
        Returns the ``commit`` left for the flush: None when it ran here."""
        result = BatchResult()
        self._observed = []
        # One fsync for the whole batch: this commit is made durable by the
        # flushed commit at the end of ``flush``, which always follows it
        # before the transport advances or a notice goes out (``process``
        # never awaits, so nothing runs in between).
        with self.store.transaction(flush=False):
            # The bridge's own events (appservice mode gets its acknowledgements
            # back) are never looked up by posting: their keys, new each time,
            # would make the batch read where it could take what it knows.
            judged = [event for event in events if not self._own(event)]
            elicitations, targets = posting_keys(judged)
            self.store.know_batch((event.get("event_id") for event in events), elicitations=elicitations,
                                  targets=targets, votes=poll_votes(judged), delivery=delivery, guess=not again)
            if delivery is not None and self.store.txn_seen(delivery):
                result.repeated = True
                return result, None, commit
            if self.on_batch and not again:  # (told once, when a batch is handled again)
                self.on_batch(events)
            for event in events:
                self._guarded(event, now, result, apart)
            self.downloads.doom_unrecorded(events)
            if commit is not None and self.store.unchanged_since(before):
                # Nothing of the batch to make durable (the bridge's own events
                # coming back, chatter): the transport's progress goes with
                # this COMMIT, not in a transaction of its own after the flush
                # (a round trip fewer on PostgreSQL).  Not waiting for the disk
                # either, as an idle flush's: losing it to a power cut only
                # means the same nothing is received again.
                commit()
                commit = None
            return result, self.store.flush_view(commit=True), commit  # the flush's reads, and the COMMIT with them

    def _polls_maybe_allowed(self, event: dict[str, Any]) -> None:
        """The room's power levels changed: a room that refused polls may
        take them now, and its next question tries one again (a refusal
        flags the room again)."""
        if is_power_levels(event):
            self.store.delete_meta(ROOM_REFUSED_POLLS + str(event.get("room_id")))

    def _keep_before(self, event: dict[str, Any]) -> None:
        """The room's members or power levels as the batch found them, before
        its first event that changes them (a batch handled again starts there)."""
        if self._before is None:
            return
        room, kind = str(event.get("room_id")), event.get("type")
        if kind == "m.room.member" and ("members", room) not in self._before:  # copied once a batch, not per event
            self._before[("members", room)] = set(self.members[room]) if room in self.members else None
        elif kind == "m.room.power_levels":
            self._before.setdefault(("power", room), self.power.get(room))

    def _restore_before(self) -> None:
        for (what, room), kept in (self._before or {}).items():
            if what == "poll_ends":
                self.timeline.poll_ends = kept
                continue
            table: dict[str, Any] = self.members if what == "members" else self.power
            if kept is None:
                table.pop(room, None)
            else:
                table[room] = kept
        self._before = {}

    def _one(self, event: dict[str, Any], now: str, result: BatchResult, unparked: bool = False) -> None:
        """``unparked``: an edit that waited for its original, which came now;
        redacted while it waited, it is judged, then withdrawn where the room
        placed the redaction (the bridge held what it said, and the time it
        stood counts: a veto it made had decided).  So is a vote on a quorum
        that waited for its keys; any other answer redacted before it could
        be read is dropped unjudged, as its end would be the same."""
        event_id = event.get("event_id")
        if not isinstance(event_id, str):
            result.skipped += 1
            return
        if not (fit_id(event_id) and fit_id(event.get("room_id")) and fit_id(event.get("sender"))):
            # Ids the store can't key by (a lone surrogate, 300 characters):
            # nothing can be kept or said about such an event, not even looked
            # up; skipping it is all that is left, and costs nothing when it
            # comes again.
            log.warning("event with ids the store can't keep skipped: %r", str(event_id)[:80])
            self.report_trouble("event", "unfit_ids")
            result.skipped += 1
            return
        if self.store.is_processed(event_id):
            result.skipped += 1
            return
        self._thread = (event_id, _thread_root(event))
        device = event.get(DEVICE)  # set by the encryption layer for a decrypted event
        self._device = (event_id, device if isinstance(device, dict) else None)
        self._keep_before(event)
        self._track_membership(event)
        self.timeline.track_power(event)
        self._note_for_reads(event)
        self._polls_maybe_allowed(event)
        self._upgraded(event)
        if self._own(event):
            return
        sender = event["sender"]
        if self.is_command is not None and self.is_command(event):
            self.store.mark_processed(event_id, "command")  # a management command, never an answer
            return
        # An empty vote stands even when its redaction came first: read before
        # its redaction it took the votes back for good, so it must here too,
        # or the record would hang on the order the two arrived in.
        redacted = not unparked and not is_empty_vote(event) \
            and self.timeline.redacted(event_id, sender, str(event.get("room_id")))
        if redacted and self._device[1] is None:
            self.timeline.drop_redacted(event_id)
            return
        target = edit_target(event)
        if target is not None:
            event = self.timeline.edit_of_author(event, event_id, sender, target)
            if event is None:
                return
        found = normalize(event, self.lookup)
        if found is None:
            return
        if redacted and not (isinstance(found, Candidate) and found.question is not None
                             and found.question.quorum is not None):
            self.timeline.drop_redacted(event_id)
            return
        if (isinstance(found, (Withdrawal, PollEnd)) and self._before is not None
                and ("poll_ends", "") not in self._before):
            # A batch handled again starts from the poll ends it began with.
            self._before[("poll_ends", "")] = self.timeline.snapshot()
        if isinstance(found, Withdrawal):
            self._redaction(found, event, result)
        elif isinstance(found, VoteWithdrawal):
            if self.timeline.poll_ended(found.question.event_id, _ts(event)) is not None:
                # After the poll's end its votes are final, as clients show them.
                self.store.mark_processed(found.event_id, "ignored")
                return
            # Only the votes before it in the room: a later vote that arrived first stands.
            self._withdrawn(self.timeline.clear_votes(found.question.event_id, found.sender, found.event_id,
                                                      found.room_id, _ts(event)),
                            found.event_id, found.room_id, found.sender, "poll", event, result,
                            question_event_id=found.question.event_id)
        elif isinstance(found, PollEnd):
            self.timeline.poll_end(found, self.transport.user_id)
        elif isinstance(found, Unplaced):
            self._unplaced(found, result)
        elif isinstance(found, Unreadable):
            self._log(self._refusal(found.answer, found.question, event, "schema", found.reason, found.message,
                                    found.replaces), result)
        elif isinstance(found, Annotation):
            self._annotate(found, now, result)
        else:
            self._judge(found, event, now, result)
        if redacted or (unparked and self.store.redactions_of(event_id)):
            self._redactions_kept(event_id, result)
        # Edits that came before this event (another path, a late original) are judged now.
        for parked in self.store.unpark_edits(event_id):
            self._one(parked, now, result, unparked=True)

    def _redactions_kept(self, target: str, result: BatchResult) -> None:
        """The redactions of a held event that came while it was held, applied
        now it is judged, each at its place in the room."""
        for redaction_id, room_id, by, ts in self.store.redactions_kept(target):
            self._redaction(Withdrawal(target, redaction_id, room_id, by),
                            {"event_id": redaction_id, "room_id": room_id, "sender": by, "origin_server_ts": ts},
                            result, held=True)

    def _redaction(self, found: Withdrawal, event: dict[str, Any], result: BatchResult, held: bool = False) -> None:
        touched = self.timeline.redaction(found, _ts(event), held=held)
        if touched is not NOT_NOW:
            self._withdrawn(touched, found.event_id, found.room_id, found.sender, "redaction", event, result,
                            target=found.target)

    def _guarded(self, event: dict[str, Any], now: str, result: BatchResult, apart: bool) -> None:
        """One event whose handling raises is set aside as refused, so it cannot
        block every later event forever (the transport would redeliver it).
        Only the store failing as a whole (disk I/O, locked, full) and the
        disk are transient: they fail the batch for a retry."""
        observed = self._observed if self._observed is not None else []
        before = len(observed)
        try:
            with self.store.savepoint(apart=apart):
                self._one(event, now, result)
        except (sqlite3.OperationalError, OSError):
            raise
        except Exception:  # noqa: BLE001 - whatever the cause, this event must not stop the stream
            del observed[before:]  # what the undone part observed never happened
            log.exception("event %s could not be processed; refused as internal_error", event.get("event_id"))
            try:
                with self.store.savepoint(apart=apart):
                    self._set_aside(event, result)
            except (sqlite3.OperationalError, OSError):
                raise
            except Exception:  # noqa: BLE001 - not even the refusal can be kept: skip it, said in the log
                log.exception("event %s could not be set aside either; skipped", event.get("event_id"))

    def _set_aside(self, event: dict[str, Any], result: BatchResult) -> None:
        event_id, room_id, sender = event.get("event_id"), event.get("room_id"), event.get("sender")
        if not fit_id(event_id):
            return
        self.report_trouble("event", "internal_error")
        if fit_id(room_id) and fit_id(sender):
            self.store.log(LogEntry(event_id, room_id, sender, "answer_event", "refused", layer="schema",
                                    reason="internal_error",
                                    message="the bridge could not process this message. "
                                            "Please try answering again.", ts=_ts(event)))
        self.store.mark_processed(event_id, "refused")
        result.refused += 1

    def report_trouble(self, kind: str, reason: str) -> None:
        """Count something held back or set aside (kind: event, set, notice, download)."""
        if self.on_trouble is not None:
            self._observe(self.on_trouble, kind, reason)

    def _observe(self, tell: Callable[..., None], *args: Any) -> None:
        """``tell(*args)`` now, or (inside a batch's handling) once the batch is kept."""
        if self._observed is None:
            tell(*args)
        else:
            self._observed.append(lambda: tell(*args))

    def _withdrawn(self, touched: tuple[str, str, str] | None, event_id: str, room_id: str, sender: str, via: str,
                   event: dict[str, Any], result: BatchResult, target: str | None = None,
                   question_event_id: str | None = None) -> None:
        if touched:
            set_dir, set_id, qid = touched
            # `replaces` names what was withdrawn, so the word back can go where its acknowledgement went.
            logged = self.store.logged_question(target) if target else None
            entry = self._with_device(self._in_its_thread(LogEntry(
                event_id, room_id, sender, via, "withdrawn", set_id=set_id, set_dir=set_dir, qid=qid, ts=_ts(event),
                replaces=target, question_event_id=logged[0] if logged else question_event_id)))
            self._past_the_deadline(entry)
            self.store.log(entry)
            if self.on_logged:
                self.on_logged(entry)
            result.withdrawn += 1
        self.store.mark_processed(event_id, "withdrawn")

    def _past_the_deadline(self, entry: LogEntry) -> None:
        """A withdrawal the room placed at or after its question's deadline:
        the room's order says the deadline passed, so the posting is expired
        before its record is made again, as the deadlines pass would say (at
        a start it runs after the backlog: the word back and the agent heard
        of an open question that had lost its vote)."""
        question = self.store.question_by_event(entry.question_event_id) if entry.question_event_id else None
        if question is None or question.expires_ms is None or entry.ts < question.expires_ms \
                or not (question.open or question.closed_why == CLOSED_DECIDED) \
                or self.store.is_expired(question.event_id):
            return
        if self.store.clock.now_ms() < question.expires_ms:
            return  # a sender's clock ahead (its homeserver stamps the time) expires nothing early
        latest = self.store.latest_posted(entry.set_dir or "", entry.qid or "")
        if latest is None or latest.event_id == question.event_id:
            self.store.mark_expired(question.event_id, question.expires_ms)

    def _unplaced(self, found: Unplaced, result: BatchResult) -> None:
        """A reply to the bridge that is about no question it knows: a short
        help instead of silence.  Replies between people are left alone."""
        if self.transport.user_id in found.mentions and self._may_answer(found.sender, found.room_id, found.event_id):
            self._log(LogEntry(found.event_id, found.room_id, found.sender, "reply", "refused", layer="recorded",
                               reason="unplaced_reply", message=unplaced_message(found.about), ts=found.ts), result)

    def _context(self, room_id: str, event_id: str, sender: str) -> JudgeContext:
        """What an event from ``sender`` is judged against: the room's members
        as the timeline has them at it (``membership``)."""
        members = self.members.get(room_id, set())
        if event_id in self.members_then and sender not in members:
            members = members | {sender}
        return JudgeContext(allowed=self.answerers, members=frozenset(members), bridge_user=self.transport.user_id)

    def _common(self, answer: IncomingAnswer, question: RecordedQuestion | None, ts: int,
                replaces: str | None = None) -> dict[str, Any]:
        return dict(event_id=answer.event_id, room_id=answer.room_id, sender=answer.sender, via=answer.via,
                    set_id=question.set_id if question else None,
                    set_dir=self.store.set_dir_of(question.event_id) if question else None,
                    qid=question.qid if question else None,
                    question_event_id=question.event_id if question else None, ts=ts, replaces=replaces)

    def _refusal(self, answer: IncomingAnswer, question: RecordedQuestion | None, event: dict[str, Any], layer: str,
                 reason: str, message: str, replaces: str | None = None) -> LogEntry:
        return LogEntry(outcome="refused", layer=layer, reason=reason, message=message,
                        **self._common(answer, question, _ts(event), replaces))

    def _log(self, entry: LogEntry, result: BatchResult) -> None:
        problem = unfit(entry.record) if entry.record is not None else None
        if problem is not None:
            # Refused where it enters: kept, it would fail every write of the set after it.
            self.report_trouble("event", "unstorable")
            entry = dataclasses.replace(entry, outcome="refused", record=None, layer="recorded", reason="unstorable",
                                        message=f"the answer holds {problem}, which can't be recorded.")
        current, root = self._thread
        if root is not None and entry.event_id == current:
            entry = dataclasses.replace(entry, thread_root=root)
        entry = self._with_device(self._in_its_thread(entry))
        if entry.outcome == "refused":
            result.refused += 1
        else:
            result.accepted += 1
        # The one line per answer operators.md promises (the metrics count them; the log says which).
        log.info("%s %s from %s to %s/%s%s", entry.outcome, entry.event_id, entry.sender, entry.set_id or "-",
                 entry.qid or "-", f" ({entry.reason})" if entry.reason else "")
        self.store.log(entry)
        if self.on_logged:
            self.on_logged(entry)
        self.store.mark_processed(entry.event_id, entry.outcome)
        if self.on_outcome:
            self._observe(self.on_outcome, entry)

    def _in_its_thread(self, entry: LogEntry) -> LogEntry:
        """An edit or a withdrawal of a message sent in a thread belongs to
        that thread: the edit event (or the redaction) carries no thread of its
        own, and its word back shown in the main timeline left the thread."""
        if entry.replaces is None or entry.thread_root is not None:
            return entry
        root = self.store.thread_of(entry.replaces)
        return dataclasses.replace(entry, thread_root=root) if root is not None else entry

    def _with_device(self, entry: LogEntry) -> LogEntry:
        """The entry with the device that sent the event being judged (encrypted rooms)."""
        current, device = self._device
        if device is not None and entry.event_id == current:
            return dataclasses.replace(entry, device=device)
        return entry

    def _judge(self, found: Candidate, event: dict[str, Any], now: str, result: BatchResult) -> None:
        answer, question = found.answer, found.question
        verdict = judge(question, answer, self._context(answer.room_id, answer.event_id, answer.sender))
        if isinstance(verdict, Accepted) and answer.via == "poll" and question is not None:
            ended = self.timeline.poll_ended(question.event_id, answer.origin_server_ts)
            if ended is not None:
                verdict = poll_ended_refusal(*ended)
        common = self._common(answer, question, _ts(event), found.replaces)
        set_dir = common["set_dir"]
        if isinstance(verdict, Accepted) and question is not None and set_dir:
            source = {"via": "matrix", "how": answer.via, "room_id": answer.room_id, "event_id": answer.event_id,
                      "sender": answer.sender, "ts": _ts(event)}
            # The pick's own fields only: notes, files and timecodes people add
            # are folded in when the record is projected, so a withdrawn one
            # is gone from it whatever came after.
            record = to_record(question, verdict, prior=None, source=source, now=now)
            # The record's rev is what answers.json will say: every answer ever
            # accepted counts, the one an edit replaced included.
            record["rev"] = self.store.accepted_count(set_dir, common["qid"]) + 1
            choice = record.get("choice")
            takes_input = isinstance(choice, str) and question.option_input(choice) is not None
            entry = LogEntry(outcome="accepted", record=record, carry_note=None if takes_input else record.get("note"),
                             **common)
        else:
            entry = LogEntry(outcome="refused", layer=verdict.layer, reason=verdict.reason, message=verdict.message,
                             **common)
        self._log(entry, result)
        if entry.outcome == "accepted" and found.replaces:
            # The edit stands in for what it edits while it is the latest version in the room.
            self.store.reshadow(found.replaces)
        cleared = self.timeline.vote_cleared(question.event_id, answer.sender, entry.ts) \
            if entry.outcome == "accepted" and answer.via == "poll" and question is not None else None
        if cleared is not None and self.store.withdraw(entry.event_id) is not None:
            # A late vote the person had already taken back: withdrawn as it is
            # logged, and the withdrawal is an outcome of its own in the answer
            # log (the empty vote that took it back, about this vote), as it is
            # when the empty vote comes after the vote.  No answer-log row is
            # its own (as for a close), so the vote's receipt stays its acceptance.
            by, at = cleared
            self.store.append_leaf(dataclasses.replace(entry, event_id=by, ts=at, replaces=entry.event_id,
                                                       record=None), None, outcome="withdrawn")

    def _annotate(self, found: Annotation, now: str, result: BatchResult) -> None:
        """A note, a file or timecodes for the answer: checked like an answer
        (same question, room, sender, still open), then kept as a delta."""
        question = found.question
        answer = IncomingAnswer(found.event_id, found.room_id, found.sender, found.ts, via=found.via, content={
            "m.relates_to": {"event_id": question.event_id}, "elicitation_id": question.elicitation_id})
        common = self._common(answer, question, found.ts, found.replaces)
        refusal = check_identity(question, answer, self._context(found.room_id, found.event_id, found.sender))
        if refusal is not None and refusal.reason == "question_closed":
            # A note or a file is no answer: told as what it is.
            sent = "file" if found.attachments or found.via == "attachment" else "note"
            refusal = closed_refusal(question, f"your {sent} was not kept")
        problem = (refusal.layer, refusal.reason, refusal.message) if refusal else \
            self._annotation_problem(found, common["set_dir"], common["qid"])
        if problem is not None:
            layer, reason, message = problem
            self._log(LogEntry(outcome="refused", layer=layer, reason=reason, message=message, **common), result)
            return
        # A file that could not be kept does not cost the note that came with it.
        file_problem = found.problem if isinstance(found.problem, str) else None
        if file_problem:
            common.update(reason=file_problem, message=file_problem_words(file_problem, found.filename,
                                                                        self.attachment_max_bytes))
        source = {"via": "matrix", "how": found.via, "room_id": found.room_id, "event_id": found.event_id,
                  "sender": found.sender, "ts": found.ts}
        added = annotate.delta(note=found.note, attachments=list(found.attachments), timecodes=list(found.timecodes),
                               q_rev=question.rev or 1, source=source, now=now)
        self._log(LogEntry(outcome="annotated", record=added, **common), result)
        if found.replaces:
            self.store.reshadow(found.replaces)

    def _annotation_problem(self, found: Annotation, set_dir: str | None, qid: str | None) -> tuple[str, str, str] | None:
        if isinstance(found.problem, str) and not (found.note or found.timecodes):
            return "recorded", found.problem, file_problem_words(found.problem, found.filename,
                                                                 self.attachment_max_bytes)
        if not (found.note or found.attachments or found.timecodes):
            return "schema", "empty_note", "There was nothing in this message to keep."
        record = self.store.projection(set_dir, qid) if set_dir and qid else None
        room = annotate.room_left(record)
        owner = annotate.sender_of(record) if record is not None else None
        owned = self.store.additions_by(set_dir, qid, owner) if found.note and owner and set_dir and qid else 0
        if found.note and annotate.note_room_needed(found.note, found.sender, owner, owned) > room["note"]:
            return "recorded", "note_too_long", "Your notes on this question would pass 20,000 characters."
        if len(found.attachments) > room["attachments"]:
            return "recorded", "too_many_attachments", file_problem_words("too_many_attachments", found.filename)
        if len(found.timecodes) > room["timecodes"]:
            return "recorded", "too_many_timecodes", "An answer holds at most 50 timecodes."
        return None

    def _upgraded(self, event: dict[str, Any]) -> None:
        """A room upgraded (``m.room.tombstone``): the bridge stays where its
        config says, and people there may no longer be able to answer (an
        upgrade takes their power to send away), so the operator is told."""
        if event.get("type") != "m.room.tombstone" or event.get("state_key") != "":
            return
        content = event.get("content") if isinstance(event.get("content"), dict) else {}
        log.warning("room %s was upgraded to %s by %s; the bridge stays in %s, where people may no longer be able "
                    "to answer and the bridge itself, unless its power level there is 50 or more, can no longer "
                    "post (word back on answers, reminders, the answer log's checkpoints): name the new room (or "
                    "an alias of it) in rooms.default or rooms.sets and restart (questions posted already stay in "
                    "the old room)", event.get("room_id"),
                    content.get("replacement_room"), event.get("sender"), event.get("room_id"))
        self.report_trouble("room", "upgraded")

    def _note_for_reads(self, event: dict[str, Any]) -> None:
        """A member or power-level event, for the reads of its room's members under way (``load_members``)."""
        reads = self._reads.get(str(event.get("room_id")))
        if reads and (member_change(event) is not None or is_power_levels(event)):
            for arrived in reads:
                arrived.append(event)

    def _track_membership(self, event: dict[str, Any]) -> None:
        if (change := member_change(event)) is None:
            return
        room_id = str(event.get("room_id"))
        content = event.get("content") if isinstance(event.get("content"), dict) else {}
        user, joined = change
        room = self.members.setdefault(room_id, set())
        (room.add if joined else room.discard)(user)
        if self.own_users(user):
            self._own_membership(room_id, event, content)

    def _own_membership(self, room_id: str, event: dict[str, Any], content: dict[str, Any]) -> None:
        """The bridge kicked or banned (it reads nothing more there, and
        nobody hears from it): said once, counted and shown in /health until
        it joins again."""
        membership = content.get("membership")
        if membership == "join":
            # Back (its own join: a state event, read though it sent it).
            self.removed.pop(room_id, None)
            return
        sender = event.get("sender")
        if membership not in ("leave", "ban") or not isinstance(sender, str) or room_id in self.removed:
            return
        if self.own_users(sender):
            # The bridge never leaves a room it joined: a leave in its own name
            # from a joined room is the homeserver's (a room shut down or
            # deleted by its admin).  One from an invite is its own decline.
            unsigned = event.get("unsigned") if isinstance(event.get("unsigned"), dict) else {}
            before = unsigned.get("prev_content") if isinstance(unsigned.get("prev_content"), dict) else {}
            if membership != "leave" or before.get("membership") != "join":
                return
        reason = content.get("reason") if isinstance(content.get("reason"), str) else None
        self.removed[room_id] = {"by": sender, "membership": membership, **({"reason": reason[:200]} if reason else {})}
        log.warning("the bridge was %s from room %s by %s%s: it reads and answers nothing there now; its open "
                    "questions there wait. Invite it back (it joins again by itself)%s", "banned" if membership ==
                    "ban" else "removed", room_id,
                    "its homeserver (the room shut down or deleted)" if self.own_users(sender) else sender,
                    f" ({reason[:200]})" if reason else "",
                    ", once unbanned" if membership == "ban" else "")
        self.report_trouble("room", "removed")

    # -- telling people ----------------------------------------------------

    def notice_for(self, entry: LogEntry, replaced: int = 0) -> dict[str, Any]:
        """The word back on ``entry`` (``WordBack.notice_for``)."""
        return self.words.notice_for(entry, replaced)


def _thread_root(event: dict[str, Any]) -> str | None:
    content = event.get("content")
    relates = content.get("m.relates_to") if isinstance(content, dict) else None
    if isinstance(relates, dict) and relates.get("rel_type") == "m.thread" and fit_id(relates.get("event_id")):
        return relates["event_id"]
    return None


def _ts(event: dict[str, Any]) -> int:
    return timestamp(event.get("origin_server_ts"))
