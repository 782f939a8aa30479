"""The one service layer agents go through (the HTTP API and both MCP
transports): ask, read, wait, close and list, each for one agent's own sets.

A set is written exactly as a local agent would write it: a folder under
``sets.root`` holding questions.json (plus the owner file), created
atomically, so the bridge's poster picks it up as it picks up any set."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bridge.agents.apart import Apart, in_a_process
from bridge.agents.changes import Changes
from bridge.agents.closing import blocks_close, close_questions
from bridge.agents.judgeset import dicts, judge_set
from bridge.agents.media_quota import MediaQuota
from bridge.agents.errors import BadRequest, LintFailed, NotFound, NotLeading, NotStored, listed
from bridge.agents.owner import OWNER_FILE, Owner, owner_bytes, read_owner
from bridge.agents.waitcap import Waits
from bridge.answers.view import ReadError, load_view
from bridge.answers.arrival import as_read
from bridge.questionset.lint import lint
from bridge.questionset.lint.identity import ID_PATTERN
from bridge import strictjson
from bridge.questionset.load import LoadError, parse_json
from bridge.questionset.media import LocalFilesystem
from bridge.regularfile import read_regular
from bridge.questionset.setdir import QUESTIONS_FILE, questions_bytes
from bridge.wholefile import replace_whole, sync_dir, temp_path

# The format's set id: a letter or digit, then letters, digits, _, . or -; 64 at most.
SET_ID_RULE = "a letter or digit, then letters, digits, _, . or -; 64 at most"
MAX_CALLBACKS = 5


def _view(set_dir: Path) -> dict[str, Any]:
    """``read --all``'s view of a set folder; NotFound when nothing can be read."""
    try:
        return load_view(set_dir, include_all=True)
    except ReadError as exc:
        # Named as the agent names it: where the bridge keeps its sets is not the agent's to know.
        raise NotFound(exc.message.replace(str(set_dir.parent) + os.sep, "")) from None


def _call(fn: Callable[..., Any], /, *args: Any) -> Any:
    return fn(*args)


def set_summary(set_dir: Path) -> dict[str, Any] | None:
    """A set's line in ``list_sets`` (None when it can't be read); a module
    function, so a big set's runs in a process of its own."""
    try:
        view = load_view(set_dir, include_all=True)
    except ReadError:
        return None
    answers = view["answers"]
    return {"rev": view["rev"], "open": sum(1 for a in answers if a["status"] == "open"), "answered": view["count"]}


def closed_set(data: bytes, qids: list[str] | None, status: str, reason: str | None,
               set_dir: str) -> tuple[bytes | None, bool, tuple[str, list[dict[str, str]] | None] | None]:
    """A close worked out on a questions.json's bytes: (the new bytes, whether
    anything closed, why it can't be: a message and lint's findings, or None
    for a set that can't be read); a module function, so a big set's runs
    in a process of its own."""
    try:
        raw = parse_json(data)
    except LoadError as exc:
        return None, False, (f"the set can't be read: {getattr(exc, 'message', exc)}", None)
    new, done = close_questions(raw, qids, status, reason)
    result = lint(new, LocalFilesystem(set_dir), probe=None, confined=True)
    blocking = [f for f in result.errors if blocks_close(f.where, f.message)]
    if blocking:
        return None, False, ("the set would fail lint", dicts(blocking))
    return (questions_bytes(new) if done else None), done, None


def _files_now(set_dir: Path) -> tuple[Any, ...]:
    """What tells one state of a set's two files from the next (a write replaces a file: a new inode)."""
    out: list[Any] = []
    for name in (QUESTIONS_FILE, "answers.json"):
        try:
            st = os.stat(set_dir / name)
            out.append((st.st_ino, st.st_mtime_ns, st.st_size))
        except OSError:
            out.append(None)
    return tuple(out)


def is_set_id(value: object) -> bool:
    """The format's id rule (lint's ``ID_PATTERN``), over the whole value: a trailing newline makes no id."""
    return isinstance(value, str) and ID_PATTERN.fullmatch(value) is not None


