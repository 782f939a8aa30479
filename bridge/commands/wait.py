"""``askwright-bridge wait SET_DIR [--question QID ...] [--until answered|all]
[--timeout SECONDS] [--all]``: block until the answers asked for are in
``answers.json``, then print what ``read`` prints.

The folder is watched (inotify and the like, through watchfiles), not
polled: the files are read once at the start and again only when
``answers.json`` or ``questions.json`` changes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from watchfiles import watch

# The predicates live in answers.arrival (pure, shared with the agents' wait); re-exported here.
from bridge.answers.arrival import UNTIL_ALL, UNTIL_ANSWERED, arrived, as_read, expired_in, in_the_set, unanswerable
from bridge.answers.file import ANSWERS_NAME
from bridge.answers.view import ReadError, load_view
from bridge.commands.read import render
from bridge.questionset.setdir import QUESTIONS_FILE

EXIT_ARRIVED = 0
EXIT_UNREADABLE = 2
EXIT_TIMEOUT = 3
EXIT_EXPIRED = 4  # PROTOCOL 2a: an awaited question expired undecided

# The watcher wakes this often even when nothing changes, only to notice the
# deadline (and, once, a write that landed before it started watching).
TICK_MS = 500

_EPILOG = """\
what counts as arrived:
  an answer is a record in state "answered" (a pick) for the question's
  current revision.  "unsure" and note-only records are not answers here
  (use `read` to see them), nor is a stale record answering an older
  revision: after a question is revised, wait waits for the new answer.

  --question QID                that question has an answer (given more than
                                once: every question named has one)
  --until answered (default)    with --question: as above; without: at least
                                one open question has an answer (answers that
                                were already there count: it returns at once)
  --until all                   every open question has an answer (returns at
                                once when no question is open; a show_if
                                question its condition ruled out is not
                                waited for); not combined with --question

output and exit codes:
  prints exactly what `read SET_DIR [--all]` prints, when the answers arrived
  (exit 0) and also on timeout (exit 3) so the current state is in hand;
  exit 2 when the set can't be read or QID is not in questions.json, and
  (printing the state) when what is awaited can get no answer: QID closed,
  withdrawn or superseded, or no question of the set open;
  exit 4 when a question waited for expired undecided (its state shows
  `expired`: never an approval, whatever votes it lists).
