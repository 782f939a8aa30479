"""The webhooks' durable outbox: a row per (event, URL) written in the same
store transaction as the answer-log entry it tells of, so an accepted answer
and its webhook are committed together or not at all.

``OutboxHook`` is the pipeline's ``on_logged`` hook: synchronous, cheap (one
small file read: the set's owner) and inside the batch's transaction."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

from bridge.agents.owner import Owner, read_owner
from bridge.protocol.recorded import RecordedQuestion
from bridge.service.config import Agent
from bridge.service.storage.store import LogEntry, Store

# The log outcomes an agent is told of, and the event type each becomes.
EVENT_TYPES = {"accepted": "answer.accepted", "withdrawn": "answer.withdrawn"}
# Meta key prefix: the owner of a set folder as last posted from (value: the
# owner file's JSON), for the closes of a folder that is then removed whole.
OWNER_SEEN = "webhook_owner:"


# A webhook destination as deliveries are paced: an agent's URL.  Two agents
# naming one URL are two lanes, so one's failures (its signature refused
# there, say) never hold up the other's deliveries.
Lane = tuple[str, str]


@dataclass(frozen=True)
class Delivery:
    id: int
    key: str
    agent: str
    url: str
    body: bytes
    created_at: int
    attempts: int

    @property
    def lane(self) -> Lane:
        return self.agent, self.url


def event_body(entry: LogEntry, agent: str, key: str, receipt: dict[str, Any] | None = None,
               now: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a webhook POST carries (pure); ``receipt``: the answer log's leaf
    of it, as answers.json has it; ``now``: an accepted answer's question's
    record after it, which the body carries (``stands``: whether this answer
    is the one it holds)."""
    body = {
        "type": EVENT_TYPES[entry.outcome],
        "id": key,
        "agent": agent,
        "set": entry.set_id,
        "qid": entry.qid,
        "answer_event_id": entry.event_id,
        "sender": entry.sender,
        "ts": entry.ts,
        # An answer read late can be earlier in the room than the one that
        # stands (a federated server catching up): the record it carried was
        # its own pick, and an agent acting on the latest webhook acted on an
        # answer that did not stand.
        "record": entry.record if now is None else now,
    }
    if now is not None:
        body["stands"] = (now.get("source") or {}).get("event_id") in (entry.event_id, entry.replaces)
    if receipt is not None:
        body["receipt"] = receipt
    return body


def _taken_back(entry: LogEntry) -> dict[str, Any]:
    """A withdrawal's body names the event it took back (a redaction's own id is ``answer_event_id``)."""
    return {"withdrawn_event_id": entry.replaces} if entry.outcome == "withdrawn" else {}


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


def approval_body(kind: str, question: RecordedQuestion, record: dict[str, Any] | None, agent: str,
                  key: str) -> dict[str, Any]:
    """``question.decided`` / ``question.expired`` (PROTOCOL 2a; pure).  An
    expired question's record is never consent, whatever votes it lists."""
    return {
        "type": f"question.{kind}",
        "id": key,
        "agent": agent,
        "set": question.set_id,
        "qid": question.qid,
        "q_rev": question.rev,
        "question_event_id": question.event_id,
        "state": (record or {}).get("state", "expired" if kind == "expired" else None),
        "record": record,
    }


def targets(agent: Agent | None, callbacks: tuple[str, ...]) -> list[str]:
    urls = [agent.webhook_url] if agent is not None and agent.webhook_url else []
    return list(dict.fromkeys(urls + list(callbacks)))


