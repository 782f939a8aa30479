"""A question's media -> the content repository, once, and into its thread.

Each file is uploaded once whatever the number of questions or revisions
that show it: the store keeps the mxc URL by content hash.  The question
event carries the URLs (``build_question_event(media=...)``); the files
themselves go into the question's thread as ``m.image`` / ``m.video`` /
``m.audio`` / ``m.file`` messages so Element shows them, with the captions
file of a video beside it.  A drawn figure has no file: it is posted as a
text rendering of its data, so it is never silently dropped.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import shutil
import struct
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bridge.protocol.one_pager import ENCRYPTED_MESSAGE_MAX_BYTES, MESSAGE_MAX_BYTES, render_one_pager
from bridge.protocol.outcome import in_thread, txn_id
from bridge.protocol.render import esc, start_words
from bridge.questionset.media import LocalFilesystem, captions_for, ffprobe_command, media_type, mimetype, resolve
from bridge.questionset.model import MediaItem, Question, QuestionSet
from bridge.service.storage.store import Store

log = logging.getLogger(__name__)

PROBE_TIMEOUT_SECONDS = 30
_MSGTYPES = {"image": "m.image", "video": "m.video", "audio": "m.audio"}
_FIGURE_TEXT_MAX = 4000


@dataclass
class Upload:
    """One uploaded file as the question event and the thread message describe it."""

    url: str
    mimetype: str
    size: int
    name: str
    w: int | None = None
    h: int | None = None
    duration_ms: int | None = None
    # Uploaded encrypted (for an encrypted room): the key, IV and hash, with ``url`` in it.
    file: dict[str, Any] | None = None

    def description(self) -> dict[str, Any]:
        out: dict[str, Any] = {"url": self.url, "mimetype": self.mimetype, "size": self.size}
        if self.file:
            out["file"] = self.file  # ``url`` alone is ciphertext; the event itself is encrypted
        out.update({k: v for k, v in (("w", self.w), ("h", self.h), ("duration_ms", self.duration_ms)) if v})
        return out

    def info(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mimetype": self.mimetype, "size": self.size}
        out.update({k: v for k, v in (("w", self.w), ("h", self.h), ("duration", self.duration_ms)) if v})
        return out


@dataclass
class PreparedMedia:
    uploads: dict[str, dict[str, Any]] = field(default_factory=dict)  # for build_question_event(media=...)
    messages: list[dict[str, Any]] = field(default_factory=list)  # thread messages, without m.relates_to


async def encrypted_room(transport: Any, room: str | None) -> bool:
    """Whether what is sent to ``room`` goes out encrypted (its events then
    sized for the ciphertext, its files encrypted before they are uploaded)."""
    room_encrypted = getattr(transport, "room_encrypted", None)
    return bool(room and room_encrypted and await room_encrypted(room))


async def prepare(qset: QuestionSet, question: Question, set_dir: Path, store: Store, transport: Any,
                  room: str | None = None) -> PreparedMedia:
    """Upload (or find uploaded) every media item of ``question``; encrypted
    when ``room`` is an encrypted room, so the server never holds the plain file."""
    encrypted = await encrypted_room(transport, room)
    out = PreparedMedia()
    fs = LocalFilesystem(str(set_dir))
    for index, item in enumerate(question.media or ()):
        if item.src is None:
            out.messages.append(figure_message(item, index))
            continue
        found = resolve(item.src, list(qset.media_roots), fs)
        if not found.ok or found.path is None:
            out.messages.append(_missing_message(item))
            continue
        try:
            upload = await _upload_once(Path(found.path), store, transport, encrypted)
        except Exception as exc:  # noqa: BLE001 - one bad file must not keep the question back
            if passing(exc):
                # A 502, a timeout, a connection reset: the question waits and
                # its set is tried again, rather than posted for good without it.
                raise
            log.warning("media %s of %s/%s not uploaded: %s", item.src, qset.id, question.id, exc)
            out.messages.append(_missing_message(item))
            continue
        out.uploads[item.src] = upload.description()
        captions = captions_for(found, list(qset.media_roots), fs) if media_type(item.src) == "video" else None
        if captions:
            try:
                vtt = await _upload_once(Path(captions), store, transport, encrypted)
                # Before the video: a thread's summary shows its last message,
                # which should be the video, not its subtitles file.
                out.messages.append(_file_message(vtt, captions_caption(upload.name)))
            except Exception as exc:  # noqa: BLE001
                if passing(exc):
                    raise  # the question waits, as for its video: posted for good without them, never sent
                log.warning("captions %s not uploaded: %s", captions, exc)
        out.messages.append(media_message(item, upload))
    return out


def passing(exc: BaseException) -> bool:
    """A failure of the homeserver or the network that another try may not meet."""
    import aiohttp

    return bool(getattr(exc, "transient", False)) or isinstance(exc, (asyncio.TimeoutError, aiohttp.ClientError))


def captions_caption(video_name: str) -> str:
    return f"Captions (WebVTT subtitles) for the video {video_name}, which follows"


async def post_one_pager(qset: QuestionSet, question: Question, set_dir: Path, question_event_id: str, room_id: str,
                         store: Store, transport: Any) -> None:
    """Post the question's background (``one_pager``) into its thread, once.

    The question message promises it there.  A block with a file is resolved
    and uploaded like a media item (same roots, same checks); one that can't
    be is named instead.  Transaction ids follow the message's place, so a
    retry after a crash re-sends the same transactions.
    """
    key = f"one_pager_posted:{question_event_id}"
    if not question.one_pager or await store.run(store.get_meta, key):
        return
    blocks = [block.model_dump(mode="json") for block in question.one_pager]
    encrypted = await encrypted_room(transport, room_id)
    parts = render_one_pager(blocks, title=question.title, labels={o.id: o.label for o in question.options or ()},
                             message_max=ENCRYPTED_MESSAGE_MAX_BYTES if encrypted else MESSAGE_MAX_BYTES)
    fs = LocalFilesystem(str(set_dir))
    for index, part in enumerate(parts):
        content = part.content
        if part.media is not None and part.media.src:
            found = resolve(part.media.src, list(qset.media_roots), fs)
            if found.ok and found.path is not None:
                try:
                    content = media_message(part.media, await _upload_once(Path(found.path), store, transport,
                                                                           encrypted))
                except Exception as exc:  # noqa: BLE001 - the block is named instead
                    if passing(exc):
                        # Tried again with the set (the parts sent already are
                        # the same transactions): marked posted, it was never.
                        raise
                    log.warning("background file %s of %s/%s not uploaded: %s", part.media.src, qset.id,
                                question.id, exc)
        # Set text in the thread: any user id in it is the set's words, not a ping.
        content = {**content, "m.mentions": {}, "m.relates_to": in_thread(question_event_id)}
        await transport.send(room_id, "m.room.message", content, txn_id("one-pager", question_event_id, str(index)))
    await store.run_written(store.set_meta, key, "1")


# A part of a question's whole text sent into its thread, in UTF-8 bytes:
# well inside an event (65,536 bytes) even once escaped or encrypted.
WHOLE_PART_BYTES = 15_000


async def post_whole_question(question: Question, body: str, question_event_id: str, room_id: str, store: Store,
                              transport: Any) -> None:
    """A question text too long for its message (shortened there, saying so:
    ``render.WHOLE_IN_THREAD``) sent whole into its thread, once, in parts
    that each fit an event: a person must read all of what they answer."""
    key = f"whole_posted:{question_event_id}"
    if question.question in body or await store.run(store.get_meta, key):
        return
    parts = text_parts(question.question, WHOLE_PART_BYTES)
    for index, part in enumerate(parts):
        heading = f"The whole question ({index + 1} of {len(parts)}):" if len(parts) > 1 else "The whole question:"
        # Set text in the thread: any user id in it is the set's words, not a ping.
        content = {"msgtype": "m.notice", "body": f"{heading}\n\n{part}", "m.mentions": {},
                   "m.relates_to": in_thread(question_event_id)}
        await transport.send(room_id, "m.room.message", content, txn_id("whole", question_event_id, str(index)))
    await store.run_written(store.set_meta, key, "1")


def text_parts(text: str, max_bytes: int) -> list[str]:
    """``text`` in consecutive parts of at most ``max_bytes`` UTF-8 bytes,
    each ending at a paragraph's or a word's end where one is near."""
    parts: list[str] = []
    rest = text
    while len(rest.encode()) > max_bytes:
        head = rest.encode()[:max_bytes].decode(errors="ignore")
        cut = max(head.rfind("\n\n"), head.rfind("\n"), head.rfind(" "))
        if cut < len(head) // 2:
            cut = len(head)  # no break near the end: cut where the bytes end
        parts.append(head[:cut].rstrip())
        rest = rest[cut:].lstrip()
    return [*parts, rest] if rest or not parts else parts


async def post_in_thread(messages: list[dict[str, Any]], question_event_id: str, room_id: str, store: Store,
                         transport: Any) -> None:
    """Post the media messages into the question's thread, once."""
    key = f"media_posted:{question_event_id}"
    if not messages or await store.run(store.get_meta, key):
        return
    for index, content in enumerate(messages):
        content = {**content, "m.mentions": {}, "m.relates_to": in_thread(question_event_id)}
        await transport.send(room_id, "m.room.message", content, txn_id("media", question_event_id, str(index)))
    await store.run_written(store.set_meta, key, "1")


