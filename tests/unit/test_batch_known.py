"""A batch's events are looked up at once (``Store.know_batch``) and the
store keeps what it read up to date while the batch is judged: whatever the
events (answers, edits before or after what they edit, redactions before or
after their target, notes, poll votes, the same event twice, a stranger's
redaction), one batch leaves the same record (its rev too), answer log and
answer-log leaves as delivering them one at a time."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.timeline import MODERATOR, PEOPLE, Room, answer, dumps, edit, note, redact, vote

pytestmark = pytest.mark.usefixtures("store_backend")  # on SQLite and on PostgreSQL

PICKS = ("main", "stable")


@st.composite
def timelines(draw: Any) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for n in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["answer", "edit", "redact", "note", "vote", "again"]))
        sender = draw(st.sampled_from([*PEOPLE[:2], MODERATOR]))
        ts = 1000 + draw(st.integers(0, 20))
        # Targets may be events still to come (read before their target) or unknown.
        target = f"$e{max(0, n + draw(st.integers(-3, 3)))}"
        if kind == "answer":
            events.append(answer(f"$e{n}", sender, ts, draw(st.sampled_from(PICKS))))
        elif kind == "edit":
            events.append(edit(f"$e{n}", sender, ts, target, draw(st.sampled_from(PICKS))))
        elif kind == "redact":
            events.append(redact(f"$e{n}", sender, ts, target))
        elif kind == "note":
            events.append(note(f"$e{n}", sender, ts, f"note {n}"))
        elif kind == "vote":
            events.append(vote(f"$e{n}", sender, ts, draw(st.sampled_from([[], ["main"], ["stable"]]))))
        elif events:
            events.append(dict(draw(st.sampled_from(events))))  # the same event delivered twice
    return events


def outcome(room: Room) -> tuple[str, list[tuple], list[tuple]]:
    # Not its time: each write is stamped later than the one before it (a
    # millisecond past it on this fixed clock), and one event at a time makes more.
    record = {k: v for k, v in (room.record() or {}).items() if k != "updated"} or None
    log = room.store.db.execute(
        "SELECT event_id, sender, outcome, reason, record, withdrawn, shadowed, replaces FROM answer_log"
        " ORDER BY seq").fetchall()
    leaves = room.store.db.execute("SELECT idx, leaf FROM audit_leaf ORDER BY idx").fetchall()
    return dumps(record), [tuple(r) for r in log], [tuple(r) for r in leaves]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=timelines())
def test_one_batch_leaves_what_one_event_at_a_time_leaves(events: list[dict[str, Any]]) -> None:
    base = Path(tempfile.mkdtemp())
    try:
        (base / "batch").mkdir()
        (base / "single").mkdir()
        together, apart = Room(base / "batch"), Room(base / "single")
        for room in (together, apart):
            room.pipeline.clock = lambda: "2026-12-03T12:00:00.000Z"  # the time records are written at
        together.deliver(events)
        for event in events:
            apart.deliver([event])
        assert outcome(together) == outcome(apart)
        together.store.close()
        apart.store.close()
    finally:
        shutil.rmtree(base)


def test_what_a_batch_knows_is_its_own_thread_s_until_its_transaction_ends(tmp_path: Path) -> None:
    """A coroutine on the event loop asking while a batch runs on the store's
    thread waits for the batch to end, as its statements do, and sees what was
    committed: not the batch's marks, which may still be rolled back."""
    import asyncio
    import threading

    room = Room(tmp_path)
    store = room.store
    inside, go_on = threading.Event(), threading.Event()

    def batch() -> None:
        try:
            with store.transaction(flush=False):
                store.know_batch(["$x"])
                with store.savepoint():
                    store.mark_processed("$x", "accepted")
                inside.set()
                go_on.wait(5)
                raise RuntimeError("the batch fails: rolled back")
        except RuntimeError:
            pass

    async def main() -> bool:
        job = asyncio.ensure_future(store.run(batch))
        await asyncio.get_running_loop().run_in_executor(None, inside.wait, 5)
        threading.Timer(0.3, go_on.set).start()
        seen = store.is_processed("$x")  # on the loop's thread, while the batch's transaction is open
        await job
        return seen

    assert asyncio.run(main()) is False
    store.close()
