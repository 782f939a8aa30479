"""The readable part of a question.v2 message: ``body`` and ``formatted_body``.

Pure.  Both are rendered from the event's own structured content (``set``,
``question``, ``subject``), never from ``questions.json``, so the numbers a
person reads are exactly the positions in ``question.options`` that replies
and reactions are resolved against.

Everything the set provides is untrusted: in the HTML every such string goes
through ``html.escape(quote=True)`` and nothing from the set ever lands in a
tag or an attribute.  Only tags Element's sanitiser keeps are produced
(``ALLOWED_TAGS``); ``<details>`` is avoided because not every client shows it.

``limit`` caps every set-provided string (in characters, before escaping):
the size guard in ``question_event`` re-renders with smaller limits when an
event would not fit.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bridge.questionset.model import OTHER_ID, UNSURE_ID

ALLOWED_TAGS = frozenset({"h4", "p", "ol", "ul", "li", "blockquote", "strong", "em", "code", "br", "span"})
HTML_FORMAT = "org.matrix.custom.html"

SINGLE_PICK_KINDS = frozenset({"choice", "scale", "confirm", "compare"})
# Keycap reactions 1..10 (PROTOCOL section 3); 10 has its own emoji.
KEYCAPS = tuple(f"{n}\ufe0f\u20e3" for n in range(1, 10)) + ("\U0001f51f",)

# "1.0 s", "1.4s", "12 sec", "0:07", "01:02:03.5": the set's timecodes, shown
# prominently because askwright turns them into "Play from" buttons and here
# the person has to seek by hand.
_TIMECODE = re.compile(r"(?<![\w.:])(?:\d{1,2}:)?\d{1,2}:\d{2}(?:\.\d+)?(?![\w:])|(?<![\w.])\d+(?:\.\d+)?\s?(?:s|sec|secs|seconds?)\b")

_ELLIPSIS = "\u2026"
_DIGEST_SHOWN = 12


def render(
    content: Mapping[str, Any], *, limit: int | None = None, poll: bool = False, background: bool = False
) -> tuple[str, str]:
    """(body, formatted_body) for the question.v2 ``content``.

    ``poll`` says the bridge also posts a native poll for this question, so
    the instructions mention voting in it.  ``background`` says the question
    has a one-pager, which never rides in the event but in its thread.
    """
    return (
        render_body(content, limit=limit, poll=poll, background=background),
        render_html(content, limit=limit, poll=poll, background=background),
    )


# ---------------------------------------------------------------- helpers


def shorten(text: str, limit: int | None) -> str:
    if limit is None or len(text) <= limit:
        return text
    return text[: max(limit - 1, 0)] + _ELLIPSIS


def short_digest(digest: str) -> str:
    """Enough of a digest to recognise it; the full one is in ``subject``."""
    if len(digest) <= _DIGEST_SHOWN + 4:
        return digest
    return digest[:_DIGEST_SHOWN] + _ELLIPSIS


def esc(text: str) -> str:
    """Escape set text for HTML; line breaks stay visible."""
    return html.escape(text, quote=True).replace("\r\n", "\n").replace("\n", "<br>")


def esc_timecodes(text: str) -> str:
    """Escape, with every timecode in ``<strong>`` so it stands out."""
    out: list[str] = []
    pos = 0
    for match in _TIMECODE.finditer(text):
        out.append(esc(text[pos : match.start()]))
        out.append(f"<strong>{esc(match.group(0))}</strong>")
        pos = match.end()
    out.append(esc(text[pos:]))
    return "".join(out)


def _question(content: Mapping[str, Any]) -> Mapping[str, Any]:
    q = content.get("question")
    return q if isinstance(q, Mapping) else {}


def _options(q: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [o for o in q.get("options") or () if isinstance(o, Mapping)]


def _side_names(q: Mapping[str, Any]) -> dict[str, str]:
    """Option id -> side name for a compare question's ``sides``."""
    if q.get("kind") != "compare":
        return {}
    sides = q.get("sides") or {}
    return {v: k for k, v in sides.items() if k != "randomized" and isinstance(v, str)}


