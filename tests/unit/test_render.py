"""The readable message: escaped, Element-safe, numbered as the event is."""

from __future__ import annotations

import re
from typing import Any

import pytest

from bridge.protocol.question_event import build_question_event, new_elicitation_id
from bridge.protocol.render import ALLOWED_TAGS, KEYCAPS, esc_timecodes, render, render_body, short_digest
from bridge.questionset.model import QuestionSet
from helpers.html import parse

HOSTILE = [
    "<script>alert(1)</script>",
    '<img src=x onerror="alert(1)">',
    "[x](javascript:alert(1))",
    "&amp; and \"quotes\" and 'single'",
]


def question(kind: str = "choice", **fields: Any) -> dict[str, Any]:
    q: dict[str, Any] = {
        "id": "q1",
        "kind": kind,
        "title": "The database",
        "question": "Which database should the service use?",
        "why": "The schema work starts tomorrow.",
        "options": [
            {"id": "pg", "label": "PostgreSQL", "consequence": "One more service to run."},
            {"id": "sqlite", "label": "SQLite"},
            {"id": "duck", "label": "DuckDB"},
        ],
        "guess": {"option": "pg", "why": "You run it elsewhere.", "confidence": "high"},
    }
    if kind == "text":
        del q["options"]
        q["guess"] = {"text": "main", "why": "The usual.", "confidence": "high"}
    if kind == "multi":
        q["guess"] = {"options": ["pg", "duck"], "why": "Both.", "confidence": "high"}
    if kind == "rank":
        q["guess"] = {"order": ["duck", "pg", "sqlite"], "why": "Speed.", "confidence": "high"}
    q.update(fields)
    return q


def event(q: dict[str, Any], *, title: str = "Demo decisions", **kwargs: Any) -> dict[str, Any]:
    qset = QuestionSet.model_validate({"askwright": 1, "id": "demo", "title": title, "questions": [q]})
    model = qset.questions[0]
    eid = new_elicitation_id("demo", model.id, model.rev, "test")
    return build_question_event(qset, model, elicitation_id=eid, **kwargs)


# ---------------------------------------------------------------- content shown


def test_body_shows_everything_a_reader_needs() -> None:
    body = event(question())["body"]
    for part in ("Demo decisions", "The database", "Which database should the service use?", "The schema work starts tomorrow."):
        assert part in body
    assert "1. PostgreSQL \u2014 One more service to run." in body
    assert "4. Not sure, ask me later" in body
    assert "5. Something else" in body
    assert "My guess: PostgreSQL (1) \u2014 You run it elsewhere." in body


def test_html_shows_everything_a_reader_needs() -> None:
    html = event(question())["formatted_body"]
    assert "<h4>Question: The database</h4>" in html
    assert "<em>Demo decisions</em>" in html
    assert "<li>PostgreSQL \u2014 <em>One more service to run.</em></li>" in html
    assert "<li>Not sure, ask me later</li>\n<li>Something else</li>\n</ol>" in html
    assert "My guess: <strong>PostgreSQL (1)</strong> \u2014 You run it elsewhere." in html


@pytest.mark.parametrize("kind", ["choice", "multi", "rank", "scale", "confirm", "compare", "text"])
def test_numbered_options_follow_event_order(kind: str) -> None:
    content = event(question(kind))
    options = content["question"]["options"]
    if kind == "text":
        # The reply is the answer itself: nothing is numbered, unsure is spelled out.
        assert not re.search(r"^\d+\. ", content["body"], flags=re.MULTILINE)
        assert "<ol>" not in content["formatted_body"]
        assert "reply unsure" in content["body"]
        return
    # multi/rank: the built-ins are not in the list (they can't be combined
    # with picks) but keep their numbers, set apart under it.
    listed = [o for o in options if o["id"] not in ("unsure", "other")] if kind in ("multi", "rank") else options
    body_numbers = re.findall(r"^(\d+)\. (.+)$", content["body"], flags=re.MULTILINE)
    assert [int(n) for n, _ in body_numbers] == list(range(1, len(listed) + 1))
    assert [label.split(" \u2014 ")[0] for _, label in body_numbers] == [o["label"] for o in listed]
    html_items = re.findall(r"<li>(.*?)</li>", content["formatted_body"].split("<ol>")[1].split("</ol>")[0])
    assert [item.split(" \u2014 ")[0] for item in html_items] == [o["label"] for o in listed]
    if kind in ("multi", "rank"):
        n = len(listed)
        apart = f"Or, on its own instead of picks: reply unsure ({n + 1} \u00b7 Not sure, ask me later) or other: <your text> ({n + 2} \u00b7 Something else)."
        assert apart in content["body"]
        assert f"<code>unsure</code> ({n + 1} \u00b7 Not sure, ask me later)" in content["formatted_body"]


