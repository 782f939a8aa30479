"""The record is what the room's timeline says, whatever the order or the
path events arrive by: driven through the real pipeline and store."""

from __future__ import annotations

from pathlib import Path

from helpers.timeline import MODERATOR, ROOM, Room, answer, edit, note, picture, redact, saved_file, vote

ALICE, BOB = "@alice:hs", "@bob:hs"


def test_a_late_older_answer_does_not_replace_a_newer_one(tmp_path: Path) -> None:
    room = Room(tmp_path)
    room.deliver([answer("$new", BOB, 2000, "stable")])
    room.deliver([answer("$old", ALICE, 1000, "main")])  # stranded, found by the safety net later
    assert room.record()["choice"] == "stable"
    assert room.record()["rev"] == 2


def test_a_late_original_still_gets_its_early_edit(tmp_path: Path) -> None:
    room = Room(tmp_path)
    room.deliver([edit("$e", ALICE, 2000, "$a", "stable")])
    assert room.record() is None
    room.deliver([answer("$a", ALICE, 1000, "main")])
    assert room.record()["choice"] == "stable"


def test_an_edit_from_someone_else_is_ignored(tmp_path: Path) -> None:
    room = Room(tmp_path)
    room.deliver([answer("$a", ALICE, 1000, "main"), edit("$e", BOB, 2000, "$a", "stable")])
    record = room.record()
    assert record["choice"] == "main" and record["source"]["sender"] == ALICE


def test_a_redaction_counts_from_the_sender_or_a_moderator_only(tmp_path: Path) -> None:
    room = Room(tmp_path)
    room.deliver([answer("$a", ALICE, 1000, "main"), redact("$r1", BOB, 2000, "$a")])
    assert room.record()["choice"] == "main"  # Bob may not redact Alice's answer
    room.deliver([redact("$r2", MODERATOR, 3000, "$a")])
    assert room.record() is None


def test_redacting_an_edit_restores_the_version_before_it(tmp_path: Path) -> None:
    room = Room(tmp_path)
    room.deliver([answer("$a", ALICE, 1000, "main"), edit("$e1", ALICE, 2000, "$a", "stable"),
                  edit("$e2", ALICE, 3000, "$a", "main")])  # a second edit (of the original, as clients send it)
    assert room.record()["choice"] == "main" and room.record()["source"]["event_id"] == "$e2"
    room.deliver([redact("$r", ALICE, 4000, "$e2")])
    assert room.record()["choice"] == "stable"
    room.deliver([redact("$r2", ALICE, 5000, "$e1")])
    assert room.record()["choice"] == "main" and room.record()["source"]["event_id"] == "$a"


def test_an_edit_of_an_edit_is_ignored_as_clients_ignore_it(tmp_path: Path) -> None:
    """The spec: the event an edit replaces must not itself be an edit, and
    clients (Element among them) show the original with its own edits only.
    Alice's edit of her edit changes nothing people see, so it changes
    nothing in answers.json, whichever of the two edits arrives first."""
    for order in ("in order", "the edit of the edit first"):
        (tmp_path / order.replace(" ", "-")).mkdir()
        room = Room(tmp_path / order.replace(" ", "-"))
        first = edit("$e1", ALICE, 2000, "$a", "stable")
        second = edit("$e2", ALICE, 3000, "$e1", "main")  # an edit of the edit
        room.deliver([answer("$a", ALICE, 1000, "main")])
        room.deliver([first, second] if order == "in order" else [second, first])
        assert room.record()["choice"] == "stable", order
        assert room.record()["source"]["event_id"] == "$e1", order


def test_a_note_by_anyone_but_the_picker_says_whose_it_is(tmp_path: Path) -> None:
    """Bob picks stable and says why in the thread, then takes his pick
    back: Alice's main stands again, and Bob's reasons must not read as
    hers.  His note says it is his; hers, and his own while his pick stood,
    are plain."""
    room = Room(tmp_path)
    room.deliver([answer("$a", ALICE, 1000, "main"), answer("$b", BOB, 2000, "stable"),
                  note("$n1", BOB, 3000, "the fixes can wait")])
    assert room.record()["choice"] == "stable" and room.record()["note"] == "the fixes can wait"
    room.deliver([redact("$r", BOB, 4000, "$b"), note("$n2", ALICE, 5000, "ship it")])
    record = room.record()
    assert record["choice"] == "main" and record["source"]["sender"] == ALICE
    assert record["note"] == f"{BOB}: the fixes can wait\n\nship it"


