"""Postings: a set folder's questions in the room, each revision atomic.

Driven with the real store and the real poster; the transport records what
would be sent (and fails where a test says)."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
from pathlib import Path
from typing import Any

from bridge.protocol.judge import IncomingAnswer, JudgeContext, Refused, judge
from bridge.protocol.poll import POLL_END, POLL_START
from bridge.protocol.question_event import content_size
from bridge.protocol.render import shown_title
from bridge.questionset.model import QuestionSet
from bridge.service.posting.insend import IN_SEND, settle
from bridge.service.posting.poster import Poster, PostReport
from bridge.service.operators.admin import describe_post
from bridge.service.operators.setstatus import collect
from bridge.service.storage.heldback import format_held, held_back
from bridge.service.storage.store import Store

ROOM = "!room:hs"


class Transport:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any], str]] = []
        self.fail_on: str | None = None
        self.answer_with: str | None = None

    async def send(self, room_id: str, event_type: str, content: dict[str, Any], txn_id: str) -> str:
        if self.fail_on == event_type:
            raise RuntimeError("the homeserver went away")
        self.sent.append((event_type, content, txn_id))
        if self.answer_with is not None:
            return self.answer_with
        return f"$e{len(self.sent)}"

    def questions(self) -> list[dict[str, Any]]:
        return [c for t, c, _ in self.sent if t == "m.room.message" and "elicitation_id" in c]


def choice(rev: int = 1, qid: str = "pick", title: str = "Which take?") -> dict[str, Any]:
    return {"id": qid, "kind": "choice", "rev": rev, "title": title, "question": "Which take do we keep?",
            "why": "The cut is due.", "options": [{"id": "a", "label": "Take A"}, {"id": "b", "label": "Take B"}]}


def write_set(folder: Path, set_id: str, *questions: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "questions.json").write_text(json.dumps({"askwright": 1, "id": set_id, "title": "Takes",
                                                       "questions": list(questions)}))


def load(folder: Path) -> tuple[QuestionSet | None, list[str]]:
    try:
        return QuestionSet.model_validate(json.loads((folder / "questions.json").read_text())), []
    except (OSError, ValueError) as exc:
        return None, [str(exc)]


def poster(tmp_path: Path, transport: Transport) -> tuple[Poster, Store]:
    store = Store(tmp_path / "bridge.sqlite")
    return Poster(store, transport, room_for=lambda _set: ROOM, load_set=load), store


def answer_to(question, sender: str = "@ann:hs") -> IncomingAnswer:
    content = {"msgtype": "m.text", "body": "a", "schema_version": 1,
               "suite_event_type": "dev.superpipeline.question.answer.v2", "elicitation_id": question.elicitation_id,
               "m.relates_to": {"rel_type": "m.reference", "event_id": question.event_id}, "option_id": "a"}
    return IncomingAnswer("$ans", ROOM, sender, 1, content)


CTX = JudgeContext(allowed=None, members=frozenset({"@ann:hs"}), bridge_user="@bridge:hs")


def test_a_new_rev_closes_the_old_one_before_anything_else_is_sent(tmp_path: Path) -> None:
    folder = tmp_path / "sets" / "takes"
    write_set(folder, "takes", choice(1))
    transport = Transport()
    p, store = poster(tmp_path, transport)
    asyncio.run(p.sync_root(tmp_path / "sets"))
    first = store.latest_posted(str(folder.resolve()), "pick")

    write_set(folder, "takes", choice(2, title="Which take, now?"))
    transport.fail_on = POLL_START  # rev 2's poll never goes out (a crash would do the same)
    try:
        asyncio.run(p.sync_root(tmp_path / "sets"))
    except RuntimeError:
        pass
    old = store.question_by_event(first.event_id)
    assert old.open is False
    refused = judge(old, answer_to(old), CTX)
    assert isinstance(refused, Refused) and refused.reason == "question_closed"
    postings = store.postings(str(folder.resolve()), "pick")
    assert [q.rev for q in postings] == [2, 1] and [q.open for q in postings] == [True, False]

    transport.fail_on = None  # the next pass finishes rev 2 and says rev 1 was replaced
    asyncio.run(p.sync_root(tmp_path / "sets"))
    closes = [c for _t, c, _ in transport.sent if "dev.superpipeline.question.closed" in c]
    assert [c["dev.superpipeline.question.closed"]["question_event_id"] for c in closes] == [first.event_id]
    assert len(transport.questions()) == 2


def test_a_rev_that_goes_back_is_a_new_posting_with_its_own_id(tmp_path: Path, caplog) -> None:
    folder = tmp_path / "sets" / "takes"
    transport = Transport()
    p, store = poster(tmp_path, transport)
    for rev in (1, 2, 1):
        write_set(folder, "takes", choice(rev))
        report = asyncio.run(p.sync_root(tmp_path / "sets"))
    assert any("rev went back from 2 to 1" in w for w in report.warnings)
    posted = transport.questions()
    assert [c["question"]["rev"] for c in posted] == [1, 2, 1]
    assert len({c["elicitation_id"] for c in posted}) == 3
    postings = store.postings(str(folder.resolve()), "pick")
    assert [q.open for q in postings] == [True, False, False]
    newest = postings[0]
    assert newest.rev == 1 and newest.elicitation_id == posted[-1]["elicitation_id"]
    assert judge(newest, answer_to(newest), CTX).__class__.__name__ == "Accepted"
    (folder / "questions.json").write_text((folder / "questions.json").read_text() + " ")  # touched, same questions
    asyncio.run(p.sync_root(tmp_path / "sets"))
    assert len(transport.questions()) == 3  # not posted again at every pass


def test_a_clash_on_recording_a_posting_is_an_error_not_ignored(tmp_path: Path, caplog) -> None:
    folder = tmp_path / "sets" / "takes"
    write_set(folder, "takes", choice(1, qid="one"), choice(1, qid="two"))
    transport = Transport()
    transport.answer_with = "$same"  # a homeserver handing back one event for two posts
    p, store = poster(tmp_path, transport)
    with caplog.at_level(logging.ERROR):
        report = asyncio.run(p.sync_root(tmp_path / "sets"))
    assert str(folder) in report.broken and "clashes" in report.broken[str(folder)][0]
    assert "clashes" in caplog.text
    assert store.latest_posted(str(folder.resolve()), "two") is None
    assert store.get_meta(f"set_synced:{folder.resolve()}") is None  # tried again on the next pass


def test_a_second_folder_with_the_same_set_id_is_refused_naming_both(tmp_path: Path, caplog) -> None:
    root = tmp_path / "sets"
    first, second = root / "a-takes", root / "b-takes"
    write_set(first, "takes", choice(1))
    write_set(second, "takes", choice(1, qid="other"))
    transport = Transport()
    p, store = poster(tmp_path, transport)
    with caplog.at_level(logging.ERROR):
        report = asyncio.run(p.sync_root(root))
    message = report.broken[str(second)][0]
    assert str(first.resolve()) in message and str(second.resolve()) in message
    assert str(first.resolve()) in caplog.text and str(second.resolve()) in caplog.text
    assert [c["question"]["id"] for c in transport.questions()] == ["pick"]
    # Syncing the second again touches nothing of the first.
    asyncio.run(p.sync_set(second, PostReport()))
    assert store.latest_posted(str(first.resolve()), "pick").open is True
    rows = {row.set_dir: row for row in collect(root, store.posted_question_counts())}
    assert rows[str(second)].problem is not None and str(first) in rows[str(second)].problem
    assert rows[str(first)].problem is None and rows[str(first)].posted == 1


def test_a_set_folder_that_vanishes_closes_its_questions_and_comes_back_as_new_postings(tmp_path: Path) -> None:
    root = tmp_path / "sets"
    folder = root / "takes"
    write_set(folder, "takes", choice(1))
    transport = Transport()
    p, store = poster(tmp_path, transport)
    asyncio.run(p.sync_root(root))
    posted = store.latest_posted(str(folder.resolve()), "pick")

    shutil.move(str(folder), str(tmp_path / "archived"))
    asyncio.run(p.sync_changed(root, [folder / "questions.json"]))
    closed = store.question_by_event(posted.event_id)
    assert closed.open is False and closed.closed_why == "this set was removed"
    refused = judge(closed, answer_to(closed), CTX)
    assert isinstance(refused, Refused) and "this set was removed" in refused.message
    words = [c for _t, c, _ in transport.sent if "dev.superpipeline.question.closed" in c]
    assert words and words[0]["dev.superpipeline.question.closed"]["why"] == "this set was removed"
    assert words[0]["body"].startswith("“Which take?” is closed (this set was removed); answers to this message")

    shutil.move(str(tmp_path / "archived"), str(folder))
    asyncio.run(p.sync_changed(root, [folder / "questions.json"]))
    again = store.latest_posted(str(folder.resolve()), "pick")
    assert again.event_id != posted.event_id and again.open is True
    assert again.elicitation_id != posted.elicitation_id


def test_an_unreadable_questions_file_keeps_the_posted_questions_open(tmp_path: Path) -> None:
    root = tmp_path / "sets"
    folder = root / "takes"
    write_set(folder, "takes", choice(1))
    transport = Transport()
    p, store = poster(tmp_path, transport)
    asyncio.run(p.sync_root(root))
    (folder / "questions.json").write_text("{ half written")
    report = asyncio.run(p.sync_root(root))
    assert str(folder) in report.broken
    assert store.latest_posted(str(folder.resolve()), "pick").open is True
    row = collect(root, store.posted_question_counts())[0]
    assert row.problem is not None and "posted questions stay open" in row.problem


def test_a_set_folder_moved_in_is_a_changed_set(tmp_path: Path) -> None:
    from bridge.service.posting.poster import changed_sets

    root = tmp_path / "sets"
    write_set(root / "group" / "takes", "takes", choice(1))
    (root / "group" / "takes" / "attachments").mkdir()
    assert changed_sets(root, [root / "group"]) == [root / "group" / "takes"]
    assert changed_sets(root, [root / "group" / "takes" / "attachments"]) == []


def test_a_set_written_while_its_pass_waits_is_not_remembered_by_the_older_hash(tmp_path: Path,
                                                                              monkeypatch) -> None:
    # The pass hashed questions.json, then waited its reading turn (another
    # set linting) while the agent wrote a third question; the newer file was
    # posted and the older hash kept as synced.  The agent taking the third
    # question back out wrote the older bytes again: skipped as synced, the
    # question stayed open in the room for good.
    from bridge.service.posting import poster as poster_module

    folder = tmp_path / "sets" / "takes"
    write_set(folder, "takes", choice(1))
    p, store = poster(tmp_path, Transport())
    asyncio.run(p.sync_root(tmp_path / "sets"))
    write_set(folder, "takes", choice(1), choice(1, qid="extra", title="Extra?"))
    second = (folder / "questions.json").read_bytes()
    hashed = poster_module._fingerprint

    def written_while_waiting(set_dir: Path) -> str | None:
        fingerprint = hashed(set_dir)
        monkeypatch.setattr(poster_module, "_fingerprint", hashed)  # the agent writes once
        write_set(folder, "takes", choice(1), choice(1, qid="extra", title="Extra?"), choice(1, qid="x3", title="X3?"))
        return fingerprint

    monkeypatch.setattr(poster_module, "_fingerprint", written_while_waiting)
    asyncio.run(p.sync_if_changed(folder, PostReport()))
    assert store.latest_posted(str(folder.resolve()), "x3").open  # the newer file was the one posted
    (folder / "questions.json").write_bytes(second)
    asyncio.run(p.sync_if_changed(folder, PostReport()))
    assert not store.latest_posted(str(folder.resolve()), "x3").open


class NoPolls(Transport):
    """A room whose power levels refuse polls."""

    async def send(self, room_id: str, event_type: str, content: dict[str, Any], txn_id: str) -> str:
        from types import SimpleNamespace

        from bridge.service.transport.matrix import MatrixError

        if event_type == POLL_START and not getattr(self, "allowed", False):
            raise MatrixError("sending a poll", SimpleNamespace(status_code="M_FORBIDDEN", message="no"))
        return await super().send(room_id, event_type, content, txn_id)


def test_a_room_that_refuses_polls_still_gets_every_question_of_the_set(tmp_path: Path) -> None:
    # One poll the room's power levels forbid stopped the whole set: 7 of 8
    # questions never posted, the set retried for ever with the same refusal.
    root = tmp_path / "sets"
    write_set(root / "takes", "takes", choice(1, "one"), choice(1, "two"), choice(1, "three"))
    transport = NoPolls()
    p, store = poster(tmp_path, transport)
    report = asyncio.run(p.sync_root(root))
    assert report.failed == []  # nothing left to try again with a room that said no for good
    assert len(transport.questions()) == 3


def test_a_question_whose_poll_the_room_refused_no_longer_points_to_a_poll(tmp_path: Path) -> None:
    """The room refused the poll, and the question still said "To answer:
    vote in the poll; …", later questions too, and the help after an
    unreadable reply to them offered "or vote in the poll": a poll no one can see."""
    from bridge.protocol.replies import help_text

    root = tmp_path / "sets"
    write_set(root / "takes", "takes", choice(1, "one"), choice(1, "two"))
    transport = NoPolls()
    p, store = poster(tmp_path, transport)
    asyncio.run(p.sync_root(root))
    first, second = transport.questions()
    assert "To answer: vote in the poll; " in first["body"]  # as posted, before the room said no
    [edit] = [c for t, c, _ in transport.sent if c.get("m.relates_to", {}).get("rel_type") == "m.replace"]
    assert edit["m.relates_to"]["event_id"] == "$e1"
    shown = edit["m.new_content"]
    assert "poll" not in shown["body"] and "poll" not in shown["formatted_body"], shown["body"]
    assert "To answer: reply to this message with the number of your pick" in shown["body"]
    assert "poll" not in second["body"] and "poll" not in second["formatted_body"], second["body"]
    words = help_text(store.question_by_event("$e3"))
    assert words.startswith("Reply with the number of your pick (1–4) or react with its number;"), words
    # The first keeps its content as posted: the answer log hashes what the room's event holds.
    assert store.question_by_event("$e1").content == first
    store.close()


def test_a_room_that_refused_polls_gets_them_again_once_its_power_levels_change(tmp_path: Path) -> None:
    """An admin who read "this room does not allow its poll" and let the
    bridge send polls: every later question was still posted without one,
    for good."""
    from bridge.service.answering.pipeline import Pipeline

    root = tmp_path / "sets"
    write_set(root / "takes", "takes", choice(1, "one"))
    transport = NoPolls()
    p, store = poster(tmp_path, transport)
    asyncio.run(p.sync_root(root))
    write_set(root / "more", "more", choice(1, "two"))
    asyncio.run(p.sync_root(root))
    assert [t for t, _c, _x in transport.sent].count(POLL_START) == 0
    levels = {"type": "m.room.power_levels", "state_key": "", "event_id": "$pl", "room_id": ROOM,
              "sender": "@admin:hs", "origin_server_ts": 5, "content": {"events": {POLL_START: 0}}}
    Pipeline(store=store, transport=transport, answerers=None, own_users=lambda u: u == "@bridge:hs").process([levels])
    transport.allowed = True  # the room takes polls now
    write_set(root / "last", "last", choice(1, "three"))
    asyncio.run(p.sync_root(root))
    assert [t for t, _c, _x in transport.sent].count(POLL_START) == 1
    assert "To answer: vote in the poll; " in transport.questions()[-1]["body"]
    store.close()


def test_a_set_mapped_to_another_room_says_once_that_its_open_questions_stay(tmp_path: Path, caplog) -> None:
    """rooms.sets changed under a running set: its open postings keep their
    room (their answers are there); the operator is told so, once, and a
    revision is posted in the new room."""
    folder = tmp_path / "sets" / "takes"
    write_set(folder, "takes", choice(1))
    transport = Transport()
    p, store = poster(tmp_path, transport)
    asyncio.run(p.sync_root(tmp_path / "sets"))
    p.room_for = lambda _set: "!new:hs"
    with caplog.at_level(logging.WARNING, logger="bridge.service.posting.poster"):
        for _ in range(2):
            asyncio.run(p.sync_root(tmp_path / "sets"))
    said = [r.getMessage() for r in caplog.records if "stay in" in r.getMessage()]
    assert said == ["set takes is now mapped to room !new:hs; its open questions stay in !room:hs, where they "
                    "were asked, and move there only when they are revised (or are closed and opened again)"]
    assert len(transport.questions()) == 1
    write_set(folder, "takes", choice(2))
    asyncio.run(p.sync_root(tmp_path / "sets"))
    assert store.latest_posted(str(folder.resolve()), "pick").room_id == "!new:hs"


class SlowTransport(Transport):
    """A homeserver taking its time over each send (as its rate limits make it)."""

    async def send(self, room_id: str, event_type: str, content: dict[str, Any], txn_id: str) -> str:
        await asyncio.sleep(0.01)
        return await super().send(room_id, event_type, content, txn_id)


def many(n: int) -> list[dict[str, Any]]:
    return [choice(qid=f"q{i}", title=f"Take {i}?") for i in range(n)]


def test_one_agents_long_set_does_not_hold_another_sets_questions(tmp_path: Path) -> None:
    # One lock for every set: a set of 1,500 questions held another agent's
    # one question for 250 s, until its last was out.
    big, small = tmp_path / "sets" / "big", tmp_path / "sets" / "small"
    write_set(big, "big", *many(150))
    write_set(small, "small", choice(qid="urgent", title="Ship today?"))
    transport = SlowTransport()
    p, store = poster(tmp_path, transport)

    async def run() -> tuple[int, int]:
        posting = asyncio.ensure_future(p.sync_dirs([big]))
        while len(transport.questions()) < 5:
            await asyncio.sleep(0.01)
        await p.sync_dirs([small])
        small_done = len(transport.questions())
        await posting
        return small_done, len(transport.questions())

    small_done, total = asyncio.run(run())
    titles = [c["question"]["title"] for c in transport.questions()]
    assert total == 151 and "Ship today?" in titles
    assert small_done < 50, f"the small set waited for {small_done - 1} of the big set's questions"
    store.close()


def test_a_set_closed_while_it_is_posted_is_not_posted_to_its_end(tmp_path: Path) -> None:
    # An agent closed every question of its set while the bridge posted it:
    # all 1,500 were posted anyway, then closed again one by one.
    big = tmp_path / "sets" / "big"
    questions = many(150)
    write_set(big, "big", *questions)
    transport = SlowTransport()
    p, store = poster(tmp_path, transport)

    async def run() -> None:
        posting = asyncio.ensure_future(p.sync_dirs([big]))
        while len(transport.questions()) < 5:
            await asyncio.sleep(0.01)
        write_set(big, "big", *[{**q, "status": "closed"} for q in questions])
        report = await posting
        assert report.failed == [big]  # taken again as it is now, by the next pass
        await p.sync_dirs([big])

    asyncio.run(run())
    posted = len(transport.questions())
    assert posted < 30, f"{posted} of the 150 closed questions were posted"
    postings = store.posted_for_set(str(big.resolve()))
    assert postings and not any(recorded.open for recorded, _poll in postings)
    store.close()


def test_posting_a_set_never_waits_for_the_database_on_the_event_loop(tmp_path: Path) -> None:
    # The poster read and wrote the store on the event loop: with the database
    # 40 ms away, posting a set held /health and every agent a second at a
    # time, and with the network to it cut, 18 s.  Every statement of a
    # posting (new, revised, closed, removed) runs on the store's thread.
    from helpers.loopwatch import statements_on_the_loop

    folder = tmp_path / "sets" / "takes"
    write_set(folder, "takes", *[choice(qid=f"q{n}", title=f"Take {n}?") for n in range(3)])
    transport = Transport()
    p, store = poster(tmp_path, transport)
    on_loop = statements_on_the_loop(store)

    async def run() -> None:
        await p.sync_root(tmp_path / "sets")
        write_set(folder, "takes", choice(rev=2, qid="q0"), {**choice(qid="q1", title="Take 1?"), "status": "closed"})
        await p.sync_root(tmp_path / "sets")
        shutil.rmtree(folder)
        await p.sync_root(tmp_path / "sets")

    asyncio.run(run())
    assert len(transport.questions()) == 4
    assert on_loop == []
    store.close()


class Deduplicating(Transport):
    """A homeserver's transaction ids: the same one sent again is the same event."""

    def __init__(self) -> None:
        super().__init__()
        self.events: dict[str, str] = {}

    async def send(self, room_id: str, event_type: str, content: dict[str, Any], txn_id: str) -> str:
        if txn_id not in self.events:
            self.events[txn_id] = await super().send(room_id, event_type, content, txn_id)
        return self.events[txn_id]


