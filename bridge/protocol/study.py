"""A study set (a quiz): the word back on each answer, and the score.

Pure.  Whether a pick is right and why is looked up in the *current*
``questions.json``: the posted event never carries ``correct`` or an
option's ``why`` (that would give the quiz away).  Text answers are not
scored here: they are stored for grading against the rubric or model answer.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bridge.protocol.outcome import shown_title

if TYPE_CHECKING:
    from bridge.questionset.model import Question, QuestionSet

NO_TOPIC = "(no topic)"


def feedback(question: Question | None, record: dict[str, Any]) -> str | None:
    """One or two sentences on an answer to a quiz question; None when there is nothing to say."""
    if question is None or (record.get("q_rev") or 1) != (question.rev or 1):
        # An answer to a revision since replaced: its verdict is not the new
        # revision's ``correct`` (a right answer was told "Not quite").
        return None
    if question.kind == "text":
        if record.get("text") is None:
            return None
        return "Your answer is stored for grading" + (" against the rubric." if question.rubric else ".")
    choice = record.get("choice")
    picked = question.option(choice) if isinstance(choice, str) else None
    right = next((o for o in question.options or () if o.correct), None)
    if picked is None or right is None:
        return None
    if picked.id == right.id:
        return "Right." + (f" {picked.why}" if picked.why else "")
    text = "Not quite." + (f" {picked.why}" if picked.why else "")
    return text + f" The answer is \u201c{right.label}\u201d" + (f": {right.why}" if right.why else ".")


@dataclass(frozen=True)
class Score:
    points: float
    possible: float
    by_topic: dict[str, tuple[float, float]]
    bonus: tuple[float, float]
    to_grade: int  # text answers waiting for a grader


def complete(qset: QuestionSet, answers: dict[str, dict[str, Any]]) -> bool:
    """Every question the quiz asks now has an answer to it as it stands (a
    note alone is not one, nor an answer to an earlier revision)."""
    answers = _current(qset, answers)
    questions = _asked(qset, answers)
    return bool(questions) and all(
        (answers.get(q.id) or {}).get("state") in ("answered", "unsure") for q in questions)


def _current(qset: QuestionSet, answers: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The answers to each question's current revision: one to a revision
    since replaced was scored against the new one's ``correct``."""
    revs = {q.id: q.rev or 1 for q in qset.questions}
    return {qid: record for qid, record in answers.items() if (record.get("q_rev") or 1) == revs.get(qid, 1)}


def _asked(qset: QuestionSet, answers: dict[str, dict[str, Any]]) -> list[Question]:
    """The open questions the quiz asks, given the answers: one ``show_if``
    makes "only needed if" another's answer is one of its options is not
    asked when that answer is another (the quiz was never scored)."""
    def needed(question: Question) -> bool:
        condition = question.show_if
        if condition is None:
            return True
        record = answers.get(condition.question) or {}
        picked = {record.get("choice"), *(record.get("choices") or ())}
        return bool(picked & set(condition.option))
    return [q for q in qset.open_questions if needed(q)]


def counted(qset: QuestionSet, answers: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """What a score is made of: the answers to the questions the quiz asks,
    each to its current revision (an answer to a question not asked, or to
    a revision replaced, changes no score)."""
    current = _current(qset, answers)
    return {q.id: current[q.id] for q in _asked(qset, current) if q.id in current}


def score(qset: QuestionSet, answers: dict[str, dict[str, Any]]) -> Score:
    answers = _current(qset, answers)
    main = [0.0, 0.0]
    bonus = [0.0, 0.0]
    topics: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    to_grade = 0
    for question in _asked(qset, answers):
        if question.kind == "text":
            to_grade += (answers.get(question.id) or {}).get("text") is not None
            continue
        points = float(question.points or 1)
        got = points if _right(question, answers.get(question.id)) else 0.0
        if question.bonus:
            bonus[0] += got
            bonus[1] += points
            continue
        main[0] += got
        main[1] += points
        bucket = topics[question.topic or NO_TOPIC]
        bucket[0] += got
        bucket[1] += points
    return Score(main[0], main[1], {k: (v[0], v[1]) for k, v in sorted(topics.items())}, (bonus[0], bonus[1]),
                 to_grade)


def score_text(qset: QuestionSet, result: Score, replaces: bool = False) -> str:
    """The score as plain text: ``replaces`` when an earlier score of the set
    was posted (a changed answer re-scores), which the first line says."""
    return "\n".join([_score_head(qset, result, replaces)] + [f"- {line}" for line in _topic_lines(result)]
                      + _score_tail(result))


def score_html(qset: QuestionSet, result: Score, replaces: bool = False) -> str:
    """The same as ``score_text``, the topics a real list."""
    from bridge.protocol.render import esc_links

    html = f"<p>{esc_links(_score_head(qset, result, replaces))}</p>"
    topics = _topic_lines(result)
    if topics:
        html += "<ul>" + "".join(f"<li>{esc_links(line)}</li>" for line in topics) + "</ul>"
    return html + "".join(f"<p>{esc_links(line)}</p>" for line in _score_tail(result))


def _score_head(qset: QuestionSet, result: Score, replaces: bool) -> str:
    head = f"Score for \u201c{shown_title(qset.title)}\u201d: {_n(result.points)} of {_n(result.possible)}."
    return head + (" This replaces the earlier score: an answer changed." if replaces else "")


def _topic_lines(result: Score) -> list[str]:
    return [f"{topic}: {_n(got)} of {_n(possible)}" for topic, (got, possible) in result.by_topic.items()]


def _score_tail(result: Score) -> list[str]:
    lines = []
    if result.bonus[1]:
        lines.append(f"Bonus questions: {_n(result.bonus[0])} of {_n(result.bonus[1])}")
    if result.to_grade:
        many = result.to_grade > 1
        lines.append(f"{result.to_grade} written answer{'s' if many else ''} wait{'' if many else 's'} for grading.")
    return lines


def _right(question: Question, record: dict[str, Any] | None) -> bool:
    right = next((o.id for o in question.options or () if o.correct), None)
    return record is not None and right is not None and record.get("choice") == right


def _n(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
