"""A schema's ``pattern`` read as ECMA-262 reads it, wherever the bridge checks one."""

from __future__ import annotations

import pytest

from bridge.protocol.patterns import Validator, compiled
from bridge.protocol.schemas import compile_predicate


@pytest.mark.parametrize("pattern, text, matches", [
    ("^[a-z]+$", "abc", True),
    ("^[a-z]+$", "abc\n", False),  # Python's $ alone would match before the newline
    ("^[a-z]+$", "ab\nc", False),
    (r"^a\$$", "a$", True),  # an escaped $ is a dollar sign
    ("^[$a]+$", "$a$", True),  # so is one in a class
    ("^[$a]+$", "$a\n", False),
    (r"\S", " x ", True),  # unanchored patterns search, as the schemas mean
    # ECMA-262's classes: its \s is not Python's (U+001C-U+001F, U+0085 are no
    # space to it, U+FEFF is), its \d and \w are ASCII.  A close's reason
    # "\u001d" was refused, and one of "\ufeff" taken.
    (r"\S", "\u001d", True),
    (r"\S", "\u0085", True),
    (r"\S", "\ufeff", False),
    (r"\s", "\u00a0", True),
    (r"^\d+$", "\u0663", False),
    (r"^[\w.-]+$", "caf\u00e9", False),
    (r"^[\w.-]+$", "a_b.c-1", True),
    (r"^\D$", "x", True),
])
def test_a_dollar_is_the_end_of_the_string(pattern, text, matches):
    assert bool(compiled(pattern).search(text)) is matches
    schema = {"type": "string", "pattern": pattern}
    assert Validator(schema).is_valid(text) is matches
    predicate = compile_predicate(schema)  # the Matrix schemas' fast check agrees with their validator
    assert predicate is not None and predicate(text) is matches
