"""The SQLite store: migrations, the answer log's projection, exactly-once bookkeeping."""

from __future__ import annotations

import pytest

from bridge.protocol.recorded import RecordedQuestion
from bridge.service.storage.store import SCHEMA_VERSION, LogEntry, PostingConflict, Store, StoreVersionError

pytestmark = pytest.mark.usefixtures("store_backend")  # every test on SQLite and on PostgreSQL


def question(event_id="$q", qid="branch", rev=1) -> RecordedQuestion:
    content = {"elicitation_id": f"elc_{event_id}", "question": {"id": qid, "rev": rev, "title": "T"}}
    return RecordedQuestion(event_id=event_id, room_id="!r", set_id="s", content=content)


def accepted(store: Store, event_id: str, choice: str) -> None:
    with store.transaction():
        store.append_log(LogEntry(event_id, "!r", "@p:hs", "answer_event", "accepted", set_id="s", set_dir="/sets/s",
                                  qid="branch", question_event_id="$q",
                                  record={"qid": "branch", "choice": choice, "q_rev": 1, "rev": 1}))
        store.mark_processed(event_id, "accepted")


def test_a_new_store_is_at_the_current_schema(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_a_store_from_a_newer_version_is_refused(tmp_path):
    path = tmp_path / "s.sqlite"
    store = Store(path)
    store.db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    store.close()
    with pytest.raises(StoreVersionError, match="newer askwright-bridge"):
        Store(path)
    with pytest.raises(StoreVersionError, match="newer askwright-bridge"):
        Store.read_only(path)


def test_reopening_keeps_everything(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    with store.transaction():
        store.record_posted(question(), set_dir="/sets/s", posted_at=1)
        store.set_meta("sync_token", "s1")
    store.close()
    again = Store(tmp_path / "s.sqlite")
    assert again.question_by_elicitation("elc_$q").event_id == "$q"
    assert again.get_meta("sync_token") == "s1"


def test_projection_is_the_latest_answer_and_rev_counts_them(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    accepted(store, "$a1", "main")
    accepted(store, "$a2", "stable")
    record = store.projection("/sets/s", "branch")
    assert (record["choice"], record["rev"]) == ("stable", 2)


def test_a_withdrawal_falls_back_to_the_previous_answer_then_to_none(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    accepted(store, "$a1", "main")
    accepted(store, "$a2", "stable")
    with store.transaction():
        assert store.withdraw("$a2") == ("/sets/s", "s", "branch")
    assert store.projection("/sets/s", "branch")["choice"] == "main"
    with store.transaction():
        store.withdraw("$a1")
    assert store.projection("/sets/s", "branch") is None
    with store.transaction():
        assert store.withdraw("$a1") is None


def test_accepted_answers_mark_their_question_dirty_until_flushed(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    accepted(store, "$a1", "main")
    assert store.dirty() == [("/sets/s", "s", "branch")]
    with store.transaction():
        store.clear_dirty(store.dirty())
    assert store.dirty() == []
    assert store.is_processed("$a1") and not store.is_processed("$a2")


def test_a_failed_transaction_leaves_nothing(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    with pytest.raises(RuntimeError):
        with store.transaction():
            store.mark_processed("$a1", "accepted")
            raise RuntimeError("disk full")
    assert not store.is_processed("$a1")


def test_a_posting_that_clashes_is_refused_as_a_conflict_and_its_transaction_undone(tmp_path):
    # On PostgreSQL the failed insert aborted the transaction, so the lookup of
    # the clash failed too: a store error instead of the conflict the poster handles.
    store = Store(tmp_path / "s.sqlite")
    with store.transaction():
        store.record_posted(question("$q"), set_dir="/sets/s", posted_at=1)
    clash = RecordedQuestion(event_id="$new", room_id="!r", set_id="s", content=question("$q").content)
    with pytest.raises(PostingConflict, match=r"clashes with the posting already recorded: \$q of /sets/s/branch"):
        with store.transaction():
            store.mark_processed("$a1", "accepted")
            store.record_posted(clash, set_dir="/sets/s", posted_at=2)
    assert not store.is_processed("$a1") and store.count_posted() == 1


def test_no_entries_are_no_pending_notice(tmp_path):
    assert Store(tmp_path / "s.sqlite").notice_pending([]) is False


def test_postings_and_held_sets_of_one_moment_are_listed_in_the_order_they_came(tmp_path):
    # On PostgreSQL an updated row (the poll set after the posting, a set held
    # again) moves in the table, and ties came back in the table's order.
    store = Store(tmp_path / "s.sqlite")
    with store.transaction():
        for event_id, qid in (("$q1", "first"), ("$q2", "second"), ("$q3", "third")):
            store.record_posted(question(event_id, qid=qid), set_dir="/sets/s", posted_at=5)
        store.set_poll("$q1", "$poll1")
        store.hold_set("/sets/b", "b", "unwritable", 7)
        store.hold_set("/sets/a", "a", "unwritable", 7)
        store.hold_set("/sets/b", "b", "unwritable", 7)
    assert [posting.event_id for posting in store.open_posted()] == ["$q1", "$q2", "$q3"]
    assert [held[0] for held in store.held_sets()] == ["/sets/b", "/sets/a"]


def test_rows_read_back_are_the_entries_and_postings_written(tmp_path):
    """Rows are mapped to entries and postings by their columns' names: every
    field a read carries comes back as it was written."""
    store = Store(tmp_path / "s.sqlite")
    written = LogEntry("$a1", "!r", "@p:hs", "answer_event", "accepted", set_id="s", set_dir="/sets/s", qid="branch",
                       question_event_id="$q", layer="l", reason="why", message="m",
                       record={"qid": "branch", "choice": "main", "q_rev": 1, "rev": 1}, ts=5, replaces="$a0",
                       carry_note="kept", thread_root="$root")
    with store.transaction():
        store.record_posted(question(), set_dir="/sets/s", posted_at=1)
        seq = store.append_log(written)
    assert store.log_entry(seq) == LogEntry(**{**written.__dict__, "carry_note": None})
    assert store.accepted_answer("$a1") == LogEntry("$a1", "!r", "@p:hs", "answer_event", "accepted", set_id="s",
                                                    set_dir="/sets/s", qid="branch", question_event_id="$q",
                                                    record=written.record, ts=5)
    assert store.postings("/sets/s", "branch") == [question()]
    assert store.posted_for_set("/sets/s") == [(question(), None)]
    with store.transaction():
        store.close_question("$q", "superseded")
    assert store.latest_posted("/sets/s", "branch") == RecordedQuestion(
        event_id="$q", room_id="!r", set_id="s", content=question().content, open=False, closed_why="superseded")
