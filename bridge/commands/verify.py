"""``askwright-bridge verify SET_DIR --log DIR [--checkpoint FILE...]``: check a set against the answer log.

Offline, trusting nothing the bridge says: every record in the set's
``answers.json`` against its leaf, every leaf's inclusion under the latest
checkpoint, each checkpoint's signature with the log's key (``DIR/key.txt``,
or ``--key``), and the consistency of every earlier checkpoint given (those
exported, the ones in ``--checkpoint`` files: saved by an agent, or read
from the room) with the latest.  ``--room -c CONFIG`` adds the checkpoints
the bridge's rooms hold in their state history.

Exit 0 when all holds; 1 when something does not (each mismatch named: the
record, the index, what differs); 2 when an input can't be read.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

from bridge import strictjson
from bridge.protocol.deadline import format_rfc3339

EXIT_OK, EXIT_MISMATCH, EXIT_UNREADABLE = 0, 1, 2


class Unreadable(Exception):
    pass


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "verify", help="check a set's answers.json against the answer log (offline)",
        description="Check every record of SET_DIR/answers.json against its leaf in the exported log (DIR from "
                    "'audit export'), every leaf under the latest checkpoint, each checkpoint's signature and the "
                    "consistency of every earlier checkpoint with the latest.  Exit 0 all holds, 1 something does "
                    "not (each named), 2 an input can't be read.")
    parser.add_argument("set_dir", help="the set folder (its answers.json)")
    parser.add_argument("--log", required=True, help="the folder 'askwright-bridge audit export' wrote")
    parser.add_argument("--checkpoint", action="append", default=[],
                        help="an earlier checkpoint (a signed note, or the room's state event JSON); repeatable")
    parser.add_argument("--key", help="the log's verifier key (default: DIR/key.txt)")
    parser.add_argument("--room", action="store_true", help="also the checkpoints the rooms hold (needs -c)")
    parser.add_argument("-c", "--config", help="the bridge's YAML config file (for --room)")
    return parser


def run(args: argparse.Namespace) -> int:
    from bridge.protocol import audit_verify, checkpoint as cp, roomnotes

    try:
        answers = Path(args.set_dir) / "answers.json"
        doc, twice = _loads(_text(answers), answers, audit_verify.read_answers)
        # Which questions need a quorum: the set's own words (a record may drop its votes).
        asked = Path(args.set_dir) / "questions.json"
        questions = _questions(asked) if asked.exists() else None
        leaves = read_leaves(Path(args.log) / "leaves.jsonl")
        vkey = args.key or _text(Path(args.log) / "key.txt").strip()
        try:
            origin, public = cp.parse_verifier_key(vkey)
        except cp.NoteError as exc:
            raise Unreadable(f"the log's key: {exc}") from None
        notes = [_text(p) for p in sorted((Path(args.log) / "checkpoints").glob("*.txt"))]
        # Checkpoints from elsewhere may be newer than the export (the bridge runs on).
        later = [_checkpoint_file(Path(p)) for p in args.checkpoint]
        room = _room_checkpoints(args.config, origin, public) if args.room else roomnotes.Taken()
    except Unreadable as exc:
        print(f"askwright-bridge verify: {exc}", file=sys.stderr)
        return EXIT_UNREADABLE
    verdict = audit_verify.verify_set(doc, leaves, notes, origin, public, questions, later + room.later)
    verdict.problems[:0] = twice
    verdict.problems += room.problems
    for problem in verdict.problems:
        print(problem)
    if verdict.before_the_log:
        print(f"note: {len(verdict.before_the_log)} record(s) answered before the log began "
              f"({_when(verdict.log_began_ms)}), which the log does not cover: "
              f"{', '.join(verdict.before_the_log[:20])}{' …' if len(verdict.before_the_log) > 20 else ''}")
    for note in room.notes:
        print(f"note: {note}")
    if verdict.newer:
        print(f"note: {len(verdict.newer)} checkpoint(s) given are newer than the export (up to size "
              f"{max(verdict.newer)}; the export holds {verdict.leaves} leaves): the answers logged since are not "
              "checked here; export again to check them")
    summary = (f"{verdict.checked_records} records, {verdict.leaves} leaves, latest checkpoint "
               f"{verdict.checkpoint_size}, {verdict.earlier_checkpoints} earlier checkpoints")
    print(f"all holds: {summary}" if verdict.holds else f"{len(verdict.problems)} problem(s): {summary}")
    uncovered = verdict.leaves - (verdict.checkpoint_size or 0)
    if verdict.checkpoint_size is not None and uncovered > 0 and not verdict.truncated:
        # (After the verdict: what no signature covers is not checked, for or against.)
        print(f"note: the last {uncovered} leaves are under no checkpoint: no signature covers them, and they are "
              "not checked here (an answer logged since the latest checkpoint; 'audit export' signs them where the "
              "log's key is)")
    if verdict.holds:
        return EXIT_OK
    return EXIT_UNREADABLE if verdict.truncated else EXIT_MISMATCH


def _when(ms: int | None) -> str:
    if ms is None:
        return "it has no leaf yet"
    return "its first leaf at " + format_rfc3339(ms)


def read_leaves(path: Path) -> list[bytes]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise Unreadable(f"{path}: can't be read ({exc.strerror or exc})") from None
    if data and not data.endswith(b"\n"):
        raise Unreadable(f"{path}: truncated (its last line is not whole)")
    return data.split(b"\n")[:-1] if data else []


def _text(path: Path) -> str:
    """The file's text as written: read_text's newline translation turned a
    CRLF checkpoint into one that verified, which C2SP's readers refuse."""
    try:
        return path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise Unreadable(f"{path}: can't be read ({getattr(exc, 'strerror', None) or exc})") from None


