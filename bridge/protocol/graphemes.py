"""Text cut short without breaking a character a person sees.

Pure.  A cut by code points can land inside what reads as one character: an
accent left off its letter, a family emoji (people joined by U+200D) turned
into a lone person and a stray joiner, a flag (a pair of regional
indicators) turned into a letter in a box.  ``cut`` backs off to the start of
such a cluster instead.  Not full Unicode segmentation (no dependency for
it): the marks that join, which are the ones seen cut in words back.
"""

from __future__ import annotations

import unicodedata

_ZWJ = "\u200d"


def _joins_previous(char: str) -> bool:
    """Whether ``char`` belongs to the character before it."""
    code = ord(char)
    return (char == _ZWJ or unicodedata.category(char) in ("Mn", "Me", "Mc")
            or 0xFE00 <= code <= 0xFE0F or 0xE0100 <= code <= 0xE01EF  # variation selectors
            or 0x1F3FB <= code <= 0x1F3FF  # skin tones
            or 0xE0020 <= code <= 0xE007F)  # tags (the flags of England, Scotland, Wales)


def _regional(char: str) -> bool:
    return 0x1F1E6 <= ord(char) <= 0x1F1FF


def cut(text: str, end: int) -> str:
    """``text[:end]``, shorter where that would end inside a character a
    person sees (then up to where that character starts)."""
    if end >= len(text):
        return text
    end = max(end, 0)
    while end > 0 and (_joins_previous(text[end]) or text[end - 1] == _ZWJ):
        end -= 1
    if end > 0 and _regional(text[end]) and _regional(text[end - 1]):
        run = 0
        while end - run > 0 and _regional(text[end - run - 1]):
            run += 1
        if run % 2:  # the last indicator kept is the first of a flag's pair
            end -= 1
    return text[:end]


def shorten(text: str, limit: int | None) -> str:
    """``text`` within ``limit`` characters (None: as it is), cut on a whole
    character with an ellipsis for what was left out."""
    if limit is None or len(text) <= limit:
        return text
    return cut(text, limit - 1) + "\u2026"
