"""The webhooks' durable outbox: a row per (event, URL) written in the same
store transaction as the answer-log entry it tells of, so an accepted answer
and its webhook are committed together or not at all.

``OutboxHook`` is the pipeline's ``on_logged`` hook: synchronous, cheap (one
small file read: the set's owner) and inside the batch's transaction."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from bridge.agents.owner import read_owner
from bridge.protocol.recorded import RecordedQuestion
from bridge.service.config import Agent
from bridge.service.storage.store import LogEntry, Store

# The log outcomes an agent is told of, and the event type each becomes.
EVENT_TYPES = {"accepted": "answer.accepted", "withdrawn": "answer.withdrawn"}


@dataclass(frozen=True)
class Delivery:
    id: int
    key: str
    agent: str
    url: str
    body: bytes
    created_at: int
    attempts: int


def event_body(entry: LogEntry, agent: str, key: str, receipt: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a webhook POST carries (pure); ``receipt``: the answer log's leaf of it, as answers.json has it."""
    body = {
        "type": EVENT_TYPES[entry.outcome],
        "id": key,
        "agent": agent,
        "set": entry.set_id,
        "qid": entry.qid,
        "answer_event_id": entry.event_id,
        "sender": entry.sender,
        "ts": entry.ts,
        "record": entry.record,
    }
    if receipt is not None:
        body["receipt"] = receipt
    return body


def closed_body(question: RecordedQuestion, why: str, agent: str, key: str) -> dict[str, Any]:
    """What a webhook POST carries when a question is closed (pure)."""
    return {
        "type": "question.closed",
        "id": key,
        "agent": agent,
        "set": question.set_id,
        "qid": question.qid,
        "q_rev": question.rev,
        "question_event_id": question.event_id,
        "why": why,
    }


def targets(agent: Agent | None, callbacks: tuple[str, ...]) -> list[str]:
    urls = [agent.webhook_url] if agent is not None and agent.webhook_url else []
    return list(dict.fromkeys(urls + list(callbacks)))


class OutboxHook:
    def __init__(self, store: Store, agents: Mapping[str, Agent], on_queued: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.time):
        self.store = store
        self.agents = agents
        self.on_queued = on_queued
        self.clock = clock

    def __call__(self, entry: LogEntry) -> None:
        """An answer-log entry (the pipeline's ``on_logged``)."""
        if entry.outcome not in EVENT_TYPES or not entry.set_dir:
            return
        key = f"{EVENT_TYPES[entry.outcome]}:{entry.event_id}"
        receipt = self.store.receipt_of(entry.event_id)  # its leaf is in this transaction already
        self._queue(entry.set_dir, key, lambda agent: event_body(entry, agent, key, receipt))

    def closed(self, question: RecordedQuestion, why: str) -> None:
        """A posted question closed, withdrawn, superseded or replaced (the poster's ``on_closed``)."""
        set_dir = self.store.set_dir_of(question.event_id)
        if not set_dir:
            return
        key = f"question.closed:{question.event_id}"
        self._queue(set_dir, key, lambda agent: closed_body(question, why, agent, key))

    def _queue(self, set_dir: str, key: str, body_for: Callable[[str], dict[str, Any]]) -> None:
        owner = read_owner(set_dir)
        if owner is None or owner.agent not in self.agents:
            return
        urls = targets(self.agents[owner.agent], owner.callbacks)
        if not urls:
            return
        body = json.dumps(body_for(owner.agent), ensure_ascii=False, sort_keys=True)
        now = int(self.clock() * 1000)
        for url in urls:
            self.store.db.execute(
                "INSERT OR IGNORE INTO webhook_outbox (key, agent, url, body, created_at, next_at, attempts) "
                "VALUES (?, ?, ?, ?, ?, ?, 0)", (key, owner.agent, url, body, now, now))
        if self.on_queued:
            self.on_queued()


def due(store: Store, now_ms: int, limit: int = 50) -> list[Delivery]:
    rows = store.db.execute("SELECT id, key, agent, url, body, created_at, attempts FROM webhook_outbox "
                            "WHERE next_at <= ? ORDER BY id LIMIT ?", (now_ms, limit)).fetchall()
    return [Delivery(r[0], r[1], r[2], r[3], r[4].encode(), r[5], r[6]) for r in rows]


def next_due(store: Store) -> int | None:
    row = store.db.execute("SELECT MIN(next_at) FROM webhook_outbox").fetchone()
    return row[0] if row else None


def delivered(store: Store, row_id: int) -> None:
    with store.transaction():
        store.db.execute("DELETE FROM webhook_outbox WHERE id=?", (row_id,))


def retry_at(store: Store, row_id: int, attempts: int, next_at_ms: int) -> None:
    with store.transaction(flush=False):  # a lost retry time only means trying again sooner
        store.db.execute("UPDATE webhook_outbox SET attempts=?, next_at=? WHERE id=?", (attempts, next_at_ms, row_id))


def pending(store: Store) -> int:
    return store.db.execute("SELECT COUNT(*) FROM webhook_outbox").fetchone()[0]
