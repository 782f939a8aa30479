"""The entry point: every rule, run in a fixed order (the order of the findings), then the type errors folded in."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bridge.questionset import media as media_rules
from bridge.questionset.lint.approvals import check_approvals, check_set_expires
from bridge.questionset.lint.confined import check_confined_backgrounds, check_confined_roots
from bridge.questionset.lint.context import Context, QuestionView, question_views
from bridge.questionset.lint.eventsize import check_fits_one_event
from bridge.questionset.lint.guess import check_guess
from bridge.questionset.lint.identity import check_question_id, check_rev_and_supersedes, check_show_if, check_status
from bridge.questionset.lint.media_items import check_media
from bridge.questionset.lint.options import check_options
from bridge.questionset.lint.posted import check_posted_rev
from bridge.questionset.lint.setlevel import check_across_questions, check_set
from bridge.questionset.lint.sides import check_sides
from bridge.questionset.lint.study import check_study
from bridge.questionset.lint.subject import check_subject
from bridge.questionset.lint.type_errors import merge_type_findings, under_any
from bridge.questionset.lint.unknown import check_depth, check_unknown
from bridge.questionset.lint.wording import check_look_for, check_question_text, check_title, check_why_and_hint
from bridge.questionset.load import Finding, validate_model
from bridge.questionset.model import QuestionSet


@dataclass
class LintResult:
    set_id: str | None
    errors: list[Finding] = field(default_factory=list)
    warnings: list[Finding] = field(default_factory=list)
    model: QuestionSet | None = None

    @property
    def ok(self) -> bool:
        return not self.errors

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "set": self.set_id,
            "errors": [f.as_dict() for f in self.errors],
            "warnings": [f.as_dict() for f in self.warnings],
        }


def lint(raw: dict[str, Any], fs: media_rules.Filesystem, *, probe: media_rules.Probe | None = None,
         posted_revs: Mapping[str, int] | None = None, confined: bool = False,
         answerers: Iterable[str] | None = None) -> LintResult:
    """Check a parsed ``questions.json`` against every rule of the format.

    ``fs`` answers file questions relative to the set folder; ``probe``
    (optional) reads a video's codecs; without it the codec check is skipped.
    ``posted_revs`` (optional): question id -> the highest rev the bridge
    posted of it, read from its store by the caller; a lower rev is a warning.
    ``answerers`` (optional): the bridge's own (its config's; empty: anyone in
    the room), so a quorum nobody allowed could meet is an error there too.
    """
    if not isinstance(raw, dict):
        return LintResult(None, [Finding("set", "questions.json must hold a JSON object")])
    model, type_findings = validate_model(raw)
    type_errors = merge_type_findings(type_findings)

    mode = raw.get("mode")
    # An unknown mode is a type error; the rules then read the set as the default.
    ctx = Context(raw, fs, probe, mode if mode in ("decide", "study") else "decide", posted_revs or {}, confined,
                  answerers=frozenset(answerers or ()) or None)
    check_set(ctx)
    check_set_expires(ctx)
    if confined:
        check_confined_roots(ctx)
    questions = question_views(raw)
    by_id: dict[str, QuestionView] = {}
    for q in questions:
        if q.id is not None:
            by_id.setdefault(q.id, q)
    for q in questions:
        _check_question(ctx, q, by_id)
    check_across_questions(ctx, questions)
    if not ctx.errors:
        check_fits_one_event(ctx, model, questions)

    typed = [f.where for f in type_errors]
    set_id = raw.get("id") if isinstance(raw.get("id"), str) else None
    return LintResult(
        set_id=set_id,
        errors=type_errors + [f for f in ctx.errors if not under_any(f.where, typed)],
        warnings=[f for f in ctx.warnings if not under_any(f.where, typed)],
        model=model,
    )


def _check_question(ctx: Context, q: QuestionView, by_id: dict[str, QuestionView]) -> None:
    check_unknown(ctx, q.raw, "question", q.where)
    check_depth(ctx, q.raw, q.where)
    check_question_id(ctx, q, by_id)
    check_title(ctx, q)
    check_question_text(ctx, q)
    check_why_and_hint(ctx, q)
    check_look_for(ctx, q)
    check_options(ctx, q)
    check_guess(ctx, q)
    check_sides(ctx, q)
    check_media(ctx, q)
    if ctx.confined:
        check_confined_backgrounds(ctx, q)
    check_show_if(ctx, q, by_id)
    check_status(ctx, q, by_id)
    check_rev_and_supersedes(ctx, q)
    check_posted_rev(ctx, q)
    check_subject(ctx, q)
    check_approvals(ctx, q)
    if ctx.study:
        check_study(ctx, q)
