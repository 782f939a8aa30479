"""Properties of the judge over generated inputs."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.protocol import schemas
from bridge.protocol.judge import REASONS, Accepted, IncomingAnswer, JudgeContext, Refused, judge
from bridge.protocol.recorded import RecordedQuestion
from bridge.protocol.to_record import to_record

ROOM, BRIDGE, PERSON, QEVENT = "!r:hs", "@bridge:hs", "@p:hs", "$q"
CTX = JudgeContext(allowed=None, members=frozenset({PERSON}), bridge_user=BRIDGE)
KINDS = ("choice", "multi", "compare", "rank", "text", "scale", "confirm")

json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=25,
)

KNOWN = ("msgtype", "body", "schema_version", "suite_event_type", "elicitation_id", "option_id", "text",
         "subject", "m.relates_to", "note")


def base_content() -> dict[str, Any]:
    return {
        "msgtype": "m.text",
        "body": "b",
        "suite_event_type": "dev.superpipeline.question.answer.v2",
        "elicitation_id": "elc",
        "option_id": "a",
        "m.relates_to": {"rel_type": "m.reference", "event_id": QEVENT},
    }


# Near-valid contents: the base with known fields replaced by random or
# typical values, or dropped, so every schema rule gets exercised.
typical = st.sampled_from(["", " ", "a", "m.text", "m.reference", "unsure", "other", "x" * 201, "\n\t"]) | st.text(max_size=5)
field_values = json_values | typical | st.integers(-2, 2) | st.builds(
    dict, id=typical, digest=typical
) | st.fixed_dictionaries({"rel_type": typical, "event_id": typical})


@st.composite
def near_valid(draw: st.DrawFn) -> dict[str, Any]:
    content = base_content()
    for key in draw(st.lists(st.sampled_from(KNOWN), max_size=4, unique=True)):
        if draw(st.booleans()):
            content.pop(key, None)
        else:
            content[key] = draw(field_values)
    return content


def question(kind: str = "choice") -> RecordedQuestion:
    options = [{"id": "unsure", "label": "U"}] if kind == "text" else [
        {"id": "a", "label": "A"}, {"id": "b", "label": "B"}, {"id": "unsure", "label": "U"},
        {"id": "other", "label": "O", "input": "required"}]
    content = {"msgtype": "m.text", "body": "b", "suite_event_type": "dev.superpipeline.question.v2",
               "elicitation_id": "elc", "question": {"id": "q", "rev": 1, "kind": kind, "title": "t",
                                                     "question": "?", "options": options}}
    return RecordedQuestion(event_id=QEVENT, room_id=ROOM, set_id="s", content=content)


def check_verdict(verdict: Any) -> None:
    assert isinstance(verdict, (Accepted, Refused))
    if isinstance(verdict, Refused):
        # "unjudgeable" would mean the judge crashed inside: never on any input.
        assert verdict.reason != "unjudgeable"
        assert REASONS[verdict.reason] == verdict.layer
        assert isinstance(verdict.message, str) and verdict.message


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(content=json_values | near_valid(), kind=st.sampled_from(KINDS), known=st.booleans())
def test_any_json_content_is_judged_without_raising(content: Any, kind: str, known: bool) -> None:
    answer = IncomingAnswer(event_id="$a", room_id=ROOM, sender=PERSON, origin_server_ts=0, content=content)
    check_verdict(judge(question(kind) if known else None, answer, CTX))


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(content=json_values | near_valid() | st.builds(lambda d: {**base_content(), **d}, st.dictionaries(st.sampled_from(KNOWN), field_values)))
def test_fast_predicate_agrees_with_jsonschema(content: Any) -> None:
    fast = schemas.predicate(schemas.ANSWER)
    assert fast is not None
    assert fast(content) == schemas.validator(schemas.ANSWER).is_valid(content)
    assert (schemas.errors(schemas.ANSWER, content) == []) == fast(content)


# ------------------------------------------------------------------ valid picks

option_ids = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9_.-]{0,10}\Z").filter(lambda s: s not in ("unsure", "other"))
blank_free_text = st.text(min_size=1, max_size=40).filter(lambda s: s.strip() != "")


@st.composite
def question_and_pick(draw: st.DrawFn) -> tuple[RecordedQuestion, dict[str, Any]]:
    kind = draw(st.sampled_from(KINDS))
    ids = [] if kind == "text" else draw(st.lists(option_ids, min_size=2, max_size=6, unique=True))
    options = [{"id": i, "label": f"L{n}", **({"input": draw(st.sampled_from(["required", "optional"]))}
                                              if draw(st.booleans()) else {})} for n, i in enumerate(ids)]
    options.append({"id": "unsure", "label": "Not sure, ask me later"})
    if kind != "text":
        options.append({"id": "other", "label": "Something else", "input": "required"})
    text_max = draw(st.integers(200, 16000))
    subject = draw(st.none() | st.fixed_dictionaries({"id": st.text(min_size=1, max_size=20), "digest": st.text(min_size=1, max_size=20)}))
    content: dict[str, Any] = {
        "msgtype": "m.text", "body": "b", "suite_event_type": "dev.superpipeline.question.v2",
        "elicitation_id": draw(st.text(min_size=1, max_size=20)),
        "question": {"id": draw(option_ids), "rev": draw(st.integers(1, 9)), "kind": kind, "title": "t",
                     "question": "?", "options": options, "text_max": text_max},
    }
    if subject is not None:
        content["subject"] = subject
    q = RecordedQuestion(event_id=draw(st.text(min_size=1, max_size=20)), room_id=ROOM, set_id="s", content=content)

    answer: dict[str, Any] = {
        "msgtype": "m.text", "body": "b", "suite_event_type": "dev.superpipeline.question.answer.v2",
        "elicitation_id": content["elicitation_id"],
        "m.relates_to": {"rel_type": "m.reference", "event_id": q.event_id},
    }
    if subject is not None:
        answer["subject"] = dict(subject)
    sep = draw(st.sampled_from([",", ", ", " , "]))
    how = draw(st.sampled_from(["unsure", "other", "pick"]))
    if how == "unsure":
        answer["option_id"] = "unsure"
    elif how == "other" and kind != "text":
        answer["option_id"], answer["text"] = "other", draw(blank_free_text)
    elif kind == "text":
        answer["text"] = draw(blank_free_text)
    elif kind == "multi":
        answer["text"] = sep.join(draw(st.lists(st.sampled_from(ids), min_size=1, unique=True)))
    elif kind == "rank":
        answer["text"] = sep.join(draw(st.permutations(ids)))
    else:
        picked = draw(st.sampled_from(options))
        answer["option_id"] = picked["id"]
        if picked.get("input") == "required" or draw(st.booleans()):
            answer["text"] = draw(blank_free_text)
    if draw(st.booleans()):
        answer["note"] = draw(st.text(max_size=30))
    return q, answer


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(pair=question_and_pick())
def test_valid_picks_are_accepted_and_recorded(pair: tuple[RecordedQuestion, dict[str, Any]]) -> None:
    q, content = pair
    answer = IncomingAnswer(event_id="$a", room_id=ROOM, sender=PERSON, origin_server_ts=0, content=content)
    verdict = judge(q, answer, CTX)
    assert isinstance(verdict, Accepted), verdict
    assert verdict.qid == q.qid and verdict.q_rev == q.rev
    if q.kind == "multi" and "option_id" not in content:
        assert verdict.choices and set(verdict.choices) <= q.offered_ids
    if q.kind == "rank" and "option_id" not in content:
        assert verdict.order is not None and sorted(verdict.order) == sorted(q.rankable_ids)
    record = to_record(q, verdict, prior=None, source={"via": "matrix"}, now="2026-01-01T00:00:00Z")
    assert record["state"] in ("answered", "unsure")
    assert record["rev"] == 1 and record["q_rev"] == q.rev


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(pair=question_and_pick(), other=st.sampled_from(["elicitation_id", "event", "room", "closed", "sender"]))
def test_valid_picks_elsewhere_are_refused(pair: tuple[RecordedQuestion, dict[str, Any]], other: str) -> None:
    q, content = pair
    room, sender = ROOM, PERSON
    if other == "elicitation_id":
        content = {**content, "elicitation_id": content["elicitation_id"] + "x"}
    elif other == "event":
        content = {**content, "m.relates_to": {"rel_type": "m.reference", "event_id": q.event_id + "x"}}
    elif other == "room":
        room = "!elsewhere:hs"
    elif other == "closed":
        q = RecordedQuestion(q.event_id, q.room_id, q.set_id, q.content, open=False)
    else:
        sender = "@stranger:hs"
    verdict = judge(q, IncomingAnswer("$a", room, sender, 0, content), CTX)
    assert isinstance(verdict, Refused) and verdict.layer == "recorded"
    expected = {"elicitation_id": "wrong_elicitation", "event": "wrong_reference", "room": "wrong_room",
                "closed": "question_closed", "sender": "sender_not_allowed"}[other]
    assert verdict.reason == expected
