"""The subject a question binds its approval to."""

from __future__ import annotations

from bridge.questionset.lint.access import dict_at, str_at
from bridge.questionset.lint.context import Context, QuestionView
from bridge.questionset.lint.unknown import check_unknown

SUBJECT_MAX = 512


def check_subject(ctx: Context, q: QuestionView) -> None:
    subject = dict_at(q.raw, "subject")
    if subject is None:
        return
    where = f"{q.where}.subject"
    check_unknown(ctx, subject, "subject", where)
    for key in ("id", "digest"):
        value = str_at(subject, key)
        if value is None:
            continue
        if not value.strip():
            ctx.error(f"{where}.{key}", f"subject {key} must not be empty: it names exactly what is approved")
        elif len(value) > SUBJECT_MAX:
            ctx.error(f"{where}.{key}", f"subject {key} is {len(value)} characters long; {SUBJECT_MAX} at most")