@dataclass(frozen=True)
class Asked:
    set_id: str
    created: bool
    open_questions: list[str]
    warnings: list[dict[str, str]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        body = {"ok": True, "set": self.set_id, "created": self.created, "questions": self.open_questions}
        listed(body, "warnings", self.warnings)
        return body


# A document this large is judged in a process of its own (``apart.py``):
# beyond it, parsing and linting hold the interpreter lock for tens of ms.
BIG_DOCUMENT = 256 * 1024
BIG_SET = 500  # questions: about as much, parsed already (MCP hands the set over as an object)


class AgentSets:
    def __init__(self, root: Path, stop: asyncio.Event | None = None,
                 on_written: Callable[[Path], None] | None = None,
                 posted_revs: Callable[[], Mapping[str, Mapping[str, int]]] | None = None,
                 log_size: Callable[[], int] | None = None, answerers: Iterable[str] = ()):
        self.root = Path(root)
        # The bridge's own answerers: a set whose quorum none allowed could meet is refused, as lint -c says.
        self.answerers = tuple(answerers)
        # The answer log's size now (its leaves): a set made now starts there (``Owner.log_from``).
        self.log_size = log_size
        # Inside the bridge: the highest rev posted per question, per set
        # folder, so an agent that lowers a rev is warned as lint warns.
        self.posted_revs = posted_revs
        # Set when the bridge stops: every wait returns what it has at once.
        self.stop = stop
        # Told of every change of a set (inside the bridge by the pipeline and
        # the folder watcher too); the waits follow it.
        self.changes = Changes()
        self.waits = Waits()
        # Both doors' uploads count against one quota per agent (``agent_api.media_quota``).
        self.media_quota = MediaQuota(self.root)
        # Inside the bridge: the poster is told of a set written, beside its
        # folder watcher (which may not watch yet in the first moments of a start).
        self.on_written = on_written
        self.apart = Apart()  # the *_apart calls' threads
        # Inside a leader of a shared store: raises unless this instance still
        # leads.  A leader frozen with a request in hand, woken after another
        # took over, must not write that request's set over the new leader's.
        self.fence: Callable[[], None] | None = None
        # Readings under way: (set folder, its files' stat) -> the view being read.
        self._reading: dict[tuple[Path, Any], asyncio.Future[dict[str, Any]]] = {}
        # The homeserver's upload limit (the transport's ``upload_limit``), once connected.
        self.upload_limit: Callable[[], Awaitable[int | None]] | None = None
        # ``list_sets``: each set's line as of its files' stamp.
        self._summaries: dict[Path, tuple[Any, dict[str, Any] | None]] = {}

    # -- where a set lives, and whose it is --------------------------------------

    def _own_dir(self, agent: str, set_id: str) -> Path:
        """The folder of ``agent``'s set; NotFound for no set or another's."""
        check_set_id(set_id)
        if self.owner_of(set_id) != agent:
            raise NotFound(f"no set {set_id!r}")
        return self.root / set_id

    def owner_of(self, set_id: str) -> str | None:
        """The agent whose set ``set_id`` is now; None for no set, a local
        agent's, or a folder only claimed for media (``set_id`` a plain
        folder name, as ``check_set_id`` passes or the folder watcher sees)."""
        set_dir = self.root / set_id
        if not (set_dir / QUESTIONS_FILE).is_file():
            return None
        owner = read_owner(set_dir)
        return owner.agent if owner is not None else None

    # -- ask ------------------------------------------------------------------------

    def ask(self, agent: str, set_id: str, document: bytes | dict[str, Any],
            callbacks: list[str] | None = None) -> Asked:
        """Lint and write a set; LintFailed with the findings when it fails."""
        asked, set_dir = self._write_set(agent, set_id, document, callbacks)
        self._written(set_dir)
        return asked

    async def ask_apart(self, agent: str, set_id: str, document: bytes | dict[str, Any],
                        callbacks: list[str] | None = None) -> Asked:
        """``ask`` with its lint and writes off the event loop (``apart.py``)."""
        asked, set_dir = await self.apart.run(agent, self._write_set, agent, set_id, document, callbacks)
        self._written(set_dir)
        return asked

    def _write_set(self, agent: str, set_id: str, document: bytes | dict[str, Any],
                   callbacks: list[str] | None) -> tuple[Asked, Path]:
        """Lint and write a set, telling nobody (any thread)."""
        check_set_id(set_id)
        urls = _callbacks(callbacks)
        set_dir = self.root / set_id
        self._whose(set_dir, agent, set_id)  # someone else's: refused before the lint's seconds
        revs = dict(self._revs(set_dir))
        if _big(document):
            judged = in_a_process(judge_set, document, set_id, str(set_dir), revs, self.answerers)
        else:
            judged = judge_set(document, set_id, str(set_dir), revs, self.answerers)
        judged.raise_refusal()
        self._fenced()
        # Looked at again after the lint, which may have taken seconds: the
        # folder may have come meanwhile (the agent's own media upload claims
        # it; another agent's set makes it theirs).
        try:
            for _attempt in range(3):
                owner = self._whose(set_dir, agent, set_id)
                had_questions = (set_dir / QUESTIONS_FILE).is_file()
                new_owner = Owner(agent, tuple(urls) if callbacks is not None else (owner.callbacks if owner else ()),
                                  owner.log_from if owner else self._log_now())
                if owner is not None:
                    replace_whole(set_dir / OWNER_FILE, owner_bytes(new_owner))
                    replace_whole(set_dir / QUESTIONS_FILE, judged.data)
                    break
                try:
                    self._create(set_dir, judged.data, new_owner)
                    break
                except FileExistsError:
                    continue  # made this moment: whose it is decides
            else:  # something stands at the name that is no set folder (a dangling link)
                raise BadRequest(f"the set's folder {set_id!r} can't be made")
        except OSError as exc:  # a full disk, a read-only folder: 507 in the API's shape, not a bare 500
            raise NotStored(f"the set could not be stored: {exc.strerror or exc}") from None
        return Asked(set_id, not had_questions, judged.open_ids, judged.warnings), set_dir

    def _log_now(self) -> int:
        return self.log_size() if self.log_size is not None else 0

    def not_theirs(self, agent: str, set_id: str) -> None:
        """NotFound when ``set_id``'s folder is someone else's: what a PUT of
        the set is refused for, told before its body is sent."""
        check_set_id(set_id)
        self._whose(self.root / set_id, agent, set_id)

    @staticmethod
    def _whose(set_dir: Path, agent: str, set_id: str) -> Owner | None:
        """The set folder's owner when it is ``agent`` (None: no folder yet);
        NotFound when it is someone else's, as if there were none."""
        if not set_dir.exists():
            return None
        owner = read_owner(set_dir)
        if owner is None or owner.agent != agent:
            raise NotFound(f"no set {set_id!r}")
        return owner

    def _revs(self, set_dir: Path) -> Mapping[str, int]:
        if self.posted_revs is None:
            return {}
        return self.posted_revs().get(os.path.realpath(set_dir), {})  # the poster keys postings by the resolved folder

    def _create(self, set_dir: Path, data: bytes | None, owner: Owner) -> None:
        """The folder, whole: its owner file and (unless only claimed for media) its questions.json.
        Written in a hidden folder (never read as a set) and renamed into
        place: the poster never sees a half-written set.  FileExistsError
        when another request made the folder first."""
        self.root.mkdir(parents=True, exist_ok=True)
        # Hidden and named as a temporary file is: a start removes it when its writer died.
        staging = temp_path(self.root / f".incoming-{set_dir.name}", unique=True)
        staging.mkdir()
        try:
            replace_whole(staging / OWNER_FILE, owner_bytes(owner))
            if data is not None:
                replace_whole(staging / QUESTIONS_FILE, data)
            os.rename(staging, set_dir)
        except OSError as exc:
            shutil.rmtree(staging, ignore_errors=True)
            if os.path.lexists(set_dir):
                raise FileExistsError(str(set_dir)) from exc
            raise
        sync_dir(self.root)

    def stopping(self) -> bool:
        return self.changes.closed or (self.stop is not None and self.stop.is_set())

    def _fenced(self) -> None:
        """Before a write: NotLeading (503) when this instance no longer leads."""
        if self.fence is None:
            return
        try:
            self.fence()
        except Exception as exc:  # noqa: BLE001 - the lease's refusal, whatever its type
            raise NotLeading(f"this instance no longer leads ({exc}); send it again: the one that leads takes it") \
                from None

    def _written(self, set_dir: Path) -> None:
        self.changes.publish(set_dir)
        if self.on_written is not None:
            self.on_written(set_dir)

    # -- read -------------------------------------------------------------------------

    def read(self, agent: str, set_id: str, *, include_all: bool = False) -> dict[str, Any]:
        """Exactly what ``askwright-bridge read SET_DIR [--all]`` prints."""
        return as_read(self.read_all(agent, set_id), include_all)

    def read_all(self, agent: str, set_id: str) -> dict[str, Any]:
        return _view(self._own_dir(agent, set_id))

    async def read_apart(self, agent: str, set_id: str, *, include_all: bool = False) -> dict[str, Any]:
        """``read`` off the event loop (``read_all_apart``)."""
        return as_read(await self.read_all_apart(agent, set_id), include_all)

    async def read_all_apart(self, agent: str, set_id: str) -> dict[str, Any]:
        """``read_all``, a big set's off the event loop: a set of 24,000
        questions takes seconds to read, which on the loop held every room,
        /health and every agent.  Callers asking for the same files while a
        reading of them runs share it: a hundred waits woken by one change
        read the set once."""
        set_dir = self._own_dir(agent, set_id)
        key = (set_dir, _files_now(set_dir))
        if not _big_files(key[1]):
            return _view(set_dir)  # a few milliseconds: read here, at once
        reading = self._reading.get(key)
        if reading is None:
            # A big set is read in a process of its own, as it is judged: in a
            # thread its seconds of Python held the interpreter's lock from
            # the event loop at every turn.
            reading = asyncio.ensure_future(self.apart.run(agent, in_a_process, _view, set_dir))
            self._reading[key] = reading

            def done(future: asyncio.Future[dict[str, Any]]) -> None:
                self._reading.pop(key, None)
                if not future.cancelled():
                    future.exception()  # every caller may have gone: not an unretrieved error
            reading.add_done_callback(done)
        return await asyncio.shield(reading)

    def set_dir(self, agent: str, set_id: str) -> Path:
        return self._own_dir(agent, set_id)

    @contextlib.contextmanager
    def media_dir(self, agent: str, set_id: str) -> Iterator[Path]:
        """The folder ``agent``'s media for ``set_id`` goes into, while an
        upload is stored there: its set's, or, before the set's first PUT, a
        folder it claims for it (the owner file alone, no questions.json, so
        no set yet).  NotFound for another's.  An upload that fails in a
        folder it claimed gives the claim up again, when nothing else came
        into it meanwhile: a refused upload takes no set id."""
        self._fenced()
        set_dir, claimed = self._media_dir(agent, set_id)
        try:
            yield set_dir
        except BaseException:
            if claimed:
                self._give_up(set_dir)
            raise

    def media_not_theirs(self, agent: str, set_id: str) -> None:
        """NotFound when ``set_id``'s folder is there and not ``agent``'s to
        upload into (the folder is not claimed: told before the upload's body)."""
        check_set_id(set_id)
        set_dir = self.root / set_id
        if os.path.lexists(set_dir) and not _media_folder_of(set_dir, agent):
            raise NotFound(f"no set {set_id!r}")

    def _media_dir(self, agent: str, set_id: str) -> tuple[Path, bool]:
        check_set_id(set_id)
        set_dir = self.root / set_id
        for _attempt in range(2):
            if os.path.lexists(set_dir):
                if not _media_folder_of(set_dir, agent):
                    raise NotFound(f"no set {set_id!r}")
                return set_dir, False
            try:
                self._create(set_dir, None, Owner(agent, log_from=self._log_now(), claimed=True))
            except FileExistsError:
                continue  # claimed at the same moment: whose it is decides
            except OSError as exc:
                raise NotStored(f"the file could not be stored: {exc.strerror or exc}") from None
            return set_dir, True
        raise NotFound(f"no set {set_id!r}")

    def _give_up(self, set_dir: Path) -> None:
        """The folder claimed for an upload removed, if it still holds only
        its owner file (another upload of the agent's may be under way in it)."""
        owner = set_dir / OWNER_FILE
        try:
            if os.listdir(set_dir) != [OWNER_FILE]:
                return
            kept = owner.read_bytes()
            owner.unlink()
        except OSError:
            return
        try:
            set_dir.rmdir()
        except OSError:  # something came into it between the look and now: it stays claimed
            replace_whole(owner, kept)
            return
        sync_dir(self.root)

    # -- close ------------------------------------------------------------------------

    def close(self, agent: str, set_id: str, qids: list[str] | None, status: str,
              reason: str | None) -> dict[str, Any]:
        closed, set_dir = self._close(agent, set_id, qids, status, reason)
        if closed["closed"]:
            self._written(set_dir)
        return closed

    async def close_apart(self, agent: str, set_id: str, qids: list[str] | None, status: str,
                          reason: str | None) -> dict[str, Any]:
        """``close`` with its lint and write off the event loop (``apart.py``)."""
        closed, set_dir = await self.apart.run(agent, self._close, agent, set_id, qids, status, reason)
        if closed["closed"]:
            self._written(set_dir)
        return closed

    async def list_sets_apart(self, agent: str) -> list[dict[str, Any]]:
        """``list_sets`` off the event loop: it reads every set of the agent's."""
        return await self.apart.run(agent, self.list_sets, agent)

    def _close(self, agent: str, set_id: str, qids: list[str] | None, status: str,
               reason: str | None) -> tuple[dict[str, Any], Path]:
        set_dir = self._own_dir(agent, set_id)
        try:  # (the MCP SDK's parser lets half a surrogate pair through)
            strictjson.check_text(reason)
        except strictjson.NotJson as exc:
            raise BadRequest(f"reason: {exc}") from None
        try:
            data = read_regular(set_dir / QUESTIONS_FILE)  # (a FIFO there would hold the thread: ``regularfile``)
        except OSError as exc:
            raise NotFound(f"the set can't be read: {exc}") from None
        # A big set's parse, lint and new bytes in a process of its own, as
        # its PUT is judged: in this thread, their long calls held the
        # interpreter's lock (/health and every agent) 200 ms at a time.
        closing = in_a_process if len(data) > BIG_DOCUMENT else _call
        new, done, failed = closing(closed_set, data, qids, status, reason, os.path.abspath(set_dir))
        if failed is not None:
            message, findings = failed
            if findings is None:
                raise NotFound(message)
            raise LintFailed(message, findings=findings)
        if done:
            self._fenced()
            try:
                replace_whole(set_dir / QUESTIONS_FILE, new)
            except OSError as exc:  # a full disk, a read-only folder: 507 as a PUT's, the set as it was
                raise NotStored(f"the set could not be stored: {exc.strerror or exc}") from None
        return {"ok": True, "set": set_id, "status": status, "closed": done}, set_dir

    # -- list ---------------------------------------------------------------------------

    def log_starts(self, agent: str) -> dict[str, int]:
        """Set id -> where ``agent``'s set of that name begins in the answer
        log (``Owner.log_from``), for each of its sets."""
        return {entry.name: owner.log_from for entry, owner in self._owned(agent)}

    def list_sets(self, agent: str) -> list[dict[str, Any]]:
        found = []
        for entry, _owner in self._owned(agent):
            summary = self._summary(entry)
            if summary is not None:
                found.append({"set": entry.name, **summary})
        return found

    def _owned(self, agent: str) -> Iterator[tuple[Path, Owner]]:
        """``agent``'s set folders (by name) and their owner files."""
        if not self.root.is_dir():
            return
        for entry in sorted(self.root.iterdir()):
            if entry.name.startswith(".") or not entry.is_dir():
                continue
            owner = read_owner(entry)
            if owner is not None and owner.agent == agent:
                yield entry, owner

    def _summary(self, set_dir: Path) -> dict[str, Any] | None:
        """A set's line in the list, kept while its files stay as they are: a
        listing reads again only what changed, and a big set in a process."""
        stamp = _files_now(set_dir)
        kept = self._summaries.get(set_dir)
        if kept is not None and kept[0] == stamp:
            return kept[1]
        summary = (in_a_process if _big_files(stamp) else _call)(set_summary, set_dir)
        self._summaries[set_dir] = (stamp, summary)
        return summary


def check_set_id(set_id: object, where: str = "id") -> str:
    """The one id rule of both doors: an id that can't be a set's is a bad request (400), naming it."""
    if not is_set_id(set_id):
        raise BadRequest(f"{where}: not a set id ({SET_ID_RULE})")
    return set_id


def _callbacks(callbacks: list[str] | None) -> list[str]:
    if callbacks is None:
        return []
    if not isinstance(callbacks, list) or len(callbacks) > MAX_CALLBACKS:
        raise BadRequest(f"callbacks must be a list of at most {MAX_CALLBACKS} URLs")
    for url in callbacks:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")) or len(url) > 2000:
            raise BadRequest("each callback must be an http:// or https:// URL")
    return list(dict.fromkeys(callbacks))


def _big_files(stamp: Any) -> bool:
    """A set whose questions.json or answers.json (``_files_now``'s stamp) takes
    long to read: answers of 20,000 characters each make a 10 MB answers.json
    of a set of 160 questions, which each wait read on the event loop."""
    return any((files or (0, 0, 0))[2] > BIG_DOCUMENT for files in stamp[:2])


def _big(document: bytes | dict[str, Any]) -> bool:
    if isinstance(document, dict):
        questions = document.get("questions")
        return isinstance(questions, list) and len(questions) > BIG_SET
    return len(document) > BIG_DOCUMENT


def _media_folder_of(set_dir: Path, agent: str) -> bool:
    """Whether the folder standing at ``set_dir`` is one ``agent``'s media may go into."""
    owner = read_owner(set_dir)
    return not set_dir.is_symlink() and set_dir.is_dir() and owner is not None and owner.agent == agent