class OutboxHook:
    def __init__(self, store: Store, agents: Mapping[str, Agent], on_queued: Callable[[], None] | None = None,
                 clock: Callable[[], float] | None = None):
        self.store = store
        self.agents = agents
        self.on_queued = on_queued
        # The store's clock: another instance (a standby taking over) compares next_at with its own.
        self.clock = clock or store.clock.seconds

    def __call__(self, entry: LogEntry) -> None:
        """An answer-log entry (the pipeline's ``on_logged``)."""
        if entry.outcome not in EVENT_TYPES or not entry.set_dir:
            return
        key = f"{EVENT_TYPES[entry.outcome]}:{entry.event_id}"
        receipt = self.store.receipt_of(entry.event_id)  # its leaf is in this transaction already
        question = self.store.question_by_event(entry.question_event_id) if entry.question_event_id else None
        record = self.store.projection(entry.set_dir, entry.qid) if entry.qid else None
        if question is not None and question.quorum is not None and entry.qid:
            # Every vote is told, with the votes standing after it and the
            # question's state; its record is the question's (a tally), never
            # the one vote's (which read "answered" while the approval waited).
            now = record or {}
            self._queue(entry.set_dir, key, lambda agent: {**event_body(entry, agent, key, receipt),
                                                          "record": record, "state": now.get("state"),
                                                          "votes": now.get("votes", []),
                                                          "required": question.quorum[0],
                                                          **_taken_back(entry)})
            return
        if entry.outcome == "accepted" and entry.qid:
            self._queue(entry.set_dir, key, lambda agent: event_body(entry, agent, key, receipt, record))
            return
        # A withdrawal: the record that stands now (an earlier answer back, or
        # none), and what was taken back; it held nothing (null), however much stood.
        self._queue(entry.set_dir, key, lambda agent: {**event_body(entry, agent, key, receipt), "record": record,
                                                      **_taken_back(entry)})

    def decided(self, question: RecordedQuestion, record: dict[str, Any] | None, again: int = 0) -> None:
        self._approval("decided", question, record, again)

    def expired(self, question: RecordedQuestion, record: dict[str, Any] | None, again: int = 0) -> None:
        self._approval("expired", question, record, again)

    def _approval(self, kind: str, question: RecordedQuestion, record: dict[str, Any] | None, again: int) -> None:
        """``again``: how many times the room was told an outcome of this
        posting before; a later one (the decision changed) gets a key of its own."""
        set_dir = self.store.set_dir_of(question.event_id)
        if not set_dir:
            return
        key = f"question.{kind}:{question.event_id}" + (f":{again}" if again else "")
        self._queue(set_dir, key, lambda agent: approval_body(kind, question, record, agent, key))

    def closed(self, question: RecordedQuestion, why: str) -> None:
        """A posted question closed, withdrawn, superseded, replaced by a new
        revision, removed from its set, or its set removed (the poster's
        ``on_closed``): one ``question.closed`` per posting."""
        set_dir = self.store.set_dir_of(question.event_id)
        if not set_dir:
            return
        key = f"question.closed:{question.event_id}"
        owner = read_owner(set_dir)
        if owner is None and not os.path.lexists(set_dir):
            owner = self._owner_seen(set_dir)  # the folder went with its owner file
        self._queue(set_dir, key, lambda agent: closed_body(question, why, agent, key), owner)

    def posted(self, question: RecordedQuestion) -> None:
        """A question posted (the poster's ``on_posted``): who owns its set is
        kept, so the closes of a folder removed whole still reach its agent."""
        set_dir = self.store.set_dir_of(question.event_id)
        if not set_dir:
            return
        self._keep_owner(set_dir)

    def owner_written(self, set_dir: str) -> None:
        """The agent asked again (its callbacks, say, changed) with nothing
        new to post: the owner kept for a folder removed whole is kept up
        too, or its closes went to the callbacks it had dropped."""
        if self.store.get_meta(OWNER_SEEN + set_dir) is not None:
            self._keep_owner(set_dir)

    def _keep_owner(self, set_dir: str) -> None:
        owner = read_owner(set_dir)
        # No owner file read is not a new owner: the folder may be going whole
        # (rm -r takes the owner file before questions.json and the folder),
        # and forgetting the agent then lost the closes it was owed.
        seen = json.dumps(owner.as_dict()) if owner is not None else None
        if seen is None or self.store.get_meta(OWNER_SEEN + set_dir) == seen:
            return
        with self.store.transaction(flush=False):  # lost, it is only written again at the next posting
            self.store.set_meta(OWNER_SEEN + set_dir, seen)

    def _owner_seen(self, set_dir: str) -> Owner | None:
        raw = self.store.get_meta(OWNER_SEEN + set_dir)
        try:
            data = json.loads(raw) if raw else None
        except ValueError:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("agent"), str):
            return None
        callbacks = data.get("callbacks")
        return Owner(data["agent"], tuple(u for u in callbacks if isinstance(u, str))
                     if isinstance(callbacks, list) else ())

    def _queue(self, set_dir: str, key: str, body_for: Callable[[str], dict[str, Any]],
               owner: Owner | None = None) -> None:
        owner = owner or read_owner(set_dir)
        if owner is None or owner.agent not in self.agents:
            return
        urls = targets(self.agents[owner.agent], owner.callbacks)
        if not urls:
            return
        body = json.dumps(body_for(owner.agent), ensure_ascii=False, sort_keys=True)
        now = int(self.clock() * 1000)
        for url in urls:
            self.store.db.execute(
                "INSERT INTO webhook_outbox (key, agent, url, body, created_at, next_at, attempts, callback) "
                "VALUES (?, ?, ?, ?, ?, ?, 0, ?) ON CONFLICT DO NOTHING",
                (key, owner.agent, url, body, now, now, int(url in owner.callbacks)))
        if self.on_queued:
            self.on_queued()


