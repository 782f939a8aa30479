"""What every rule is handed: the run (mode, files, findings so far) and a view of one question."""

from __future__ import annotations

from collections.abc import Mapping
import time
from dataclasses import dataclass, field
from typing import Any

from bridge.questionset import media as media_rules
from bridge.questionset.lint.access import list_at, str_at, value_at
from bridge.questionset.load import Finding
from bridge.questionset.model import KINDS


def _label(item: Any, index: int, named: set[str] | None = None) -> str:
    """How a list item is named in ``where``: by its id when it has one (as
    the loader does), by its place when an item before it took that id
    (``named``: the ids taken so far, added to): findings about the second
    of two questions "a" were read as the first's."""
    ident = value_at(item, "id")
    if not isinstance(ident, str) or not ident or (named is not None and ident in named):
        return str(index)
    if named is not None:
        named.add(ident)
    return ident


def question_views(raw: dict[str, Any]) -> list[QuestionView]:
    """A view of each question of the set (its objects; anything else is a
    type error the loader names)."""
    named: set[str] = set()
    return [question_view(q, _label(q, i, named)) for i, q in enumerate(list_at(raw, "questions") or [])
            if isinstance(q, dict)]


@dataclass
class QuestionView:
    """One question's raw dict plus what the rules keep asking about it."""

    raw: dict[str, Any]
    where: str
    id: str | None
    kind: str | None
    is_open: bool
    options: list[tuple[str, dict[str, Any]]]  # (where, option dict)
    options_given: bool  # a list of options is there at all

    @property
    def option_ids(self) -> list[str]:
        return [o["id"] for _, o in self.options if isinstance(o.get("id"), str)]


def question_view(raw: dict[str, Any], label: str) -> QuestionView:
    where = f"questions[{label}]"
    kind = str_at(raw, "kind")
    status = value_at(raw, "status")
    # An invalid status is a type error already; counting it as open (the
    # default) keeps it from also setting off "no open question".
    is_open = status not in ("closed", "superseded", "withdrawn")
    raw_options = list_at(raw, "options")
    named: set[str] = set()
    options = [
        (f"{where}.options[{_label(o, i, named)}]", o) for i, o in enumerate(raw_options or []) if isinstance(o, dict)
    ]
    return QuestionView(
        raw=raw,
        where=where,
        id=str_at(raw, "id"),
        kind=kind if kind in KINDS else None,
        is_open=is_open,
        options=options,
        options_given=raw_options is not None,
    )


@dataclass
class Context:
    raw: dict[str, Any]
    fs: media_rules.Filesystem
    probe: media_rules.Probe | None
    mode: str
    # Question id -> the highest rev the bridge posted of it (empty without a store).
    posted_revs: Mapping[str, int] = field(default_factory=dict)
    # A set an agent sent through the HTTP API or MCP: media only from its own folder (``confined``).
    confined: bool = False
    # The bridge's own ``answerers`` (None: anyone in the room): a question's are within them.
    answerers: frozenset[str] | None = None
    # When lint runs: a duration counts from here, an RFC 3339 ``expires`` must be after it.
    now_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    errors: list[Finding] = field(default_factory=list)
    warnings: list[Finding] = field(default_factory=list)

    @property
    def study(self) -> bool:
        return self.mode == "study"

    def error(self, where: str, message: str) -> None:
        self.errors.append(Finding(where, message))

    def warning(self, where: str, message: str) -> None:
        self.warnings.append(Finding(where, message))

    @property
    def media_roots(self) -> list[str]:
        """The roots media is resolved in: for a confined set, only those inside its folder."""
        roots = [r for r in list_at(self.raw, "media_roots") or [] if isinstance(r, str)]
        if self.confined:
            from bridge.questionset.lint.confined import safe_roots

            return safe_roots(roots, self.fs)
        return roots