def killed(*args: Any, **kwargs: Any) -> None:
    raise SystemExit("killed between the send and the record")


def sync_killed_before_recording(p: Any, store: Any, root: Path, monkeypatch: Any) -> None:
    """One pass over ``root`` that dies after its send and before the posting is recorded."""
    monkeypatch.setattr(store, "record_posted", killed)
    try:
        asyncio.run(p.sync_root(root))
    except SystemExit:
        pass


def test_a_new_rev_sent_and_not_recorded_is_recorded_at_the_next_start_and_closes_the_old(
        tmp_path: Path, monkeypatch) -> None:
    folder = tmp_path / "sets" / "takes"
    write_set(folder, "takes", choice(1))
    transport = Deduplicating()
    p, store = poster(tmp_path, transport)
    asyncio.run(p.sync_root(tmp_path / "sets"))
    first = store.latest_posted(str(folder.resolve()), "pick")

    write_set(folder, "takes", choice(2))
    sync_killed_before_recording(p, store, tmp_path / "sets", monkeypatch)
    store.close()
    sent = transport.questions()[-1]
    assert sent["question"]["rev"] == 2

    store = Store(tmp_path / "bridge.sqlite")  # the next start
    assert store.latest_posted(str(folder.resolve()), "pick").rev == 1
    asyncio.run(settle(store, transport))
    now = store.latest_posted(str(folder.resolve()), "pick")
    assert now.rev == 2 and now.content == sent and now.event_id == transport.events[transport.sent[-1][2]]
    assert store.question_by_event(first.event_id).open is False
    assert store.meta_with_prefix(IN_SEND) == []
    assert len(transport.questions()) == 2  # sent again, the same event: not a third post


