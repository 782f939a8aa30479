"""The homeserver as the bridge sees it: matrix-nio's AsyncClient behind the
few calls the pipeline and the poster make.

nio already waits out 429s (``retry_after_ms``) and retries dropped
connections; this layer turns its error responses into exceptions and
classifies them as transient (retry the batch later) or permanent.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import quote

from nio import (AsyncClient, AsyncClientConfig, ErrorResponse, JoinedMembersResponse, JoinResponse,
                 RoomPutStateResponse, RoomRedactResponse, RoomSendResponse, UploadResponse)

log = logging.getLogger(__name__)


class MatrixError(Exception):
    def __init__(self, what: str, response: Any):
        self.status = getattr(response, "status_code", None)
        self.transient = self.status in (None, "M_LIMIT_EXCEEDED", "M_UNKNOWN") or str(self.status).startswith("5")
        super().__init__(f"{what}: {getattr(response, 'message', response)} ({self.status})")


def client_config() -> AsyncClientConfig:
    # Wait out homeserver restarts with a short, capped backoff rather than nio's minute-long one.
    return AsyncClientConfig(max_timeout_retry_wait_time=5, request_timeout=60, store_sync_tokens=False)


class NioTransport:
    """Sends as ``user_id`` with ``client``'s token (a bot's token or an appservice's as_token)."""

    def __init__(self, client: AsyncClient):
        self.client = client

    @property
    def user_id(self) -> str:
        return self.client.user_id

    async def send(self, room_id: str, event_type: str, content: dict[str, Any], txn_id: str) -> str:
        response = await self.client.room_send(room_id, event_type, content, tx_id=txn_id,
                                               ignore_unverified_devices=True)
        if not isinstance(response, RoomSendResponse):
            raise MatrixError(f"sending {event_type} to {room_id}", response)
        return response.event_id

    async def redact(self, room_id: str, event_id: str, reason: str, txn_id: str) -> None:
        response = await self.client.room_redact(room_id, event_id, reason=reason, tx_id=txn_id)
        if not isinstance(response, RoomRedactResponse):
            raise MatrixError(f"redacting {event_id}", response)

    async def joined_members(self, room_id: str) -> set[str]:
        response = await self.client.joined_members(room_id)
        if not isinstance(response, JoinedMembersResponse):
            raise MatrixError(f"listing members of {room_id}", response)
        return {member.user_id for member in response.members}

    async def join(self, room: str) -> str:
        response = await self.client.join(room)
        if not isinstance(response, JoinResponse):
            raise MatrixError(f"joining {room}", response)
        return response.room_id

    async def download(self, mxc: str, limit: int) -> bytes:
        """The bytes behind ``mxc``, at most ``limit`` of them.

        The authenticated media API first (Synapse serves new media only
        there); the legacy one for homeservers that predate it.
        """
        from bridge.service.attachments import FileGone, FileTooLarge

        server, _, media_id = mxc.removeprefix("mxc://").partition("/")
        if not server or not media_id or "/" in media_id:
            raise FileGone(mxc)
        quoted = f"{quote(server, safe='')}/{quote(media_id, safe='')}"
        headers = {"Authorization": f"Bearer {self.client.access_token}"}
        for path in (f"/_matrix/client/v1/media/download/{quoted}", f"/_matrix/media/v3/download/{quoted}"):
            response = await self.client.send("GET", path, headers=headers)
            try:
                if response.status in (404, 400) and path.startswith("/_matrix/client/v1"):
                    continue  # an older homeserver without authenticated media
                if response.status in (404, 403, 400):
                    raise FileGone(f"{mxc}: HTTP {response.status}")
                if response.status != 200:
                    raise MatrixError(f"downloading {mxc}", response)
                length = response.content_length
                if length is not None and length > limit:
                    raise FileTooLarge(mxc)
                data = await response.content.read(limit + 1)
                if len(data) > limit:
                    raise FileTooLarge(mxc)
                return data
            finally:
                response.release()
        raise FileGone(mxc)

    async def upload(self, data: bytes, content_type: str, filename: str) -> str:
        import io

        response, _ = await self.client.upload(io.BytesIO(data), content_type=content_type, filename=filename,
                                               filesize=len(data))
        if not isinstance(response, UploadResponse):
            raise MatrixError(f"uploading {filename}", response)
        return response.content_uri
