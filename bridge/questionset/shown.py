"""Words a person reads and types back: an option's label, a title, a side's
name.  Pure, and shared by the lint and the reply reader, so what the lint
calls two labels is what a reply can tell apart.

A reply names an option in the words the person read; ``reply_key`` is how
those words compare: Unicode's compatibility form (a decomposed é, a
no-break space and a full-width letter read as what they show), invisible
characters dropped, spaces collapsed, quotes and a closing full stop or
exclamation mark left out, case ignored.
"""

from __future__ import annotations

import unicodedata

_QUOTES = "\"'`\u201c\u201d\u2018\u2019"
# Invisible characters that change what a line shows or seems to say: the
# zero-width space, the marks and embeddings of direction (U+202E turns the
# rest of the line around), the word joiner, a byte-order mark.  (The
# zero-width joiner and non-joiner are left: emoji and scripts need them.)
HIDDEN = frozenset("\u200b\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2060\u2066\u2067\u2068\u2069\ufeff")
_LINE_BREAKS = frozenset("\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029")


def visible(text: str) -> str:
    return "".join(ch for ch in text if ch not in HIDDEN)


def reply_key(text: str) -> str:
    return reply_form(text).casefold()


def reply_form(text: str) -> str:
    """``reply_key`` with its case kept: what tells apart two labels a quiz
    made differ by case only ("we", "We")."""
    return " ".join(reply_exact(text).rstrip(".!").split())


def reply_exact(text: str) -> str:
    """The words as written, closing mark and case kept: what tells apart two
    labels a quiz made differ by that mark only ("Stop.", "Stop!").  Only
    what a person can't see or type back is left out: invisible characters,
    extra spaces, the quotes around the words."""
    plain = visible(unicodedata.normalize("NFKC", text))
    return " ".join(plain.strip().strip(_QUOTES).split())


def one_line_problem(text: str) -> str | None:
    """Why ``text`` is not one line of visible words, if it is not: a line
    break lets a label add lines of its own ("2. Delete the database") to
    the numbered list a person answers from."""
    for ch in text:
        if ch in _LINE_BREAKS:
            return "holds a line break; keep it to one line"
        if unicodedata.category(ch) == "Cc":
            return f"holds a control character (U+{ord(ch):04X}); remove it"
        if ch in HIDDEN:
            return f"holds an invisible character (U+{ord(ch):04X}) that changes what it shows; remove it"
    return None
