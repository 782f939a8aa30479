"""``askwright-bridge validate``: exit codes and output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bridge.cli import main

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "matrix-events" / "answers"


def cases(name: str) -> list[dict[str, Any]]:
    return json.loads((CORPUS / name).read_text(encoding="utf-8"))["cases"]


def write(tmp_path: Path, name: str, value: Any) -> str:
    path = tmp_path / name
    path.write_text(value if isinstance(value, str) else json.dumps(value), encoding="utf-8")
    return str(path)


def run(tmp_path: Path, question: Any, answer: Any, *extra: str) -> int:
    return main(["validate", "--question", write(tmp_path, "q.json", question), write(tmp_path, "a.json", answer), *extra])


@pytest.mark.parametrize("case", cases("valid.json"), ids=lambda c: c["name"])
def test_valid_cases_exit_0(tmp_path: Path, case: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    assert run(tmp_path, case["question"], case["answer"], "--json") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is True and out["refused_by"] is None and out["reason"] is None
    assert set(out) == {"ok", "refused_by", "reason", "message"}


@pytest.mark.parametrize("case", cases("refused.json"), ids=lambda c: c["name"])
def test_refused_cases_exit_1(tmp_path: Path, case: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    assert run(tmp_path, case["question"], case["answer"], "--json") == 1
    out = json.loads(capsys.readouterr().out)
    assert (out["ok"], out["refused_by"], out["reason"]) == (False, case["refused_by"], case["reason"])
    assert out["message"]


def test_plain_output_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ok, bad = cases("valid.json")[0], cases("refused.json")[0]
    assert run(tmp_path, ok["question"], ok["answer"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith("ok")
    assert run(tmp_path, bad["question"], bad["answer"]) == 1
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "recorded" in out and "option_not_offered" in out


def test_sender_is_taken_as_a_member_but_never_the_bridge(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    case = cases("valid.json")[0]
    stranger = {**case["answer"], "sender": "@someone-else:example.org"}
    assert run(tmp_path, case["question"], stranger) == 0
    bridge = {**case["answer"], "sender": case["question"]["sender"]}
    assert run(tmp_path, case["question"], bridge, "--json") == 1
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["reason"] == "from_bridge"


def test_answer_event_without_content_is_refused_not_unreadable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    case = cases("valid.json")[0]
    answer = {k: v for k, v in case["answer"].items() if k != "content"}
    assert run(tmp_path, case["question"], answer, "--json") == 1
    assert json.loads(capsys.readouterr().out)["reason"] == "not_an_object"


@pytest.mark.parametrize(
    ("question", "answer"),
    [
        ("{not json", None),
        ("[]", None),
        ({"event_id": "$q", "room_id": "!r", "sender": "@b:hs"}, None),
        ({"event_id": "$q", "room_id": "!r", "sender": "@b:hs", "content": {"msgtype": "m.text"}}, None),
        ({"room_id": "!r", "sender": "@b:hs", "content": {}}, None),
        (None, "nope"),
        (None, {"content": {}}),
        (None, "\ufeff{}"),
        (None, "[" * 100_000 + "]" * 100_000),
    ],
)
def test_unreadable_exits_2(tmp_path: Path, question: Any, answer: Any, capsys: pytest.CaptureFixture[str]) -> None:
    case = cases("valid.json")[0]
    code = run(tmp_path, case["question"] if question is None else question, case["answer"] if answer is None else answer, "--json")
    assert code == 2
    out = json.loads(capsys.readouterr().out)
    assert (out["ok"], out["refused_by"], out["reason"]) == (False, None, "unreadable_input")


def test_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    case = cases("valid.json")[0]
    code = main(["validate", "--question", str(tmp_path / "missing.json"), write(tmp_path, "a.json", case["answer"])])
    assert code == 2
    err = capsys.readouterr().err
    assert "missing.json" in err and err.count("\n") == 1


@pytest.mark.parametrize("where, value", [
    ("expires", "tomorrow"),
    ("expires", "2026-13-01T00:00:00Z"),  # the shape of a time, and no time there is
    ("expires", "2026-12-01T14:00:00"),  # no zone: which 14:00?
    ("escalate.after", "in an hour"),
])
def test_a_question_whose_deadline_is_no_rfc3339_time_is_unreadable_not_judged_without_it(
        tmp_path: Path, where: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    """PROTOCOL 2a: the event carries its deadline as an RFC 3339 time with a
    zone.  One that was not read as no deadline at all, so validate accepted
    an answer the bridge would refuse as late."""
    case = cases("valid.json")[0]
    question = json.loads(json.dumps(case["question"]))
    if where == "expires":
        question["content"]["question"]["expires"] = value
    else:
        question["content"]["question"]["escalate"] = {"after": value, "to": ["@someone:example.org"]}
    assert run(tmp_path, question, case["answer"], "--json") == 2
    out = json.loads(capsys.readouterr().out)
    assert (out["ok"], out["refused_by"], out["reason"]) == (False, None, "unreadable_input")
    # Named where it is, with lint's words for the same value in questions.json.
    assert f"question.{where}: {json.dumps(value)}" in out["message"], out
    assert out["message"].endswith("such as 2026-12-01T14:00:00Z)"), out