"""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "wait",
        help="block until answers arrive, then print what read prints",
        description="Block until the answers named have arrived in a set folder's answers.json, then print "
                    "them exactly as `read` does.  The folder is watched, not polled.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("set_dir", metavar="SET_DIR", help="the set folder (holds questions.json)")
    parser.add_argument("--question", metavar="QID", action="append",
                        help="wait for this question's answer (more than once: for each one's)")
    parser.add_argument("--until", choices=[UNTIL_ANSWERED, UNTIL_ALL], default=UNTIL_ANSWERED,
                        help="answered: the question (or any open question) has an answer; "
                             "all: every open question has one (default: answered)")
    parser.add_argument("--timeout", type=_seconds, default=None, metavar="SECONDS",
                        help="give up after this many seconds with exit 3 (default: wait as long as it takes)")
    parser.add_argument("--all", dest="include_all", action="store_true",
                        help="print like `read --all`: also every question without an answer")
    return parser


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if value != value:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}")
    if value < 0:
        raise argparse.ArgumentTypeError("the timeout can't be negative")
    return value


# -- the command -------------------------------------------------------------------


@dataclass(frozen=True)
class Awaited:
    """What is waited for: ``questions`` (each must get its answer; none: any
    open question, or every one with ``until`` all), over ``arrival``'s
    predicates of one question each."""

    questions: tuple[str, ...]
    until: str

    def _each(self) -> tuple[str | None, ...]:
        return self.questions or (None,)

    def arrived(self, view: dict[str, Any]) -> bool:
        return all(arrived(view, q, self.until) for q in self._each())

    def unanswerable(self, view: dict[str, Any]) -> str | None:
        return next((why for q in self._each() if not arrived(view, q, self.until)
                     and (why := unanswerable(view, q, self.until))), None)

    def expired(self, view: dict[str, Any]) -> bool:
        return any(expired_in(view, q, self.until) for q in self._each())

    def missing(self, view: dict[str, Any]) -> str | None:
        return next((q for q in self.questions if not in_the_set(view, q)), None)


def run(args: argparse.Namespace) -> int:
    awaited = Awaited(tuple(dict.fromkeys(args.question or ())), args.until)
    if awaited.questions and args.until == UNTIL_ALL:
        return _fail("--until all waits for every open question; leave out --question")
    set_dir = Path(args.set_dir)
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    view: dict[str, Any] | None = None
    try:
        view = load_view(set_dir, include_all=True, warn=_warn)
    except ReadError as exc:
        if exc.in_answers or not (set_dir / QUESTIONS_FILE).is_file():
            return _fail(exc.message)
        # There, and perhaps caught mid-write by its writer (questions.json is
        # the agent's, written any way it likes): read again on its changes
        # for a moment.  Still unreadable then, it is so (it waited for ever).
        grace = time.monotonic() + UNREADABLE_SECONDS
        try:
            view, _done = _watch(set_dir, None, awaited, grace if deadline is None else min(deadline, grace))
        except (FileNotFoundError, ReadError):
            view = None
        if view is None:
            return _fail(exc.message)
    if (missing := awaited.missing(view)) is not None:
        return _fail(f"no question {missing!r} in {set_dir / QUESTIONS_FILE}")

    done = awaited.arrived(view)
    why = None if done else awaited.unanswerable(view)
    if not done and why is None and (deadline is None or time.monotonic() < deadline):
        try:
            view, done = _watch(set_dir, view, awaited, deadline)
        except FileNotFoundError:
            return _fail(f"the set folder {set_dir} was removed while waiting")
        except ReadError as exc:  # answers.json replaced by one that breaks the format
            return _fail(exc.message)
        why = None if done else awaited.unanswerable(view)
    sys.stdout.write(render(as_read(view, args.include_all)))
    if why is not None:
        return _fail(why)
    if done and awaited.expired(view):
        return EXIT_EXPIRED
    return EXIT_ARRIVED if done else EXIT_TIMEOUT


def _watch(set_dir: Path, view: dict[str, Any] | None, awaited: Awaited,
           deadline: float | None) -> tuple[dict[str, Any] | None, bool]:
    """Re-read on every change of answers.json or questions.json until the
    answers arrive or the deadline passes; the latest good view and whether
    it is done.  A file caught mid-rewrite by its writer (questions.json is
    the agent's, written any way it likes) is read again on its next change.
    A set folder replaced by another of its name is followed; one removed is
    FileNotFoundError; an answers.json that breaks the format, ReadError."""
    polling = False
    while True:
        try:
            found = _watch_folder(set_dir, _inode(set_dir), view, awaited, deadline, polling=polling)
        except (RuntimeError, OSError) as exc:
            if polling or not _out_of_watches(exc):
                raise
            # Every inotify instance the user may have is taken (hundreds of
            # waits, or other programs): the folder is looked at instead.
            _warn(f"no file watch left ({' '.join(str(exc).split())[:120]}); looking every "
                  f"{POLL_MS} ms instead (raise fs.inotify.max_user_instances to watch)")
            polling = True
            continue
        if found is not None:
            return found


# How long a questions.json that does not read at the start is read again
# (its writer may be mid-write) before the wait says it can't be read.
UNREADABLE_SECONDS = 2.0

# How often a wait with no file watch left looks at the folder.
POLL_MS = 300


def _out_of_watches(exc: BaseException) -> bool:
    """inotify refused: its instances (EMFILE) or its watches (ENOSPC) are used up."""
    said = str(exc)
    return "Too many open files" in said or "No space left on device" in said or "inotify" in said.lower()


# A folder gone for this long is removed, not being replaced (moved away, then another moved in).
GONE_SECONDS = 2.0


def _inode(set_dir: Path) -> int:
    """The folder's inode, waiting ``GONE_SECONDS`` for one to be there; FileNotFoundError after."""
    given_up = time.monotonic() + GONE_SECONDS
    while True:
        try:
            return os.stat(set_dir).st_ino
        except FileNotFoundError:
            if time.monotonic() >= given_up:
                raise
            time.sleep(0.1)


def _watch_folder(set_dir: Path, inode: int, view: dict[str, Any] | None, awaited: Awaited,
                  deadline: float | None, polling: bool = False) -> tuple[dict[str, Any] | None, bool] | None:
    """``_watch`` on the folder that is ``inode``; None once another folder took its name."""
    names = {ANSWERS_NAME, QUESTIONS_FILE}
    first = True
    for changes in watch(set_dir, watch_filter=lambda _change, path: os.path.basename(path) in names,
                         debounce=200, step=20, rust_timeout=TICK_MS, yield_on_timeout=True, recursive=False,
                         force_polling=polling, poll_delay_ms=POLL_MS):
        try:
            if os.stat(set_dir).st_ino != inode:
                return None  # another folder has its name now: watched instead
        except FileNotFoundError:
            return None  # gone, perhaps on its way to being replaced
        # The first wake-up always re-reads: a write between the first check
        # and the watcher starting would otherwise go unseen.
        if changes or first:
            first = False
            try:
                view = load_view(set_dir, include_all=True)
            except ReadError as exc:
                if exc.in_answers:
                    raise
            else:
                if awaited.arrived(view):
                    return view, True
                if awaited.unanswerable(view):
                    return view, False  # (closed meanwhile: ``run`` says so)
        if deadline is not None and time.monotonic() >= deadline:
            break
    return view, False


def _warn(message: str) -> None:
    print(f"askwright-bridge wait: warning: {message}", file=sys.stderr)


def _fail(message: str) -> int:
    print(f"askwright-bridge wait: {' '.join(message.split())}", file=sys.stderr)
    return EXIT_UNREADABLE
