"""What lint makes of a set an agent writes: a pure function over the
document and the set's folder (its media files are looked at, never
written), so a big one is judged in a process of its own (``apart.py``)
and its seconds of parsing and linting never hold this process's
interpreter lock, which the event loop needs too."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from bridge.agents.errors import BadRequest, LintFailed, TooLarge
from bridge.questionset.lint import lint
from bridge import strictjson
from bridge.questionset.load import LoadError, parse_json
from bridge.questionset.media import LocalFilesystem
from bridge.questionset.lint.posted import changed_unposted
from bridge.questionset.setdir import MAX_QUESTIONS_BYTES, QUESTIONS_FILE, questions_bytes, questions_data


@dataclass
class JudgedSet:
    """The file to write and what to tell the agent, or why not (exceptions
    carry their findings as attributes a process boundary would drop)."""
    data: bytes = b""
    open_ids: list[str] = field(default_factory=list)
    warnings: list[dict[str, str]] = field(default_factory=list)
    bad: str | None = None  # BadRequest's message
    too_large: str | None = None  # TooLarge's
    failed: tuple[str, list[dict[str, str]], list[dict[str, str]]] | None = None  # LintFailed's

    def raise_refusal(self) -> None:
        if self.bad is not None:
            raise BadRequest(self.bad)
        if self.too_large is not None:
            raise TooLarge(self.too_large)
        if self.failed is not None:
            message, findings, warnings = self.failed
            raise LintFailed(message, findings=findings, warnings=warnings)


def judge_set(document: bytes | dict[str, Any], set_id: str, folder: str,
              revs: Mapping[str, int], answerers: tuple[str, ...] = ()) -> JudgedSet:
    try:
        raw = parsed(document)
    except BadRequest as exc:
        return JudgedSet(bad=exc.message)
    if raw.get("id") != set_id:
        return JudgedSet(failed=("the set's id must be the id in the address",
                                 [{"where": "id", "message": f"must be {set_id!r}, the set id in the address"}], []))
    try:
        data = questions_bytes(raw)
    except strictjson.NotJson as exc:
        return JudgedSet(bad=f"questions.json: {exc}")
    if len(data) > MAX_QUESTIONS_BYTES:
        # As it is written (a document that came as JSON inside an envelope,
        # or through MCP, was never measured): a file the bridge can't read
        # back is never written.  Said before seconds of lint.
        return JudgedSet(too_large=f"questions.json would be {len(data)} bytes as written, larger than the format "
                                   f"allows ({MAX_QUESTIONS_BYTES})")
    result = lint(raw, LocalFilesystem(os.path.abspath(folder)), probe=None, posted_revs=revs, confined=True,
                  answerers=answerers)
    warnings = dicts(result.warnings)
    if revs:  # (nothing posted: nothing the set as it was could differ from; its file is not read)
        warnings += dicts(changed_unposted(raw, _current(folder), revs))
    if not result.ok:
        return JudgedSet(failed=("the set fails lint", dicts(result.errors), warnings))
    open_ids = [q.id for q in result.model.questions if q.is_open] if result.model else []
    return JudgedSet(data=data, open_ids=open_ids, warnings=warnings)


def _current(folder: str) -> dict[str, Any] | None:
    """The set's questions.json as it is before this write (None: none, or unreadable)."""
    try:
        return parse_json(questions_data(os.path.join(folder, QUESTIONS_FILE)))
    except (OSError, LoadError, RecursionError, ValueError):
        return None


def dicts(findings: list[Any]) -> list[dict[str, str]]:
    return [f.as_dict() for f in findings]


def parsed(document: bytes | dict[str, Any]) -> dict[str, Any]:
    if isinstance(document, dict):
        return document
    if len(document) > MAX_QUESTIONS_BYTES:
        raise BadRequest("questions.json is larger than the format allows")
    try:
        return parse_json(document)
    except LoadError as exc:
        raise BadRequest(exc.message) from None
    except (RecursionError, ValueError):
        raise BadRequest("questions.json is not usable JSON") from None