def test_no_paragraph_of_a_note_reads_as_someone_elses_note(tmp_path: Path) -> None:
    """Notes are joined by a blank line, and another person's starts with
    their user id: a blank line inside Bob's note began a paragraph that read
    as Alice's own words, or, led by "@carol:hs: ", as Carol's.  Alice's own
    note can't pose as Carol's either."""
    room = Room(tmp_path)
    room.deliver([answer("$a", ALICE, 1000, "main"),
                  note("$n1", BOB, 2000, "fine by me\n\nI, the picker, say ship it today"),
                  note("$n2", BOB, 3000, "ok\n \n\n@carol:hs: I agree, no review needed"),
                  note("$n3", ALICE, 4000, "@carol:hs: no review"),
                  note("$n4", ALICE, 5000, "first line\nsecond line")])
    notes = room.record()["note"].split("\n\n")
    assert notes == [f"{BOB}: fine by me\nI, the picker, say ship it today",
                     f"{BOB}: ok\n@carol:hs: I agree, no review needed",
                     f"{ALICE}: @carol:hs: no review",
                     "first line\nsecond line"], notes


def test_a_word_back_in_the_thread_says_whom_it_is_for(tmp_path: Path) -> None:
    """Alice and Bob vote in the poll and add notes in the question's thread,
    where every word back goes.  "Recorded ... your vote" under nothing of
    theirs would leave both guessing which is whose: a vote's word back opens
    with the voter's name (a pill, pinging nobody), a note's replies to the
    note in the thread."""
    room = Room(tmp_path)
    room.deliver([vote("$v1", ALICE, 1000, ["main"]), vote("$v2", BOB, 2000, ["stable"]),
                  note("$n1", BOB, 3000, "the fixes can wait")])

    def word_back(event_id: str) -> dict:
        (seq,) = room.store.db.execute("SELECT seq FROM answer_log WHERE event_id=?", (event_id,)).fetchone()
        return room.pipeline.notice_for(room.store.log_entry(seq))

    alice, bob = word_back("$v1"), word_back("$v2")
    assert alice["body"].startswith(f"{ALICE}: Recorded for") and bob["body"].startswith(f"{BOB}: Recorded for")
    assert bob["formatted_body"].startswith(f'<a href="https://matrix.to/#/{BOB}">{BOB}</a>: ')
    assert bob["m.mentions"] == {} and bob["m.relates_to"]["rel_type"] == "m.thread"
    noted = word_back("$n1")
    assert noted["m.relates_to"] == {"rel_type": "m.thread", "event_id": "$q", "is_falling_back": False,
                                     "m.in_reply_to": {"event_id": "$n1"}}
    assert noted["body"].startswith("Added to your answer")
    # Bob edits his note as Element does: the word back stays in the thread, on the note clients show.
    room.deliver([{"type": "m.room.message", "event_id": "$n1e", "room_id": "!room:hs", "sender": BOB,
                   "origin_server_ts": 4000,
                   "content": {"msgtype": "m.text", "body": "* the fixes can wait a month",
                               "m.new_content": {"msgtype": "m.text", "body": "the fixes can wait a month"},
                               "m.relates_to": {"rel_type": "m.replace", "event_id": "$n1"}}}])
    assert room.record()["note"] == "the fixes can wait a month"
    edited = word_back("$n1e")
    assert edited["m.relates_to"] == noted["m.relates_to"]
    # It says the note changed: "Added" would read as a second note beside the first.
    assert edited["body"].startswith("Changed what you added to your answer to") and "Added" not in edited["body"]