def option_display(q: Mapping[str, Any], option: Mapping[str, Any]) -> str:
    """What the person reads for an option.

    On a compare question the options shown in the clip read as their side
    ("Left", "Right") until the pick, as askwright's page does, so the labels
    do not give away which take is which.
    """
    side = _side_names(q).get(str(option.get("id")))
    if side is not None:
        return side[:1].upper() + side[1:]
    return str(option.get("label", option.get("id", "")))


def _number_of(q: Mapping[str, Any]) -> dict[str, int]:
    return {str(o.get("id")): i for i, o in enumerate(_options(q), start=1)}


def _numbered(q: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The options shown as a numbered list.

    A reply to a text question is the answer itself, so a "1" there would be
    read as text, not as "Not sure": its only option (unsure) is offered in
    the instructions instead of being numbered.
    """
    return [] if q.get("kind") == "text" else _options(q)


def _set_options(q: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [o for o in _options(q) if o.get("id") not in (UNSURE_ID, OTHER_ID)]


# ---------------------------------------------------------------- the parts, as data


def _guess_parts(q: Mapping[str, Any]) -> tuple[str, str] | None:
    """(what is guessed, why) in the person's terms, or None."""
    guess = q.get("guess")
    if not isinstance(guess, Mapping):
        return None
    numbers = _number_of(q)
    by_id = {str(o.get("id")): o for o in _options(q)}

    def name(oid: Any) -> str:
        oid = str(oid)
        if oid in by_id:
            return f"{option_display(q, by_id[oid])} ({numbers[oid]})"
        return oid

    if isinstance(guess.get("option"), str):
        what = name(guess["option"])
    elif isinstance(guess.get("options"), list):
        what = ", ".join(name(o) for o in guess["options"])
    elif isinstance(guess.get("order"), list):
        what = " \u2192 ".join(name(o) for o in guess["order"])
    elif isinstance(guess.get("text"), str):
        what = guess["text"]
    else:
        return None
    why = guess.get("why")
    return what, why if isinstance(why, str) else ""


def _media_line(item: Mapping[str, Any]) -> str:
    name = item.get("label") or item.get("name") or item.get("alt") or item.get("type") or "media"
    bits = [str(name)]
    if item.get("type"):
        bits.append(f"({item['type']})")
    if item.get("start") is not None:
        bits.append(f"from {item['start']} s")
    if item.get("caption"):
        bits.append(f"\u2014 {item['caption']}")
    return " ".join(bits)


def _answer_steps(q: Mapping[str, Any], poll: bool) -> list[tuple[str, str | None]]:
    """How to answer: (prose, example to show as code) pairs, per kind."""
    kind = q.get("kind")
    count = len(_options(q))
    n_set = len(_set_options(q))
    steps: list[tuple[str, str | None]] = []
    if kind in SINGLE_PICK_KINDS:
        if poll:
            steps.append(("vote in the poll", None))
        steps.append(("reply to this message with the number of your pick, e.g.", "1"))
        last = min(count, len(KEYCAPS))
        steps.append((f"or react to it with {KEYCAPS[0]}\u2026{KEYCAPS[last - 1]}", None))
    elif kind == "multi":
        example = "1, 3" if n_set >= 3 else "1, 2"
        steps.append(("reply to this message with the numbers of every option you pick, separated by commas, e.g.", example))
    elif kind == "rank":
        example = ", ".join(str(i) for i in range(min(n_set, 3), 0, -1))
        steps.append((f"reply to this message with all {n_set} numbers in your order, first = best, separated by commas, e.g.", example))
    elif kind == "text":
        steps.append(("reply to this message with your answer", None))
    if any(o.get("id") == OTHER_ID for o in _options(q)):
        steps.append(("for something else reply", "other: <your text>"))
    steps.append(("if you are not sure reply", UNSURE_ID))
    return steps


def _quiz_line(q: Mapping[str, Any]) -> str | None:
    """A quiz question's topic and points, as the review will score it."""
    bits: list[str] = []
    if q.get("topic"):
        bits.append(f"Topic: {q['topic']}")
    if q.get("points") is not None:
        points = q["points"]
        bits.append(f"{points} point{'' if str(points) == '1' else 's'}" + (" (bonus)" if q.get("bonus") else ""))
    return " · ".join(bits) or None


def _background_note(q: Mapping[str, Any], has_one_pager: bool) -> str | None:
    if q.get("one_pager_ref") or has_one_pager:
        return "The background for this question is posted in this message's thread."
    return None


# ---------------------------------------------------------------- plain body


def render_body(
    content: Mapping[str, Any],
    *,
    limit: int | None = None,
    poll: bool = False,
    background: bool = False,
    bare: bool = False,
) -> str:
    """The plain-text fallback.

    ``bare`` leaves out everything but the title, the question, the options
    and the instructions: the last resort of the size guard.
    """
    q = _question(content)
    cut: Callable[[Any], str] = lambda s: shorten(str(s), limit)  # noqa: E731
    lines: list[str] = []
    set_info = content.get("set")
    if isinstance(set_info, Mapping) and set_info.get("title") and not bare:
        lines.append(f"[{cut(set_info['title'])}]")
    lines.append(cut(q.get("title", "")))
    lines.append(cut(q.get("question", "")))
    if not bare:
        lines.extend(_body_context(content, q, cut, background))
    if _numbered(q):
        lines.append("")
    for i, opt in enumerate(_numbered(q), start=1):
        line = f"{i}. {cut(option_display(q, opt))}"
        if opt.get("consequence") and not bare:
            line += f" \u2014 {cut(opt['consequence'])}"
        lines.append(line)
    if not bare:
        lines.extend(_body_guess(q, cut))
    lines.append("")
    lines.append("To answer: " + "; ".join(p + (f" {ex}" if ex else "") for p, ex in _answer_steps(q, poll)) + ".")
    return "\n".join(lines)


def _body_context(
    content: Mapping[str, Any], q: Mapping[str, Any], cut: Callable[[Any], str], background: bool
) -> list[str]:
    lines: list[str] = []
    subject = content.get("subject")
    if isinstance(subject, Mapping):
        lines.append(f"Approving: {cut(subject.get('id', ''))} (digest {short_digest(str(subject.get('digest', '')))})")
    quiz = _quiz_line(q)
    if quiz:
        lines.append(cut(quiz))
    if q.get("why"):
        lines.append(f"Why I ask: {cut(q['why'])}")
    if q.get("hint"):
        lines.append(f"Hint: {cut(q['hint'])}")
    look_for = [s for s in q.get("look_for") or () if isinstance(s, str)]
    if look_for:
        lines.append("What to look for:")
        lines.extend(f"- {cut(item)}" for item in look_for)
    media = [m for m in q.get("media") or () if isinstance(m, Mapping)]
    if media:
        lines.append("Media (sent with this question):")
        lines.extend(f"- {cut(_media_line(m))}" for m in media)
    show_if = q.get("show_if")
    if isinstance(show_if, Mapping):
        lines.append(f"Asked because of your answer to {cut(show_if.get('question', ''))}.")
    note = _background_note(q, background)
    if note:
        lines.append(note)
    return lines


def _body_guess(q: Mapping[str, Any], cut: Callable[[Any], str]) -> list[str]:
    parts = _guess_parts(q)
    if parts is None:
        return []
    if (q.get("guess") or {}).get("confidence") == "high":
        what, why = parts
        return ["", f"My guess: {cut(what)}" + (f" \u2014 {cut(why)}" if why else "")]
    return ["", "My guess: (guess hidden; it is in the formatted message behind a spoiler)"]


# ---------------------------------------------------------------- HTML


def render_html(
    content: Mapping[str, Any], *, limit: int | None = None, poll: bool = False, background: bool = False
) -> str:
    q = _question(content)

    def cut(s: Any) -> str:
        return esc(shorten(str(s), limit))

    def cut_tc(s: Any) -> str:
        return esc_timecodes(shorten(str(s), limit))

    parts: list[str] = []
    set_info = content.get("set")
    if isinstance(set_info, Mapping) and set_info.get("title"):
        parts.append(f"<p><em>{cut(set_info['title'])}</em></p>")
    parts.append(f"<h4>{cut(q.get('title', ''))}</h4>")
    parts.append(f"<p><strong>{cut_tc(q.get('question', ''))}</strong></p>")
    parts.extend(_html_context(content, q, cut, cut_tc, background))
    parts.append(_html_options(q, cut))
    parts.extend(_html_guess(q, cut))
    parts.append(_html_steps(q, poll))
    return "".join(parts)


def _html_context(
    content: Mapping[str, Any],
    q: Mapping[str, Any],
    cut: Callable[[Any], str],
    cut_tc: Callable[[Any], str],
    background: bool,
) -> list[str]:
    parts: list[str] = []
    subject = content.get("subject")
    if isinstance(subject, Mapping):
        digest = esc(short_digest(str(subject.get("digest", ""))))
        parts.append(f"<blockquote>Approving <code>{cut(subject.get('id', ''))}</code> (digest <code>{digest}</code>)</blockquote>")
    quiz = _quiz_line(q)
    if quiz:
        parts.append(f"<p><em>{cut(quiz)}</em></p>")
    if q.get("why"):
        parts.append(f"<p><em>Why I ask:</em> {cut_tc(q['why'])}</p>")
    if q.get("hint"):
        parts.append(f"<p><em>Hint:</em> {cut_tc(q['hint'])}</p>")
    look_for = [s for s in q.get("look_for") or () if isinstance(s, str)]
    if look_for:
        items = "".join(f"<li>{cut_tc(item)}</li>" for item in look_for)
        parts.append(f"<p><em>What to look for:</em></p><ul>{items}</ul>")
    media = [m for m in q.get("media") or () if isinstance(m, Mapping)]
    if media:
        items = "".join(f"<li>{cut_tc(_media_line(m))}</li>" for m in media)
        parts.append(f"<p><em>Media (sent with this question):</em></p><ul>{items}</ul>")
    show_if = q.get("show_if")
    if isinstance(show_if, Mapping):
        parts.append(f"<p>Asked because of your answer to <code>{cut(show_if.get('question', ''))}</code>.</p>")
    note = _background_note(q, background)
    if note:
        parts.append(f"<p><em>{esc(note)}</em></p>")
    return parts


def _html_options(q: Mapping[str, Any], cut: Callable[[Any], str]) -> str:
    items: list[str] = []
    for opt in _numbered(q):
        item = cut(option_display(q, opt))
        if opt.get("consequence"):
            item += f" \u2014 <em>{cut(opt['consequence'])}</em>"
        items.append(f"<li>{item}</li>")
    return f"<ol>{''.join(items)}</ol>" if items else ""


def _html_guess(q: Mapping[str, Any], cut: Callable[[Any], str]) -> list[str]:
    parts = _guess_parts(q)
    if parts is None:
        return []
    what, why = parts
    shown = f"<strong>{cut(what)}</strong>" + (f" \u2014 {cut(why)}" if why else "")
    if (q.get("guess") or {}).get("confidence") == "high":
        return [f"<p>My guess: {shown}</p>"]
    # A low-confidence guess must not anchor the person: hidden until clicked.
    return [f"<p>My guess (click to show): <span data-mx-spoiler>{shown}</span></p>"]


def _html_steps(q: Mapping[str, Any], poll: bool) -> str:
    steps: Sequence[tuple[str, str | None]] = _answer_steps(q, poll)
    text = "; ".join(esc(p) + (f" <code>{esc(ex)}</code>" if ex else "") for p, ex in steps)
    return f"<p><em>To answer:</em> {text}.</p>"
