"""A question too long for its message is read whole: the message says it was
shortened, and its whole text follows in the question's thread, in parts that
fit; it was cut to a few hundred characters, the rest nowhere a person sees."""

from __future__ import annotations

import pytest

from helpers.waiting import until

pytestmark = pytest.mark.integration

THREAD = "m.thread"


def long_set(text: str) -> dict:
    return {"askwright": 1, "id": "long", "title": "Migration plan", "questions": [{
        "id": "plan", "kind": "choice", "title": "Migration plan", "question": text,
        "why": "The plan decides the weekend's work.",
        "options": [{"id": "go", "label": "Go ahead"}, {"id": "wait", "label": "Wait a week"}],
        "guess": {"option": "go", "why": "It was reviewed.", "confidence": "low"}}]}


async def test_a_question_too_long_for_its_message_is_posted_whole_in_its_thread(bridge):
    paragraphs = [f"Step {n}: move the shard {n} of the ledger to the new cluster, check its counts against the "
                  f"old one, keep the old one read-only for a day, and write down who checked it (café {n})."
                  for n in range(240)]
    text = "\n\n".join(paragraphs) + "\n\nShould the migration go ahead this weekend?"
    assert len(text.encode()) > 40_000
    bridge.add_set(long_set(text))
    bridge.start()
    (question,) = (await bridge.wait_questions(bridge.alice, 1, timeout=60)).values()
    body = question["content"]["body"]
    assert text not in body and "the whole question follows in this message's thread" in body
    assert "the whole question follows" in question["content"].get("formatted_body", "the whole question follows")

    async def parts() -> list[dict]:
        found = [e for e in await bridge.alice.messages(bridge.room_id, limit=100)
                 if e.get("content", {}).get("m.relates_to", {}).get("rel_type") == THREAD
                 and e["content"]["m.relates_to"].get("event_id") == question["event_id"]
                 and e["content"].get("body", "").startswith("The whole question")]
        return found if found and found[-1]["content"]["body"].endswith("this weekend?") else []

    posted = await until(parts, what="the whole question in its thread", timeout=30)
    assert len(posted) > 1
    rebuilt = [e["content"]["body"].split("\n\n", 1)[1] for e in posted]
    assert " ".join(" ".join(rebuilt).split()) == " ".join(text.split())