def test_shuffled_order_is_the_numbered_order() -> None:
    content = event(question(), order=["duck", "pg", "sqlite"])
    assert "1. DuckDB" in content["body"] and "2. PostgreSQL" in content["body"]
    assert "My guess: PostgreSQL (2)" in content["body"]


def test_compare_sides_read_as_sides() -> None:
    q = question("compare", sides={"left": "pg", "right": "sqlite", "randomized": True}, look_for=["The rows from 1.0 s on"])
    q["guess"] = {"option": "sqlite", "why": "Smaller.", "confidence": "high"}
    content = event(q)
    assert "1. Left" in content["body"] and "2. Right" in content["body"] and "3. DuckDB" in content["body"]
    assert "PostgreSQL" not in content["body"] and "PostgreSQL" not in content["formatted_body"]
    assert "My guess: Right (2)" in content["body"]


# ---------------------------------------------------------------- guess


def test_low_guess_hidden_behind_spoiler() -> None:
    q = question()
    q["guess"] = {"option": "sqlite", "why": "Smallest to run.", "confidence": "low"}
    content = event(q)
    assert "(guess hidden" in content["body"]
    assert "SQLite (2)" not in content["body"] and "Smallest to run." not in content["body"]
    html = content["formatted_body"]
    spoiler = re.search(r"<span data-mx-spoiler>(.*?)</span>", html)
    assert spoiler is not None and "SQLite (2)" in spoiler.group(1) and "Smallest to run." in spoiler.group(1)
    assert html.count("Smallest to run.") == 1


def test_high_guess_shown() -> None:
    content = event(question())
    assert "data-mx-spoiler" not in content["formatted_body"]
    assert "My guess: PostgreSQL (1)" in content["body"]


def test_multi_rank_text_guesses() -> None:
    assert "My guess: PostgreSQL (1), DuckDB (3) \u2014 Both." in event(question("multi"))["body"]
    assert "My guess: DuckDB (3) \u2192 PostgreSQL (1) \u2192 SQLite (2)" in event(question("rank"))["body"]
    assert "My guess: main \u2014 The usual." in event(question("text"))["body"]


# ---------------------------------------------------------------- how to answer


def test_how_to_answer_by_kind() -> None:
    choice = event(question())["body"]
    assert "number of your pick" in choice and f"{KEYCAPS[0]} (keycap one) \u2026 {KEYCAPS[3]} (keycap four)" in choice
    assert "other: <your text>" in choice and "unsure" in choice
    assert "vote in the poll" not in choice
    assert "vote in the poll" in event(question(), poll=True)["body"]
    multi = event(question("multi"))["body"]
    assert "separated by commas" in multi and "1, 3" in multi and KEYCAPS[0] not in multi
    rank = event(question("rank"))["body"]
    assert "all 3 numbers in your order" in rank and "3, 2, 1" in rank
    text = event(question("text"))["body"]
    assert "reply to this message with your answer" in text and "other:" not in text and "unsure" in text


