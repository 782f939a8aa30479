"""Media an agent sends for its set (the HTTP ``PUT /v1/sets/{id}/media/{name}``
and the MCP tool ``upload_media``): the file lands in the set's folder,
where the set names it by ``src`` exactly as a local agent's set would.

The body is streamed to a temporary file in that folder (``bridge.wholefile``), counted
against the limit and the agent's quota (``media_quota``) while it is read
(whatever Content-Length said), then
fsynced and renamed over the name: a failed or cut-off upload leaves
nothing, and the poster never sees half a file."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bridge.agents.errors import AgentError, BadRequest, NotStored, TooLarge
from bridge.agents.media_quota import Charge
from bridge.questionset.media import UPLOAD_EXTENSIONS, mimetype
from bridge.wholefile import TempFile, in_thread

if TYPE_CHECKING:
    from bridge.agents.sets import AgentSets

# A plain name: no /, never two dots in a row; the OpenAPI document's
# pattern for {name} is exactly NAME_PATTERN.
PLAIN = r"[A-Za-z0-9][A-Za-z0-9_-]*(?:\.[A-Za-z0-9_-]+)*"
NAME = re.compile(PLAIN)
NAME_PATTERN = f"^{PLAIN}\\.(?:{'|'.join(UPLOAD_EXTENSIONS)})$"
NAME_MAX = 128
# agent_api.media_max's default (the config's own), for callers built without a config.
DEFAULT_MEDIA_MAX = 100 * 1024 * 1024
# Written to disk in pieces of about this size (each in a worker thread).
WRITE_BATCH = 1024 * 1024


async def stored_body(stored: Stored, upload_limit: Callable[[], Awaitable[int | None]] | None) -> dict[str, Any]:
    """What an upload answers: the file as stored, and a warning when the
    homeserver's upload limit is under it (the agent would otherwise learn
    only from the room that people saw the question without it)."""
    body = stored.as_dict()
    limit = await upload_limit() if upload_limit is not None else None
    if limit is not None and stored.size > limit:
        body["warnings"] = [{"where": stored.name, "message": (
            f"{stored.size} bytes, over the homeserver's upload limit of {limit} bytes: a question showing it "
            "goes out without it, its thread naming it as not sent")}]
    return body


@dataclass(frozen=True)
class Stored:
    set_id: str
    name: str
    size: int
    sha256: str
    created: bool

    def as_dict(self) -> dict[str, Any]:
        return {"ok": True, "set": self.set_id, "name": self.name, "src": self.name, "type": mimetype(self.name),
                "size": self.size, "sha256": self.sha256, "created": self.created}


def check_media_name(name: Any) -> str:
    """``name`` when it is a plain file name whose extension the format's media
    table knows (a video, sound or image, or a video's .vtt captions); BadRequest naming ``name``."""
    if not isinstance(name, str) or len(name) > NAME_MAX or not NAME.fullmatch(name):
        problem = (f"a plain file name of at most {NAME_MAX} characters: a letter or digit, then letters, digits, "
                   "_, - and single dots; no /")
    elif not re.fullmatch(NAME_PATTERN, name):
        shown = "." + name.rsplit(".", 1)[-1] if "." in name else "(none)"
        problem = (f"the extension {shown} is not a media type the format knows (in lower case): "
                   "video .mp4 .m4v .webm .mov, audio .mp3 .m4a .wav .ogg .oga .opus .flac, "
                   "image .png .jpg .jpeg .gif .webp .svg .avif, or .vtt captions")
    else:
        return name
    raise BadRequest(f"name: {problem}", findings=[{"where": "name", "message": problem}])


async def store_upload(sets: AgentSets, agent: str, set_id: str, name: str, chunks: AsyncIterator[bytes],
                       limit: int, expected: int | None = None) -> Stored:
    """An upload of either door: into the set's folder (claimed for it
    before the set's first PUT), within the agent's ``media_quota``."""
    with sets.media_dir(agent, set_id) as set_dir:
        async with sets.media_quota.charge(agent, Path(set_dir) / name, expected) as charge:
            return await receive(set_dir, set_id, name, chunks, limit, expected=expected, charge=charge)


async def receive(set_dir: Path, set_id: str, name: str, chunks: AsyncIterator[bytes], limit: int,
                  expected: int | None = None, charge: Charge | None = None) -> Stored:
    """Stream ``chunks`` into ``set_dir/name``; TooLarge past ``limit`` bytes,
    QuotaExceeded past ``charge``'s quota, BadRequest for an empty body or
    one shorter than ``expected``."""
    final = Path(set_dir) / name
    if os.path.isdir(final) and not os.path.islink(final):
        raise BadRequest(f"name: {name!r} is a folder in this set", findings=[
            {"where": "name", "message": "a folder of the set has this name"}])
    created = not os.path.lexists(final)
    try:
        part = TempFile(final, unique=True)  # two uploads of one name at once each write their own
    except OSError as exc:
        raise NotStored(f"the file could not be stored: {exc.strerror or exc}") from None
    digest, size, pending, ours = hashlib.sha256(), 0, bytearray(), None
    try:
        ours = os.lstat(part.temp)  # which file is this upload's, once renamed
        async for chunk in _until_cut(chunks):
            size += len(chunk)
            if size > limit:
                raise TooLarge(f"the file is larger than {limit} bytes (agent_api.media_max)")
            if charge is not None:
                charge.take(len(chunk))
            digest.update(chunk)
            pending += chunk
            if len(pending) >= WRITE_BATCH:
                await in_thread(part.write, bytes(pending))
                pending.clear()
        if expected is not None and size != expected:
            raise BadRequest(f"the body ended after {size} of {expected} bytes")
        if size == 0:
            raise BadRequest("the body is empty: send the file's bytes")
        await in_thread(part.write, bytes(pending))
        await in_thread(part.commit)
    except BaseException as exc:
        part.discard()
        if part.renamed and ours is not None:
            # Cancelled while the commit's thread ran (the client gone, a
            # timeout), or its folder's fsync failed: the rename went through,
            # but the upload fails, so its file goes too.  Kept, it sat under
            # its name after an answer saying nothing was stored, and kept a
            # folder claimed for it.  (A file it replaced went with the rename.)
            _remove_if_ours(final, ours)
        if isinstance(exc, OSError):
            raise NotStored(f"the file could not be stored: {exc.strerror or exc}") from None
        raise
    if charge is not None:
        charge.stored()
    return Stored(set_id, name, size, digest.hexdigest(), created)


def _remove_if_ours(path: Path, ours: os.stat_result) -> None:
    """``path`` removed when it is still the file written as ``ours``: another
    upload of the same name may have renamed its own over it since."""
    with contextlib.suppress(OSError):
        now = os.lstat(path)
        if (now.st_ino, now.st_dev) == (ours.st_ino, ours.st_dev):
            os.unlink(path)


async def _until_cut(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """``chunks``; a body cut off (the client gone, a short chunked body) is a
    BadRequest, never taken for the disk's failure."""
    iterator = aiter(chunks)
    while True:
        try:
            chunk = await anext(iterator)
        except StopAsyncIteration:
            return
        except AgentError:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever the transport raises, the body is not whole
            raise BadRequest(f"the body was cut off before its end ({type(exc).__name__})") from None
        yield chunk


async def pieces(data: bytes) -> AsyncIterator[bytes]:
    """``data`` as the chunks ``receive`` takes (for a file that came whole, over MCP)."""
    for start in range(0, len(data), WRITE_BATCH):
        yield data[start:start + WRITE_BATCH]
