"""The approval fields (PROTOCOL 2a): ``expires``, ``answerers``, ``quorum``, ``escalate``."""

from __future__ import annotations

from typing import Any

from bridge.protocol.deadline import is_rfc3339, parse_rfc3339_ms, parse_when
from bridge.protocol.userids import user_id_problem
from bridge.questionset.builtin import BUILTIN_IDS
from bridge.questionset.lint.access import dict_at, is_int, list_at, quote, value_at
from bridge.questionset.lint.context import Context, QuestionView
from bridge.questionset.lint.unknown import check_unknown

# The kinds whose answer is one pick: the only ones a vote can be counted on.
QUORUM_KINDS = ("choice", "confirm", "scale", "compare")


def check_set_expires(ctx: Context) -> None:
    questions = [q for q in list_at(ctx.raw, "questions") or () if isinstance(q, dict) and "expires" not in q]
    _check_when(ctx, value_at(ctx.raw, "expires"), "expires", "expires",
                posted=all(_posted(ctx, q.get("id"), q.get("rev")) for q in questions))


def check_approvals(ctx: Context, q: QuestionView) -> None:
    _check_when(ctx, value_at(q.raw, "expires"), f"{q.where}.expires", "expires",
                posted=_posted(ctx, q.id, q.raw.get("rev")))
    answerers = _check_users(ctx, q.raw, "answerers", q.where)
    escalate = dict_at(q.raw, "escalate")
    to: list[str] = []
    if escalate is not None:
        where = f"{q.where}.escalate"
        check_unknown(ctx, escalate, "escalate", where)
        if value_at(escalate, "after") is None:
            ctx.error(f"{where}.after", "escalate needs `after`: when to bring the others in (a duration such as 2h)")
        else:
            _check_when(ctx, value_at(escalate, "after"), f"{where}.after", "escalate.after",
                        posted=_posted(ctx, q.id, q.raw.get("rev")))
            _check_escalates_in_time(ctx, value_at(escalate, "after"),
                                     value_at(q.raw, "expires") or value_at(ctx.raw, "expires"), f"{where}.after",
                                     posted=_posted(ctx, q.id, q.raw.get("rev")))
        if value_at(escalate, "to") is None:
            ctx.error(f"{where}.to", "escalate needs `to`: the user ids to bring in")
        else:
            to = _check_users(ctx, escalate, "to", where)
    _check_within_the_bridges(ctx, q, answerers, "answerers")
    _check_within_the_bridges(ctx, q, to, "escalate.to")
    quorum = dict_at(q.raw, "quorum")
    if quorum is not None:
        _check_quorum(ctx, q, quorum, answerers, to)


def _check_within_the_bridges(ctx: Context, q: QuestionView, users: list[str], name: str) -> None:
    """The question's people who are not among the bridge's ``answerers``:
    the question names them (escalation mentions them, "you may answer it
    now"), and every answer of theirs is refused ``sender_not_allowed``."""
    outside = [user for user in users if ctx.answerers is not None and user not in ctx.answerers]
    if outside:
        ctx.warning(f"{q.where}.{name}", f"{', '.join(outside[:5])}{' …' if len(outside) > 5 else ''} "
                                          f"{'is' if len(outside) == 1 else 'are'} not among the bridge's answerers: "
                                          "named here, but every answer of theirs would be refused")


def _posted(ctx: Context, qid: Any, rev: Any) -> bool:
    """The bridge posted this revision of the question already."""
    return isinstance(qid, str) and (rev if is_int(rev) else 1) <= ctx.posted_revs.get(qid, 0)


def _check_when(ctx: Context, value: Any, where: str, name: str, posted: bool = False) -> None:
    """``posted``: the revision it applies to was posted already: its time
    passing is its deadline having come, not a mistake (the set's other
    questions can still be added and revised)."""
    if value is None or not isinstance(value, str):
        return  # absent, or a type error already
    try:
        at = parse_when(value, ctx.now_ms)
    except ValueError as exc:
        ctx.error(where, f"{name} {quote(value)} {exc}")
        return
    if is_rfc3339(value) and at <= ctx.now_ms and not posted:
        ctx.error(where, f"{name} {quote(value)} is in the past; give a later time or a duration such as 2h")


