"""Keeping the rooms in step with the sets: every open question posted once
per revision, older revisions marked replaced, closed questions announced.

A post is sent with a transaction id derived from what is posted, so a crash
between the send and the store's commit re-sends the same transaction and the
homeserver hands back the same event instead of posting twice; what was sent
is kept first, so the next start records it before it reads an answer
(``insend``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from bridge.protocol.judge import KEEPS_TAKING
from bridge.protocol.outcome import shown_title, txn_id
from bridge.protocol.render import REASON_SHOWN, shown_words
from bridge.protocol.poll import POLL_END, POLL_START, poll_end, poll_start
from bridge.protocol.question_event import (CONTENT_MAX_BYTES, ENCRYPTED_CONTENT_MAX_BYTES, QuestionEventTooLarge,
                                            build_question_event, closed_replacement, new_elicitation_id,
                                            option_order, poll_refused_replacement)
from bridge.protocol.recorded import RecordedQuestion
from bridge.questionset.lint.posted import rev_went_back
from bridge.questionset.model import Question, QuestionSet
from bridge.service.posting import media
from bridge.service.posting.insend import UNTOLD, PollSending, Sending, keep, record_poll, record_sent
from bridge.service.posting.sets import QUESTIONS, SKIPPED, discover, duplicate_set_message, folders, leads_outside
from bridge.regularfile import read_regular
from bridge.service.storage.meta import ROOM_REFUSED_POLLS
from bridge.service.storage.setpaths import NOT_POSTED, REV_FIRST_POSTED, SET_SYNCED
from bridge.service.storage.store import PostingConflict, Store

log = logging.getLogger(__name__)

LoadSet = Callable[[Path], tuple[QuestionSet | None, list[str]]]

# Sets posted side by side: one agent's set of thousands of questions (a
# quarter of an hour of sends) held every other set, and every other agent's,
# until its last question was out.
SETS_AT_ONCE = 4


@dataclass
class PostReport:
    posted: list[str] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)
    broken: dict[str, list[str]] = field(default_factory=dict)
    failed: list[Path] = field(default_factory=list)  # could not be posted now (a room refused, the network)
    # Set folder -> its questions its room can't take (too large for an
    # encrypted room's events), skipped while the set's others are posted.
    refused: dict[str, list[str]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def question_digest(qset: QuestionSet, question: Question) -> str:
    material = {"set": [qset.id, qset.title, qset.mode], "q": question.model_dump(mode="json", exclude_none=True)}
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


class Poster:
    # Every store call of the poster is a job on the store's thread
    # (``store.run``, ``store.run_written``): with the database 40 ms away,
    # posting a set held the event loop (/health, every agent) a second at a
    # time, and with the network to it cut, 18 s.

    def __init__(self, store: Store, transport: Any, room_for: Callable[[str], str], load_set: LoadSet,
                 on_posted: Callable[[RecordedQuestion], None] | None = None,
                 on_closed: Callable[[RecordedQuestion, str], None] | None = None):
        self.store = store
        self.transport = transport
        self.room_for = room_for
        self.load_set = load_set
        self.on_posted = on_posted
        # Runs inside the store transaction that closes a question (with why).
        self.on_closed = on_closed
        # Deadlines, decisions, escalations (bridge.service.answering.deadlines.Deadlines), when wired.
        self.deadlines: Any = None
        # The first posting, the folder watcher and the agents' door run side
        # by side: a folder (and a set id, which two folders may both claim)
        # is taken by one of them at a time, so no question is posted twice.
        self._locks: dict[str, asyncio.Lock] = {}
        self._told_stays: set[tuple[str, str, str]] = set()  # (set id, room posted in, room mapped to) logged
        self._not_posted_now: dict[str, str] | None = None  # folder -> why (``NOT_POSTED``), read once
        self._told_refused: set[tuple[str, str, int, str]] = set()  # (folder, qid, rev, digest) logged
        self._root: Path | None = None  # the sets root last passed over (``_root_away``)
        # The sets root whose vanished folders are held (``_root_away``), as
        # named in ``NOT_POSTED`` (resolved when the hold began: said once).
        self._root_held: Path | None = None
        # Set id -> the folders refused because another folder has it: taken
        # again once that folder goes (nothing of theirs changed to wake them).
        self._refused_for_id: dict[str, set[Path]] = {}

    async def sync_root(self, root: Path, stop: asyncio.Event | None = None) -> PostReport:
        """Every set under ``root``; a stop is honoured between sets, so a
        SIGTERM in a long first posting does not wait for the last set."""
        await self.tell_moved()
        return await self.sync_dirs(discover(root), stop, root=root)

    async def sync_dirs(self, set_dirs: Iterable[Path], stop: asyncio.Event | None = None,
                        root: Path | None = None) -> PostReport:
        """Each set on its own: one that can't be posted now (its room refuses
        the bridge, the homeserver fails) is reported in ``failed`` and the
        others are posted.  ``root``: the sets root they are under (else the
        one last given)."""
        report = PostReport()
        set_dirs = list(set_dirs)
        if root is not None:
            self._root = root
        try:
            freed = await self.close_vanished(report, self._root)
        except Exception as exc:  # noqa: BLE001 - said again at the next pass; the sets go on
            log.warning("closing the questions of a removed set failed (%s); trying again later", exc)
            if self._root is not None:
                report.failed.append(self._root)  # a pass over the root tells the room what it was not told
        else:
            set_dirs.extend(folder for set_id in freed for folder in self._refused_for_id.pop(set_id, ())
                            if folder not in set_dirs)
        turns = asyncio.Semaphore(SETS_AT_ONCE)

        async def one(set_dir: Path) -> None:
            async with turns:
                if stop is not None and stop.is_set():
                    return
                try:
                    await self.sync_if_changed(set_dir, report)
                except Exception as exc:  # noqa: BLE001 - tried again later; the other sets go on
                    log.warning("set %s not posted yet (%s); the other sets go on", set_dir, exc)
                    report.failed.append(set_dir)
                    await self._not_posted(set_dir, " ".join(f"{type(exc).__name__}: {exc}".split())[:300])
                else:
                    # A question its room refuses is named as the set's not
                    # posted, the others being posted (or forgotten once none is).
                    refused = report.refused.get(str(set_dir))
                    await self._not_posted(set_dir, None if not refused else " ".join(
                        f"{'; '.join(refused)}; the set's other questions are posted".split())[:600])

        await asyncio.gather(*(one(set_dir) for set_dir in set_dirs))
        return report

    async def _not_posted(self, set_dir: Path, why: str | None) -> None:
        """Keep why the set could not be posted (``status`` and /health say
        it), or forget it once the set is posted; a write only when it changes."""
        folder = str(set_dir.resolve())
        async with self._lock("not posted"):  # (sets are posted side by side: one reading, one write at a time)
            if self._not_posted_now is None:
                self._not_posted_now = {key[len(NOT_POSTED):]: value for key, value in
                                        await self.store.run(self.store.meta_with_prefix, NOT_POSTED)}
            if self._not_posted_now.get(folder) == why:
                return
            if why is None:
                del self._not_posted_now[folder]
                await self.store.run_written(self.store.delete_meta, NOT_POSTED + folder, flush=False)
            else:
                self._not_posted_now[folder] = why
                await self.store.run_written(self.store.set_meta, NOT_POSTED + folder, why, flush=False)

    def _lock(self, key: str) -> asyncio.Lock:
        return self._locks.setdefault(key, asyncio.Lock())

    async def sync_changed(self, root: Path, paths: Iterable[str | Path]) -> PostReport:
        """Only the sets whose questions.json is among ``paths`` (what the folder
        watcher saw change): an edit of one set costs one set, however many
        sets the root holds.  A set folder that went away is noticed here too."""
        return await self.sync_dirs(dict.fromkeys(changed_sets(root, paths)), root=root)

    async def close_vanished(self, report: PostReport, root: Path | None = None) -> set[str]:
        """A set folder that is gone takes its open questions with it: they are
        closed in the room ("this set was removed") and answers to them are
        refused with that reason.  Should the folder come back, its questions
        are posted again, as new postings.  A folder that is still there but
        can't be read is not gone: its questions stay open.  Nor is one gone
        with the sets root itself (``_root_away``): nothing is closed then,
        and the root is looked at again.  Returns the set ids the folders
        gone had (another folder may take them now)."""
        freed: set[str] = set()
        with_open = await self.store.run(self.store.folders_with_open)
        gone = [folder for folder in with_open if not os.path.lexists(folder)]
        held = await asyncio.to_thread(_root_away, root, gone) if gone and root is not None else None
        if held is not None:
            if self._root_held is None:
                log.warning("%s", held)
                self._root_held = root.resolve()
            report.failed.append(root)  # looked at again (with backoff)
            await self._not_posted(self._root_held, held)
            return freed
        if self._root_held is not None:
            log.info("sets root %s holds its sets again; a set folder still gone is closed as removed", root)
            await self._not_posted(self._root_held, None)
            self._root_held = None
        for folder in gone:
            async with self._lock(folder):
                if os.path.lexists(folder):
                    continue  # back meanwhile
                log.warning("set folder %s is gone; closing its open questions", folder)
                # Every one closed in the store at once, then the rooms told:
                # closed one by one, a large set's last questions took answers
                # (acknowledged, with nowhere to write them) until their turn.
                postings = await self.store.run(self.store.posted_for_set, folder)
                freed.update(recorded.set_id for recorded, _poll in postings)
                await self._not_posted(Path(folder), None)
                # If it comes back, it is read again in full: forgotten with
                # the closes, in their transaction (left to after the room was
                # told, a refused notice kept it, and the folder moved back
                # unchanged stayed closed for good).
                await self._close_all([recorded for recorded, _poll in postings if recorded.open], SET_REMOVED,
                                      report, forget=f"{SET_SYNCED}{folder}")
        await self._tell_untold_gone()
        return freed

    async def _tell_untold_gone(self) -> None:
        """Tell the rooms the closes they were not told of (a refused send,
        a crash) whose set folder is gone: no pass over the set tells them
        (``_sync_loaded`` does for a set that is there)."""
        def untold_gone() -> list[tuple[RecordedQuestion, str]]:
            owed = []
            for key, why in self.store.meta_with_prefix(UNTOLD):
                event_id = key[len(UNTOLD):]
                set_dir = self.store.set_dir_of(event_id)
                recorded = self.store.question_by_event(event_id)
                if recorded is not None and set_dir and not os.path.lexists(set_dir):
                    owed.append((recorded, why))
            return owed

        for recorded, why in await self.store.run(untold_gone):
            await self._tell_closed(recorded, why)

    async def sync_if_changed(self, set_dir: Path, report: PostReport) -> None:
        """``sync_set``, unless the set's questions.json is byte for byte the one
        last synced in full (remembered in the store, so a restart skips the
        unchanged sets too).  A set is only remembered once every question of
        it is posted, polled, closed as it should be; a broken set or a crash
        half-way leaves it to be synced again."""
        async with self._lock(str(set_dir.resolve())):
            hashed_as = _stat(set_dir)
            fingerprint = _fingerprint(set_dir)
            key = f"{SET_SYNCED}{set_dir.resolve()}"
            if fingerprint is not None and await self.store.run(self.store.get_meta, key) == fingerprint:
                return
            posted_as = await self._sync_set(set_dir, report)
            # The hash is remembered only for the file that was read and
            # posted: hashed before the reading turn (seconds, behind another
            # set's lint), the file may be replaced meanwhile; its newer
            # questions were posted under the older file's hash, and that
            # older file written back later was skipped as synced, leaving a
            # question added and removed in between open for good.  Not
            # remembered, the set is simply read again at its next change.
            # (A set with a question its room refused is read again at the
            # next pass over the root, its room perhaps able to take it then.)
            if posted_as is not None and posted_as == hashed_as and fingerprint is not None \
                    and str(set_dir) not in report.broken and str(set_dir) not in report.refused:
                await self.store.run_written(self.store.set_meta, key, fingerprint)

    async def sync_set(self, set_dir: Path, report: PostReport) -> None:
        async with self._lock(str(set_dir.resolve())):
            await self._sync_set(set_dir, report)

    async def _sync_set(self, set_dir: Path, report: PostReport) -> tuple[int, ...] | None:
        """The ``_stat`` of the questions.json read and taken in full (posted,
        or found broken); None when there is none to remember: the set changed
        while it was read or posted, and was left for the next pass to take as
        it is now (in ``report.failed``), or is going away."""
        # Sets are read one at a time, in the order asked, and each takes its
        # id's turn before the next is read: of two folders claiming one set
        # id, the first in order is the one that posts it (posted side by
        # side, whichever read faster took it).
        async with self._lock("reading"):
            read_as = _stat(set_dir)
            # Off the event loop: a set of tens of thousands of questions lints
            # for seconds, which held every room, /health and every agent.
            qset, errors = await asyncio.to_thread(self.load_set, set_dir)
            if qset is None and read_as is None and _stat(set_dir) is None:
                # Not a broken set: one going away (rm -r under way) as it was read.
                log.info("set %s is no longer there; its questions close with its folder", set_dir)
                return None
            if qset is None:
                report.broken[str(set_dir)] = errors
                log.error("set %s skipped: it fails lint:\n  %s", set_dir, "\n  ".join(errors))
                return read_as
            if _changed_since(set_dir, read_as, report):
                # Written as it was read: what was loaded may be the newer
                # file, so ``read_as`` can't stand for it (a set of no
                # questions meets no check in ``_sync_loaded``).
                return None
            turn = self._lock(f"set\x00{qset.id}")
            await turn.acquire()
        try:
            return read_as if await self._sync_loaded(set_dir, qset, read_as, report) else None
        finally:
            turn.release()

    async def _sync_loaded(self, set_dir: Path, qset: QuestionSet, read_as: tuple[int, ...] | None,
                           report: PostReport) -> bool:
        folder = str(set_dir.resolve())
        owner = self._owner_elsewhere(qset.id, folder, await self.store.run(self.store.folders_of_set, qset.id))
        if owner is not None:
            # Postings are a folder's: a second folder under the same id would
            # share the room and the one-pagers with the first.  The first keeps
            # it, untouched; this one waits until it has an id of its own.
            message = duplicate_set_message(qset.id, owner, folder)
            report.broken[str(set_dir)] = [message]
            self._refused_for_id.setdefault(qset.id, set()).add(set_dir)
            log.error("%s", message)
            return True
        room = self.room_for(qset.id)
        current = {q.id: q for q in qset.questions}
        for question in qset.questions:
            if _changed_since(set_dir, read_as, report):
                # Closed, revised or removed meanwhile (an agent's close of a set
                # of thousands came while it was posted, and every closed
                # question was posted anyway, then closed one by one).
                return False
            postings = await self.store.run(self.store.postings, folder, question.id)
            latest = postings[0] if postings else None
            if question.is_open:
                # A posting its quorum decided or its deadline closed is done: it is not posted again.
                done = latest is not None and not latest.open and latest.closed_why in KEEPS_TAKING
                if latest is None or latest.rev != question.rev or (not latest.open and not done):
                    if latest is not None and question.rev < latest.rev:
                        warning = f"{qset.id}/{question.id}: {rev_went_back(latest.rev, question.rev)}"
                        report.warnings.append(warning)
                        log.warning("%s", warning)
                    try:
                        await self._post(qset, question, set_dir, room, report, replacing=postings)
                    except QuestionEventTooLarge as exc:
                        # Fits a plain room's event, not an encrypted one's
                        # (lint, not knowing the room, only warns): refused
                        # there, and the set's other questions are posted.
                        # It held the whole set, tried again for ever.
                        self._refuse(qset, question, set_dir, str(exc), report)
                    continue
                if done:
                    continue
                self._tell_stays(qset.id, latest.room_id, room)
                # A crash between posting the question and its poll or media: finish the job.
                await self._ensure_poll(latest)
                if self.deadlines is not None and \
                        await self.store.run(self.store.get_meta, f"approval:{latest.event_id}") is None:
                    await self.deadlines.schedule(latest, await self.store.run(self.store.poll_of, latest.event_id))
                # In the room the question is in, wherever the set's room is now:
                # a thread message sent elsewhere was refused for ever.
                asked_in = latest.room_id
                await media.post_whole_question(question, str(latest.content.get("body", "")), latest.event_id,
                                                asked_in, self.store, self.transport)
                await media.post_one_pager(qset, question, set_dir, latest.event_id, asked_in, self.store,
                                           self.transport)
                if question.media and not await self.store.run(self.store.get_meta, f"media_posted:{latest.event_id}"):
                    prepared = await media.prepare(qset, question, set_dir, self.store, self.transport, room=asked_in)
                    await media.post_in_thread(prepared.messages, latest.event_id, asked_in, self.store,
                                               self.transport)
                for older in postings[1:]:
                    if older.open:  # only the newest posting of a question takes answers
                        await self._close(older, f"{REPLACED} {question.rev}", report)
            else:
                for posting in postings:
                    if posting.open:
                        await self._close(posting, _closing_words(question, qset), report)
        for recorded, _poll in await self.store.run(self.store.posted_for_set, folder):
            if recorded.open and recorded.qid not in current:
                await self._close(recorded, "removed from the set", report)
            elif not recorded.open:
                why = await self.store.run(self.store.get_meta, UNTOLD + recorded.event_id)
                if why is not None:
                    await self._tell_closed(recorded, why)  # closed by a run that stopped before saying so
        return True

    def _refuse(self, qset: QuestionSet, question: Question, set_dir: Path, why: str, report: PostReport) -> None:
        """A question its room can't take: in the report (``status`` and
        /health name it, ``_not_posted``), logged once per revision."""
        message = f"{qset.id}/{question.id} rev {question.rev} not posted: {why}"
        report.refused.setdefault(str(set_dir), []).append(message)
        told = (str(set_dir.resolve()), question.id, question.rev, question_digest(qset, question))
        if told not in self._told_refused:
            self._told_refused.add(told)
            log.error("%s; the set's other questions are posted", message)

    async def tell_moved(self) -> None:
        """``_tell_stays`` for every set with open questions (at a pass over the
        root: a set unchanged since its last sync is not read again)."""
        for set_id, posted_in in await self.store.run(self.store.open_set_rooms):
            self._tell_stays(set_id, posted_in, self.room_for(set_id))

    def _tell_stays(self, set_id: str, posted_in: str, room: str) -> None:
        """An open posting stays where it was asked (its answers are there) when
        the config now maps its set to another room: said once, so no one looks
        for the questions in the new room in vain.  (An alias not joined yet
        names no room to compare.)"""
        if room == posted_in or not room.startswith("!") or (set_id, posted_in, room) in self._told_stays:
            return
        self._told_stays.add((set_id, posted_in, room))
        log.warning("set %s is now mapped to room %s; its open questions stay in %s, where they were asked, "
                    "and move there only when they are revised (or are closed and opened again)",
                    set_id, room, posted_in)

    async def _takes_reactions(self, room: str) -> bool:
        """Whether the question may offer keycap reactions in ``room`` (not
        where they would be refused: ``takes_reactions``)."""
        takes = getattr(self.transport, "takes_reactions", None)
        return True if takes is None else await takes(room)

    @staticmethod
    def _owner_elsewhere(set_id: str, folder: str, folders: list[str]) -> str | None:
        """Another folder that posted under ``set_id`` first (``folders``, in
        the order they did) and still holds that set."""
        for other in folders:
            if other == folder:
                return None
            if _holds_set(Path(other), set_id):
                return other
        return None

    async def _post(self, qset: QuestionSet, question: Question, set_dir: Path, room: str, report: PostReport,
                    replacing: list[RecordedQuestion] = ()) -> None:
        """Post one question as a new posting.  The question event goes first
        (its id is the posting's); then, in one store transaction, the new
        posting is recorded and every open posting it replaces is closed,
        before anything else is sent: from that commit on only the new one
        takes answers, whatever happens to the poll, one-pager or files."""
        folder = str(set_dir.resolve())
        digest = question_digest(qset, question)
        # The posting's number among the question's postings: a posting of a
        # rev posted before (a rev that went back) still gets its own id.
        number = len(replacing)
        elicitation = new_elicitation_id(qset.id, question.id, question.rev,
                                         salt=f"{room}\x00{digest}\x00{folder}\x00{number}")
        prepared = await media.prepare(qset, question, set_dir, self.store, self.transport, room=room) \
            if question.media \
            else media.PreparedMedia()
        content = build_question_event(qset, question, elicitation_id=elicitation, media=prepared.uploads,
                                       order=option_order(question, seed=elicitation, mode=qset.mode),
                                       # Posted beside it when it gets one, unless its room refused one before.
                                       poll=not await self._refuses_polls(room),
                                       posted_ms=await self._first_posted(folder, question),
                                       reactions=await self._takes_reactions(room),
                                       max_bytes=ENCRYPTED_CONTENT_MAX_BYTES if await media.encrypted_room(
                                           self.transport, room) else CONTENT_MAX_BYTES)
        sending = Sending(txn=txn_id("post", qset.id, question.id, str(question.rev), digest, folder, str(number)),
                          room=room, set_id=qset.id, folder=folder, qid=question.id, content=content,
                          replacing=tuple(old.event_id for old in replacing if old.open),
                          why=f"{REPLACED} {question.rev}",
                          after=replacing[0].event_id if replacing else None)
        # Kept before the send (``insend``): a kill after it leaves the room
        # ahead of the store, and the next start records it before any answer.
        await self.store.run_written(keep, self.store, sending, flush=False)
        event_id = await self.transport.send(room, "m.room.message", content, sending.txn)
        keep_record = self.deadlines.keep_record if self.deadlines is not None else None
        try:
            # Flushed: the old posting's close must not be lost once the new one is out.
            recorded, replaced = await self.store.run_written(lambda: record_sent(
                self.store, sending, event_id, self.store.clock.now_ms(), keep_record=keep_record,
                on_closed=self.on_closed))
        except PostingConflict as exc:
            # The homeserver handed back an event the store already knows (a
            # transaction id reused), or the id is taken: nothing is recorded,
            # the set is left to the next pass, and the operator is told.
            await self.store.run_written(self.store.delete_meta, sending.key)
            report.broken[str(set_dir)] = [str(exc)]
            log.error("%s/%s not recorded: %s", qset.id, question.id, exc)
            return
        why = sending.why
        report.posted.append(f"{qset.id}/{question.id}@{question.rev}")
        log.info("question posted: %s/%s rev %d as %s in %s", qset.id, question.id, question.rev, event_id, room)
        for old in replaced:
            report.closed.append(f"{old.set_id}/{old.qid}@{old.rev}")
            log.info("question closed: %s/%s rev %s (%s)", old.set_id, old.qid, old.rev, why)
        await self._ensure_poll(recorded)
        if self.deadlines is not None:
            await self.deadlines.schedule(recorded, await self.store.run(self.store.poll_of, recorded.event_id))
        # The background first, the files after it: the thread's summary shows
        # its last message, and a picture or clip says more there.
        await media.post_whole_question(question, content["body"], event_id, room, self.store, self.transport)
        await media.post_one_pager(qset, question, set_dir, event_id, room, self.store, self.transport)
        await media.post_in_thread(prepared.messages, event_id, room, self.store, self.transport)
        for old in replaced:
            await self._tell_closed(old, why)
        if self.on_posted:  # (the owner of its set kept in the store)
            await self.store.run(self.on_posted, recorded)

    async def _first_posted(self, folder: str, question: Question) -> int:
        """When this revision was first posted: ``expires`` and ``escalate.after``
        durations count from it.  Kept in the store before the send, so a
        retried post (a crash before its commit) builds the same content, and
        a repost of the same revision keeps its deadline."""
        key = f"{REV_FIRST_POSTED}{folder}\x1f{question.id}\x1f{question.rev}"

        def kept_or_now() -> int:
            kept = self.store.get_meta(key)
            if kept is not None:
                return int(kept)
            now = self.store.clock.now_ms()  # deadlines are judged by whichever instance leads (dbclock)
            self.store.set_meta(key, str(now))
            return now

        return await self.store.run_written(kept_or_now)

    async def _ensure_poll(self, recorded: RecordedQuestion) -> None:
        """Post the question's poll once (the transaction id makes a retry the same event)."""
        if await self.store.run(self.store.poll_of, recorded.event_id) or \
                await self.store.run(self.store.get_meta, _NO_POLL + recorded.event_id) or \
                await self._refuses_polls(recorded.room_id):
            return
        content = poll_start(recorded)
        if content is None:
            return
        sending = PollSending(txn_id("poll", recorded.event_id), recorded.room_id, recorded.event_id, content)
        # Kept before the send, as a question is: votes cast before a kill count.
        await self.store.run_written(keep, self.store, sending, flush=False)
        try:
            poll_id = await self.transport.send(recorded.room_id, POLL_START, content, sending.txn)
        except Exception as exc:
            if not getattr(exc, "permanent", False):
                raise  # tried again with the set
            if await self._out_of(recorded.room_id):
                # Kicked between the question and its poll: the question waits
                # for the bridge to be back (invited, it rejoins), its poll too.
                raise
            # The room refuses polls (its power levels), not the question: the
            # question stands, answered by reply or reaction, and the set's
            # other questions are posted; retrying would never work.
            log.warning("poll for %s/%s not posted (%s); it is answered by reply or reaction there",
                        recorded.set_id, recorded.qid, exc)
            await self._drop_poll_step(recorded)
            status = str(getattr(exc, "status", ""))

            def no_poll() -> None:
                self.store.set_meta(_NO_POLL + recorded.event_id, status)
                if status == "M_FORBIDDEN":  # the room's power levels: its later questions too (one poll too large is not)
                    self.store.set_meta(ROOM_REFUSED_POLLS + recorded.room_id, status)
                self.store.delete_meta(sending.key)

            await self.store.run_written(no_poll, flush=False)
            return
        # As for the question: a lost record re-sends the same poll.
        await self.store.run_written(record_poll, self.store, sending, poll_id, flush=False)
        log.info("poll for %s/%s posted as %s", recorded.set_id, recorded.qid, poll_id)

    async def _refuses_polls(self, room_id: str) -> bool:
        """Whether ``room_id`` refused a poll for good before: its later
        questions say nothing of a poll and get none."""
        return await self.store.run(self.store.get_meta, ROOM_REFUSED_POLLS + room_id) is not None

    async def _drop_poll_step(self, recorded: RecordedQuestion) -> None:
        """The question said "vote in the poll" and no poll came: its message
        is edited not to send people to it.  The posting keeps its content as
        posted (the answer log hashes that, as anyone reading the event can),
        so the help after an unreadable reply to this one question may still
        name the poll; the room's later questions offer none.  Sent before
        the refusal is kept: a failure to send tries the poll, and this,
        again with the set."""
        edit = poll_refused_replacement(recorded.event_id, recorded.content)
        if edit is None:
            return
        try:
            await self.transport.send(recorded.room_id, "m.room.message", edit, txn_id("no-poll", recorded.event_id))
        except Exception as exc:
            if not getattr(exc, "permanent", False):
                raise
            # The message can't be edited either: the help words still follow what it shows.
            log.warning("question %s/%s not edited to drop its poll (%s)", recorded.set_id, recorded.qid, exc)
            return

    async def _out_of(self, room_id: str) -> bool:
        """Whether the bridge is surely not in ``room_id`` now (False when that can't be told)."""
        listed = getattr(self.transport, "joined_rooms", None)
        if listed is None:
            return False
        try:
            return room_id not in await listed()
        except Exception:  # noqa: BLE001 - not known: taken as in, as before
            return False

    async def _close(self, recorded: RecordedQuestion, why: str, report: PostReport) -> None:
        await self._close_all([recorded], why, report)

    async def _close_all(self, closing: list[RecordedQuestion], why: str, report: PostReport,
                         forget: str | None = None) -> None:
        """``forget``: a meta key deleted in the transaction that closes them."""
        # The store is updated first (one transaction): from this moment
        # answers are refused.  Telling the room is owed until it is done (a
        # crash or a refused send in between leaves the word pending, and the
        # next pass over the set says it, under the same transaction ids).
        def close() -> None:
            for recorded in closing:
                self.store.close_question(recorded.event_id, why)
                self.store.set_meta(UNTOLD + recorded.event_id, why)
                if self.on_closed:
                    self.on_closed(recorded, why)
            if forget is not None:
                self.store.delete_meta(forget)

        if not closing:
            if forget is not None:
                await self.store.run_written(self.store.delete_meta, forget, flush=False)
            return
        await self.store.run_written(close)
        for recorded in closing:
            report.closed.append(f"{recorded.set_id}/{recorded.qid}@{recorded.rev}")
            log.info("question closed: %s/%s rev %s (%s)", recorded.set_id, recorded.qid, recorded.rev, why)
        for recorded in closing:
            await self._tell_closed(recorded, why)

    async def _replacement(self, recorded: RecordedQuestion) -> RecordedQuestion | None:
        """The open posting that replaced ``recorded`` (a later revision), if any."""
        set_dir = await self.store.run(self.store.set_dir_of, recorded.event_id)
        newest = await self.store.run(self.store.latest_posted, set_dir, recorded.qid) \
            if set_dir and recorded.qid else None
        return newest if newest is not None and newest.open and newest.event_id != recorded.event_id \
            and (newest.rev or 0) > (recorded.rev or 0) else None

    async def _tell_closed(self, recorded: RecordedQuestion, why: str) -> None:
        title = shown_title(recorded.question.get("title", recorded.qid))
        # Every other why says the question's state ("withdrawn (...)", "replaced by revision 2").
        state = f"closed ({why})" if why == SET_REMOVED else why
        text = f"“{title}” is {state}; answers to this message are no longer accepted."
        if why.startswith(REPLACED):
            # Where to answer now: the revision's message, by its own title (the person sees that one).
            newer = await self._replacement(recorded)
            if newer is not None:
                text += f" Answer revision {newer.rev}, “{shown_title(newer.question.get('title', newer.qid))}”, instead."
        content = {
            "msgtype": "m.notice",
            "body": text,
            "m.mentions": {},  # tells the room; pings nobody the question named
            "m.relates_to": {"rel_type": "m.thread", "event_id": recorded.event_id, "is_falling_back": True,
                             "m.in_reply_to": {"event_id": recorded.event_id}},
            "dev.superpipeline.question.closed": {"question_event_id": recorded.event_id, "qid": recorded.qid,
                                                  "why": why},
        }
        sent_id = await self.transport.send(recorded.room_id, "m.room.message", content,
                                            txn_id("close", recorded.event_id))
        # The question's own message says so too: its "To answer" line becomes "Closed".
        closed_at = await self.store.run(self.store.clock.now_ms)
        await self.transport.send(recorded.room_id, "m.room.message",
                                  closed_replacement(recorded.event_id, recorded.content, why, closed_at),
                                  txn_id("close-edit", recorded.event_id))
        poll = await self.store.run(self.store.poll_of, recorded.event_id)
        if poll:
            # Votes after this are refused anyway (the question is closed); ending
            # the poll shows the person so before they vote.
            await self.transport.send(recorded.room_id, POLL_END, poll_end(poll, why), txn_id("poll-end", poll))
        def told() -> None:
            self.store.delete_meta(UNTOLD + recorded.event_id)
            if isinstance(sent_id, str):  # a reply to the close notice is refused as question_closed, not ignored
                self.store.record_sent(sent_id, recorded.room_id, question_event_id=recorded.event_id, kind="closed")

        # Not flushed: a lost mark only says the same again, with the same transaction ids.
        await self.store.run_written(told, flush=False)


# Meta key prefix: a question whose room refused its poll for good (value: the error code).
_NO_POLL = "poll_refused:"
SET_REMOVED = "this set was removed"
REPLACED = "replaced by revision"  # "... 2": why a posting a later revision replaced was closed


def _root_away(root: Path, gone: list[str]) -> str | None:
    """Why the set folders ``gone`` (the store's, with open questions) are
    not taken as removed, or None: the sets root they are under can't be
    read (not there: a share mounted above it dropped), or holds no set
    while more than one of them went at once (an empty mount point: the
    bridge started before its share was mounted, or the share dropped).
    Every open question of every set was closed as removed, and posted again
    as new once the share was back.  (A root whose only set is removed
    looks like an empty mount point: that set is closed, as before.)"""
    top = os.path.realpath(root)
    under = [folder for folder in gone if Path(folder).is_relative_to(top)]
    if not under:
        return None
    try:
        with os.scandir(root) as entries:
            next(entries, None)
    except OSError as exc:
        state = f"can't be read ({exc.strerror or exc})"
    else:
        if len(under) < 2 or any(QUESTIONS in files for _folder, files in folders(root)):
            return None
        state = "holds no set"
    return (f"sets root {root} {state} while the store has open questions in {len(under)} set folder(s) under it "
            f"({under[0]}{', ...' if len(under) > 1 else ''}); nothing is closed until it is looked at again "
            "(a share not mounted yet, or dropped?)")


def _holds_set(set_dir: Path, set_id: str) -> bool:
    """Whether ``set_dir`` still holds a questions.json saying ``set_id`` (read
    leniently: a set that fails lint still holds its id)."""
    try:
        raw = json.loads(read_regular(set_dir / QUESTIONS))
    except (OSError, ValueError):
        return False
    return isinstance(raw, dict) and raw.get("id") == set_id


def _stat(set_dir: Path) -> tuple[int, ...] | None:
    """What tells that a set's questions.json was written since (an atomic
    replace is a new inode); None when it is not there."""
    try:
        st = os.stat(set_dir / QUESTIONS)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def _changed_since(set_dir: Path, read_as: tuple[int, ...] | None, report: PostReport) -> bool:
    """Whether the set's questions.json was written since it was read as
    ``read_as``: then the set is left for the next pass to take as it is now
    (in ``report.failed``)."""
    if _stat(set_dir) == read_as:
        return False
    log.info("set %s changed while it was read or posted; it is taken again as it is now", set_dir)
    report.failed.append(set_dir)
    return True


def _fingerprint(set_dir: Path) -> str | None:
    try:
        return hashlib.sha256(read_regular(set_dir / QUESTIONS)).hexdigest()
    except OSError:
        return None


def changed_sets(root: Path, paths: Iterable[str | Path]) -> list[Path]:
    """The set folders of the changed questions.json files among ``paths`` (and
    of the sets in a folder among them), by the rules of ``discover``: under
    ``root`` without passing through a symlinked, hidden or ``attachments``
    folder, and still holding the file."""
    found = []
    root = Path(os.path.abspath(root))
    for path in (Path(os.path.abspath(p)) for p in paths):
        if path.name != QUESTIONS:
            if path.is_dir() and not path.is_symlink():
                # A folder moved in (or back): the sets in it, whose own files
                # changed before the watcher could see inside it.
                found.extend(changed_sets(root, [d / QUESTIONS for d in discover(path)]))
            continue
        set_dir = path.parent
        try:
            parts = set_dir.relative_to(root).parts
        except ValueError:
            continue
        if any(part.startswith(".") or part in SKIPPED for part in parts):
            continue
        if any((root.joinpath(*parts[:n])).is_symlink() for n in range(1, len(parts) + 1)):
            continue
        if path.is_file() and not leads_outside(path, root):
            found.append(set_dir)
    return found


def _closing_words(question: Question, qset: QuestionSet) -> str:
    if question.status == "withdrawn":
        return f"withdrawn ({shown_words(question.reason, REASON_SHOWN)})" if question.reason else "withdrawn"
    if question.status == "superseded":
        # Named by its title, as the room shows it (the id is the agent's word),
        # cut as a title is everywhere the bridge quotes one: named whole (a
        # title of 16,000 characters), the closing edit was past what an event
        # carries, refused, and every pass failed on it for good.
        successor = next((q for q in qset.questions if q.id == question.superseded_by), None)
        name = shown_title(successor.title if successor is not None else question.superseded_by or "")
        return f"superseded by “{name}”" if name else "superseded"
    return "closed"
