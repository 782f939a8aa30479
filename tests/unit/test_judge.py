"""The judge: every reason code, every kind's encodings, and its guarantees."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from jsonschema.exceptions import ValidationError

from bridge.protocol import judge as judge_module
from bridge.protocol import schemas
from bridge.protocol.judge import (
    NOTE_MAX,
    REASONS,
    Accepted,
    IncomingAnswer,
    JudgeContext,
    Refused,
    check_schema,
    judge,
)
from bridge.protocol.recorded import TEXT_MAX_DEFAULT, RecordedQuestion

ROOM = "!room:example.org"
BRIDGE = "@bridge:example.org"
ALICE = "@alice:example.org"
QEVENT = "$q1"
ELC = "elc_1"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "reason-codes.md"

UNSURE = {"id": "unsure", "label": "Not sure, ask me later"}
OTHER = {"id": "other", "label": "Something else", "input": "required"}
ABC = [{"id": "a", "label": "Apple"}, {"id": "b", "label": "Banana"}, {"id": "c", "label": "Cherry"}]


def question(kind: str = "choice", *, options: list[dict[str, Any]] | None = None, open: bool = True, **extra: Any) -> RecordedQuestion:
    if options is None:
        options = [UNSURE] if kind == "text" else [*ABC, UNSURE, OTHER]
    q: dict[str, Any] = {"id": "q", "rev": 2, "kind": kind, "title": "T", "question": "Which?", "options": options}
    content: dict[str, Any] = {
        "msgtype": "m.text",
        "body": "T",
        "suite_event_type": "dev.superpipeline.question.v2",
        "elicitation_id": ELC,
        "question": q,
    }
    for key, value in extra.items():
        (content if key == "subject" else q)[key] = value
    return RecordedQuestion(event_id=QEVENT, room_id=ROOM, set_id="s", content=content, open=open)


def content(**fields: Any) -> dict[str, Any]:
    c: dict[str, Any] = {
        "msgtype": "m.text",
        "body": "answer",
        "suite_event_type": "dev.superpipeline.question.answer.v2",
        "elicitation_id": ELC,
        "m.relates_to": {"rel_type": "m.reference", "event_id": QEVENT},
    }
    for key, value in fields.items():
        if value is ...:
            c.pop(key, None)
        else:
            c[key] = value
    return c


def answer(c: Any, *, sender: str = ALICE, room: str = ROOM, via: str = "answer_event") -> IncomingAnswer:
    return IncomingAnswer(event_id="$a1", room_id=room, sender=sender, origin_server_ts=1, content=c, via=via)


CTX = JudgeContext(allowed=None, members=frozenset({ALICE, BRIDGE}), bridge_user=BRIDGE)


def verdict(q: RecordedQuestion | None, c: Any, ctx: JudgeContext = CTX, **kw: Any) -> Accepted | Refused:
    return judge(q, answer(c, **kw), ctx)


def refused(v: Accepted | Refused, reason: str) -> None:
    assert isinstance(v, Refused), v
    assert v.reason == reason, v
    if reason != "unjudgeable":
        assert v.layer == REASONS[reason]
    assert v.message and "\n" not in v.message


# ---------------------------------------------------------------- schema layer


@pytest.mark.parametrize("value", [None, [], "a", 1, 1.5, True, ["option_id"]])
def test_not_an_object(value: Any) -> None:
    refused(verdict(question(), value), "not_an_object")


@pytest.mark.parametrize("field", ["msgtype", "body", "suite_event_type", "elicitation_id", "m.relates_to"])
def test_missing_required_field(field: str) -> None:
    v = verdict(question(), content(option_id="a", **{field: ...}))
    refused(v, "missing_field")
    assert field in v.message


def test_missing_reference_says_so_in_plain_words() -> None:
    v = verdict(question(), content(option_id="a", **{"m.relates_to": ...}))
    assert "which question" in v.message


@pytest.mark.parametrize(
    "fields",
    [
        {"option_id": 3},
        {"option_id": "a", "text": 3},
        {"option_id": "a", "body": None},
        {"option_id": "a", "schema_version": "1"},
        {"option_id": "a", "schema_version": True},
        {"option_id": "a", "subject": "x"},
        {"option_id": "a", "note": ["n"]},
        {"option_id": "a", "m.relates_to": []},
    ],
)
def test_wrong_type(fields: dict[str, Any]) -> None:
    refused(verdict(question(), content(**fields)), "wrong_type")


@pytest.mark.parametrize(
    "fields",
    [
        {"msgtype": "m.notice"},
        {"suite_event_type": "dev.superpipeline.question.answer.v1"},
        {"schema_version": 0},
        {"m.relates_to": {"rel_type": "m.replace", "event_id": QEVENT}},
    ],
)
def test_wrong_value(fields: dict[str, Any]) -> None:
    refused(verdict(question(), content(option_id="a", **fields)), "wrong_value")


@pytest.mark.parametrize(
    "fields",
    [
        {"option_id": ""},
        {"option_id": "a", "elicitation_id": ""},
        {"option_id": "a", "m.relates_to": {"rel_type": "m.reference", "event_id": ""}},
        {"option_id": "a", "subject": {"id": "", "digest": "d"}},
    ],
)
def test_too_short(fields: dict[str, Any]) -> None:
    refused(verdict(question(), content(**fields)), "too_short")


@pytest.mark.parametrize(
    "fields",
    [
        {"option_id": "a", "elicitation_id": "e" * 201},
        {"text": "t" * 16001},
        {"option_id": "a", "note": "n" * 16001},
        {"option_id": "a", "subject": {"id": "i", "digest": "d" * 513}},
    ],
)
def test_too_long(fields: dict[str, Any]) -> None:
    refused(verdict(question("text"), content(**fields)), "too_long")


@pytest.mark.parametrize("fields, words", [
    ({"text": "t" * 16001}, "Your answer is 16001 characters long; the bridge takes at most 16000. Shorten it and "
                            "send it again."),
    ({"option_id": "a", "note": "n" * 17000}, "Your note is 17000 characters long; the bridge takes at most 16000."),
])
def test_what_a_person_typed_too_long_is_told_in_plain_words(fields: dict[str, Any], words: str) -> None:
    """A 17,000-character reply was told "The answer's `text` is longer than
    16000 characters.": backticks Element shows as they are, and no count."""
    found = verdict(question("text"), content(**fields))
    assert isinstance(found, Refused) and found.message.startswith(words) and "`" not in found.message, found