# ---------------------------------------------------------------- messages


def media_message(item: MediaItem, upload: Upload) -> dict[str, Any]:
    kind = item.type or media_type(upload.name) or ""
    # Element shows ``body`` as the caption when it differs from ``filename``.
    caption = " \u2014 ".join(s for s in (item.label, item.caption) if s) or item.alt or upload.name
    content: dict[str, Any] = {"msgtype": _MSGTYPES.get(kind, "m.file"), "body": caption, "filename": upload.name,
                               **_location(upload), "info": upload.info()}
    if item.alt:
        content["info"]["alt"] = item.alt  # no standard field yet; harmless for clients that ignore it
    if item.start is not None:
        content["body"] += f" (from {start_words(item.start)})"
    return content


def _file_message(upload: Upload, caption: str) -> dict[str, Any]:
    return {"msgtype": "m.file", "body": caption, "filename": upload.name, **_location(upload), "info": upload.info()}


def _location(upload: Upload) -> dict[str, Any]:
    # In an encrypted room the message carries ``file`` (with the key) instead of ``url``.
    return {"file": upload.file} if upload.file else {"url": upload.url}


def _missing_message(item: MediaItem) -> dict[str, Any]:
    text = f"A media file of this question could not be sent: {item.label or item.src}."
    return {"msgtype": "m.notice", "body": text}


