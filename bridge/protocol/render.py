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
from dataclasses import dataclass
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from bridge.questionset.builtin import OTHER_ID, UNSURE_ID
from bridge.questionset.shown import visible
from bridge.protocol.graphemes import shorten

ALLOWED_TAGS = frozenset({"hr", "h4", "p", "ol", "ul", "li", "blockquote", "strong", "em", "code", "br", "span"})
# Element's sanitiser keeps these too; only the background (``one_pager``) uses them.
TABLE_TAGS = frozenset({"table", "thead", "tbody", "tr", "th", "td"})
HTML_FORMAT = "org.matrix.custom.html"

# Kinds whose pick is one option id (`option_id` in the answer).
SINGLE_PICK_KINDS = frozenset({"choice", "scale", "confirm", "compare"})
POLL_ANSWERS_MAX = 20  # MSC3381: a poll offers at most 20 answers
# Answered with a list of picks, so a built-in (alone by nature) is set apart.
LIST_KINDS = frozenset({"multi", "rank"})
# The files are posted in the question's thread, not attached to the message.
_MEDIA_HEADING = "Media (in this message's thread)"
# What the title line says a message is: Element groups one sender's messages,
# and a question's title read as one more paragraph of the question above it.
# Neither its position nor the set's size: a posted question is never edited
# when the set grows, so "3 of 8" would turn untrue in the messages already sent.
QUESTION_LABEL = "Question: "
# Keycap reactions 1..10 (PROTOCOL section 3); 10 has its own emoji.
KEYCAPS = tuple(f"{n}\ufe0f\u20e3" for n in range(1, 10)) + ("\U0001f51f",)
# Each keycap's name in words, beside it where a font may draw a black box.
KEYCAP_WORDS = ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")

def keycap_named(number: int) -> str:
    """``1\ufe0f\u20e3 (keycap one)``: the emoji, and what it is in words."""
    return f"{KEYCAPS[number - 1]} (keycap {KEYCAP_WORDS[number - 1]})"


# "1.0 s", "1.4s", "12 sec", "0:07", "01:02:03.5": the set's timecodes, shown
# prominently because askwright turns them into "Play from" buttons and here
# the person has to seek by hand.
_TIMECODE = re.compile(r"(?<![\w.:])(?:\d{1,2}:)?\d{1,2}:\d{2}(?:\.\d+)?(?![\w:])|(?<![\w.])\d+(?:\.\d+)?\s?(?:s|sec|secs|seconds?)\b")

# What Element's linkifier turns into a link (a pill for a Matrix id): a
# Matrix user, room, alias or event id with its server, a URL, www.…, an
# e-mail address, a bare domain with a common TLD.  Set text that looks like
# one is shown as code, so a label reads as what the set wrote rather than as
# a link to somewhere (or someone) else.  The linkifier knows every TLD; the
# ones here are the common ones and those that are also file extensions
# agents write ("setup.py", "README.md", "clip.mov" were links to http://setup.py).
_TLDS = ("com|org|net|io|dev|app|ai|co|me|info|edu|gov|de|uk|eu|fr|nl|py|md|rs|sh|pl|so|zip|mov|tv|ly|cc|us|ca|"
         "it|es|ch|se|at|be|jp|cn|ru|br|au|in|to|gg|is|ws|im|fm|ml|xyz|site|online|tech|cloud|page|link|run")
_LINKLIKE = re.compile(
    r"[@#!+$][^\s:@#!]+:(?:(?:[A-Za-z0-9\-]+\.)+[A-Za-z0-9\-]+|localhost|\[[0-9A-Fa-f:.]+\])(?::\d+)?"
    # room version 12 ids (and event ids) have no server part, only a long hash
    r"|(?<![\w.])[!$][A-Za-z0-9_\-+/=]{20,}"
    r"|\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s<>\"\u201c\u201d\u2018\u2019]*[^\s<>\"'\u201c\u201d\u2018\u2019.,;:!?)\]]"
    r"|\bwww\.[^\s<>\"\u201c\u201d\u2018\u2019]*[^\s<>\"'\u201c\u201d\u2018\u2019.,;:!?)\]]"
    r"|\b[\w.+\-]+@[\w\-]+(?:\.[\w\-]+)+"
    rf"|\b(?:[A-Za-z0-9](?:[A-Za-z0-9\-]*[A-Za-z0-9])?\.)+(?:{_TLDS})\b(?:/[^\s<>\"]*)?"
)