def test_limits_are_inclusive() -> None:
    q = question("text")
    ok = content(text="t" * 16000, note="n" * 16000, elicitation_id=ELC)
    assert isinstance(verdict(q, ok), Accepted)
    assert check_schema(content(option_id="a", elicitation_id="e" * 200)) is None


@pytest.mark.parametrize("fields", [{}, {"text": ""}, {"text": " \t\n"}, {"note": "only a note"}])
def test_no_answer(fields: dict[str, Any]) -> None:
    refused(verdict(question("text"), content(**fields)), "no_answer")


def test_specific_error_beats_the_cross_field_rule() -> None:
    # text of the wrong type and no option: the type is what to fix.
    refused(verdict(question("text"), content(text=5)), "wrong_type")


def test_invalid_content_is_the_fallback_for_unmapped_keywords(monkeypatch: pytest.MonkeyPatch) -> None:
    odd = ValidationError("odd", validator="uniqueItems", path=["x"], validator_value=True, instance=[], schema={})
    monkeypatch.setattr(schemas, "errors", lambda event_type, instance: [odd])
    refused(verdict(question(), content(option_id="a")), "invalid_content")


def test_unknown_properties_are_allowed() -> None:
    c = content(option_id="a", **{"org.example.x": {"deep": [[[]]]}, "m.mentions": {}})
    assert isinstance(verdict(question(), c), Accepted)


