"""Management commands: the parser, the handler (admins and everyone else), the dispatcher."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bridge.wholefile import TEMP_MARK
from bridge.protocol.recorded import RecordedQuestion
from bridge.service.operators.admin import (CLOSE, HELP, INVALID, MAX_COMMAND_AGE_MS, POST, REMIND, STATUS, AdminContext,
                                  AdminDispatcher, Command, close_in_file, describe_post, handle, is_command,
                                  parse_command, reply_content)
from bridge.service.posting.poster import PostReport
from bridge.service.storage.store import Store

ADMIN = "@admin:hs"
STRANGER = "@someone:hs"


# -- the parser ----------------------------------------------------------------------


@pytest.mark.parametrize("body, expected", [
    ("!ask", Command(HELP)),
    ("!ask help", Command(HELP)),
    ("!ASK Help", Command(HELP)),
    ("  !ask   status  ", Command(STATUS)),
    ("!ask post release", Command(POST, set_id="release")),
    ("!ask close release branch", Command(CLOSE, set_id="release", qid="branch")),
    ("!ask remind release", Command(REMIND, set_id="release")),
    ("!ask\tpost\trelease", Command(POST, set_id="release")),
    # Set ids and question ids keep their case; only the verb is folded.
    ("!ask close Release Branch", Command(CLOSE, set_id="Release", qid="Branch")),
    # A reply: the quoted fallback is skipped, the first line of the reply read.
    ("> <@alice:hs> Which branch?\n> more\n\n!ask close release branch", Command(CLOSE, set_id="release",
                                                                                 qid="branch")),
    # A name typed as code (Element sends the backticks in the body) or quoted.
    ("!ask close `release` `branch`", Command(CLOSE, set_id="release", qid="branch")),
    ("!ask post \"release\"", Command(POST, set_id="release")),
    ("!ask remind “release”", Command(REMIND, set_id="release")),
    ("!ask post `release", Command(POST, set_id="`release")),
    # Only the first line counts: what follows is commentary.
    ("!ask post release\nplease, the old one was wrong", Command(POST, set_id="release")),
])
def test_commands_are_parsed(body, expected):
    assert parse_command(body) == expected


@pytest.mark.parametrize("body", ["", "   ", "hello", "ask help", "!askhelp", "!ask-help", "please !ask help",
                                  "> !ask help", None, 42, {"body": "!ask help"}])
def test_what_is_not_a_command_is_none(body):
    assert parse_command(body) is None


@pytest.mark.parametrize("body, words", [
    ("!ask frobnicate", "no command “frobnicate”"),
    ("!ask post", "!ask post <set>"),
    ("!ask post a b", "!ask post <set>"),
    ("!ask close release", "!ask close <set> <question>"),
    ("!ask close a b c", "!ask close <set> <question>"),
    ("!ask remind", "!ask remind <set>"),
    ("!ask status now", "!ask status"),
    ("!ask help me", "!ask help"),
])
def test_a_malformed_command_is_invalid_and_says_the_right_form(body, words):
    command = parse_command(body)
    assert command is not None and command.verb == INVALID
    assert words in command.problem


def test_is_command_looks_at_room_messages_only():
    assert is_command({"type": "m.room.message", "content": {"msgtype": "m.text", "body": "!ask status"}})
    assert is_command({"type": "m.room.message", "content": {"body": "!ask nonsense"}})  # invalid is still ours
    assert not is_command({"type": "m.room.message", "content": {"body": "stable, please"}})
    assert not is_command({"type": "m.reaction", "content": {"body": "!ask status"}})
    assert not is_command({"type": "m.room.message", "content": "!ask status"})
    assert not is_command("!ask status")


# -- the handler -----------------------------------------------------------------------


QUESTIONS = {
    "askwright": 1, "id": "release", "title": "Release", "x-extra": {"kept": True},
    "questions": [
        {"id": "branch", "kind": "choice", "title": "Branch", "question": "Which branch?",
         "why": "It decides where the release is cut.",
         "guess": {"option": "main", "why": "As last time.", "confidence": "low"},
         "options": [{"id": "main", "label": "Main"}, {"id": "stable", "label": "Stable"}]},
        {"id": "name", "kind": "text", "title": "Name", "question": "What name?", "status": "withdrawn",
         "reason": "not needed", "why": "It names the release.",
         "guess": {"text": "Aurora", "why": "The theme.", "confidence": "low"}},
    ],
}


@pytest.fixture
def sets_root(tmp_path: Path) -> Path:
    root = tmp_path / "sets"
    folder = root / "release-folder"
    folder.mkdir(parents=True)
    (folder / "questions.json").write_text(json.dumps(QUESTIONS))
    return root


class Calls:
    def __init__(self) -> None:
        self.posted: list[Path] = []
        self.reminded: list[str] = []
        self.remind_count = 2

    async def post_set(self, set_dir: Path) -> str:
        self.posted.append(set_dir)
        return "Posted 1 question."

    async def remind_set(self, set_id: str) -> int:
        self.reminded.append(set_id)
        return self.remind_count


@pytest.fixture
def ctx(tmp_path, sets_root, store_backend):
    calls = Calls()
    store = Store(tmp_path / "s.sqlite")
    context = AdminContext(admins=frozenset({ADMIN}), sets_root=sets_root, store=store, post_set=calls.post_set,
                           remind_set=calls.remind_set)
    context.calls = calls
    yield context
    store.close()


@pytest.mark.parametrize("body", ["!ask", "!ask help", "!ask status", "!ask post release",
                                  "!ask close release branch", "!ask remind release", "!ask nonsense"])
async def test_everyone_but_an_admin_is_refused_and_nothing_happens(ctx, sets_root, body):
    reply = await handle(parse_command(body), STRANGER, ctx)
    assert "only the bridge's admins" in reply
    assert ctx.calls.posted == [] and ctx.calls.reminded == []
    assert json.loads((sets_root / "release-folder" / "questions.json").read_text()) == QUESTIONS


async def test_with_no_admins_configured_nobody_may(ctx):
    ctx.admins = frozenset()
    assert "only the bridge's admins" in await handle(parse_command("!ask help"), ADMIN, ctx)


async def test_help_lists_every_command(ctx):
    reply = await handle(parse_command("!ask help"), ADMIN, ctx)
    for form in ("!ask help", "!ask status", "!ask post <set>", "!ask close <set> <question>", "!ask remind <set>"):
        assert form in reply


async def test_an_invalid_command_gets_the_right_form(ctx):
    reply = await handle(parse_command("!ask close release"), ADMIN, ctx)
    assert "!ask close <set> <question>" in reply and "!ask help" in reply


async def test_status_is_the_status_table(ctx, sets_root):
    content = {"elicitation_id": "elc_1", "question": {"id": "branch", "rev": 1, "title": "Branch"}}
    with ctx.store.transaction():
        ctx.store.record_posted(RecordedQuestion("$q", "!r", "release", content),
                                set_dir=str((sets_root / "release-folder").resolve()), posted_at=1)
    reply = await handle(parse_command("!ask status"), ADMIN, ctx)
    header, row = reply.splitlines()
    assert header.split() == ["SET", "POSTED", "OPEN", "ANSWERED", "UNSURE", "NOTES", "PENDING", "EXPIRED", "STALE"]
    assert row.split() == ["release", "1", "1", "0", "0", "0", "1", "0", "0"]


async def test_post_finds_the_set_by_id_and_asks_the_poster(ctx, sets_root):
    reply = await handle(parse_command("!ask post release"), ADMIN, ctx)
    assert reply == "Posted 1 question."
    assert ctx.calls.posted == [sets_root / "release-folder"]


async def test_a_set_can_be_named_by_its_folder_too(ctx, sets_root):
    await handle(parse_command("!ask post release-folder"), ADMIN, ctx)
    assert ctx.calls.posted == [sets_root / "release-folder"]


@pytest.mark.parametrize("body", ["!ask post nope", "!ask close nope branch", "!ask remind nope"])
async def test_an_unknown_set_is_said_so(ctx, body):
    reply = await handle(parse_command(body), ADMIN, ctx)
    assert "no set “nope”" in reply
    assert ctx.calls.posted == [] and ctx.calls.reminded == []


async def test_close_sets_the_status_in_questions_json_and_keeps_everything_else(ctx, sets_root):
    path = sets_root / "release-folder" / "questions.json"
    reply = await handle(parse_command("!ask close release branch"), ADMIN, ctx)
    assert "Closed “branch”" in reply
    after = json.loads(path.read_text())
    expected = json.loads(json.dumps(QUESTIONS))
    expected["questions"][0]["status"] = "closed"
    assert after == expected
    assert not [p for p in path.parent.iterdir() if TEMP_MARK in p.name]
    again = await handle(parse_command("!ask close release branch"), ADMIN, ctx)
    assert again == "“branch” is already closed."


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o664])
async def test_close_keeps_the_questions_file_as_readable_as_the_agent_made_it(ctx, sets_root, mode):
    # A private questions.json (0600) came back 0644, for anyone on the machine to read.
    path = sets_root / "release-folder" / "questions.json"
    path.chmod(mode)
    assert "Closed “branch”" in await handle(parse_command("!ask close release branch"), ADMIN, ctx)
    assert path.stat().st_mode & 0o777 == mode


async def test_a_command_on_a_set_id_two_folders_hold_acts_on_the_folder_that_posted(ctx, sets_root):
    # "a-new" sorts first, "release-folder" posted: the close went to "a-new",
    # which the bridge refuses as a second folder of the set, and the question
    # stayed open in the room.
    import os

    newcomer = sets_root / "a-new"
    newcomer.mkdir()
    (newcomer / "questions.json").write_text(json.dumps(QUESTIONS))
    posted = sets_root / "release-folder"
    with ctx.store.transaction():
        ctx.store.record_posted(RecordedQuestion(event_id="$q", room_id="!r", set_id="release",
                                                 content={"elicitation_id": "elc_b", "question": {"id": "branch", "rev": 1}}),
                                set_dir=os.path.realpath(posted), posted_at=1)
    reply = await handle(parse_command("!ask close release branch"), ADMIN, ctx)
    assert "release-folder" in reply, reply
    assert json.loads((posted / "questions.json").read_text())["questions"][0]["status"] == "closed"
    assert json.loads((newcomer / "questions.json").read_text()) == QUESTIONS
    await handle(parse_command("!ask post release"), ADMIN, ctx)
    assert ctx.calls.posted == [posted]


async def test_close_refuses_unknown_and_no_longer_open_questions(ctx, sets_root):
    before = (sets_root / "release-folder" / "questions.json").read_bytes()
    assert "no question “nope”" in await handle(parse_command("!ask close release nope"), ADMIN, ctx)
    assert await handle(parse_command("!ask close release name"), ADMIN, ctx) == "“name” is already withdrawn."
    assert (sets_root / "release-folder" / "questions.json").read_bytes() == before


def test_close_reports_an_unreadable_questions_file(tmp_path):
    (tmp_path / "questions.json").write_text("{ not json")
    assert "can't be read" in close_in_file(tmp_path, "branch")


def test_close_writes_through_a_symlinked_questions_file_to_the_file_it_names(tmp_path):
    """The link was replaced by a copy: the agent's own file (the link's
    target) stayed open, and the set no longer saw what the agent wrote."""
    import os

    (tmp_path / "questions.v2.json").write_text(json.dumps(QUESTIONS))
    os.symlink("questions.v2.json", tmp_path / "questions.json")
    qid = next(q["id"] for q in QUESTIONS["questions"] if q.get("status", "open") == "open")
    assert close_in_file(tmp_path, qid).startswith("Closed")
    assert (tmp_path / "questions.json").is_symlink()
    closed = json.loads((tmp_path / "questions.v2.json").read_text())
    assert next(q for q in closed["questions"] if q["id"] == qid)["status"] == "closed"
    # A link out of the set folder is not written through.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "questions.json").write_text(json.dumps(QUESTIONS))
    inside = tmp_path / "linked"
    inside.mkdir()
    os.symlink(elsewhere / "questions.json", inside / "questions.json")
    assert "outside the set folder" in close_in_file(inside, qid)
    assert json.loads((elsewhere / "questions.json").read_text()) == QUESTIONS


async def test_remind_counts_what_was_sent(ctx, sets_root):
    assert await handle(parse_command("!ask remind release"), ADMIN, ctx) == "Sent 2 reminders for “release”."
    assert ctx.calls.reminded == ["release"]
    ctx.calls.remind_count = 0
    # Nothing posted (its room refuses the bot, it fails lint): not "every question has an answer".
    told = await handle(parse_command("!ask remind release"), ADMIN, ctx)
    assert told.startswith("Nothing to remind about: no question of “release” is open in a room"), told
    content = {"elicitation_id": "elc_1", "question": {"id": "branch", "rev": 1, "title": "Branch"}}
    with ctx.store.transaction():
        ctx.store.record_posted(RecordedQuestion("$q", "!r", "release", content),
                                set_dir=str((sets_root / "release-folder").resolve()), posted_at=1)
    told = await handle(parse_command("!ask remind release"), ADMIN, ctx)
    assert told == "Nothing to remind about: every open question of “release” has an answer."


def test_a_post_report_reads_as_a_sentence():
    assert describe_post(PostReport(posted=["s/a@1", "s/b@1"], closed=["s/c@1"])) == \
        "Posted 2 questions, closed 1."
    assert describe_post(PostReport(posted=["s/a@1"])) == "Posted 1 question."
    assert describe_post(PostReport()).startswith("Nothing to post")
    assert "fails lint" in describe_post(PostReport(broken={"/s": ["questions[0].kind: bad"]}))


def test_a_reply_quotes_the_command_and_keeps_a_table_in_pre():
    plain = reply_content("Done.", "$cmd")
    # A status table names people: it pings none of them.
    assert plain == {"msgtype": "m.notice", "body": "Done.", "m.mentions": {},
                     "m.relates_to": {"m.in_reply_to": {"event_id": "$cmd"}}}
    table = reply_content("SET  X\n<a>  1", "$cmd")
    assert table["formatted_body"] == "<pre><code>SET  X\n&lt;a&gt;  1</code></pre>"


# -- the dispatcher --------------------------------------------------------------------

NOW = 1_800_000_000.0


def message(event_id: str, body: str, sender: str = ADMIN, age_ms: int = 1000, room: str = "!r") -> dict:
    return {"type": "m.room.message", "event_id": event_id, "room_id": room, "sender": sender,
            "origin_server_ts": int(NOW * 1000) - age_ms, "content": {"msgtype": "m.text", "body": body}}


class Sender:
    def __init__(self, fail: int = 0) -> None:
        self.sent: list[tuple[str, str, dict, str]] = []
        self.fail = fail

    async def __call__(self, room_id: str, event_type: str, content: dict, txn_id: str) -> str:
        if self.fail:
            self.fail -= 1
            raise RuntimeError("homeserver away")
        self.sent.append((room_id, event_type, content, txn_id))
        return "$reply"


async def test_the_dispatcher_answers_each_command_once(ctx):
    send = Sender()
    dispatcher = AdminDispatcher(ctx, send, own_user=lambda user: user == "@bot:hs", clock=lambda: NOW)
    events = [message("$1", "!ask help"), message("$2", "just chatting"), message("$3", "!ask status", STRANGER),
              message("$4", "!ask help", "@bot:hs"), message("$old", "!ask remind release",
                                                              age_ms=MAX_COMMAND_AGE_MS + 1)]
    assert dispatcher.collect(events) == 2
    assert dispatcher.collect(events) == 0  # a replayed batch queues nothing twice
    assert await dispatcher.drain() == 2
    replies = {content["m.relates_to"]["m.in_reply_to"]["event_id"]: content["body"] for _r, _t, content, _x in send.sent}
    assert "!ask close <set> <question>" in replies["$1"]
    assert "only the bridge's admins" in replies["$3"]
    assert ctx.calls.reminded == []  # the old command was history, not a request
    assert ctx.store.command_handled("$1") and ctx.store.command_handled("$3")
    assert dispatcher.collect(events) == 0  # handled ones are remembered by the store


async def test_a_command_sent_as_a_notice_or_an_emote_is_not_run(ctx):
    # Another bot's notice quoting "!ask remind ..." ran it (and two bots
    # answering each other's notices loop); "/me !ask close ..." is an emote.
    send = Sender()
    dispatcher = AdminDispatcher(ctx, send, own_user=lambda user: False, clock=lambda: NOW)
    notice, emote = message("$n", "!ask remind release"), message("$e", "!ask remind release")
    notice["content"]["msgtype"], emote["content"]["msgtype"] = "m.notice", "m.emote"
    assert dispatcher.collect([notice, emote]) == 0
    assert await dispatcher.drain() == 0
    assert send.sent == [] and ctx.calls.reminded == []
    assert is_command(notice)  # still never read as an answer


async def test_a_command_typed_in_a_thread_is_answered_in_that_thread(ctx):
    # The answer went to the main timeline, out of sight of the admin who
    # typed the command in a question's thread.
    send = Sender()
    dispatcher = AdminDispatcher(ctx, send, own_user=lambda user: False, clock=lambda: NOW)
    threaded = message("$in", "!ask help")
    threaded["content"]["m.relates_to"] = {"rel_type": "m.thread", "event_id": "$question", "is_falling_back": True,
                                           "m.in_reply_to": {"event_id": "$question"}}
    dispatcher.collect([threaded, message("$out", "!ask help")])
    assert await dispatcher.drain() == 2
    relates = {content["m.relates_to"]["m.in_reply_to"]["event_id"]: content["m.relates_to"]
               for _r, _t, content, _x in send.sent}
    assert relates["$in"]["rel_type"] == "m.thread" and relates["$in"]["event_id"] == "$question"
    assert relates["$in"]["is_falling_back"] is False
    assert "rel_type" not in relates["$out"]


async def test_a_commands_age_is_the_homeservers_not_a_clock_compared_across_machines(ctx):
    # A bridge whose clock ran 11 minutes ahead took every command for one
    # older than 10 minutes and ignored it, in silence, for good.  The
    # homeserver says how old an event is (``unsigned.age``).
    send = Sender()
    ahead = NOW + 11 * 60
    dispatcher = AdminDispatcher(ctx, send, own_user=lambda user: False, clock=lambda: ahead)
    fresh = {**message("$now", "!ask help"), "unsigned": {"age": 800}}
    stale = {**message("$then", "!ask help", age_ms=MAX_COMMAND_AGE_MS + 5000),
             "unsigned": {"age": MAX_COMMAND_AGE_MS + 5000}}
    assert dispatcher.collect([fresh, stale]) == 1
    assert await dispatcher.drain() == 1
    assert [content["m.relates_to"]["m.in_reply_to"]["event_id"] for _r, _t, content, _x in send.sent] == ["$now"]


async def test_a_reply_that_cannot_be_sent_is_retried_without_running_the_command_again(ctx):
    send = Sender(fail=1)
    dispatcher = AdminDispatcher(ctx, send, own_user=lambda user: False, clock=lambda: NOW)
    dispatcher.collect([message("$1", "!ask remind release")])
    assert await dispatcher.drain() == 0
    assert not ctx.store.command_handled("$1")
    assert await dispatcher.drain() == 1
    assert ctx.calls.reminded == ["release"]  # run once, though the reply was sent on the second try
    assert len(send.sent) == 1 and send.sent[0][2]["body"] == "Sent 2 reminders for “release”."


async def test_a_room_that_refuses_the_reply_for_good_holds_up_no_other_command(ctx):
    """An admin's command in a room that then made the bridge read-only: its
    reply was retried every 5 s for good, and every later command, in any
    room, waited behind it.  It is dropped now; a room that refuses only for
    now keeps its commands, in order, while other rooms' are answered."""
    from types import SimpleNamespace

    from bridge.service.transport.matrix import MatrixError

    sent: list[tuple[str, str]] = []
    away = {"!busy:hs"}

    async def send(room_id: str, event_type: str, content: dict, txn_id: str) -> str:
        if room_id == "!muted:hs":
            raise MatrixError("send", SimpleNamespace(status_code="M_FORBIDDEN", message="not allowed"))
        if room_id in away:
            raise MatrixError("send", SimpleNamespace(status_code="M_LIMIT_EXCEEDED", message="slow down"))
        sent.append((room_id, content["m.relates_to"]["m.in_reply_to"]["event_id"]))
        return "$reply"

    dispatcher = AdminDispatcher(ctx, send, own_user=lambda user: False, clock=lambda: NOW)
    dispatcher.collect([message("$1", "!ask help", room="!muted:hs"), message("$2", "!ask help", room="!busy:hs"),
                        message("$3", "!ask help", room="!busy:hs"), message("$4", "!ask help")])
    assert await dispatcher.drain() == 1
    assert sent == [("!r", "$4")]
    assert ctx.store.command_handled("$1") and [p.event_id for p in dispatcher.queue] == ["$2", "$3"]
    away.clear()
    assert await dispatcher.drain() == 2
    assert sent[1:] == [("!busy:hs", "$2"), ("!busy:hs", "$3")]


