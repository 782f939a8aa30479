"""The pieces around the normaliser: notes and timecodes, folding notes into
records, the store's withdrawals, the poll content, quiz feedback, media headers."""

from __future__ import annotations

import struct
import zlib

import pytest

from bridge.protocol.annotate import MAX_ATTACHMENTS, delta, fold_records, merge
from bridge.protocol.notes import MAX_TIMECODE_TEXT, MAX_TIMECODES, parse_note, parse_timecode
from bridge.protocol.poll import POLL_START, poll_end, poll_start
from bridge.protocol.study import complete, feedback, score, score_text
from bridge.questionset.model import QuestionSet
from bridge.service.answering.attachments import extension
from bridge.service.posting.media import figure_message, image_size
from bridge.service.storage.store import LogEntry, Store
from test_normalize import QUESTIONS


# ---------------------------------------------------------------- notes


@pytest.mark.parametrize("line, t, text", [
    ("1.4 s: the arrow jumps", 1.4, "the arrow jumps"), ("1.4s - jumps", 1.4, "jumps"), ("at 2 sec", 2.0, ""),
    ("0:07 the logo", 7.0, "the logo"), ("1:02:03.5 \u2014 end", 3723.5, "end"), ("@12.345s: x", 12.35, "x"),
    ("3,5 s: comma", 3.5, "comma"),
])
def test_timecode_lines(line, t, text):
    code = parse_timecode(line)
    assert code is not None and (code.t, code.text) == (t, text)


@pytest.mark.parametrize("line", ["1. a list item", "version 2.0 s", "keep it", "12 seconds later it breaks"[3:]])
def test_lines_that_are_not_timecodes(line):
    assert parse_timecode(line) is None


@pytest.mark.parametrize("line, codes", [
    ("0:01 the left side smears; 1.5 s: the colours flicker", [(1.0, "the left side smears"), (1.5, "the colours flicker")]),
    ("0:07 the logo, then at 0:09 it fades", [(7.0, "the logo"), (9.0, "it fades")]),
    ("1 s: a 2 s: b 3 s: c", [(1.0, "a"), (2.0, "b"), (3.0, "c")]),
    ("3,5 s: one time with a decimal comma", [(3.5, "one time with a decimal comma")]),
    ("1 s: build v2:30 is fine", [(1.0, "build v2:30 is fine")]),
])
def test_every_time_in_a_timecode_line_is_its_own_timecode(line, codes):
    note = parse_note(line)
    assert [(code.t, code.text) for code in note.timecodes] == codes and note.text == ""


@pytest.mark.parametrize("line, codes", [
    ("1.5 s: the colours flicker for 2 seconds", [(1.5, "the colours flicker for 2 seconds")]),
    ("0:07 the logo lasts 3 s too long", [(7.0, "the logo lasts 3 s too long")]),
    ("2s fade is 10 sec instead of 5 sec", [(2.0, "fade is 10 sec instead of 5 sec")]),
    ("1 s: it flickers; 2 s", [(1.0, "it flickers; 2 s")]),
    ("0:01 it smears and 0:03 it fades", [(1.0, "it smears"), (3.0, "it fades")]),
])
def test_a_length_of_time_inside_a_remark_stays_in_its_words(line, codes):
    """"1.5 s: the colours flicker for 2 seconds" became two timecodes, the
    second empty, and the person's "2 seconds" was lost: a later time starts
    a timecode only after a separator or written as a label, with words after it."""
    note = parse_note(line)
    assert [(code.t, code.text) for code in note.timecodes] == codes and note.text == ""


def test_limits_on_timecodes():
    note = parse_note("\n".join(f"{n} s: x" for n in range(60)))
    assert len(note.timecodes) == MAX_TIMECODES and note.text.count("\n") == 9
    assert len(parse_note("1 s: " + "y" * 900).timecodes[0].text) == MAX_TIMECODE_TEXT


# ---------------------------------------------------------------- folding notes into records


SOURCE = {"via": "matrix"}