# -------------------------------------------------------------- recorded layer


def test_from_bridge() -> None:
    refused(verdict(question(), content(option_id="a"), sender=BRIDGE), "from_bridge")


def test_unknown_question() -> None:
    refused(verdict(None, content(option_id="a")), "unknown_question")


def test_a_question_record_without_an_id_is_unknown() -> None:
    q = RecordedQuestion(event_id=QEVENT, room_id=ROOM, set_id="s", content={"elicitation_id": ELC})
    refused(verdict(q, content(option_id="a")), "unknown_question")


def test_wrong_reference() -> None:
    c = content(option_id="a", **{"m.relates_to": {"rel_type": "m.reference", "event_id": "$other"}})
    refused(verdict(question(), c), "wrong_reference")


def test_wrong_room() -> None:
    refused(verdict(question(), content(option_id="a"), room="!else:example.org"), "wrong_room")


def test_sender_not_a_member() -> None:
    refused(verdict(question(), content(option_id="a"), sender="@mallory:example.org"), "sender_not_allowed")


def test_allow_list_replaces_membership() -> None:
    ctx = JudgeContext(allowed=frozenset({"@bob:example.org"}), members=frozenset({ALICE}), bridge_user=BRIDGE)
    refused(verdict(question(), content(option_id="a"), ctx), "sender_not_allowed")
    ctx = JudgeContext(allowed=frozenset({ALICE}), members=frozenset(), bridge_user=BRIDGE)
    assert isinstance(verdict(question(), content(option_id="a"), ctx), Accepted)


def test_bridge_is_refused_even_when_allowed() -> None:
    ctx = JudgeContext(allowed=frozenset({BRIDGE}), members=frozenset({BRIDGE}), bridge_user=BRIDGE)
    refused(verdict(question(), content(option_id="a"), ctx, sender=BRIDGE), "from_bridge")


def test_wrong_elicitation() -> None:
    refused(verdict(question(), content(option_id="a", elicitation_id="elc_0")), "wrong_elicitation")


def test_question_closed() -> None:
    refused(verdict(question(open=False), content(option_id="a")), "question_closed")


def test_a_closed_question_says_so_to_a_sender_whose_membership_is_unknown() -> None:
    """A room the config no longer names has its members unread once its last
    question closed: an answer there, after a restart, hears that the question
    is closed, not that its sender may not answer."""
    unread = JudgeContext(allowed=None, members=frozenset(), bridge_user=BRIDGE)
    posted = question()
    closed = RecordedQuestion(posted.event_id, posted.room_id, posted.set_id, posted.content,
                              open=False, closed_why="this set was removed")
    verdict_ = verdict(closed, content(option_id="a"), unread)
    refused(verdict_, "question_closed")
    assert "no longer open (this set was removed)" in verdict_.message


SUBJECT = {"id": "subj-1", "digest": "sha256:abc"}


def test_subject_bound_accepts_the_exact_binding() -> None:
    q = question("confirm", subject=SUBJECT)
    assert isinstance(verdict(q, content(option_id="a", subject=dict(SUBJECT))), Accepted)


def test_subject_missing() -> None:
    refused(verdict(question("confirm", subject=SUBJECT), content(option_id="a")), "subject_missing")


def test_wrong_subject_wins_over_wrong_digest() -> None:
    q = question("confirm", subject=SUBJECT)
    refused(verdict(q, content(option_id="a", subject={"id": "subj-2", "digest": "sha256:abc"})), "wrong_subject")
    refused(verdict(q, content(option_id="a", subject={"id": "subj-2", "digest": "sha256:zzz"})), "wrong_subject")


def test_wrong_digest() -> None:
    q = question("confirm", subject=SUBJECT)
    refused(verdict(q, content(option_id="a", subject={"id": "subj-1", "digest": "sha256:abd"})), "wrong_digest")


