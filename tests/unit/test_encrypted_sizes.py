"""What the bridge sends into an encrypted room fits an event once
encrypted: the question and each part of its background, measured as the
Megolm ciphertext nio makes of them (the room's encrypted event is about 4/3
of the plaintext).  A 55 KB question fit in the clear and was refused as
M_TOO_LARGE once encrypted: it never appeared."""

from __future__ import annotations

import json
from typing import Any

import pytest
from nio.crypto.sessions import OutboundGroupSession

from bridge.protocol.one_pager import ENCRYPTED_MESSAGE_MAX_BYTES, render_one_pager
from bridge.protocol.question_event import (CONTENT_MAX_BYTES, ENCRYPTED_CONTENT_MAX_BYTES, QuestionEventTooLarge,
                                            content_size)
from test_question_event import build, decide_set

SESSION = OutboundGroupSession()
SESSION.mark_as_shared()  # (as once its key went to the room: nio encrypts only then)


def encrypted(content: dict[str, Any], event_type: str = "m.room.message") -> dict[str, Any]:
    """The m.room.encrypted content a client sends for ``content`` (nio's Megolm)."""
    payload = json.dumps({"type": event_type, "content": content, "room_id": "!room:example.org"},
                         ensure_ascii=False, separators=(",", ":"))
    return {"algorithm": "m.megolm.v1.aes-sha2", "sender_key": "x" * 43, "ciphertext": SESSION.encrypt(payload),
            "session_id": SESSION.id, "device_id": "ABCDEFGHIJ"}


def long_question(chars: int) -> dict[str, Any]:
    raw = decide_set()
    question = next(q for q in raw["questions"] if q["id"] == "db")
    question["question"] = "Does this sentence read well in every language we ship? " * (chars // 58)
    return raw


def test_a_long_question_fits_an_encrypted_rooms_event_once_encrypted():
    raw = long_question(30_000)
    clear = build(raw, "db", elicitation_id="elc_x")
    assert content_size(encrypted(clear, "dev.superpipeline.question.v2")) > CONTENT_MAX_BYTES  # as it was sent
    sized = build(raw, "db", elicitation_id="elc_x", max_bytes=ENCRYPTED_CONTENT_MAX_BYTES)
    assert content_size(sized) <= ENCRYPTED_CONTENT_MAX_BYTES
    assert content_size(encrypted(sized, "dev.superpipeline.question.v2")) <= CONTENT_MAX_BYTES


def test_structured_fields_past_an_encrypted_rooms_event_are_refused_there():
    raw = decide_set()
    question = next(q for q in raw["questions"] if q["id"] == "db")
    question["look_for"] = [f"Whether item {n} of the list reads well in every language we ship" for n in range(700)]
    build(raw, "db", elicitation_id="elc_x")  # fits in the clear
    with pytest.raises(QuestionEventTooLarge, match="in an encrypted room"):
        build(raw, "db", elicitation_id="elc_x", max_bytes=ENCRYPTED_CONTENT_MAX_BYTES)


def test_each_part_of_a_long_background_fits_an_encrypted_rooms_event():
    paragraphs = [{"type": "text", "text": f"Paragraph {n}: " + "the build notes in full, " * 40} for n in range(300)]
    parts = render_one_pager(paragraphs, title="Release notes", message_max=ENCRYPTED_MESSAGE_MAX_BYTES)
    assert len(parts) > 3
    assert max(content_size(encrypted(part.content)) for part in parts) <= CONTENT_MAX_BYTES
