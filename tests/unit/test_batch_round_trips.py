"""What a batch of answers costs on PostgreSQL, in waits for the server: a
fixed number for the batch, however many events it holds (see
docs/architecture.md, "A batch's round trips").  Every wait is a network
round trip, so a database a few milliseconds away multiplies them."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import bridge.answers.file as answers_file
from bridge.service.answering.pipeline import Pipeline
from bridge.service.storage.leader import Lease
from bridge.service.storage.store import Store
from helpers import timeline
from helpers.pgstore import on_postgresql, round_trips
from helpers.timeline import PEOPLE, Room
from test_isolation_parts import ALICE, BOB, BOT, OTHER_ROOM, ROOM, Transport, answer, setup
from test_leader import wait_for

THIRD_ROOM = "!third:hs"


def written(folder: Path) -> dict:
    return json.loads((folder / "answers.json").read_text())["answers"]["name"]


def noted_writes(monkeypatch, waits: list[int]) -> list[int]:
    """The waits counted so far each time an answers.json is written."""
    noted: list[int] = []
    replace = answers_file.replace_whole

    def note(path, data):
        noted.append(waits[0])
        replace(path, data)

    monkeypatch.setattr(answers_file, "replace_whole", note)
    return noted


def restarted(tmp_path: Path, store: Store, rooms: tuple[str, ...]) -> tuple[Store, Pipeline]:
    """The same store as a new process opens it (nothing known of the postings), and its pipeline."""
    store.close()
    store = Store(tmp_path / "bridge.sqlite")
    pipeline = Pipeline(store=store, transport=Transport(), answerers=None, own_users=lambda u: u == BOT)
    for room in rooms:
        asyncio.run(pipeline.load_members(room))
    return store, pipeline


def test_a_question_this_process_posted_is_answered_with_a_wait_fewer(tmp_path, monkeypatch, postgres_server):
    """What the bridge records of a posting it made (the posting, its
    question's count, its poll) is what later batches take, once the
    posting's transaction is kept: a question's first answer (most are
    answered once) waits as often as one to a question answered before."""
    on_postgresql(monkeypatch, postgres_server)
    store, pipeline, _transport, folders = setup(tmp_path)  # posts the question
    waits = round_trips(monkeypatch)
    before_write = noted_writes(monkeypatch, waits)
    pipeline.process([answer(0, "$first", "first")])
    assert before_write == [2]  # the condition with the writes and the COMMIT; the log's origin (no key here)
    assert written(folders[ROOM])["rev"] == 1


def test_a_batch_waits_for_the_database_a_fixed_number_of_times(tmp_path, monkeypatch, postgres_server):
    on_postgresql(monkeypatch, postgres_server)
    store, pipeline, _transport, folders = setup(tmp_path, rooms=(ROOM, OTHER_ROOM, THIRD_ROOM))
    # Each statement's translation worked out once, and each set written once.
    pipeline.process([answer(0, "$warm0", "first")])
    pipeline.process([answer(1, "$warm1", "first", room=OTHER_ROOM)])
    # A start: nothing known of the postings.
    store, pipeline = restarted(tmp_path, store, (ROOM, OTHER_ROOM, THIRD_ROOM))
    waits = round_trips(monkeypatch)
    before_write = noted_writes(monkeypatch, waits)
    pipeline.process([answer(1, "$one", "alone", sender=BOB, room=OTHER_ROOM)])
    # A question no batch has looked up yet: BEGIN with the batch's look-ups
    # (its postings and their counts too); the entry, its leaf, its marks and
    # RELEASE, with what the flush starts from, the record to write and the
    # COMMIT; the log's origin (not kept here: no key); answers.json; the
    # flush's end.
    assert before_write == [3] and waits[0] == 4
    assert written(folders[OTHER_ROOM])["rev"] == 2
    waits[0], before_write[:] = 0, []
    pipeline.process([answer(1, "$two", "again", sender=ALICE, room=OTHER_ROOM)])
    # A question the batch before looked up: its posting and count taken from
    # that batch, its event taken as new, and that condition sent with the
    # writes and the COMMIT (``guesses``): one wait fewer before answers.json.
    assert before_write == [2] and waits[0] == 3
    waits[0], before_write[:] = 0, []
    pipeline.process([answer(1, f"$more{n}", f"answer {n}", sender=ALICE if n % 2 else BOB, room=OTHER_ROOM)
                      for n in range(50)])
    assert before_write == [2] and waits[0] == 3  # each answer's writes go with the flush's reads
    assert written(folders[OTHER_ROOM])["rev"] == 53


def delivering(store: Store, pipeline: Pipeline):
    """Appservice transactions into ``pipeline``, as the transaction server hands them over."""
    def deliver(txn: str, events: list) -> object:
        return pipeline.process(events, commit=lambda: store.mark_txn(txn), delivery=txn)
    return deliver


def test_an_appservice_transaction_costs_no_wait_more_and_is_taken_once(tmp_path, monkeypatch, postgres_server):
    """Whether the transaction was taken before is read with the batch's
    look-ups and marked with its commit: the same waits as a sync's batch."""
    on_postgresql(monkeypatch, postgres_server)
    store, pipeline, _transport, folders = setup(tmp_path)
    deliver = delivering(store, pipeline)

    deliver("t0", [answer(0, "$warm", "first")])
    waits = round_trips(monkeypatch)
    assert not deliver("t1", [answer(0, "$one", "alone", sender=BOB)]).repeated
    assert waits[0] == 3  # as a sync's batch answering the same question
    waits[0] = 0
    # The homeserver sends it again (the 200 was lost), holding an answer it
    # did not hold the first time: nothing of it is handled.
    assert deliver("t1", [answer(0, "$other", "changed", sender=BOB)]).repeated
    # Taken as new with the rest, it fails that condition on the server (its
    # writes with it); ROLLBACK; read again: the look-ups, then the empty
    # transaction's COMMIT.
    assert waits[0] == 4
    assert written(folders[ROOM])["rev"] == 2
    assert store.db.execute("SELECT COUNT(*) FROM answer_log WHERE event_id='$other'").fetchone()[0] == 0
    assert store.txn_seen("t1") and not store.txn_seen("t2")


def test_the_leaders_fence_costs_no_wait_more(tmp_path, monkeypatch, postgres_server):
    """Under the leader's lease each transaction reads the lease row with its
    BEGIN, and the flush's end, whose first wait is its COMMIT, sends the
    COMMIT with it: the row missing fails on the server, so nothing commits
    unchecked (``tests/unit/test_leader.py``)."""
    on_postgresql(monkeypatch, postgres_server)
    store, pipeline, _transport, folders = setup(tmp_path)
    lease = Lease(store.db.url, postgres_server.password, ttl=30)
    lease.start()
    try:
        wait_for(lambda: lease.leading)
        lease.guard_store(store)
        pipeline.process([answer(0, "$warm", "first")])
        waits = round_trips(monkeypatch)
        pipeline.process([answer(0, "$one", "alone", sender=BOB)])
        assert waits[0] == 3  # as without a lease
        assert written(folders[ROOM])["rev"] == 2
    finally:
        lease.stop()


def member(user: str, event_id: str) -> dict:
    return {"type": "m.room.member", "event_id": event_id, "room_id": ROOM, "sender": user, "state_key": user,
            "origin_server_ts": 2000, "content": {"membership": "join"}}


def test_a_batch_between_two_answers_keeps_what_the_first_knew(tmp_path, monkeypatch, postgres_server):
    """A batch that names no posting (a member joining; in appservice mode
    the bridge's own acknowledgements) does not make the next answer read
    its question's posting again."""
    on_postgresql(monkeypatch, postgres_server)
    store, pipeline, _transport, folders = setup(tmp_path)
    pipeline.process([answer(0, "$warm", "first")])
    pipeline.process([member("@carol:hs", "$joined")])
    waits = round_trips(monkeypatch)
    before_write = noted_writes(monkeypatch, waits)
    pipeline.process([answer(0, "$next", "again", sender=BOB)])
    assert before_write == [2] and waits[0] == 3  # taken, as right after the first
    assert written(folders[ROOM])["rev"] == 2


def acknowledgement(event_id: str, answer_id: str) -> dict:
    """The bridge's own reaction to an answer, as appservice mode gets it back."""
    return {"type": "m.reaction", "event_id": event_id, "room_id": ROOM, "sender": BOT, "origin_server_ts": 3000,
            "content": {"m.relates_to": {"rel_type": "m.annotation", "event_id": answer_id, "key": "✅"}}}


def test_the_bridges_own_events_cost_no_read(tmp_path, monkeypatch, postgres_server):
    """Appservice mode gets the bridge's acknowledgements back, each relating
    to a new answer.  They are never judged, so they are never looked up by
    posting: a transaction of them waits as an answer's does, not once more
    to read what they relate to, and the answer's transaction queued behind
    it (the homeserver sends one at a time) waits no longer for it."""
    on_postgresql(monkeypatch, postgres_server)
    _store, pipeline, _transport, folders = setup(tmp_path)
    pipeline.process([answer(0, "$warm", "first")])
    waits = round_trips(monkeypatch)
    pipeline.process([acknowledgement("$ack1", "$warm")])
    assert waits[0] == 1  # the guess, with the flush's reads and the COMMIT (nothing to write)
    waits[0] = 0
    before_write = noted_writes(monkeypatch, waits)
    pipeline.process([answer(0, "$next", "again", sender=BOB)])
    assert before_write == [2] and waits[0] == 3  # as right after the first: its guess still stands
    assert written(folders[ROOM])["rev"] == 2


def test_an_appservice_transaction_of_the_bridges_own_events_waits_once(tmp_path, monkeypatch, postgres_server):
    """Appservice mode gets its own events back, about two transactions an
    answer, one at a time: an answer sent meanwhile queues behind them.
    Such a transaction changes nothing, so it is marked taken with its
    batch's COMMIT, not in a transaction of its own after the flush."""
    on_postgresql(monkeypatch, postgres_server)
    store, pipeline, _transport, folders = setup(tmp_path)
    deliver = delivering(store, pipeline)

    deliver("t0", [answer(0, "$warm", "first")])
    waits = round_trips(monkeypatch)
    assert not deliver("t1", [acknowledgement("$ack1", "$warm")]).repeated
    assert waits[0] == 1  # the guess, the mark, the flush's reads and the COMMIT
    assert store.txn_seen("t1")
    assert deliver("t1", [acknowledgement("$ack1", "$warm")]).repeated  # sent again: taken once
    waits[0] = 0
    before_write = noted_writes(monkeypatch, waits)
    assert not deliver("t2", [answer(0, "$next", "again", sender=BOB)]).repeated
    assert before_write == [2] and waits[0] == 3  # an answer's transaction: marked after its answers.json
    assert written(folders[ROOM])["rev"] == 2 and store.txn_seen("t2")


def test_a_question_first_answered_after_a_start_costs_no_wait_more(tmp_path, monkeypatch, postgres_server):
    """A question's posting is read with what the bridge keeps parsed of it
    (its content): a question answered for the first time since the start
    waits as often as any question read, not once more to read its content."""
    on_postgresql(monkeypatch, postgres_server)
    store, _pipeline, _transport, folders = setup(tmp_path)
    with store.transaction():
        store.set_meta("audit_origin", "example.org/askwright-bridge/bot")  # as the first start with a key does
    store, pipeline = restarted(tmp_path, store, (ROOM,))
    store.audit_origin()  # read once a process, at its start (``open_log``)
    waits = round_trips(monkeypatch)
    before_write = noted_writes(monkeypatch, waits)
    pipeline.process([answer(0, "$first", "first")])
    assert before_write == [2]  # the look-ups; the writes, the flush's reads and the COMMIT
    assert written(folders[ROOM])["rev"] == 1


def test_a_poll_vote_waits_as_an_answer_does(tmp_path, monkeypatch, postgres_server):
    """A vote asks whether the person took their votes back later in the
    room (an empty vote, read before it): that is known with the batch's
    look-ups, read or taken, not asked mid-judging in a round trip of its
    own before answers.json can be written."""
    on_postgresql(monkeypatch, postgres_server)
    room = Room(tmp_path)
    room.deliver([timeline.answer("$warm", PEOPLE[2], 1000, "main")])
    room.crash()  # a start: nothing known carries over
    waits = round_trips(monkeypatch)
    before_write = noted_writes(monkeypatch, waits)
    room.deliver([timeline.vote("$v1", PEOPLE[0], 1001, ["main"])])
    assert before_write == [3]  # read with the batch's look-ups
    waits[0], before_write[:] = 0, []
    room.deliver([timeline.vote("$v2", PEOPLE[1], 1002, ["stable"])])
    assert before_write == [2]  # taken from the batch before, checked with the writes
    assert room.record()["rev"] == 3