def test_a_malformed_recorded_subject_refuses_every_binding() -> None:
    q = question("confirm", subject={"id": "subj-1"})
    refused(verdict(q, content(option_id="a", subject={"id": "subj-1", "digest": "d"})), "wrong_subject")
    refused(verdict(q, content(option_id="a")), "subject_missing")


def test_unexpected_subject() -> None:
    refused(verdict(question(), content(option_id="a", subject=SUBJECT)), "unexpected_subject")


def test_text_too_long_against_text_max() -> None:
    q = question("text", text_max=5)
    assert isinstance(verdict(q, content(text="12345")), Accepted)
    refused(verdict(q, content(text="123456")), "text_too_long")
    refused(verdict(question("choice", text_max=3), content(option_id="other", text="four")), "text_too_long")


def test_text_max_default() -> None:
    assert question("text").text_max == TEXT_MAX_DEFAULT == 16000
    assert question("text", text_max=0).text_max == 16000  # out of range: the schema's cap applies


@pytest.mark.parametrize("kind", ["choice", "scale", "confirm", "compare", "multi", "rank", "text"])
def test_option_not_offered(kind: str) -> None:
    refused(verdict(question(kind), content(option_id="zzz")), "option_not_offered")


def test_option_not_offered_echo_is_short() -> None:
    v = verdict(question(), content(option_id="x" * 5000 + "\nline"))
    refused(v, "option_not_offered")
    assert len(v.message) < 200


def test_option_not_offered_echo_holds_no_control_character() -> None:
    # A NUL in the refusal's message would fail its write on PostgreSQL.
    v = verdict(question(), content(option_id="a\x00b\x1bc"))
    refused(v, "option_not_offered")
    assert "\x00" not in v.message and "\x1b" not in v.message and "a\ufffdb\ufffdc" in v.message
    # Half a surrogate pair (JSON's escapes spell it): the refusal could not be written, and the
    # person was told the bridge failed ("internal_error") where the option is simply not offered.
    v = verdict(question(), content(option_id="x\udfffy\ud800"))
    refused(v, "option_not_offered")
    v.message.encode("utf-8")
    assert "x\ufffdy\ufffd" in v.message


def test_input_required() -> None:
    refused(verdict(question(), content(option_id="other")), "input_required")
    refused(verdict(question(), content(option_id="other", text="  ")), "input_required")
    ok = verdict(question(), content(option_id="other", text="kiwi"))
    assert isinstance(ok, Accepted) and ok.option_id == "other" and ok.text == "kiwi"


def test_optional_input() -> None:
    q = question(options=[{"id": "a", "label": "A", "input": "optional"}, UNSURE, OTHER])
    for text in (None, "", "why not"):
        v = verdict(q, content(option_id="a", text=text) if text is not None else content(option_id="a"))
        assert isinstance(v, Accepted)
        assert v.text == (text or None)


def test_text_beside_an_option_without_input_is_kept() -> None:
    v = verdict(question(), content(option_id="a", text="because"))
    assert isinstance(v, Accepted) and v.text == "because"


@pytest.mark.parametrize("kind", ["choice", "scale", "confirm", "compare"])
def test_text_alone_is_not_a_pick(kind: str) -> None:
    refused(verdict(question(kind), content(text="a")), "option_required")


def test_note_too_long() -> None:
    c = content(option_id="other", text="t" * 10000, note="n" * (NOTE_MAX - 10000 - 1))
    refused(verdict(question(), c), "note_too_long")
    c = content(option_id="other", text="t" * 10000, note="n" * (NOTE_MAX - 10000 - 2))
    assert isinstance(verdict(question(), c), Accepted)


# ------------------------------------------------------------- kind encodings


@pytest.mark.parametrize("kind", ["choice", "scale", "confirm", "compare"])
def test_single_pick_kinds(kind: str) -> None:
    v = verdict(question(kind), content(option_id="b", note="a note"))
    assert isinstance(v, Accepted)
    assert (v.option_id, v.text, v.choices, v.order, v.note, v.kind) == ("b", None, None, None, "a note", kind)
    assert (v.qid, v.q_rev, v.event_id, v.elicitation_id, v.via) == ("q", 2, "$a1", ELC, "answer_event")


