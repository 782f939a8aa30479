"""A batch's events share round trips on PostgreSQL (each event's part of
the transaction ends in a deferred RELEASE), so a write that fails there may
belong to an event already released.  The batch is then handled again from
the room state it began with, each part in a round trip of its own: the
failure is set aside with its own event, and every other event's outcome is
the one it would have had alone.  On SQLite, where each statement runs at
once, the same batch comes out the same."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bridge.service.storage.store import Store

from test_isolation_parts import ALICE, BOB, ROOM, answer, setup

pytestmark = pytest.mark.usefixtures("store_backend")  # on SQLite and on PostgreSQL


def leave(user: str, event_id: str) -> dict[str, Any]:
    return {"type": "m.room.member", "event_id": event_id, "room_id": ROOM, "sender": user, "state_key": user,
            "origin_server_ts": 3000, "content": {"membership": "leave"}}


def poison(store: Store) -> None:
    """``$poison`` accepted writes a second row for itself: the key refuses
    it, on PostgreSQL on the server when the write is sent (with a later
    event's, there)."""
    mark = store.mark_processed

    def failing_mark(event_id: str, outcome: str) -> None:
        mark(event_id, outcome)
        if event_id == "$poison" and outcome != "refused":
            store.db.defer("INSERT INTO processed(event_id, outcome) VALUES (?, ?)", (event_id, outcome))

    store.mark_processed = failing_mark  # type: ignore[method-assign]


def test_a_write_that_fails_beside_other_events_is_set_aside_with_its_own(tmp_path: Path) -> None:
    store, pipeline, _transport, _folders = setup(tmp_path)
    poison(store)
    pipeline.process([answer(0, "$alice", "Borealis"), answer(0, "$poison", "Aurora", sender=BOB),
                      leave(ALICE, "$left"), answer(0, "$bob", "Australis", sender=BOB)])
    outcomes = dict(store.db.execute("SELECT event_id, outcome || ':' || COALESCE(reason, '') FROM answer_log"))
    # Alice answered before she left: her answer stands, judged with the
    # members the batch began with (not those it ended with the first time).
    assert outcomes == {"$alice": "accepted:", "$poison": "refused:internal_error", "$bob": "accepted:"}
    assert ALICE not in pipeline.members[ROOM]
    assert {row[0] for row in store.db.execute("SELECT event_id FROM processed")} >= {"$alice", "$poison", "$bob"}


def test_a_batch_handled_again_counts_each_outcome_once(tmp_path: Path) -> None:
    """The metrics hear a batch's outcomes once it is kept: a first pass that
    was undone (a part failed beside others) counts nothing."""
    store, pipeline, _transport, _folders = setup(tmp_path)
    observed: list[tuple[str, str]] = []
    pipeline.on_outcome = lambda entry: observed.append((entry.event_id, entry.outcome))
    troubles: list[tuple[str, str]] = []
    pipeline.on_trouble = lambda kind, reason: troubles.append((kind, reason))
    poison(store)
    pipeline.process([answer(0, "$alice", "Borealis"), answer(0, "$poison", "Aurora", sender=BOB),
                      answer(0, "$bob", "Australis", sender=BOB)])
    assert sorted(observed) == [("$alice", "accepted"), ("$bob", "accepted")]  # $poison: set aside
    assert troubles == [("event", "internal_error")]
