"""A set folder's answers as ``read`` shows them, loaded from disk.

The one code path ``read``, ``wait`` and the bridge's ``status`` share: the
commands print it, the service counts it, so neither depends on the other.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bridge.answers.document import AnswersError
from bridge.answers.file import AnswersFile
from bridge.answers.read import read_view
from bridge.questionset.load import LoadError, parse_json, validate_model
from bridge.questionset.model import QuestionSet
from bridge.questionset.setdir import questions_data


class ReadError(Exception):
    """The set folder, its questions.json or its answers.json can't be read at all."""

    def __init__(self, message: str, *, in_answers: bool = False):
        super().__init__(message)
        self.message = message
        # answers.json breaks the format: never a file caught mid-write
        # (its writers only rename a whole one in), so no later look mends it.
        self.in_answers = in_answers


def load_view(set_dir: Path, *, include_all: bool, warn: Callable[[str], None] | None = None) -> dict[str, Any]:
    """What ``read`` prints, as a value.  ``warn`` hears why questions.json
    could not be modelled (the answers are listed anyway); ReadError when
    nothing can be read."""
    try:
        raw = _questions_raw(set_dir)
        qset = _model_or_warn(raw, warn)
        set_id = qset.id if qset else (raw.get("id") if isinstance(raw.get("id"), str) and raw["id"] else None)
        doc = AnswersFile(set_dir, set_id).load()
    except _Unreadable as exc:
        raise ReadError(str(exc)) from None
    except AnswersError as exc:
        raise ReadError(exc.message, in_answers=True) from None
    except OSError as exc:
        raise ReadError(f"cannot read {exc.filename or set_dir}: {exc.strerror or exc}") from None
    return read_view(doc, qset, os.path.abspath(set_dir), include_all=include_all)


class _Unreadable(Exception):
    pass


def _questions_raw(set_dir: Path) -> dict[str, Any]:
    if not set_dir.is_dir():
        raise _Unreadable(f"no set folder at {set_dir}")
    path = set_dir / "questions.json"
    try:
        # (A FIFO under the name held every reader; one past 16 MB is no set,
        # never posted, and a wait for one of its questions waited for ever.)
        data = questions_data(path)
    except FileNotFoundError:
        raise _Unreadable(f"no questions.json in {set_dir}") from None
    except OSError as exc:
        raise _Unreadable(f"cannot read {path}: {exc.strerror or exc}") from None
    except LoadError as exc:
        raise _Unreadable(exc.message) from None
    try:
        return parse_json(data)
    except LoadError as exc:
        raise _Unreadable(f"{path}: {exc.message}") from None


def _model_or_warn(raw: dict[str, Any], warn: Callable[[str], None] | None) -> QuestionSet | None:
    """The model, or None with a warning.

    The answers are the person's and still readable when the agent has
    since broken questions.json, so read prints them rather than failing,
    with status "unknown" and current_rev/stale null; the warning (on
    stderr: stdout keeps the exact shape) says why.
    """
    qset, findings = validate_model(raw)
    if qset is None and warn is not None:
        first = findings[0] if findings else None
        detail = f" ({first.where}: {first.message})" if first else ""
        more = f" and {len(findings) - 1} more" if len(findings) > 1 else ""
        warn(f"questions.json does not fit the format{detail}{more}; answers are listed with status unknown")
    return qset
