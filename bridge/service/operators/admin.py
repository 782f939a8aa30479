"""Management commands, given in a room or a direct message with the bridge:

    !ask help                   what the commands are
    !ask status                 how every set stands (as `askwright-bridge status`)
    !ask post <set>             re-read a set now and post what is not posted yet
    !ask close <set> <question> close a question: its status in questions.json becomes "closed"
    !ask remind <set>           nudge every unanswered open question of a set now

Only the users in the config's ``admins`` may give them; anyone else is told
so.  ``parse_command`` and ``handle`` are the policy (unit-tested without a
homeserver); ``AdminDispatcher`` picks commands out of the event stream and
answers them in the background, each at most once (the store remembers).

``close`` edits the set's questions.json (atomically) rather than the store:
the agent's file stays the one truth about which questions are open, and
the bridge's folder watcher then closes the question in the room exactly as
if the agent had closed it.  questions.json has no writer lock; an agent
rewriting the file from an old copy at the same moment would reopen it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bridge.protocol.outcome import in_thread_reply, txn_id
from bridge.questionset.load import LoadError
from bridge.questionset.setdir import QUESTIONS_FILE, questions_bytes, read_questions
from bridge.service.storage.heldback import format_held, held_back
from bridge.service.storage.store import Store
from bridge.service.storage.storethread import loop_side
from bridge.service.supervisor import format_tasks
from bridge.service.transport.matrix import MatrixError
from bridge.wholefile import replace_whole

log = logging.getLogger(__name__)

PREFIX = "!ask"
HELP = "help"
STATUS = "status"
POST = "post"
CLOSE = "close"
REMIND = "remind"
INVALID = "invalid"

# verb -> (argument names, what it does)
USAGE: dict[str, tuple[tuple[str, ...], str]] = {
    HELP: ((), "this list"),
    STATUS: ((), "how every set stands: posted, open, answered, unsure, notes, pending, expired, stale"),
    POST: (("<set>",), "re-read a set now and post its questions not posted yet"),
    CLOSE: (("<set>", "<question>"), "close a question (its status in questions.json becomes closed)"),
    REMIND: (("<set>",), "nudge every unanswered open question of a set now"),
}

# How soon a reply that could not be sent (the homeserver away) is tried again.
RETRY_SECONDS = 5.0
# Someone who may not give commands is told so once in this while (per
# room): thirty "!ask" from one member made thirty refusals, each spending
# the bot's rate with the homeserver ahead of the answers' words.
STRANGER_TOLD_EVERY = 600.0

# Commands older than this when they reach the bridge are history (a first
# sync's timeline, a long outage), not requests to act on now.
MAX_COMMAND_AGE_MS = 10 * 60 * 1000


@dataclass(frozen=True)
class Command:
    verb: str  # help | status | post | close | remind | invalid
    set_id: str | None = None
    qid: str | None = None
    problem: str | None = None  # for ``invalid``: what is wrong with it


def parse_command(body: Any) -> Command | None:
    """The command in a message body; None when the body is not one at all.

    The first line that is not a reply's quoted fallback ("> ...") is the
    command; ``!ask`` is matched without regard to case.  A ``!ask`` line
    that asks for something unknown, or with the wrong arguments, is an
    ``invalid`` command, so the sender learns the right form.
    """
    if not isinstance(body, str):
        return None
    line = next((ln for ln in body.splitlines() if ln.strip() and not ln.lstrip().startswith(">")), "")
    words = line.split()
    if not words or words[0].lower() != PREFIX:
        return None
    if len(words) == 1:
        return Command(HELP)
    verb, args = words[1].lower(), words[2:]
    if verb not in USAGE:
        return Command(INVALID, problem=f"there is no command “{words[1]}”.")
    names, _what = USAGE[verb]
    if len(args) != len(names):
        return Command(INVALID, problem=f"the form is “{_form(verb)}”.")
    args = [_unquoted(arg) for arg in args]
    return Command(verb, set_id=args[0] if args else None, qid=args[1] if len(args) > 1 else None)


# Marks a client puts around a name typed as code or quoted: Element's
# composer sends `release` as the body when the admin formats it as code.
_QUOTES = {"`": "`", '"': '"', "'": "'", "“": "”", "‘": "’"}


def _unquoted(word: str) -> str:
    """``word`` without one pair of quotes or backticks around it."""
    close = _QUOTES.get(word[:1])
    if close is not None and len(word) > 2 and word.endswith(close):
        return word[1:-1]
    return word


def is_command(event: Any) -> bool:
    """A room message holding a ``!ask`` command: the pipeline must not read
    it as an answer (a reply in a question's thread would otherwise be one)."""
    if not isinstance(event, dict) or event.get("type") != "m.room.message":
        return False
    content = event.get("content")
    return isinstance(content, dict) and parse_command(content.get("body")) is not None


# -- answering a command ------------------------------------------------------------


@dataclass
class AdminContext:
    """What the commands need from the running bridge."""

    admins: frozenset[str]
    sets_root: Path
    store: Store
    # Re-read one set folder and post what is due; returns a sentence for the admin.
    post_set: Callable[[Path], Awaitable[str]]
    # Nudge the set's unanswered open questions now; returns how many were nudged.
    remind_set: Callable[[str], Awaitable[int]]
    # The supervisor's tasks (``Supervisor.view``): status lists those that failed.
    tasks: Callable[[], dict[str, dict[str, Any]]] | None = None


async def handle(command: Command, sender: str, ctx: AdminContext) -> str:
    """The reply to ``command`` from ``sender``."""
    if sender not in ctx.admins:
        return "Sorry, only the bridge's admins can give it commands."
    if command.verb == INVALID:
        return f"I did not understand that: {command.problem} Send “!ask help” for the list."
    if command.verb == HELP:
        return help_text()
    # Set status reads every set's files and lints them: loaded on the first
    # command, not with the bridge.
    from bridge.service.operators.setstatus import collect, find_set, format_table, set_id_of

    if command.verb == STATUS:
        # The store read on its thread, the sets' files read and linted on
        # another: with the database far away or many sets, /health and the
        # rooms are served meanwhile.
        counts, revs, held = await ctx.store.run(lambda: (ctx.store.posted_question_counts(),
                                                          ctx.store.highest_posted_revs(), held_back(ctx.store)))
        table = format_table(await asyncio.to_thread(collect, ctx.sets_root, counts, revs))
        troubled = format_tasks(ctx.tasks(), troubled_only=True) if ctx.tasks is not None else ""
        return within_one_message((table + format_held(held) + troubled).rstrip("\n"))
    # The sets' files read off the event loop, as status reads them.
    posted = await ctx.store.run(ctx.store.folders_of_set, command.set_id or "")
    set_dir = await asyncio.to_thread(find_set, ctx.sets_root, command.set_id or "", posted)
    if set_dir is None:
        return f"There is no set “{command.set_id}” in the bridge's sets folder."
    if command.verb == POST:
        return await ctx.post_set(set_dir)
    if command.verb == CLOSE:
        return await asyncio.to_thread(close_in_file, set_dir, command.qid or "")
    if command.verb == REMIND:
        set_id = await asyncio.to_thread(set_id_of, set_dir)
        sent = await ctx.remind_set(set_id)
        if sent == 0 and not await ctx.store.run(ctx.store.open_posted, set_id):
            # Not "every question answered": none is asked in a room (its room
            # refuses the bot, it fails lint, it is all closed).
            return f"Nothing to remind about: no question of “{command.set_id}” is open in a room now " \
                   "(“!ask status” says how the set stands)."
        if sent == 0:
            return f"Nothing to remind about: every open question of “{command.set_id}” has an answer."
        return f"Sent {sent} reminder{'s' if sent != 1 else ''} for “{command.set_id}”."
    return help_text()


def help_text() -> str:
    lines = ["askwright-bridge commands:"]
    lines += [f"  {_form(verb)} — {what}" for verb, (_names, what) in USAGE.items()]
    return "\n".join(lines)


def _form(verb: str) -> str:
    return " ".join([PREFIX, verb, *USAGE[verb][0]])


def close_in_file(set_dir: Path, qid: str) -> str:
    """Set the question's status to "closed" in questions.json (atomically,
    every other byte of meaning kept); the bridge's watcher does the rest."""
    path = set_dir / QUESTIONS_FILE
    try:
        raw = read_questions(str(path))
    except LoadError as exc:
        return f"The set's questions.json can't be read: {exc.message}"
    questions = raw.get("questions")
    found = next((q for q in questions if isinstance(q, dict) and q.get("id") == qid), None) \
        if isinstance(questions, list) else None
    if found is None:
        return f"There is no question “{qid}” in {set_dir.name}/{QUESTIONS_FILE}."
    status = found.get("status", "open")
    if status != "open":
        return f"“{qid}” is already {status}."
    found["status"] = "closed"
    # Through a link, the file it names is the set's (the agent writes there):
    # replacing the link with a copy left that file open and the set deaf to it.
    real = Path(os.path.realpath(path))
    if path.is_symlink() and not real.is_relative_to(os.path.realpath(set_dir)):
        return (f"{set_dir.name}/{QUESTIONS_FILE} is a link to a file outside the set folder; "
                "close the question there.")
    try:
        replace_whole(real, questions_bytes(raw))
    except OSError as exc:
        return f"questions.json could not be written: {exc.strerror or exc}"
    log.info("question closed by an admin: %s/%s", set_dir.name, qid)
    return f"Closed “{qid}” in {set_dir.name}/{QUESTIONS_FILE}; the bridge closes it in the room now."


def describe_post(report: Any) -> str:
    """A sentence about a poster's PostReport (posted / closed / broken)."""
    if report.broken:
        problems = "; ".join(p for errors in report.broken.values() for p in errors[:3])
        return f"The set was not posted: it fails lint ({problems})."
    parts = []
    if report.posted:
        parts.append(f"posted {len(report.posted)} question{'s' if len(report.posted) != 1 else ''}")
    if report.closed:
        parts.append(f"closed {len(report.closed)}")
    # A question its room can't take (too large for an encrypted room's events): the others are posted.
    refused = [message for messages in getattr(report, "refused", {}).values() for message in messages]
    if not parts and not refused:
        return "Nothing to post: every open question of the set is already in its room."
    sentence = ", ".join(parts) + "." if parts else ""
    if refused:
        sentence += (" " if sentence else "") + " ".join(f"{message}." for message in refused[:3])
    return sentence[0].upper() + sentence[1:]


def reply_content(text: str, in_reply_to: str, thread: str | None = None) -> dict[str, Any]:
    """The bridge's answer to a command: a notice replying to it (a table
    keeps its columns in a <pre>), in the thread the command was typed in
    (``thread``: its root), where its admin is looking."""
    # A status table names people (answerers, voters): it tells, it does not ping them.
    relates = in_thread_reply(thread, in_reply_to) if thread else {"m.in_reply_to": {"event_id": in_reply_to}}
    content: dict[str, Any] = {"msgtype": "m.notice", "body": text, "m.mentions": {}, "m.relates_to": relates}
    if "\n" in text:
        content["format"] = "org.matrix.custom.html"
        content["formatted_body"] = f"<pre><code>{_escape(text)}</code></pre>"
    return content


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# -- in the event stream ------------------------------------------------------------


@dataclass(frozen=True)
class _Pending:
    event_id: str
    room_id: str
    sender: str
    command: Command
    thread: str | None = None  # the root of the thread it was typed in


def _thread_of(event: dict[str, Any]) -> str | None:
    relates = event["content"].get("m.relates_to")
    if isinstance(relates, dict) and relates.get("rel_type") == "m.thread" and isinstance(relates.get("event_id"), str):
        return relates["event_id"]
    return None


class AdminDispatcher:
    """Takes ``!ask`` commands out of each batch (``collect``, synchronous and
    cheap, called from the pipeline) and answers them in the background
    (``run``), so a slow ``post`` never holds up answers."""

    def __init__(self, ctx: AdminContext, send: Callable[[str, str, dict[str, Any], str], Awaitable[str]],
                 own_user: Callable[[str], bool], clock: Callable[[], float] = time.time):
        self.ctx = ctx
        self.send = send
        self.own_user = own_user
        self.clock = clock
        self.queue: list[_Pending] = []
        # Replies worked out but not yet sent: a retry resends, never re-runs.
        self.replies: dict[str, str] = {}
        self.wake = asyncio.Event()
        # ``collect`` runs inside the pipeline's batch, a job on the store's thread.
        self._woken = loop_side(self.wake.set)
        self._stranger_told: dict[tuple[str, str], float] = {}  # (room, sender) -> when told

    def collect(self, events: Iterable[dict[str, Any]]) -> int:
        """Queue the commands in ``events``; returns how many were queued."""
        now_ms = int(self.clock() * 1000)
        queued = {p.event_id for p in self.queue}
        added = 0
        for event in events:
            # Typed commands only: a notice is a bot's (two bots answering
            # each other's notices loop), an emote is "/me ...", not an order.
            if not is_command(event) or event["content"].get("msgtype") != "m.text":
                continue
            event_id, room_id, sender = event.get("event_id"), event.get("room_id"), event.get("sender")
            if not (isinstance(event_id, str) and isinstance(room_id, str) and isinstance(sender, str)):
                continue
            if self.own_user(sender) or event_id in queued or self.ctx.store.command_handled(event_id):
                continue
            if _age_ms(event, now_ms) > MAX_COMMAND_AGE_MS:
                continue
            self.queue.append(_Pending(event_id, room_id, sender, parse_command(event["content"]["body"]),
                                       _thread_of(event)))
            queued.add(event_id)
            added += 1
        if added:
            self._woken()
        return added

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            waker = asyncio.ensure_future(self.wake.wait())
            stopper = asyncio.ensure_future(stop.wait())
            await asyncio.wait({waker, stopper}, return_when=asyncio.FIRST_COMPLETED,
                               timeout=RETRY_SECONDS if self.queue else None)
            waker.cancel()
            stopper.cancel()
            self.wake.clear()
            await self.drain()

    async def drain(self) -> int:
        """Answer every queued command.  One whose reply can't be sent now
        stays queued for the next wake-up, and so do the later ones in its
        room (in order); other rooms' go on.  One whose room refuses the
        bridge for good (kicked, made read-only) is dropped, said in the log:
        nothing behind it waits on a reply that can never go."""
        answered = 0
        waiting: set[str] = set()  # rooms whose reply could not be sent now
        for pending in list(self.queue):
            if pending.room_id in waiting:
                continue
            text = self.replies.get(pending.event_id)
            if text is None and self._told_lately(pending):
                log.info("command from %s, who may not give commands, not answered: told so lately", pending.sender)
                await self.ctx.store.run_written(self.ctx.store.mark_command, pending.event_id,
                                                 int(self.clock() * 1000))
                self.queue.remove(pending)
                continue
            if text is None:
                try:
                    text = await handle(pending.command, pending.sender, self.ctx)
                except Exception as exc:  # noqa: BLE001 - a failed command is reported, never fatal
                    log.exception("command %s from %s failed", pending.command.verb, pending.sender)
                    text = f"That did not work: {exc}"
                self.replies[pending.event_id] = text
            try:
                await self.send(pending.room_id, "m.room.message",
                                reply_content(text, pending.event_id, pending.thread), txn_id("admin", pending.event_id))
            except Exception as exc:  # noqa: BLE001 - the homeserver is away: try again later
                if not (isinstance(exc, MatrixError) and exc.permanent):
                    log.warning("reply to command %s not sent yet (%s)", pending.event_id, exc)
                    waiting.add(pending.room_id)
                    continue
                log.warning("reply to command %s dropped: %s can't be written to (%s)", pending.event_id,
                            pending.room_id, exc)
            else:
                log.info("command %s from %s answered", pending.command.verb, pending.sender)
                answered += 1
            await self.ctx.store.run_written(self.ctx.store.mark_command, pending.event_id, int(self.clock() * 1000))
            self.queue.remove(pending)
            self.replies.pop(pending.event_id, None)
        return answered

    def _told_lately(self, pending: _Pending) -> bool:
        """Whether ``pending`` is a stranger's, told lately that only admins
        may give commands (else the time of this telling is noted)."""
        if pending.sender in self.ctx.admins:
            return False
        key, now = (pending.room_id, pending.sender), self.clock()
        if now - self._stranger_told.get(key, float("-inf")) < STRANGER_TOLD_EVERY:
            return True
        self._stranger_told = {k: at for k, at in self._stranger_told.items() if now - at < STRANGER_TOLD_EVERY}
        self._stranger_told[key] = now
        return False


# What a reply may hold, in UTF-8 bytes: it goes as text and as HTML, and a
# Matrix event is at most 65,536 bytes.  With some 400 sets the status table
# passed it: the homeserver refused the reply and the admin heard nothing.
REPLY_BYTES = 24_000


def within_one_message(text: str, limit: int = REPLY_BYTES) -> str:
    """``text``, its lines cut where it would not fit in one message, saying so."""
    if len(text.encode()) <= limit:
        return text
    lines, kept, size = text.split("\n"), [], 0
    for line in lines:
        size += len(line.encode()) + 1
        if size > limit - 200:
            break
        kept.append(line)
    return "\n".join(kept) + (f"\n… and {len(lines) - len(kept)} more lines, too many for one message: "
                              "`askwright-bridge status -c CONFIG` prints them all.")


def poster_post_set(poster: Any) -> Callable[[Path], Awaitable[str]]:
    """``post_set`` for ``AdminContext`` backed by the bridge's Poster."""
    from bridge.service.posting.poster import PostReport  # noqa: PLC0415 - the poster pulls in the transport side

    async def post(set_dir: Path) -> str:
        report = PostReport()
        await poster.sync_set(set_dir, report)
        return describe_post(report)

    return post


def _age_ms(event: dict[str, Any], now_ms: int) -> int:
    """How old a command was when it reached the bridge: the homeserver's
    own ``unsigned.age`` when it says (no clock compared: a bridge whose
    clock ran 11 minutes ahead ignored every command, in silence), else
    this machine's clock against the sender's server's timestamp."""
    unsigned = event.get("unsigned")
    age = unsigned.get("age") if isinstance(unsigned, dict) else None
    if isinstance(age, int) and not isinstance(age, bool):
        return age
    ts = event.get("origin_server_ts")
    return now_ms - ts if isinstance(ts, int) and not isinstance(ts, bool) else 0
