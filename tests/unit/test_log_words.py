"""An exception in a log line: its message, or its kind when it has none; and no secret in a line."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

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


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_no_secret_reaches_the_log_in_either_format(fmt, capsys):
    """logging.format json redacted after json.dumps had escaped the quotes
    the patterns look for: a password in a quoted body came out whole; and
    neither format knew webhook secrets, Bearer tokens, the authentication
    service's tokens, or a quoted password with spaces."""
    from bridge.service.logs import setup_logging

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        setup_logging("INFO", fmt)
        said = logging.getLogger("test")
        said.warning("body %s", '{"password": "hunter2 horse battery", "access_token": "abcdef123"}')
        said.warning("webhook_secret=whsec-0123 for the agent; Authorization: Bearer planner-token-0123")
        said.warning("logged in as mat_0123456789abcdef; the next sync token s72_4")
        try:
            raise RuntimeError('refused {"as_token": "as-secret-0123"}')
        except RuntimeError:
            said.exception("a failure")
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    out = capsys.readouterr().err
    for secret in ("hunter2", "horse", "abcdef123", "whsec-0123", "planner-token-0123", "0123456789abcdef",
                   "as-secret-0123"):
        assert secret not in out, (secret, out)
    assert "s72_4" in out  # a sync token is no secret: kept, to follow the bridge's progress
    if fmt == "json":
        assert all(json.loads(line) for line in out.splitlines())