def test_a_sending_that_cannot_be_settled_is_left_to_the_pass(tmp_path: Path, monkeypatch, caplog) -> None:
    folder = tmp_path / "sets" / "takes"
    write_set(folder, "takes", choice(1))
    transport = Transport()
    p, store = poster(tmp_path, transport)
    sync_killed_before_recording(p, store, tmp_path / "sets", monkeypatch)
    monkeypatch.undo()
    transport.fail_on = "m.room.message"  # the room refuses the bridge now
    with caplog.at_level(logging.WARNING):
        asyncio.run(settle(store, transport))
    assert "takes/pick rev 1" in caplog.text and "could not be recorded" in caplog.text
    assert store.meta_with_prefix(IN_SEND) == [] and store.latest_posted(str(folder.resolve()), "pick") is None
    transport.fail_on = None
    asyncio.run(p.sync_root(tmp_path / "sets"))
    assert store.latest_posted(str(folder.resolve()), "pick").rev == 1


def test_a_sending_kept_in_a_shape_this_version_cannot_read_is_dropped_not_a_failed_start(tmp_path: Path, caplog) -> None:
    store = Store(tmp_path / "bridge.sqlite")
    with store.transaction():
        store.set_meta(IN_SEND + "txn", '{"room": "!r:hs"}')
    with caplog.at_level(logging.WARNING):
        asyncio.run(settle(store, Transport()))
    assert "can't be read" in caplog.text and store.meta_with_prefix(IN_SEND) == []


