"""Reminders: a gentle nudge in the thread of a question that has been open
and unanswered for a while, at most once per period.

``due_reminders`` is pure (the whole policy, unit-tested); ``remind_once``
does one pass against the store and a send callable; ``reminder_loop`` runs
passes until stopped.  When a question was last nudged is kept in the store,
so a restart neither repeats a nudge nor forgets one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from bridge.service.eventwait import set_within
from bridge.protocol.outcome import in_thread, shown_title, txn_id
from bridge.service.storage.store import PostedQuestion, Store

log = logging.getLogger(__name__)

# transport.send(room_id, event_type, content, txn_id) -> event id
Send = Callable[[str, str, dict[str, Any], str], Awaitable[str]]

REMINDER_KEY = "dev.superpipeline.question.reminder"
# How often the loop looks; far below any sensible `after` or `every`.
DEFAULT_TICK_SECONDS = 60.0
# ``!ask remind`` nudges a question again at most this often: ten commands in
# a second sent every open question's nudge ten times.
ASKED_AGAIN_SECONDS = 60.0


def due_reminders(open_questions: Iterable[PostedQuestion], answered: set[str], last_reminded: Mapping[str, int],
                  now_ms: int, after_seconds: float, period_seconds: float) -> list[PostedQuestion]:
    """The open questions to nudge now.

    A question is due when nobody has answered it (its event id is not in
    ``answered``), it was posted at least ``after_seconds`` ago, and it was
    never nudged or last nudged at least ``period_seconds`` ago.  Times are
    milliseconds since the epoch, as the store keeps them.
    """
    after_ms, period_ms = after_seconds * 1000, period_seconds * 1000
    due = []
    for question in open_questions:
        if question.event_id in answered:
            continue
        if now_ms - question.posted_at < after_ms:
            continue
        last = last_reminded.get(question.event_id)
        if last is not None and now_ms - last < period_ms:
            continue
        due.append(question)
    return due


def reminder_content(question: PostedQuestion) -> dict[str, Any]:
    """A notice in the question's thread (with the reply fallback for
    clients without threads)."""
    text = f"A gentle reminder: “{shown_title(question.title)}” is still waiting for an answer."
    return {
        "msgtype": "m.notice",
        "body": text,
        "m.mentions": {},  # a nudge in the thread, not a ping of everyone the question names
        "m.relates_to": in_thread(question.event_id),
        REMINDER_KEY: {"question_event_id": question.event_id, "set": question.set_id, "qid": question.qid},
    }


async def send_reminders(store: Store, send: Send, questions: list[PostedQuestion], now_ms: int) -> int:
    """Nudge each question and record it; returns how many were sent.  The
    transaction id names the question and this pass's time: nio's retry of
    one send is deduplicated by the homeserver, a later nudge is a new event."""
    sent = 0
    for question in questions:
        sent_id = await send(question.room_id, "m.room.message", reminder_content(question),
                             txn_id("remind", question.event_id, str(now_ms)))
        await store.run(_reminded, store, question, now_ms, sent_id)
        log.info("reminder sent: %s/%s rev %d (%s)", question.set_id, question.qid, question.rev, question.event_id)
        sent += 1
    return sent


def _reminded(store: Store, question: PostedQuestion, now_ms: int, sent_id: Any) -> None:
    with store.transaction():
        store.mark_reminded(question.event_id, now_ms)
        if isinstance(sent_id, str):  # a reply to the reminder answers the question
            store.record_sent(sent_id, question.room_id, question_event_id=question.event_id, kind="reminder")


async def remind_once(store: Store, send: Send, *, after_seconds: float, period_seconds: float,
                      now_ms: int | None = None) -> int:
    """One pass; what it reads and writes of the store are jobs on the store's
    thread (a pass comes every tick, answers flowing or not)."""
    now_ms = store.clock.now_ms() if now_ms is None else now_ms
    due = await store.run(lambda: due_reminders(store.open_posted(), store.answered_question_events(),
                                                store.reminded(), now_ms, after_seconds, period_seconds))
    return await send_reminders(store, send, due, now_ms)


async def remind_set_now(store: Store, send: Send, set_id: str, now_ms: int | None = None) -> int:
    """``!ask remind <set>``: nudge every unanswered open question of the set
    at once, whatever the reminders' timing (an admin asked), but none nudged
    in the last ``ASKED_AGAIN_SECONDS``.  Read on the store's thread, as every
    pass is: a slow store holds no room up."""
    now_ms = store.clock.now_ms() if now_ms is None else now_ms
    due = await store.run(lambda: due_reminders(store.open_posted(set_id), store.answered_question_events(),
                                                store.reminded(), now_ms, 0, ASKED_AGAIN_SECONDS))
    return await send_reminders(store, send, due, now_ms)


async def reminder_loop(store: Store, send: Send, stop: asyncio.Event, *, after_seconds: float,
                        period_seconds: float, tick_seconds: float = DEFAULT_TICK_SECONDS) -> None:
    """A pass every ``tick_seconds`` until ``stop``; a failed pass (the
    homeserver away) is logged and tried again on the next tick."""
    while not stop.is_set():
        try:
            await remind_once(store, send, after_seconds=after_seconds, period_seconds=period_seconds)
        except Exception as exc:  # noqa: BLE001 - reminders are a courtesy; they must not stop the bridge
            log.warning("reminders not sent yet (%s); trying again in %.0f s", exc, tick_seconds)
        await set_within(stop, tick_seconds)