def _check_escalates_in_time(ctx: Context, after: Any, expires: Any, where: str, posted: bool = False) -> None:
    """An escalation at or after the deadline would bring people in to a
    question nobody may answer any more.  Told when both are durations
    (counted from the same posting) or both times, and for a duration
    against a time when the revision is still to be posted: posted now, it
    is late already, and posted later, later still.  (A time against a
    duration depends on when the revision is posted.)"""
    if not (isinstance(after, str) and isinstance(expires, str)):
        return
    if is_rfc3339(after) != is_rfc3339(expires) and (is_rfc3339(after) or posted):
        return
    try:
        late = parse_when(after, ctx.now_ms) >= parse_when(expires, ctx.now_ms)
    except ValueError:
        return  # said where each is checked
    if late:
        ctx.error(where, f"escalate.after {quote(after)} is not before expires {quote(expires)}: "
                         "the people brought in could no longer answer")


def _check_users(ctx: Context, obj: dict[str, Any], key: str, where: str) -> list[str]:
    users = list_at(obj, key)
    if users is None:
        return []
    place = f"{where}.{key}"
    if not users:
        ctx.error(place, f"{key} must name at least one Matrix user id (leave it out to let anyone the bridge accepts answer)")
    good: list[str] = []
    for i, user in enumerate(users):
        problem = user_id_problem(user)
        if problem:
            ctx.error(f"{place}[{i}]", problem)
        elif user in good:
            ctx.warning(f"{place}[{i}]", f"{user} is listed twice")
        else:
            good.append(user)
    return good


def _check_quorum(ctx: Context, q: QuestionView, quorum: dict[str, Any], answerers: list[str], to: list[str]) -> None:
    where = f"{q.where}.quorum"
    check_unknown(ctx, quorum, "quorum", where)
    if q.kind is not None and q.kind not in QUORUM_KINDS:
        ctx.error(where, f"a quorum counts one pick per person; a {q.kind} question can't have one "
                         f"(only {', '.join(QUORUM_KINDS)})")
    required = value_at(quorum, "required")
    if required is None:
        ctx.error(f"{where}.required", "quorum needs `required`: how many people must agree")
    elif is_int(required):
        if required < 1:
            ctx.error(f"{where}.required", f"required is {required}; it must be 1 or more")
        # Who may answer: the question's own (and those it escalates to),
        # within the bridge's; the bridge's all, when the question names none.
        allowed = set(answerers) | set(to) if answerers else None
        if ctx.answerers is not None:
            allowed = ctx.answerers & allowed if allowed is not None else set(ctx.answerers)
        if allowed is not None and required > len(allowed):
            people = len(allowed)
            ctx.error(f"{where}.required", f"required is {required} but only {people} "
                                           f"{'person' if people == 1 else 'people'} may answer"
                                           f"{'' if answerers else ' (the bridge’s answerers)'}: it could never be met")
    offered = set(q.option_ids)
    vetoes = list_at(quorum, "veto") or []
    if offered and offered <= set(vetoes) and is_int(required) and required > 1:
        ctx.warning(f"{where}.veto", f"every option is a veto: the first vote decides, and required "
                                     f"({required}) counts for nothing")
    for i, veto in enumerate(vetoes):
        if not isinstance(veto, str):
            continue
        if veto in BUILTIN_IDS:
            ctx.error(f"{where}.veto[{i}]", f"{quote(veto)} is a built-in option and never a vote; veto one of the question's own options")
        elif veto not in offered:
            ctx.error(f"{where}.veto[{i}]", f"{quote(veto)} is not one of this question's options "
                                            f"({', '.join(sorted(offered)) or 'none'})")


__all__ = ["check_approvals", "check_set_expires", "user_id_problem", "QUORUM_KINDS", "parse_rfc3339_ms"]
