"""Files over MCP: people's files as blob resources
(``askwright://sets/{id}/attachments/{name}``, listed under the agent's
sets' resources) and the tool ``upload_media`` (a small media file, base64,
into the set's folder).  The rules are those of the HTTP routes."""

from __future__ import annotations

import asyncio
import base64
import binascii
import os
from pathlib import Path
from typing import Any

import mcp_types as types

from bridge.agents.attachment_files import Digests, attachment_path, check_name, named_in, with_file_objects
from bridge.agents.errors import BadRequest, NotFound, TooLarge
from bridge.agents.files_http import attachment_url
from bridge.agents.media_files import check_media_name, pieces, store_upload, stored_body
from bridge.agents.readgate import ReadGate
from bridge.agents.sets import AgentSets
from bridge.questionset.media import mimetype

ATTACHMENT_TEMPLATE = "askwright://sets/{id}/attachments/{name}"
_PREFIX, _MIDDLE = "askwright://sets/", "/attachments/"
# One JSON-RPC message carries the whole file (base64, a third larger) and
# is held in memory while it is read, both ways: bigger files go through the
# HTTP PUT (``upload_media``) and GET (a resource read).
MCP_MEDIA_MAX = 32 * 1024 * 1024


def attachment_uri(set_id: str, name: str) -> str:
    return f"{_PREFIX}{set_id}{_MIDDLE}{name}"


def attachment_of_uri(uri: str) -> tuple[str, str] | None:
    """(set id, file name) of an attachment resource URI, or None."""
    if not uri.startswith(_PREFIX) or _MIDDLE not in uri[len(_PREFIX):]:
        return None
    set_id, name = uri[len(_PREFIX):].split(_MIDDLE, 1)
    return (set_id, name) if set_id and name else None


def base64_size(size: int) -> int:
    """How long ``size`` bytes are in base64."""
    return 4 * ((size + 2) // 3)


def wrapped_base64_size(size: int) -> int:
    """How long ``size`` bytes are in base64 in lines, as a JSON string: the
    densest common wrapping (PEM's 64 characters) with each line's CRLF
    escaped ("\\r\\n", four bytes)."""
    text = base64_size(size)
    return text + 4 * -(-text // 64)


class McpFiles:
    def __init__(self, sets: AgentSets, media_max: int, digests: Digests | None = None, *, local: bool = False):
        self.sets = sets
        # Served over stdio to an agent on this machine: a file too big to
        # carry is pointed to where it lies, not to an HTTP API it may not have.
        self.local = local
        self.media_max = min(media_max, MCP_MEDIA_MAX)
        self.digests = digests or Digests()
        self.turns = ReadGate()

    async def view(self, agent: str, set_id: str, view: dict[str, Any]) -> dict[str, Any]:
        """A read view as MCP gives it: each attachment an object whose url is its resource URI."""
        return await with_file_objects(view, self.sets.set_dir(agent, set_id),
                                       lambda name: attachment_uri(set_id, name), self.digests)

    async def resources(self, agent: str, set_ids: list[str]) -> list[types.Resource]:
        """Every file the answers of the agent's sets name, as a blob resource."""
        found = []
        for set_id in set_ids:
            try:
                set_dir = self.sets.set_dir(agent, set_id)
                names = sorted(named_in(await self.sets.read_all_apart(agent, set_id), set_dir))
            except NotFound:
                continue
            for name in names:
                try:
                    size = attachment_path(set_dir, name).stat().st_size
                except (NotFound, OSError):
                    continue
                found.append(types.Resource(uri=attachment_uri(set_id, name), name=f"{name} ({set_id})",
                                            description=f"A file a person sent with an answer to {set_id}",
                                            mime_type=mimetype(name), size=size))
        return found

    async def read(self, agent: str, uri: str) -> types.ReadResourceResult:
        """The file's bytes; NotFound for a file that is not one of this agent's sets' answers'."""
        parsed = attachment_of_uri(uri)
        if parsed is None:
            raise NotFound(f"no resource {uri}")
        set_id, name = parsed
        check_name(name)
        set_dir = self.sets.set_dir(agent, set_id)
        if name not in named_in(await self.sets.read_all_apart(agent, set_id), set_dir):
            raise NotFound(f"no file {name!r} in this set's answers")
        path = attachment_path(set_dir, name)
        # The front's gate holds a read's turn until its answer is sent, but
        # only for a request small enough to look into: these turns bound
        # the file's bytes and their base64 whatever the request looked like.
        async with self.turns.turn_of(agent):
            # Read and encoded on a worker thread: 20 MiB held the event loop ~150 ms.
            read = await asyncio.to_thread(_blob, path, uri, mimetype(name), MCP_MEDIA_MAX)
        if isinstance(read, int):
            elsewhere = f"read it at {path} on this machine" if self.local else \
                f"GET {attachment_url(set_id, name)} over the HTTP API (the same token)"
            raise TooLarge(f"{name} is {read} bytes, more than the {MCP_MEDIA_MAX} bytes a resource read "
                           f"carries: {elsewhere}")
        return read

    async def upload(self, agent: str, arguments: dict[str, Any]) -> dict[str, Any]:
        set_id, name = arguments["set_id"], check_media_name(arguments["name"])
        # Lines wrapped as MIME, `base64` and Python's encodebytes write them
        # are base64 still: the line breaks (any white space) are no data.
        text = "".join(arguments["data"].split())
        if len(text) > base64_size(self.media_max):
            raise TooLarge(f"data: the file is larger than {self.media_max} bytes; upload it with "
                           f"PUT /v1/sets/{set_id}/media/{name}")
        try:
            data = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise BadRequest("data: not base64", findings=[{"where": "data", "message": "the file's bytes in base64"}]) from None
        # Its size known before a byte is written: a file past the quota is refused at once.
        stored = await store_upload(self.sets, agent, set_id, name, pieces(data), self.media_max, expected=len(data))
        return await stored_body(stored, self.sets.upload_limit)


def _blob(path: Path, uri: str, mime: str, limit: int) -> types.ReadResourceResult | int:
    """The file as a blob resource; its size instead when it is over
    ``limit`` (looked at before it is read, and read no further than that:
    a file past the limit is never held)."""
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        data = handle.read(limit + 1) if size <= limit else b""
    if size > limit or len(data) > limit:
        return max(size, len(data))
    return types.ReadResourceResult(contents=[types.BlobResourceContents(
        uri=uri, mime_type=mime, blob=base64.b64encode(data).decode("ascii"))])