def due(store: Store, now_ms: int, limit: int = 50) -> list[Delivery]:
    rows = store.db.execute("SELECT id, key, agent, url, body, created_at, attempts FROM webhook_outbox "
                            "WHERE next_at <= ? ORDER BY id LIMIT ?", (now_ms, limit)).fetchall()
    return [_delivery(r) for r in rows]


def due_lanes(store: Store, now_ms: int, leave_out: Collection[Lane] = (),
              agents_out: Collection[str] = ()) -> list[tuple[Lane, int]]:
    """Each lane with rows due, with its oldest row's id, oldest first; none
    of the lanes in ``leave_out`` (a circuit open, its fill in flight) nor
    of the agents in ``agents_out`` (their share in flight).  Ids only: what
    can start is chosen from these before any body is read."""
    skip, params = _leaving_out(leave_out)
    if agents_out:
        skip += f" AND agent NOT IN ({', '.join('?' * len(agents_out))})"
        params += tuple(agents_out)
    rows = store.db.execute(f"SELECT agent, url, MIN(id) FROM webhook_outbox WHERE next_at <= ?{skip} "
                            "GROUP BY agent, url ORDER BY MIN(id)", (now_ms, *params)).fetchall()
    return [((agent, url), first) for agent, url, first in rows]


def due_by_url(store: Store, now_ms: int, per_url: int, lanes: Collection[Lane]) -> list[Delivery]:
    """The oldest ``per_url`` due rows of each of ``lanes`` (an agent's URL):
    one lane's backlog never hides another's rows."""
    if not lanes:
        return []
    pairs = tuple(lanes)
    only = f"(agent, url) IN (VALUES {', '.join(['(?, ?)'] * len(pairs))})"
    # The window picks ids only; the bodies (kilobytes each) are read for the
    # rows picked.  Sorting a backlog of 10,000 rows with their bodies took
    # 0.7 s a pass on the store's thread, which the answers wait for.
    rows = store.db.execute(
        "SELECT o.id, o.key, o.agent, o.url, o.body, o.created_at, o.attempts FROM webhook_outbox AS o JOIN ("
        "SELECT id, ROW_NUMBER() OVER (PARTITION BY agent, url ORDER BY id) AS n "
        f"FROM webhook_outbox WHERE next_at <= ? AND {only}) AS due ON due.id = o.id WHERE due.n <= ? ORDER BY o.id",
        (now_ms, *(part for pair in pairs for part in pair), per_url)).fetchall()
    return [_delivery(r) for r in rows]


def next_due(store: Store, after_ms: int | None = None, leave_out: Collection[Lane] = ()) -> int | None:
    """The soonest next_at (after ``after_ms``, of lanes not left out)."""
    if after_ms is None:
        row = store.db.execute("SELECT MIN(next_at) FROM webhook_outbox").fetchone()
        return row[0] if row else None
    skip, params = _leaving_out(leave_out)
    row = store.db.execute(f"SELECT MIN(next_at) FROM webhook_outbox WHERE next_at > ?{skip}",
                           (after_ms, *params)).fetchone()
    return row[0] if row else None


