"""An exception in a log line: its message, or its kind when it has none."""

from __future__ import annotations

import asyncio

from bridge.service.logs import why


def test_a_timeout_is_named_by_its_kind_and_an_error_by_its_message():
    # nio's 60 s timeout while a batch asked after someone at an event: the
    # retry's warning read "sync batch not handled (); retrying in 0.5 s".
    assert why(asyncio.TimeoutError()) == "TimeoutError"
    assert why(ValueError("the store refused it")) == "the store refused it"
