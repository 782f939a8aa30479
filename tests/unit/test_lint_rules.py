"""One test per lint rule: a clean set, broken in exactly one place, reports
exactly that one finding (its place, and error or warning) and nothing else."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bridge.questionset.lint import LintResult, is_bare_label, is_vague, lint, sentence_count
from bridge.questionset.media import LocalFilesystem, Streams

Raw = dict[str, Any]

CODECS = {
    "clip.mp4": Streams(video=("h264",), audio=("aac",)),
    "silent.mp4": Streams(video=("h264",)),
    "clip.webm": Streams(video=("vp9",), audio=("opus",)),
    "broken.mp4": None,
}


def probe_stub(path: str) -> Streams | None:
    return CODECS[os.path.basename(path)]


def decide_set() -> Raw:
    return {
        "askwright": 1,
        "id": "takes",
        "title": "Pick the take",
        "media_roots": ["../renders"],
        "questions": [
            {
                "id": "pick",
                "kind": "choice",
                "title": "The poster",
                "question": "Which poster should go on the landing page?",
                "why": "The landing page changes on Monday.",
                "look_for": ["Whether the title reads at thumbnail size"],
                "media": [{"src": "poster.png", "alt": "Two posters side by side"}],
                "options": [{"id": "red", "label": "The red poster"}, {"id": "blue", "label": "The blue poster"}],
                "guess": {"option": "blue", "why": "Blue matches the logo.", "confidence": "low"},
            },
            {
                "id": "many",
                "kind": "multi",
                "title": "Languages",
                "question": "Which languages should the page ship in?",
                "why": "Each language needs a translator.",
                "options": [
                    {"id": "en", "label": "English"},
                    {"id": "de", "label": "German"},
                    {"id": "fr", "label": "French"},
                ],
                "guess": {"options": ["en", "de"], "why": "Most visits come from those two.", "confidence": "high"},
            },
            {
                "id": "take",
                "kind": "compare",
                "title": "The arrow",
                "question": "Which take of the arrow shot should go in the cut?",
                "why": "This is the only shot of the arrow.",
                "look_for": ["The arrow from 1.0 s: does it stay in place when he falls?"],
                "media": [{"src": "clip.mp4"}],
                "sides": {"left": "t2", "right": "t5", "randomized": True},
                "options": [
                    {"id": "t2", "label": "Take 2"},
                    {"id": "t5", "label": "Take 5"},
                    {"id": "redo", "label": "Neither: redo the shot"},
                ],
                "guess": {"option": "t5", "why": "The shaft is thinner.", "confidence": "low"},
            },
            {
                "id": "order",
                "kind": "rank",
                "title": "Fix order",
                "question": "In what order should the fixes land?",
                "why": "One fix per day gets through QA.",
                "options": [{"id": "sync", "label": "The sync crash"}, {"id": "login", "label": "The login crash"}],
                "guess": {"order": ["login", "sync"], "why": "Login blocks everyone.", "confidence": "high"},
            },
            {
                "id": "say",
                "kind": "text",
                "title": "Headline",
                "question": "What sentence should open the release notes?",
                "why": "The update dialog shows it.",
                "guess": {"text": "Sync survives sleep.", "why": "Most asked for.", "confidence": "low"},
            },
            {
                "id": "rate",
                "kind": "scale",
                "title": "Updater risk",
                "question": "How risky is the new updater?",
                "why": "High risk puts it behind a flag.",
                "options": [
                    {"id": "low", "label": "Calm"},
                    {"id": "mid", "label": "Some risk"},
                    {"id": "high", "label": "Alarming"},
                ],
                "guess": {"option": "mid", "why": "It passed QA.", "confidence": "low"},
            },
            {
                "id": "go",
                "kind": "confirm",
                "title": "Freeze date",
                "question": "Should the freeze start on Friday?",
                "why": "It moves the release date.",
                "options": [{"id": "fri", "label": "Freeze on Friday"}, {"id": "mon", "label": "Freeze on Monday"}],
                "guess": {"option": "fri", "why": "Work is merged.", "confidence": "high"},
            },
            {
                "id": "approve",
                "kind": "confirm",
                "title": "Publish the build",
                "question": "Do you approve publishing this build?",
                "why": "Beta users install it within the hour.",
                "subject": {"id": "build-2.4.0-rc1", "digest": "sha256:abc123"},
                "options": [{"id": "publish", "label": "Publish it"}, {"id": "hold", "label": "Hold it back"}],
                "guess": {"option": "publish", "why": "All checks passed.", "confidence": "high"},
            },
        ],
    }


def study_set() -> Raw:
    return {
        "askwright": 1,
        "id": "quiz",
        "title": "A quiz",
        "mode": "study",
        "questions": [
            {
                "id": "capital",
                "kind": "choice",
                "topic": "geography",
                "title": "Capital",
                "question": "What is the capital of France?",
                "options": [
                    {"id": "paris", "label": "Paris", "correct": True, "why": "Right."},
                    {"id": "lyon", "label": "Lyon", "why": "The third largest city, not the capital."},
                ],
            },
            {
                "id": "explain",
                "kind": "text",
                "topic": "history",
                "title": "Explain",
                "question": "Why did the Roman republic end?",
                "rubric": "Mentions the civil wars.",
            },
        ],
    }


def q(raw: Raw, qid: str) -> Raw:
    return next(item for item in raw["questions"] if item["id"] == qid)


@pytest.fixture
def set_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "takes"
    folder.mkdir(parents=True)
    (folder / "poster.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (folder / "old.gif").write_bytes(b"GIF89a")
    (folder / "notes.bin").write_bytes(b"?")
    (folder / "clip.webm").write_bytes(b"webm")
    (folder / "broken.mp4").write_bytes(b"no video")
    (folder / "silent.mp4").write_bytes(b"mp4")
    (tmp_path / "renders").mkdir()
    (tmp_path / "renders" / "clip.mp4").write_bytes(b"mp4")
    (tmp_path / "secret.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    os.symlink(tmp_path / "secret.png", folder / "link.png")
    return folder


def run(raw: Raw, folder: Path) -> LintResult:
    return lint(raw, LocalFilesystem(str(folder)), probe=probe_stub)


def findings(result: LintResult) -> list[tuple[str, str]]:
    return [(f.where, "error") for f in result.errors] + [(f.where, "warning") for f in result.warnings]


def test_clean_decide_set_has_no_findings(set_dir: Path) -> None:
    result = run(decide_set(), set_dir)
    assert findings(result) == []
    assert result.ok and result.set_id == "takes" and result.model is not None


def test_clean_study_set_has_no_findings(set_dir: Path) -> None:
    assert findings(run(study_set(), set_dir)) == []


# ---------------------------------------------------------------- mutations

Mutation = Callable[[Raw], None]


def _set(path: str, value: Any) -> Mutation:
    """A mutation that sets raw[...] along a dotted path; "q:<id>" picks a question, digits a list index."""

    def mutate(raw: Raw) -> None:
        node: Any = raw
        keys = path.split(".")
        for key in keys[:-1]:
            node = _step(raw, node, key)
        last = keys[-1]
        if value is _DELETE:
            del node[int(last) if last.isdigit() else last]
        else:
            node[int(last) if last.isdigit() else last] = value

    return mutate


def _step(raw: Raw, node: Any, key: str) -> Any:
    if key.startswith("q:"):
        return q(raw, key[2:])
    return node[int(key)] if key.isdigit() else node[key]


_DELETE = object()


def _delete(path: str) -> Mutation:
    return _set(path, _DELETE)


def _renamed_side(raw: Raw, old: str, new: str) -> None:
    sides = next(q for q in raw["questions"] if q["id"] == "take")["sides"]
    sides[new] = sides.pop(old)


def _all(*mutations: Mutation) -> Mutation:
    def mutate(raw: Raw) -> None:
        for m in mutations:
            m(raw)

    return mutate


def _close_all(raw: Raw) -> None:
    for item in raw["questions"]:
        item["status"] = "closed"


def _add_text_questions(n: int) -> Mutation:
    def mutate(raw: Raw) -> None:
        for i in range(n):
            raw["questions"].append(
                {
                    "id": f"extra{i}",
                    "kind": "text",
                    "title": f"Extra {i}",
                    "question": f"What is extra number {i}?",
                    "why": "It fills the set.",
                    "guess": {"text": "Something", "why": "A guess.", "confidence": "low"},
                }
            )

    return mutate


def _guess_first_everywhere(raw: Raw) -> None:
    for item in raw["questions"]:
        if item["kind"] in ("choice", "compare", "scale", "confirm"):
            item["guess"]["option"] = item["options"][0]["id"]


def _duplicate_question_id(raw: Raw) -> None:
    q(raw, "many")["id"] = "pick"


FOUR_SENTENCES = "One. Two. Three. Four."
ERROR, WARNING = "error", "warning"

DECIDE_CASES: list[tuple[str, Mutation, str | None, str | None]] = [
    # the set
    ("askwright-not-1", _set("askwright", 2), "askwright", ERROR),
    ("askwright-wrong-type", _set("askwright", "1"), "askwright", ERROR),
    ("set-id-bad-chars", _set("id", "my set"), "id", ERROR),
    ("set-id-too-long", _set("id", "a" * 65), "id", ERROR),
    ("set-id-64-ok", _set("id", "a" * 64), None, None),
    ("set-id-missing", _delete("id"), "id", ERROR),
    ("set-title-empty", _set("title", "  "), "title", ERROR),
    ("set-title-missing", _delete("title"), "title", ERROR),
    ("mode-unknown", _set("mode", "quiz"), "mode", ERROR),
    ("media-root-missing", _set("media_roots", ["../renders", "nowhere"]), "media_roots[1]", ERROR),
    ("no-open-question", _close_all, "questions", ERROR),
    ("questions-empty", _set("questions", []), "questions", ERROR),
    ("questions-missing", _delete("questions"), "questions", ERROR),
    ("questions-item-not-object", lambda raw: raw["questions"].append(7), "questions[8]", ERROR),
    ("set-unknown-field", _set("colour", "red"), "colour", WARNING),
    ("too-many-open", _add_text_questions(5), "questions", WARNING),
    ("twelve-open-ok", _add_text_questions(4), None, None),
    ("guess-always-first", _guess_first_everywhere, "questions", WARNING),
    # question ids
    ("question-id-underscore", _set("questions.0.id", "_pick"), "questions[_pick].id", ERROR),
    ("question-id-bad-chars", _set("questions.0.id", "pick me"), "questions[pick me].id", ERROR),
    # The second of two questions "pick" is named by its place: by its id, it was read as the first.
    ("question-id-duplicate", _duplicate_question_id, "questions[1].id", ERROR),
    ("question-kind-unknown", _set("q:say.kind", "essay"), "questions[say].kind", ERROR),
    # title and question
    ("title-empty", _set("q:pick.title", ""), "questions[pick].title", ERROR),
    ("title-too-long", _set("q:pick.title", "x" * 81), "questions[pick].title", WARNING),
    ("title-80-ok", _set("q:pick.title", "x" * 80), None, None),
    ("title-duplicate-open", _set("q:many.title", "THE POSTER"), "questions[many].title", ERROR),
    (
        "title-duplicate-closed-ok",
        _all(_set("q:many.title", "The poster"), _set("q:many.status", "closed")),
        None,
        None,
    ),
    ("question-no-question-mark", _set("q:pick.question", "Pick a poster."), "questions[pick].question", ERROR),
    ("question-mark-mid-fails", _set("q:pick.question", "Which? The red one"), "questions[pick].question", ERROR),
    # A question asked in its language's own mark asks (the set was skipped whole).
    ("question-arabic-mark", _set("q:pick.question", "أي ملصق يوضع على الصفحة؟"), None, None),
    ("question-full-width-mark", _set("q:pick.question", "どのポスターにしますか？"), None, None),
    (
        "question-duplicate-open",
        _set("q:many.question", "which poster should go on the landing page?"),
        "questions[many].question",
        ERROR,
    ),
    # why, hint, look_for
    ("why-missing", _delete("q:pick.why"), "questions[pick].why", ERROR),
    ("why-empty", _set("q:pick.why", " "), "questions[pick].why", ERROR),
    ("why-four-sentences", _set("q:pick.why", FOUR_SENTENCES), "questions[pick].why", WARNING),
    ("why-three-sentences-ok", _set("q:pick.why", "One. Two at 1.0 s. Three!"), None, None),
    ("hint-four-sentences", _set("q:pick.hint", FOUR_SENTENCES), "questions[pick].hint", WARNING),
    ("look-for-missing-compare", _delete("q:take.look_for"), "questions[take].look_for", ERROR),
    ("look-for-empty-compare", _set("q:take.look_for", []), "questions[take].look_for", ERROR),
    ("look-for-missing-media", _delete("q:pick.look_for"), "questions[pick].look_for", ERROR),
    ("look-for-short", _set("q:pick.look_for", ["Sharpness"]), "questions[pick].look_for[0]", WARNING),
    ("look-for-vague", _set("q:pick.look_for", ["The overall quality of it"]), "questions[pick].look_for[0]", WARNING),
    ("look-for-not-strings", _set("q:pick.look_for", "the title"), "questions[pick].look_for", ERROR),
    # options
    ("options-missing", _delete("q:many.options"), "questions[many].options", ERROR),
    (
        "options-only-one",
        _all(_set("q:pick.options", [{"id": "blue", "label": "The blue poster"}])),
        "questions[pick].options",
        ERROR,
    ),
    ("option-id-duplicate", _set("q:many.options.2.id", "de"), "questions[many].options[2].id", ERROR),
    ("option-id-unsure", _set("q:many.options.2.id", "unsure"), "questions[many].options[unsure].id", ERROR),
    # A reply names an option by id or label in any case: these would be the built-ins' twins.
    ("option-id-Unsure", _set("q:many.options.2.id", "Unsure"), "questions[many].options[Unsure].id", ERROR),
    ("option-label-something-else", _set("q:many.options.2.label", "something else"),
     "questions[many].options[fr].label", ERROR),
    ("option-id-other", _set("q:many.options.2.id", "other"), "questions[many].options[other].id", ERROR),
    ("option-id-comma", _set("q:many.options.2.id", "f,r"), "questions[many].options[f,r].id", ERROR),
    ("option-label-duplicate", _set("q:many.options.2.label", "GERMAN"), "questions[many].options[fr].label", ERROR),
    # Labels a reply can't tell from another's, or that it reads as a built-in or another option's id:
    # passed, and the option could be picked only by its number.
    ("option-label-duplicate-as-a-reply-reads", _set("q:many.options.2.label", "German!"),
     "questions[many].options[fr].label", ERROR),
    ("option-label-duplicate-spaced", _all(_set("q:many.options.1.label", "Ship it"),
                                           _set("q:many.options.2.label", "Ship\u00a0 it")),
     "questions[many].options[fr].label", ERROR),
    ("option-label-duplicate-decomposed", _all(_set("q:many.options.1.label", "Caf\u00e9 menu"),
                                               _set("q:many.options.2.label", "Cafe\u0301 menu")),
     "questions[many].options[fr].label", ERROR),
    ("option-label-other", _set("q:many.options.2.label", "Other"), "questions[many].options[fr].label", ERROR),
    ("option-label-not-sure", _set("q:many.options.2.label", "Not sure."), "questions[many].options[fr].label", ERROR),
    ("option-label-unsure", _set("q:many.options.2.label", "Unsure"), "questions[many].options[fr].label", ERROR),
    ("option-label-another-id", _set("q:many.options.2.label", "DE"), "questions[many].options[fr].label", ERROR),
    ("option-label-its-own-id-ok", _set("q:many.options.2.label", "FR"), None, None),
    # Nothing to see, or lines of its own in the numbered list a person answers from.
    ("option-label-zero-width", _set("q:many.options.2.label", "\u200b"), "questions[many].options[fr].label", ERROR),
    ("option-label-two-lines", _set("q:many.options.2.label", "French\n2. Delete the prod database"),
     "questions[many].options[fr].label", ERROR),
    # A consequence shows on its option's numbered line: it passed with lines of its own.
    ("option-consequence-two-lines", _set("q:many.options.2.consequence", "fine\n2. Drop the prod database"),
     "questions[many].options[fr].consequence", ERROR),
    ("option-consequence-one-line-ok", _set("q:many.options.2.consequence", "we ship the French build"), None, None),
    ("option-label-turned-around", _set("q:many.options.2.label", "French \u202eesrever"),
     "questions[many].options[fr].label", ERROR),
    ("option-label-emoji-ok", _set("q:many.options.2.label", "French \U0001f469\u200d\U0001f4bb"), None, None),
    ("title-two-lines", _set("q:pick.title", "Poster\nTo answer: reply 2"), "questions[pick].title", ERROR),
    ("title-zero-width", _set("q:pick.title", "\u200b"), "questions[pick].title", ERROR),
    ("option-label-empty", _set("q:many.options.2.label", ""), "questions[many].options[fr].label", ERROR),
    ("option-label-missing", _delete("q:many.options.2.label"), "questions[many].options[fr].label", ERROR),
    ("option-label-wrong-type", _set("q:many.options.2.label", 3), "questions[many].options[fr].label", ERROR),
    ("option-unknown-field", _set("q:many.options.2.icon", "fr.png"), "questions[many].options[fr].icon", WARNING),
    ("text-with-options", _set("q:say.options", [{"id": "a", "label": "Apples"}]), "questions[say].options", ERROR),
    ("text-with-empty-options-ok", _set("q:say.options", []), None, None),
    ("scale-number-label-ok", _set("q:rate.options.0.label", "1"), None, None),
    # guesses
    ("guess-missing", _delete("q:pick.guess"), "questions[pick].guess", ERROR),
    ("guess-option-unknown", _set("q:pick.guess.option", "green"), "questions[pick].guess.option", ERROR),
    ("guess-option-missing", _delete("q:take.guess.option"), "questions[take].guess.option", ERROR),
    ("guess-multi-unknown", _set("q:many.guess.options", ["en", "it"]), "questions[many].guess.options", ERROR),
    ("guess-multi-empty", _set("q:many.guess.options", []), "questions[many].guess.options", ERROR),
    ("guess-multi-missing", _delete("q:many.guess.options"), "questions[many].guess.options", ERROR),
    ("guess-rank-incomplete", _set("q:order.guess.order", ["login"]), "questions[order].guess.order", ERROR),
    ("guess-rank-twice", _set("q:order.guess.order", ["login", "login"]), "questions[order].guess.order", ERROR),
    ("guess-rank-missing", _delete("q:order.guess.order"), "questions[order].guess.order", ERROR),
    ("guess-text-missing", _delete("q:say.guess.text"), "questions[say].guess.text", ERROR),
    ("guess-text-blank", _set("q:say.guess.text", " "), "questions[say].guess.text", ERROR),
    ("guess-why-missing", _delete("q:rate.guess.why"), "questions[rate].guess.why", ERROR),
    ("guess-confidence-missing", _delete("q:rate.guess.confidence"), "questions[rate].guess.confidence", ERROR),
    ("guess-confidence-bad", _set("q:rate.guess.confidence", "medium"), "questions[rate].guess.confidence", ERROR),
    ("guess-unknown-field", _set("q:rate.guess.score", 3), "questions[rate].guess.score", WARNING),
    # confirm
    ("confirm-label-yes", _set("q:go.options.0.label", "Yes, freeze on Friday"), "questions[go].options[fri].label", ERROR),
    ("confirm-label-no", _set("q:go.options.1.label", "No"), "questions[go].options[mon].label", ERROR),
    ("confirm-label-nobody-ok", _set("q:go.options.1.label", "Nobody freezes"), None, None),
    (
        "confirm-four-actions",
        _set(
            "q:go.options",
            [{"id": i, "label": f"Freeze in {i} days"} for i in ("d1", "d2", "d3", "fri")],
        ),
        "questions[go].options",
        ERROR,
    ),
    # sides
    ("sides-randomized-false", _set("q:take.sides.randomized", False), "questions[take].sides.randomized", WARNING),
    ("sides-randomized-missing", _delete("q:take.sides.randomized"), "questions[take].sides.randomized", WARNING),
    ("sides-randomized-not-bool", _set("q:take.sides.randomized", "yes"), "questions[take].sides.randomized", ERROR),
    ("sides-unknown-option", _set("q:take.sides.left", "t9"), "questions[take].sides.left", ERROR),
    ("sides-one-side", _delete("q:take.sides.right"), "questions[take].sides", ERROR),
    # A side's name is what the person reads for its option, and may reply with.
    ("sides-name-empty", lambda raw: _renamed_side(raw, "left", ""), "questions[take].sides.", ERROR),
    ("sides-named-alike", lambda raw: _renamed_side(raw, "right", "Left"), "questions[take].sides.Left", ERROR),
    ("sides-named-as-a-built-in", lambda raw: _renamed_side(raw, "left", "unsure"), "questions[take].sides.unsure",
     ERROR),
    ("sides-named-as-a-label", lambda raw: _renamed_side(raw, "left", "Take 5"), "questions[take].sides.Take 5",
     ERROR),
    ("sides-same-take", _set("q:take.sides.right", "t2"), "questions[take].sides", ERROR),
    ("sides-not-on-compare", _set("q:pick.sides", {"left": "red", "right": "blue", "randomized": True}), "questions[pick].sides", ERROR),
    # media
    ("media-outside-dotdot", _set("q:pick.media.0.src", "../secret.png"), "questions[pick].media[0].src", ERROR),
    ("media-outside-symlink", _set("q:pick.media.0.src", "link.png"), "questions[pick].media[0].src", ERROR),
    ("media-missing", _set("q:pick.media.0.src", "gone.png"), "questions[pick].media[0].src", ERROR),
    ("media-empty-src", _set("q:pick.media.0.src", ""), "questions[pick].media[0].src", ERROR),
    ("media-no-src-or-figure", _delete("q:pick.media.0.src"), "questions[pick].media[0]", ERROR),
    ("media-image-no-alt", _delete("q:pick.media.0.alt"), "questions[pick].media[0].alt", WARNING),
    ("media-unknown-extension", _set("q:pick.media.0.src", "notes.bin"), "questions[pick].media[0].type", ERROR),
    ("media-declared-type-ok", _all(_set("q:pick.media.0.src", "notes.bin"), _set("q:pick.media.0.type", "image")), None, None),
    ("media-type-bad", _set("q:pick.media.0.type", "picture"), "questions[pick].media[0].type", ERROR),
    ("media-unknown-field", _set("q:pick.media.0.width", 300), "questions[pick].media[0].width", WARNING),
    ("media-found-in-root", _set("q:take.media.0.src", "clip.mp4"), None, None),
    ("video-codec-vp9", _set("q:take.media.0.src", "clip.webm"), "questions[take].media[0].src", WARNING),
    ("video-unreadable", _set("q:take.media.0.src", "broken.mp4"), "questions[take].media[0].src", WARNING),
    ("video-no-sound-ok", _set("q:take.media.0.src", "silent.mp4"), None, None),
    ("figure-ok", _set("q:pick.media.0", {"figure": {"type": "bars"}, "alt": "Two bars"}), None, None),
    ("figure-no-alt", _set("q:pick.media.0", {"figure": {"type": "bars"}}), "questions[pick].media[0].alt", WARNING),
    (
        "figure-with-src",
        _set("q:pick.media.0", {"figure": {"type": "bars"}, "alt": "Two bars", "src": "poster.png"}),
        "questions[pick].media[0].src",
        ERROR,
    ),
    # show_if
    ("show-if-ok", _set("q:many.show_if", {"question": "pick", "option": ["red"]}), None, None),
    ("show-if-unknown-question", _set("q:many.show_if", {"question": "nope", "option": ["red"]}), "questions[many].show_if.question", ERROR),
    ("show-if-itself", _set("q:many.show_if", {"question": "many", "option": ["en"]}), "questions[many].show_if.question", ERROR),
    ("show-if-unknown-option", _set("q:many.show_if", {"question": "pick", "option": ["green"]}), "questions[many].show_if.option", ERROR),
    ("show-if-no-option", _set("q:many.show_if", {"question": "pick", "option": []}), "questions[many].show_if.option", ERROR),
    ("show-if-missing-option", _set("q:many.show_if", {"question": "pick"}), "questions[many].show_if.option", ERROR),
    # status, rev, supersedes
    ("superseded-without-by", _set("q:many.status", "superseded"), "questions[many].superseded_by", ERROR),
    (
        "superseded-by-unknown",
        _all(_set("q:many.status", "superseded"), _set("q:many.superseded_by", "nope")),
        "questions[many].superseded_by",
        ERROR,
    ),
    ("superseded-by-ok", _all(_set("q:many.status", "superseded"), _set("q:many.superseded_by", "pick")), None, None),
    ("withdrawn-without-reason", _set("q:many.status", "withdrawn"), "questions[many].reason", ERROR),
    ("withdrawn-with-reason-ok", _all(_set("q:many.status", "withdrawn"), _set("q:many.reason", "Decided in the meeting")), None, None),
    ("status-unknown", _set("q:many.status", "paused"), "questions[many].status", ERROR),
    ("rev-zero", _set("q:many.rev", 0), "questions[many].rev", ERROR),
    # Synapse refuses integers past 2^53 - 1: the bridge posted one as a string, which its schema refuses.
    ("rev-past-2-53", _set("q:many.rev", 2**53), "questions[many].rev", ERROR),
    ("rev-2-53-less-1-ok", _set("q:many.rev", 2**53 - 1), None, None),
    ("rev-not-int", _set("q:many.rev", 1.5), "questions[many].rev", ERROR),
    ("supersedes-ok", _set("q:many.supersedes", "langs@2"), None, None),
    ("supersedes-bad-rev", _set("q:many.supersedes", "langs@0"), "questions[many].supersedes", ERROR),
    ("supersedes-bad-form", _set("q:many.supersedes", "langs@two"), "questions[many].supersedes", ERROR),
    ("supersedes-itself", _set("q:many.supersedes", "many"), "questions[many].supersedes", ERROR),
    # subject (the bridge's extension)
    ("subject-id-empty", _set("q:approve.subject.id", ""), "questions[approve].subject.id", ERROR),
    ("subject-digest-too-long", _set("q:approve.subject.digest", "d" * 513), "questions[approve].subject.digest", ERROR),
    ("subject-digest-512-ok", _set("q:approve.subject.digest", "d" * 512), None, None),
    ("subject-digest-missing", _delete("q:approve.subject.digest"), "questions[approve].subject.digest", ERROR),
    ("subject-not-object", _set("q:approve.subject", "build-1"), "questions[approve].subject", ERROR),
    ("subject-unknown-field", _set("q:approve.subject.url", "https://x"), "questions[approve].subject.url", WARNING),
    # unknown question field
    ("question-unknown-field", _set("q:pick.colour", "red"), "questions[pick].colour", WARNING),
]

BARE_LABELS = ["Left", "right", "B", "b)", "2", "Option 2", "choice B", "OK", "Yes", "no", "The left one"]


def _check_one(raw: Raw, folder: Path, where: str | None, level: str | None) -> None:
    result = run(raw, folder)
    expected = [] if where is None else [(where, level)]
    assert findings(result) == expected, [f.as_dict() for f in result.errors + result.warnings]
    for f in result.errors + result.warnings:
        assert f.message and not f.message.startswith("Input should")


@pytest.mark.parametrize(("mutation", "where", "level"), [c[1:] for c in DECIDE_CASES], ids=[c[0] for c in DECIDE_CASES])
def test_decide_rule(set_dir: Path, mutation: Mutation, where: str | None, level: str | None) -> None:
    raw = copy.deepcopy(decide_set())
    mutation(raw)
    _check_one(raw, set_dir, where, level)


@pytest.mark.parametrize("label", BARE_LABELS)
def test_bare_option_label_fails(set_dir: Path, label: str) -> None:
    raw = decide_set()
    q(raw, "many")["options"][2]["label"] = label
    _check_one(raw, set_dir, "questions[many].options[fr].label", ERROR)


def test_absolute_src_inside_a_root_is_allowed(set_dir: Path) -> None:
    raw = decide_set()
    q(raw, "take")["media"][0]["src"] = str(set_dir.parent / "renders" / "clip.mp4")
    _check_one(raw, set_dir, None, None)


def test_absolute_src_outside_fails(set_dir: Path) -> None:
    raw = decide_set()
    q(raw, "pick")["media"][0]["src"] = str(set_dir.parent / "secret.png")
    _check_one(raw, set_dir, "questions[pick].media[0].src", ERROR)


def test_codec_check_is_skipped_without_a_probe(set_dir: Path) -> None:
    raw = decide_set()
    q(raw, "take")["media"][0]["src"] = "clip.webm"
    assert findings(lint(raw, LocalFilesystem(str(set_dir)))) == []


def test_a_probe_that_raises_is_a_warning_not_a_crash(set_dir: Path) -> None:
    def boom(path: str) -> Streams | None:
        raise RuntimeError("ffprobe died")

    result = lint(decide_set(), LocalFilesystem(str(set_dir)), probe=boom)
    assert findings(result) == [("questions[take].media[0].src", WARNING)]


# ---------------------------------------------------------------- study mode

STUDY_CASES: list[tuple[str, Mutation, str | None, str | None]] = [
    ("kind-not-allowed", _set("q:capital.kind", "multi"), "questions[capital].kind", ERROR),
    ("topic-missing", _delete("q:capital.topic"), "questions[capital].topic", WARNING),
    ("correct-twice", _set("q:capital.options.1.correct", True), "questions[capital].options", ERROR),
    ("correct-none", _delete("q:capital.options.0.correct"), "questions[capital].options", ERROR),
    ("option-why-missing", _delete("q:capital.options.1.why"), "questions[capital].options[lyon].why", ERROR),
    ("points-zero", _set("q:capital.points", 0), "questions[capital].points", ERROR),
    ("points-string", _set("q:capital.points", "2"), "questions[capital].points", ERROR),
    ("points-fraction-ok", _set("q:capital.points", 0.5), None, None),
    ("bonus-not-bool", _set("q:capital.bonus", "yes"), "questions[capital].bonus", ERROR),
    ("shuffle-not-bool", _set("q:capital.shuffle", 0), "questions[capital].shuffle", ERROR),
    ("bonus-shuffle-ok", _all(_set("q:capital.bonus", True), _set("q:capital.shuffle", False)), None, None),
    ("text-without-grading", _delete("q:explain.rubric"), "questions[explain].rubric", ERROR),
    ("text-model-answer-ok", _all(_delete("q:explain.rubric"), _set("q:explain.model_answer", "The civil wars.")), None, None),
    ("rubric-list-ok", _set("q:explain.rubric", ["Civil wars", "Caesar"]), None, None),
    ("rubric-of-blanks", _set("q:explain.rubric", ["", "  "]), "questions[explain].rubric", ERROR),
    ("rubric-wrong-type", _set("q:explain.rubric", 3), "questions[explain].rubric", ERROR),
    ("question-mark-inside-ok", _set("q:capital.question", 'Which word is wrong? "Paris are big"'), None, None),
    ("question-without-mark", _set("q:capital.question", "Name the capital."), "questions[capital].question", ERROR),
    # (With ids that are not the labels: a reply "paris" names the option whose id it is.)
    ("labels-differ-by-case-ok", lambda raw: (_set("q:capital.options.0.id", "p")(raw),
                                              _set("q:capital.options.1.id", "l")(raw),
                                              _set("q:capital.options.1.label", "paris")(raw)), None, None),
    # A reply written as the label tells "Paris." from "Paris!"; nothing tells apart a space.
    ("labels-differ-by-mark-ok", lambda raw: (_set("q:capital.options.0.id", "p")(raw),
                                              _set("q:capital.options.1.id", "l")(raw),
                                              _set("q:capital.options.0.label", "Paris.")(raw),
                                              _set("q:capital.options.1.label", "Paris!")(raw)), None, None),
    ("labels-differ-by-spaces", lambda raw: (_set("q:capital.options.0.label", "Paris  city")(raw),
                                             _set("q:capital.options.1.label", "Paris city")(raw)),
     "questions[capital].options[lyon].label", ERROR),
    ("label-another-options-id", _set("q:capital.options.1.label", "paris"), "questions[capital].options[lyon].label",
     ERROR),
    ("labels-equal", _set("q:capital.options.1.label", "Paris"), "questions[capital].options[lyon].label", ERROR),
    ("label-left-ok", _set("q:capital.options.1.label", "Left"), None, None),
    ("guess-why-look-for-not-needed", lambda raw: None, None, None),
    ("too-many-open", _add_text_questions(29), "questions", WARNING),
]


def _study_extra_questions(raw: Raw) -> None:
    # The decide-set helper adds text questions with guesses; a quiz's text question needs a rubric.
    for item in raw["questions"]:
        if item["id"].startswith("extra"):
            item.update(topic="extra", rubric="Any answer.")
            del item["guess"]


@pytest.mark.parametrize(("mutation", "where", "level"), [c[1:] for c in STUDY_CASES], ids=[c[0] for c in STUDY_CASES])
def test_study_rule(set_dir: Path, mutation: Mutation, where: str | None, level: str | None) -> None:
    raw = copy.deepcopy(study_set())
    mutation(raw)
    _study_extra_questions(raw)
    _check_one(raw, set_dir, where, level)


def test_study_allows_thirty_open_questions(set_dir: Path) -> None:
    raw = study_set()
    _add_text_questions(28)(raw)
    _study_extra_questions(raw)
    _check_one(raw, set_dir, None, None)


# ---------------------------------------------------------------- robustness and helpers


@pytest.mark.parametrize(
    "raw",
    [
        {},
        {"questions": "all"},
        {"questions": [None, [], {"options": {"a": 1}}, {"guess": [1], "media": [3, {"src": 5}], "sides": 4}]},
        {
            "askwright": True,
            "id": 3,
            "title": [],
            "mode": None,
            "media_roots": [1, None],
            "questions": [
                {
                    "kind": "compare",
                    "sides": {"left": 1, "randomized": 2},
                    "show_if": {"question": 1, "option": "x"},
                    "subject": {"id": 1},
                }
            ],
        },
        {"questions": [{"id": "a", "kind": "rank", "options": [{"id": 1, "label": None}], "guess": {"order": [1, 2]}}]},
    ],
)
def test_wrong_types_anywhere_give_findings_not_exceptions(set_dir: Path, raw: Raw) -> None:
    result = run(raw, set_dir)
    assert not result.ok and result.model is None
    wheres = [f.where for f in result.errors]
    assert len(wheres) == len(set(wheres)), "one finding per place"


def test_not_an_object() -> None:
    result = lint([1, 2], LocalFilesystem("."))  # type: ignore[arg-type]
    assert not result.ok and result.set_id is None


def test_result_as_dict_shape(set_dir: Path) -> None:
    raw = decide_set()
    q(raw, "pick")["title"] = "x" * 90
    data = run(raw, set_dir).as_dict()
    assert data == {
        "ok": True,
        "set": "takes",
        "errors": [],
        "warnings": [{"where": "questions[pick].title", "message": data["warnings"][0]["message"]}],
    }


@pytest.mark.parametrize(
    ("text", "count"),
    [("", 0), ("One.", 1), ("Plays from 1.0 s. Then stops!", 2), ("A? B! C. D", 4), ("No full stop", 1)],
)
def test_sentence_count(text: str, count: int) -> None:
    assert sentence_count(text) == count


@pytest.mark.parametrize(
    ("item", "vague"),
    [("The overall quality", True), ("Overall look and feel", True), ("The arrow when he falls", False)],
)
def test_is_vague(item: str, vague: bool) -> None:
    assert is_vague(item) is vague


@pytest.mark.parametrize(("label", "bare"), [("Take 2", False), ("Left", True), ("Option B", True), ("Leftovers", False), ("4", True)])
def test_is_bare_label(label: str, bare: bool) -> None:
    assert is_bare_label(label) is bare
    assert is_bare_label("4", kind="scale") is False


def test_a_show_if_loop_is_an_error_on_each_question_in_it(set_dir: Path) -> None:
    """Two questions each shown only once the other is answered: neither could
    ever be shown (one naming itself was refused already; a loop of two passed)."""
    raw = decide_set()
    q(raw, "many")["show_if"] = {"question": "pick", "option": ["red"]}
    q(raw, "pick")["show_if"] = {"question": "many", "option": ["en"]}
    result = run(raw, set_dir)
    assert sorted(findings(result)) == [("questions[many].show_if.question", "error"),
                                        ("questions[pick].show_if.question", "error")]
    assert "could ever be shown" in result.errors[0].message


def test_a_question_too_large_for_one_event_is_an_error(set_dir: Path) -> None:
    """The bridge shortens a question's text to fit an event, but not its
    structured fields: lint passed a 70 KB why, and the poster then tried the
    set again and again, posting none of it."""
    raw = decide_set()
    q(raw, "many")["look_for"] = [f"Whether item {n} of the list reads well in every language we ship" * 3
                                  for n in range(400)]
    errors = [(f.where, f.message) for f in run(raw, set_dir).errors]
    assert [where for where, _message in errors] == ["questions[many]"]
    assert "too large for one Matrix event" in errors[0][1]


def test_a_scale_whose_numbers_are_not_their_places_is_warned_of(set_dir: Path) -> None:
    # A reply's number is the option's place (PROTOCOL): on a 0-4 scale a
    # person replying "3" gets the option labelled 2, with no word about it.
    raw = decide_set()
    scale = next(question for question in raw["questions"] if question.get("kind") == "scale")
    scale["options"] = [{"id": f"v{n}", "label": str(n)} for n in range(5)]
    scale["guess"]["option"] = "v2"
    warned = [f.where for f in run(raw, set_dir).warnings if f.where.endswith(".label")]
    assert warned == [f"questions[{scale['id']}].options[v{n}].label" for n in range(5)]
    scale["options"] = [{"id": f"v{n}", "label": str(n)} for n in range(1, 6)]
    scale["guess"]["option"] = "v2"
    assert [f.where for f in run(raw, set_dir).warnings if f.where.endswith(".label")] == []


def test_an_unknown_field_nested_too_deep_to_keep_is_an_error(set_dir: Path) -> None:
    """The model keeps unknown fields and the poster writes them out again: a
    question holding one 450 levels deep linted clean, its agent was told
    201, and the set was never posted (refused at every pass)."""
    from bridge.service.posting.poster import question_digest  # what refused it

    def nested(levels: int) -> Any:
        value: Any = "x"
        for _ in range(levels):
            value = [value]
        return value

    raw = decide_set()
    first = raw["questions"][0]
    first["x"] = nested(450)
    result = run(raw, set_dir)
    assert (f"questions[{first['id']}].x", "error") in findings(result)
    first["x"] = nested(64)  # deep, but keepable: only the unknown field's warning
    kept = run(raw, set_dir)
    assert (f"questions[{first['id']}].x", "error") not in findings(kept)
    assert kept.model is not None and question_digest(kept.model, kept.model.questions[0])


def test_a_figure_nested_too_deep_to_keep_is_an_error(set_dir: Path) -> None:
    """A figure's spec is a known field that holds anything: one 450 levels
    deep passed lint, and the set was never posted, as an unknown field did."""
    value: Any = {"mark": "bar"}
    for _ in range(450):
        value = {"layer": [value]}
    raw = decide_set()
    first = raw["questions"][0]
    first["media"] = [{"figure": value, "alt": "A chart of the takes"}]
    assert any(f.where == f"questions[{first['id']}]" and "levels deep" in f.message for f in run(raw, set_dir).errors)


def test_a_scale_from_zero_is_told_a_reply_of_0_picks_nothing(set_dir: Path) -> None:
    # It said a reply "0" picks option 0: there is none, a reply "0" picks nothing.
    raw = decide_set()
    rate = next(q for q in raw["questions"] if q["id"] == "rate")
    for n, option in enumerate(rate["options"]):
        option["label"] = str(n)
    said = {f.where: f.message for f in run(raw, set_dir).warnings}
    assert "picks nothing" in said["questions[rate].options[low].label"]
    assert "picks option 1, not this one (option 2)" in said["questions[rate].options[mid].label"]


def test_a_media_root_that_is_a_file_is_said_to_be_one(set_dir: Path) -> None:
    # It was said not to exist, while it plainly does.
    raw = decide_set()
    raw["media_roots"] = ["../renders", "../secret.png"]
    said = {f.where: f.message for f in run(raw, set_dir).errors}
    assert "is a file, not a folder" in said["media_roots[1]"]


def test_a_question_too_large_for_an_encrypted_rooms_event_is_a_warning(set_dir: Path) -> None:
    """Encryption makes an event about 4/3 as large: a question that fits in
    the clear may not be posted in an encrypted room, which lint can't tell."""
    raw = decide_set()
    q(raw, "many")["look_for"] = [f"Whether item {n} of the list reads well in every language we ship"
                                  for n in range(700)]
    result = run(raw, set_dir)
    assert result.errors == []
    said = [(f.where, f.message) for f in result.warnings if "encrypted room" in f.message]
    assert [where for where, _message in said] == ["questions[many]"], said
