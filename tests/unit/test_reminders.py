"""Reminders: who is due (after, period, answered), what is sent, that the store remembers."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from bridge.protocol.recorded import RecordedQuestion
from bridge.service.config import ConfigError, parse_config, parse_duration
from bridge.service.operators.reminders import (REMINDER_KEY, due_reminders, remind_once, remind_set_now, reminder_content,
                                      reminder_loop)
from bridge.service.storage.store import LogEntry, PostedQuestion, Store

HOUR_MS = 3600 * 1000
DAY = 86400.0


def posted(event_id: str, posted_at: int, qid: str = "q", set_id: str = "s") -> PostedQuestion:
    return PostedQuestion(event_id, "!r", set_id, "/sets/s", qid, 1, f"Title {qid}", posted_at)


# -- the policy ------------------------------------------------------------------------


def test_a_question_is_due_only_once_it_has_waited_long_enough():
    q = posted("$q", 0)
    assert due_reminders([q], set(), {}, now_ms=23 * HOUR_MS, after_seconds=DAY, period_seconds=DAY) == []
    assert due_reminders([q], set(), {}, now_ms=24 * HOUR_MS, after_seconds=DAY, period_seconds=DAY) == [q]


def test_an_answered_question_is_never_due():
    q = posted("$q", 0)
    assert due_reminders([q], {"$q"}, {}, now_ms=99 * HOUR_MS, after_seconds=DAY, period_seconds=DAY) == []


def test_at_most_one_nudge_per_period():
    q = posted("$q", 0)
    last = {"$q": 24 * HOUR_MS}
    for hours in (24, 30, 47):
        assert due_reminders([q], set(), last, now_ms=hours * HOUR_MS, after_seconds=DAY, period_seconds=DAY) == []
    assert due_reminders([q], set(), last, now_ms=48 * HOUR_MS, after_seconds=DAY, period_seconds=DAY) == [q]


def test_after_and_every_are_independent():
    q = posted("$q", 0)
    # First nudge after 2 h, then every 30 min.
    assert due_reminders([q], set(), {}, now_ms=2 * HOUR_MS, after_seconds=7200, period_seconds=1800) == [q]
    last = {"$q": 2 * HOUR_MS}
    assert due_reminders([q], set(), last, now_ms=2 * HOUR_MS + 1_799_000, after_seconds=7200,
                         period_seconds=1800) == []
    assert due_reminders([q], set(), last, now_ms=2 * HOUR_MS + 1_800_000, after_seconds=7200,
                         period_seconds=1800) == [q]


def test_only_the_due_ones_come_back_in_order():
    old, fresh, answered, nudged = posted("$a", 0), posted("$b", 23 * HOUR_MS), posted("$c", 0), posted("$d", 0)
    due = due_reminders([old, fresh, answered, nudged], {"$c"}, {"$d": 30 * HOUR_MS}, now_ms=40 * HOUR_MS,
                        after_seconds=DAY, period_seconds=DAY)
    assert due == [old]


def test_the_reminder_is_a_notice_in_the_questions_thread():
    content = reminder_content(posted("$q", 0, qid="branch"))
    assert content["msgtype"] == "m.notice"
    assert "Title branch" in content["body"] and "reminder" in content["body"]
    assert content["m.relates_to"]["rel_type"] == "m.thread"
    assert content["m.relates_to"]["event_id"] == "$q"
    assert content["m.relates_to"]["m.in_reply_to"] == {"event_id": "$q"}
    assert content[REMINDER_KEY] == {"question_event_id": "$q", "set": "s", "qid": "branch"}


@pytest.mark.parametrize("text, seconds", [("30m", 1800), ("24h", 86400), ("2d", 172800), ("90s", 90),
                                           ("1w", 604800), ("45", 45), (" 1.5h ", 5400), (120, 120)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "5x", "-1h", "0", "h", True])
def test_bad_durations(text):
    with pytest.raises(ValueError):
        parse_duration(text)


BASE = {"homeserver": {"url": "http://127.0.0.1:8008"}, "bot": {"user_id": "@a:b", "access_token": "t"},
        "sets": {"root": "."}, "rooms": {"default": "!r"}, "store": {"path": "s.sqlite"}}


def test_the_reminders_section_defaults_off_and_parses_durations(tmp_path):
    config = parse_config(dict(BASE), base_dir=tmp_path, environ={})
    assert config.reminders.enabled is False
    assert config.reminders.after_seconds == DAY and config.reminders.every_seconds == DAY
    config = parse_config({**BASE, "reminders": {"enabled": True, "after": "30m", "every": "2d"}}, base_dir=tmp_path,
                          environ={})
    assert (config.reminders.after_seconds, config.reminders.every_seconds) == (1800, 2 * DAY)


def test_a_bad_reminder_duration_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match="reminders.every: must be a duration"):
        parse_config({**BASE, "reminders": {"every": "often"}}, base_dir=tmp_path, environ={})


# -- against the store -------------------------------------------------------------------


def record_question(store: Store, event_id: str, qid: str, posted_at: int, set_id: str = "s") -> None:
    content = {"elicitation_id": f"elc_{event_id}", "question": {"id": qid, "rev": 1, "title": f"Title {qid}"}}
    with store.transaction():
        store.record_posted(RecordedQuestion(event_id, "!r", set_id, content), set_dir=f"/sets/{set_id}",
                            posted_at=posted_at)


class FakeSend:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, dict, str]] = []

    async def __call__(self, room_id: str, event_type: str, content: dict, txn_id: str) -> str:
        self.sent.append((room_id, event_type, content, txn_id))
        return f"$sent{len(self.sent)}"


@pytest.mark.usefixtures("store_backend")
async def test_a_pass_nudges_due_questions_once_per_period_and_remembers_across_restarts(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    record_question(store, "$a", "a", posted_at=0)
    record_question(store, "$b", "b", posted_at=0)
    record_question(store, "$c", "c", posted_at=0)
    with store.transaction():  # b is answered, c is closed
        store.append_log(LogEntry("$ans", "!r", "@p:hs", "answer_event", "accepted", set_id="s", set_dir="/sets/s",
                                  qid="b", question_event_id="$b", record={"qid": "b", "text": "x", "q_rev": 1}))
        store.close_question("$c")
    send = FakeSend()
    assert await remind_once(store, send, after_seconds=DAY, period_seconds=DAY, now_ms=25 * HOUR_MS) == 1
    assert [(room, content[REMINDER_KEY]["qid"]) for room, _t, content, _x in send.sent] == [("!r", "a")]
    assert await remind_once(store, send, after_seconds=DAY, period_seconds=DAY, now_ms=30 * HOUR_MS) == 0
    store.close()

    store = Store(tmp_path / "s.sqlite")
    assert store.reminded() == {"$a": 25 * HOUR_MS}
    assert await remind_once(store, send, after_seconds=DAY, period_seconds=DAY, now_ms=40 * HOUR_MS) == 0
    assert await remind_once(store, send, after_seconds=DAY, period_seconds=DAY, now_ms=49 * HOUR_MS) == 1
    assert len(send.sent) == 2 and send.sent[0][3] != send.sent[1][3]  # a new nudge is a new transaction


@pytest.mark.usefixtures("store_backend")
async def test_a_withdrawn_answer_makes_the_question_due_again(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    record_question(store, "$a", "a", posted_at=0)
    with store.transaction():
        store.append_log(LogEntry("$ans", "!r", "@p:hs", "answer_event", "accepted", set_id="s", set_dir="/sets/s",
                                  qid="a", question_event_id="$a", record={"qid": "a", "text": "x", "q_rev": 1}))
    assert store.answered_question_events() == {"$a"}
    with store.transaction():
        store.withdraw("$ans")
    assert store.answered_question_events() == set()


@pytest.mark.usefixtures("store_backend")
async def test_remind_now_nudges_one_sets_unanswered_questions_whatever_the_timing(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    record_question(store, "$a", "a", posted_at=10**13)  # posted "now"
    record_question(store, "$x", "x", posted_at=0, set_id="other")
    send = FakeSend()
    from helpers.loopwatch import statements_on_the_loop

    on_loop = statements_on_the_loop(store)  # "!ask remind" read the store on the event loop
    assert await remind_set_now(store, send, "s", now_ms=10**13) == 1
    assert on_loop == []
    assert send.sent[0][2][REMINDER_KEY]["question_event_id"] == "$a"
    assert store.reminded() == {"$a": 10**13}
    # Asked again and again: ten commands in a second nudged it ten times.
    for n in range(1, 10):
        assert await remind_set_now(store, send, "s", now_ms=10**13 + 100 * n) == 0
    assert await remind_set_now(store, send, "s", now_ms=10**13 + 61_000) == 1
    assert len(send.sent) == 2


def test_a_reminder_quotes_at_most_a_short_title():
    content = reminder_content(SimpleNamespace(title="\U0001F600" * 10_000, event_id="$a", set_id="s", qid="a"))
    assert len(content["body"]) < 300 and "\u2026\u201d" in content["body"]


@pytest.mark.usefixtures("store_backend")
async def test_the_loop_survives_a_failing_send_and_stops_when_asked(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    record_question(store, "$a", "a", posted_at=0)
    calls = 0

    async def flaky(room_id, event_type, content, txn_id):
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("homeserver away")
        return "$ok"

    stop = asyncio.Event()
    task = asyncio.ensure_future(reminder_loop(store, flaky, stop, after_seconds=1, period_seconds=DAY,
                                               tick_seconds=0.05))
    for _ in range(100):
        if store.reminded():
            break
        await asyncio.sleep(0.02)
    stop.set()
    await asyncio.wait_for(task, 2)
    assert calls == 2 and "$a" in store.reminded()


def test_migrations_add_the_reminder_and_command_tables(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    tables = {row[0] for row in store.db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"reminders", "admin_command"} <= tables
    with store.transaction():
        store.mark_reminded("$q", 5)
        store.mark_reminded("$q", 7)
    assert store.reminded() == {"$q": 7}


def test_an_older_store_migrates_forward_keeping_its_rows(tmp_path):
    import sqlite3

    from bridge.service.storage.dialect import SQLITE
    from bridge.service.storage.schema import SCHEMA_VERSION, migration

    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path, isolation_level=None)
    for number in range(SCHEMA_VERSION - 1):
        for statement in migration(number, SQLITE):
            db.execute(statement)
        db.execute(f"PRAGMA user_version={number + 1}")
    db.execute("INSERT INTO meta(key, value) VALUES ('sync_token', 's1')")
    db.execute("INSERT INTO webhook_outbox (key, agent, url, body, created_at, next_at) "
               "VALUES ('k', 'a', 'https://h.example/in', '{}', 1, 1)")
    db.close()
    store = Store(path)
    assert store.get_meta("sync_token") == "s1"
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    # A row queued before it was recorded whether a set's callbacks named its URL: the agent's URL's, as it was.
    assert store.db.execute("SELECT key, callback FROM webhook_outbox").fetchall() == [("k", 0)]
    assert store.reminded() == {}