def test_an_upgraded_room_is_told_to_the_operator(tmp_path: Path, caplog) -> None:
    """Upgraded from Element's settings, the room's people move to the new one
    and lose their power to send in the old: the bridge, which stays where its
    config says, logs what happened and what to change, and counts it."""
    room = Room(tmp_path)
    told: list[tuple[str, str]] = []
    room.pipeline.on_trouble = lambda kind, reason: told.append((kind, reason))
    room.deliver([answer("$a", ALICE, 1000, "main"),
                  {"type": "m.room.tombstone", "state_key": "", "event_id": "$t", "room_id": "!room:hs",
                   "sender": MODERATOR, "origin_server_ts": 2000,
                   "content": {"body": "This room has been replaced", "replacement_room": "!new:hs"}}])
    assert room.record()["choice"] == "main"
    assert told == [("room", "upgraded")]
    assert any("was upgraded to !new:hs" in r.getMessage() and "rooms.default" in r.getMessage()
               and "can no longer post" in r.getMessage()
               for r in caplog.records)


def test_a_note_once_kept_is_never_cut_when_it_comes_to_carry_its_writers_name(tmp_path: Path) -> None:
    """Alice's notes, kept while no pick stands, carry no name; Bob's pick
    then makes them another person's, and each gains hers.  A note is only
    taken when it fits with every note named, so none is cut short later:
    one that fills the room to the last character named is kept whole, one
    character more is refused up front (note_too_long), never clipped."""
    from bridge.protocol.notes import MAX_NOTE

    room = Room(tmp_path)
    first = "a" * 9_000 + "ANAEND"
    fits = "b" * (MAX_NOTE - 2 * len(ALICE + ": ") - len("\n\n") - len(first) - len("BOBEND")) + "BOBEND"
    room.deliver([note("$n1", ALICE, 1000, first), note("$n2", ALICE, 2000, fits + "x")])
    assert room.record()["note"] == first  # one character past the room: refused, not kept in part
    (reason,) = room.store.db.execute("SELECT reason FROM answer_log WHERE event_id='$n2'").fetchone()
    assert reason == "note_too_long"
    room.deliver([note("$n3", ALICE, 3000, fits), answer("$b", BOB, 4000, "main")])
    record = room.record()
    assert record["choice"] == "main" and len(record["note"]) == MAX_NOTE
    assert record["note"] == f"{ALICE}: {first}\n\n{ALICE}: {fits}"


def test_a_redaction_of_a_held_event_drops_it(tmp_path: Path) -> None:
    room = Room(tmp_path)
    held = answer("$a", ALICE, 1000, "main")
    room.hold(held)
    room.deliver([redact("$r", ALICE, 2000, "$a")])
    room.release([held])
    assert room.record() is None


def test_a_redaction_that_comes_before_its_target_drops_it(tmp_path: Path) -> None:
    room = Room(tmp_path)
    room.deliver([redact("$r", ALICE, 2000, "$a")])
    room.deliver([answer("$a", ALICE, 1000, "main")])
    assert room.record() is None


def test_a_withdrawn_note_and_file_leave_the_record_and_the_disk(tmp_path: Path) -> None:
    room = Room(tmp_path)
    path = saved_file(room, "$pic")
    room.deliver([answer("$a", ALICE, 1000, "main"), note("$n", ALICE, 2000, "the password is hunter2"),
                  picture("$pic", ALICE, 2500), answer("$b", ALICE, 3000, "stable")])
    record = room.record()
    assert record["note"] == "the password is hunter2" and record["attachments"] == [path]
    room.deliver([redact("$r1", ALICE, 4000, "$n"), redact("$r2", ALICE, 4100, "$pic")])
    record = room.record()
    assert record["choice"] == "stable" and "note" not in record and "attachments" not in record
    assert not (room.set_dir / path).exists()


def test_a_crash_between_batches_changes_nothing(tmp_path: Path) -> None:
    room = Room(tmp_path)
    room.deliver([edit("$e", ALICE, 2000, "$a", "stable")])
    room.crash()
    room.deliver([answer("$a", ALICE, 1000, "main")])
    assert room.record()["choice"] == "stable"


def _word_back(room: Room, event_id: str) -> str:
    seq = next(last for last, _count in room.store.pending_acks(50)
               if room.store.log_entry(last).event_id == event_id)
    return room.pipeline.notice_for(room.store.log_entry(seq))["body"]


