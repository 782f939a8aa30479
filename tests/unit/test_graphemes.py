"""Text cut short never breaks a character a person sees: words back,
titles, poll answers and quoted replies end on a whole one."""

from __future__ import annotations

import pytest

from bridge.protocol.graphemes import cut
from bridge.protocol.normalize import _cant_read
from bridge.protocol.outcome import describe_record
from bridge.protocol.render import TITLE_SHOWN, shown_title

FAMILY = "\U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466"  # one family emoji
FLAG = "\U0001F1EB\U0001F1F7"  # the French flag: two regional indicators
ACCENTED = "e\u0301\u0301"  # e and two combining acute accents
KEYCAP = "1\ufe0f\u20e3"
THUMB = "\U0001F44D\U0001F3FD"  # a thumbs up with a skin tone


@pytest.mark.parametrize("cluster", [FAMILY, FLAG, ACCENTED, KEYCAP, THUMB])
def test_a_cut_inside_a_character_backs_off_to_its_start(cluster):
    text = "ab" + cluster + "cd"
    for end in range(3, 2 + len(cluster)):
        assert cut(text, end) == "ab", (cluster, end)
    assert cut(text, 2 + len(cluster)) == "ab" + cluster


def test_flags_side_by_side_are_cut_between_pairs():
    flags = FLAG * 3
    assert cut(flags, 3) == FLAG and cut(flags, 4) == FLAG * 2 and cut(flags, 10) == flags


def test_what_a_person_reads_ends_on_a_whole_character():
    """A title, a quoted text answer or a reply that could not be read, cut
    in the middle of a family emoji or a flag: half an emoji and a stray
    joiner (or a letter in a box) showed before the "…"."""
    title = shown_title("a" * (TITLE_SHOWN - 3) + FAMILY + "tail")
    assert title == "a" * (TITLE_SHOWN - 3) + "\u2026", title[-8:]
    quoted = describe_record({"text": "x" * 79 + FLAG + " more"})
    assert quoted == "\u201c" + "x" * 79 + "\u2026\u201d", quoted
    from bridge.protocol.recorded import RecordedQuestion

    question = RecordedQuestion("$q", "!r", "s", {"question": {"id": "q", "kind": "text", "title": "T", "options": []}})
    said = _cant_read("y" * 58 + FLAG + "z" * 5, question)
    assert "\u201c" + "y" * 58 + "\u2026\u201d" in said, said


def test_an_echoed_id_or_user_id_ends_on_a_whole_character():
    """A refusal quoting an option id a person typed, or lint naming a user
    id that is none, cut a family emoji in half before the "…"."""
    from bridge.protocol.judge import _quote
    from bridge.protocol.userids import user_id_problem

    assert _quote("b" * 58 + FLAG + "y" * 5) == "\u201c" + "b" * 58 + "\u2026\u201d"
    said = user_id_problem("a" * 57 + FAMILY + "x" * 10)
    assert said.startswith('"' + "a" * 57 + "\u2026" + '"'), said


def test_lint_validate_file_names_and_agent_errors_end_on_a_whole_character():
    """A value lint quotes, a question `validate` could not read, a file
    name a refusal names and a text the agents' API echoes back each cut
    a flag in half before the "…"."""
    from bridge.agents.errors import MAX_TEXT, clipped
    from bridge.commands.validate import Unreadable, _question_event
    from bridge.protocol.file_problems import shown_name
    from bridge.questionset.lint.access import quote

    assert quote("q" * 58 + FLAG + "r") == '"' + "q" * 58 + "\u2026" + '"'
    assert shown_name("n" * 58 + FLAG + ".png") == "n" * 58 + "\u2026"
    assert clipped("t" * (MAX_TEXT - 1) + FLAG + "u") == "t" * (MAX_TEXT - 1) + "\u2026"
    event = {"type": "dev.superpipeline.question.v2", "event_id": "$q", "room_id": "!r", "sender": "@b:hs",
             "content": {"question": {"id": "q", "kind": "text", "title": "T", "expires": "x" * 77 + FLAG}}}
    with pytest.raises(Unreadable) as refused:
        _question_event(event)
    assert '"' + "x" * 77 + "\u2026 " in str(refused.value), str(refused.value)