def test_a_set_its_room_refuses_is_named_as_not_posted_until_it_is(tmp_path: Path) -> None:
    # The room's power levels forbid the bridge to post: status showed the
    # set's questions unposted, and neither it nor /health said why.
    from bridge.service.storage.heldback import counts, format_held, held_back

    folder = tmp_path / "sets" / "takes"
    write_set(folder, "takes", choice(1))
    transport = Transport()
    transport.fail_on = "m.room.message"
    p, store = poster(tmp_path, transport)
    report = asyncio.run(p.sync_root(tmp_path / "sets"))
    assert report.failed == [folder]
    held = held_back(store)
    assert counts(held)["sets_not_posted"] == 1
    assert f"set {folder.resolve()} not posted yet: RuntimeError: the homeserver went away" in format_held(held)
    transport.fail_on = None
    asyncio.run(p.sync_root(tmp_path / "sets"))
    assert counts(held_back(store))["sets_not_posted"] == 0 and len(transport.questions()) == 1



def test_a_send_that_failed_is_not_sent_at_the_next_start_once_a_later_revision_went_out(tmp_path: Path) -> None:
    # Rev 1's send failed (the homeserver away), rev 2 was posted after: the
    # next start sent rev 1 again, open beside rev 2, both taking answers.
    folder = tmp_path / "sets" / "takes"
    write_set(folder, "takes", choice(1))
    transport = Deduplicating()
    p, store = poster(tmp_path, transport)
    transport.fail_on = "m.room.message"
    asyncio.run(p.sync_root(tmp_path / "sets"))
    transport.fail_on = None
    write_set(folder, "takes", choice(2))
    asyncio.run(p.sync_root(tmp_path / "sets"))
    asyncio.run(settle(store, transport))
    asyncio.run(p.sync_root(tmp_path / "sets"))
    assert [(q.rev, q.open) for q in store.postings(str(folder.resolve()), "pick")] == [(2, True)]
    assert [c["question"]["rev"] for c in transport.questions()] == [2]
    assert store.meta_with_prefix(IN_SEND) == []