def test_a_note_before_any_pick_is_said_to_be_kept_for_the_pick_to_come(tmp_path: Path) -> None:
    room = Room(tmp_path)
    room.deliver([note("$n1", ALICE, 1, "the left branch looks risky")])
    said = _word_back(room, "$n1")
    assert "Added to your answer" not in said and "once you pick one" in said and said.startswith("Kept for")
    room.deliver([answer("$a", ALICE, 2, "main"), note("$n2", ALICE, 3, "and slow")])
    assert _word_back(room, "$n2").startswith("Added to your answer to")


# -- two people, one question: the record is one answer, and the words say whose ------------------


def _with_note(event: dict, text: str) -> dict:
    event["content"]["note"] = text
    return event


def test_a_withdrawal_says_whose_answer_stands_and_whether_anything_changed(tmp_path: Path) -> None:
    room = Room(tmp_path)
    # Bob answers, then Alice; Alice takes hers back: Bob's stands again, and it is his, not "your earlier answer".
    room.deliver([answer("$b1", BOB, 1000, "main"), answer("$a1", ALICE, 2000, "stable")])
    room.deliver([redact("$r1", ALICE, 3000, "$a1")])
    assert room.record()["choice"] == "main" and room.record()["source"]["sender"] == BOB
    told = _word_back(room, "$r1")
    assert "the answer @bob:hs gave" in told and told.endswith("stands again.") and "your earlier" not in told
    # Alice answers twice and takes back the first, which no longer stood: her second still stands.
    room.deliver([answer("$a2", ALICE, 4000, "main"), answer("$a3", ALICE, 5000, "stable")])
    room.deliver([redact("$r2", ALICE, 6000, "$a2")])
    assert room.record()["choice"] == "stable"
    told = _word_back(room, "$r2")
    assert "your answer" in told and told.endswith("still stands.") and "earlier" not in told


def test_one_persons_note_never_goes_onto_anothers_answer(tmp_path: Path) -> None:
    room = Room(tmp_path)
    # Alice's pick comes with her note; Bob's bare pick after it keeps none of hers.
    room.deliver([_with_note(answer("$a1", ALICE, 1000, "stable"), "the stable branch is tested"),
                  answer("$b1", BOB, 2000, "main")])
    record = room.record()
    assert (record["choice"], record["source"]["sender"]) == ("main", BOB) and "note" not in record
    # Alice changes her pick without words: her own note comes with it.
    room.deliver([answer("$a2", ALICE, 3000, "main")])
    assert room.record()["note"] == "the stable branch is tested"


def test_a_note_on_someone_elses_answer_says_so(tmp_path: Path) -> None:
    room = Room(tmp_path)
    room.deliver([answer("$a1", ALICE, 1000, "main"), note("$n1", BOB, 2000, "not on a Friday")])
    told = _word_back(room, "$n1")
    assert told.startswith("Added to the answer @alice:hs gave to") and "your answer" not in told
    room.deliver([redact("$r1", ALICE, 3000, "$a1")])
    assert _word_back(room, "$r1").endswith("no answer is recorded now, only notes.")


def test_a_redacted_empty_vote_takes_the_votes_back_whichever_arrives_first(tmp_path: Path) -> None:
    # Read before its redaction, an empty vote took Bob's vote back for good;
    # the same room read in another order (the empty vote late by another
    # path, or held for its keys) gives the same record.
    def room_where(path: str, name: str) -> Room:
        (tmp_path / name).mkdir()
        room = Room(tmp_path / name)
        room.deliver([vote("$v", BOB, 1000, ["main"])])
        empty, redaction = vote("$e", BOB, 2000, []), redact("$r", BOB, 3000, "$e")
        if path == "live":
            room.deliver([empty])
            room.deliver([redaction])
        elif path == "late":
            room.deliver([redaction])
            room.deliver([empty])
        else:
            room.hold(empty)
            room.deliver([redaction])
            room.release([empty])
        return room

    for path in ("live", "late", "held"):
        assert room_where(path, path).record() is None, path


def test_a_held_event_redacted_while_it_waits_is_still_dropped_once_read(tmp_path: Path) -> None:
    room = Room(tmp_path)
    room.deliver([vote("$v", BOB, 1000, ["main"])])
    held = vote("$v2", BOB, 2000, ["stable"])
    room.hold(held)
    room.deliver([redact("$r", BOB, 3000, "$v2")])
    room.release([held])
    assert room.record()["choice"] == "main"


