"""What a person types (or reacts) in Element -> the pick it means.

Pure.  Numbers are 1-based positions in the question event's own
``question.options`` (built-ins included): exactly the numbers the message
shows (``render``), so what the person read is what is resolved here.
Nothing here decides whether a pick is *allowed*; that is the judge's job.
This only says what the words mean, or that they mean nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from bridge.protocol.recorded import RecordedQuestion
from bridge.protocol.render import KEYCAP_STEP, KEYCAPS, POLL_STEP, SINGLE_PICK_KINDS, option_display
from bridge.questionset.builtin import OTHER_ID, UNSURE_ID
from bridge.questionset.shown import reply_exact, reply_form, reply_key

_NUMBER = re.compile(r"^#?(\d{1,3})[.)]?$")
_SPACED_NUMBERS = re.compile(r"^\d{1,3}(?:\s+\d{1,3})+$")
# "<option>: <words>" (or with a dash): the option and its input or a remark.
# Not a colon with a digit after it: "1:02 the cut is abrupt" is a time in
# the clip (a timecode, ``notes``), not option 1 with the words "02 the cut".
_HEAD = re.compile(r"^(?P<head>[^:\n\u2013\u2014]{1,200}?)\s*(?::(?!\d)|\s[-\u2013\u2014])\s*(?P<rest>.+)$",
                   re.DOTALL)


@dataclass(frozen=True)
class Pick:
    option_id: str | None = None
    text: str | None = None  # a text answer, the ids of a multi/rank, or an option's input
    note: str | None = None  # words on the lines after the pick

    def fields(self) -> dict[str, str]:
        return {k: v for k, v in (("option_id", self.option_id), ("text", self.text), ("note", self.note)) if v}


# A reply fallback's first line names the sender of what it quotes:
# "> <@alice:hs> ..." (an emote: "> * <@alice:hs> ...").
_FALLBACK_HEAD = re.compile(r"^> (?:\* )?<@[^>\s]+>")


def strip_fallback(body: str) -> str:
    """The reply without the ``> `` quote of the message replied to.

    Element no longer sends one (PROTOCOL section 3), but older clients and
    bridges do, and a quoted question must never be read as the answer.  A
    quote the person typed (Markdown's ``> ``, no sender named) is theirs
    and stays.
    """
    lines = body.splitlines()
    if not lines or not _FALLBACK_HEAD.match(lines[0]):
        return body.strip()
    index = 0
    while index < len(lines) and (lines[index].startswith("> ") or lines[index] == ">"):
        index += 1
    if index and index < len(lines) and not lines[index].strip():
        index += 1
    return "\n".join(lines[index:]).strip()


def read_reply(body: str, question: RecordedQuestion) -> Pick | None:
    """The pick ``body`` makes on ``question``; None when it can't be read as one."""
    text = strip_fallback(body)
    if not text:
        return None
    if question.kind == "text":
        # The whole reply is the answer; only a bare "unsure" is the built-in.
        return Pick(option_id=UNSURE_ID) if reply_key(text) in _unsure_words(question) else Pick(text=text)
    pick = _read_pick(text, question)
    if pick is not None:
        return pick
    first, _, rest = text.partition("\n")
    if rest.strip():
        pick = _read_pick(first.strip(), question)
        if pick is not None:
            return Pick(pick.option_id, pick.text, rest.strip())
    return None


def keycap_pick(key: str, question: RecordedQuestion) -> Pick | None:
    """A keycap reaction (1\ufe0f\u20e3 .. \U0001f51f, with or without VS16) -> that option."""
    number = keycap_number(key)
    if number is None or number > len(question.options) or question.kind == "text":
        return None  # (a text question's message numbers nothing: its "not sure" is a reply)
    return Pick(option_id=question.options[number - 1]["id"])


def keycap_number(key: str) -> int | None:
    key = key.replace("\ufe0f", "")
    for number, cap in enumerate(KEYCAPS, start=1):
        if key == cap.replace("\ufe0f", ""):
            return number
    return None


def help_text(question: RecordedQuestion) -> str:
    """One short paragraph on what a reply to ``question`` can say."""
    count = len(question.options)
    own = len(question.rankable_ids)
    builtins = "“unsure” if you are not sure" + (", or “other: <your words>”" if OTHER_ID in question.offered_ids else "")
    kind = question.kind
    if kind == "text":
        return "Reply to the question with your answer in your own words, or “unsure” if you are not sure."
    # Only what the message shows: numbers and the words of the options, never ids.
    if kind == "multi":
        return (f"Reply with the numbers of every option you pick, separated by commas "
                f"(for example “1, {min(own, 3)}”); {builtins}.")
    if kind == "rank":
        example = ", ".join(str(n) for n in range(own, 0, -1))
        return f"Reply with all {own} numbers in your order, best first, separated by commas (for example “{example}”); {builtins}."
    how = f"Reply with the number of your pick (1\u2013{count})"
    if kind in SINGLE_PICK_KINDS:
        # What the question's message offered, as it showed it.
        shown = str(question.content.get("body") or "")
        ways = [way for way, step in (("react with its number", KEYCAP_STEP), ("vote in the poll", POLL_STEP))
                if step in shown]
        if ways:
            how += "".join(f", {way}" for way in ways[:-1]) + f"{',' if len(ways) > 1 else ''} or {ways[-1]}"
    return f"{how}; {builtins}."


def valid_numbers(question: RecordedQuestion) -> int:
    """How many numbers an answer to ``question`` may use (1 to this): a list
    (``multi``, ``rank``) names the set's own options, never the built-ins
    shown after them, which stand alone ("unsure", never "1, unsure")."""
    return len(question.rankable_ids) if question.kind in ("multi", "rank") else len(question.options)


def numbers_out_of_range(body: str, question: RecordedQuestion) -> list[int]:
    """The numbers in a reply that name no option it may use ("9" on four
    options; on a list, a built-in's number beside others), in the order
    typed; empty when every number is one it may use."""
    if question.kind == "text":
        return []
    text = strip_fallback(body)
    parts = text.split() if _SPACED_NUMBERS.match(text) else re.split(r"[,;>\n]", text)
    count = valid_numbers(question)
    found = []
    for part in parts:
        number = _NUMBER.match(reply_key(part))
        if number and not 1 <= int(number.group(1)) <= count and int(number.group(1)) not in found:
            found.append(int(number.group(1)))
    return found


# ---------------------------------------------------------------- reading


def _read_pick(text: str, question: RecordedQuestion) -> Pick | None:
    if reply_key(text) in _unsure_words(question):
        return Pick(option_id=UNSURE_ID)
    whole = _resolve(text, question)
    if question.kind in ("multi", "rank"):
        if whole in (UNSURE_ID, OTHER_ID):
            return Pick(option_id=whole)
        builtin = _builtin_with_words(text, question)
        if builtin is not None:
            return builtin
        ids = _resolve_list(text, question)
        return Pick(text=", ".join(ids)) if ids else None
    if whole is not None:
        return Pick(option_id=whole)
    match = _HEAD.match(text)
    if match:
        head = _resolve(match.group("head"), question)
        if head is not None:
            # The words are the option's input (``other``) or, on an option
            # that takes none, a remark the judge keeps as the note.
            return Pick(option_id=head, text=match.group("rest").strip())
    return None


def _builtin_with_words(text: str, question: RecordedQuestion) -> Pick | None:
    match = _HEAD.match(text)
    if match and _resolve(match.group("head"), question) == OTHER_ID:
        return Pick(option_id=OTHER_ID, text=match.group("rest").strip())
    return None


def _resolve_list(text: str, question: RecordedQuestion) -> list[str] | None:
    if _SPACED_NUMBERS.match(text.strip()):
        parts = text.split()
    else:
        separators = r"[,;>\n]" if question.kind == "rank" else r"[,;\n]"
        parts = [p for p in re.split(separators, text) if p.strip()]
    if not parts:
        return None
    ids = [_resolve(part, question) for part in parts]
    if any(oid is None for oid in ids):
        return None
    return [oid for oid in ids if oid is not None]


def _resolve(token: str, question: RecordedQuestion) -> str | None:
    """One option from its number, id, label or (on a compare) the side shown."""
    plain = reply_key(token)
    if not plain:
        return None
    number = _NUMBER.match(plain)
    options = question.options
    if number:
        index = int(number.group(1))
        return options[index - 1]["id"] if 1 <= index <= len(options) else None
    for option in options:
        if plain == reply_key(option["id"]):
            return option["id"]
    named = [option for option in options
             if any(isinstance(name, str) and plain == reply_key(name)
                    for name in (option.get("label"), option_display(question.question, option)))]
    named = _as_written(token, named)
    return named[0]["id"] if named else None


# A quiz may offer labels a loosened reply can't tell apart: the one written
# as the person wrote it wins over the first of them.  First its closing mark
# ("Stop!" over "Stop."), then its case ("we" over "We").
_WRITTEN_FORMS = (lambda words: reply_exact(words).casefold(), reply_form)


def _as_written(token: str, named: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for form in _WRITTEN_FORMS:
        if len(named) < 2:
            break
        written = form(token)
        named = [option for option in named if form(str(option.get("label"))) == written] or named
    return named


def _unsure_words(question: RecordedQuestion) -> set[str]:
    if UNSURE_ID not in question.offered_ids:
        return set()
    words = {UNSURE_ID, "not sure"}
    label = question.label(UNSURE_ID)
    if label:
        words.add(reply_key(label))
    return words


