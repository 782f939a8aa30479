"""``askwright-bridge read SET_DIR [--all]``: print a set's answers as JSON.

Exit 0 with the answers (zero of them when nothing is answered yet); exit 2
with one line on stderr when the set folder, its questions.json or its
answers.json cannot be read at all.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from bridge.answers.document import AnswersError
from bridge.answers.file import AnswersFile
from bridge.answers.read import read_view
from bridge.questionset.load import LoadError, parse_json, validate_model
from bridge.questionset.model import QuestionSet

EXIT_OK = 0
EXIT_UNREADABLE = 2


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "read",
        help="print a set's answers as JSON",
        description="Print the answers in a set folder's answers.json, checked against its current questions.json.",
    )
    parser.add_argument("set_dir", metavar="SET_DIR", help="the set folder (holds questions.json)")
    parser.add_argument(
        "--all",
        dest="include_all",
        action="store_true",
        help="also list every question without an answer (state unanswered)",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    set_dir = Path(args.set_dir)
    try:
        raw = _questions_raw(set_dir)
        qset = _model_or_warn(raw)
        set_id = qset.id if qset else (raw.get("id") if isinstance(raw.get("id"), str) and raw["id"] else None)
        doc = AnswersFile(set_dir, set_id).load()
    except _Unreadable as exc:
        return _fail(str(exc))
    except AnswersError as exc:
        return _fail(exc.message)
    except OSError as exc:
        return _fail(f"cannot read {exc.filename or set_dir}: {exc.strerror or exc}")

    view = read_view(doc, qset, os.path.abspath(set_dir), include_all=args.include_all)
    sys.stdout.write(json.dumps(view, indent=2, ensure_ascii=False) + "\n")
    return EXIT_OK


class _Unreadable(Exception):
    pass


def _questions_raw(set_dir: Path) -> dict[str, Any]:
    if not set_dir.is_dir():
        raise _Unreadable(f"no set folder at {set_dir}")
    path = set_dir / "questions.json"
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise _Unreadable(f"no questions.json in {set_dir}") from None
    except OSError as exc:
        raise _Unreadable(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        return parse_json(data)
    except LoadError as exc:
        raise _Unreadable(f"{path}: {exc.message}") from None


def _model_or_warn(raw: dict[str, Any]) -> QuestionSet | None:
    """The model, or None with a warning.

    The answers are the person's and still readable when the agent has
    since broken questions.json, so read prints them rather than failing,
    with status "unknown" and current_rev/stale null; the warning on stderr
    (stdout keeps the exact shape) says why.
    """
    qset, findings = validate_model(raw)
    if qset is None:
        first = findings[0] if findings else None
        detail = f" ({first.where}: {first.message})" if first else ""
        more = f" and {len(findings) - 1} more" if len(findings) > 1 else ""
        print(
            f"askwright-bridge read: warning: questions.json does not fit the format{detail}{more}; "
            "answers are listed with status unknown",
            file=sys.stderr,
        )
    return qset


def _fail(message: str) -> int:
    # One line, whatever the message held.
    print(f"askwright-bridge read: {' '.join(message.split())}", file=sys.stderr)
    return EXIT_UNREADABLE