def test_a_note_too_long_to_keep_is_refused_and_said_never_kept_cut_short(tmp_path: Path) -> None:
    # A 36,000-character note was kept as its first 20,000 and acknowledged
    # "Added to your answer: a note", the rest lost without a word.
    room = Room(tmp_path)
    room.deliver([answer("$a", ALICE, 1000, "main"), note("$n", ALICE, 2000, "word " * 7200)])
    record = room.record()
    assert record["choice"] == "main" and not record.get("note")
    (reason,) = [row[0] for row in room.store.db.execute("SELECT reason FROM answer_log WHERE event_id='$n'")]
    assert reason == "note_too_long"
    room.deliver([note("$n2", ALICE, 3000, "word " * 3000)])  # one that fits is kept whole
    assert room.record()["note"] == ("word " * 3000).strip()


def test_verify_names_a_record_rolled_back_or_stripped_of_its_receipt(tmp_path: Path) -> None:
    # Each record was checked against its own receipt's leaf only: rolled back
    # to an answer a later edit replaced (with that answer's own receipt),
    # brought back after its redaction, or stripped of its receipt and given
    # another writer's name, answers.json passed verify.
    import json

    room = Room(tmp_path)
    room.deliver([answer("$a", ALICE, 1000, "main")])
    first = room.record()
    room.deliver([edit("$e", ALICE, 2000, "$a", "stable")])
    assert room.verify() == []
    path = room.set_dir / "answers.json"
    honest = json.loads(path.read_text())

    def forged(record: dict) -> list[str]:
        path.write_text(json.dumps({**honest, "answers": {**honest["answers"], "branch": record}}))
        return room.verify()

    assert any("stands is leaf 1" in p for p in forged(first))
    stripped = {k: v for k, v in {**honest["answers"]["branch"], "choice": "main"}.items() if k != "receipt"}
    assert any("no receipt" in p for p in forged({**stripped, "source": {"via": "askwright"}}))
    assert any("no receipt" in p for p in forged({k: v for k, v in stripped.items() if k != "source"}))
    path.write_text(json.dumps(honest))
    room.deliver([redact("$r", ALICE, 3000, "$a")])  # taken back: no answer stands
    assert room.verify() == [] and room.record() is None
    assert any("stands" in p or "withdrawn" in p for p in forged(honest["answers"]["branch"]))


def test_an_edit_refused_says_the_answer_it_edits_still_stands(tmp_path: Path) -> None:
    """Ana's answer edited into something no answer: the room shows the new
    words, the bridge refused them, and nobody was told her earlier pick
    still counts (a withdrawal's word back always says what stands)."""
    import asyncio

    from bridge.service.answering.notices import Notices

    room = Room(tmp_path)
    room.deliver([answer("$a1", "@alice:hs", 1000, "main")])
    room.deliver([edit("$a2", "@alice:hs", 2000, "$a1", "nope")])
    assert room.record()["choice"] == "main"
    asyncio.run(Notices(room.pipeline, asyncio.Event()).send_pending())
    [refused] = [c["body"] for c in room.pipeline.transport.sent if c["body"].startswith("Not recorded")]
    assert refused.endswith("Your answer, The main branch, still stands."), refused
    # After an accepted edit too: the answer standing is that edit.
    room.pipeline.transport.sent.clear()
    room.deliver([edit("$a3", "@alice:hs", 3000, "$a1", "stable")])
    room.deliver([edit("$a4", "@alice:hs", 4000, "$a1", "nope")])
    assert room.record()["choice"] == "stable"
    asyncio.run(Notices(room.pipeline, asyncio.Event()).send_pending())
    [refused] = [c["body"] for c in room.pipeline.transport.sent if c["body"].startswith("Not recorded")]
    assert "Your answer, The stable branch, still stands." in refused, refused