def test_a_question_removed_after_its_send_is_closed_by_the_starts_pass(tmp_path: Path, monkeypatch) -> None:
    folder = tmp_path / "sets" / "takes"
    write_set(folder, "takes", choice(1), choice(1, qid="other"))
    transport = Deduplicating()
    p, store = poster(tmp_path, transport)
    asyncio.run(p.sync_root(tmp_path / "sets"))
    write_set(folder, "takes", choice(1), choice(2, qid="other"))
    sync_killed_before_recording(p, store, tmp_path / "sets", monkeypatch)
    monkeypatch.undo()
    write_set(folder, "takes", choice(1))  # "other" taken out of the set while the bridge was down
    asyncio.run(settle(store, transport))
    asyncio.run(p.sync_root(tmp_path / "sets"))
    assert [(q.rev, q.open) for q in store.postings(str(folder.resolve()), "other")] == [(2, False), (1, False)]


class Refused403(Exception):
    """What a send into a room the bridge is not in gets (Synapse: 403 M_FORBIDDEN)."""

    permanent = True
    status = "M_FORBIDDEN"


class KickedAfterTheQuestion(Transport):
    """The bridge is kicked right after a question went out; invited back later, it rejoins."""

    def __init__(self) -> None:
        super().__init__()
        self.kicked = False

    async def send(self, room_id: str, event_type: str, content: dict[str, Any], txn_id: str) -> str:
        if self.kicked:
            raise Refused403(f"User @bot:hs not in room {room_id}")
        sent = await super().send(room_id, event_type, content, txn_id)
        self.kicked = "elicitation_id" in content
        return sent

    async def joined_rooms(self) -> set[str]:
        return set() if self.kicked else {ROOM}


