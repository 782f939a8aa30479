"""A question, or its poll, between its send and its record.

The one moment the room is ahead of the store: the event is out, people can
answer or vote, and the store does not know it yet.  A kill there left the
answers of the next start's first batch refused as answers to no question,
and the votes dropped as votes in no poll of the bridge's (the sets are read
again only after that batch).  So what is about to be sent is kept first
(``IN_SEND``, one per question and per poll), and a start records what a stopped
instance left there before it reads a batch: the same transaction sent again
is the same event (the homeserver hands its id back), recorded with the
content the room got.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, Callable

from bridge.protocol.poll import POLL_START
from bridge.protocol.recorded import RecordedQuestion
from bridge.service.storage.setpaths import SET_SYNCED

log = logging.getLogger(__name__)

IN_SEND = "post_in_send:"  # meta, under the question's folder and id (or the poll's question): JSON
UNTOLD = "close_untold:"  # meta: a close the room has not been told of yet (the poster tells it)

# (replaced posting, set folder), in the recording transaction: an approval's record kept.
KeepRecord = Callable[[RecordedQuestion, str], None]
OnClosed = Callable[[RecordedQuestion, str], None]


@dataclass(frozen=True)
class Sending:
    """A new posting as it is sent: where, what, and which open postings it replaces."""

    txn: str
    room: str
    set_id: str
    folder: str
    qid: str
    content: dict[str, Any]
    replacing: tuple[str, ...]  # event ids of the open postings the new one closes
    why: str  # what the replaced ones are closed with
    after: str | None  # the question's latest posting when this one was sent: a later one makes it stale

    @property
    def key(self) -> str:
        # One per question: a later sending of it (another revision) takes the
        # place of one whose send failed, which is never sent again.
        return f"{IN_SEND}{self.folder}\x1f{self.qid}"  # (not NUL: PostgreSQL's text refuses it)

    @property
    def name(self) -> str:
        return f"{self.set_id}/{self.qid} rev {self.content.get('question', {}).get('rev')}"

    def dumps(self) -> str:
        return json.dumps({"txn": self.txn, "room": self.room, "set_id": self.set_id, "folder": self.folder,
                           "qid": self.qid, "content": self.content, "replacing": list(self.replacing),
                           "why": self.why, "after": self.after})

    def stale(self, store: Any) -> bool:
        """A posting of the question was recorded since (this send failed, and
        a later one went out).  (One the set no longer asks is closed by the
        start's pass, which reads the set again.)"""
        postings = store.postings(self.folder, self.qid)
        return (postings[0].event_id if postings else None) != self.after


@dataclass(frozen=True)
class PollSending:
    """A recorded posting's poll as it is sent."""

    txn: str
    room: str
    question: str  # the posting's event id
    content: dict[str, Any]

    @property
    def key(self) -> str:
        return f"{IN_SEND}poll\x1f{self.question}"

    @property
    def name(self) -> str:
        return f"the poll of {self.question}"

    def dumps(self) -> str:
        return json.dumps({"poll": True, "txn": self.txn, "room": self.room, "question": self.question,
                           "content": self.content})

    def stale(self, store: Any) -> bool:
        """The question closed since, or its poll recorded."""
        question = store.question_by_event(self.question)
        return question is None or not question.open or store.poll_of(self.question) is not None


def _loads(raw: str) -> Sending | PollSending:
    data = json.loads(raw)
    if data.get("poll"):
        return PollSending(data["txn"], data["room"], data["question"], data["content"])
    return Sending(data["txn"], data["room"], data["set_id"], data["folder"], data["qid"], data["content"],
                   tuple(data["replacing"]), data["why"], data["after"])


def keep(store: Any, sending: Sending | PollSending) -> None:
    """Inside a transaction, before the send: what is about to be sent."""
    store.set_meta(sending.key, sending.dumps())


def record_sent(store: Any, sending: Sending, event_id: str, posted_at: int, *,
                keep_record: KeepRecord | None = None,
                on_closed: OnClosed | None = None) -> tuple[RecordedQuestion, list[RecordedQuestion]]:
    """Inside a transaction: the new posting recorded, the ones it replaces
    closed, the sending no longer in doubt.  (new posting, replaced ones);
    ``PostingConflict`` when the store knows the event already."""
    recorded = RecordedQuestion(event_id=event_id, room_id=sending.room, set_id=sending.set_id,
                                content=sending.content)
    replaced = [old for old in map(store.question_by_event, sending.replacing) if old is not None and old.open]
    if keep_record is not None:
        for old in replaced:  # before the new posting makes the question's record its own
            keep_record(old, sending.folder)
    store.record_posted(recorded, set_dir=sending.folder, posted_at=posted_at)
    for old in replaced:
        store.close_question(old.event_id, sending.why)
        store.set_meta(UNTOLD + old.event_id, sending.why)
        if on_closed:  # the agent hears of it as of any other close
            on_closed(old, sending.why)
    store.delete_meta(sending.key)
    return recorded, replaced


def record_poll(store: Any, sending: PollSending, poll_id: str) -> None:
    """Inside a transaction: the posting's poll recorded, no longer in doubt."""
    store.set_poll(sending.question, poll_id)
    store.delete_meta(sending.key)


async def settle(store: Any, transport: Any, on_closed: OnClosed | None = None) -> None:
    """At start, before the first batch: every sending a stopped instance
    left in doubt sent again and recorded.  One that fails now (the room
    gone, the homeserver refusing) is dropped: the sets' pass posts what is
    still wanted, as it would have."""
    left = await store.run(store.meta_with_prefix, IN_SEND)
    if not left:
        return
    from bridge.service.answering.deadlines import keep_record  # (loaded only when needed: a start's first batch waits)

    for key, raw in left:
        try:
            sending = _loads(raw)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("a sending kept as %s can't be read (%s); the sets' pass posts what is still wanted", key, exc)
            await store.run_written(store.delete_meta, key)
            continue
        if await store.run(sending.stale, store):
            # Its send failed, and what the set wants went out after it: sent
            # now, it would be a question (or poll) nobody asked for any more.
            await store.run_written(store.delete_meta, key)
            continue
        try:
            if isinstance(sending, PollSending):
                event_id = await transport.send(sending.room, POLL_START, sending.content, sending.txn)
                await store.run_written(record_poll, store, sending, event_id)
            else:
                event_id = await transport.send(sending.room, "m.room.message", sending.content, sending.txn)

                def record() -> None:
                    record_sent(store, sending, event_id, store.clock.now_ms(),
                                keep_record=lambda old, folder: keep_record(store, old, folder), on_closed=on_closed)
                    # The set is read again in full by the start's pass: what
                    # changed in it since this send (a question closed,
                    # removed, revised) is done to this posting there.
                    store.delete_meta(SET_SYNCED + sending.folder)

                await store.run_written(record)
        except Exception as exc:  # noqa: BLE001 - one posting's trouble, left to the sets' pass
            log.warning("%s, sent before the last stop in %s, could not be recorded (%s); "
                        "the sets' pass posts it if it is still wanted", sending.name, sending.room, exc)
            await store.run_written(store.delete_meta, key)
        else:
            log.info("%s, sent before the last stop, recorded as %s", sending.name, event_id)