def expired(store: Store, created_before_ms: int, limit: int = 5000) -> list[Delivery]:
    """Rows older than the drop-after limit, whatever their URL's circuit
    says; without their bodies (they are dropped, never sent)."""
    rows = store.db.execute("SELECT id, key, agent, url, '', created_at, attempts FROM webhook_outbox "
                            "WHERE created_at < ? ORDER BY id LIMIT ?", (created_before_ms, limit)).fetchall()
    return [_delivery(r) for r in rows]


def _leaving_out(lanes: Collection[Lane]) -> tuple[str, tuple[str, ...]]:
    pairs = tuple(lanes)
    if not pairs:
        return "", ()
    return f" AND (agent, url) NOT IN (VALUES {', '.join(['(?, ?)'] * len(pairs))})", \
        tuple(part for pair in pairs for part in pair)


def _delivery(r: Any) -> Delivery:
    return Delivery(r[0], r[1], r[2], r[3], r[4].encode(), r[5], r[6])


def delivered(store: Store, *row_ids: int) -> None:
    """The rows gone from the outbox, in one transaction (one sync of the disk)."""
    with store.transaction():
        for row_id in row_ids:
            store.db.execute("DELETE FROM webhook_outbox WHERE id=?", (row_id,))


def due_now(store: Store, lane: Lane, now_ms: int) -> int:
    """Every row of ``lane`` due at once (a URL that took one again takes the
    rest: its backlog had waited out each row's backoff, up to 5 minutes
    apiece); how many were waiting.  The caller passes the end of a hold
    still running as ``now_ms``: then they are due when it ends."""
    with store.transaction(flush=False):
        return store.db.execute("UPDATE webhook_outbox SET next_at=? WHERE agent=? AND url=? AND next_at>?",
                                (now_ms, *lane, now_ms)).rowcount


# Meta key prefix (+ agent, percent-encoded, a space, url): until when (ms,
# the store's clock) a URL asked to be left alone (a 429's or 503's
# Retry-After): a restart keeps it.  The agent and the URL were joined with a
# NUL, which PostgreSQL text cannot hold: there the hold was never kept (and
# the URL's queued rows, put off in the same transaction, were not put off).
# A key of that kind a SQLite store kept from before is still read.
HELD = "webhook_held:"


def _held_key(lane: Lane) -> str:
    agent, url = lane
    return f"{HELD}{quote(agent, safe='')} {url}"


def _held_lane(key: str) -> Lane:
    rest = key[len(HELD):]
    if "\x00" in rest:  # kept before the key changed (SQLite only: PostgreSQL never took one)
        agent, _, url = rest.partition("\x00")
        return agent, url
    agent, _, url = rest.partition(" ")
    return unquote(agent), url


def hold_lane(store: Store, lane: Lane, until_ms: int) -> None:
    """Nothing goes to ``lane`` before ``until_ms``: its rows queued now wait,
    and the hold is kept for the rows queued later, across a restart."""
    with store.transaction(flush=False):
        _defer(store, lane, until_ms)
        store.set_meta(_held_key(lane), str(until_ms))


def defer_lane(store: Store, lane: Lane, until_ms: int) -> None:
    """``lane``'s rows wait until ``until_ms`` (its circuit opened): while
    they stayed due, every pass of the deliverer read a dead receiver's whole
    backlog again to leave it out, on the store's thread."""
    with store.transaction(flush=False):
        _defer(store, lane, until_ms)


def _defer(store: Store, lane: Lane, until_ms: int) -> None:
    store.db.execute("UPDATE webhook_outbox SET next_at=? WHERE agent=? AND url=? AND next_at<?",
                     (until_ms, *lane, until_ms))


def retried_lanes(store: Store) -> set[Lane]:
    """The lanes with rows tried and not taken yet: read at a start, the
    outages the rows' backoffs remember and a new deliverer does not."""
    return {(agent, url) for agent, url in
            store.db.execute("SELECT DISTINCT agent, url FROM webhook_outbox WHERE attempts > 0").fetchall()}