def test_a_kick_between_a_question_and_its_poll_leaves_the_poll_to_post_once_back(tmp_path):
    """The poll's 403 (not in the room) was taken as the room refusing polls
    for good: invited back, the bridge never posted it, and the question was
    the one of its kind without a poll."""
    write_set(tmp_path / "sets" / "takes", "takes", choice())
    transport = KickedAfterTheQuestion()
    bridge, _store = poster(tmp_path, transport)
    assert asyncio.run(bridge.sync_root(tmp_path / "sets")).failed
    transport.kicked = False  # invited back: joined again
    asyncio.run(bridge.sync_root(tmp_path / "sets"))
    assert [t for t, _c, _x in transport.sent].count(POLL_START) == 1
    assert len(transport.questions()) == 1


class Rooms(Transport):
    """Which room each send went to; thread messages fail until ``threads_fail`` is off."""

    def __init__(self) -> None:
        super().__init__()
        self.rooms: list[tuple[str, str | None]] = []
        self.threads_fail = True

    async def send(self, room_id: str, event_type: str, content: dict[str, Any], txn_id: str) -> str:
        relates = content.get("m.relates_to") or {}
        if self.threads_fail and relates.get("rel_type") == "m.thread":
            raise RuntimeError("the homeserver went away")
        self.rooms.append((room_id, relates.get("event_id")))
        return await super().send(room_id, event_type, content, txn_id)