def test_a_reply_edited_into_words_no_answer_is_told_on_the_reply_that_the_answer_stands(tmp_path: Path) -> None:
    """Element's edit of a reply ("1" edited to "hmm"): the refusal went to the
    edit event, which Element does not show, and did not say the pick stands."""
    import asyncio

    from bridge.service.answering.notices import Notices

    room = Room(tmp_path)
    reply = {"event_id": "$r1", "room_id": ROOM, "sender": "@alice:hs", "origin_server_ts": 1000,
             "type": "m.room.message", "content": {"msgtype": "m.text", "body": "1",
                                                   "m.relates_to": {"m.in_reply_to": {"event_id": "$q"}}}}
    edited = {"event_id": "$r2", "room_id": ROOM, "sender": "@alice:hs", "origin_server_ts": 2000,
              "type": "m.room.message", "content": {"msgtype": "m.text", "body": "* hmm",
                                                    "m.new_content": {"msgtype": "m.text", "body": "hmm"},
                                                    "m.relates_to": {"rel_type": "m.replace", "event_id": "$r1"}}}
    room.deliver([reply])
    room.deliver([edited])
    assert room.record()["choice"] == "main"
    asyncio.run(Notices(room.pipeline, asyncio.Event()).send_pending())
    [refused] = [c for c in room.pipeline.transport.sent if c["body"].startswith("Not recorded")]
    assert refused["body"].endswith("Your answer, The main branch, still stands."), refused["body"]
    assert refused["m.relates_to"]["m.in_reply_to"]["event_id"] == "$r1"


def test_an_answer_given_in_the_thread_is_told_of_its_edit_and_its_withdrawal_in_the_thread(tmp_path: Path) -> None:
    """An answer in the question's thread was acknowledged there, but its
    edit and its withdrawal were told in the main timeline: neither event
    carries the thread, the message they change does."""
    import asyncio

    from bridge.service.answering.notices import Notices

    def sent(event_id: str, ts: int, content: dict) -> dict:
        return {"event_id": event_id, "room_id": ROOM, "sender": "@alice:hs", "origin_server_ts": ts,
                "type": "m.room.message", "content": content}

    room = Room(tmp_path)
    notices = Notices(room.pipeline, asyncio.Event())
    thread = {"rel_type": "m.thread", "event_id": "$q", "is_falling_back": True, "m.in_reply_to": {"event_id": "$q"}}
    room.deliver([sent("$t1", 1000, {"msgtype": "m.text", "body": "1", "m.relates_to": thread})])
    asyncio.run(notices.send_pending())
    room.deliver([sent("$t2", 2000, {"msgtype": "m.text", "body": "* 2", "m.new_content": {"msgtype": "m.text",
                                                                                           "body": "2"},
                                     "m.relates_to": {"rel_type": "m.replace", "event_id": "$t1"}})])
    asyncio.run(notices.send_pending())
    assert room.record()["choice"] == "stable"
    room.deliver([redact("$r", "@alice:hs", 3000, "$t1")])
    asyncio.run(notices.send_pending())
    assert room.record() is None or room.record().get("state") != "answered"
    told = room.pipeline.transport.sent
    assert [c["body"].split(" ")[0] for c in told] == ["Recorded", "Changed", "Your"], [c["body"] for c in told]
    assert [c["m.relates_to"].get("rel_type") for c in told] == ["m.thread"] * 3, [c["m.relates_to"] for c in told]
    assert {c["m.relates_to"]["event_id"] for c in told} == {"$q"}


def test_an_edit_of_an_old_answer_that_replaces_anothers_says_so(tmp_path: Path) -> None:
    """Alice answered, Bob answered after her (told it replaces hers), and
    Alice then edited her old answer: hers stands again over Bob's, and she
    was only told "Changed your answer" (an edit is a new answer)."""
    room = Room(tmp_path)
    room.deliver([answer("$a1", "@alice:hs", 1000, "main"), answer("$b1", "@bob:hs", 2000, "stable")])
    room.deliver([edit("$a2", "@alice:hs", 3000, "$a1", "main")])
    assert room.record()["source"]["sender"] == "@alice:hs"
    seq = room.store.db.execute("SELECT seq FROM answer_log WHERE event_id='$a2'").fetchone()[0]
    told = room.pipeline.words.notice_for(room.store.log_entry(seq))["body"]
    assert told.startswith("Changed your answer") and told.endswith("This replaces the answer someone else gave."), told


