"""Events held back for decryption take their place in the room's timeline,
against a real Synapse with a person whose client encrypts."""

from __future__ import annotations

import asyncio
import time

import pytest

from helpers.harness import answer_content, store_rows
from test_encryption import encrypted, started  # noqa: F401 - the fixture and the start of its tests

pytestmark = pytest.mark.integration


async def kept(bridge, event_ids: list[str], *, only: bool = True, timeout: float = 20) -> None:
    """Until the bridge holds ``event_ids`` undecrypted (and nothing else, with ``only``)."""
    deadline = time.monotonic() + timeout
    while True:
        held = {r[0] for r in store_rows(bridge.store_path, "SELECT event_id FROM undecrypted")}
        if (held == set(event_ids)) if only else set(event_ids) <= held:
            return
        assert time.monotonic() < deadline, f"not kept\n{bridge.log_text()[-3000:]}"
        await asyncio.sleep(0.1)


async def processed(bridge, event_id: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not store_rows(bridge.store_path, "SELECT 1 FROM processed WHERE event_id=?", event_id):
        assert time.monotonic() < deadline, f"{event_id} not processed\n{bridge.log_text()[-3000:]}"
        await asyncio.sleep(0.1)


async def test_two_answers_from_one_late_session_land_in_the_order_they_were_sent(encrypted):  # noqa: F811
    bridge, alice, room = encrypted, encrypted.alice, encrypted.room_id
    bridge.extra_config = {"encryption": {"grace": "10m"}}
    questions = await started(bridge)
    question = questions[("branch", 1)]
    # The bridge used to replay events held in one sync by event id (a hash):
    # sent while it is stopped, both come in its first sync after the start;
    # a pair whose ids sort against the order they were sent in shows it.
    assert bridge.stop() == 0
    for _attempt in range(12):
        first, second = await alice.encrypt_withheld_many(room, [answer_content(question, option_id="main"),
                                                                 answer_content(question, option_id="stable")])
        earlier = await alice.send_raw(room, "m.room.encrypted", first)
        later = await alice.send_raw(room, "m.room.encrypted", second)
        if later < earlier:
            break
    bridge.start()
    await kept(bridge, [earlier, later], only=False)
    await alice.share_withheld(room)
    record = await bridge.wait_answer("kinds", "branch", rev=2, timeout=40)
    assert (record["choice"], record["source"]["event_id"]) == ("stable", later)


async def test_a_redaction_of_a_held_answer_drops_it(encrypted):  # noqa: F811
    bridge, alice, room = encrypted, encrypted.alice, encrypted.room_id
    bridge.extra_config = {"encryption": {"grace": "10m"}}
    questions = await started(bridge)
    content = answer_content(questions[("branch", 1)], option_id="stable")
    late = await alice.send_raw(room, "m.room.encrypted", await alice.encrypt_withheld(room, content))
    await kept(bridge, [late])
    redaction = await alice.redact(room, late)
    await processed(bridge, redaction)
    # Kept until its keys come: only then can anyone tell what it was (an
    # empty poll vote takes votes back even when redacted).
    await kept(bridge, [late])
    await alice.share_withheld(room)
    marker = await alice.send(room, answer_content(questions[("ship", 1)], option_id="go"))
    await alice.wait_notice(room, marker, timeout=40)
    await kept(bridge, [])
    assert "branch" not in bridge.answers("kinds")["answers"]
    assert await alice.notices_for(room, late) == []


async def test_a_held_answer_redacted_and_never_decrypted_is_given_up_without_a_word(encrypted):  # noqa: F811
    bridge, alice, room = encrypted, encrypted.alice, encrypted.room_id  # grace: 3 s
    questions = await started(bridge)
    content = answer_content(questions[("branch", 1)], option_id="stable")
    late = await alice.send_raw(room, "m.room.encrypted", await alice.encrypt_withheld(room, content))
    await kept(bridge, [late])
    await alice.redact(room, late)
    await kept(bridge, [], timeout=40)  # past the grace, its keys never shared
    marker = await alice.send(room, answer_content(questions[("ship", 1)], option_id="go"))
    await alice.wait_notice(room, marker, timeout=40)
    assert await alice.notices_for(room, late) == []
    assert store_rows(bridge.store_path, "SELECT outcome FROM processed WHERE event_id=?", late) == [("withdrawn",)]
