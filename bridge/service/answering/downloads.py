"""Files people send, fetched without holding anything else up.

A batch waits for its files at most BATCH_WAIT.  A download still going on
then goes on by itself: its event leaves the batch, kept in the store (its
``attachment`` row says ``pending``, the event waits in meta under
``download:<id>``) before the transport's progress can move past it, and is
judged on its own once the file is whole or given up on.  So a content
repository that stalls costs that one file's word back, never another
person's answer or another room's (and an appservice transaction is answered
well within the homeserver's timeout, which would otherwise count the bridge
as down and drop the room keys it pushes meanwhile).  Nor does a slow
server or person take every turn to download (``mediaturns``): another
room's file is fetched beside theirs.

A start (and the new leader) takes the kept ones up again: a file fetched and
recorded but not yet judged is judged, one not fetched is fetched again under
the same name.  The file's number is given when the batch meets it, so the
files after it never take its name.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

from bridge.protocol.annotate import room_left
from bridge.protocol.normalize import is_file_content
from bridge.service.answering.attachments import (Download, MayAnswer, abandoned_after, fetch_bounded, file_content,
                                                  media_url, sweep_sets, target)
from bridge.service.answering.mediaturns import MediaTurns, Turn, origin_of
from bridge.service.answering.places import Places
from bridge.service.eventwait import any_set, set_within
from bridge.wholefile import in_thread
from bridge.service.storage.setpaths import DOWNLOAD_KEPT
from bridge.service.storage.store import Store

log = logging.getLogger(__name__)

PENDING = "pending"  # the attachment row of a file still coming
KEPT = DOWNLOAD_KEPT  # meta: the event of a file still coming, with where it goes
# How long a batch waits for its files before it goes on without the slow ones.
BATCH_WAIT = 3.0
# How often kept downloads nobody is running (a failed judging, a start) are taken up.
RESUME_EVERY = 30.0
# A batch's file: (event, set folder, question id, its number, its download).
Job = tuple[dict[str, Any], str, str, int, "asyncio.Future[Any]"]
# How often the sets' attachments folders are swept of part files no
# download is writing any more (a crash mid-download whose file was never
# tried again: redacted or its question closed before the next start).
SWEEP_EVERY = 300.0

JudgeLater = Callable[[list[dict[str, Any]]], Awaitable[Any]]


class Downloads:
    def __init__(self, store: Store, download: Download | None, may_answer: MayAnswer,
                 on_trouble: Callable[[str, str], None] | None, max_bytes: int, judge_later: JudgeLater,
                 flush: Callable[[], Awaitable[Any]] | None = None):
        self.store, self.download, self.may_answer = store, download, may_answer
        self.on_trouble, self.max_bytes, self.judge_later = on_trouble, max_bytes, judge_later
        self.flush = flush  # the folders written (and doomed files deleted) now
        self.running: dict[str, asyncio.Future[Any]] = {}  # event id -> its download and judging
        # Tries downloading at once, shared out by server and by person (``fetch_bounded``).
        self.turns = MediaTurns()
        # The files each answer may still take, kept while any of its files is not judged yet.
        self._places: dict[tuple[str, str], Places] = {}
        # Files whose events are not judged yet (``attachments.Unjudged``): an edit sending another file may come first.
        self._unjudged: dict[str, tuple[str, str, str | None]] = {}

    async def prefetch(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Save the new files of ``events`` sent to open questions; the events to judge now."""
        if self.download is None:
            return events
        later: set[str] = set()
        jobs: list[Job] = []
        numbers: dict[tuple[str, str], int] = {}
        unjudged = dict(self._unjudged)  # and this batch's files, as they are found
        for event in events:
            event_id = event.get("event_id")
            if event_id in self.running or (_is_file(event) and self.store.attachment(event_id) == (None, PENDING)):
                later.add(event_id)  # its file is still coming: judged when it has
                continue
            found = target(event, self.store, unjudged)
            if found is None:
                continue
            event_id, question_event_id, qid, set_dir = found
            unjudged[event_id] = (str(event.get("sender")), question_event_id, media_url(file_content(event)))
            if not self.may_answer(str(event.get("sender")), str(event.get("room_id")), event_id):
                continue  # the judging step refuses the sender; a stranger's file is never written
            # Numbered in the batch's order before any download starts: the files
            # of one batch are fetched side by side, so a slow one costs its
            # bound once, not once per file.
            key = (set_dir, qid)
            if key not in numbers:
                # Names go on from every file ever fetched for the question (none
                # is taken twice); the cap counts what the answer holds now.
                numbers[key] = self.store.attachment_count(set_dir, qid)
                if key not in self._places:  # (else files of an earlier batch still hold some)
                    # Files still coming from before a restart (taken up again
                    # after this batch, with no place of their own) keep theirs.
                    self._places[key] = Places(room_left(self.store.projection(set_dir, qid))["attachments"]
                                               - self.store.coming_attachments(set_dir, qid, PENDING))
            numbers[key] += 1
            places = self._places[key]
            places.owed += 1
            jobs.append((event, set_dir, qid, numbers[key], asyncio.ensure_future(places.fetched(functools.partial(
                fetch_bounded, file_content(event), set_dir, qid, numbers[key], self.download, self.max_bytes,
                self._turn(event))))))
        if not jobs:
            return [event for event in events if event.get("event_id") not in later] if later else events
        try:
            await asyncio.wait([job for *_parts, job in jobs], timeout=BATCH_WAIT)
            self._record(jobs, unjudged)
        except BaseException:
            await self._undo(jobs)
            raise
        for event, set_dir, qid, _number, job in jobs:
            judged = functools.partial(self._judged, (set_dir, qid))
            if job.done():
                self._told(event["event_id"], qid, job.result()[1])
                judged()  # (by the caller, with the rest of the batch)
            else:
                later.add(event["event_id"])
                self._unjudged[event["event_id"]] = unjudged[event["event_id"]]
                log.info("file %s for %s still coming after %.0f s: judged once it is in, the batch goes on",
                         event["event_id"], qid, BATCH_WAIT)
                self._follow(event, qid, job, judged)
        return [event for event in events if event.get("event_id") not in later]

    def _record(self, jobs: list[Job], unjudged: dict[str, tuple[str, str, str | None]]) -> None:
        """Each file of the batch as it stands: saved, refused, or still coming."""
        with self.store.transaction():
            for event, set_dir, qid, number, job in jobs:
                url = media_url(file_content(event))
                if job.done():
                    path, problem = job.result()
                    self.store.record_attachment(event["event_id"], set_dir, qid, path, problem, url)
                else:
                    self.store.record_attachment(event["event_id"], set_dir, qid, None, PENDING, url)
                    self.store.set_meta(KEPT + event["event_id"], json.dumps(
                        {"event": event, "set_dir": set_dir, "qid": qid, "number": number,
                         "question": unjudged[event["event_id"]][1]}))

    async def _undo(self, jobs: list[Job]) -> None:
        """A batch that failed before its files were recorded (the store away
        a moment) comes again: its downloads are stopped (their part files
        gone) and their places given back, or its second go would fetch each
        file again under the same name beside the first, and the one that
        lost the race be told its file was not saved."""
        for *_parts, job in jobs:
            job.cancel()
        await asyncio.gather(*(job for *_parts, job in jobs), return_exceptions=True)
        for _event, set_dir, qid, _number, job in jobs:
            saved = job.result()[0] if not job.cancelled() and job.exception() is None else None
            places = self._places.get((set_dir, qid))
            if saved is not None:
                # Fetched already: recorded by nothing, and its place held.
                Path(set_dir, saved).unlink(missing_ok=True)
                if places is not None:
                    places.free += 1
            self._judged((set_dir, qid))

    async def run(self, stop: asyncio.Event, after: asyncio.Event | None = None) -> None:
        """Take up the kept downloads nobody runs (at start, then every
        RESUME_EVERY); on stop, leave the running ones to the next start."""
        try:
            if after is not None:
                await any_set([stop, after])  # the answers waiting at start come first
            swept = 0.0
            while not stop.is_set():
                await self.resume()
                if self.download is not None and time.monotonic() - swept >= SWEEP_EVERY:
                    swept = time.monotonic()
                    await self._sweep()
                await set_within(stop, RESUME_EVERY)
        finally:
            for running in list(self.running.values()):
                running.cancel()

    async def resume(self) -> None:
        if self.download is None:
            return
        kept = await self.store.run(self.store.meta_with_prefix, KEPT)
        for key, value in kept:
            event_id = key[len(KEPT):]
            if event_id in self.running:
                continue
            kept_event = json.loads(value)
            event, qid = kept_event["event"], kept_event["qid"]
            if "question" in kept_event:
                self._unjudged[event_id] = (str(event.get("sender")), kept_event["question"],
                                            media_url(file_content(event)))
            saved = await self.store.run(self.store.attachment, event_id)
            if saved == (None, PENDING):
                log.info("file %s for %s fetched again (its download was cut short)", event_id, qid)
                self._follow(event, qid, asyncio.ensure_future(fetch_bounded(
                    file_content(event), kept_event["set_dir"], qid, kept_event["number"], self.download,
                    self.max_bytes, self._turn(event))))
            else:
                self._follow(event, qid, None)  # fetched, not judged yet

    def _turn(self, event: dict[str, Any]) -> Turn:
        return self.turns.of(origin_of(media_url(file_content(event))), str(event.get("sender")))

    async def _sweep(self) -> None:
        folders = await self.store.run(self.store.folders_posted)
        await in_thread(sweep_sets, folders, abandoned_after(self.max_bytes))

    def _judged(self, key: tuple[str, str]) -> None:
        places = self._places.get(key)
        if places is not None:
            places.owed -= 1
            if places.owed <= 0:
                del self._places[key]  # the record holds them all now: the next batch counts from it

    def _follow(self, event: dict[str, Any], qid: str, job: asyncio.Future[Any] | None,
                judged: Callable[[], None] = lambda: None) -> None:
        event_id = event["event_id"]
        self.running[event_id] = asyncio.ensure_future(self._settle(event, qid, job))

        def done(_task: asyncio.Future[Any]) -> None:
            self.running.pop(event_id, None)
            self._unjudged.pop(event_id, None)
            judged()
        self.running[event_id].add_done_callback(done)

    async def _settle(self, event: dict[str, Any], qid: str, job: asyncio.Future[Any] | None) -> None:
        """The file in (or given up on), then its event judged; its kept
        event goes last, so a failure between leaves it to be taken up again."""
        event_id = event["event_id"]
        try:
            if job is not None:
                path, problem = await job
                await self.store.run(self._settled, event_id, path, problem)
                self._told(event_id, qid, problem)
            await self.judge_later([event])
            if await self.store.run(self._forget, event_id) and self.flush is not None:
                await self.flush()
        except asyncio.CancelledError:
            if job is not None:
                job.cancel()
            raise
        except Exception:  # noqa: BLE001 - kept: taken up again within RESUME_EVERY
            log.exception("file %s for %s not judged yet; tried again", event_id, qid)

    def _settled(self, event_id: str, path: str | None, problem: str | None) -> None:
        with self.store.transaction():
            self.store.settle_attachment(event_id, path, problem)

    def _forget(self, event_id: str) -> bool:
        """Its kept event let go; and its file doomed when the event was judged
        to record nothing (redacted while the file came, its question closed
        meanwhile), as a withdrawn file is: ``attachments/`` holds only what
        answers.json names.  Whether a file was doomed."""
        with self.store.transaction(flush=False):
            self.store.delete_meta(KEPT + event_id)
            return self.store.doom_if_unused(event_id)

    def doom_unrecorded(self, events: list[dict[str, Any]]) -> None:
        """The files of ``events``, just judged (in the store's transaction),
        doomed where the judging recorded nothing: a file fetched within the
        batch's wait and then refused (a note past its limit, say) is deleted
        as one whose event was judged apart is (``_forget``)."""
        for event in events:
            # (Judged: an edit waiting for its original is not yet.)
            event_id = event.get("event_id")
            if _is_file(event) and isinstance(event_id, str) and self.store.is_processed(event_id):
                self.store.doom_if_unused(event_id)

    def _told(self, event_id: str, qid: str, problem: str | None) -> None:
        if problem:
            log.info("file %s for %s not kept: %s", event_id, qid, problem)
            if self.on_trouble is not None:
                self.on_trouble("download", problem)


def _is_file(event: dict[str, Any]) -> bool:
    return is_file_content(event.get("content"))

