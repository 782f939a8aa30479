"""What a question says: its title, the question itself, why and hint, and what to look for."""

from __future__ import annotations

import re

from bridge.questionset.lint.access import blank, list_at, quote, str_at
from bridge.questionset.lint.context import Context, QuestionView
from bridge.questionset.shown import one_line_problem

TITLE_WARN_LENGTH = 80
MAX_SENTENCES = 3


def check_title(ctx: Context, q: QuestionView) -> None:
    title = str_at(q.raw, "title")
    if title is None:
        return
    if blank(title):
        ctx.error(f"{q.where}.title", "give the question a title")
    elif problem := one_line_problem(title):
        ctx.error(f"{q.where}.title", f"the title {problem}")
    elif len(title.strip()) > TITLE_WARN_LENGTH:
        ctx.warning(f"{q.where}.title", f"the title is {len(title.strip())} characters long; keep it to {TITLE_WARN_LENGTH} at most")


QUESTION_MARKS = ("?", "\u061f", "\uff1f", "\u037e")


def check_question_text(ctx: Context, q: QuestionView) -> None:
    text = str_at(q.raw, "question")
    if text is None:
        return
    # Trailing spaces are forgiven: "Which one? " still ends in ?.  The
    # question mark is the language's own: Arabic's ؟, the full-width ？ of
    # Chinese and Japanese, the Greek ; (U+037E) ask as ? does.
    if ctx.study:
        if not any(mark in text for mark in QUESTION_MARKS):
            ctx.error(f"{q.where}.question", "a quiz question must contain a ? (it may quote its sentence after the ask)")
    elif not text.rstrip().endswith(QUESTION_MARKS):
        ctx.error(f"{q.where}.question", "end the question with ?: it must ask something")


def sentence_count(text: str) -> int:
    """Sentences end in . ! or ? followed by a space or the end ("1.0 s" is not two)."""
    parts = re.split(r"(?<=[.!?])\s+", text.strip())
    return sum(1 for part in parts if re.search(r"\w", part))


def check_why_and_hint(ctx: Context, q: QuestionView) -> None:
    why = str_at(q.raw, "why")
    if not ctx.study and blank(why):  # a why of the wrong type is the model's finding at the same place
        ctx.error(f"{q.where}.why", "say why you are asking: what the answer changes")
    for name in ("why", "hint"):
        value = str_at(q.raw, name)
        if value is not None and (n := sentence_count(value)) > MAX_SENTENCES:
            ctx.warning(f"{q.where}.{name}", f"{name} has {n} sentences; cut it to {MAX_SENTENCES} at most")


# Words that name no particular thing to look at: an item made only of them
# (ignoring filler words) is as vague as "quality" or "overall".
_VAGUE_WORDS = frozenset(
    "quality overall general generally everything anything all look looks feel feels vibe vibes good bad "
    "better best nice fine ok okay style aesthetic aesthetics appearance impression polish polished "
    "things stuff details detail whole".split()
)
_FILLER_WORDS = frozenset("the a an of and or in on is it its how does do what this that to for at".split())


def is_vague(item: str) -> bool:
    words = re.findall(r"[a-z0-9']+", item.lower())
    content = [w for w in words if w not in _FILLER_WORDS]
    return not content or all(w in _VAGUE_WORDS for w in content)


def _has_media(q: QuestionView) -> bool:
    return bool(list_at(q.raw, "media"))


def check_look_for(ctx: Context, q: QuestionView) -> None:
    items = list_at(q.raw, "look_for")
    needed = not ctx.study and (q.kind == "compare" or _has_media(q))
    # An empty list is as good as none: there is still nothing to look for.
    if needed and not items and q.raw.get("look_for") in (None, []):
        reason = "a compare question" if q.kind == "compare" else "a question with media"
        ctx.error(f"{q.where}.look_for", f"{reason} needs look_for: list what to watch or listen for")
    for i, item in enumerate(items or []):
        if not isinstance(item, str):
            continue
        if len(item.split()) < 3:
            ctx.warning(f"{q.where}.look_for[{i}]", f"{quote(item)} is too short; say in a few words what exactly to look for")
        elif is_vague(item):
            ctx.warning(f"{q.where}.look_for[{i}]", f"{quote(item)} is vague; name the moment or detail to look at")