def figure_message(item: MediaItem, index: int) -> dict[str, Any]:
    """A drawn figure as text: its alt, then its data, so the person sees what it shows."""
    figure = item.figure or {}
    title = item.alt or figure.get("title") or f"Figure {index + 1}"
    data = json.dumps(figure, indent=2, ensure_ascii=False, sort_keys=True)
    if len(data) > _FIGURE_TEXT_MAX:
        data = data[: _FIGURE_TEXT_MAX - 1] + "\u2026"
    body = f"Figure: {title}\n{data}"
    html = f"<p><em>Figure:</em> {esc(str(title))}</p><pre><code>{esc(data).replace('<br>', chr(10))}</code></pre>"
    return {"msgtype": "m.notice", "body": body, "format": "org.matrix.custom.html", "formatted_body": html}


# ---------------------------------------------------------------- uploading


# A file replaced while it is hashed and sent (an agent's PUT renames a new
# one into place) is sent again, this many times at most.
CHANGED_TRIES = 3


class ChangedWhileSent(OSError):
    """The file kept changing while it was uploaded: the question waits and
    its set is tried again (``passing``), as after a homeserver's 502."""

    transient = True


async def _upload_once(path: Path, store: Store, transport: Any, encrypted: bool = False) -> Upload:
    """The file uploaded (or found uploaded before, by its hash).  What is
    kept under a hash is what was sent: a file replaced between the hashing
    and the sending read as the new bytes, filed under the old bytes' hash,
    and a later question showing the old file was posted with the new one."""
    for _try in range(CHANGED_TRIES):
        upload = await _upload_as_it_is(path, store, transport, encrypted)
        if upload is not None:
            return upload
        log.info("media %s changed while it was uploaded; uploaded again", path)
    raise ChangedWhileSent(f"{path} kept changing while it was uploaded")


