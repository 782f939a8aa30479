"""``askwright-bridge read SET_DIR [--all]``: print a set's answers as JSON.

Exit 0 with the answers (zero of them when nothing is answered yet); exit 2
with one line on stderr when the set folder, its questions.json or its
answers.json cannot be read at all.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bridge.answers.view import ReadError, load_view

__all__ = ["ReadError", "load_view", "render", "run", "add_parser"]

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
    try:
        view = load_view(Path(args.set_dir), include_all=args.include_all, warn=_warn)
    except ReadError as exc:
        return _fail(exc.message)
    sys.stdout.write(render(view))
    return EXIT_OK


def render(view: dict[str, Any]) -> str:
    return json.dumps(view, indent=2, ensure_ascii=False) + "\n"


def _warn(message: str) -> None:
    print(f"askwright-bridge read: warning: {message}", file=sys.stderr)


def _fail(message: str) -> int:
    # One line, whatever the message held.
    print(f"askwright-bridge read: {' '.join(message.split())}", file=sys.stderr)
    return EXIT_UNREADABLE