def _questions(path: Path) -> Any:
    """The set's questions.json, read as the bridge reads it (a byte-order mark an editor wrote is passed over)."""
    from bridge.questionset.load import LoadError, parse_json

    try:
        return parse_json(_text(path))
    except LoadError as exc:
        raise Unreadable(f"{path}: {exc.message}") from None


def _loads(text: str, path: Path, parse: Callable[[str], Any] | None = None) -> Any:
    """``text`` (of ``path``) as JSON, by ``parse`` if given; Unreadable when it is none."""
    try:
        if parse is not None:
            return parse(text)
        return strictjson.loads(text, utf8_only=False)  # (a record holding half a surrogate pair is named)
    except ValueError as exc:
        raise Unreadable(f"{path}: not JSON ({exc})") from None
    except RecursionError:
        raise Unreadable(f"{path}: not JSON this reader takes (nested too deep)") from None


def _checkpoint_file(path: Path) -> str:
    """A signed note, or the room's state event (its content, or the whole event) holding one."""
    text = _text(path)
    if text.lstrip().startswith("{"):
        value = _loads(text, path)
        content = value.get("content", value) if isinstance(value, dict) else None
        note = content.get("checkpoint") if isinstance(content, dict) else None
        if not isinstance(note, str):
            raise Unreadable(f"{path}: holds no checkpoint")
        return note
    return text


def _room_checkpoints(config_path: str | None, origin: str, public: bytes) -> Any:
    if not config_path:
        raise Unreadable("--room needs -c CONFIG (the bridge's rooms and credentials)")
    import asyncio

    from bridge.protocol.roomnotes import take
    from bridge.service.auditing.roomstate import read_room_checkpoints
    from bridge.service.config import ConfigError, load_config

    try:
        config = load_config(config_path)
    except ConfigError as exc:
        raise Unreadable(str(exc)) from None
    try:
        user, events = asyncio.run(read_room_checkpoints(config, on_cut=lambda room, read: print(
            f"note: room {room}: only its newest {read} checkpoints were read; older ones are not checked",
            file=sys.stderr)))
    except Exception as exc:  # noqa: BLE001 - the homeserver or the room can't be read: an input unreadable
        raise Unreadable(f"the rooms' checkpoints can't be read ({exc})") from None
    return take(events, user, origin, public)
