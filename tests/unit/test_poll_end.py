"""A question's poll ended by someone else (MSC3381: the poll's sender, or
anyone with the power to redact it, may end it; a moderator can from
Element).  Element then shows the votes until the end as final and takes no
more; a vote placed after it (another client, a vote read late) was still
recorded, so the record said what no one in the room saw.  Through the real
pipeline and store (``helpers.timeline``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from helpers.timeline import MODERATOR, PEOPLE, Room, answer, redact, vote

ALICE, BOB, CAROL = PEOPLE


def poll_end(event_id: str, sender: str, ts: int, stable: bool = False) -> dict[str, Any]:
    """The poll's end as Element sends it (or in the MSC's stable form)."""
    kind = "m.poll.end" if stable else "org.matrix.msc3381.poll.end"
    return {"event_id": event_id, "room_id": "!room:hs", "sender": sender, "origin_server_ts": ts, "type": kind,
            "content": {"m.relates_to": {"rel_type": "m.reference", "event_id": "$poll"},
                        "org.matrix.msc1767.text": "Ended the poll"}}


def outcome(room: Room, event_id: str) -> tuple[str, str | None]:
    return room.store.db.execute("SELECT outcome, reason FROM answer_log WHERE event_id=?", (event_id,)).fetchone()


@pytest.mark.parametrize("stable", [False, True], ids=["msc3381", "stable"])
def test_a_vote_after_a_moderator_ended_the_poll_is_refused_and_one_before_it_stands(tmp_path: Path,
                                                                                     stable: bool) -> None:
    room = Room(tmp_path)
    room.deliver([vote("$a1", ALICE, 1000, ["main"]), poll_end("$end", MODERATOR, 2000, stable)])
    room.deliver([vote("$b1", BOB, 3000, ["stable"])])
    assert outcome(room, "$b1") == ("refused", "poll_ended")
    assert room.record()["choice"] == "main"  # Alice's vote, as the poll shows it
    # Placed before the end, read after it (another path, a slow server): it counts.
    room.deliver([vote("$c1", CAROL, 1500, ["stable"])])
    assert outcome(room, "$c1") == ("accepted", None)
    # The question is still open: a reply to it is an answer as ever.
    room.deliver([answer("$b2", BOB, 4000, "stable")])
    assert outcome(room, "$b2") == ("accepted", None)
    room.crash()  # a restart: the end is the store's
    room.deliver([vote("$a2", ALICE, 5000, ["stable"])])
    assert outcome(room, "$a2") == ("refused", "poll_ended")


def test_an_empty_vote_after_the_end_takes_nothing_back(tmp_path: Path) -> None:
    """The votes until the end are final in the room: an empty vote sent
    after it (any client but Element, which offers none) silently dropped
    the vote the ended poll still shows."""
    room = Room(tmp_path)
    room.deliver([vote("$a1", ALICE, 1000, ["main"]), poll_end("$end", MODERATOR, 2000)])
    room.deliver([vote("$a2", ALICE, 3000, [])])
    assert room.record()["choice"] == "main"
    room.deliver([vote("$a3", ALICE, 1500, [])])  # one placed before the end, read late, counts
    assert room.record() is None


def test_a_poll_end_redacted_opens_the_poll_again_as_clients_show_it(tmp_path: Path) -> None:
    room = Room(tmp_path)
    room.deliver([poll_end("$end", MODERATOR, 2000)])
    room.deliver([redact("$r-bob", BOB, 2500, "$end")])  # not his, no power: nothing changes
    room.deliver([vote("$b1", BOB, 3000, ["stable"])])
    assert outcome(room, "$b1") == ("refused", "poll_ended")
    room.deliver([redact("$r-mod", MODERATOR, 3500, "$end")])
    room.deliver([vote("$b2", BOB, 4000, ["stable"])])
    assert outcome(room, "$b2") == ("accepted", None)
    room.crash()
    room.deliver([vote("$a1", ALICE, 5000, ["main"])])
    assert outcome(room, "$a1") == ("accepted", None)


def test_a_poll_end_from_someone_without_the_power_to_end_it_changes_nothing(tmp_path: Path) -> None:
    room = Room(tmp_path)
    room.deliver([poll_end("$end", ALICE, 2000)])  # not the poll's sender, no power to redact it
    room.deliver([vote("$b1", BOB, 3000, ["stable"])])
    assert outcome(room, "$b1") == ("accepted", None) and room.record()["choice"] == "stable"


def test_a_batch_handled_again_starts_from_the_poll_ends_it_began_with(tmp_path: Path) -> None:
    room = Room(tmp_path)
    room.pipeline._before = {}
    room.pipeline._one(poll_end("$end", MODERATOR, 2000), "2027-01-15T08:00:00Z", _Result())
    assert room.pipeline.timeline.poll_ended("$q", 2500) == (MODERATOR, 2000)
    room.pipeline._restore_before()  # its transaction was not kept: neither is what it learnt
    assert room.pipeline.timeline.poll_ended("$q", 2500) is None


class _Result:
    accepted = refused = withdrawn = skipped = written_sets = 0