_ELLIPSIS = "\u2026"
# Hex digits of a digest shown: enough to compare by eye with the one the
# agent printed; the full digest is in ``subject``.
_DIGEST_SHOWN = 16
_DIGEST_PREFIX = "sha256:"


def render(
    content: Mapping[str, Any], *, limit: int | None = None, poll: bool = False, background: bool = False,
    reactions: bool = True,
) -> tuple[str, str]:
    """(body, formatted_body) for the question.v2 ``content``.

    ``poll`` says the bridge also posts a native poll for this question, so
    the instructions mention voting in it.  ``background`` says the question
    has a one-pager, which never rides in the event but in its thread.
    ``reactions`` False: keycap reactions can't answer in the room (clients
    send them unencrypted, and an encrypted room's trust refuses what names
    no session), so the instructions do not offer them.
    """
    return (
        render_body(content, limit=limit, poll=poll, background=background, reactions=reactions),
        render_html(content, limit=limit, poll=poll, background=background, reactions=reactions),
    )


# ---------------------------------------------------------------- helpers


# Said under a question text too long for its message: the poster sends the
# whole text into the question's thread (``media.post_whole_question``).
WHOLE_IN_THREAD = "(Shortened to fit one message: the whole question follows in this message's thread.)"


def _cut_short(q: Mapping[str, Any], limit: int | None) -> bool:
    return limit is not None and len(str(q.get("question", ""))) > limit


# A question's title (or an option's label) as a word back quotes it: a set
# may give one of 10,000 characters (lint only warns), and every word back
# on it was past the homeserver's 65,536 bytes, dropped, the person told
# nothing.
TITLE_SHOWN = 200
REASON_SHOWN = 500  # a withdrawal's reason, in the closing words


def shown_title(title: Any) -> str:
    """An agent's words inside the bridge's own sentence: cut short, and
    without the invisible characters that turn what follows around (a
    U+202E in a subject id showed the digest after it reversed)."""
    return shown_words(title, TITLE_SHOWN)


def shown_words(text: Any, limit: int) -> str:
    return shorten(visible(str(text)), limit)


def short_digest(digest: str) -> str:
    """Enough of a digest to recognise it; the full one is in ``subject``.

    The ``sha256:`` prefix is dropped: it carries no information a person
    compares, and keeping it left only five hex digits on show.
    """
    if digest[: len(_DIGEST_PREFIX)].lower() == _DIGEST_PREFIX:
        digest = digest[len(_DIGEST_PREFIX) :]
    if len(digest) <= _DIGEST_SHOWN + 4:
        return digest
    return digest[:_DIGEST_SHOWN] + _ELLIPSIS


def esc(text: str) -> str:
    """Escape set text for HTML; line breaks stay visible."""
    return html.escape(text, quote=True).replace("\r\n", "\n").replace("\n", "<br>")


def _esc_marked(text: str, pattern: re.Pattern[str]) -> str:
    out: list[str] = []
    pos = 0
    for match in pattern.finditer(text):
        out.append(esc(text[pos : match.start()]))
        out.append(f"<code>{esc(match.group(0))}</code>")
        pos = match.end()
    out.append(esc(text[pos:]))
    return "".join(out)


_LINK_OR_TIME = re.compile(f"{_LINKLIKE.pattern}|{_TIMECODE.pattern}")


def esc_links(text: str) -> str:
    """Escape, with every id-, URL- or domain-like run in ``<code>``.

    Element does not linkify inside ``<code>``, so ``@alice:example.org`` in a
    label stays the set's words instead of becoming a pill or a link.
    """
    return _esc_marked(text, _LINKLIKE)