def pick(choice: str) -> dict:
    return {"qid": "q", "state": "answered", "choice": choice, "q_rev": 1, "rev": 1, "updated": "t", "source": SOURCE}


def note(text: str, **more) -> dict:
    return delta(note=text, attachments=more.get("attachments", []), timecodes=more.get("timecodes", []), q_rev=1,
                 source=SOURCE, now="t")


def test_notes_alone_are_note_only_at_rev_1():
    notes = [(delta(note="hm", attachments=[], timecodes=[], q_rev=2, source=SOURCE, now="t"), (5, 1))]
    record = fold_records("q", [], notes, 0)
    assert (record["state"], record["note"], record["rev"], record["q_rev"]) == ("note_only", "hm", 1, 2)


def test_every_standing_note_folds_into_the_standing_pick_before_or_after_it():
    late = note("late", attachments=["attachments/q-1.png"], timecodes=[{"t": 1.0, "text": ""}])
    record = fold_records("q", [(pick("a"), False, None, (2, 2))], [(note("early"), (1, 1)), (late, (3, 3))], 1)
    assert record["choice"] == "a" and record["note"] == "early\n\nlate"
    assert record["attachments"] == ["attachments/q-1.png"] and record["timecodes"] == [{"t": 1.0, "text": ""}]


def test_a_withdrawn_note_is_not_in_the_record():
    # What is withdrawn is not handed in at all: the pick stands alone.
    record = fold_records("q", [(pick("b"), False, None, (3, 3))], [], 2)
    assert "note" not in record and "attachments" not in record and record["rev"] == 2


def test_a_pick_without_words_keeps_the_earlier_picks_note_unless_it_was_an_input():
    with_note = {**pick("a"), "note": "thin shaft"}
    kept = fold_records("q", [(pick("b"), False, None, (3, 3)), (with_note, False, "thin shaft", (1, 1))], [], 2)
    assert kept["note"] == "thin shaft"
    dropped = fold_records("q", [(pick("b"), False, None, (3, 3)), (with_note, False, None, (1, 1))], [], 2)
    assert "note" not in dropped


def test_a_record_from_before_takes_only_later_notes():
    whole = {**pick("a"), "note": "early"}
    record = fold_records("q", [(whole, True, None, (2, 2))], [(note("early"), (1, 1)), (note("late"), (3, 3))], 1)
    assert record["note"] == "early\n\nlate"


def test_nothing_left_is_no_record():
    assert fold_records("q", [], [], 3) is None


def test_merge_keeps_the_limits():
    record = {"attachments": [f"attachments/q-{n}" for n in range(MAX_ATTACHMENTS)]}
    assert len(merge(record, {"attachments": ["attachments/more"]})["attachments"]) == MAX_ATTACHMENTS


# ---------------------------------------------------------------- the store


def entry(event_id: str, outcome: str, record: dict, via: str = "reply", replaces: str | None = None) -> LogEntry:
    return LogEntry(event_id, "!r", "@a:hs", via, outcome, set_id="s", set_dir="/sets/s", qid="q",
                    question_event_id="$q", record=record, replaces=replaces)


