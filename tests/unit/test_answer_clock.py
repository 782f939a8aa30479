"""The time an answer is recorded (``updated``) never goes back: agents wait
for an answer ``after`` the last one they saw by it."""

from __future__ import annotations

import time
from typing import Any

from bridge.answers.arrival import parse_time
from bridge.service.answering.pipeline import utc_now


def test_the_clock_read_across_a_second_s_end_does_not_go_back_a_second(monkeypatch: Any) -> None:
    # The thread is descheduled between two readings of the clock, across the end of a second.
    readings = iter([1_780_000_000.9995, 1_780_000_001.0004, 1_780_000_001.0004])
    monkeypatch.setattr(time, "time", lambda: next(readings))
    stamp = utc_now()
    assert stamp == "2026-05-28T20:26:40.999Z"
    assert parse_time(stamp).timestamp() > 1_780_000_000.5


def test_answers_recorded_one_after_another_are_in_order() -> None:
    stamps = [utc_now() for _ in range(2000)]
    assert [parse_time(s) for s in stamps] == sorted(parse_time(s) for s in stamps)


def test_an_answer_is_stamped_by_the_stores_clock_which_a_cluster_shares(tmp_path) -> None:
    """A new leader whose machine's clock ran two minutes behind stamped the
    next answers before the last one: every agent waiting ``after`` it
    missed them.  ``updated`` comes from the store's clock (on PostgreSQL
    the database's), as every other time another instance reads."""
    from helpers.timeline import Room, answer

    room = Room(tmp_path)
    room.store.clock = type("Shared", (), {"now_ms": staticmethod(lambda: 1_800_000_000_123)})()
    room.deliver([answer("$a1", "@alice:hs", 1000, "main")])
    assert room.record()["updated"] == "2027-01-15T08:00:00.123Z"


def test_each_answer_accepted_or_refused_is_one_log_line(tmp_path, caplog) -> None:
    # operators.md promises it; the metrics counted them, and the log said nothing.
    import logging

    from helpers.timeline import Room, answer

    room = Room(tmp_path)
    with caplog.at_level(logging.INFO, logger="bridge.service.answering.pipeline"):
        room.deliver([answer("$a1", "@alice:hs", 1000, "main"), answer("$x1", "@mallory:elsewhere", 1001, "main")])
    lines = [r.getMessage() for r in caplog.records if r.name == "bridge.service.answering.pipeline"]
    assert any(line.startswith("accepted $a1 from @alice:hs to ") for line in lines), lines
    assert any(line.startswith("refused $x1 from @mallory:elsewhere to ") and "(" in line for line in lines), lines
