"""The record is what the room's timeline says, whatever the order or the
path events arrive by: driven through the real pipeline and store."""

from __future__ import annotations

from pathlib import Path

from helpers.timeline import MODERATOR, Room, answer, edit, note, picture, redact, saved_file

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
                  edit("$e2", ALICE, 3000, "$e1", "main")])  # an edit of the edit
    assert room.record()["choice"] == "main" and room.record()["source"]["event_id"] == "$e2"
    room.deliver([redact("$r", ALICE, 4000, "$e2")])
    assert room.record()["choice"] == "stable"
    room.deliver([redact("$r2", ALICE, 5000, "$e1")])
    assert room.record()["choice"] == "main" and room.record()["source"]["event_id"] == "$a"


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