def test_a_questions_leftover_background_goes_to_the_room_it_was_asked_in(tmp_path):
    """Its one-pager not yet out when the set was moved to another room: the
    bridge sent it there, in the thread of an event of the first room, which
    the homeserver refuses for ever; the set was retried without end."""
    folder = tmp_path / "sets" / "takes"
    question = {**choice(), "one_pager": [{"type": "text", "text": "Why we ask: the cut is due on Friday."}]}
    write_set(folder, "takes", question)
    transport, rooms = Rooms(), {"takes": "!old:hs"}
    store = Store(tmp_path / "bridge.sqlite")
    assert asyncio.run(Poster(store, transport, room_for=rooms.get, load_set=load).sync_root(tmp_path / "sets")).failed
    asked = store.latest_posted(str(folder.resolve()), "pick").event_id
    rooms["takes"], transport.threads_fail = "!new:hs", False
    asyncio.run(Poster(store, transport, room_for=rooms.get, load_set=load).sync_root(tmp_path / "sets"))
    in_its_thread = [room for room, about in transport.rooms if about == asked]
    assert in_its_thread and set(in_its_thread) == {"!old:hs"}, transport.rooms


class SizedTransport(Transport):
    """Refuses what a homeserver refuses: an event over 65,536 bytes (less its envelope)."""

    async def send(self, room_id: str, event_type: str, content: dict[str, Any], txn_id: str) -> str:
        if content_size(content) > 65536 - 2048:
            raise RuntimeError(f"M_TOO_LARGE: {content_size(content)} bytes")
        return await super().send(room_id, event_type, content, txn_id)


def test_a_question_superseded_by_one_with_a_long_title_is_closed_in_the_room(tmp_path: Path) -> None:
    """The successor is named by its title cut short, as titles are cut
    elsewhere: named whole (16,000 characters), the closing edit was past
    what an event carries, refused, and every later pass failed the same way,
    the room never told that the old question was closed."""
    root = tmp_path / "sets"
    folder = root / "takes"
    write_set(folder, "takes", choice(1, qid="old"))
    transport = SizedTransport()
    p, store = poster(tmp_path, transport)
    asyncio.run(p.sync_root(root))
    old = store.latest_posted(str(folder.resolve()), "old")
    long_title = "Überarbeitete Frage " * 800
    write_set(folder, "takes", dict(choice(1, qid="old"), status="superseded", superseded_by="new"),
              choice(1, qid="new", title=long_title))
    report = asyncio.run(p.sync_changed(root, [folder / "questions.json"]))
    assert not report.failed
    named = f"superseded by “{shown_title(long_title)}”"
    notices = [c for _t, c, _ in transport.sent if "dev.superpipeline.question.closed" in c]
    assert [c["dev.superpipeline.question.closed"]["question_event_id"] for c in notices] == [old.event_id]
    assert named in notices[0]["body"]
    edits = [c for _t, c, _ in transport.sent if c.get("m.relates_to", {}).get("rel_type") == "m.replace"
             and c["m.relates_to"]["event_id"] == old.event_id]
    assert len(edits) == 1 and named in edits[0]["m.new_content"]["body"]
    ends = [c for t, c, _ in transport.sent if t == POLL_END]
    assert len(ends) == 1 and f"Superseded by “{shown_title(long_title)}”" in json.dumps(ends[0], ensure_ascii=False)
    assert store.question_by_event(old.event_id).closed_why == named


class EncryptedTransport(Transport):
    async def room_encrypted(self, room_id: str) -> bool:
        return True


def test_a_question_too_large_for_an_encrypted_room_is_skipped_and_the_rest_of_its_set_posted(
        tmp_path: Path, caplog) -> None:
    """A question whose event fits a plain room but not an encrypted one (lint
    only warns: it does not know the room) is refused in that room: skipped,
    logged once, and named in what ``status`` and /health hold back, while
    its set's other questions are posted.  It failed the whole set, which was
    tried again for ever and never posted its other questions."""
    root = tmp_path / "sets"
    folder = root / "takes"
    big = dict(choice(1, qid="big"), question="Which take do we keep? " + "Context. " * 5500)  # ~50 KB
    write_set(folder, "takes", big, choice(1, qid="small"))
    transport = EncryptedTransport()
    p, store = poster(tmp_path, transport)
    with caplog.at_level(logging.ERROR):
        report = asyncio.run(p.sync_root(root))
        assert [c["question"]["id"] for c in transport.questions()] == ["small"]
        assert not report.failed and not report.broken
        assert list(report.refused) == [str(folder)] and "'big'" in report.refused[str(folder)][0]
        assert describe_post(report).startswith("Posted 1 question. takes/big rev 1 not posted: ")  # `!ask post`
        held = held_back(store)["not_posted"]
        assert [row["set_dir"] for row in held] == [str(folder.resolve())] and "'big'" in held[0]["reason"]
        assert "encrypted room" in held[0]["reason"] and "other questions are posted" in held[0]["reason"]
        assert "'big'" in format_held(held_back(store))
        report = asyncio.run(p.sync_root(root))  # a later pass: nothing new sent, not said again
    assert [c["question"]["id"] for c in transport.questions()] == ["small"] and not report.failed
    assert len([r for r in caplog.records if "'big'" in r.getMessage()]) == 1
    assert store.latest_posted(str(folder.resolve()), "big") is None

    write_set(folder, "takes", choice(1, qid="big"), choice(1, qid="small"))  # shortened: posted, no longer held
    asyncio.run(p.sync_changed(root, [folder / "questions.json"]))
    assert [c["question"]["id"] for c in transport.questions()] == ["small", "big"]
    assert held_back(store)["not_posted"] == []


