"""What an agent's request can fail with: each maps to one HTTP status and to
one MCP tool error, never to a traceback."""

from __future__ import annotations

from typing import Any

from bridge.protocol.graphemes import shorten


class AgentError(Exception):
    status = 400
    code = "bad_request"
    # HTTP headers the refusal carries (Retry-After).
    headers: dict[str, str] = {}

    def __init__(self, message: str, *, findings: list[dict[str, str]] | None = None,
                 warnings: list[dict[str, str]] | None = None):
        super().__init__(message)
        self.message = message
        self.findings = findings or []
        self.warnings = warnings or []

    def as_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"ok": False, "error": self.code, "message": clipped(self.message)}
        if self.findings or self.code == "lint_failed":
            listed(body, "errors", self.findings)
            listed(body, "warnings", self.warnings)
        return body


# A set of thousands of questions can have a finding on each: a reply lists
# the first ones and says how many more there are (an MCP client reads a
# message of at most 1 MB; the 422 of a big set was 11 MB of findings).
MAX_LISTED = 100
# And each text in a refusal at most this long: one quotes what it refuses
# (a question id of a megabyte, "no question 'xxx…'"), and the call failed in
# a 2025-era client instead of telling it why.
MAX_TEXT = 2000


def clipped(value: Any) -> Any:
    """A text cut to ``MAX_TEXT`` characters (the cut said with "…"); anything else as it is."""
    return shorten(value, MAX_TEXT + 1) if isinstance(value, str) else value


def listed(body: dict[str, Any], key: str, items: list[Any]) -> None:
    body[key] = [{k: clipped(v) for k, v in item.items()} if isinstance(item, dict) else clipped(item)
                 for item in items[:MAX_LISTED]]
    if len(items) > MAX_LISTED:
        body[f"{key}_omitted"] = len(items) - MAX_LISTED


class BadRequest(AgentError):
    """The request itself is unusable: not JSON, a wrong parameter."""


class TooLarge(AgentError):
    """A set larger than the format allows (16 MB as the bridge writes it), a file over ``agent_api.media_max``."""

    status = 413
    code = "too_large"


class QuotaExceeded(AgentError):
    """An upload that would take the agent's set folders past ``agent_api.media_quota``."""

    status = 413
    code = "quota_exceeded"

    def __init__(self, message: str, *, used: int, limit: int):
        super().__init__(message)
        self.used, self.limit = used, limit

    def as_dict(self) -> dict[str, Any]:
        return {**super().as_dict(), "quota": {"used": self.used, "limit": self.limit}}


class NotFound(AgentError):
    """No such set for this agent (another agent's set looks exactly like none)."""

    status = 404
    code = "not_found"


class LintFailed(AgentError):
    """The set fails the format's rules; the findings say where and what."""

    status = 422
    code = "lint_failed"


class Unprocessable(AgentError):
    """Well-formed, but not something this set can take (an unknown question id)."""

    status = 422
    code = "unprocessable"


class NotLeading(AgentError):
    """A write asked of an instance of a shared store that lost its lease (frozen, cut off)."""

    status = 503
    code = "not_leading"


class TooManyWaits(AgentError):
    """Over ``agent_api.max_waits`` (this agent's) or ``max_waits_total`` (everyone's)."""

    status = 429
    code = "too_many_waits"

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after
        self.headers = {"Retry-After": str(retry_after)}


class CallbackRefused(AgentError):
    """A callback URL that goes into the bridge's own network (loopback,
    private, link-local, metadata...): the findings name each one."""

    status = 422
    code = "callback_refused"


class NotStored(AgentError):
    """The disk refused what was sent (full, read-only); nothing was left behind."""

    status = 507
    code = "not_stored"