async def _upload_as_it_is(path: Path, store: Store, transport: Any, encrypted: bool) -> Upload | None:
    """None when the file changed between its hashing and the end of its upload."""
    # Read as it is hashed and sent (encrypted piece by piece in an
    # encrypted room), never whole: a clip of tens of megabytes, four sets
    # posted at once.
    digest, size, head, hashed = await asyncio.to_thread(_digest, path)
    # An encrypted upload is its own entry: its key must never reach a plain room.
    cache_key = f"e2e:{digest}" if encrypted else digest
    cached = await store.run(store.upload_of, cache_key)
    if cached is not None:
        url, info = cached
        return Upload(url=url, **{**info, "name": path.name})
    mime = mimetype(path.name)
    if encrypted:
        file_info = await transport.upload_encrypted(path, mime, path.name)
        url = file_info["url"]
    else:
        file_info = None
        url = await transport.upload(path, mime, path.name)
    upload = Upload(url=url, mimetype=mime, size=size, name=path.name, file=file_info)
    upload.w, upload.h = image_size(head)
    if upload.w is None and mime.split("/")[0] in ("video", "audio"):
        probed = await asyncio.to_thread(probe, str(path))
        upload.w, upload.h, upload.duration_ms = probed
    if await asyncio.to_thread(_identity, path) != hashed:
        return None  # what went up may be another file than the one hashed: not kept under its hash
    info: dict[str, Any] = {"mimetype": mime, "size": size, "w": upload.w, "h": upload.h,
                            "duration_ms": upload.duration_ms}
    if file_info:
        info["file"] = file_info
    await store.run_written(store.record_upload, cache_key, url, info)
    return upload


# How much of a file ``image_size`` looks at: a JPEG's size marker may come
# after an EXIF block with a thumbnail (64 KiB at most per segment).
IMAGE_HEAD = 1024 * 1024


def _digest(path: Path) -> tuple[str, int, bytes, tuple[int, ...]]:
    """(sha256 hex, size, its first IMAGE_HEAD bytes, the file's identity
    when hashed: ``_identity``), read in pieces."""
    with open(path, "rb") as handle:
        head = handle.read(IMAGE_HEAD)
        digest = hashlib.sha256(head)
        size = len(head)
        while chunk := handle.read(1024 * 1024):
            digest.update(chunk)
            size += len(chunk)
        return digest.hexdigest(), size, head, _identity_of(os.fstat(handle.fileno()))


def _identity(path: Path) -> tuple[int, ...]:
    try:
        return _identity_of(os.stat(path))
    except OSError:
        return ()  # gone: not the file hashed


def _identity_of(stat: os.stat_result) -> tuple[int, ...]:
    """What tells one version of a file from the next: its inode (a file
    renamed into place is another) and its size and time of change."""
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


def image_size(data: bytes) -> tuple[int | None, int | None]:
    """(width, height) from a PNG or JPEG header; (None, None) for anything else."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        return struct.unpack(">II", data[16:24])
    if data[:2] == b"\xff\xd8":
        pos = 2
        while pos + 9 < len(data):
            if data[pos] != 0xFF:
                return None, None
            marker = data[pos + 1]
            length = struct.unpack(">H", data[pos + 2 : pos + 4])[0]
            # SOF0..SOF15 carry the size, except DHT (C4), JPG (C8) and DAC (CC).
            if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
                height, width = struct.unpack(">HH", data[pos + 5 : pos + 9])
                return width, height
            pos += 2 + length
    return None, None


def probe(path: str) -> tuple[int | None, int | None, int | None]:
    """(width, height, duration in ms) from ffprobe when it is installed."""
    executable = shutil.which("ffprobe")
    if executable is None:
        return None, None, None
    command = ffprobe_command(executable, "stream=width,height:format=duration", path)
    try:
        done = subprocess.run(command, capture_output=True, timeout=PROBE_TIMEOUT_SECONDS, check=False)
        parsed = json.loads(done.stdout or b"{}")
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None, None, None
    width = height = None
    for stream in parsed.get("streams") or ():
        if isinstance(stream.get("width"), int):
            width, height = stream["width"], stream.get("height")
            break
    try:
        duration = round(float((parsed.get("format") or {}).get("duration")) * 1000)
    except (TypeError, ValueError):
        duration = None
    return width, height, duration
