"""A leaf's bytes are RFC 8785 (JCS).  ``audit_leaf.canonical`` writes the
values every leaf holds (strings, safe integers, booleans, nulls, lists and
objects) with ``json`` in C and leaves anything else to ``rfc8785``: the
bytes must be the package's, byte for byte, or the same refusal."""

from __future__ import annotations

from typing import Any

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.protocol import audit_leaf

# Every code point, lone surrogates included; keys from the ranges whose
# UTF-16 order differs from their code points' order (U+E000 and up against
# characters past U+FFFF) come often.
TEXT = st.text(st.characters(codec=None, categories=None), max_size=12) | st.text(
    st.sampled_from(["a", "\ue000", "\ufb33", "\uffff", "\U0001f600", "\U00010000", "\r", "\x7f", '"', "\\"]),
    max_size=4)
SCALARS = (st.none() | st.booleans() | st.integers(-(2**54), 2**54) | st.floats() | TEXT)
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(TEXT, inner, max_size=5),
                      max_leaves=30)


def outcome(write: Any, value: Any) -> tuple[str, Any]:
    try:
        return ("bytes", write(value))
    except Exception as exc:  # noqa: BLE001 - the refusal is what is compared
        return ("refused", type(exc).__name__)


@settings(max_examples=1500)
@given(VALUES)
def test_canonical_bytes_are_the_packages(value: Any) -> None:
    assert outcome(audit_leaf.canonical, value) == outcome(rfc8785.dumps, value)


def test_the_rfcs_own_sorting_example() -> None:
    """RFC 8785, 3.2.3: keys in the order of their UTF-16 code units."""
    value = {"\u20ac": "Euro Sign", "\r": "Carriage Return", "\ufb33": "Hebrew Letter Dalet With Dagesh",
             "1": "One", "\U0001f600": "Emoji: Grinning Face", "\u0080": "Control",
             "\u00f6": "Latin Small Letter O With Diaeresis"}
    expected = ('{"\\r":"Carriage Return","1":"One","\u0080":"Control","\u00f6":"Latin Small Letter O With '
                'Diaeresis","\u20ac":"Euro Sign","\U0001f600":"Emoji: Grinning Face","\ufb33":"Hebrew Letter '
                'Dalet With Dagesh"}').encode()
    assert audit_leaf.canonical(value) == expected


def test_a_leaf_is_written_without_the_pure_python_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """The leaf every answer makes takes the fast path (``rfc8785`` is pure
    Python: 24 us a leaf against 6 us)."""
    leaf = audit_leaf.build_leaf(outcome="accepted", set_id="s", room_id="!r:hs", event_id="$e", sender="@a:hs",
                                 ts=1, question={"question": {"id": "q", "rev": 1}}, question_event_id="$q",
                                 record={"qid": "q", "state": "answered", "text": "ünï 🎉"})
    expected = rfc8785.dumps(leaf)
    monkeypatch.setattr(rfc8785, "dumps", lambda _value: pytest.fail("the leaf went to rfc8785"))
    assert audit_leaf.canonical(leaf) == expected
