"""The readable message: escaped, Element-safe, numbered as the event is."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Any

import pytest

from bridge.protocol.question_event import build_question_event, new_elicitation_id
from bridge.protocol.render import ALLOWED_TAGS, KEYCAPS, esc_timecodes, render, render_body, short_digest
from bridge.questionset.model import QuestionSet

HOSTILE = [
    "<script>alert(1)</script>",
    '<img src=x onerror="alert(1)">',
    "[x](javascript:alert(1))",
    "&amp; and \"quotes\" and 'single'",
]


class _Tags(HTMLParser):
    """Collects tags and attributes, and the text as a browser would show it."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse(html: str) -> _Tags:
    parser = _Tags()
    parser.feed(html)
    parser.close()
    return parser


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
    assert "<h4>The database</h4>" in html
    assert "<em>Demo decisions</em>" in html
    assert "<li>PostgreSQL \u2014 <em>One more service to run.</em></li>" in html
    assert "<li>Not sure, ask me later</li><li>Something else</li></ol>" in html
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
    body_numbers = re.findall(r"^(\d+)\. (.+)$", content["body"], flags=re.MULTILINE)
    assert [int(n) for n, _ in body_numbers] == list(range(1, len(options) + 1))
    assert [label.split(" \u2014 ")[0] for _, label in body_numbers] == [o["label"] for o in options]
    html_items = re.findall(r"<li>(.*?)</li>", content["formatted_body"].split("<ol>")[1].split("</ol>")[0])
    assert [item.split(" \u2014 ")[0] for item in html_items] == [o["label"] for o in options]


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
    assert "number of your pick" in choice and f"{KEYCAPS[0]}\u2026{KEYCAPS[4]}" in choice
    assert "other: <your text>" in choice and "unsure" in choice
    assert "vote in the poll" not in choice
    assert "vote in the poll" in event(question(), poll=True)["body"]
    multi = event(question("multi"))["body"]
    assert "separated by commas" in multi and "1, 3" in multi and KEYCAPS[0] not in multi
    rank = event(question("rank"))["body"]
    assert "all 3 numbers in your order" in rank and "3, 2, 1" in rank
    text = event(question("text"))["body"]
    assert "reply to this message with your answer" in text and "other:" not in text and "unsure" in text


def test_reactions_cap_at_ten() -> None:
    q = question(options=[{"id": f"o{i}", "label": f"Choice number {i}"} for i in range(12)])
    q["guess"] = {"option": "o1", "why": "x", "confidence": "high"}
    body = event(q)["body"]
    assert f"{KEYCAPS[0]}\u2026\U0001f51f" in body


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
        "The arrow from <strong>1.0 s</strong>: and <strong>1.4s</strong>, then <strong>0:07</strong> "
        "or <strong>12 seconds</strong>"
    )
    assert esc_timecodes("Take 2 <b>") == "Take 2 &lt;b&gt;"
    html = event(question(look_for=["Watch the arrow from 1.0 s: does it stay?"]))["formatted_body"]
    assert "<li>Watch the arrow from <strong>1.0 s</strong>: does it stay?</li>" in html


def test_subject_shown_shortened() -> None:
    digest = "sha256:0588c96c7eff47e1a83d9fc1d0ecda3cc3b72e559a5c402bb9da29d9851dbceb"
    content = event(question(subject={"id": "release-4.2", "digest": digest}))
    assert f"Approving: release-4.2 (digest {short_digest(digest)})" in content["body"]
    assert digest not in content["body"] and digest not in content["formatted_body"]
    assert "<code>release-4.2</code>" in content["formatted_body"]
    assert short_digest("sha256:abc") == "sha256:abc"


def test_background_note_for_one_pager() -> None:
    content = event(question(one_pager=[{"type": "text", "text": "long"}]))
    assert "thread" in content["body"] and "thread" in content["formatted_body"]
    assert "thread" not in event(question())["body"]


def test_show_if_and_media_mentioned() -> None:
    q = question(show_if={"question": "other_q", "option": ["x"]}, media=[{"src": "clip.mp4", "start": 1.5, "caption": "the fall"}])
    content = event(q, media={"clip.mp4": {"url": "mxc://example.org/clip", "mimetype": "video/mp4"}})
    assert "other_q" in content["body"]
    assert "clip.mp4 (video) from 1.5 s \u2014 the fall" in content["body"]
    assert "from <strong>1.5 s</strong>" in content["formatted_body"]


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
