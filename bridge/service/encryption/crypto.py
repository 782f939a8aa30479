"""End-to-end encryption on matrix-nio's olm machine (vodozemac), for both
modes (each hands nio what it receives for the bridge's device:
``devicenews``; appservice mode's transactions: ``ascrypto``).

What nio does by itself: it encrypts in ``room_send`` when it knows the room
is encrypted, takes the room keys and other to-device messages handed to it
(``devicenews``: nio reads no sync response in either mode), and keeps the
account, sessions and device keys in its SQLite store.  What it leaves to its
caller, and this module does:

* decrypting the rooms' events (``screen``, in ``receiving``) and telling
  nio what those events say of members and encryption (``note_events``),
  since nio does not read them;
* making sure nio knows every room the bridge sends to, with its encryption
  state and members, before anything is posted: the bridge may post before
  its first sync, and a room nio does not know would otherwise get plaintext;
* the key chores nio's own ``sync_forever`` would do (upload, query, claim,
  queued to-device messages), since the bridge runs its own sync loop;
* the trust policy (``encryption.trust``) and a log of who got room keys;
  cross-signing (the bridge's own identity and others' signed devices) is
  ``crosssigning``'s;
* events it cannot decrypt yet: kept in the bridge's store before the sync
  token moves past them, their keys asked of the sender (``keyrequests``),
  retried on every sync, and after the grace period given up on with a word
  to the person (never recorded as an answer): ``receiving``, whose half of
  ``Crypto`` is a mixin there.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from nio import AsyncClient, KeysQueryResponse, KeysUploadError
from nio.rooms import MatrixRoom

from bridge.protocol.keyquery import answered
from bridge.service.config import Encryption
from bridge.service.encryption.keyrequests import KeyRequests
from bridge.service.encryption.receiving import ENCRYPTED, ENCRYPTION_STATE, Receiving
from bridge.service.transport.matrix import state_content
from bridge.service.storage.store import LogEntry, Store

if TYPE_CHECKING:
    from bridge.service.encryption.crosssigning import CrossSigning

log = logging.getLogger(__name__)

# How long a send waits to learn who is invited (they get its room key too).
INVITED_READ_SECONDS = 10.0

# The trust levels that check the session an answer was sent from: an answer
# in the clear names none, and a device nobody placed never gets keys.
SESSION_CHECKING = ("verified", "cross-signed")



def available() -> bool:
    """True when matrix-nio was installed with its e2e extra."""
    from nio.crypto import ENCRYPTION_ENABLED

    return bool(ENCRYPTION_ENABLED)


def crypto_dir(store_path: Path) -> Path:
    """Where nio keeps the device's keys and sessions: beside the bridge's store."""
    return store_path.with_name(store_path.name + ".crypto")


def _said_if_failed(task: asyncio.Future[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("key chores left running behind a send failed (%s); the next send or sync tries again",
                    task.exception())


class Crypto(Receiving):
    """The bridge's encryption state around one nio client with olm loaded."""

    def __init__(self, client: AsyncClient, store: Store, settings: Encryption,
                 on_outcome: Callable[[LogEntry], None] | None = None, clock: Callable[[], int] | None = None,
                 cross_signing: CrossSigning | None = None):
        self.client = client
        # The bridge's own cross-signing identity, and the check of others' devices for trust: cross-signed.
        self.cross_signing = cross_signing
        self.store = store
        self.settings = settings
        self.on_outcome = on_outcome
        # The store's clock: undecrypted.first_seen is judged against the
        # patience by whichever instance leads when the keys are late.
        self.clock = clock = clock or store.clock.now_ms
        self._trust_logged: dict[tuple[str, str], str] = {}
        # Rooms whose members changed where no sync told nio (appservice mode).
        self._members_changed: set[str] = set()
        self.key_requests = KeyRequests(client, clock)
        self._signing: asyncio.Future[None] | None = None
        # People nio asked the devices of and got no answer for (their
        # homeserver unreachable): nio keeps them to ask again, and their
        # encrypted messages wait rather than being judged on devices unread.
        self._devices_unanswered: set[str] = set()
        self._querying = asyncio.Lock()
        self._queried: set[str] = set()  # whom the query under way asks about
        self._behind: asyncio.Future[None] | None = None  # key chores another room's send left running
        self._waiting_logged: set[str] = set()  # kept events already said to wait for their sender's keys
        # Events from a session nio did not know -> their sender, whose devices were asked for.
        self._sessions_asked: dict[str, str] = {}
        self._undecrypted_said: set[Any] = set()  # kept events ``_not_decrypted`` spoke of
        # The last look at the kept events found none, and none was kept
        # since: the next look needs no job on the store's thread.  Only this
        # object keeps events, and a term as leader has one of its own (a
        # takeover starts with a new one, which looks).
        self._none_kept = False
        # When this run first looked at kept events: each waits the grace
        # period from then at least (``Receiving._given_up_at``).
        self._first_look: int | None = None

    # -- start-up -------------------------------------------------------

    def describe_device(self) -> str:
        olm = self.client.olm
        fingerprint = olm.account.identity_keys["ed25519"] if olm else "?"
        return f"device {self.client.device_id}, ed25519 fingerprint {_grouped(fingerprint)}"

    async def start(self) -> None:
        log.info("end-to-end encryption on (trust: %s); the bridge's %s", self.settings.trust, self.describe_device())
        # A new device's keys go up first: signing needs them on the homeserver.
        # The other key chores (``maintain``: people's devices queried) are the
        # front's to start: bot mode runs them beside each sync, so a start's
        # first batch of plain answers does not wait for every known person's
        # keys.  A send runs them first (``before_send``).
        await self.upload_keys()
        if self.cross_signing is not None:
            # Beside the first sync rather than before it: nothing encrypted
            # is sent until it is done (``before_send``), plaintext need not wait.
            self._signing = asyncio.ensure_future(self._sign_own_device(self.cross_signing))

    async def _sign_own_device(self, cross_signing: CrossSigning) -> None:
        try:
            await cross_signing.ensure()
        except Exception as exc:  # noqa: BLE001 - an unsigned device still encrypts; clients may hide it
            log.error("the bridge's device is not cross-signed (%s): clients that only trust sessions "
                      "verified by their owner will not show its messages", exc)

    async def close(self) -> None:
        for task in (self._signing, self._behind):
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    # -- rooms ----------------------------------------------------------

    async def ensure_room(self, room_id: str) -> MatrixRoom:
        """nio's view of ``room_id``, its encryption state asked of the homeserver
        when nio has not seen the room in a sync yet."""
        room = self.client.rooms.get(room_id)
        if room is not None:
            return room
        encrypted = room_id in self.client.encrypted_rooms
        if not encrypted:
            # Not knowing (not in the room yet, an error) raises: it must never mean sending in the clear.
            state = await state_content(self.client, room_id, ENCRYPTION_STATE, "the encryption state")
            encrypted = bool(state and state.get("algorithm"))
        room = MatrixRoom(room_id, self.client.user_id, encrypted)
        self.client.rooms[room_id] = room
        if encrypted:
            self.client.encrypted_rooms.add(room_id)
            if self.client.store is not None:
                self.client.store.save_encrypted_rooms([room_id])
            log.info("room %s is encrypted: the bridge encrypts what it sends there", room_id)
        return room

    async def before_send(self, room_id: str) -> bool:
        """Ready to send into ``room_id``; True when what is sent there is encrypted."""
        room = await self.ensure_room(room_id)
        if not room.encrypted:
            return False
        if self._signing is not None:
            # Current clients hide what an unsigned device encrypts.
            await asyncio.shield(self._signing)
        # nio's view of the room is made anew by a join (``MatrixTransport.join``)
        # that may run beside this send: its members are read from the view in
        # place after the read, not the one held before it.  (Read from a
        # view replaced meanwhile, they were none: the room key went to no one,
        # and the first question of a room joined at an invite stayed
        # unreadable to the person who invited the bridge.)
        for _attempt in range(3):
            room = await self.ensure_room(room_id)
            if room.members_synced and room_id not in self._members_changed:
                break
            self._members_changed.discard(room_id)
            await self._read_members(room_id)
        room = await self.ensure_room(room_id)
        members = set(room.users)
        if self._keys_wanted(members):
            await self.maintain()
        else:
            # Someone elsewhere waits for a key query (their homeserver slow or
            # away): it goes on behind, and this room's send waits for none of
            # it.  One slow person held every encrypted send in every room for
            # twice their query's time.
            self._maintain_behind()
            await self.maintain(only=members)
        return True

    def _keys_wanted(self, members: set[str]) -> bool:
        """Whether one of ``members`` has devices or cross-signing keys to be asked about (or being asked about)."""
        client = self.client
        wanted = set(client.users_for_key_query) | self._queried if client.olm is not None else set()
        if self.settings.trust == "cross-signed" and self.cross_signing is not None:
            wanted |= {user for user in members if not self.cross_signing.known(user)
                       or self.cross_signing.is_pending(user)}
        return bool(members & wanted)

    def _maintain_behind(self) -> None:
        if self._behind is not None and not self._behind.done():
            return
        self._behind = asyncio.ensure_future(self.maintain())
        self._behind.add_done_callback(_said_if_failed)

    async def read_changed_members(self) -> None:
        """The members of rooms ``members_changed`` named, read now: their
        devices are then queried by the next ``maintain``, so an answer from a
        newcomer is judged with their device known."""
        for room_id in list(self._members_changed):
            self._members_changed.discard(room_id)
            if room_id in self.client.rooms:
                await self._read_members(room_id)

    async def _read_members(self, room_id: str) -> None:
        """nio's members of ``room_id``, those who get its room keys: the
        joined, and the invited where the room's history is visible to them
        (as Element shares: a reviewer invited just before an agent's
        questions were posted reads them once she joins)."""
        room = self.client.rooms.get(room_id)
        for user_id in list(room.invited_users) if room is not None else ():
            room.remove_member(user_id)  # read anew below (an invite taken back, or taken)
        await self.client.joined_members(room_id)
        invited = await self._invited(room_id) if room_id in self.client.rooms else set()
        # The view as it is after both reads: a join beside them makes it anew (``before_send``).
        room = self.client.rooms.get(room_id)
        if room is None or not invited:
            return
        for user_id in invited - set(room.users):
            room.add_member(user_id, None, None, invited=True)
        if room.encrypted and self.client.olm is not None:
            self.client.olm.update_tracked_users(room)

    async def _invited(self, room_id: str) -> set[str]:
        """Those invited to ``room_id``, unless its history is visible to joined members only."""
        try:
            # Bounded: nio tries a request the homeserver does not answer
            # again for ever, and this one must not hold the send it comes before.
            response: Any = await asyncio.wait_for(self.client.room_get_state(room_id), INVITED_READ_SECONDS)
        except asyncio.TimeoutError:
            response = f"no answer within {INVITED_READ_SECONDS:.0f} s"
        events = getattr(response, "events", None)
        if not isinstance(events, list):
            log.info("the invited members of %s not read (%s): its room keys go to the joined only", room_id,
                     getattr(response, "message", response))
            return set()
        invited, visibility = set(), "shared"
        for event in events:
            content = event.get("content") if isinstance(event, dict) else None
            if not isinstance(content, dict):
                continue
            if event.get("type") == "m.room.history_visibility":
                visibility = content.get("history_visibility", visibility)
            elif event.get("type") == "m.room.member" and content.get("membership") == "invite" \
                    and isinstance(event.get("state_key"), str):
                invited.add(event["state_key"])
        return set() if visibility == "joined" else invited

    def devices_settled(self, senders: set[str]) -> bool:
        """Whether what is known of each sender's devices can settle the trust
        in their messages now: their devices read and not marked outdated
        (nor, under ``cross-signed``, their cross-signing keys unread).  When
        so, a batch from them need not wait for the key chores of others
        (a newcomer to the room, say): they can run beside it."""
        client = self.client
        if client.olm is None:
            return True
        # Users with devices read: nio's table gains an empty entry for anyone
        # whose devices were only looked up (a message's sender key, say).
        outdated, known = client.users_for_key_query, {user for user, devices in client.device_store.items() if devices}
        cross = self.settings.trust == "cross-signed" and self.cross_signing is not None
        return all(sender in known and sender not in outdated and not (cross and not self.cross_signing.known(sender))
                   for sender in senders)

    def members_changed(self, room_id: str) -> None:
        """Someone joined or left ``room_id`` and no sync told nio: its members
        are read again before the next send there, under a new room key (what
        nio does itself on a member event in a sync)."""
        self._members_changed.add(room_id)
        if self.client.olm is not None:
            self.client.invalidate_outbound_session(room_id)

    def note_events(self, events: list[dict[str, Any]]) -> None:
        """What nio would have learned from these room events had it read them
        (the bridge reads them itself, in both modes): who joined or left, who
        may read the history, and a room whose encryption was turned on, after
        which nothing is sent there in the clear."""
        for event in events:
            room_id, kind = event.get("room_id"), event.get("type")
            if not isinstance(room_id, str) or not isinstance(event.get("state_key"), str):
                continue
            if kind == "m.room.member" or kind == "m.room.history_visibility":
                # Only where nio encrypts: a plain room's members are read
                # when its encryption is turned on (``_encryption_on``).  Who
                # may read changes with the history's visibility too (under
                # "joined" the invited no longer get keys): a new room key.
                if room_id in self.client.encrypted_rooms:
                    self.members_changed(room_id)
            elif kind == ENCRYPTION_STATE and event["state_key"] == "" and \
                    isinstance(event.get("content"), dict) and event["content"].get("algorithm"):
                self._encryption_on(room_id)

    def _encryption_on(self, room_id: str) -> None:
        room = self.client.rooms.get(room_id)
        if room_id in self.client.encrypted_rooms and (room is None or room.encrypted):
            return
        self.client.encrypted_rooms.add(room_id)
        if self.client.store is not None:
            self.client.store.save_encrypted_rooms([room_id])
        if room is not None:
            room.encrypted = True
        self.members_changed(room_id)  # read again before the next send: their devices get the room key
        log.info("room %s is encrypted now: the bridge encrypts what it sends there", room_id)

    def waits_for_chores(self, events: list[dict[str, Any]]) -> bool:
        """Whether a batch's trust check must wait for the key chores: it has
        encrypted events from someone whose devices this run has not settled
        (``devices_settled``: a newcomer, devices changed, or not read since
        the start: nio keeps each device's trust from the run before, which
        may be stale, and an answer from a device its owner has since
        cross-signed would be refused).  Otherwise the chores run beside it."""
        senders = {event.get("sender") for event in events if event.get("type") == ENCRYPTED}
        return bool(senders) and not (all(isinstance(sender, str) for sender in senders)
                                      and self.devices_settled(senders))

    async def chores(self) -> None:
        """Members read again where they changed (their devices are then
        queried), then the key chores."""
        await self.read_changed_members()
        await self.maintain()

    # -- key chores and trust -------------------------------------------

    async def maintain(self, only: set[str] | None = None) -> None:
        """What nio's sync_forever does between syncs, then the trust policy.
        ``only``: the members of the room a send is for, none of whom is to be
        asked about: no query, and one-time keys claimed for them alone."""
        client = self.client
        if client.olm is None:
            return
        await self.upload_keys()
        if only is not None:
            if client.should_claim_keys:
                wanted = {user: devices for user, devices in client.get_users_for_key_claiming().items()
                          if user in only}
                if wanted:
                    await client.keys_claim(wanted)
            if client.outgoing_to_device_messages:
                await client.send_to_device_messages()
            self.apply_trust()
            return
        outdated: set[str] = set()
        # One query at a time (a send's chores run beside the loop's): a
        # query that failed after a later one answered for someone would
        # mark her unanswered again, and nio, settled, never asks again.
        async with self._querying:
            if client.should_query_keys:
                outdated = set(client.users_for_key_query)
                self._queried = set(outdated)
                try:
                    response = await client.keys_query()
                finally:
                    self._queried = set()
                # nio changes nothing of someone left out of the answer and asks
                # them again with the next query; until then they are not known.
                data = {"device_keys": response.device_keys, "failures": response.failures} \
                    if isinstance(response, KeysQueryResponse) else {}
                self._devices_unanswered = (self._devices_unanswered | outdated) - answered(outdated, data)
        if self.settings.trust == "cross-signed" and self.cross_signing is not None:
            # nio reads no cross-signing keys: the same people are asked again for theirs.
            unknown = {user for user in client.device_store.users if not self.cross_signing.known(user)}
            await self.cross_signing.refresh(outdated | unknown)
        if client.should_claim_keys:
            await client.keys_claim(client.get_users_for_key_claiming())
        if client.outgoing_to_device_messages:
            await client.send_to_device_messages()
        self.apply_trust()

    async def upload_keys(self) -> None:
        """The device's keys (a new device's identity, fresh one-time keys) when nio says they are due."""
        if self.client.olm is None or not self.client.should_upload_keys:
            return
        response = await self.client.keys_upload()
        if isinstance(response, KeysUploadError):
            log.error("uploading the device keys failed (%s): people cannot encrypt for the bridge. If the "
                      "access token belongs to a session that already has other keys, give the bridge its "
                      "own login (bot.password) or a fresh token", getattr(response, "message", response))

    def apply_trust(self) -> None:
        """Mark every known device of the people the bridge shares rooms with
        as the policy says: verified (gets keys), or blacklisted (never does).
        ``all`` leaves them unverified; nio shares with those when told to
        ignore unverified devices."""
        client, policy = self.client, self.settings.trust
        for user_id, devices in client.device_store.items():
            # The bridge's own other sessions (older logins) are placed like anyone's
            # under the strict policies: a send must never meet an unplaced device.
            if user_id == client.user_id and policy not in SESSION_CHECKING:
                continue
            for device in devices.values():
                if device.deleted or (user_id == client.user_id and device.id == client.device_id):
                    continue
                if policy == "verified":
                    pinned = self.settings.verified_devices.get(user_id, {}).get(device.id)
                    if pinned is not None and pinned == device.ed25519:
                        self._set(device, "verified", "verified by the operator")
                    else:
                        why = "its fingerprint does not match the one configured" if pinned else \
                            "not in encryption.verified_devices"
                        self._set(device, "blacklisted", why)
                elif policy == "cross-signed":
                    if self.cross_signing is not None and \
                            self.cross_signing.is_cross_signed(user_id, device.id, device.ed25519):
                        self._set(device, "verified", "cross-signed by its owner")
                    else:
                        self._set(device, "blacklisted", "not cross-signed by its owner (they can verify this "
                                  "session in their client)")
                elif policy == "tofu":
                    self._set(device, "verified", "trusted on first use")
                else:
                    if device.blacklisted:
                        client.unblacklist_device(device)
                    self._note(device, "unverified", "trust: all")

    def _set(self, device: Any, state: str, why: str) -> None:
        client = self.client
        if state == "verified" and not device.verified:
            if device.blacklisted:
                client.unblacklist_device(device)
            client.verify_device(device)
        elif state == "blacklisted" and not device.blacklisted:
            if device.verified:
                client.unverify_device(device)
            client.blacklist_device(device)
        self._note(device, state, why)

    def _note(self, device: Any, state: str, why: str) -> None:
        key = (device.user_id, device.id)
        if self._trust_logged.get(key) == state:
            return
        self._trust_logged[key] = state
        if state == "blacklisted":
            log.warning("device %s of %s (%s) gets no room keys: %s", device.id, device.user_id,
                        _grouped(device.ed25519), why)
        else:
            log.info("device %s of %s (%s) is %s: %s", device.id, device.user_id, _grouped(device.ed25519),
                     state, why)

    @property
    def takes_plain_answers(self) -> bool:
        """Whether an answer sent unencrypted into an encrypted room can count:
        not under the trust levels that check the sending session."""
        return self.settings.trust not in SESSION_CHECKING

    @property
    def ignore_unverified_devices(self) -> bool:
        # Under tofu and verified every device is verified or blacklisted by
        # apply_trust, so this only matters for devices seen mid-send; under
        # ``verified`` such a device must fail the send rather than get keys.
        return self.settings.trust not in SESSION_CHECKING

    async def ensure_room_key(self, room_id: str) -> None:
        """A room key shared with the room's devices, as ``room_send`` makes
        sure of before it encrypts: an event encrypted apart from a send (a
        delayed event) had none after a member joined, so it was not
        encrypted at all, or only with a key the newcomer never got."""
        client = self.client
        if client.olm is None or not client.olm.should_share_group_session(room_id):
            return
        sharing = client.sharing_session.get(room_id)
        if sharing is not None:
            await sharing.wait()  # a send is sharing one right now
            return
        before = self.session_snapshot(room_id)
        await client.share_group_session(room_id, ignore_unverified_devices=self.ignore_unverified_devices)
        self.log_shared(room_id, before)

    def key_recipients(self, room_id: str) -> frozenset[tuple[str, str]]:
        """The devices the room key in use in ``room_id`` was shared with;
        empty when none is in use (a member came or went: the next send shares a new one)."""
        snapshot = self.session_snapshot(room_id)
        return snapshot[1] if snapshot else frozenset()

    def session_snapshot(self, room_id: str) -> tuple[str, frozenset[tuple[str, str]]] | None:
        olm = self.client.olm
        session = olm.outbound_group_sessions.get(room_id) if olm else None
        return (session.id, frozenset(session.users_shared_with)) if session else None

    def log_shared(self, room_id: str, before: tuple[str, frozenset[tuple[str, str]]] | None) -> None:
        """Say which devices got the room key when a send shared a new one."""
        after = self.session_snapshot(room_id)
        if after is None or after == before:
            return
        session_id, shared = after
        fresh = shared - (before[1] if before and before[0] == session_id else frozenset())
        room = self.client.rooms.get(room_id)
        withheld = []
        own = (self.client.user_id, self.client.device_id)
        for user_id in (room.users if room else ()):
            for device in self.client.device_store.active_user_devices(user_id):
                if (user_id, device.id) in shared or (user_id, device.id) == own:
                    continue
                withheld.append(f"{user_id}/{device.id} ({_trust_word(device)})")
        log.info("room key %s… for %s shared with %s%s", session_id[:10], room_id,
                 ", ".join(sorted(f"{u}/{d}" for u, d in fresh)) or "no new device",
                 f"; not shared with {', '.join(sorted(withheld))}" if withheld else "; withheld from no device")

def _grouped(key: str) -> str:
    """A key as Element shows it: groups of four."""
    return " ".join(key[i:i + 4] for i in range(0, len(key), 4))


def _trust_word(device: Any) -> str:
    if device.blacklisted:
        return "blacklisted"
    if device.verified:
        return "no olm session yet"
    return "unverified"