def closes_told(transport: Transport) -> list[str]:
    return [c["dev.superpipeline.question.closed"]["question_event_id"] for _t, c, _ in transport.sent
            if "dev.superpipeline.question.closed" in c]


def test_a_sets_root_not_mounted_closes_nothing_and_is_looked_at_again(tmp_path: Path, caplog) -> None:
    """A sets root that is empty (the bridge started before its share is
    mounted, or the share dropped), or not there at all, while the store has
    open questions in folders under it, is no set removed: nothing is closed,
    the log says so once naming the root, ``status`` and /health name it,
    and the root is looked at again (in ``failed``).  Every open question of
    every set was closed as "this set was removed", and posted again as new
    once the share was back.  A single set removed is still closed."""
    root = tmp_path / "sets"
    write_set(root / "a", "a", choice(1)); write_set(root / "b", "b", choice(1))
    transport = Transport()
    p, store = poster(tmp_path, transport)
    asyncio.run(p.sync_root(root))
    sent = len(transport.sent)

    root.rename(tmp_path / "share"); root.mkdir()  # an empty mount point
    with caplog.at_level(logging.WARNING):
        report = asyncio.run(p.sync_root(root))
        assert closes_told(transport) == [] and len(transport.sent) == sent
        assert report.failed == [root] and not report.closed
        held = held_back(store)["not_posted"]
        assert [row["set_dir"] for row in held] == [str(root.resolve())]
        assert "nothing is closed" in held[0]["reason"]
        root.rmdir()  # not there at all (the share mounted at a folder above it dropped)
        report = asyncio.run(p.sync_changed(root, [root / "a" / "questions.json"]))
        assert closes_told(transport) == [] and report.failed == [root]
    assert len([r for r in caplog.records if str(root) in r.getMessage() and r.levelno == logging.WARNING]) == 1
    assert all(store.latest_posted(str(root.resolve() / s), "pick").open for s in ("a", "b"))

    (tmp_path / "share").rename(root)  # mounted again: nothing closed, nothing posted again
    report = asyncio.run(p.sync_root(root))
    assert len(transport.sent) == sent and not report.failed and held_back(store)["not_posted"] == []

    shutil.rmtree(root / "a")  # one set removed: closed as before
    asyncio.run(p.sync_changed(root, [root / "a" / "questions.json"]))
    assert closes_told(transport) == [store.latest_posted(str(root.resolve() / "a"), "pick").event_id]
    assert store.latest_posted(str(root.resolve() / "b"), "pick").open


def test_a_removed_sets_close_notices_the_room_refused_are_told_later_and_the_folder_back_is_posted(
        tmp_path: Path) -> None:
    """The room refusing the close notices of a removed set (a 502 mid-way
    through thousands) leaves them owed: a later pass tells the room, and
    the folder's synced mark went with the closes, so the folder moved back
    unchanged is posted again.  Nothing told the room again, and the stale
    mark kept the folder back closed for good."""
    root = tmp_path / "sets"
    folder = root / "takes"
    write_set(folder, "takes", choice(1, qid="one"), choice(1, qid="two"))
    transport = Transport()
    p, store = poster(tmp_path, transport)
    asyncio.run(p.sync_root(root))
    posted = {qid: store.latest_posted(str(folder.resolve()), qid) for qid in ("one", "two")}

    shutil.move(str(folder), str(tmp_path / "archived"))
    transport.fail_on = "m.room.message"  # the homeserver has a 502 as the room is told
    report = asyncio.run(p.sync_changed(root, [folder / "questions.json"]))
    assert not any(store.question_by_event(q.event_id).open for q in posted.values())
    assert closes_told(transport) == []
    transport.fail_on = None
    asyncio.run(p.sync_root(root))  # the later pass
    assert sorted(closes_told(transport)) == sorted(q.event_id for q in posted.values())
    edited = [c["m.relates_to"]["event_id"] for _t, c, _ in transport.sent
              if c.get("m.relates_to", {}).get("rel_type") == "m.replace"]
    assert sorted(edited) == sorted(q.event_id for q in posted.values())
    asyncio.run(p.sync_root(root))
    assert len(closes_told(transport)) == 2  # told once
    assert root in report.failed  # the pass that failed to tell had the root looked at again

    shutil.move(str(tmp_path / "archived"), str(folder))  # moved back, unchanged
    asyncio.run(p.sync_changed(root, [folder / "questions.json"]))
    for qid, before in posted.items():
        again = store.latest_posted(str(folder.resolve()), qid)
        assert again.open is True and again.event_id != before.event_id
    assert [c["question"]["id"] for c in transport.questions()] == ["one", "two", "one", "two"]