@pytest.mark.parametrize(
    ("text", "choices"),
    [("a", ("a",)), ("a, c", ("a", "c")), ("c,a", ("c", "a")), (" b , ", ("b",)), ("a,,c", ("a", "c"))],
)
def test_multi_accepts(text: str, choices: tuple[str, ...]) -> None:
    v = verdict(question("multi"), content(text=text))
    assert isinstance(v, Accepted)
    assert v.choices == choices and v.option_id is None and v.text is None


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("a, d", "option_not_offered"),
        ("a, a", "choice_repeated"),
        (",", "no_choices"),
        (" , ,", "no_choices"),
        ("a, other", "builtin_in_list"),
        ("unsure", "builtin_in_list"),
        ("A", "option_not_offered"),
        ("Apple", "option_not_offered"),
    ],
)
def test_multi_refuses(text: str, reason: str) -> None:
    refused(verdict(question("multi"), content(text=text)), reason)


def test_multi_regular_option_id_is_the_wrong_encoding() -> None:
    refused(verdict(question("multi"), content(option_id="a")), "wrong_encoding")
    refused(verdict(question("multi"), content(option_id="a", text="a, b")), "wrong_encoding")


@pytest.mark.parametrize("kind", ["multi", "rank"])
def test_builtins_stand_alone_on_list_kinds(kind: str) -> None:
    v = verdict(question(kind), content(option_id="unsure"))
    assert isinstance(v, Accepted) and v.option_id == "unsure"
    v = verdict(question(kind), content(option_id="other", text="something"))
    assert isinstance(v, Accepted) and (v.option_id, v.text, v.choices, v.order) == ("other", "something", None, None)


def test_rank_accepts_every_option_once() -> None:
    v = verdict(question("rank"), content(text="c, a, b"))
    assert isinstance(v, Accepted) and v.order == ("c", "a", "b")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("a, b", "rank_incomplete"),
        ("a, b, c, c", "choice_repeated"),
        ("a, b, c, d", "option_not_offered"),
        ("a, b, c, unsure", "builtin_in_list"),
        (",", "rank_incomplete"),
    ],
)
def test_rank_refuses(text: str, reason: str) -> None:
    refused(verdict(question("rank"), content(text=text)), reason)


def test_rank_regular_option_id_is_the_wrong_encoding() -> None:
    refused(verdict(question("rank"), content(option_id="a")), "wrong_encoding")


def test_text_kind() -> None:
    v = verdict(question("text"), content(text="  main  "))
    assert isinstance(v, Accepted) and v.text == "  main  " and v.option_id is None
    v = verdict(question("text"), content(option_id="unsure", text="no idea yet"))
    assert isinstance(v, Accepted) and (v.option_id, v.text) == ("unsure", "no idea yet")


def test_text_kind_takes_only_unsure_even_if_more_is_offered() -> None:
    q = question("text", options=[UNSURE, {"id": "x", "label": "X"}])
    refused(verdict(q, content(option_id="x")), "option_not_offered")


def test_unknown_kind_needs_an_option() -> None:
    refused(verdict(question("poll"), content(text="a")), "option_required")
    assert isinstance(verdict(question("poll"), content(option_id="a")), Accepted)


def test_blank_note_is_no_note() -> None:
    v = verdict(question(), content(option_id="a", note="   "))
    assert isinstance(v, Accepted) and v.note is None


def test_via_is_carried() -> None:
    v = verdict(question(), content(option_id="a"), via="poll")
    assert isinstance(v, Accepted) and v.via == "poll"


# ----------------------------------------------------------------- guarantees


def test_order_of_layers_schema_first() -> None:
    # Broken content against no question: the schema layer speaks first.
    refused(verdict(None, {"msgtype": "m.text"}), "missing_field")


