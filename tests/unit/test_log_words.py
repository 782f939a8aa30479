"""An exception in a log line: its message, or its kind when it has none."""

from __future__ import annotations

import asyncio

from bridge.service.logs import why


def test_a_timeout_is_named_by_its_kind_and_an_error_by_its_message():
    # nio's 60 s timeout while a batch asked after someone at an event: the
    # retry's warning read "sync batch not handled (); retrying in 0.5 s".
    assert why(asyncio.TimeoutError()) == "TimeoutError"
    assert why(ValueError("the store refused it")) == "the store refused it"


def test_a_message_over_lines_is_told_on_one_line_and_clipped():
    from bridge.service.logs import in_a_line

    assert in_a_line(OSError("connection refused\n\tIs the server running?")) == \
        "connection refused Is the server running?"
    assert len(in_a_line(ValueError("x" * 1000))) == 300 and in_a_line(TimeoutError()) == "TimeoutError"