def lane_holds(store: Store, now_ms: int) -> dict[Lane, int]:
    """The holds still running (those past are forgotten)."""
    holds: dict[Lane, int] = {}
    past = []
    for key, value in store.meta_with_prefix(HELD):
        lane = _held_lane(key)
        until = int(value) if value.isdigit() else 0
        if until > now_ms:
            holds[lane] = max(until, holds.get(lane, 0))  # an old key and a new one for one lane: the later
        else:
            past.append(key)
    if past:
        with store.transaction(flush=False):
            for key in past:
                store.delete_meta(key)
    return holds


# Meta key prefix: an agent's webhook_url as the last start had it.
WEBHOOK_URL_SEEN = "webhook_url:"


def follow_webhook_urls(store: Store, agents: Mapping[str, Agent]) -> list[tuple[str, str, str | None, int]]:
    """At start: the rows queued for an agent's webhook_url before it was
    changed go to the new one (or, with none configured now, are dropped),
    never on to the URL the operator retired; (agent, old, new, rows) of
    each change.  A set's own callbacks stay as the set named them: a row
    its callbacks named (the old URL too, say) stays, and the new URL gets
    a copy of its own."""
    changed = []
    with store.transaction(flush=False):
        for name, agent in agents.items():
            seen = store.get_meta(WEBHOOK_URL_SEEN + name)
            current = agent.webhook_url or None
            if seen and seen != current:
                if current:
                    # An event the new URL has its own row for (a set naming it as a callback) goes there once.
                    store.db.execute("DELETE FROM webhook_outbox WHERE agent=? AND url=? AND callback=0 AND key IN "
                                     "(SELECT key FROM webhook_outbox WHERE url=?)", (name, seen, current))
                    copied = store.db.execute(
                        "INSERT INTO webhook_outbox (key, agent, url, body, created_at, next_at, attempts, callback) "
                        "SELECT key, agent, ?, body, created_at, created_at, 0, 0 FROM webhook_outbox "
                        "WHERE agent=? AND url=? AND callback=1 ON CONFLICT DO NOTHING", (current, name, seen)).rowcount
                    # Moved as the copies are, due now and untried: the tries and
                    # backoff (up to 5 minutes) were the old URL's, which the
                    # operator often retires for being down.
                    moved = copied + store.db.execute(
                        "UPDATE webhook_outbox SET url=?, next_at=created_at, attempts=0 "
                        "WHERE agent=? AND url=? AND callback=0", (current, name, seen)).rowcount
                else:
                    moved = store.db.execute("DELETE FROM webhook_outbox WHERE agent=? AND url=? AND callback=0",
                                             (name, seen)).rowcount
                changed.append((name, seen, current, moved))
            if current != seen:
                if current:
                    store.set_meta(WEBHOOK_URL_SEEN + name, current)
                else:
                    store.delete_meta(WEBHOOK_URL_SEEN + name)
    return changed


def drop_unsigned(store: Store, agents: Mapping[str, Agent]) -> dict[str, int]:
    """At start: the rows of every agent the config no longer lets sign (the
    agent removed, or its webhook_secret) dropped in one statement; how many
    each such agent had.  One by one, as each came due, a removed agent's
    backlog of thousands cost as many transactions on the store's thread
    (which answers wait for) and as many log lines."""
    signing = tuple(name for name, agent in agents.items() if agent.webhook_secret)
    kept = f" WHERE agent NOT IN ({', '.join('?' * len(signing))})" if signing else ""
    with store.transaction(flush=False):  # lost, they are dropped at the next start (or as they come due)
        rows = store.db.execute(f"DELETE FROM webhook_outbox{kept} RETURNING agent", signing).fetchall()
    dropped: dict[str, int] = {}
    for (agent,) in rows:
        dropped[agent] = dropped.get(agent, 0) + 1
    return dropped


def retry_at(store: Store, row_id: int, attempts: int, next_at_ms: int) -> None:
    with store.transaction(flush=False):  # a lost retry time only means trying again sooner
        store.db.execute("UPDATE webhook_outbox SET attempts=?, next_at=? WHERE id=?", (attempts, next_at_ms, row_id))


def pending(store: Store) -> int:
    return store.db.execute("SELECT COUNT(*) FROM webhook_outbox").fetchone()[0]
