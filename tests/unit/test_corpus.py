"""Every case of the answer corpus (fixtures/matrix-events/answers) through the judge."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bridge.protocol import schemas
from bridge.protocol.judge import REASONS, Accepted, IncomingAnswer, JudgeContext, Refused, judge
from bridge.protocol.recorded import RecordedQuestion

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "matrix-events" / "answers"
FILES = ("valid.json", "refused.json", "extra.json")


def load(name: str) -> list[dict[str, Any]]:
    return json.loads((CORPUS / name).read_text(encoding="utf-8"))["cases"]


ALL_CASES = [(name, case) for name in FILES for case in load(name)]


def run_case(case: dict[str, Any]) -> Accepted | Refused:
    event = case["question"]
    question = RecordedQuestion.from_event(event, open=case.get("question_open", True)) if event else None
    answer = IncomingAnswer.from_event(case["answer"])
    bridge_user = event["sender"] if event else "@askwright:example.org"
    given = case.get("context")
    if given is None:
        ctx = JudgeContext(allowed=None, members=frozenset({answer.sender, bridge_user}), bridge_user=bridge_user)
    else:
        allowed = given["allowed"]
        ctx = JudgeContext(
            allowed=None if allowed is None else frozenset(allowed),
            members=frozenset(given["members"]),
            bridge_user=given["bridge_user"],
        )
    return judge(question, answer, ctx)


@pytest.mark.parametrize(("file", "case"), ALL_CASES, ids=[f"{f}:{c['name']}" for f, c in ALL_CASES])
def test_case(file: str, case: dict[str, Any]) -> None:
    verdict = run_case(case)
    if case["expect"] == "accepted":
        assert isinstance(verdict, Accepted), verdict
        for field, value in case.get("accepted", {}).items():
            got = getattr(verdict, field)
            assert (list(got) if isinstance(got, tuple) else got) == value, field
    else:
        assert case["expect"] == "refused"
        assert isinstance(verdict, Refused), verdict
        assert (verdict.layer, verdict.reason) == (case["refused_by"], case["reason"])
        assert verdict.message


def test_seed_counts() -> None:
    assert len(load("valid.json")) == 7
    assert len(load("refused.json")) == 12
    assert all(c["expect"] == "accepted" for c in load("valid.json"))
    assert all(c["expect"] == "refused" for c in load("refused.json"))


def test_seed_layers_as_the_seed_names_them() -> None:
    layers = [c["refused_by"] for c in load("refused.json")]
    assert layers.count("schema") == 2
    assert layers.count("recorded") == 10


def test_every_reachable_reason_code_has_a_case() -> None:
    used = {c["reason"] for _, c in ALL_CASES if c["expect"] == "refused"}
    # invalid_content and unjudgeable are safety nets no content reaches
    # today; test_judge covers them.  poll_ended is the pipeline's (a poll's
    # end is an event of the room the judge does not see): test_poll_end.
    assert set(REASONS) - used == {"invalid_content", "unjudgeable", "poll_ended"}
    assert used <= set(REASONS)


def test_case_names_are_unique() -> None:
    names = [c["name"] for _, c in ALL_CASES]
    assert len(names) == len(set(names))


@pytest.mark.parametrize(("file", "case"), ALL_CASES, ids=[f"{f}:{c['name']}" for f, c in ALL_CASES])
def test_recorded_questions_are_question_v2_events(file: str, case: dict[str, Any]) -> None:
    if case["question"] is None:
        return
    try:
        found = schemas.errors(schemas.QUESTION, case["question"]["content"])
    except schemas.SchemaMissing:
        pytest.skip("question.v2 schema not present")
    assert found == []


def test_accepted_answers_pass_plain_jsonschema() -> None:
    # The fast predicate is not involved here: jsonschema itself agrees.
    for _, case in ALL_CASES:
        if case["expect"] == "accepted":
            assert schemas.validator(schemas.ANSWER).is_valid(case["answer"]["content"]), case["name"]


def test_seed_values_kept() -> None:
    valid = {c["name"]: c["answer"]["content"] for c in load("valid.json")}
    assert valid["an option the question offered"] == {
        "msgtype": "m.text",
        "body": "Run the tests",
        "schema_version": 1,
        "suite_event_type": "dev.superpipeline.question.answer.v2",
        "elicitation_id": "elc_7f3c",
        "option_id": "run_them",
        "m.relates_to": {"rel_type": "m.reference", "event_id": "$questionEventId"},
    }
    allow = valid["approval-request: allow once, bound"]
    assert allow["subject"] == {"id": "stkreq_8f2c", "digest": "sha256:4be1c0de9a7f30b2"}
    assert allow["m.relates_to"]["event_id"] == "$aprEventId"
    assert "schema_version" not in allow