@pytest.mark.usefixtures("store_backend")
def test_a_redaction_of_the_original_withdraws_its_edits(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    with store.transaction():
        store.append_log(entry("$first", "accepted", pick("a")))
        store.append_log(entry("$second", "accepted", pick("b")))
        store.append_log(entry("$edit", "accepted", pick("c"), via="edit", replaces="$second"))
        assert store.projection("/sets/s", "q")["choice"] == "c"
        assert store.withdraw("$second") == ("/sets/s", "s", "q")
    record = store.projection("/sets/s", "q")
    assert (record["choice"], record["rev"]) == ("a", 3)  # falls back; rev counts every answer


@pytest.mark.usefixtures("store_backend")
def test_an_empty_vote_withdraws_only_that_persons_votes(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    with store.transaction():
        store.append_log(entry("$reply", "accepted", pick("a")))
        store.append_log(entry("$vote", "accepted", pick("b"), via="poll"))
        assert store.withdraw_votes("$q", "@a:hs") is not None
        assert store.withdraw_votes("$q", "@a:hs") is None
    assert store.projection("/sets/s", "q")["choice"] == "a"
    assert store.logged_question("$vote") == ("$q", "poll")


@pytest.mark.usefixtures("store_backend")
def test_attachments_are_remembered_once(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    with store.transaction():
        store.record_attachment("$img", "/sets/s", "q", "attachments/q-1.png", None)
        store.record_attachment("$img", "/sets/s", "q", "attachments/q-2.png", None)
        store.record_attachment("$big", "/sets/s", "q", None, "attachment_too_large")
    assert store.attachment("$img") == ("attachments/q-1.png", None)
    assert store.attachment_count("/sets/s", "q") == 2 and store.attachment("$none") is None


# ---------------------------------------------------------------- polls


def test_the_poll_lists_the_options_in_the_events_order_with_unsure():
    content = poll_start(QUESTIONS["takes"])
    poll = content[POLL_START]
    # "other" needs words a vote cannot carry: it is left to a reply.
    assert [a["id"] for a in poll["answers"]] == ["t2", "t5", "unsure"]
    # On a compare the poll shows the sides, as the message does, not the take names.
    assert [a["org.matrix.msc1767.text"] for a in poll["answers"]][:2] == ["Left", "Right"]
    assert poll["max_selections"] == 1 and poll["kind"] == "org.matrix.msc3381.poll.disclosed"


def test_no_poll_for_the_kinds_answered_by_reply():
    assert all(poll_start(QUESTIONS[q]) is None for q in ("platforms", "order", "name"))


def test_poll_end_references_the_poll():
    assert poll_end("$p", "closed")["m.relates_to"] == {"rel_type": "m.reference", "event_id": "$p"}


# ---------------------------------------------------------------- quizzes


def quiz() -> QuestionSet:
    return QuestionSet.model_validate({"askwright": 1, "id": "quiz", "title": "Quiz", "mode": "study", "questions": [
        {"id": "a", "kind": "choice", "title": "A", "question": "A?", "topic": "t1",
         "options": [{"id": "x", "label": "X", "correct": True, "why": "X is it."},
                     {"id": "y", "label": "Y", "why": "Y is a trap."}]},
        {"id": "b", "kind": "choice", "title": "B", "question": "B?", "topic": "t2", "points": 2,
         "options": [{"id": "x", "label": "X", "correct": True, "why": "Yes."}, {"id": "y", "label": "Y", "why": "No."}]},
        {"id": "c", "kind": "choice", "title": "C", "question": "C?", "bonus": True,
         "options": [{"id": "x", "label": "X", "correct": True, "why": "Yes."}, {"id": "y", "label": "Y", "why": "No."}]},
        {"id": "d", "kind": "text", "title": "D", "question": "D?", "model_answer": "d"},
    ]})


def test_feedback_right_and_wrong():
    qset = quiz()
    assert feedback(qset.question("a"), {"choice": "x"}) == "Right. X is it."
    assert feedback(qset.question("a"), {"choice": "y"}) == "Not quite. Y is a trap. The answer is \u201cX\u201d: X is it."
    assert feedback(qset.question("d"), {"text": "words"}).startswith("Your answer is stored for grading")


def test_score_by_topic_with_the_bonus_apart():
    qset = quiz()
    answers = {"a": {"state": "answered", "choice": "x"}, "b": {"state": "answered", "choice": "y"},
               "c": {"state": "answered", "choice": "x"}}
    assert not complete(qset, answers)
    answers["d"] = {"state": "answered", "text": "d"}
    assert complete(qset, answers)
    result = score(qset, answers)
    assert (result.points, result.possible, result.bonus, result.to_grade) == (1, 3, (1, 1), 1)
    assert result.by_topic == {"t1": (1, 1), "t2": (0, 2)}
    assert score_text(qset, result).startswith("Score for \u201cQuiz\u201d: 1 of 3.")


# ---------------------------------------------------------------- media and files


def test_image_size_from_png_and_jpeg_headers():
    png = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + struct.pack(">II", 640, 480) + b"\x08\x02\x00\x00\x00"
    assert image_size(png + struct.pack(">I", zlib.crc32(b""))) == (640, 480)
    jpeg = b"\xff\xd8" + b"\xff\xe0" + struct.pack(">H", 4) + b"\x00\x00" + b"\xff\xc0" + struct.pack(">HBHH", 11, 8, 200, 300) + b"\x00" * 6
    assert image_size(jpeg) == (300, 200)
    assert image_size(b"GIF89a") == (None, None)


@pytest.mark.parametrize("start, said", [(1.5, "(from 1.5 s)"), ("1.25 s", "(from 1.25 s)"), ("0:07", "(from 0:07)")])
def test_a_media_files_caption_says_its_start_unit_once(start, said):
    """The file posted in the thread said "(from 0:07 s)" for a start written "0:07"."""
    from bridge.questionset.model import MediaItem
    from bridge.service.posting.media import Upload, media_message
    content = media_message(MediaItem(src="clip.mp4", label="The clip", start=start),
                            Upload(url="mxc://hs/clip", mimetype="video/mp4", size=10, name="clip.mp4"))
    assert content["body"] == f"The clip {said}"


def test_a_figure_is_posted_as_escaped_text():
    from bridge.questionset.model import MediaItem
    content = figure_message(MediaItem(figure={"type": "bar", "title": "<b>x</b>"}, alt="Bars <i>"), 0)
    assert content["msgtype"] == "m.notice" and "Bars <i>" in content["body"]
    assert "<i>" not in content["formatted_body"] and "<b>x" not in content["formatted_body"]


@pytest.mark.parametrize("content, info, ext", [
    ({"body": "shot.PNG"}, {}, "png"), ({"body": "../../etc/passwd"}, {"mimetype": "image/jpeg"}, "jpg"),
    ({"body": "x.tar.gz;rm -rf"}, {}, "bin"), ({"body": "noext", "filename": "a.webp"}, {}, "webp"),
    # A newline at the name's end (Python's $ matches before it) would end up in the saved file's name.
    ({"body": "shot.png\n"}, {"mimetype": "image/jpeg"}, "jpg"), ({"body": "x", "filename": "a.gif\n"}, {}, "bin"),
    # With a filename the body is a caption (the spec's m.file): never the name's extension.
    ({"body": "crash in v2.3", "filename": "Screenshot"}, {"mimetype": "image/png"}, "png"),
    ({"body": "see example.com", "filename": "clip"}, {}, "bin"),
    # Dots in a name with no extension (a macOS screenshot's, a version): the
    # mimetype says what it is (it was a ".32", application/octet-stream to agents).
    ({"body": "Screenshot 2026-12-07 at 10.15.32", "filename": "Screenshot 2026-12-07 at 10.15.32"},
     {"mimetype": "image/png"}, "png"),
    ({"body": "release notes v2.3"}, {"mimetype": "application/pdf"}, "pdf"),
    # A plain extension nothing here knows stays, as with no mimetype to say better.
    ({"body": "data.parquet"}, {"mimetype": "application/octet-stream"}, "parquet"),
    ({"body": "take.mov"}, {"mimetype": "video/mp4"}, "mov"),
    # A voice message's mimetype with its codec, and kinds the table lacks: they were ".bin".
    ({"body": "Voice message"}, {"mimetype": "audio/webm; codecs=opus"}, "webm"),
    ({"body": "Recording"}, {"mimetype": "audio/x-m4a"}, "m4a"),
    ({"body": "notes", "filename": "notes"}, {"mimetype": "text/markdown"}, "md"),
    ({"body": "export"}, {"mimetype": "text/csv"}, "csv"),
    ({"body": "thing"}, {"mimetype": "application/x-nothing-known"}, "bin"),
])
def test_attachment_extensions_are_safe(content, info, ext):
    assert extension(content, info) == ext