async def test_a_command_that_raises_is_answered_with_the_error(ctx):
    async def broken(set_dir: Path) -> str:
        raise RuntimeError("disk full")

    ctx.post_set = broken
    send = Sender()
    dispatcher = AdminDispatcher(ctx, send, own_user=lambda user: False, clock=lambda: NOW)
    dispatcher.collect([message("$1", "!ask post release")])
    assert await dispatcher.drain() == 1
    assert send.sent[0][2]["body"] == "That did not work: disk full"


async def test_run_answers_in_the_background_until_stopped(ctx):
    import asyncio

    send = Sender()
    dispatcher = AdminDispatcher(ctx, send, own_user=lambda user: False, clock=lambda: NOW)
    stop = asyncio.Event()
    task = asyncio.ensure_future(dispatcher.run(stop))
    dispatcher.collect([message("$1", "!ask help")])
    for _ in range(100):
        if send.sent:
            break
        await asyncio.sleep(0.01)
    stop.set()
    await asyncio.wait_for(task, 2)
    assert len(send.sent) == 1


async def test_status_of_hundreds_of_sets_fits_one_message_and_says_what_is_left_out(ctx, sets_root):
    # With some 400 sets the table passed a Matrix event's 65,536 bytes: the
    # homeserver refused the reply and the admin heard nothing.
    for n in range(600):
        folder = sets_root / f"release-{n:03d}-with-a-rather-long-folder-name"
        folder.mkdir()
        (folder / "questions.json").write_text(json.dumps({**QUESTIONS, "id": f"release-{n:03d}-of-the-quarter"}))
    reply = await handle(parse_command("!ask status"), ADMIN, ctx)
    assert len(reply.encode()) < 30_000
    assert "more lines, too many for one message" in reply.splitlines()[-1]