@pytest.mark.parametrize("set_options, polled", [(19, True), (20, False), (30, False)])
def test_the_message_offers_the_poll_only_when_the_question_gets_one(set_options: int, polled: bool) -> None:
    """A poll takes 20 answers, "unsure" counted ("other" is left to a reply): with 20 options and
    more none was posted, and the message still said "vote in the poll"."""
    from bridge.protocol.poll import poll_start
    from bridge.protocol.recorded import RecordedQuestion

    q = question(options=[{"id": f"o{i}", "label": f"Choice number {i}"} for i in range(set_options)])
    q["guess"] = {"option": "o1", "why": "x", "confidence": "high"}
    content = event(q, poll=True)
    assert ("vote in the poll" in content["body"]) is polled
    assert ("vote in the poll" in content["formatted_body"]) is polled
    assert (poll_start(RecordedQuestion("$q", "!r", "demo", content)) is not None) is polled


def test_a_rank_example_names_every_option_as_the_reply_must() -> None:
    """"reply with all 5 numbers … e.g. 3, 2, 1": replying that was refused."""
    q = question("rank", options=[{"id": f"o{i}", "label": f"Choice number {i}"} for i in range(5)])
    q["guess"] = {"order": [f"o{i}" for i in range(5)], "why": "x", "confidence": "high"}
    body = event(q)["body"]
    assert "all 5 numbers in your order, first = best, separated by commas, e.g. 5, 4, 3, 2, 1." in body


def test_reactions_cap_at_ten() -> None:
    q = question(options=[{"id": f"o{i}", "label": f"Choice number {i}"} for i in range(12)])
    q["guess"] = {"option": "o1", "why": "x", "confidence": "high"}
    body = event(q)["body"]
    assert "\U0001f51f (keycap ten) for that number" in body


# ---------------------------------------------------------------- safety


@pytest.mark.parametrize("hostile", HOSTILE)
def test_hostile_strings_escaped_everywhere(hostile: str) -> None:
    q = question(
        title=f"T {hostile}",
        question=f"Q {hostile}?",
        why=f"W {hostile}",
        look_for=[f"L {hostile}"],
        options=[
            {"id": "a", "label": f"A {hostile}", "consequence": f"C {hostile}"},
            {"id": "b", "label": "Plain"},
        ],
        guess={"option": "a", "why": f"G {hostile}", "confidence": "low"},
        show_if={"question": f"x{hostile}", "option": ["a"]},
        subject={"id": f"S {hostile}", "digest": f"D {hostile}"},
    )
    content = event(q, title=f"Set {hostile}")
    html = content["formatted_body"]
    assert "<script" not in html and "<img" not in html and "onerror=\"" not in html
    assert "&lt;script&gt;" in html or "&lt;img" in html or "javascript:" in html or "&amp;amp;" in html
    if "&amp;" in hostile:
        assert "&amp;amp;" in html
    if '"' in hostile:
        assert "&quot;" in html
    # What a reader sees is the string exactly as written, never markup.
    shown = "".join(parse(html).text)
    assert f"A {hostile}" in shown and f"Set {hostile}" in shown
    # Nothing from the set becomes a tag or an attribute.
    for tag, attrs in parse(html).tags:
        assert tag in ALLOWED_TAGS, tag
        assert all(name == "data-mx-spoiler" for name, _ in attrs), attrs
    # Body is plain text, shown verbatim.
    assert f"A {hostile}" in content["body"]


@pytest.mark.parametrize("kind", ["choice", "multi", "rank", "scale", "confirm", "compare", "text"])
def test_only_element_tags(kind: str) -> None:
    q = question(kind, look_for=["The rows from 1.0 s on"], subject={"id": "release-4.2", "digest": "sha256:abc"})
    q["guess"]["confidence"] = "low"
    html = event(q)["formatted_body"]
    for tag, attrs in parse(html).tags:
        assert tag in ALLOWED_TAGS
        assert tag not in {"details", "summary", "a", "img", "script", "div"}
        assert all(name == "data-mx-spoiler" for name, _ in attrs)


# ---------------------------------------------------------------- details


