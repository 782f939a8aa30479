"""The receiving half of ``Crypto``: what encrypted events become before
the pipeline sees them (``screen``), and the events kept until their keys
(or their senders' devices) come.

Events still encrypted are decrypted here (nio reads no sync); one that
cannot be decrypted yet is kept in the bridge's store before the sync token
or the transaction moves past it, its key asked of the sender
(``keyrequests``), and retried on every sync; after the grace period it is
refused with a word to the person, never recorded as an answer.  The trust
policy (``encryption.trust``) is applied to what decrypts.

A mixin over the attributes ``Crypto`` sets (its nio client, the store, the
settings, the key requests, the cross-signing check), as mautrix-python
splits its client: one object, its parts in modules of their own.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import TYPE_CHECKING, Any, Callable

from nio import AsyncClient, MegolmEvent
from nio.exceptions import EncryptionError, LocalProtocolError

from bridge.service.config import Encryption
from bridge.service.encryption.keyrequests import KeyRequests
from bridge.service.encryption.marks import DEVICE  # what the pipeline gets in ORIGIN's place
from bridge.service.storage.store import LogEntry, Store

if TYPE_CHECKING:
    from bridge.service.encryption.crosssigning import CrossSigning

log = logging.getLogger(__name__)

ENCRYPTED = "m.room.encrypted"
ENCRYPTION_STATE = "m.room.encryption"
REDACTION = "m.room.redaction"
# A key the sync loop adds to a decrypted event's dict (and removes before the
# pipeline sees it): which device sent it, for the ``verified`` policy.
ORIGIN = "askwright.e2e"

UNDECRYPTABLE_MESSAGE = ("the bridge could not decrypt this message, so it could not read your answer. "
                         "Please send it again (if it keeps happening, your client may not be sharing "
                         "its keys with the bridge's session).")
UNVERIFIED_MESSAGE = ("this message was sent from a session the bridge's operator has not verified, "
                      "so the bridge does not accept answers from it. Answer from a verified session.")
# A message whose sender's homeserver has not answered for their devices is
# judged when it answers: a server down for a minute or an hour loses nobody's
# answer.  Past a day it is refused (UNCHECKED_MESSAGE) rather than kept for good.
UNANSWERED_PATIENCE_MS = 24 * 3600 * 1000
# How soon an event from a session nio did not know is looked at again, its
# sender's devices asked for meanwhile (the key chores run after the batch).
SESSION_LOOK_MS = 1000
UNCHECKED_MESSAGE = ("the bridge could not check the session this message was sent from: your homeserver did "
                     "not answer when asked for its keys, so the bridge could not accept your answer. Please "
                     "send it again.")
# An answer sent in the clear into an encrypted room carries no device, so no
# trust policy that names devices can accept it.  Element sends reactions so.
PLAIN_MESSAGE = ("this was not encrypted, so the bridge cannot tell which of your sessions sent it, and in this "
                 "room it takes answers only from sessions it can check. Vote in the poll or reply to the question "
                 "instead: your client encrypts those.")
# A session logged out before the bridge read what it sent: its trust can't
# be settled now (a pin removed, an identity reset since), so the answer is
# not taken; the person is told to answer from a current session, not to
# verify one that no longer exists.
LOGGED_OUT_MESSAGE = ("this message was sent from a session that has logged out since, so the bridge can no "
                      "longer check it and does not accept answers from it. Send your answer again from a current "
                      "session.")
NOT_CROSS_SIGNED_MESSAGE = ("this message was sent from a session you have not verified, so the bridge does "
                            "not accept answers from it. Verify this session in your client (from a session "
                            "you already trust, or with your recovery key), then send your answer again.")


def event_dict(event: Any, room_id: str) -> dict[str, Any]:
    """The dict the pipeline gets for a timeline event: the decrypted event
    (type and content of what the person sent, plus event id, sender and
    time) when nio decrypted it, the event as received otherwise."""
    out = {**event.source, "room_id": room_id}
    if getattr(event, "decrypted", False):
        out[ORIGIN] = {"sender_key": getattr(event, "sender_key", None),
                       "verified": bool(getattr(event, "verified", False))}
    return out


class Receiving:
    """``Crypto.screen`` and what it keeps; the attributes are ``Crypto``'s."""

    client: AsyncClient
    store: Store
    settings: Encryption
    takes_plain_answers: bool
    clock: Callable[[], int]
    key_requests: KeyRequests
    cross_signing: CrossSigning | None
    on_outcome: Callable[[LogEntry], None] | None
    _devices_unanswered: set[str]
    _waiting_logged: set[str]
    _sessions_asked: dict[str, str]
    _undecrypted_said: set[Any]
    _none_kept: bool
    _first_look: int | None

    async def sync_timeout_ms(self, default: int) -> int:
        """A long poll that wakes up in time for the first kept event's grace period."""
        timeout = default
        kept = await self._kept()  # before every long poll: not a wait on the loop
        if kept:
            due = min(self._given_up_at(event, first_seen) for event, first_seen in kept)
            timeout = min(default, due - self.clock())
            reask = self.key_requests.due_in_ms()  # a key asked for again when an answer may have been lost
            if reask is not None:
                timeout = min(timeout, reask)
        if self._sessions_asked and self._sessions_to_read():
            timeout = min(timeout, SESSION_LOOK_MS)  # the key chores ask, and the next look judges it
        if self.cross_signing is not None and self.settings.trust == "cross-signed":
            retry = self.cross_signing.due_in_ms()  # people whose homeserver did not answer, asked again
            if retry is not None:
                timeout = min(timeout, retry)
        return max(0, timeout)

    async def _kept(self) -> list[tuple[dict[str, Any], int]]:
        """The kept events (``Store.undecrypted``), read on the store's thread
        unless the last look found none and none was kept since: a batch of
        plain answers then waits for no job but its own."""
        if self._none_kept:
            return []
        kept = await self.store.run(self.store.undecrypted)
        self._none_kept = not kept
        return kept

    def _keep(self, events: list[dict[str, Any]], now: int) -> list[dict[str, Any]]:
        """Keep ``events`` (one store transaction); those not kept before."""
        self._none_kept = False
        with self.store.transaction():
            return [e for e in events if self.store.keep_undecrypted(e, now)]

    def processed_of(self, events: list[dict[str, Any]]) -> set[str]:
        """On the store's thread: which of ``events`` were already processed."""
        return self.store.processed_among([e["event_id"] for e in events])

    async def screen(self, events: list[dict[str, Any]], is_own: Callable[[str], bool]) -> tuple[
            list[dict[str, Any]], list[str]]:
        """The batch the pipeline should judge, and the kept events it resolves.

        Events still encrypted are kept (durably, before the caller moves the
        sync token) and their keys asked for; kept events that decrypt now are
        put in front of the batch (they are older); kept events past the grace
        period are refused and the person told; under ``trust: verified`` an
        answer from a device the operator has not verified is refused (and
        under ``cross-signed`` one its owner has not signed).  An answer whose
        sender's devices could not be read (their homeserver did not answer)
        is not judged yet: it is kept like an undecryptable one, and judged
        when an answer comes (or refused after the grace period).

        Only what it would keep is looked up in the store (one job): an event
        judged before and delivered again (a transaction sent again, a sync
        replayed after a restart) must not be kept again.  What decrypts
        goes to the batch, whose own look-ups skip what was processed, so a
        batch whose events all decrypt waits for no job before its own.
        """
        newly_kept: list[dict[str, Any]] = []
        batch: list[dict[str, Any]] = []
        refusals: list[tuple[dict[str, Any], str, str]] = []
        now = self.clock()
        strict = not self.takes_plain_answers
        unattributable = {id(event) for event in sent_in_the_clear(events, self.client.encrypted_rooms)} \
            if strict else set()
        for event in events:
            if id(event) in unattributable:
                sender = event.get("sender")
                if isinstance(sender, str) and not is_own(sender):
                    refusals.append((event, "device_not_verified", PLAIN_MESSAGE))
                    continue
            if _sealed(event):
                sender = event.get("sender")
                if not isinstance(sender, str) or is_own(sender):
                    continue
                # Still encrypted: nobody tried yet (nio reads no sync).
                decrypted = self._decrypt(event)
                if decrypted is None:
                    newly_kept.append(event)
                else:
                    batch.append(decrypted)
                continue
            batch.append(event)
        if newly_kept:
            processed = await self.store.run(self.processed_of, newly_kept)
            newly_kept = [event for event in newly_kept if event["event_id"] not in processed]
        if newly_kept:
            for event in self._keep(newly_kept, now):
                log.warning("event %s from %s in %s could not be decrypted yet; kept, keys asked for",
                            event["event_id"], event["sender"], event["room_id"])
        resolved: list[str] = []
        recovered: list[dict[str, Any]] = []
        expired: list[dict[str, Any]] = []
        still_kept: list[dict[str, Any]] = []
        kept_since: dict[str, int] = {}
        sealed: set[str] = set()  # kept encrypted, decrypted now
        for event, first_seen in await self._kept():
            decrypted = self._decrypt(event)
            if decrypted is not None:
                if ORIGIN not in event:
                    sealed.add(event["event_id"])
                    if event["event_id"] not in self._waiting_logged:
                        log.info("event %s decrypted after its keys arrived", event["event_id"])
                recovered.append(decrypted)
                resolved.append(event["event_id"])
                kept_since[event["event_id"]] = first_seen
            elif now >= self._given_up_at(event, first_seen):
                expired.append(event)
            else:
                still_kept.append(event)
        await self.key_requests.ask(still_kept)
        self._undecrypted_said &= {event["event_id"] for event in still_kept}  # said again if seen anew
        for event in expired:
            refusals.append((event, "undecryptable", UNDECRYPTABLE_MESSAGE))
        out: list[dict[str, Any]] = []
        unchecked: list[dict[str, Any]] = []
        rekept: list[dict[str, Any]] = []
        # An event kept before and delivered again (the token had not moved
        # past it when the bridge stopped) is judged once, as the kept one.
        again = {event["event_id"] for event in recovered}
        for event in recovered + [event for event in batch if event.get("event_id") not in again]:
            origin = event.pop(ORIGIN, None)
            if origin is not None and strict and not self._from_verified(event, origin):
                sender = event.get("sender")
                if isinstance(sender, str) and not is_own(sender) and not self.store.is_processed(event["event_id"]):
                    event_id = event["event_id"]
                    unread = self._devices_unread(sender) or self._session_unasked(event_id, sender, origin) \
                        or self._devices_due(event_id, sender)
                    if unread and now - kept_since.get(event_id, now) < UNANSWERED_PATIENCE_MS:
                        if event_id in kept_since:
                            resolved.remove(event_id)  # it stays kept
                            if event_id in sealed:
                                # Kept as decrypted from now on: what it waits for is
                                # its sender's devices (a day), no longer its key (the
                                # grace period, gone: every long poll then had no wait).
                                rekept.append({**event, ORIGIN: origin})
                            if event_id not in self._waiting_logged:  # said once, not at every pass
                                self._waiting_logged.add(event_id)
                                log.warning("event %s from %s waits: the keys of their devices were not "
                                            "answered for yet", event_id, sender)
                        else:
                            unchecked.append({**event, ORIGIN: origin})
                        continue
                    message = UNCHECKED_MESSAGE if unread else LOGGED_OUT_MESSAGE if self._logged_out(event, origin) \
                        else UNVERIFIED_MESSAGE if self.settings.trust == "verified" else NOT_CROSS_SIGNED_MESSAGE
                    refusals.append((event, "device_not_verified", message))
                    continue
            if origin is not None:
                event[DEVICE] = self._device_of(event, origin)
            out.append(event)
        if rekept:
            with self.store.transaction():
                for event in rekept:
                    self.store.rekeep_undecrypted(event)
        if unchecked:
            # Kept decrypted, with its origin: what waits is the trust check, not a key.
            for event in self._keep(unchecked, now):
                log.warning("event %s from %s in %s waits: the keys of %s's devices were not answered for yet",
                            event["event_id"], event["sender"], event["room_id"], event["sender"])
        if refusals:
            self._refuse(refusals)
        if self._waiting_logged:
            self._waiting_logged &= set(kept_since) - set(resolved)
        if self._sessions_asked:
            waiting = {event["event_id"] for event in unchecked} | (set(kept_since) - set(resolved))
            self._sessions_asked = {e: sender for e, sender in self._sessions_asked.items() if e in waiting}
        return out, resolved

    def _given_up_at(self, kept: dict[str, Any], first_seen: int) -> int:
        """When a kept event is given up on (store clock, ms).  One waiting
        for its sender's homeserver to answer for their devices: a day after
        it was first seen, as long as a homeserver may be down.  One waiting
        for its key: the grace period after it was first seen, or after this
        run first looked at it, whichever is later.  The grace is time spent
        waiting and asking for the key; a bridge that was stopped did
        neither (and in appservice mode the key shared meanwhile is what
        Synapse dropped), so a stop longer than the grace had the answer
        refused at the first look, its key never asked for again."""
        if ORIGIN in kept:
            return first_seen + UNANSWERED_PATIENCE_MS
        if self._first_look is None:
            self._first_look = self.clock()
        return max(first_seen, self._first_look) + int(self.settings.grace_seconds * 1000)

    def _devices_unread(self, sender: str) -> bool:
        """The sender's devices were asked for and their homeserver has not
        answered yet: what is known of them cannot settle their trust."""
        if sender in self._devices_unanswered:
            return True
        return self.settings.trust == "cross-signed" and self.cross_signing is not None and \
            self.cross_signing.is_pending(sender)

    def _session_unasked(self, event_id: str, sender: str, origin: dict[str, Any]) -> bool:
        """A session nio knows nothing of (not one logged out): its owner's
        devices are read again before the event is judged, once per event
        and run.  What nio holds may be from before they signed in on it (a
        device list change missed while the bridge was down), and an event
        kept before a restart lost the note that its sender's homeserver had
        not answered; refused at once, either was told to verify a session
        its owner had verified."""
        sender_key = origin.get("sender_key")
        if not isinstance(sender_key, str) or self._device_by_key(sender, sender_key) is not None:
            return False
        if event_id not in self._sessions_asked:
            self._sessions_asked[event_id] = sender
            self.client.olm.add_changed_users({sender})
            return True
        return False  # asked: it waits while the query is unanswered (``_devices_due``)

    def _devices_due(self, event_id: str, sender: str) -> bool:
        """The sender's devices are due to be read again (the homeserver told
        of a change, as after a restart: a session signed while the bridge
        was down): what nio holds of them may be stale, and an answer refused
        on it (one kept for its key, say, judged before the key chores ran)
        told its sender to verify a session they had verified.  It waits for
        the read, looked at again within a second."""
        if sender not in self.client.users_for_key_query:
            return False
        self._sessions_asked.setdefault(event_id, sender)
        return True

    def _sessions_to_read(self) -> bool:
        """An event waits for its sender's devices to be read, and they are
        yet to be asked for (not a homeserver that did not answer, whose
        asking again is paced by ``cross_signing``)."""
        due = self.client.users_for_key_query if self.client.olm is not None else set()
        return any(sender in due and sender not in self._devices_unanswered
                   for sender in self._sessions_asked.values())

    def _decrypt(self, event: dict[str, Any]) -> dict[str, Any] | None:
        if ORIGIN in event:
            return dict(event)  # kept decrypted, for its sender's devices to be read
        if self.client.olm is None:
            return None
        parsed = MegolmEvent.from_dict(event)
        if not isinstance(parsed, MegolmEvent):
            return self._not_decrypted(event, "nio cannot read it as a megolm event")
        parsed.room_id = event["room_id"]
        try:
            decrypted = self.client.decrypt_event(parsed)
        except (EncryptionError, LocalProtocolError) as exc:
            return self._not_decrypted(event, f"{type(exc).__name__}: {exc}")
        if type(decrypted).__name__ in ("BadEvent", "UnknownBadEvent"):
            return self._not_decrypted(event, "its plaintext is not an event nio accepts")
        return event_dict(decrypted, event["room_id"])

    def _not_decrypted(self, event: dict[str, Any], why: str) -> None:
        """Why an event stays encrypted, said once per event (a kept one is
        tried again at every pass); nio says nothing of most of these."""
        event_id = event.get("event_id")
        if event_id not in self._undecrypted_said:
            self._undecrypted_said.add(event_id)
            log.info("event %s not decrypted: %s", event_id, why)
        return None

    def _device_of(self, event: dict[str, Any], origin: dict[str, Any]) -> dict[str, Any]:
        """Which device sent a decrypted event, and whether its owner cross-signed it (for the answer log)."""
        sender, sender_key = event.get("sender"), origin.get("sender_key")
        device = None
        if isinstance(sender, str) and isinstance(sender_key, str):
            device = self._device_by_key(sender, sender_key)
        if device is None:
            return {"device_id": None, "cross_signed": False}
        signed = False
        if self.cross_signing is not None:
            try:
                signed = bool(self.cross_signing.is_cross_signed(sender, device.id, device.ed25519))
            except Exception:  # noqa: BLE001 - not known to be cross-signed is what the leaf then says
                signed = False
        return {"device_id": device.id, "cross_signed": signed}

    def _from_verified(self, event: dict[str, Any], origin: dict[str, Any]) -> bool:
        sender, sender_key = event.get("sender"), origin.get("sender_key")
        if not isinstance(sender, str) or not isinstance(sender_key, str):
            return False
        device = self.client.device_store.device_from_sender_key(sender, sender_key)
        return device is not None and device.verified

    def _device_by_key(self, sender: str, sender_key: str) -> Any:
        """The device of ``sender`` whose key encrypted an event, also one
        logged out since (nio's own look-up skips those)."""
        device = self.client.device_store.device_from_sender_key(sender, sender_key)
        if device is not None:
            return device
        # Not ``device_store[sender]``: that would give a sender never read an
        # entry of no devices, which ``Crypto.devices_settled`` takes for read.
        return next((d for d in self.client.device_store if d.user_id == sender and d.curve25519 == sender_key), None)

    def _logged_out(self, event: dict[str, Any], origin: dict[str, Any]) -> bool:
        """Sent from a session logged out before the bridge read it."""
        sender, sender_key = event.get("sender"), origin.get("sender_key")
        if not isinstance(sender, str) or not isinstance(sender_key, str):
            return False
        device = self._device_by_key(sender, sender_key)
        return device is not None and bool(device.deleted)

    def _refuse(self, refusals: list[tuple[dict[str, Any], str, str]]) -> None:
        """Refused, never recorded: a log entry the notifier turns into an
        m.notice reply to the event, and the event marked processed."""
        entries = []
        with self.store.transaction():
            for event, reason, message in refusals:
                event_id, room_id, sender = event["event_id"], event["room_id"], event["sender"]
                self.store.drop_undecrypted([event_id])
                if self.store.is_processed(event_id):
                    continue
                if self.store.redactions_of(event_id):
                    # Taken back while it waited: nothing to refuse, nobody to tell.
                    self.store.mark_processed(event_id, "withdrawn")
                    continue
                question = self._question_of(event)
                self.store.mark_processed(event_id, "refused")
                if question is None:
                    # Not related to anything the bridge posted: not an answer
                    # (people chatting from a session nobody verified), so
                    # nobody is bothered about it.
                    log.warning("event %s from %s in %s refused (%s); not an answer, so not told", event_id, sender,
                                room_id, reason)
                    continue
                entry = LogEntry(event_id=event_id, room_id=room_id, sender=sender, via="answer_event",
                                 outcome="refused", layer="schema" if reason == "undecryptable" else "recorded",
                                 reason=reason, message=message,
                                 set_id=question.set_id if question else None,
                                 set_dir=self.store.set_dir_of(question.event_id) if question else None,
                                 qid=question.qid if question else None,
                                 question_event_id=question.event_id if question else None,
                                 ts=event.get("origin_server_ts") if isinstance(event.get("origin_server_ts"), int)
                                 else 0)
                self.store.log(entry)
                entries.append(entry)
                log.warning("event %s from %s refused: %s", event_id, sender, reason)
        if self.on_outcome:
            for entry in entries:
                self.on_outcome(entry)

    def _question_of(self, event: dict[str, Any]) -> Any:
        """The question an event relates to (in the clear, for encrypted
        events): the question itself, its poll, or an answer to it."""
        content = event.get("content") if isinstance(event.get("content"), dict) else {}
        relates = content.get("m.relates_to") if isinstance(content.get("m.relates_to"), dict) else {}
        targets = [relates.get("event_id")]
        reply = relates.get("m.in_reply_to")
        if isinstance(reply, dict):
            targets.append(reply.get("event_id"))
        for target in targets:
            if not isinstance(target, str):
                continue
            found = self.store.question_by_event(target) or self.store.question_by_poll(target)
            if found is None:
                logged = self.store.logged_question(target)
                found = self.store.question_by_event(logged[0]) if logged else None
            if found is not None:
                return found
        return None


def sent_in_the_clear(events: list[dict[str, Any]], encrypted_rooms: Collection[str]) -> list[dict[str, Any]]:
    """The events (in order) a person sent unencrypted while their room was
    encrypted: no state, no redaction (never encrypted).  ``encrypted_rooms``
    already counts encryption turned on in this batch; an event before that
    in the timeline was sent into a plain room."""
    turned_on: dict[str, int] = {}
    for index, event in enumerate(events):
        if event.get("type") == ENCRYPTION_STATE and event.get("state_key") == "":
            turned_on.setdefault(event.get("room_id"), index)
    return [event for index, event in enumerate(events)
            if event.get("room_id") in encrypted_rooms and index >= turned_on.get(event.get("room_id"), -1)
            and event.get("type") not in (ENCRYPTED, REDACTION) and "state_key" not in event]


def _sealed(event: dict[str, Any]) -> bool:
    """Still encrypted, with an id to look it up by."""
    return event.get("type") == ENCRYPTED and isinstance(event.get("event_id"), str)
