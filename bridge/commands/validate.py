"""``askwright-bridge validate --question QUESTION_EVENT.json ANSWER_EVENT.json [--json]``

Judge one answer event against one question event offline, with the same two
layers the bridge uses (schema, then recorded).  Both files hold whole events
(``event_id``, ``room_id``, ``sender``, ``type``, ``content``).

Exit 0 when the answer would be accepted, 1 when it would be refused, 2 when
an input cannot be read.  ``--json`` prints
``{"ok", "refused_by", "reason", "message"}``; otherwise one plain line.

Offline there is no room to ask about membership, so the sender check treats
the answer's sender as the only member and no allow list as configured: a
sender is refused only when it is the bridge itself (the question's sender).
The question is taken as still open.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bridge.protocol import schemas
from bridge.protocol.deadline import event_time_problem
from bridge.protocol.graphemes import shorten
from bridge.protocol.judge import Accepted, IncomingAnswer, JudgeContext, Refused, judge
from bridge.protocol.recorded import RecordedQuestion

EXIT_ACCEPTED = 0
EXIT_REFUSED = 1
EXIT_UNREADABLE = 2


class Unreadable(Exception):
    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "validate",
        help="judge an answer event against a question event, offline",
        description=(
            "Judge ANSWER_EVENT.json against QUESTION_EVENT.json as the bridge would: exit 0 accepted, "
            "1 refused, 2 unreadable input. Room membership cannot be checked offline: the answer's "
            "sender is taken as a member of the room."
        ),
    )
    parser.add_argument("--question", required=True, metavar="QUESTION_EVENT.json", help="the question.v2 event as posted")
    parser.add_argument("answer", metavar="ANSWER_EVENT.json", help="the answer event to judge")
    parser.add_argument("--json", dest="as_json", action="store_true", help="print the verdict as JSON")
    return parser


def run(args: argparse.Namespace) -> int:
    try:
        question_event = _question_event(_read_event(args.question, "question"))
        answer_event = _read_event(args.answer, "answer")
        _check_answer_event(answer_event)
    except Unreadable as exc:
        _report(args.as_json, {"ok": False, "refused_by": None, "reason": "unreadable_input", "message": exc.message})
        return EXIT_UNREADABLE
    question = RecordedQuestion.from_event(question_event)
    answer = IncomingAnswer.from_event(answer_event)
    # The question's sender is the bridge that posted it.
    ctx = JudgeContext(allowed=None, members=frozenset({answer.sender}), bridge_user=question_event["sender"])
    verdict = judge(question, answer, ctx)
    _report(args.as_json, verdict_dict(verdict))
    return EXIT_ACCEPTED if isinstance(verdict, Accepted) else EXIT_REFUSED


def verdict_dict(verdict: Accepted | Refused) -> dict[str, Any]:
    if isinstance(verdict, Refused):
        return {"ok": False, "refused_by": verdict.layer, "reason": verdict.reason, "message": verdict.message}
    return {"ok": True, "refused_by": None, "reason": None, "message": f"accepted as an answer to {verdict.qid!r}"}


def _report(as_json: bool, result: dict[str, Any]) -> None:
    if as_json:
        print(json.dumps(result, ensure_ascii=False))
        return
    stream = sys.stdout if result["ok"] or result["refused_by"] else sys.stderr
    if result["ok"]:
        print(f"ok: {result['message']}", file=stream)
    elif result["refused_by"]:
        print(f"refused by the {result['refused_by']} layer ({result['reason']}): {result['message']}", file=stream)
    else:
        print(f"askwright-bridge validate: {result['message']}", file=stream)


def _read_event(path: str, what: str) -> dict[str, Any]:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise Unreadable(f"cannot read the {what} file {path}: {exc.strerror or exc}") from None
    try:
        value = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise Unreadable(f"the {what} file {path} is not JSON: {exc}") from None
    except RecursionError:
        raise Unreadable(f"the {what} file {path} is nested too deeply") from None
    if not isinstance(value, dict):
        raise Unreadable(f"the {what} file {path} must hold one event (a JSON object)")
    return value


def _question_event(event: dict[str, Any]) -> dict[str, Any]:
    for key in ("event_id", "room_id", "sender"):
        if not isinstance(event.get(key), str) or not event[key]:
            raise Unreadable(f"the question event has no {key}")
    content = event.get("content")
    if not isinstance(content, dict):
        raise Unreadable("the question event has no content object")
    # The deadline first, in the words lint uses for it: the schema's pattern
    # says only "does not match" and lets a month 13 through.
    time_problem = event_time_problem(content.get("question"))
    if time_problem is not None:
        where, value, why = time_problem
        shown = json.dumps(value, ensure_ascii=False) if isinstance(value, str) else type(value).__name__
        raise Unreadable(f"the question event is not a question.v2 event (question.{where}: {shorten(shown, 80)} {why})")
    # An answer can only be judged against a real question.v2: a broken one
    # would turn every answer into a misleading refusal.
    try:
        problems = schemas.errors(schemas.QUESTION, content)
    except RecursionError:
        raise Unreadable("the question event is nested too deeply") from None
    if problems:
        first = min(problems, key=lambda e: (len(e.absolute_path), str(list(e.absolute_path))))
        where = ".".join(str(p) for p in first.absolute_path) or "content"
        raise Unreadable(f"the question event is not a question.v2 event ({where}: {shorten(first.message, 200)})")
    return event


def _check_answer_event(event: dict[str, Any]) -> None:
    # The content is judged (a missing or broken one is a refusal); the event
    # around it must say who sent it, where, and as which event.
    for key in ("event_id", "room_id", "sender"):
        if not isinstance(event.get(key), str) or not event[key]:
            raise Unreadable(f"the answer event has no {key}")
