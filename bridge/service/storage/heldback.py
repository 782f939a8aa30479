"""What the bridge holds back, and why: for ``status``, ``!ask status`` and
``/health``.  Read from the store, so a run that is not this one (``status``
beside the running bridge) sees the same."""

from __future__ import annotations

import sqlite3
from typing import Any

from bridge.protocol.deadline import format_rfc3339
from bridge.service.storage.setpaths import NOT_POSTED
from bridge.service.storage.store import Store


def held_back(store: Store) -> dict[str, Any]:
    """Sets pending a write, events set aside (by reason), notices dropped."""
    try:
        return _held_back(store)
    except sqlite3.OperationalError as exc:
        if not _not_migrated(exc):
            # PostgreSQL away (its errors read as SQLite's OperationalError):
            # not "nothing held back", which cleared /health and the alerts.
            raise
        return nothing_held()  # a store the running bridge has not migrated yet


def _not_migrated(exc: sqlite3.OperationalError) -> bool:
    """A table or column of a later schema missing (SQLite's words, or PostgreSQL's)."""
    text = str(exc)
    return "no such table" in text or "no such column" in text or "does not exist" in text


def nothing_held() -> dict[str, Any]:
    """``held_back`` of a store that holds nothing back (none yet): every key
    there, so a script reading ``status --json`` finds the same shape always."""
    return {"sets": [], "events": {}, "notices": [], "waiting": 0, "not_posted": [],
            "webhooks": {"pending": 0, "oldest_ms": None}}


def _held_back(store: Store) -> dict[str, Any]:
    pending, oldest = store.db.execute("SELECT COUNT(*), MIN(created_at) FROM webhook_outbox").fetchone()
    return {
        "sets": [{"set_dir": set_dir, "set_id": set_id, "reason": reason, "since_ms": since, "attempts": attempts}
                 for set_dir, set_id, reason, since, attempts, _next in store.held_sets()],
        "events": store.set_aside_counts(),
        "notices": [{"log_seq": seq, "room_id": room, "reason": reason, "at_ms": at}
                    for seq, room, reason, at in store.dropped_notices()],
        # Encrypted events kept until their key comes, or their sender's
        # homeserver answers for their devices: judged then (or refused).
        "waiting": store.undecrypted_count(),
        # Sets the poster could not post (tried again with backoff): status
        # showed their questions as unposted, for no reason it gave.
        "not_posted": [{"set_dir": key[len(NOT_POSTED):], "reason": reason}
                       for key, reason in store.meta_with_prefix(NOT_POSTED)],
        # Webhooks still to deliver (a receiver down: retried for a day), and
        # since when the oldest waits: the backlog was seen only in the log.
        "webhooks": {"pending": pending, "oldest_ms": oldest},
    }


def counts(held: dict[str, Any]) -> dict[str, int]:
    return {"sets_held": len(held["sets"]), "events_set_aside": sum(held["events"].values()),
            "notices_dropped": len(held["notices"]), "events_waiting": held["waiting"],
            "sets_not_posted": len(held["not_posted"]),
            "webhooks_pending": held["webhooks"]["pending"]}


def format_held(held: dict[str, Any]) -> str:
    """Plain lines for people; empty when nothing is held back."""
    lines = [f"set {row['set_id']} ({row['set_dir']}) held back: {row['reason']} (tried {row['attempts']} times)"
             for row in held["sets"]]
    lines += [f"set {row['set_dir']} not posted yet: {row['reason']} (tried again)" for row in held["not_posted"]]
    lines += [f"{count} event(s) set aside: {reason}" for reason, count in sorted(held["events"].items())]
    if held.get("waiting"):
        lines.append(f"{held['waiting']} encrypted event(s) waiting for their keys or their senders' devices")
    pending, oldest = held["webhooks"]["pending"], held["webhooks"]["oldest_ms"]
    if pending:
        lines.append(f"{pending} webhook delivery(ies) pending, the oldest queued at "
                     f"{format_rfc3339(int(oldest))} (retried until delivered, or dropped after webhook_drop_after)")
    if held["notices"]:
        reasons = sorted({row["reason"] for row in held["notices"]})
        lines.append(f"{len(held['notices'])} notice(s) dropped ({', '.join(reasons)})")
    return "".join(line + "\n" for line in lines)