def esc_people(text: str, people: Sequence[str]) -> str:
    """Escape like ``esc_links``, with each of ``people`` (user ids the bridge
    itself names: voters, deciders, answerers) as a link Element shows as a
    pill.  A link is no mention: who is pinged is the event's ``m.mentions``."""
    names = sorted({p for p in people if p}, key=len, reverse=True)
    if not names:
        return esc_links(text)
    out: list[str] = []
    pos = 0
    for match in re.finditer("|".join(re.escape(n) for n in names), text):
        out.append(esc_links(text[pos : match.start()]))
        who = html.escape(match.group(0), quote=True)
        out.append(f'<a href="https://matrix.to/#/{who}">{who}</a>')
        pos = match.end()
    out.append(esc_links(text[pos:]))
    return "".join(out)


def esc_timecodes(text: str) -> str:
    """Escape, with every timecode (and link-like run) in ``<code>``.

    Inside the bold question a bold timecode did not stand out; code does, in
    bold text and plain alike.
    """
    return _esc_marked(text, _LINK_OR_TIME)


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


def why_in_brackets(why: str) -> str:
    """A close's why as it reads inside brackets: "withdrawn (Dropped from
    2.4)" as "withdrawn: Dropped from 2.4", not brackets within brackets.
    (Only a withdrawal's reason: other whys keep their words as they are.)"""
    if why.startswith("withdrawn (") and why.endswith(")"):
        return f"withdrawn: {why[len('withdrawn ('):-1]}"
    return why


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
    """The options shown as the numbered list.

    A reply to a text question is the answer itself, so a "1" there would be
    read as text, not as "Not sure": its only option (unsure) is offered in
    the instructions instead of being numbered.  On multi and rank the
    built-ins can't be combined with picks, so they are set apart under the
    list (``_builtins_apart``) rather than read as one more item to pick or
    to rank; their numbers stay those of the event's order.
    """
    if q.get("kind") == "text":
        return []
    if q.get("kind") in LIST_KINDS:
        return _set_options(q)
    return _options(q)