def test_never_raises_on_odd_answer_fields() -> None:
    odd = IncomingAnswer(event_id=None, room_id=["r"], sender={"x": 1}, origin_server_ts="t", content=content(option_id="a"))  # type: ignore[arg-type]
    v = judge(question(), odd, CTX)
    assert isinstance(v, Refused)


def test_unjudgeable_when_a_layer_breaks(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_: Any) -> Any:
        raise RuntimeError("bug")

    monkeypatch.setattr(judge_module, "check_recorded", boom)
    refused(verdict(question(), content(option_id="a")), "unjudgeable")
    monkeypatch.setattr(judge_module, "check_schema", boom)
    v = verdict(question(), content(option_id="a"))
    assert isinstance(v, Refused) and (v.layer, v.reason) == ("schema", "unjudgeable")


def test_deep_nesting_and_huge_strings() -> None:
    deep: Any = "x"
    for _ in range(100_000):
        deep = [deep]
    refused(verdict(question(), deep), "not_an_object")
    refused(verdict(question(), content(option_id="a", subject=deep)), "wrong_type")
    v = verdict(question(), content(option_id="a", extra=deep, body="b" * 1_000_000))
    assert isinstance(v, Accepted)
    refused(verdict(question("text"), content(text=" " * 1_000_000)), "too_long")


def test_reason_codes_are_snake_case_and_documented() -> None:
    doc = DOCS.read_text(encoding="utf-8")
    for code, layer in REASONS.items():
        assert re.fullmatch(r"[a-z][a-z0-9_]*", code)
        assert layer in ("schema", "recorded")
        assert re.search(rf"\|\s*`?{code}`?\s*\|", doc), code


def test_clip_keeps_what_the_schema_looks_at() -> None:
    assert schemas.depth(schemas.ANSWER) == 2
    c = {"subject": {"id": [[["x"]]], "digest": {"a": {"b": 1}}}, "x": [[[1]]], "s": "str"}
    assert schemas.clip(c, 2) == {"subject": {"id": [[]], "digest": {"a": {}}}, "x": [[[]]], "s": "str"}


@pytest.mark.parametrize("event_type", [schemas.QUESTION, schemas.ANSWER, schemas.OUTCOME])
def test_every_shipped_schema_is_a_valid_draft_2020_12_schema(event_type: str) -> None:
    # The bridge does not check them at run time (it cost 18 ms at the first
    # answer after each start): a broken schema is caught here, before a release.
    from jsonschema import Draft202012Validator

    Draft202012Validator.check_schema(schemas.schema(event_type))
    assert sorted(p.name for p in schemas.schema_path(schemas.ANSWER).parent.glob("*.json")) == sorted(
        f"{t}.json" for t in (schemas.QUESTION, schemas.ANSWER, schemas.OUTCOME))


def test_validators_are_compiled_once() -> None:
    assert schemas.validator(schemas.ANSWER) is schemas.validator(schemas.ANSWER)
    assert schemas.predicate(schemas.ANSWER) is not None
    assert schemas.schema(schemas.ANSWER) is schemas.schema(schemas.ANSWER)


def test_outcome_schema_shape() -> None:
    v = schemas.validator(schemas.OUTCOME)
    assert v.is_valid({"answer_event_id": "$a", "outcome": "recorded", "layer": None, "reason": None, "qid": "q", "record_rev": 1})
    assert v.is_valid({"answer_event_id": "$a", "outcome": "refused", "layer": "recorded", "reason": "wrong_digest"})
    assert not v.is_valid({"answer_event_id": "$a", "outcome": "refused", "layer": None, "reason": None})
    assert not v.is_valid({"answer_event_id": "$a", "outcome": "recorded", "layer": "schema", "reason": "x", "qid": "q", "record_rev": 1})
    assert not v.is_valid({"answer_event_id": "$a", "outcome": "refused", "layer": "schema", "reason": "x", "record_rev": 1})
    assert not v.is_valid({"answer_event_id": "$a", "outcome": "refused", "layer": "schema", "reason": "Not Snake"})