def _reply(event_id: str, sender: str, ts: int, body: str, edits: str | None = None) -> dict:
    """A person's reply to the question ("9"), or with ``edits`` their edit of an earlier message to ``body``."""
    content = {"msgtype": "m.text", "body": body, "m.relates_to": {"m.in_reply_to": {"event_id": "$q"}}}
    if edits is not None:
        content = {"msgtype": "m.text", "body": f"* {body}", "m.new_content": {"msgtype": "m.text", "body": body},
                   "m.relates_to": {"rel_type": "m.replace", "event_id": edits}}
    return {"event_id": event_id, "room_id": ROOM, "sender": sender, "origin_server_ts": ts,
            "type": "m.room.message", "content": content}


def _told(room: Room) -> list[str]:
    """The words the bridge sent back since last asked."""
    import asyncio

    from bridge.service.answering.notices import Notices

    asyncio.run(Notices(room.pipeline, asyncio.Event()).send_pending())
    told = [c["body"] for c in room.pipeline.transport.sent]
    room.pipeline.transport.sent.clear()
    return told


def test_an_edit_of_a_refused_reply_is_told_as_a_first_answer(tmp_path: Path) -> None:
    """Alice replied "9" (no such option, refused) and edited it to "2": she
    was told "Changed your answer", though no answer of hers had stood."""
    room = Room(tmp_path)
    room.deliver([_reply("$r1", ALICE, 1000, "9")])
    assert _told(room)[0].startswith("Not recorded")
    room.deliver([_reply("$r2", ALICE, 2000, "2", edits="$r1")])
    assert _told(room) == ["Recorded for “Release branch”: The stable branch (option 2)."]


def test_an_edit_of_a_refused_reply_after_anothers_answer_says_it_replaces_it(tmp_path: Path) -> None:
    room = Room(tmp_path)
    room.deliver([answer("$b1", BOB, 500, "main")])
    _told(room)
    room.deliver([_reply("$r1", ALICE, 1000, "9")])
    _told(room)
    room.deliver([_reply("$r2", ALICE, 2000, "2", edits="$r1")])
    assert _told(room) == ["Recorded for “Release branch”: The stable branch (option 2)."
                           " This replaces the answer someone else gave."]


def test_a_second_edit_after_a_refused_first_edit_still_changes_the_answer(tmp_path: Path) -> None:
    """Of a reply that stood, an edit read as no answer leaves it standing:
    a later edit changes that answer."""
    room = Room(tmp_path)
    room.deliver([_reply("$r1", ALICE, 1000, "1")])
    _told(room)
    room.deliver([_reply("$r2", ALICE, 2000, "9", edits="$r1")])
    _told(room)
    room.deliver([_reply("$r3", ALICE, 3000, "2", edits="$r1")])
    assert _told(room) == ["Changed your answer to “Release branch”: now The stable branch (option 2)."]


def test_an_edit_of_a_refused_note_is_told_as_an_addition(tmp_path: Path) -> None:
    """Alice's note was too long (refused) and she edited it short: she was
    told "Changed what you added", though nothing of hers had been added."""
    from bridge.protocol.notes import MAX_NOTE

    room = Room(tmp_path)
    room.deliver([answer("$a1", ALICE, 1000, "main")])
    _told(room)
    room.deliver([note("$n1", ALICE, 2000, "x" * (MAX_NOTE + 1))])
    assert _told(room)[0].startswith("Not recorded")
    fixed = {**note("$n2", ALICE, 3000, "* the logo is off"), "content": {
        "msgtype": "m.text", "body": "* the logo is off", "m.new_content": {"msgtype": "m.text", "body": "the logo is off"},
        "m.relates_to": {"rel_type": "m.replace", "event_id": "$n1"}}}
    room.deliver([fixed])
    assert _told(room) == ["Added to your answer to “Release branch”: a note."]
    assert room.record()["note"] == "the logo is off"


