"""A question must fit in one Matrix event (PROTOCOL 2: under 65,536 bytes).

The bridge shortens a question's readable text to fit, but its structured
fields (options, look_for, why, …) travel whole: a question whose structured
fields alone are too large could never be posted, and its set would be tried
again and again.  Lint builds the event of each open question that could be
that large, as the poster would, and says so."""

from __future__ import annotations

import json

from bridge.questionset.lint.context import Context, QuestionView
from bridge.questionset.model import QuestionSet

# Under this much JSON a question's event always fits: only larger ones are built.
SURELY_FITS = 16 * 1024


def check_fits_one_event(ctx: Context, model: QuestionSet | None, questions: list[QuestionView]) -> None:
    if model is None:
        return  # a type error already says what is wrong
    from bridge.protocol.question_event import ENCRYPTED_CONTENT_MAX_BYTES, QuestionEventTooLarge, build_question_event

    views = {q.id: q for q in questions if q.id is not None}
    for question in model.questions:
        view = views.get(question.id)
        if view is None or not view.is_open or len(json.dumps(view.raw)) < SURELY_FITS:
            continue
        try:
            build_question_event(model, question, elicitation_id="elc_lint")
        except QuestionEventTooLarge as exc:
            ctx.error(view.where, f"too large for one Matrix event, so it could never be posted: {exc}")
            continue
        try:
            build_question_event(model, question, elicitation_id="elc_lint", max_bytes=ENCRYPTED_CONTENT_MAX_BYTES)
        except QuestionEventTooLarge as exc:
            # (Lint does not know the room: encryption makes the event about 4/3 as large.)
            ctx.warning(view.where, f"too large for one Matrix event in an encrypted room, where it would not be "
                                    f"posted: {exc}")
