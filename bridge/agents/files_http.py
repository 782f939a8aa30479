"""The HTTP API's file routes: people's files out
(``GET /v1/sets/{id}/attachments/{name}``) and an agent's media in
(``PUT /v1/sets/{id}/media/{name}``).  Both for the agent's own sets only,
like every route; what they may touch is decided in ``attachment_files`` and
``media_files``."""

from __future__ import annotations

import asyncio
import math
import os
from email.utils import parsedate_to_datetime
from collections.abc import Callable, Mapping

from aiohttp import web

from bridge.agents.attachment_files import Digests, attachment_path, check_name, named_in, with_file_objects
from bridge.agents.bodyread import BodyGate, paced
from bridge.agents.errors import NotFound, TooLarge
from bridge.agents.media_files import check_media_name, store_upload, stored_body
from bridge.agents.sets import AgentSets
from bridge.questionset.media import mimetype

READ_CHUNK = 256 * 1024


def attachment_url(set_id: str, name: str) -> str:
    """Where the HTTP API serves a person's file (a path on the bridge's listener)."""
    return f"/v1/sets/{set_id}/attachments/{name}"


class FileRoutes:
    def __init__(self, sets: AgentSets, media_max: int, digests: Digests | None = None,
                 bodies: BodyGate | None = None):
        self.sets = sets
        self.media_max = media_max
        self.digests = digests or Digests()
        self.bodies = bodies or BodyGate()

    async def view(self, agent: str, set_id: str, view: dict) -> dict:
        """A read view as the HTTP API gives it: each attachment an object with its url."""
        return await with_file_objects(view, self.sets.set_dir(agent, set_id),
                                       lambda name: attachment_url(set_id, name), self.digests)

    async def attachment(self, request: web.Request, agent: str) -> web.StreamResponse:
        set_id, name = request.match_info["id"], request.match_info["name"]
        check_name(name)
        set_dir = self.sets.set_dir(agent, set_id)
        if name not in named_in(await self.sets.read_all_apart(agent, set_id), set_dir):
            raise NotFound(f"no file {name!r} in this set's answers")
        path = attachment_path(set_dir, name)
        # Served as a download, never rendered on the bridge's origin (an svg or html a person sent).
        response = _AsDecided(path, chunk_size=READ_CHUNK, headers={
            "Content-Type": mimetype(name), "X-Content-Type-Options": "nosniff",
            "Content-Disposition": f'attachment; filename="{name}"',
            "Content-Security-Policy": "default-src 'none'; sandbox"})
        if _empty_suffix(byte_ranges(request.headers)):  # "the last 0 bytes": unsatisfiable (RFC 9110 14.1.1)
            return web.Response(status=416, headers={"Content-Range": f"bytes */{os.stat(path).st_size}"})
        ignored = range_ignored(request.headers, lambda: etag_of(path), lambda: math.ceil(os.stat(path).st_mtime))
        if ignored or "If-Range" in request.headers:
            # If-Range decided here: aiohttp's own test takes a later date as a
            # match and the exact Last-Modified (whole seconds) as none.
            headers = request.headers.copy()
            headers.popall("If-Range", None)
            if ignored:
                del headers["Range"]  # the whole file, 200
            response.as_asked = request.clone(headers=headers)
        return response

    def _named(self, request: web.Request) -> tuple[str, str, int | None]:
        """(set id, file name, Content-Length) of a media upload; BadRequest
        for a name no media file has, TooLarge over ``media_max``."""
        name = check_media_name(request.match_info["name"])
        expected = request.content_length
        if expected is not None and expected > self.media_max:
            raise TooLarge(f"the file is larger than {self.media_max} bytes (agent_api.media_max)")
        return request.match_info["id"], name, expected

    async def media_refused(self, request: web.Request, agent: str) -> None:
        """What refuses an upload before its body is sent: its name, its
        size, another's folder, the agent's quota (``media_quota``: its
        files, and its uploads under way, with this one's Content-Length)."""
        set_id, name, expected = self._named(request)
        await asyncio.to_thread(self.sets.media_not_theirs, agent, set_id)
        async with self.sets.media_quota.charge(agent, self.sets.root / set_id / name, expected):
            pass

    async def put_media(self, request: web.Request, agent: str) -> web.Response:
        set_id, name, expected = self._named(request)
        # Streamed to disk, not memory, but a slow upload holds a connection
        # and a file for minutes all the same: counted with the big bodies
        # (before a folder is claimed, so a refused one takes no set id).
        give_back = self.bodies.take(agent, expected)
        try:
            body = paced(request.content.iter_chunked(READ_CHUNK))
            stored = await store_upload(self.sets, agent, set_id, name, body, self.media_max, expected=expected)
        finally:
            give_back()
        return web.json_response(await stored_body(stored, self.sets.upload_limit),
                                 status=201 if stored.created else 200)


def range_ignored(headers: Mapping[str, str], etag: Callable[[], str], modified: Callable[[], int]) -> bool:
    """Whether a request's Range is to be ignored, and the whole file served
    (RFC 9110 14.2 and 13.1.5): a unit other than bytes (which MUST be
    ignored), several ranges (served whole rather than as a multipart body),
    or an ``If-Range`` naming another version of the file than ``etag``'s or
    ``modified``'s (its Last-Modified, as aiohttp sends it: the mtime's
    second rounded up): a resumed download must not splice the new file
    onto the old.  An If-Range date matches only when it is exactly the
    Last-Modified (aiohttp took any date after it), and one that is neither
    a tag nor a date matches nothing.  A single byte range is aiohttp's to
    serve."""
    if "Range" not in headers:
        return False
    ranges = byte_ranges(headers)
    if ranges is None or "," in ranges:
        return True
    if_range = headers.get("If-Range", "").strip()
    if not if_range:
        return False
    if if_range.startswith(('"', "W/")):
        return if_range != etag()  # a weak tag never matches (13.1.5)
    try:
        return int(parsedate_to_datetime(if_range).timestamp()) != modified()
    except (TypeError, ValueError, IndexError, OverflowError):
        return True


def byte_ranges(headers: Mapping[str, str]) -> str | None:
    """What a ``Range: bytes=...`` asks for ("0-9", "-500", "0-1,5-6"); None
    for no Range, or one of another unit."""
    unit, equals, ranges = headers.get("Range", "").partition("=")
    return ranges.strip() if equals and unit.strip().lower() == "bytes" else None


def _empty_suffix(ranges: str | None) -> bool:
    """``bytes=-0`` (or ``-00``...): aiohttp served it as the whole file, 206."""
    return ranges is not None and ranges.startswith("-") and not ranges[1:].strip("0")


class _AsDecided(web.FileResponse):
    """A file answered to the request as the route decided it (its If-Range
    and an ignored Range taken out).  Prepared here and handed back, aiohttp
    prepared it again with the request as sent: an error in the log, and the
    connection closed under a client that kept it alive."""

    as_asked: web.BaseRequest | None = None

    async def prepare(self, request: web.BaseRequest):  # type: ignore[override]
        return await super().prepare(self.as_asked or request)


def etag_of(path: os.PathLike[str] | str) -> str:
    """The ETag aiohttp's FileResponse gives ``path`` as it is now."""
    st = os.stat(path)
    return f'"{st.st_mtime_ns:x}-{st.st_size:x}"'
