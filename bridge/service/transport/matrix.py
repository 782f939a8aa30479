"""The homeserver as the bridge sees it: matrix-nio's AsyncClient behind the
few calls the pipeline and the poster make.

nio already waits out 429s (``retry_after_ms``) and retries dropped
connections; this layer turns its error responses into exceptions and
classifies them as transient (retry the batch later) or permanent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
from nio import (Api, AsyncClient, AsyncClientConfig, JoinedMembersResponse, JoinedRoomsResponse, JoinResponse,
                 MessageDirection, RoomGetStateEventError, RoomGetStateEventResponse, RoomMessagesError,
                 RoomRedactResponse, RoomSendResponse, UploadResponse)
from nio.responses import Response

from bridge.protocol import paging
from bridge.protocol.retryafter import retry_after_seconds
from bridge.service.supervisor import Fatal
from bridge.service.transport.mediasession import MediaSession
from bridge.service.transport.pacing import Slot

log = logging.getLogger(__name__)

# A ``/context`` filter: with no events around, the state returned is the
# event's sender's membership at it.
_SENDERS_ONLY = json.dumps({"lazy_load_members": True}, separators=(",", ":"))


def http_status(response: Any) -> int | None:
    """The HTTP status behind a nio response (None when there is none: a
    dropped connection, a refusal of the bridge's own).  nio's
    ``status_code`` is the Matrix errcode, not this."""
    return getattr(getattr(response, "transport_response", None), "status", None)


def is_transient(errcode: str | None, http: int | None) -> bool:
    """Whether the same request may work later.  The HTTP status decides when
    there is one: a 5xx, 429 or 408 (a proxy that waited too long) is the
    homeserver (or a proxy before it) for now, any other 4xx is this request refused, M_UNKNOWN or not (a 400
    M_UNKNOWN was tried again for ever, and a 502 with a specific errcode
    given up for good).  Without one, the errcode alone: none (the network)
    or M_UNKNOWN (what a proxy's 502 says) is for now."""
    if errcode == "M_LIMIT_EXCEEDED":
        return True
    if http is not None and http >= 400:
        return http >= 500 or http in (408, 429)
    return errcode in (None, "M_UNKNOWN")  # (an error nio made of a 2xx body it could not read: as before)


class HttpReply:
    """An error reply the bridge read itself, as nio's responses carry one:
    its errcode as ``status_code``, its HTTP status behind ``transport_response``."""

    def __init__(self, status: int | None, reply: Any):
        reply = reply if isinstance(reply, dict) else {}
        self.status_code = reply.get("errcode") or str(status or "")
        self.message = reply.get("error", "")
        self.transport_response = self  # ``http_status`` reads ``.status`` behind it
        self.status = status


class MatrixError(Exception):
    def __init__(self, what: str, response: Any):
        self.status = getattr(response, "status_code", None)  # the Matrix errcode, as nio names it
        self.transient = is_transient(self.status, http_status(response))
        # With no response (a refusal of the bridge's own): the words alone, not "…: None (None)".
        super().__init__(what if response is None else f"{what}: {getattr(response, 'message', response)} ({self.status})")

    @property
    def permanent(self) -> bool:
        """Sending the same again will never work (forbidden, not in the room,
        the room gone, the content refused).  A token the homeserver no longer
        takes is not: it concerns every room, and an operator fixes it."""
        return not self.transient and self.status not in ("M_UNKNOWN_TOKEN", "M_MISSING_TOKEN")


async def state_content(client: AsyncClient, room_id: str, event_type: str, what: str) -> dict[str, Any] | None:
    """The content of the room's ``event_type`` state (empty key); None when
    the room has none.  nio hands over whatever body came as the content, a
    refusal's too: the bridge, not yet in a room, read the 403's error body
    as the room's encryption, took the room for unencrypted, and a question
    it sent as the join completed went out in the clear.  So the status
    decides: 200 is the content, 404 M_NOT_FOUND is none, anything else
    raises MatrixError naming ``what`` was being read."""
    response = await client.room_get_state_event(room_id, event_type)
    status = http_status(response)
    if isinstance(response, RoomGetStateEventResponse):
        if status == 200:
            return dict(response.content)
        read = response
        response = RoomGetStateEventError.from_dict(response.content, room_id)
        response.transport_response = read.transport_response  # (its HTTP status says whether to retry)
    if isinstance(response, RoomGetStateEventError) and status == 404 and response.status_code == "M_NOT_FOUND":
        return None
    raise MatrixError(f"reading {what} of {room_id}", response)


async def file_pieces(path: Path, piece: int = 1024 * 1024) -> AsyncIterator[bytes]:
    """A file's bytes, a piece at a time, each read on a worker thread (a
    sets folder on a network disk must not hold the event loop)."""
    handle = await asyncio.to_thread(open, path, "rb")
    try:
        while chunk := await asyncio.to_thread(handle.read, piece):
            yield chunk
    finally:
        handle.close()


def _tries(data: bytes | Path, filename: str, keys: dict[str, Any] | None = None) -> Any:
    """nio's body for an upload: ``data`` in pieces, from the start at each
    try (nio tries a dropped or timed-out upload again for ever; a few
    tries, then the caller decides).  With ``keys``: encrypted, each try
    with a fresh key, ``keys`` filled with the one that went out whole."""

    def body(_got_429: int, got_timeouts: int) -> AsyncIterator[bytes]:
        if got_timeouts >= UPLOAD_TRIES:
            raise MatrixError(f"uploading {filename}", f"the connection failed {got_timeouts} times")
        if keys is not None:
            keys.clear()  # a try cut short leaves no key of its own behind
            return _encrypted_pieces(data, keys)
        return _bytes_pieces(data) if isinstance(data, bytes) else file_pieces(data)

    return body


async def _bytes_pieces(data: bytes, piece: int = 1024 * 1024) -> AsyncIterator[bytes]:
    """Bytes in pieces as ``file_pieces`` gives a file's."""
    for at in range(0, len(data), piece):
        yield data[at:at + piece]


async def _encrypted_pieces(data: bytes | Path, keys: dict[str, Any], piece: int = 1024 * 1024) -> AsyncIterator[bytes]:
    """``data``'s ciphertext a piece at a time, each piece read, encrypted
    and hashed on a worker thread (0.5 s of cipher per 100 MB held /health,
    the syncs and every room), so a piece or two is all that is held.  nio's
    generator ends with the keys; it is read one piece ahead because aiohttp
    stops asking once Content-Length bytes went, and the keys come after."""
    from nio.crypto.attachments import encrypted_attachment_generator

    handle = None if isinstance(data, bytes) else await asyncio.to_thread(open, data, "rb")
    pieces = ([data[at:at + piece] for at in range(0, len(data), piece)] if handle is None
              else iter(lambda: handle.read(piece), b""))
    cipher = encrypted_attachment_generator(pieces)
    try:
        ciphertext = await asyncio.to_thread(next, cipher)
        while not isinstance(ciphertext, dict):
            following = await asyncio.to_thread(next, cipher)
            if isinstance(following, dict):
                keys.update(following)
            yield ciphertext
            ciphertext = following
        keys.update(ciphertext)  # an empty file: the keys alone
    finally:
        # (The generator is left to be collected: a cancelled try's worker
        # thread may still be inside it.)
        if handle is not None:
            handle.close()


class UploadRefused(Exception):
    """The homeserver will never take this file (over its upload limit)."""

    transient = False


# An upload whose connection drops this many times in a row has failed (for now).
UPLOAD_TRIES = 3
UPLOAD_LIMIT_ASK_SECONDS = 10


@dataclass
class MediaBody:
    """A download under way: the length the homeserver announced, and the body's chunks as they arrive."""

    length: int | None
    chunks: AsyncIterator[bytes]


async def _each_within(chunks: AsyncIterator[bytes], seconds: float) -> AsyncIterator[bytes]:
    """``chunks``, failing (TimeoutError) when the next takes longer than ``seconds``."""
    while True:
        try:
            async with asyncio.timeout(seconds):
                chunk = await anext(chunks)
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise TimeoutError(f"no byte of the body for {seconds:.0f} s") from None
        yield chunk


class TokenRefused(MatrixError, Fatal):
    """The homeserver refuses the bridge's access token while it runs (logged
    out, the token revoked): nothing more will come.  The bridge stops (exit
    1): a start with bot.password logs in anew, one with a token says so."""

    def __init__(self, cause: MatrixError):
        super().__init__(f"the homeserver refused the bridge's access token while it ran ({cause.status}): with "
                         "bot.password the next start logs in again; with bot.access_token give a new one", None)
        self.status, self.transient = cause.status, False


def token_refused(exc: BaseException) -> bool:
    return isinstance(exc, MatrixError) and exc.status in ("M_UNKNOWN_TOKEN", "M_MISSING_TOKEN")


class StopRequested(Exception):
    """A stop was asked for before the batch was handled: nothing of it is
    processed and the token stays, so the next start asks for it again."""


@dataclass
class TimelinePage(Response):
    """A page of ``/messages`` with its events as the homeserver sent them.

    matrix-nio would build an event object for each (and check it against
    its schemas), about 0.18 ms an event, only for the bridge to take the
    dict back out: a catch-up reads thousands.  The pipeline takes raw
    events anyway, and ``crypto.screen`` decrypts those still encrypted."""

    chunk: list[dict[str, Any]] = field(default_factory=list)
    start: str = ""
    end: str | None = None

    @classmethod
    def from_dict(cls, parsed: dict[str, Any], room_id: str = "") -> "TimelinePage | RoomMessagesError":
        chunk = parsed.get("chunk") if isinstance(parsed, dict) else None
        if not isinstance(chunk, list) or not isinstance(parsed.get("start"), str):
            return RoomMessagesError.from_dict(parsed if isinstance(parsed, dict) else {}, room_id)
        end = parsed.get("end")
        # Each event as the pipeline takes it: with its room (``/messages`` leaves it out).
        return cls(chunk=[{**event, "room_id": room_id} for event in chunk if isinstance(event, dict)],
                   start=parsed["start"], end=end if isinstance(end, str) else None)


# The longest a 429 on a download is taken at its word (past it, the
# download's own patience decides).
MEDIA_WAIT_AT_MOST = 300.0


async def _error_body(response: aiohttp.ClientResponse) -> dict[str, Any]:
    """An error response's JSON object (the Matrix error), {} when it is none."""
    try:
        # (read(n) gives what is buffered, not n bytes: read on to the end, within a bound.)
        raw = bytearray()
        while len(raw) <= 65536 and (chunk := await asyncio.wait_for(response.content.read(65536), 10)):
            raw.extend(chunk)
        body = json.loads(bytes(raw))
    except (ValueError, aiohttp.ClientError, asyncio.TimeoutError):
        return {}
    return body if isinstance(body, dict) else {}


async def _asked_to_wait(response: aiohttp.ClientResponse) -> float | None:
    """Seconds a 429 asked for: the body's ``retry_after_ms`` (the Matrix
    error), else ``Retry-After``; None when it named none."""
    waited = (await _error_body(response)).get("retry_after_ms")
    if isinstance(waited, int) and not isinstance(waited, bool) and waited >= 0:
        return min(waited / 1000, MEDIA_WAIT_AT_MOST)
    header = response.headers.get("Retry-After")
    return retry_after_seconds(header, time.time(), MEDIA_WAIT_AT_MOST) if header else None


async def timeline_page(client: AsyncClient, room_id: str, start: str | None, end: str | None,
                        limit: int, direction: MessageDirection = MessageDirection.back) -> TimelinePage:
    """One page of ``room_id``'s timeline (newest first unless ``direction``
    is forward), without the client's own messages (the bridge ignores them;
    after a big posting they would be nearly all of it)."""
    method, path = Api.room_messages(client.access_token, room_id, start=start, end=end,
                                     direction=direction, limit=limit,
                                     message_filter={"not_senders": [client.user_id]})
    # Through nio's request path: its waits on 429 and its retries hold here too.
    page = await client._send(TimelinePage, method, path, response_data=(room_id,))
    if not isinstance(page, TimelinePage):
        raise MatrixError(f"reading the timeline of {room_id}", page)
    return page


def timeline_pages(client: AsyncClient, room_id: str, start: str | None, end: str | None,
                   stop: asyncio.Event | None, limit: int = 500,
                   direction: MessageDirection = MessageDirection.back) -> AsyncIterator[TimelinePage]:
    """The pages of ``timeline_page`` from ``start`` to ``end`` (back, or
    forward and oldest first), read on past empty pages by ``paging``'s rule.
    StopRequested before the next page once ``stop`` is set: a long read
    must not hold up SIGTERM."""
    async def fetch(since: str | None) -> TimelinePage:
        if stop is not None and stop.is_set():
            raise StopRequested()
        return await timeline_page(client, room_id, since, end, limit, direction)

    return paging.pages(fetch, start, lambda empty: log.warning(
        "the timeline of %s gave %d empty pages in a row; read no further this time", room_id, empty))


async def read_ahead(pages: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """The items of ``pages``, each handed over once the next one is asked
    for: the homeserver reads the next page while the bridge judges this one."""
    upcoming = asyncio.ensure_future(anext(pages))
    try:
        while True:
            try:
                item = await upcoming
            except StopAsyncIteration:
                return
            upcoming = asyncio.ensure_future(anext(pages))
            # Runs the request up to its first wait on the network (a pooled
            # connection: the request is sent), before the caller's judging,
            # which does not yield, holds the loop.
            await asyncio.sleep(0)
            yield item
    finally:
        if not upcoming.done():
            upcoming.cancel()
            await asyncio.gather(upcoming, return_exceptions=True)


def client_config(encryption: bool = False) -> AsyncClientConfig:
    # Wait out homeserver restarts with a short, capped backoff rather than nio's minute-long one.
    # Encryption is asked for explicitly: nio turns it on whenever its e2e extra
    # is installed, and only the bot front sets up what it needs.
    extra: dict[str, Any] = {}
    if encryption:
        from bridge.service.encryption.keystore import KeyStore  # needs nio's e2e extra, checked before this

        extra["store"] = KeyStore
    return AsyncClientConfig(max_timeout_retry_wait_time=5, request_timeout=60, store_sync_tokens=False,
                             encryption_enabled=encryption, **extra)


class NioTransport:
    """Sends as ``user_id`` with ``client``'s token (a bot's token or an appservice's as_token)."""

    def __init__(self, client: AsyncClient, crypto: Any = None):
        self.client = client
        # bridge.service.encryption.crypto.Crypto when the client encrypts (bot mode), else None.
        self.crypto = crypto
        self.slot = Slot()  # sends take turns by priority (``pacing``)
        self.media = MediaSession(client)  # files people send: a pool of connections apart from the syncs'

    @property
    def user_id(self) -> str:
        return self.client.user_id

    async def send(self, room_id: str, event_type: str, content: dict[str, Any], txn_id: str) -> str:
        if room_id.startswith("#"):
            # A configured alias not joined (``RoomIds.of``): the homeserver's
            # "not in room #..." hid why; what is posted there waits for the join.
            raise MatrixError(f"the room {room_id} is not joined yet (an alias that names no room, or a room that "
                              "refuses the bridge: the log's join warnings say which); posted once it is joined",
                              None)
        async with self.slot.turn():
            if self.crypto is None:
                response = await self.client.room_send(room_id, event_type, content, tx_id=txn_id,
                                                       ignore_unverified_devices=True)
            else:
                response = await self._send_maybe_encrypted(room_id, event_type, content, txn_id)
        if not isinstance(response, RoomSendResponse):
            raise MatrixError(f"sending {event_type} to {room_id}", response)
        return response.event_id

    async def _send_maybe_encrypted(self, room_id: str, event_type: str, content: dict[str, Any],
                                    txn_id: str) -> Any:
        from nio.exceptions import LocalProtocolError, OlmUnverifiedDeviceError, SendRetryError

        encrypted = await self.crypto.before_send(room_id)
        before = self.crypto.session_snapshot(room_id) if encrypted else None
        try:
            # nio encrypts when the room is encrypted (it knows: before_send told it).
            response = await self.client.room_send(room_id, event_type, content, tx_id=txn_id,
                                                   ignore_unverified_devices=self.crypto.ignore_unverified_devices)
        except OlmUnverifiedDeviceError as exc:
            # A device appeared between the trust pass and the send: place it and retry later.
            self.crypto.apply_trust()
            raise MatrixError(f"sending {event_type} to {room_id}", exc) from None
        except (LocalProtocolError, SendRetryError) as exc:
            raise MatrixError(f"encrypting {event_type} for {room_id}", exc) from None
        if encrypted:
            self.crypto.log_shared(room_id, before)
        return response

    async def delayed_events(self) -> bool:
        """Whether the homeserver takes MSC4140 delayed events (it says so in
        /versions; one that does not would ignore the delay and send at once)."""
        if getattr(self, "_delayed", None) is None:
            response = await self.client.send("GET", "/_matrix/client/versions")
            try:
                body = await response.json() if response.status == 200 else {}
            finally:
                response.release()
            self._delayed = bool((body.get("unstable_features") or {}).get("org.matrix.msc4140"))
        return self._delayed

    async def send_delayed(self, room_id: str, event_type: str, content: dict[str, Any], txn_id: str,
                           delay_ms: int) -> str | None:
        """Hand the homeserver an event to send in ``delay_ms`` (MSC4140); its
        delay id, or None when it does not take delayed events (or refuses this
        one).  In an encrypted room the event is encrypted first, as a send is."""
        if not await self.delayed_events():
            return None
        if self.crypto is not None and await self.room_encrypted(room_id):
            await self.crypto.before_send(room_id)
            try:
                await self.crypto.ensure_room_key(room_id)
                event_type, content = self.client.encrypt(room_id, event_type, content)
            except Exception as exc:  # noqa: BLE001 - no session to encrypt with: the bridge sends it itself
                log.warning("delayed %s for %s not encrypted (%s); the bridge sends it itself", event_type, room_id, exc)
                return None
        path = (f"/_matrix/client/v3/rooms/{quote(room_id, safe='')}/send/{quote(event_type, safe='')}/"
                f"{quote(txn_id, safe='')}?org.matrix.msc4140.delay={int(delay_ms)}")
        async with self.slot.turn():
            response = await self.client.send("PUT", path, data=json.dumps(content),
                                              headers={"Authorization": f"Bearer {self.client.access_token}",
                                                       "Content-Type": "application/json"})
            try:
                body = await response.json() if response.status == 200 else None
                status = response.status
            finally:
                response.release()
        if status >= 500 or status == 429:  # (a refusal is None: the bridge sends it itself)
            raise MatrixError(f"scheduling {event_type} in {room_id}", f"HTTP {status}")
        delay_id = body.get("delay_id") if isinstance(body, dict) else None
        return delay_id if isinstance(delay_id, str) else None

    def key_recipients(self, room_id: str) -> frozenset[tuple[str, str]] | None:
        """The devices that can read what is encrypted for ``room_id`` now
        (empty: a new room key comes with the next send); None when what is
        sent there goes out unencrypted.  A delayed event encrypted earlier
        is readable by those its key went to then, and no one since."""
        if self.crypto is None:
            return None
        room = self.crypto.client.rooms.get(room_id)
        if room is None or not room.encrypted:
            return None
        return self.crypto.key_recipients(room_id)

    async def share_room_key(self, room_id: str) -> None:
        """A room key in use in ``room_id``, shared with its devices now, as
        the next send would (none after a restart, or once a member came or went)."""
        if self.crypto is not None and await self.room_encrypted(room_id):
            await self.crypto.before_send(room_id)
            await self.crypto.ensure_room_key(room_id)

    async def cancel_delayed(self, delay_id: str) -> bool:
        """Cancel a delayed event: True when this cancelled it, False when it
        was gone already (sent, or cancelled before); gone either way."""
        path = f"/_matrix/client/unstable/org.matrix.msc4140/delayed_events/{quote(delay_id, safe='')}"
        response = await self.client.send("POST", path, data=json.dumps({"action": "cancel"}),
                                          headers={"Authorization": f"Bearer {self.client.access_token}",
                                                   "Content-Type": "application/json"})
        try:
            status = response.status
        finally:
            response.release()
        if status >= 500 or status == 429:
            raise MatrixError(f"cancelling delayed event {delay_id}", f"HTTP {status}")
        return status < 300

    async def list_delayed(self) -> list[dict[str, Any]] | None:
        """The delayed events the homeserver still holds for the bridge's user
        (MSC4140 ``GET .../delayed_events``: ``delayed_events`` in Synapse's
        form, ``scheduled`` with ``next_batch`` in the MSC's later one); None
        when it lists none it will say (no delayed events, an error)."""
        if not await self.delayed_events():
            return None
        found: list[dict[str, Any]] = []
        since: str | None = None
        for _page in range(100):
            path = "/_matrix/client/unstable/org.matrix.msc4140/delayed_events"
            if since:
                path += f"?from={quote(since, safe='')}"
            response = await self.client.send("GET", path, headers={
                "Authorization": f"Bearer {self.client.access_token}"})
            try:
                body = await response.json() if response.status == 200 else None
            finally:
                response.release()
            if not isinstance(body, dict):
                return None
            page = body.get("delayed_events", body.get("scheduled"))
            if isinstance(page, list):
                found.extend(e for e in page if isinstance(e, dict))
            since = body.get("next_batch") if isinstance(body.get("next_batch"), str) else None
            if not since:
                break
        return found

    async def put_state(self, room_id: str, event_type: str, state_key: str, content: dict[str, Any]) -> str:
        """A state event (in the clear: state is never encrypted), e.g. the answer log's checkpoint."""
        async with self.slot.turn():
            response = await self.client.room_put_state(room_id, event_type, content, state_key=state_key)
        event_id = getattr(response, "event_id", None)
        if not isinstance(event_id, str):
            raise MatrixError(f"putting {event_type} in {room_id}", response)
        return event_id

    async def room_encrypted(self, room_id: str) -> bool:
        """True when what is sent into ``room_id`` goes out encrypted."""
        if self.crypto is None:
            return False
        return (await self.crypto.ensure_room(room_id)).encrypted

    async def takes_reactions(self, room_id: str) -> bool:
        """Whether a keycap reaction can answer in ``room_id``: clients send
        reactions unencrypted, which an encrypted room under a trust level
        that checks sessions refuses (no session to check)."""
        return self.crypto is None or self.crypto.takes_plain_answers or not await self.room_encrypted(room_id)

    async def redact(self, room_id: str, event_id: str, reason: str, txn_id: str) -> None:
        response = await self.client.room_redact(room_id, event_id, reason=reason, tx_id=txn_id)
        if not isinstance(response, RoomRedactResponse):
            raise MatrixError(f"redacting {event_id}", response)

    async def joined_rooms(self) -> set[str]:
        """The rooms the account is in now."""
        response = await self.client.joined_rooms()
        if not isinstance(response, JoinedRoomsResponse):
            raise MatrixError("listing the joined rooms", response)
        return set(response.rooms)

    async def joined_members(self, room_id: str) -> set[str]:
        response = await self.client.joined_members(room_id)
        if not isinstance(response, JoinedMembersResponse):
            raise MatrixError(f"listing members of {room_id}", response)
        return {member.user_id for member in response.members}

    async def event_context(self, room_id: str, event_id: str) -> dict[str, Any] | None:
        """``/context`` of ``event_id`` in ``room_id`` with no events around
        it: the event as the homeserver has it, and (``state``) its sender's
        membership there.  None for an event it does not have there (or will
        not show); MatrixError when it can't tell now."""
        path = (f"/_matrix/client/v3/rooms/{quote(room_id, safe='')}/context/{quote(event_id, safe='')}"
                f"?limit=0&filter={quote(_SENDERS_ONLY)}")
        response = await self.client.send("GET", path, headers={"Authorization": f"Bearer {self.client.access_token}"})
        try:
            status = response.status
            body = await response.json() if status == 200 else None
        finally:
            response.release()
        if status in (400, 403, 404):
            return None
        if status != 200 or not isinstance(body, dict):
            raise MatrixError(f"reading the context of {event_id}", f"HTTP {status}")
        return body

    async def power_levels(self, room_id: str) -> dict[str, Any]:
        """The room's m.room.power_levels content ({} when it has none)."""
        return await state_content(self.client, room_id, "m.room.power_levels", "the power levels") or {}

    async def join(self, room: str) -> str:
        response = await self.client.join(room)
        if not isinstance(response, JoinResponse):
            raise MatrixError(f"joining {room}", response)
        if self.crypto is not None:
            # nio must know whether the room is encrypted before the first post,
            # as the room is now: what a try before the join saw is forgotten.
            self.crypto.client.rooms.pop(response.room_id, None)
            await self.crypto.ensure_room(response.room_id)
        return response.room_id

    @contextlib.asynccontextmanager
    async def download(self, mxc: str, stall_seconds: float = 20.0,
                       first_byte_seconds: float | None = None) -> AsyncIterator[MediaBody]:
        """The body behind ``mxc``, to be read in chunks (never whole: a file
        may be hundreds of megabytes).  Waiting ``stall_seconds`` for the next
        byte of the body fails the read (a timeout), as a cut connection does
        (a payload error); the response itself may take ``first_byte_seconds``
        (None: as long as the caller's bound): a homeserver fetching a file
        from another server over federation has it whole before it sends a byte.

        The authenticated media API first (Synapse serves new media only
        there); the legacy one for homeservers that predate it.
        """
        from bridge.protocol.file_body import BodyTooLarge
        from bridge.service.answering.attachments import FileGone, NotReached, RateLimited

        server, _, media_id = mxc.removeprefix("mxc://").partition("/")
        if not server or not media_id or "/" in media_id:
            raise FileGone(mxc)
        quoted = f"{quote(server, safe='')}/{quote(media_id, safe='')}"
        # The file as stored: aiohttp asks for gzip and unpacks it, while the
        # Content-Length is the packed one, so a proxy that compresses made
        # every file that packs larger (ciphertext, random bytes) "cut short".
        headers = {"Authorization": f"Bearer {self.client.access_token}", "Accept-Encoding": "identity"}
        # No bound on the whole request (the caller bounds each try), nor
        # aiohttp's on reading (it would bound the wait for the response too):
        # the connection, the response and each wait for the body's next bytes.
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=stall_seconds)
        for path in (f"/_matrix/client/v1/media/download/{quoted}", f"/_matrix/media/v3/download/{quoted}"):
            async with asyncio.timeout(first_byte_seconds):
                response = await self.media.get(path, headers=headers, timeout=timeout)
            try:
                if response.status in (404, 400) and path.startswith("/_matrix/client/v1"):
                    continue  # an older homeserver without authenticated media
                if response.status in (404, 403, 400):
                    raise FileGone(f"{mxc}: HTTP {response.status}")
                if response.status == 502 and (await _error_body(response)).get("errcode") == "M_TOO_LARGE":
                    # A file on another server past what ours fetches over
                    # federation (its max_upload_size): never "not reached".
                    raise BodyTooLarge(f"{mxc}: larger than the homeserver fetches from {server}")
                if response.status in (502, 504):
                    # (The file's server unreachable from ours, or ours behind
                    # a proxy while it restarts: either comes back.)
                    raise NotReached(f"{mxc}: HTTP {response.status}: {server} not reached")
                if response.status == 429:
                    raise RateLimited(f"{mxc}: HTTP 429: the homeserver limits downloads",
                                      await _asked_to_wait(response))
                if response.status != 200:
                    raise MatrixError(f"downloading {mxc}", response)
                # Packed all the same (a proxy that ignores the ask): the length is the packed one, no promise.
                packed = response.headers.get("Content-Encoding", "identity").strip().lower() not in ("", "identity")
                length = None if packed else response.content_length
                yield MediaBody(length, _each_within(response.content.iter_any(), stall_seconds))
                return
            finally:
                if response.content.at_eof():
                    response.release()  # the connection goes back to the pool
                else:
                    response.close()  # a body left unread (refused, cut off): not reusable
        raise FileGone(mxc)

    async def upload_limit(self) -> int | None:
        """The homeserver's upload limit in bytes (``m.upload.size`` of the
        media config), None when it names none or can't be asked; asked once."""
        if not hasattr(self, "_upload_limit"):
            limit = None
            for path in ("/_matrix/client/v1/media/config", "/_matrix/media/v3/config"):
                try:
                    response = await self.client.send("GET", path, headers={
                        "Authorization": f"Bearer {self.client.access_token}"}, timeout=UPLOAD_LIMIT_ASK_SECONDS)
                    try:
                        body = await response.json() if response.status == 200 else None
                    finally:
                        response.release()
                except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
                    return None  # asked again at the next upload
                if isinstance(body, dict):
                    size = body.get("m.upload.size")
                    limit = size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None
                    break
            self._upload_limit = limit
        return self._upload_limit

    async def _within_limit(self, data: bytes | Path, filename: str) -> int:
        """``data``'s size; UploadRefused over the homeserver's upload limit
        (Synapse answers 413 and resets the connection while the body is
        still sent: nio saw a dropped connection and tried again for ever)."""
        size = len(data) if isinstance(data, bytes) else data.stat().st_size
        limit = await self.upload_limit()
        if limit is not None and size > limit:
            raise UploadRefused(f"uploading {filename}: {size} bytes, over the homeserver's upload limit "
                                f"of {limit} bytes")
        return size

    async def upload(self, data: bytes | Path, content_type: str, filename: str) -> str:
        """Upload ``data`` (the bytes, or a file read as it is sent: a clip of
        tens of megabytes is never held whole); its mxc URL."""
        size = await self._within_limit(data, filename)
        response, _ = await self.client.upload(_tries(data, filename), content_type=content_type,
                                               filename=filename, filesize=size)
        if not isinstance(response, UploadResponse):
            raise MatrixError(f"uploading {filename}", response)
        return response.content_uri

    async def upload_encrypted(self, data: bytes | Path, content_type: str, filename: str) -> dict[str, Any]:
        """Uploads ``data`` (or the file) encrypted with a fresh key; returns
        the ``file`` object an event in an encrypted room carries instead of ``url``."""
        # The ciphertext is as long as the file (AES-CTR): one over the limit
        # is refused before it is read.  Neither the file nor its ciphertext
        # is ever held whole (a 100 MB clip was held three times over).
        size = await self._within_limit(data, filename)
        keys: dict[str, Any] = {}
        # The content repository sees only ciphertext, so it gets no real type or name.
        response, _ = await self.client.upload(_tries(data, filename, keys), content_type="application/octet-stream",
                                               filename="encrypted", filesize=size)
        if not isinstance(response, UploadResponse):
            raise MatrixError(f"uploading {filename}", response)
        if not keys:  # the file grew while it was sent: what went up is not all of it
            raise MatrixError(f"uploading {filename}", "the file changed while it was sent")
        return {**keys, "url": response.content_uri}