@pytest.mark.parametrize(("kind", "text"), [("multi", "a, unsure"), ("rank", "a, b, c, unsure")])
def test_a_builtin_in_a_list_is_named_by_its_number_and_label(kind: str, text: str) -> None:
    # The person typed "5" (say) and saw "Not sure, ask me later", never the id.
    v = verdict(question(kind), content(text=text))
    assert isinstance(v, Refused) and v.reason == "builtin_in_list"
    assert v.message == "4 (“Not sure, ask me later”) can't be combined with other picks; send it on its own."
    other = verdict(question(kind), content(text="other, a"))
    assert isinstance(other, Refused) and other.message.startswith("5 (“Something else”) can't be combined")


def test_the_machine_failing_while_the_schema_is_first_read_is_no_refusal(monkeypatch, tmp_path) -> None:
    # Out of descriptors (idle connections filling the bridge's limit) at the
    # first answer after a start: the answer was refused for good as
    # unjudgeable. It fails the batch instead, which is tried again.
    import errno

    from helpers.timeline import Room, answer

    room = Room(tmp_path)
    read = Path.read_text

    def out_of_descriptors(self: Path, *args: Any, **kwargs: Any) -> str:
        if self.suffix == ".json" and "schema" in str(self):
            raise OSError(errno.EMFILE, "Too many open files")
        return read(self, *args, **kwargs)

    for cached in (schemas.schema, schemas.validator, schemas.predicate, schemas.depth):
        cached.cache_clear()  # as at the first answer after a start
    monkeypatch.setattr(Path, "read_text", out_of_descriptors)
    with pytest.raises(OSError):
        room.deliver([answer("$a", "@alice:hs", 1000, "main")])
    assert room.record() is None
    monkeypatch.setattr(Path, "read_text", read)
    room.deliver([answer("$a", "@alice:hs", 1000, "main")])
    assert room.record()["choice"] == "main"


@pytest.mark.parametrize("event_type", [schemas.QUESTION, schemas.ANSWER, schemas.OUTCOME])
def test_no_shipped_schema_names_a_key_twice(event_type: str) -> None:
    # JSON readers keep the last of two equal keys without a word: the
    # question schema's second ``$defs.time`` (a media start, any non-empty
    # string) replaced its RFC 3339 one, and ``expires`` took "tomorrow".
    def once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [key for key, _ in pairs]
        assert len(keys) == len(set(keys)), sorted({k for k in keys if keys.count(k) > 1})
        return dict(pairs)

    json.loads(schemas.schema_path(event_type).read_text(encoding="utf-8"), object_pairs_hook=once)


@pytest.mark.parametrize("value, valid", [
    ("2026-12-01T14:00:00Z", True), ("2026-12-01T14:00:00.250+01:00", True),
    ("tomorrow", False), ("2026-12-01T14:00:00", False), ("2026-12-01", False), ("2h", False),
])
def test_the_question_schema_takes_only_an_rfc3339_time_with_a_zone_for_a_deadline(value: str, valid: bool) -> None:
    """An agent that checks a question against the published schema finds
    the deadline the judge will read, or none it could mistake for one."""
    question = {"msgtype": "m.text", "body": "b", "suite_event_type": "dev.superpipeline.question.v2",
                "elicitation_id": "e", "question": {"id": "q", "rev": 1, "kind": "text", "title": "t",
                                                    "question": "q?", "options": [{"id": "unsure", "label": "Not sure"}],
                                                    "media": [{"url": "mxc://hs/m", "mimetype": "video/mp4", "start": "1.4 s"}]}}
    v = schemas.validator(schemas.QUESTION)
    assert v.is_valid(question)  # a media start stays seconds as the set wrote them
    assert v.is_valid({**question, "question": {**question["question"], "expires": value}}) is valid
    escalate = {"after": value, "to": ["@someone:example.org"]}
    assert v.is_valid({**question, "question": {**question["question"], "escalate": escalate}}) is valid