def test_timecodes_stand_out() -> None:
    assert esc_timecodes("The arrow from 1.0 s: and 1.4s, then 0:07 or 12 seconds") == (
        "The arrow from <code>1.0 s</code>: and <code>1.4s</code>, then <code>0:07</code> "
        "or <code>12 seconds</code>"
    )
    assert esc_timecodes("Take 2 <b>") == "Take 2 &lt;b&gt;"
    html = event(question(look_for=["Watch the arrow from 1.0 s: does it stay?"]))["formatted_body"]
    assert "<li>Watch the arrow from <code>1.0 s</code>: does it stay?</li>" in html


def test_subject_shown_shortened() -> None:
    digest = "sha256:0588c96c7eff47e1a83d9fc1d0ecda3cc3b72e559a5c402bb9da29d9851dbceb"
    content = event(question(subject={"id": "release-4.2", "digest": digest}))
    assert f"Approving: release-4.2 (digest {short_digest(digest)})" in content["body"]
    assert digest not in content["body"] and digest not in content["formatted_body"]
    assert "<code>release-4.2</code>" in content["formatted_body"]
    assert short_digest("sha256:abc") == "abc"


def test_background_note_for_one_pager() -> None:
    content = event(question(one_pager=[{"type": "text", "text": "long"}]))
    assert "thread" in content["body"] and "thread" in content["formatted_body"]
    assert "thread" not in event(question())["body"]


def test_show_if_and_media_mentioned() -> None:
    q = question(show_if={"question": "other_q", "option": ["x"]}, media=[{"src": "clip.mp4", "start": 1.5, "caption": "the fall"}])
    content = event(q, media={"clip.mp4": {"url": "mxc://example.org/clip", "mimetype": "video/mp4"}})
    # Not in the set: the ids are all there is to name it by.
    assert "Only needed if your answer to \u201cother_q\u201d is \u201cx\u201d." in content["body"]
    assert "clip.mp4 (video) from 1.5 s \u2014 the fall" in content["body"]
    assert "from <code>1.5 s</code>" in content["formatted_body"]


@pytest.mark.parametrize("start, shown", [(1.5, "from 1.5 s"), ("2", "from 2 s"), ("1.25 s", "from 1.25 s"),
                                          ("0:07", "from 0:07"), ("12 sec", "from 12 sec")])
def test_a_media_start_says_its_unit_once(start, shown) -> None:
    """A start written with its unit ("1.25 s", "0:07") showed "from 1.25 s s", "from 0:07 s"."""
    q = question(media=[{"src": "clip.mp4", "start": start}])
    content = event(q, media={"clip.mp4": {"url": "mxc://example.org/clip", "mimetype": "video/mp4"}})
    line = next(line for line in content["body"].splitlines() if "clip.mp4 (video)" in line)
    assert line.endswith(f"clip.mp4 (video) {shown}")


def test_render_is_pure_and_bare_body_keeps_options() -> None:
    content = event(question())
    assert render(content) == render(content)
    bare = render_body(content, bare=True, limit=6)
    assert "1. PostgreSQL" not in bare and "1. Postg\u2026" in bare
    assert "To answer:" in bare and "Why I ask" not in bare


def test_quiz_shows_topic_and_points_not_answers() -> None:
    raw = {
        "askwright": 1,
        "id": "quiz",
        "title": "Articles",
        "mode": "study",
        "questions": [
            {
                "id": "haus",
                "kind": "choice",
                "title": "Haus",
                "question": "Which article goes with Haus?",
                "topic": "articles",
                "points": 2,
                "bonus": True,
                "options": [
                    {"id": "der", "label": "der", "why": "Masculine: WRONG-WHY"},
                    {"id": "das", "label": "das", "correct": True, "why": "Neuter: RIGHT-WHY"},
                ],
            }
        ],
    }
    qset = QuestionSet.model_validate(raw)
    content = build_question_event(qset, qset.questions[0], elicitation_id="elc_quiz")
    assert "Topic: articles \u00b7 2 points (bonus)" in content["body"]
    assert "WHY" not in content["body"] and "WHY" not in content["formatted_body"]
    assert "My guess" not in content["body"]


# ---------------------------------------------------------------- what Element showed wrong


