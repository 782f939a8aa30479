"""Files people send into a question's thread -> ``attachments/`` in the set folder.

Runs before a batch is judged (the judging step is synchronous and inside a
store transaction), so the pure step only has to look up what was saved;
``downloads.py`` runs these fetches and lets a slow one go on apart.
Each file is saved once: the store remembers every event it fetched (or why
it could not), and a crash between the write and that row rewrites the same
name, because names are numbered from the store's count, not from the disk.

Safety: names are made here, never taken from the sender (``<qid>-<n>.<ext>``
with a short alphanumeric extension); the folder must really be inside the
set folder (a symlinked ``attachments`` pointing elsewhere is refused); files
are capped in size (``attachments.max_bytes``) and in number per question.

Whole or not at all: the body streams into a part file beside its name
(never into memory), counted, decrypted and hash-checked as it comes
(``protocol.file_body``), and is renamed into place only once it is whole
and on disk.  A body cut short is a failed try, tried again; whatever fails,
the part file goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import mimetypes
import os
import re
import time
from pathlib import Path
from collections.abc import Mapping
from typing import Any, AsyncContextManager, Callable, Iterable, TypeVar

from bridge.protocol.file_body import BodyTooLarge, BodyUndecryptable, FileBody
from bridge.protocol.normalize import is_file_content
from bridge.questionset.media import is_inside, mimetype as media_type
from bridge.service.logs import in_a_line
from bridge.service.storage.store import Store
from bridge.wholefile import TempFile, in_thread

log = logging.getLogger(__name__)

# The default of ``attachments.max_bytes``: the largest file kept.
DEFAULT_MAX_BYTES = 20 * 1024 * 1024
FOLDER = "attachments"

# (mxc, seconds a read may wait for the next bytes) -> the body under way
# (``transport.matrix.MediaBody``: ``length``, ``chunks``).
# (mxc URL, seconds the body may stall, seconds the response may take) -> the body.
Download = Callable[[str, float, float], AsyncContextManager[Any]]
MayAnswer = Callable[[str, str, str], bool]  # (sender, room id, event id)

_SAFE_EXT = re.compile(r"[a-z0-9]{1,8}")
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]+")
_EXT_BY_MIMETYPE = {
    "image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/webp": "webp", "image/svg+xml": "svg",
    "image/avif": "avif", "video/mp4": "mp4", "video/webm": "webm", "video/quicktime": "mov",
    "audio/mpeg": "mp3", "audio/ogg": "ogg", "audio/mp4": "m4a", "audio/wav": "wav", "application/pdf": "pdf",
    "text/plain": "txt", "audio/webm": "webm", "audio/x-m4a": "m4a", "video/x-matroska": "mkv",
}
UNKNOWN_TYPE = "application/octet-stream"  # what ``media_type`` says of an extension it does not know
# Plaintext gathered before a write to disk (in a thread): memory per download stays this small.
WRITE_BYTES = 1024 * 1024


class FileGone(Exception):
    """The content repository does not have the file (a permanent failure)."""


class NotReached(Exception):
    """The file's homeserver was not reached (a 502 or 504: the bridge's
    could not reach the server holding it, or is itself behind a proxy while
    it restarts): the file may well be there, and come once it is back."""


class RateLimited(NotReached):
    """429: the homeserver asks for time (Synapse limits how fast remote
    media is fetched); ``wait``: the seconds it named, if it named any."""

    def __init__(self, what: str, wait: float | None):
        super().__init__(what)
        self.wait = wait


class NotSaved(Exception):
    """The set folder would not take the file (gone, read-only, leading outside): not worth a retry."""


class DiskFull(NotSaved):
    """No room left on the set folder's disk (or its quota): the part file
    dropped, room may come back (a log rotated, an operator freeing space)."""


def not_saved(exc: OSError) -> NotSaved:
    return DiskFull(str(exc)) if exc.errno in (errno.ENOSPC, errno.EDQUOT) else NotSaved(str(exc))


# Each download gets a few tries within bounded time; then the file is
# recorded as not fetched (the person is told) and the batch goes on.  A
# content repository that fails for good, or a federated server that went
# away, must not hold every later answer back.  A try fails when no byte
# comes for TRY_SECONDS, and takes at most TRY_SECONDS plus the limit at
# SLOWEST_RATE (a large file on a slow link still gets through).  The rate is
# a file's share of the link, not the link: files sent together come side
# by side (at a MiB a second, eight 10 MB files on a 1.5 MiB/s link all ran
# out of time together and were refused, where the link carried them all).
TRIES = 3
TRY_SECONDS = 20.0
SLOWEST_RATE = 64 * 1024  # bytes a second
RETRY_PAUSE = 1.0
# A file whose homeserver can't be reached from the bridge's (restarting,
# its network down a moment) is tried again for this long, the pause
# doubling, its message judged when it comes: three tries within 3 s lost
# the person's file to a server's restart.  Not longer: a server gone for
# good must have its person told within the minute, not left waiting.
UNREACHED_PATIENCE = 30.0
# A disk that filled mid-download is tried again for this long, every
# DISK_FULL_PAUSE: the file was lost for good (attachment_not_saved) though
# its part file, discarded, had just freed the space.  The batch goes on
# without it meanwhile, its event kept pending (across a restart too).
DISK_FULL_PATIENCE = 600.0
DISK_FULL_PAUSE = 30.0
# A homeserver limiting the rate of downloads is waited out (the wait it
# names, at least): it asks for time, it is not failing.  Each try still
# runs within its own bound.
RATE_LIMITED_PATIENCE = 300.0


def try_seconds(limit: int) -> float:
    return TRY_SECONDS + limit / SLOWEST_RATE


async def fetch_bounded(content: dict[str, Any], set_dir: str, qid: str, number: int,
                        download: Download, limit: int = DEFAULT_MAX_BYTES,
                        turns: AsyncContextManager[Any] | None = None) -> tuple[str | None, str | None]:
    """``number`` names the file (never a name taken before).  ``turns``:
    the file's turn among the media's connections (``mediaturns.Turn``),
    taken again for each try; each try's clocks start once it has one (a
    try that waited for a connection behind 32 slow videos timed out in the
    queue, three times, and the person was told to send a screenshot again)."""
    began, attempt = time.monotonic(), 0
    while True:
        attempt += 1
        asked_wait: float | None = None
        try:
            async with turns if turns is not None else contextlib.nullcontext():
                return await asyncio.wait_for(_fetch(content, set_dir, qid, number, download, limit),
                                              try_seconds(limit))
        except DiskFull as exc:
            left = DISK_FULL_PATIENCE - (time.monotonic() - began)
            if left <= 0:
                log.warning("file for %s could not be saved in %s: %s", qid, set_dir, exc)
                return None, "attachment_not_saved"
            log.warning("file for %s not saved, its disk is full (%s); tried again in %.0f s", qid, exc,
                        min(DISK_FULL_PAUSE, left))
            await asyncio.sleep(min(DISK_FULL_PAUSE, left))
            continue
        except NotReached as exc:
            unreached, problem = True, in_a_line(exc)
            asked_wait = exc.wait if isinstance(exc, RateLimited) else None
        except Exception as exc:  # noqa: BLE001 - a 5xx, a timeout, a reset, a body cut short: tried again
            # (In a line: aiohttp's word on a body past its length quotes kilobytes of the file.)
            unreached, problem = False, f"{type(exc).__name__}: {in_a_line(exc)}"
        patience = RATE_LIMITED_PATIENCE if asked_wait is not None else UNREACHED_PATIENCE
        left = patience - (time.monotonic() - began)
        if unreached and left > 0:
            log.info("download for %s failed (try %d): %s; tried again for %.0f s more", qid, attempt, problem, left)
            await asyncio.sleep(min(max(RETRY_PAUSE * 2 ** (attempt - 1), asked_wait or 0.0), left))
            continue
        log.info("download for %s failed (try %d%s): %s", qid, attempt,
                 "" if unreached else f" of {TRIES}", problem)
        if attempt >= TRIES:
            if asked_wait is not None:
                return None, "attachment_rate_limited"  # (five minutes of 429s: not "not reached")
            return None, "attachment_unreachable" if unreached else "attachment_not_fetched"
        await asyncio.sleep(RETRY_PAUSE * attempt)


# A file event not judged yet (its download still running, or in the same
# batch): event id -> (sender, question event id, the file's URL).
Unjudged = Mapping[str, tuple[str, str, str | None]]


def target(event: dict[str, Any], store: Store, unjudged: Unjudged = {}) -> tuple[str, str, str, str] | None:
    """(event id, question event id, qid, set dir) of a new file sent to an open
    question: in the question's thread or a reply to it, or an edit of a file
    message that sends another file (``replacing_file``)."""
    content = event.get("content")
    event_id = event.get("event_id")
    if event.get("type") != "m.room.message" or not isinstance(content, dict) or not isinstance(event_id, str):
        return None
    if not is_file_content(content) or store.is_processed(event_id):
        return None
    if store.attachment(event_id) is not None:
        return None
    relates = content.get("m.relates_to")
    if not isinstance(relates, dict):
        return None
    if relates.get("rel_type") == "m.replace":
        return replacing_file(event, relates, store, unjudged)
    root = relates.get("event_id") if relates.get("rel_type") == "m.thread" else None
    reply = relates.get("m.in_reply_to")
    if root is None and isinstance(reply, dict):
        root = reply.get("event_id")
    # The question itself or its poll: a file in either's thread, or replying to either, is the question's.
    question = (store.question_by_event(root) or store.question_by_poll(root)) if isinstance(root, str) else None
    return _to_open(event_id, question, store)


def replacing_file(event: dict[str, Any], relates: dict[str, Any], store: Store,
                   unjudged: Unjudged = {}) -> tuple[str, str, str, str] | None:
    """An edit of a file the sender sent to a question, sending another file
    (Element's caption edit sends the same one again: nothing to fetch): the
    file it sends, fetched under the edit's id, stands in for the first.
    The first may not be judged yet (``unjudged``: its file still coming,
    or in the same batch, as after a restart): the edit waits for it in the
    log as any edit does, its own file fetched now."""
    original = relates.get("event_id")
    new = file_content(event)
    url = media_url(new)
    if not isinstance(original, str) or not is_file_content(new) or url is None:
        return None
    gesture = store.gesture_at(original)
    if gesture is not None:
        question_event_id, sender, sent = gesture[0], gesture[1], store.attachment_url(original)
    elif original in unjudged:
        sender, question_event_id, sent = unjudged[original]
    else:
        return None
    if sender != event.get("sender"):
        return None  # not a file of theirs: only the author's edit counts
    if sent in (None, url):
        return None  # the same file (a caption edit), or none fetched for it (or fetched before URLs were kept)
    return _to_open(str(event["event_id"]), store.question_by_event(question_event_id), store)


def _to_open(event_id: str, question: Any, store: Store) -> tuple[str, str, str, str] | None:
    if question is None or not question.open or not question.qid:
        return None
    set_dir = store.set_dir_of(question.event_id)
    return (event_id, question.event_id, question.qid, set_dir) if set_dir else None


def file_content(event: dict[str, Any]) -> dict[str, Any]:
    """What describes the file an event sends: an edit's new content, else its own."""
    content = event.get("content") if isinstance(event.get("content"), dict) else {}
    relates = content.get("m.relates_to")
    new = content.get("m.new_content")
    if isinstance(relates, dict) and relates.get("rel_type") == "m.replace" and isinstance(new, dict):
        return new
    return content


def media_url(content: dict[str, Any]) -> str | None:
    """The content repository's URL of the file: plain, or inside an encrypted file's key."""
    url = content.get("url")
    encrypted = content.get("file")
    if not isinstance(url, str) and isinstance(encrypted, dict):
        url = encrypted.get("url")
    return url if isinstance(url, str) else None


async def _fetch(content: dict[str, Any], set_dir: str, qid: str, number: int,
                 download: Download, limit: int = DEFAULT_MAX_BYTES) -> tuple[str | None, str | None]:
    """One try: (the saved path, None), or (None, the reason it is not kept).
    Raises for what another try may mend (the network, a body cut short)."""
    # A file sent in an encrypted room: the key rides in the (decrypted) event.
    encrypted = content.get("file") if isinstance(content.get("file"), dict) else None
    url = media_url(content)
    if url is None:
        return None, "attachment_download_failed"
    info = content.get("info") if isinstance(content.get("info"), dict) else {}
    try:
        body = FileBody(limit, encrypted if encrypted is not None and url == encrypted.get("url") else None)
        body.announce(info.get("size"))
    except BodyUndecryptable:
        return None, "attachment_encrypted"
    name = f"{_UNSAFE_NAME.sub('_', qid).lstrip('.') or 'answer'}-{number}.{extension(content, info)}"
    try:
        # The response may be as late as the file (its size as announced, at
        # most the limit) at SLOWEST_RATE: a homeserver fetching it from
        # another server sends the first byte once it has the last.
        async with download(url, TRY_SECONDS, try_seconds(min(body.announced or limit, limit))) as media:
            body.expect(media.length)
            folder = attachments_folder_or_refuse(set_dir)
            await _on_disk(sweep_abandoned, folder, abandoned_after(limit))
            await _save(folder / name, media.chunks, body)
    except BodyTooLarge:
        return None, "attachment_too_large"
    except BodyUndecryptable:
        return None, "attachment_encrypted"
    except FileGone:
        return None, "attachment_download_failed"
    except DiskFull:
        raise
    except NotSaved as exc:
        log.warning("file for %s could not be saved in %s: %s", qid, set_dir, exc)
        return None, "attachment_not_saved"
    return f"{FOLDER}/{name}", None


async def _save(path: Path, chunks: Any, body: FileBody) -> None:
    """The body streamed into ``path``'s part file, renamed over ``path``
    once whole, checked and on disk; on any failure nothing is left."""
    try:
        part = part_file(path)  # an open, on the loop: a thread could leave it open when the try is cancelled
    except OSError as exc:
        raise not_saved(exc) from exc
    try:
        pending = bytearray()
        async for chunk in chunks:
            pending += body.take(chunk)
            if len(pending) >= WRITE_BYTES:
                await _on_disk(part.write, bytes(pending))
                pending.clear()
        pending += body.end()  # raises when cut short or when the hash does not match
        await _on_disk(part.write, bytes(pending))
        await _on_disk(part.commit)
    except BaseException:
        part.discard()
        if part.renamed:
            # Cancelled while the commit ran (a try's timeout, the answer
            # withdrawn), or its folder's fsync failed: the file is under its
            # name but no answer will name it, and nothing would remove it.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        raise


T = TypeVar("T")


async def _on_disk(work: Callable[..., T], *args: Any) -> T:
    """``work`` in a thread (``in_thread``), its OSError as NotSaved."""
    try:
        return await in_thread(work, *args)
    except OSError as exc:
        raise not_saved(exc) from exc


def extension(content: dict[str, Any], info: dict[str, Any]) -> str:
    """A short, safe extension: the sent name's when it names a known kind of
    file, else the mimetype's, else the name's if plain.  The name is
    ``filename``, or ``body`` without one (with one, the body is a caption:
    "crash in v2.3" made the file a ``.3``); a name of dots and no extension
    ("Screenshot 2026-12-07 at 10.15.32") made an image/png a ``.32``, which
    the agents were told was application/octet-stream."""
    name = content.get("filename") if "filename" in content else content.get("body")
    ext = name.rsplit(".", 1)[-1].lower() if isinstance(name, str) and "." in name else ""
    plain = ext if _SAFE_EXT.fullmatch(ext) else None
    if plain is not None and media_type(f"file.{plain}") != UNKNOWN_TYPE:
        return plain
    # ("audio/webm; codecs=opus", as a voice message says it: its parameters are no kind of file.)
    kind = info.get("mimetype").split(";", 1)[0].strip().lower() if isinstance(info.get("mimetype"), str) else ""
    if kind in _EXT_BY_MIMETYPE:
        return _EXT_BY_MIMETYPE[kind]
    if plain is not None:
        return plain
    guessed = (mimetypes.guess_extension(kind) or "").lstrip(".") if kind else ""
    if _SAFE_EXT.fullmatch(guessed) and media_type(f"file.{guessed}") == kind:
        return guessed  # (text/markdown, text/csv: one the agents are told back as it was sent)
    return "bin"


def attachments_folder(set_dir: str) -> Path:
    """``<set>/attachments``, created if needed, refused if it leads outside the set folder."""
    root = os.path.realpath(set_dir)
    folder = Path(root) / FOLDER
    folder.mkdir(exist_ok=True)
    if not is_inside(os.path.realpath(folder), root) or os.path.realpath(folder) == root:
        raise OSError(f"{folder} leads outside the set folder {root}; refusing to write there")
    return folder


def attachments_folder_or_refuse(set_dir: str) -> Path:
    try:
        return attachments_folder(set_dir)
    except OSError as exc:
        raise not_saved(exc) from exc


def abandoned_after(limit: int) -> float:
    """Seconds after which no download can still be writing a part file (every try is bounded)."""
    return TRIES * (try_seconds(limit) + RETRY_PAUSE * TRIES)


def sweep_sets(set_dirs: Iterable[str], older_than: float) -> None:
    """``sweep_abandoned`` in the attachments folder of each set that has one."""
    for set_dir in set_dirs:
        with contextlib.suppress(OSError):  # gone, unreadable: nothing of ours to sweep there
            sweep_abandoned(Path(set_dir) / FOLDER, older_than)


def sweep_abandoned(folder: Path, older_than: float) -> None:
    """Part files no download can still be writing (every try is bounded in
    time): what a crash in the middle of one left, when its file was never
    tried again (its question closed meanwhile)."""
    cutoff = time.time() - older_than
    with os.scandir(folder) as entries:
        for entry in entries:
            if not (entry.name.startswith(".") and entry.name.endswith(".part")):
                continue
            # Another download may rename or remove its own part between the
            # listing and here: that file is simply not there (it failed the
            # download sweeping, its file refused as not saved).
            with contextlib.suppress(FileNotFoundError):
                if entry.is_file(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_mtime < cutoff:
                    os.unlink(entry.path)


def part_file(path: Path) -> TempFile:
    """The file written as ``.<name>.part`` beside ``path``.  The part's name is
    fixed: a try after a crash truncates what the crashed one left."""
    return TempFile(path, temp=path.with_name(f".{path.name}.part"))