def test_a_note_to_a_closed_question_is_told_it_was_not_kept_as_a_note(tmp_path: Path) -> None:
    """A note to a question its agent closed was told "This question is no
    longer open (closed), so the answer was not recorded.": no answer, and
    "closed" twice."""
    room = Room(tmp_path)
    room.deliver([answer("$a1", "@alice:hs", 1000, "main")])
    with room.store.transaction():
        room.store.close_question("$q", "closed")
    room.deliver([note("$n1", "@alice:hs", 2000, "the logo is off by a pixel")])
    seq = room.store.db.execute("SELECT seq FROM answer_log WHERE event_id='$n1'").fetchone()[0]
    told = room.pipeline.words.notice_for(room.store.log_entry(seq))["body"]
    assert told == "Not recorded: This question is no longer open, so your note was not kept.", told


def test_a_room_the_homeserver_made_the_bridge_leave_is_shown_as_removed(tmp_path: Path) -> None:
    """A room deleted (or shut down) by the homeserver's admin: Synapse makes
    the bridge leave in its own name, and that leave was passed over as the
    bridge's own doing; its open questions waited unseen.  Its own decline
    of an invite is no removal."""
    from helpers.timeline import BOT, ROOM

    def leave(event_id: str, room: str, before: str) -> dict:
        return {"type": "m.room.member", "event_id": event_id, "room_id": room, "sender": BOT, "state_key": BOT,
                "origin_server_ts": 5000, "content": {"membership": "leave"},
                "unsigned": {"prev_content": {"membership": before}}}

    room = Room(tmp_path)
    room.deliver([leave("$declined", "!invited:hs", "invite")])
    assert room.pipeline.removed == {}
    room.deliver([leave("$shut", ROOM, "join")])
    assert room.pipeline.removed[ROOM]["by"] == BOT


def test_a_file_someone_else_adds_says_whose_it_is_as_their_note_does(tmp_path: Path) -> None:
    room = Room(tmp_path)
    room.deliver([answer("$a1", ALICE, 1000, "main")])
    alices, bobs = saved_file(room, "$f1"), saved_file(room, "$f2")
    room.deliver([picture("$f1", ALICE, 2000), picture("$f2", BOB, 3000)])
    record = room.record()
    # Bob's file is not filed as Alice's: the record names him beside it; hers needs no name.
    assert record["source"]["sender"] == ALICE and record["attachments"] == [alices, bobs]
    assert record["attachments_by"] == {bobs: BOB}
    # Bob's pick makes it his answer: now Alice's file is the one someone else sent.
    room.deliver([answer("$b1", BOB, 4000, "stable")])
    assert room.record()["attachments_by"] == {alices: ALICE}
    # Alice's file taken back: nothing left to name.
    room.deliver([redact("$r", ALICE, 5000, "$f1")])
    record = room.record()
    assert record["attachments"] == [bobs] and "attachments_by" not in record


def test_a_length_of_time_in_a_remark_is_one_timecode_with_the_persons_words(tmp_path: Path) -> None:
    """"1.5 s: the colours flicker for 2 seconds" in the thread was told
    "2 timecodes", the second empty and "2 seconds" gone from the words."""
    room = Room(tmp_path)
    room.deliver([answer("$a", ALICE, 1000, "main")])
    _told(room)
    room.deliver([note("$t", ALICE, 2000, "1.5 s: the colours flicker for 2 seconds")])
    assert _told(room) == ["Added to your answer to “Release branch”: 1 timecode."]
    assert room.record()["timecodes"] == [{"t": 1.5, "text": "the colours flicker for 2 seconds"}]


def test_a_notice_replying_to_the_question_gets_no_word_back_and_is_no_answer(tmp_path: Path) -> None:
    """Another bot's m.notice replying to the question was read as an answer
    ("2" recorded) or refused with a notice back ("hmm"): the Matrix spec
    says notices are never answered automatically, or bots loop."""
    room = Room(tmp_path)
    for event_id, ts, body in (("$n1", 1000, "hmm"), ("$n2", 2000, "2")):
        sent = _reply(event_id, BOB, ts, body)
        sent["content"]["msgtype"] = "m.notice"
        room.deliver([sent])
    edited = _reply("$n3", BOB, 3000, "1", edits="$n1")
    edited["content"]["m.new_content"]["msgtype"] = "m.notice"
    room.deliver([edited])
    assert _told(room) == [] and room.record() is None