async def test_status_and_the_commands_record_wait_for_the_database_off_the_event_loop(ctx):
    """With the database 100 ms away each statement of ``!ask status`` on
    the event loop held /health and every room (0.7 s a command)."""
    from bridge.service.operators.admin import _Pending
    from helpers.loopwatch import statements_on_the_loop

    on_loop = statements_on_the_loop(ctx.store)
    send = Sender()
    dispatcher = AdminDispatcher(ctx, send, own_user=lambda user: user == "@bot:hs", clock=lambda: NOW)
    dispatcher.queue.append(_Pending("$1", "!room:hs", ADMIN, parse_command("!ask status")))
    assert await dispatcher.drain() == 1
    assert "release" in send.sent[0][2]["body"]
    assert on_loop == []


async def test_someone_who_may_not_give_commands_is_told_once_in_a_while_not_once_a_command(ctx):
    """Thirty "!ask" from one member made thirty refusals from the bot."""
    send = Sender()
    now = [NOW]
    dispatcher = AdminDispatcher(ctx, send, own_user=lambda user: False, clock=lambda: now[0])
    other = "@other:hs"
    dispatcher.collect([message(f"$s{n}", "!ask status", STRANGER) for n in range(30)]
                       + [message("$o", "!ask help", other), message("$a", "!ask help")])
    await dispatcher.drain()
    told = [content["m.relates_to"]["m.in_reply_to"]["event_id"] for _r, _t, content, _x in send.sent]
    assert told == ["$s0", "$o", "$a"]  # the first of the thirty; another member; the admin
    assert all(ctx.store.command_handled(f"$s{n}") for n in range(30)) and not dispatcher.queue
    now[0] += 11 * 60
    dispatcher.collect([{**message("$later", "!ask status", STRANGER), "origin_server_ts": int(now[0] * 1000)}])
    await dispatcher.drain()
    assert send.sent[-1][2]["m.relates_to"]["m.in_reply_to"]["event_id"] == "$later"
