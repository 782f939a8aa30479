"""A person's free words beside an answer -> the note and its timecodes.

Pure.  askwright's page ties a remark to a moment of a clip; in a chat the
person writes it on a line of its own (``1.4 s: the arrow jumps``,
``0:07 the logo flickers``), so every such line becomes a timecode and the
other lines stay the note.  The server's limits (question-set format, "What
comes back") are applied here so a record can never be refused on write.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from bridge.protocol.graphemes import shorten

MAX_TIMECODES = 50
MAX_TIMECODE_TEXT = 500
# A week: longer than any clip a question shows; past it a "timecode" is just text.
MAX_SECONDS = 7 * 24 * 3600
MAX_NOTE = 20_000

# A time at the start of a line: seconds with a unit ("1.4 s", "12sec") or a
# clock ("0:07", "1:02:03.5"), optionally after "at" or "@", then an optional
# separator and the remark.  A bare number is not a time: "1. foo" is a list.
_LINE = re.compile(
    r"^\s*(?:at\s+|@\s*)?"
    r"(?:(?P<clock>(?:\d{1,2}:)?\d{1,2}:\d{2}(?:\.\d+)?)|(?P<secs>\d+(?:[.,]\d+)?)\s*(?:s|sec|secs|seconds?)\b)"
    r"\s*[:\-\u2013\u2014]?\s*(?P<text>.*)$",
    re.IGNORECASE,
)

# The same times anywhere later in such a line, which may start a timecode of
# their own ("0:01 the left side smears; 1.5 s: the colours flicker"): not
# inside a number or a word ("3,5 s" is one time; "v2:30" is none).  ``mark``:
# the time written as a label ("2 s: b"), as a timecode starts.
_LATER = re.compile(
    r"(?<![\w.:,])(?:at\s+|@\s*)?"
    r"(?:(?P<clock>(?:\d{1,2}:)?\d{1,2}:\d{2}(?:\.\d+)?)(?![\d:])|(?P<secs>\d+(?:[.,]\d+)?)\s*(?:s|sec|secs|seconds?)\b)"
    r"\s*(?P<mark>[:\-\u2013\u2014])?\s*",
    re.IGNORECASE,
)
# What ends one remark before the next time: a list separator or an "and".
_TRAILING = re.compile(r"(?:\s*(?:[;,|/]|\band\b|\bthen\b))+\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Timecode:
    t: float  # seconds, rounded to 0.01
    text: str

    def as_record(self) -> dict[str, float | str]:
        return {"t": self.t, "text": self.text}


@dataclass(frozen=True)
class Note:
    text: str  # the lines that are not timecodes, trimmed ("" when none)
    timecodes: tuple[Timecode, ...]


def parse_note(text: str) -> Note:
    """Split ``text`` into its timecode lines and the rest.

    Lines past the 50th timecode stay in the note as written rather than
    being dropped: they are still the person's words.
    """
    kept: list[str] = []
    codes: list[Timecode] = []
    for line in text.splitlines():
        found = line_timecodes(line)[:MAX_TIMECODES - len(codes)]
        if found:
            codes.extend(found)
        else:
            kept.append(line)
    # Not cut to MAX_NOTE here: a note that would not fit is refused as
    # note_too_long (the person told), never kept shortened as if whole.
    return Note("\n".join(kept).strip(), tuple(codes))


def parse_timecode(line: str) -> Timecode | None:
    """The first timecode of a line that starts with one."""
    codes = line_timecodes(line)
    return codes[0] if codes else None


def line_timecodes(line: str) -> list[Timecode]:
    """Every timecode of a line that starts with a time, each with the text
    up to the next time; [] for a line that does not start with one."""
    first = _LINE.match(line)
    if first is None or _seconds(first) is None:
        return []  # also a time past any media: the line stays in the note as written
    text = first.group("text")
    times = [(first, 0)] + _later_starts(text)
    codes = []
    for index, (match, start) in enumerate(times):
        begin = 0 if index == 0 else match.end()
        end = times[index + 1][1] if index + 1 < len(times) else len(text)
        remark = _TRAILING.sub("", text[begin:end]).strip()
        codes.append(Timecode(round(_seconds(match) or 0.0, 2), shorten(remark, MAX_TIMECODE_TEXT)))
    return codes


def _later_starts(text: str) -> list[tuple[re.Match[str], int]]:
    """The times in a timecode line's remark that start remarks of their own:
    those after a separator ("…; 1.5 s: …", "…, then at 0:09 …") or written
    as a label ("a 2 s: b"), with words after them.  A length of time inside
    a remark ("the colours flicker for 2 seconds", "lasts 3 s too long") is
    the person's words, not a moment: taken as one, the words were lost to
    an empty timecode."""
    candidates = [m for m in _LATER.finditer(text) if _seconds(m) is not None
                  and (m.group("mark") or _TRAILING.search(text[:m.start()]))]
    starts: list[tuple[re.Match[str], int]] = []
    end = len(text)
    for match in reversed(candidates):  # from the last: a time with no words after it stays in the remark before
        if _TRAILING.sub("", text[match.end():end]).strip():
            starts.insert(0, (match, match.start()))
            end = match.start()
    return starts


def _seconds(match: re.Match[str]) -> float | None:
    if match.group("clock"):
        seconds = 0.0
        for part in match.group("clock").split(":"):
            seconds = seconds * 60 + float(part)
    else:
        seconds = float(match.group("secs").replace(",", "."))
    return seconds if seconds <= MAX_SECONDS else None  # also NaN and the infinity long digits parse to