def test_question_title_comes_first_and_blocks_are_on_their_own_lines() -> None:
    content = event(question(), title="Release 2.4 decisions")
    assert content["body"].split("\n")[:3] == ["Question: The database", "[Release 2.4 decisions]",
                                               "Which database should the service use?"]
    html = content["formatted_body"]
    assert html.startswith("<hr>\n<h4>Question: The database</h4>\n<p><em>Release 2.4 decisions</em></p>\n<p><strong>Which")
    # A preview that drops the tags must not run one block into the next.
    for joined in ("</h4><", "</p><", "</ol><", "</ul><", "</li><"):
        assert joined not in html, joined


@pytest.mark.parametrize("label", ["@alice:example.org", "#general:example.org", "!xKqwUzWhNdAyYhPLcE:example.org",
                                   "https://example.org/a?b=1", "$ev_abcdefghijklmnopqrstuvwxyz0123",
                                   # file names whose extension is a TLD too: Element linked them
                                   "setup.py", "README.md", "clip.mov"])
def test_id_and_url_like_labels_are_code_so_element_does_not_linkify_them(label: str) -> None:
    q = question(options=[{"id": "a", "label": label}, {"id": "b", "label": "Plain"}],
                 guess={"option": "a", "why": f"Because of {label}.", "confidence": "high"})
    html = event(q)["formatted_body"]
    shown = html.replace("&amp;", "&")
    assert f"<li><code>{label}</code></li>" in shown
    assert f"My guess: <strong><code>{label}</code> (1)</strong> \u2014 Because of <code>{label}</code>." in shown
    assert "<li>Plain</li>" in html


def test_timecodes_are_code_in_titles_labels_and_the_question() -> None:
    q = question(title="The fall at 0:07", question="What happens at 1.4 s?",
                 options=[{"id": "a", "label": "Cut at 2 s"}, {"id": "b", "label": "Keep"}],
                 guess={"option": "a", "why": "x", "confidence": "high"})
    html = event(q)["formatted_body"]
    assert "<h4>Question: The fall at <code>0:07</code></h4>" in html
    assert "<p><strong>What happens at <code>1.4 s</code>?</strong></p>" in html
    assert "<li>Cut at <code>2 s</code></li>" in html


def test_approval_shows_sixteen_hex_digits_in_a_bold_line() -> None:
    digest = "sha256:0588c96c7eff47e1a83d9fc1d0ecda3cc3b72e559a5c402bb9da29d9851dbceb"
    assert short_digest(digest) == "0588c96c7eff47e1\u2026"
    assert short_digest("SHA256:" + "ab" * 4) == "abababab"
    content = event(question(subject={"id": "release-4.2", "digest": digest}))
    html = content["formatted_body"]
    assert "<blockquote>" not in html
    assert "<p><strong>Approving <code>release-4.2</code> (digest <code>0588c96c7eff47e1\u2026</code>)</strong></p>" in html
    assert "Approving: release-4.2 (digest 0588c96c7eff47e1\u2026)" in content["body"]


def test_media_are_said_to_be_in_the_thread() -> None:
    q = question(media=[{"src": "clip.mp4"}])
    content = event(q, media={"clip.mp4": {"url": "mxc://example.org/clip", "mimetype": "video/mp4"}})
    assert "Media (in this message's thread):" in content["body"]
    assert "<p><em>Media (in this message's thread):</em></p>" in content["formatted_body"]
    assert "sent with this question" not in content["body"]


def test_keycaps_are_named_and_where_to_find_them() -> None:
    body = event(question())["body"]
    assert "(search \u201ckeycap\u201d in the reaction picker)" in body
    # Read with every emoji glyph missing, the words still say which reaction means what.
    without_glyphs = body.replace("\ufe0f\u20e3", "").replace("\U0001f51f", "")
    assert "react to it with the keycap emoji 1 (keycap one) \u2026 4 (keycap four) for that number" in without_glyphs
    assert f"{KEYCAPS[0]} (keycap one)" in event(question())["formatted_body"]