def _set_options(q: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [o for o in _options(q) if o.get("id") not in (UNSURE_ID, OTHER_ID)]


def _builtins_apart(q: Mapping[str, Any]) -> list[tuple[int, str, str]]:
    """(number, what to type, label) of each built-in shown apart (multi/rank)."""
    if q.get("kind") not in LIST_KINDS:
        return []
    typed = {UNSURE_ID: UNSURE_ID, OTHER_ID: "other: <your text>"}
    return [
        (number, typed[str(o.get("id"))], str(o.get("label", o.get("id"))))
        for number, o in enumerate(_options(q), start=1)
        if o.get("id") in typed
    ]


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


_BARE_SECONDS = re.compile(r"^\d+(?:\.\d+)?$")


def start_words(start: Any) -> str:
    """Where a media file starts, as the set wrote it, in seconds said once:
    a bare number (1.5, "2") gets its unit, while "1.25 s", "12 sec" or
    "0:07" carry their own (it read "from 0:07 s").  Shared by the question's
    message and the caption of the file posted in its thread."""
    text = str(start).strip()
    return f"{text} s" if _BARE_SECONDS.match(text) else text


def _media_line(item: Mapping[str, Any]) -> str:
    name = item.get("label") or item.get("name") or item.get("alt") or item.get("type") or "media"
    bits = [str(name)]
    if item.get("type"):
        bits.append(f"({item['type']})")
    if item.get("start") is not None:
        bits.append(f"from {start_words(item['start'])}")
    if item.get("caption"):
        bits.append(f"\u2014 {item['caption']}")
    return " ".join(bits)


# Words of the "To answer" line that say the message offers a way: the help
# after an unreadable reply offers only what the message did (keycaps are
# refused in an encrypted room that trusts cross-signed devices only).
POLL_STEP = "vote in the poll"
KEYCAP_STEP = "search \u201ckeycap\u201d in the reaction picker"


def needs_words(option: Mapping[str, Any]) -> bool:
    """An option only a reply can give ("other"): a vote or a keycap carries
    no words, so offered there it could only ever be refused."""
    return option.get("input") == "required"


def poll_answers(options: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The options a poll offers: those a vote alone can answer."""
    return [o for o in options if not needs_words(o)]


def gets_poll(kind: Any, options: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a question of ``kind`` offering ``options`` (built-ins
    included) has a poll: polls are single-choice in Element, of 2 to 20
    answers.  The poll is posted, and the message says to vote in it, by this."""
    return kind in SINGLE_PICK_KINDS and 2 <= len(poll_answers(options)) <= POLL_ANSWERS_MAX


def _answer_steps(q: Mapping[str, Any], poll: bool, reactions: bool = True) -> list[tuple[str, str | None]]:
    """How to answer: (prose, example to show as code) pairs, per kind;
    ``poll``: one is posted beside it, when the question can have one."""
    kind = q.get("kind")
    n_set = len(_set_options(q))
    steps: list[tuple[str, str | None]] = []
    if kind in SINGLE_PICK_KINDS:
        if poll and gets_poll(kind, _options(q)):
            steps.append((POLL_STEP, None))
        steps.append(("reply to this message with the number of your pick, e.g.", "1"))
        # The keycaps go up to the last option that needs no words ("unsure"),
        # by its place in the list: "other" is left to its reply.
        last = min(max((n for n, o in enumerate(_options(q), start=1) if not needs_words(o)), default=0),
                   len(KEYCAPS))
        # Some systems draw keycaps as black boxes with Element's bundled font:
        # each keycap's name beside it still reads, and says where to find it.
        if reactions:
            steps.append((
                f"or react to it with the keycap emoji {keycap_named(1)} \u2026 {keycap_named(last)} "
                f"for that number ({KEYCAP_STEP})",
                None,
            ))
    elif kind == "multi":
        example = "1, 3" if n_set >= 3 else "1, 2"
        steps.append(("reply to this message with the numbers of every option you pick, separated by commas, e.g.", example))
    elif kind == "rank":
        example = ", ".join(str(i) for i in range(n_set, 0, -1))  # (every number: a shorter one is refused)
        steps.append((f"reply to this message with all {n_set} numbers in your order, first = best, separated by commas, e.g.", example))
    elif kind == "text":
        steps.append(("reply to this message with your answer", None))
    if kind in LIST_KINDS:
        # The built-ins have their own line under the list.
        return steps
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


def _show_if_parts(q: Mapping[str, Any]) -> tuple[str, list[str]] | None:
    """(the earlier question's title, the labels of the answers that need this one).

    The question is posted up front, before that answer exists, so the words
    say when it is needed rather than claim it was asked because of it.  The
    title and labels ride in ``show_if`` (the builder looks them up in the
    set); an event without them falls back to the ids.
    """
    show_if = q.get("show_if")
    if not isinstance(show_if, Mapping):
        return None
    title = show_if.get("title") if isinstance(show_if.get("title"), str) else None
    ids = [str(o) for o in show_if.get("option") or ()]
    labels = show_if.get("labels")
    if not (isinstance(labels, list) and len(labels) == len(ids) and all(isinstance(x, str) for x in labels)):
        labels = ids
    return title or str(show_if.get("question", "")), list(labels)


def _either(items: Sequence[str]) -> str:
    """"“a”", "“a” or “b”", "“a”, “b” or “c”" (items already quoted/escaped)."""
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " or " + items[-1]


# ---------------------------------------------------------------- plain body


def render_body(
    content: Mapping[str, Any],
    *,
    limit: int | None = None,
    poll: bool = False,
    background: bool = False,
    bare: bool = False,
    now_ms: int | None = None,
    reactions: bool = True,
) -> str:
    """The plain-text fallback.

    The question's title is the first line, after ``QUESTION_LABEL``:
    previews, reply quotes and the thread list show the start of the
    message, and the set title there cut off what is being asked; the label
    says where one question starts where nothing else marks it.  ``bare`` leaves out everything but the title,
    the question, the options and the instructions: the last resort of the
    size guard.
    """
    q = _question(content)
    cut: Callable[[Any], str] = lambda s: shorten(str(s), limit)  # noqa: E731
    lines: list[str] = [QUESTION_LABEL + cut(q.get("title", ""))]
    set_info = content.get("set")
    if isinstance(set_info, Mapping) and set_info.get("title") and not bare:
        lines.append(f"[{cut(set_info['title'])}]")
    lines.append(cut(q.get("question", "")))
    if _cut_short(q, limit):
        lines.append(WHOLE_IN_THREAD)
    # Who may answer and by when: the rules of the answer, so kept even in the bare form.
    lines.extend(approval_lines(q, now_ms))
    if not bare:
        lines.extend(_body_context(content, q, cut, background))
    if _numbered(q):
        lines.append("")
    for i, opt in enumerate(_numbered(q), start=1):
        line = f"{i}. {cut(option_display(q, opt))}"
        if opt.get("consequence") and not bare:
            line += f" \u2014 {cut(opt['consequence'])}"
        lines.append(line)
    apart = _builtins_apart(q)
    if apart:
        lines.append("")
        lines.append(
            "Or, on its own instead of picks: reply "
            + " or ".join(f"{typed} ({number} \u00b7 {cut(label)})" for number, typed, label in apart)
            + "."
        )
    if not bare:
        lines.extend(_body_guess(q, cut))
    lines.append("")
    lines.append("To answer: " + "; ".join(p + (f" {ex}" if ex else "")
                                           for p, ex in _answer_steps(q, poll, reactions)) + ".")
    return "\n".join(lines)


def approval_lines(q: Mapping[str, Any], now_ms: int | None) -> list[str]:
    """The deadline, who may answer, how many must agree, who is brought in later (PROTOCOL 2a)."""
    from bridge.protocol.deadline import deadline_words, event_time_ms, when_words

    lines: list[str] = []
    expires = event_time_ms(q.get("expires"))
    if expires is not None:
        lines.append(deadline_words(expires, now_ms if now_ms is not None else expires) + ".")
    answerers = [a for a in q.get("answerers") or () if isinstance(a, str)]
    if answerers:
        lines.append(f"Who may answer: {', '.join(answerers)}.")
    quorum = q.get("quorum")
    if isinstance(quorum, Mapping) and isinstance(quorum.get("required"), int):
        need = quorum["required"]
        words = f"Decided when {need} {'person picks' if need == 1 else 'people pick'} the same option"
        labels = {o.get("id"): option_display(q, o) for o in _options(q)}
        vetoes = [f"\u201c{labels.get(v, v)}\u201d" for v in quorum.get("veto") or () if isinstance(v, str)]
        if vetoes:
            words += f"; {_either(vetoes)} from anyone decides at once"
        lines.append(words + ".")
    escalate = q.get("escalate")
    if isinstance(escalate, Mapping):
        after = event_time_ms(escalate.get("after"))
        to = [t for t in escalate.get("to") or () if isinstance(t, str)]
        if after is not None and to:
            lines.append(f"Undecided by {when_words(after, now_ms if now_ms is not None else after)}: "
                         f"{', '.join(to)} will be asked too.")
    return lines


def approval_line_html(line: str, q: Mapping[str, Any]) -> str:
    """An approval line as HTML: the people it names (answerers, those
    brought in) as pills, and a veto's label that looks like a link or an
    id as code, as every other text of the set is shown."""
    escalate = q.get("escalate") if isinstance(q.get("escalate"), Mapping) else {}
    people = [p for p in (*(q.get("answerers") or ()), *(escalate.get("to") or ())) if isinstance(p, str)]
    return esc_people(line, people)


@dataclass(frozen=True)
class _ShownLine:
    """An approval line of a posted message that time makes stale."""

    text: str  # the line as the message shows it
    when: str  # its time as shown there (with its date when posted another day)
    at_ms: int  # that time
    to: tuple[str, ...] = ()  # an escalation's people; empty: the deadline

    def asked(self) -> str:
        return f"Undecided by {self.when}: {', '.join(self.to)} {'was' if len(self.to) == 1 else 'were'} asked too."


def _shown_approval_lines(q: Mapping[str, Any], shown: str) -> list[_ShownLine]:
    """The deadline and escalation lines of ``shown`` (a message's body), as
    ``approval_lines`` wrote them at posting."""
    from bridge.protocol.deadline import clock_words, event_time_ms

    def lines(head: str, at_ms: int, tail: str) -> Iterator[tuple[str, str]]:
        # A time as ``when_words`` shows it, its date there when posted another day.
        when = rf"((?:[^,\n]+, )?{re.escape(clock_words(at_ms))})"
        for text in shown.split("\n"):
            if found := re.fullmatch(head + when + tail, text):
                yield text, found.group(1)

    out: list[_ShownLine] = []
    expires = event_time_ms(q.get("expires"))
    if expires is not None:
        # ", in 2 hours": the time left, which messages posted before said (and settle or reopen now).
        out += [_ShownLine(text, when, expires) for text, when
                in lines("Answer by ", expires, r"(?:, in [^\n]+| \(the deadline has passed\))?\.")]
    escalate = q.get("escalate")
    if isinstance(escalate, Mapping):
        after = event_time_ms(escalate.get("after"))
        to = tuple(t for t in escalate.get("to") or () if isinstance(t, str))
        if after is not None and to:
            tail = f": {re.escape(', '.join(to))} will be asked too\\."
            out += [_ShownLine(text, when, after, to) for text, when in lines("Undecided by ", after, tail)]
    return out


def settled_lines(q: Mapping[str, Any], at_ms: int | None, shown: str) -> list[tuple[str, str | None]]:
    """(line as shown, what it becomes or None to drop it) for a question closed
    at ``at_ms``, the approval lines of ``shown`` (its body) once closed.

    The deadline keeps its time (and loses the "in 2 hours" a message posted
    before said), and says whether it passed or the question closed first;
    the escalation says its people were asked if that time came, and goes
    if it did not (it is no longer to come)."""
    out: list[tuple[str, str | None]] = []
    for line in _shown_approval_lines(q, shown):
        if not line.to:
            state = "" if at_ms is None else " (passed)" if at_ms >= line.at_ms else " (closed before it)"
            out.append((line.text, f"Deadline: {line.when}{state}."))
        else:
            out.append((line.text, line.asked() if at_ms is not None and at_ms >= line.at_ms else None))
    return out


def reopened_lines(q: Mapping[str, Any], at_ms: int, shown: str) -> list[tuple[str, str]]:
    """(line as shown, what it says now) for a question open again at
    ``at_ms`` (its decision undone): the deadline as a time, said passed if it
    has (a message posted before said the time left from its posting, "in 2
    hours" with 15 minutes left), and the escalation said as done once its
    time came (held back by the decision, it is sent at the undo)."""
    from bridge.protocol.deadline import deadline_words

    out: list[tuple[str, str]] = []
    for line in _shown_approval_lines(q, shown):
        if not line.to:
            out.append((line.text, deadline_words(line.at_ms, at_ms) + "."))
        elif at_ms >= line.at_ms:
            out.append((line.text, line.asked()))
    return out


def _body_context(
    content: Mapping[str, Any], q: Mapping[str, Any], cut: Callable[[Any], str], background: bool
) -> list[str]:
    lines: list[str] = []
    subject = content.get("subject")
    if isinstance(subject, Mapping):
        lines.append(f"Approving: {cut(visible(str(subject.get('id', ''))))} "
                     f"(digest {short_digest(str(subject.get('digest', '')))})")
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
        lines.append(f"{_MEDIA_HEADING}:")
        lines.extend(f"- {cut(_media_line(m))}" for m in media)
    show_if = _show_if_parts(q)
    if show_if is not None:
        title, labels = show_if
        lines.append(f"Only needed if your answer to \u201c{cut(title)}\u201d is {_either([f'“{cut(x)}”' for x in labels])}.")
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
    content: Mapping[str, Any], *, limit: int | None = None, poll: bool = False, background: bool = False,
    now_ms: int | None = None, reactions: bool = True,
) -> str:
    """The formatted message: one block element per line.

    The newlines between blocks are what Element's own composer sends too;
    they keep the previews that flatten the HTML to text from running the
    title into the next line ("Release 2.4 decisionsDatabase migr…").
    The rule and the labelled title open every question, so it stands apart
    when Element groups it under the sender's message before.
    """
    q = _question(content)

    def cut(s: Any) -> str:
        # Every set-provided string: escaped, timecodes and link-like runs as code.
        return esc_timecodes(shorten(str(s), limit))

    parts: list[str] = ["<hr>", f"<h4>{esc(QUESTION_LABEL)}{cut(q.get('title', ''))}</h4>"]
    set_info = content.get("set")
    if isinstance(set_info, Mapping) and set_info.get("title"):
        parts.append(f"<p><em>{cut(set_info['title'])}</em></p>")
    parts.append(f"<p><strong>{cut(q.get('question', ''))}</strong></p>")
    if _cut_short(q, limit):
        parts.append(f"<p><em>{esc(WHOLE_IN_THREAD)}</em></p>")
    lines = approval_lines(q, now_ms)
    if lines:
        parts.append("<p>" + "<br>\n".join(f"<em>{approval_line_html(line, q)}</em>" for line in lines) + "</p>")
    parts.extend(_html_context(content, q, cut, background))
    options = _html_options(q, cut)
    if options:
        parts.append(options)
    parts.extend(_html_builtins(q, cut))
    parts.extend(_html_guess(q, cut))
    parts.append(_html_steps(q, poll, reactions))
    return "\n".join(parts)


def _html_context(
    content: Mapping[str, Any],
    q: Mapping[str, Any],
    cut: Callable[[Any], str],
    background: bool,
) -> list[str]:
    parts: list[str] = []
    subject = content.get("subject")
    if isinstance(subject, Mapping):
        digest = esc(short_digest(str(subject.get("digest", ""))))
        # A plain bold line: a blockquote reads as a quote of someone else, and greys it out.
        parts.append(
            f"<p><strong>Approving <code>{esc(visible(str(subject.get('id', ''))))}</code> "
            f"(digest <code>{digest}</code>)</strong></p>"
        )
    quiz = _quiz_line(q)
    if quiz:
        parts.append(f"<p><em>{cut(quiz)}</em></p>")
    if q.get("why"):
        parts.append(f"<p><em>Why I ask:</em> {cut(q['why'])}</p>")
    if q.get("hint"):
        parts.append(f"<p><em>Hint:</em> {cut(q['hint'])}</p>")
    look_for = [s for s in q.get("look_for") or () if isinstance(s, str)]
    if look_for:
        items = "\n".join(f"<li>{cut(item)}</li>" for item in look_for)
        parts.append(f"<p><em>What to look for:</em></p>\n<ul>\n{items}\n</ul>")
    media = [m for m in q.get("media") or () if isinstance(m, Mapping)]
    if media:
        items = "\n".join(f"<li>{cut(_media_line(m))}</li>" for m in media)
        parts.append(f"<p><em>{_MEDIA_HEADING}:</em></p>\n<ul>\n{items}\n</ul>")
    show_if = _show_if_parts(q)
    if show_if is not None:
        title, labels = show_if
        answers = _either([f"\u201c{cut(x)}\u201d" for x in labels])
        parts.append(f"<p><em>Only needed if your answer to \u201c{cut(title)}\u201d is {answers}.</em></p>")
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
    return "<ol>\n" + "\n".join(items) + "\n</ol>" if items else ""


def _html_builtins(q: Mapping[str, Any], cut: Callable[[Any], str]) -> list[str]:
    apart = _builtins_apart(q)
    if not apart:
        return []
    choices = " or ".join(f"<code>{esc(typed)}</code> ({number} \u00b7 {cut(label)})" for number, typed, label in apart)
    return [f"<p><em>Or, on its own instead of picks:</em> reply {choices}.</p>"]


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


def _html_steps(q: Mapping[str, Any], poll: bool, reactions: bool = True) -> str:
    steps: Sequence[tuple[str, str | None]] = _answer_steps(q, poll, reactions)
    text = "; ".join(esc(p) + (f" <code>{esc(ex)}</code>" if ex else "") for p, ex in steps)
    return f"<p><em>To answer:</em> {text}.</p>"
