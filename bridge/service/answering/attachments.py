"""Files people send into a question's thread -> ``attachments/`` in the set folder.

Runs before a batch is judged (the judging step is synchronous and inside a
store transaction), so the pure step only has to look up what was saved.
Each file is saved once: the store remembers every event it fetched (or why
it could not), and a crash between the write and that row rewrites the same
name, because names are numbered from the store's count, not from the disk.

Safety: names are made here, never taken from the sender (``<qid>-<n>.<ext>``
with a short alphanumeric extension); the folder must really be inside the
set folder (a symlinked ``attachments`` pointing elsewhere is refused); files
are capped in size and in number per question.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from pathlib import Path
from typing import Any, Awaitable, Callable

from bridge.protocol.annotate import MAX_ATTACHMENTS
from bridge.protocol.normalize import FILE_MSGTYPES
from bridge.questionset.media import is_inside
from bridge.service.storage.store import Store

log = logging.getLogger(__name__)

MAX_BYTES = 20 * 1024 * 1024
FOLDER = "attachments"

Download = Callable[[str, int], Awaitable[bytes]]
MayAnswer = Callable[[str, str], bool]

_SAFE_EXT = re.compile(r"^[a-z0-9]{1,8}$")
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]+")
_EXT_BY_MIMETYPE = {
    "image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/webp": "webp", "image/svg+xml": "svg",
    "image/avif": "avif", "video/mp4": "mp4", "video/webm": "webm", "video/quicktime": "mov",
    "audio/mpeg": "mp3", "audio/ogg": "ogg", "audio/mp4": "m4a", "audio/wav": "wav", "application/pdf": "pdf",
    "text/plain": "txt",
}


class FileTooLarge(Exception):
    """The download passed the cap; raised by a ``Download``."""


class FileGone(Exception):
    """The content repository does not have the file (a permanent failure)."""


# Each download gets a few tries within bounded time; then the file is
# recorded as not fetched (the person is told) and the batch goes on.  A
# content repository that fails for good, or a federated server that went
# away, must not hold every later answer back.
TRIES = 3
TRY_SECONDS = 20.0
RETRY_PAUSE = 1.0


async def prefetch(events: list[dict[str, Any]], store: Store, download: Download, may_answer: MayAnswer,
                   on_trouble: Callable[[str, str], None] | None = None) -> int:
    """Save every new file of ``events`` sent to an open question; returns how many were saved.

    Every outcome is remembered in the store (the file's path, or why it was
    not kept), so a file is fetched once and the person is told.  Nothing
    one download does raises out of here but the store failing.
    """
    jobs = []
    numbers: dict[tuple[str, str], int] = {}
    for event in events:
        target = _target(event, store)
        if target is None:
            continue
        event_id, question_event_id, qid, set_dir = target
        if not may_answer(str(event.get("sender")), str(event.get("room_id"))):
            continue  # the judging step refuses the sender; a stranger's file is never written
        # Numbered in the batch's order before any download starts: the files
        # of one batch are fetched side by side, so a slow one costs its
        # bound once, not once per file.
        key = (set_dir, qid)
        numbers[key] = numbers.get(key, store.attachment_count(set_dir, qid)) + 1
        jobs.append((event_id, set_dir, qid, _fetch_bounded(event["content"], set_dir, qid, numbers[key], download)))
    if not jobs:
        return 0
    results = await asyncio.gather(*(job for *_ids, job in jobs))
    with store.transaction():
        for (event_id, set_dir, qid, _job), (path, problem) in zip(jobs, results):
            store.record_attachment(event_id, set_dir, qid, path, problem)
    for (event_id, _set_dir, qid, _job), (_path, problem) in zip(jobs, results):
        if problem:
            log.info("file %s for %s not kept: %s", event_id, qid, problem)
            if on_trouble is not None:
                on_trouble("download", problem)
    return sum(path is not None for path, _problem in results)


async def _fetch_bounded(content: dict[str, Any], set_dir: str, qid: str, number: int,
                         download: Download) -> tuple[str | None, str | None]:
    for attempt in range(1, TRIES + 1):
        try:
            return await asyncio.wait_for(_fetch(content, set_dir, qid, number, download), TRY_SECONDS)
        except Exception as exc:  # noqa: BLE001 - a 5xx, a timeout, a reset: tried again, then given up
            problem = f"{type(exc).__name__}: {exc}"
        log.info("download for %s failed (try %d of %d): %s", qid, attempt, TRIES, problem)
        if attempt < TRIES:
            await asyncio.sleep(RETRY_PAUSE * attempt)
    return None, "attachment_not_fetched"


def _target(event: dict[str, Any], store: Store) -> tuple[str, str, str, str] | None:
    """(event id, question event id, qid, set dir) of a new file sent to an open question."""
    content = event.get("content")
    event_id = event.get("event_id")
    if event.get("type") != "m.room.message" or not isinstance(content, dict) or not isinstance(event_id, str):
        return None
    if content.get("msgtype") not in FILE_MSGTYPES or store.is_processed(event_id):
        return None
    if store.attachment(event_id) is not None:
        return None
    relates = content.get("m.relates_to")
    if not isinstance(relates, dict):
        return None
    root = relates.get("event_id") if relates.get("rel_type") == "m.thread" else None
    reply = relates.get("m.in_reply_to")
    if root is None and isinstance(reply, dict):
        root = reply.get("event_id")
    question = store.question_by_event(root) if isinstance(root, str) else None
    if question is None or not question.open or not question.qid:
        return None
    set_dir = store.set_dir_of(question.event_id)
    return (event_id, question.event_id, question.qid, set_dir) if set_dir else None


async def _fetch(content: dict[str, Any], set_dir: str, qid: str, number: int,
                 download: Download) -> tuple[str | None, str | None]:
    if number > MAX_ATTACHMENTS:
        return None, "too_many_attachments"
    url = content.get("url")
    encrypted = content.get("file") if isinstance(content.get("file"), dict) else None
    if not isinstance(url, str) and encrypted is not None:
        # A file sent in an encrypted room: the key rides in the (decrypted) event.
        url = encrypted.get("url")
    if not isinstance(url, str):
        return None, "attachment_download_failed"
    info = content.get("info") if isinstance(content.get("info"), dict) else {}
    size = info.get("size")
    if isinstance(size, int) and size > MAX_BYTES:
        return None, "attachment_too_large"
    try:
        data = await download(url, MAX_BYTES)
    except FileTooLarge:
        return None, "attachment_too_large"
    except FileGone:
        return None, "attachment_download_failed"
    if encrypted is not None and url == encrypted.get("url"):
        data = decrypt_file(encrypted, data)
        if data is None:
            return None, "attachment_encrypted"
    name = f"{_UNSAFE_NAME.sub('_', qid).lstrip('.') or 'answer'}-{number}.{extension(content, info)}"
    try:
        write_atomic(attachments_folder(set_dir) / name, data)
    except OSError as exc:  # the folder gone, read-only, full, or leading outside the set: not worth a retry
        log.warning("file for %s could not be saved in %s: %s", qid, set_dir, exc)
        return None, "attachment_not_saved"
    return f"{FOLDER}/{name}", None


def decrypt_file(file: dict[str, Any], data: bytes) -> bytes | None:
    """The plaintext of an encrypted attachment, or None when it cannot be
    decrypted (a key that is missing or malformed, a hash that does not match)."""
    try:
        from nio.crypto.attachments import decrypt_attachment

        key, hashes = file.get("key"), file.get("hashes")
        if not isinstance(key, dict) or not isinstance(hashes, dict):
            return None
        return decrypt_attachment(data, key["k"], hashes["sha256"], file["iv"])
    except Exception:  # noqa: BLE001 - any failure means the same: this file can't be read
        return None


def extension(content: dict[str, Any], info: dict[str, Any]) -> str:
    """A short, safe extension: the sent name's if it is plain, else from the mimetype."""
    for name in (content.get("filename"), content.get("body")):
        if isinstance(name, str) and "." in name:
            ext = name.rsplit(".", 1)[-1].lower()
            if _SAFE_EXT.match(ext):
                return ext
    mimetype = info.get("mimetype")
    return _EXT_BY_MIMETYPE.get(mimetype, "bin") if isinstance(mimetype, str) else "bin"


def attachments_folder(set_dir: str) -> Path:
    """``<set>/attachments``, created if needed, refused if it leads outside the set folder."""
    root = os.path.realpath(set_dir)
    folder = Path(root) / FOLDER
    folder.mkdir(exist_ok=True)
    if not is_inside(os.path.realpath(folder), root) or os.path.realpath(folder) == root:
        raise OSError(f"{folder} leads outside the set folder {root}; refusing to write there")
    return folder


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o644)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if tmp.exists():
            tmp.unlink()
        raise