@pytest.mark.parametrize("kind", ["multi", "rank"])
def test_multi_and_rank_set_the_builtins_apart_with_their_numbers(kind: str) -> None:
    content = event(question(kind))
    html = content["formatted_body"]
    listed = html.split("<ol>")[1].split("</ol>")[0]
    assert "Not sure" not in listed and "Something else" not in listed
    assert ("<p><em>Or, on its own instead of picks:</em> reply <code>unsure</code> (4 \u00b7 Not sure, ask me later) "
            "or <code>other: &lt;your text&gt;</code> (5 \u00b7 Something else).</p>") in html
    # The numbers people type are still the event's positions.
    assert [o["id"] for o in content["question"]["options"]][3:] == ["unsure", "other"]
    if kind == "rank":
        assert "all 3 numbers in your order" in content["body"]


def test_show_if_says_when_it_is_needed_with_the_earlier_title_and_labels() -> None:
    raw = {
        "askwright": 1, "id": "demo", "title": "Demo",
        "questions": [
            question(id="timing", title="Release timing", options=[
                {"id": "now", "label": "Ship now"}, {"id": "late", "label": "Ship late"}, {"id": "never", "label": "Never"}]),
            question(id="bg", title="Background check", show_if={"question": "timing", "option": ["late", "never"]}),
        ],
    }
    raw["questions"][0]["guess"] = {"option": "now", "why": "x", "confidence": "high"}
    qset = QuestionSet.model_validate(raw)
    content = build_question_event(qset, qset.questions[1], elicitation_id="elc_bg")
    expected = "Only needed if your answer to \u201cRelease timing\u201d is \u201cShip late\u201d or \u201cNever\u201d."
    assert expected in content["body"]
    assert f"<p><em>{expected}</em></p>" in content["formatted_body"]
    assert "Asked because" not in content["body"] and "timing" not in content["formatted_body"].replace("Release timing", "")


@pytest.mark.parametrize("kind", ["choice", "multi", "rank", "text"])
def test_every_question_opens_with_a_rule_and_a_labelled_title_whatever_its_kind(kind: str) -> None:
    # Element groups one sender's messages: a rank or text question (no poll
    # between) ran into the one before with nothing to show where it starts.
    content = event(question(kind))
    assert content["formatted_body"].startswith("<hr>\n<h4>Question: The database</h4>\n")
    assert content["body"].startswith("Question: The database\n")


def test_a_shortened_question_keeps_its_header() -> None:
    content = event(question(question="x" * 30000, why="y" * 30000))
    assert content["formatted_body"].startswith("<hr>\n<h4>Question: The database</h4>")
    assert content["body"].startswith("Question: The database\n")



def test_where_reactions_are_refused_the_question_does_not_offer_them() -> None:
    """An encrypted room whose trust checks the sending session refuses
    keycap reactions (clients send them unencrypted): the question offering
    them sent people to a way that is always refused."""
    refused = event(question(), poll=True, reactions=False)
    for part in ("body", "formatted_body"):
        assert "keycap" not in refused[part] and KEYCAPS[0] not in refused[part]
        assert "vote in the poll" in refused[part] and "number of your pick" in refused[part]
    assert "keycap" in event(question(), poll=True)["formatted_body"]


def test_a_question_text_cut_to_fit_says_the_whole_follows_in_the_thread() -> None:
    from bridge.service.posting.media import text_parts

    long_text = ("A step of the plan, with its checks. " * 1500) + "Go ahead?"
    posted = event(question(question=long_text))
    for part in ("body", "formatted_body"):
        assert "the whole question follows in this message" in posted[part]
    assert "the whole question follows" not in event(question())["body"]
    parts = text_parts(long_text, 15_000)
    assert len(parts) > 1 and all(len(p.encode()) <= 15_000 for p in parts)
    assert " ".join(parts).split() == long_text.split()
    wide = "é" * 20_000  # no break anywhere: cut where the bytes end, never inside a character
    assert "".join(text_parts(wide, 15_000)) == wide
