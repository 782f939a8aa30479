"""build_question_event: schema-valid, float-free, small enough, nothing spoiled."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from bridge.protocol.question_event import (
    CONTENT_MAX_BYTES,
    EVENT_MAX_BYTES,
    SUITE_EVENT_TYPE,
    QuestionEventTooLarge,
    build_question_event,
    content_size,
    new_elicitation_id,
    no_floats,
    option_order,
)
from bridge.questionset.builtin import OTHER_ID, OTHER_LABEL, UNSURE_ID, UNSURE_LABEL
from bridge.questionset.model import QuestionSet
from bridge.resources import examples_dir, schema_path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures" / "matrix-events" / "questions"
SUBJECT = {"id": "stkreq_8f2c", "digest": "sha256:4be1c0de9a7f30b2a1c9e8d7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7"}


@pytest.fixture(scope="module")
def validator() -> Draft202012Validator:
    schema = json.loads(schema_path(SUITE_EVENT_TYPE).read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def _guess(option: str, confidence: str = "high") -> dict[str, Any]:
    return {"option": option, "why": "It matches what you picked last time.", "confidence": confidence}


def decide_set(**overrides: Any) -> dict[str, Any]:
    """One open question of every kind, as an agent would write them."""
    questions = [
        {
            "id": "db",
            "kind": "choice",
            "title": "The database",
            "question": "Which database should the service use?",
            "why": "The schema work starts tomorrow.",
            "options": [
                {"id": "pg", "label": "PostgreSQL", "consequence": "One more service to run."},
                {"id": "sqlite", "label": "SQLite"},
            ],
            "guess": _guess("pg"),
        },
        {
            "id": "langs",
            "kind": "multi",
            "title": "Languages",
            "question": "Which languages should the docs ship in?",
            "why": "Translation is booked per language.",
            "options": [{"id": "en", "label": "English"}, {"id": "de", "label": "German"}, {"id": "fr", "label": "French"}],
            "guess": {"options": ["en", "de"], "why": "Most readers.", "confidence": "low"},
        },
        {
            "id": "arrow",
            "kind": "compare",
            "title": "The arrow",
            "question": "Which take of the arrow shot should go in the cut?",
            "why": "The take you pick gets the HD re-render.",
            "look_for": ["The arrow from 1.0 s: does it stay in place when he falls?"],
            "media": [{"src": "arrow_pair.mp4", "start": 1.0}, {"src": "still.png", "start": 2, "alt": "a still"}],
            "sides": {"left": "t2", "right": "t5", "randomized": True},
            "options": [
                {"id": "t2", "label": "Take 2"},
                {"id": "t5", "label": "Take 5"},
                {"id": "redo", "label": "Neither: redo the shot", "consequence": "About 40 minutes of renders."},
            ],
            "guess": _guess("t5", "low"),
        },
        {
            "id": "prio",
            "kind": "rank",
            "title": "Priorities",
            "question": "In which order should these land?",
            "why": "One engineer, three weeks.",
            "options": [{"id": "a", "label": "Search"}, {"id": "b", "label": "Export"}, {"id": "c", "label": "Sharing"}],
            "guess": {"order": ["b", "a", "c"], "why": "Export is asked for most.", "confidence": "high"},
        },
        {
            "id": "name",
            "kind": "text",
            "title": "The name",
            "question": "What should the new branch be called?",
            "why": "It goes into every link.",
            "guess": {"text": "main", "why": "The usual.", "confidence": "high"},
            "show_if": {"question": "db", "option": ["pg"]},
        },
        {
            "id": "tone",
            "kind": "scale",
            "title": "Tone",
            "question": "How formal should the replies be?",
            "why": "Sets the prompt.",
            "options": [{"id": "s1", "label": "Casual"}, {"id": "s2", "label": "Neutral"}, {"id": "s3", "label": "Formal"}],
            "guess": _guess("s2"),
        },
        {
            "id": "deploy",
            "kind": "confirm",
            "title": "Deploy",
            "question": "Should release 4.2 go to production now?",
            "why": "The window closes at six.",
            "options": [{"id": "go", "label": "Ship it now"}, {"id": "wait", "label": "Wait for Monday"}],
            "guess": _guess("go"),
            "subject": {"id": "release-4.2", "digest": "sha256:0588c96c7eff47e1a83d9fc1d0ecda3cc3b72e559a5c402bb9da29d9851dbceb"},
        },
    ]
    raw = {"askwright": 1, "id": "demo", "title": "Demo decisions", "questions": questions}
    raw.update(overrides)
    return raw


def study_set() -> dict[str, Any]:
    return {
        "askwright": 1,
        "id": "quiz",
        "title": "German articles",
        "mode": "study",
        "questions": [
            {
                "id": "haus",
                "kind": "choice",
                "title": "Haus",
                "question": "Which article goes with Haus?",
                "topic": "articles",
                "points": 1.5,
                "options": [
                    {"id": "der", "label": "der", "correct": False, "why": "Masculine."},
                    {"id": "die", "label": "die", "correct": False, "why": "Feminine."},
                    {"id": "das", "label": "das", "correct": True, "why": "Neuter: SECRET-WHY."},
                ],
            },
            {
                "id": "explain",
                "kind": "text",
                "title": "Explain",
                "question": "Why is it das Mädchen?",
                "points": 2,
                "model_answer": "SECRET-MODEL: -chen makes nouns neuter.",
                "rubric": ["SECRET-RUBRIC mentions -chen"],
            },
        ],
    }


MEDIA = {
    "arrow_pair.mp4": {"url": "mxc://example.org/arrowpair", "mimetype": "video/mp4", "size": 1234567, "w": 1920, "h": 540, "duration_ms": 4200.0},
    "still.png": {"url": "mxc://example.org/still", "mimetype": "image/png", "size": 2048, "w": 640, "h": 360},
}


def build(raw: dict[str, Any], qid: str, **kwargs: Any) -> dict[str, Any]:
    qset = QuestionSet.model_validate(raw)
    question = qset.question(qid)
    assert question is not None
    kwargs.setdefault("elicitation_id", new_elicitation_id(qset.id, qid, question.rev, "!room:0"))
    return build_question_event(qset, question, **kwargs)


def floats_in(value: Any, path: str = "$") -> list[str]:
    if isinstance(value, float):
        return [path]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in floats_in(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in floats_in(v, f"{path}[{i}]")]
    return []


def check(content: dict[str, Any], validator: Draft202012Validator) -> None:
    errors = sorted(validator.iter_errors(content), key=lambda e: list(e.path))
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors]
    assert floats_in(content) == []
    assert content_size(content) + 1024 < EVENT_MAX_BYTES
    assert content_size(content) <= CONTENT_MAX_BYTES


ALL_QIDS = [q["id"] for q in decide_set()["questions"]]


# ---------------------------------------------------------------- every kind


@pytest.mark.parametrize("qid", ALL_QIDS)
def test_every_kind_validates(qid: str, validator: Draft202012Validator) -> None:
    content = build(decide_set(), qid, media=MEDIA)
    check(content, validator)
    assert content["msgtype"] == "m.text"
    assert content["suite_event_type"] == SUITE_EVENT_TYPE
    assert content["schema_version"] == 1
    assert content["set"] == {"id": "demo", "title": "Demo decisions", "mode": "decide"}
    assert content["question"]["id"] == qid
    assert content["question"]["text_max"] == 16000
    assert content["format"] == "org.matrix.custom.html"
    assert content["body"] and content["formatted_body"]


def test_all_seven_kinds_are_covered() -> None:
    kinds = {q["kind"] for q in decide_set()["questions"]}
    assert kinds == {"choice", "multi", "compare", "rank", "text", "scale", "confirm"}


@pytest.mark.parametrize("qid", ALL_QIDS)
def test_builtins_appended(qid: str) -> None:
    content = build(decide_set(), qid)
    options = content["question"]["options"]
    raw_q = next(q for q in decide_set()["questions"] if q["id"] == qid)
    own = [o["id"] for o in raw_q.get("options", [])]
    if raw_q["kind"] == "text":
        assert options == [{"id": UNSURE_ID, "label": UNSURE_LABEL}]
    else:
        assert [o["id"] for o in options] == own + [UNSURE_ID, OTHER_ID]
        assert options[-2] == {"id": UNSURE_ID, "label": UNSURE_LABEL}
        assert options[-1] == {"id": OTHER_ID, "label": OTHER_LABEL, "input": "required"}


def test_structured_fields_copied() -> None:
    content = build(decide_set(), "arrow", media=MEDIA)
    q = content["question"]
    assert q["why"] == "The take you pick gets the HD re-render."
    assert q["look_for"] == ["The arrow from 1.0 s: does it stay in place when he falls?"]
    assert q["sides"] == {"left": "t2", "right": "t5", "randomized": True}
    assert q["guess"] == {"option": "t5", "why": "It matches what you picked last time.", "confidence": "low"}
    assert q["options"][2]["consequence"] == "About 40 minutes of renders."
    shown_if = build(decide_set(), "name")["question"]["show_if"]
    # The earlier question's title and the options' labels ride along, for the words the message shows.
    assert shown_if == {"question": "db", "option": ["pg"], "title": "The database", "labels": ["PostgreSQL"]}


def test_media_times_are_strings_and_milliseconds() -> None:
    media = build(decide_set(), "arrow", media=MEDIA)["question"]["media"]
    assert media[0]["url"] == "mxc://example.org/arrowpair"
    assert media[0]["mimetype"] == "video/mp4"
    assert media[0]["type"] == "video"
    assert media[0]["start"] == "1.0" and media[0]["start_ms"] == 1000
    assert media[0]["duration_ms"] == 4200 and isinstance(media[0]["duration_ms"], int)
    assert media[1]["start"] == "2" and media[1]["start_ms"] == 2000
    assert media[1]["alt"] == "a still"
    assert "src" not in media[0]


def test_string_start_kept_as_written() -> None:
    raw = decide_set()
    raw["questions"][2]["media"][0]["start"] = "1.25 s"
    media = build(raw, "arrow", media=MEDIA)["question"]["media"]
    assert media[0]["start"] == "1.25 s" and media[0]["start_ms"] == 1250


def test_media_not_uploaded_are_left_out(validator: Draft202012Validator) -> None:
    content = build(decide_set(), "arrow", media={"still.png": MEDIA["still.png"]})
    assert [m["url"] for m in content["question"]["media"]] == ["mxc://example.org/still"]
    check(content, validator)
    assert "media" not in build(decide_set(), "arrow")["question"]


def test_subject_copied_from_question(validator: Draft202012Validator) -> None:
    content = build(decide_set(), "deploy")
    assert content["subject"] == {"id": "release-4.2", "digest": "sha256:0588c96c7eff47e1a83d9fc1d0ecda3cc3b72e559a5c402bb9da29d9851dbceb"}
    check(content, validator)
    assert "subject" not in build(decide_set(), "db")


def test_subject_argument_wins() -> None:
    content = build(decide_set(), "db", subject=SUBJECT)
    assert content["subject"] == SUBJECT


# ---------------------------------------------------------------- floats


def test_no_floats_anywhere_even_from_uploads(validator: Draft202012Validator) -> None:
    uploads = {k: dict(v, size=float(v["size"]), w=640.0) for k, v in MEDIA.items()}
    content = build(decide_set(), "arrow", media=uploads)
    check(content, validator)


def test_no_floats_guard() -> None:
    assert no_floats({"a": [1.5, 2, True, None, "x"], "b": {"c": 2**60}}) == {"a": ["1.5", 2, True, None, "x"], "b": {"c": str(2**60)}}


def test_schema_rejects_floats_and_huge_ints(validator: Draft202012Validator) -> None:
    content = build(decide_set(), "db")
    assert validator.is_valid(content)
    assert not validator.is_valid(dict(content, extra={"deep": [{"t": 1.5}]}))
    assert not validator.is_valid(dict(content, extra=2**53))
    assert validator.is_valid(dict(content, extra={"unknown": "kept"}))


def test_schema_rejects_float_start(validator: Draft202012Validator) -> None:
    content = build(decide_set(), "arrow", media=MEDIA)
    content["question"]["media"][0]["start"] = 1.5
    assert not validator.is_valid(content)


# ---------------------------------------------------------------- study mode


def test_study_mode_reveals_nothing(validator: Draft202012Validator) -> None:
    for qid in ("haus", "explain"):
        content = build(study_set(), qid)
        check(content, validator)
        dumped = json.dumps(content)
        assert "SECRET" not in dumped
        assert '"correct"' not in dumped
        for opt in content["question"]["options"]:
            assert set(opt) <= {"id", "label", "consequence", "input"}
    haus = build(study_set(), "haus")["question"]
    assert haus["points"] == "1.5" and haus["topic"] == "articles"
    assert build(study_set(), "explain")["question"]["points"] == 2


def test_option_order_shuffles_study_deterministically() -> None:
    qset = QuestionSet.model_validate(study_set())
    q = qset.question("haus")
    assert q is not None
    orders = {tuple(option_order(q, f"seed-{i}")) for i in range(20)}
    assert len(orders) > 1
    assert option_order(q, "seed-1") == option_order(q, "seed-1")
    assert all(sorted(o) == ["das", "der", "die"] for o in orders)
    assert option_order(q, "seed-1", mode="decide") == ["der", "die", "das"]
    q.shuffle = False
    assert option_order(q, "seed-1") == ["der", "die", "das"]


def test_order_argument_sets_option_order() -> None:
    content = build(study_set(), "haus", order=["das", "der", "die"])
    assert [o["id"] for o in content["question"]["options"]] == ["das", "der", "die", UNSURE_ID, OTHER_ID]
    with pytest.raises(ValueError):
        build(study_set(), "haus", order=["das", "der"])


# ---------------------------------------------------------------- size


def test_long_one_pager_stays_out(validator: Draft202012Validator) -> None:
    raw = decide_set()
    raw["questions"][0]["one_pager"] = [{"type": "text", "text": "background " * 20_000}]
    assert len(json.dumps(raw["questions"][0]["one_pager"])) > 200_000
    content = build(raw, "db", one_pager_ref="mxc://example.org/onepager")
    check(content, validator)
    assert "background background" not in json.dumps(content)
    assert content["question"]["one_pager_ref"] == "mxc://example.org/onepager"
    assert "thread" in content["body"]
    no_ref = build(raw, "db")
    check(no_ref, validator)
    assert "thread" in no_ref["body"] and "one_pager_ref" not in no_ref["question"]


def test_huge_strings_are_shortened_not_refused(validator: Draft202012Validator) -> None:
    raw = decide_set()
    q = raw["questions"][2]
    q["why"] = "<b>why</b> " * 2_000
    q["look_for"] = [f"item {i} at 1.0 s " + "&<>\"' " * 600 for i in range(4)]
    q["options"][2]["consequence"] = "costly " * 1_000
    content = build(raw, "arrow", media=MEDIA)
    check(content, validator)
    # The structured fields are whole: only the readable parts were shortened.
    assert content["question"]["look_for"] == q["look_for"]
    assert content["question"]["why"] == q["why"]


def test_shortening_keeps_options_numbered(validator: Draft202012Validator) -> None:
    raw = decide_set()
    raw["questions"][0]["why"] = "w" * 40_000
    content = build(raw, "db")
    check(content, validator)
    assert "1. PostgreSQL" in content["body"]
    assert "3. Not sure, ask me later" in content["body"]


def test_structured_fields_too_large_raise() -> None:
    raw = decide_set()
    raw["questions"][0]["look_for"] = ["x" * 70_000]
    with pytest.raises(QuestionEventTooLarge, match="db"):
        build(raw, "db")


@pytest.mark.parametrize("size", [1_000, 10_000, 20_000, 28_000, 31_000])
def test_never_oversized(size: int, validator: Draft202012Validator) -> None:
    raw = decide_set()
    raw["questions"][3]["why"] = "é<" * size
    try:
        content = build(raw, "prio")
    except QuestionEventTooLarge:
        return
    check(content, validator)


# ---------------------------------------------------------------- ids and arguments


def test_elicitation_id_deterministic_and_bounded() -> None:
    a = new_elicitation_id("takes", "arrow", 1, "!r:1")
    assert a == new_elicitation_id("takes", "arrow", 1, "!r:1")
    assert a != new_elicitation_id("takes", "arrow", 2, "!r:1")
    assert a != new_elicitation_id("takes", "arrow", 1, "!r:2")
    assert 1 <= len(a) <= 200
    long = new_elicitation_id("s" * 500, "q" * 500, 10**12, "x" * 10_000)
    assert 1 <= len(long) <= 200


def test_bad_arguments_refused() -> None:
    with pytest.raises(ValueError):
        build(decide_set(), "db", elicitation_id="")
    with pytest.raises(ValueError):
        build(decide_set(), "db", elicitation_id="x" * 201)
    with pytest.raises(ValueError):
        build(decide_set(), "db", text_max=16001)


def test_text_max_passed_through(validator: Draft202012Validator) -> None:
    content = build(decide_set(), "name", text_max=500)
    assert content["question"]["text_max"] == 500
    check(content, validator)


# ---------------------------------------------------------------- fixtures and examples


def _fixture_files() -> list[Path]:
    return sorted(FIXTURES.glob("*.json"))


def test_fixtures_exist() -> None:
    names = {p.stem for p in _fixture_files()}
    assert {"choice", "compare_media_sides", "subject_bound_approval", "text"} <= names


@pytest.mark.parametrize("path", _fixture_files(), ids=lambda p: p.stem)
def test_fixture_validates(path: Path, validator: Draft202012Validator) -> None:
    event = json.loads(path.read_text(encoding="utf-8"))
    assert event["type"] == "m.room.message"
    assert {"event_id", "room_id", "sender", "content"} <= set(event)
    check(event["content"], validator)
    assert content_size(event) < EVENT_MAX_BYTES


def _example_sets() -> list[Path]:
    try:
        root = examples_dir()
    except FileNotFoundError:
        return []
    return sorted(root.glob("**/questions.json"))


@pytest.mark.parametrize("path", _example_sets(), ids=lambda p: p.parent.name)
def test_every_bundled_example_builds(path: Path, validator: Draft202012Validator) -> None:
    qset = QuestionSet.model_validate_json(path.read_bytes())
    assert qset.open_questions
    for question in qset.open_questions:
        uploads = {
            item.src: {"url": f"mxc://example.org/m{i}", "mimetype": "application/octet-stream"}
            for i, item in enumerate(question.media or [])
            if item.src
        }
        eid = new_elicitation_id(qset.id, question.id, question.rev, "example")
        content = build_question_event(qset, question, elicitation_id=eid, media=uploads, posted_ms=1_800_000_000_000)
        check(content, validator)


def test_bad_subject_refused() -> None:
    with pytest.raises(ValueError, match="subject.digest"):
        build(decide_set(), "db", subject={"id": "x", "digest": "d" * 513})
    with pytest.raises(ValueError, match="subject.id"):
        build(decide_set(), "db", subject={"id": "", "digest": "d"})


# ---------------------------------------------------------------- compare: the sides in the order they are seen


def _compare_set(sides: dict[str, Any]) -> dict[str, Any]:
    q = {
        "id": "splash", "kind": "compare", "title": "Splash", "question": "Which splash should open the app?",
        "why": "Seen on every start.", "look_for": ["The first second: does it stay sharp?"],
        "media": [{"src": "pair.mp4"}], "sides": sides,
        "options": [{"id": "keep", "label": "Keep the old splash"}, {"id": "b", "label": "Take B"}, {"id": "a", "label": "Take A"}],
        "guess": _guess("a"),
    }
    return {"askwright": 1, "id": "demo", "title": "Demo", "questions": [q]}


@pytest.mark.parametrize("order", [None, ["keep", "b", "a"], ["b", "keep", "a"], ["a", "b", "keep"]])
def test_compare_lists_left_then_right_then_the_rest(order: list[str] | None, validator: Draft202012Validator) -> None:
    content = build(_compare_set({"left": "a", "right": "b", "randomized": True}), "splash", order=order)
    ids = [o["id"] for o in content["question"]["options"]]
    assert ids == ["a", "b", "keep", UNSURE_ID, OTHER_ID]
    assert "1. Left\n2. Right\n3. Keep the old splash" in content["body"]
    validator.validate(content)


def test_compare_without_sides_keeps_the_given_order() -> None:
    raw = _compare_set({"left": "a", "right": "b"})
    del raw["questions"][0]["sides"]
    content = build(raw, "splash", order=["b", "keep", "a"])
    assert [o["id"] for o in content["question"]["options"]][:3] == ["b", "keep", "a"]


def test_show_if_names_validate(validator: Draft202012Validator) -> None:
    content = build(decide_set(), "name")
    validator.validate(content)
    assert "Only needed if your answer to \u201cThe database\u201d is \u201cPostgreSQL\u201d." in content["body"]
