"""``askwright-bridge lint SET_DIR [--json] [--no-probe] [-c CONFIG]``: check a question set.

SET_DIR may also be a sets root (a folder without questions.json holding
sets): every set under it is checked, and a second folder under a set id
another folder already has is an error naming both (the bridge refuses it).

With the bridge's config, the set is also checked against what the bridge
posted (its store, opened read-only): a question whose rev is lower than
one already posted is a warning ("rev went back"); and against the
config's ``answerers``: a quorum more than the people allowed to answer
could meet is an error, as the bridge refuses to post it.

Exit status: 0 no error (warnings allowed), 1 errors, 2 the folder or file
can't be read or isn't a JSON object, or the config or store can't be used.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path

from bridge.questionset.lint import LintResult
from bridge.questionset.load import Finding, LoadError
from bridge.questionset.setdir import load_set_dir
from bridge.service.posting.sets import QUESTIONS, discover, duplicate_set_message

EXIT_OK = 0
EXIT_ERRORS = 1
EXIT_UNREADABLE = 2


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "lint",
        help="check a question set against the askwright format",
        description="Check a set folder's questions.json against every rule of the askwright format.",
    )
    parser.add_argument("set_dir", metavar="SET_DIR", help="the set folder (or its questions.json)")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    parser.add_argument("--no-probe", action="store_true", help="skip the video codec check (ffprobe)")
    parser.add_argument("-c", "--config", help="the bridge's YAML config: also check revs against what it posted, "
                             "and quorums against its answerers")
    return parser


def run(args: argparse.Namespace) -> int:
    revs: Mapping[str, Mapping[str, int]] = {}
    answerers: list[str] = []
    if getattr(args, "config", None):
        revs, answerers, problem = _from_the_bridge(args.config)
        if problem is not None:
            return _unreadable(" ".join(problem.split()), as_json=args.json)
    root = Path(args.set_dir)
    if root.is_dir() and not (root / QUESTIONS).exists():
        sets = discover(root)
        if sets:
            return _run_root(sets, args, revs, answerers)
    try:
        result = load_set_dir(args.set_dir, probe=not args.no_probe, posted_revs=revs, answerers=answerers)
    except LoadError as exc:
        return _unreadable(exc.message, as_json=args.json)
    if args.json:
        _write(sys.stdout, json.dumps(result.as_dict(), indent=2) + "\n")
    else:
        _write(sys.stdout, render(result))
    return EXIT_OK if result.ok else EXIT_ERRORS


def _run_root(sets: list[Path], args: argparse.Namespace, revs: Mapping[str, Mapping[str, int]],
              answerers: list[str]) -> int:
    """Every set under a root; the first folder found under a set id keeps it."""
    results: list[tuple[Path, LintResult | None, str | None]] = []
    owners: dict[str, Path] = {}
    for set_dir in sets:
        try:
            result = load_set_dir(set_dir, probe=not args.no_probe, posted_revs=revs, answerers=answerers)
        except LoadError as exc:
            results.append((set_dir, None, exc.message))
            continue
        if result.set_id is not None:
            owner = owners.setdefault(result.set_id, set_dir)
            if owner != set_dir:
                result.errors.append(Finding("id", duplicate_set_message(result.set_id, str(owner.resolve()),
                                                                         str(set_dir.resolve()))))
        results.append((set_dir, result, None))
    if args.json:
        document = {"ok": all(r is not None and r.ok for _d, r, _m in results), "sets": [
            {"set_dir": str(d), **(r.as_dict() if r is not None else
                                   {"ok": False, "set": None, "errors": [{"where": "questions.json", "message": m}],
                                    "warnings": []})} for d, r, m in results]}
        _write(sys.stdout, json.dumps(document, indent=2) + "\n")
    else:
        for set_dir, result, message in results:
            _write(sys.stdout, f"{set_dir}:\n")
            _write(sys.stdout, render(result) if result is not None else f"  error    questions.json: {message}\n")
    if any(r is None for _d, r, _m in results):
        return EXIT_UNREADABLE
    return EXIT_OK if all(r.ok for _d, r, _m in results) else EXIT_ERRORS


def _from_the_bridge(config_path: str) -> tuple[Mapping[str, Mapping[str, int]], list[str], str | None]:
    """The highest rev posted per question, per set folder, from the bridge's
    store (read-only: safe while the bridge runs; none before it first ran),
    and the bridge's ``answerers``; or why they can't be read.  The config and store code are imported only
    here: lint without a config stays quick for agents that run it often."""
    import sqlite3

    from bridge.service.config import ConfigError, load_config
    from bridge.service.storage.store import Store, StoreVersionError

    try:
        config = load_config(config_path, secrets=False)
    except ConfigError as exc:
        return {}, [], str(exc)
    section, answerers = config.store, list(config.answerers)
    try:
        store = Store.read_only(section.path, url=section.url, password=section.password)
    except FileNotFoundError:
        return {}, answerers, None  # the bridge has not run yet: nothing posted
    except StoreVersionError as exc:
        return {}, [], str(exc)
    except sqlite3.Error as exc:
        return {}, [], f"{section.where}: the store can't be read ({exc})"
    try:
        return store.highest_posted_revs(), answerers, None
    except sqlite3.Error as exc:
        return {}, [], f"{section.where}: the store can't be read ({exc})"
    finally:
        store.close()


def _unreadable(message: str, *, as_json: bool) -> int:
    if as_json:
        document = {"ok": False, "set": None, "errors": [{"where": "questions.json", "message": message}], "warnings": []}
        _write(sys.stdout, json.dumps(document, indent=2) + "\n")
    else:
        _write(sys.stderr, f"askwright-bridge lint: {message}\n")
    return EXIT_UNREADABLE


def render(result: LintResult) -> str:
    """The readable listing: a summary line, then one line per finding."""
    name = result.set_id if result.set_id is not None else "(set without an id)"
    if not result.errors and not result.warnings:
        return f"{name}: ok, no errors and no warnings\n"
    lines = [f"{name}: {_count(len(result.errors), 'error')}, {_count(len(result.warnings), 'warning')}"]
    lines += [_line("error", f) for f in result.errors]
    lines += [_line("warning", f) for f in result.warnings]
    return "\n".join(lines) + "\n"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _line(level: str, finding: Finding) -> str:
    # One finding per line, whatever control characters the set's values hold.
    text = f"  {level:<7}  {finding.where}: {finding.message}"
    return re.sub(r"[\x00-\x08\x0b-\x1f\x7f\n\r]", lambda m: f"\\x{ord(m.group()):02x}", text)


_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _write(stream: object, text: str) -> None:
    """Write text that may carry lone surrogates (JSON allows them) or characters the terminal can't show.

    JSON output is ASCII already (escaped by json.dumps), so this only ever
    changes the readable listing.
    """
    text = _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    encoding = getattr(stream, "encoding", None) or "utf-8"
    text = text.encode(encoding, "backslashreplace").decode(encoding, "replace")
    stream.write(text)  # type: ignore[attr-defined]
