"""A room's timeline driven through the real pipeline and store, for tests
that deliver the same events in different orders and by different paths."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bridge.answers.file import AnswersFile
from bridge.protocol import audit_verify, checkpoint as cp, merkle
from bridge.protocol.normalize import ANSWER_TYPE
from bridge.protocol.question_event import build_question_event
from bridge.protocol.recorded import RecordedQuestion
from bridge.questionset.model import QuestionSet
from bridge.service.answering.pipeline import Pipeline
from bridge.service.encryption.marks import DEVICE
from bridge.service.storage.store import Store
from helpers.sets import all_kinds_set

ROOM, BOT = "!room:hs", "@bot:hs"
PEOPLE = ("@alice:hs", "@bob:hs", "@carol:hs")
MODERATOR = "@mod:hs"
QID, ELC = "branch", "elc_branch"


class Transport:
    user_id = BOT

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send(self, room_id: str, event_type: str, content: dict[str, Any], txn_id: str) -> str:
        self.sent.append(content)
        return f"$sent{len(self.sent)}"

    async def joined_members(self, room_id: str) -> set[str]:
        return {*PEOPLE, MODERATOR, BOT}

    async def power_levels(self, room_id: str) -> dict[str, Any]:
        return {"users": {MODERATOR: 50, BOT: 100}, "redact": 50}


class Room:
    """The bridge's side of one room with the ``branch`` question posted."""

    def __init__(self, tmp_path: Path, store_path: Path | None = None,
                 approval: dict[str, Any] | None = None, posted_ms: int | None = None) -> None:
        """``approval``: the question's ``expires`` / ``answerers`` / ``quorum`` /
        ``escalate`` fields (PROTOCOL 2a), a duration counted from ``posted_ms``."""
        self.set_dir = tmp_path / "kinds"
        self.set_dir.mkdir(exist_ok=True)
        self.store_path = store_path or tmp_path / "bridge.sqlite"
        raw = all_kinds_set("kinds")
        if approval:
            next(q for q in raw["questions"] if q["id"] == QID).update(approval)
        qset = QuestionSet.model_validate(raw)
        question = next(q for q in qset.questions if q.id == QID)
        self.posted = RecordedQuestion(event_id="$q", room_id=ROOM, set_id="kinds",
                                       content=build_question_event(qset, question, elicitation_id=ELC,
                                                                    posted_ms=posted_ms))
        self.open()
        if self.store.question_by_event("$q") is None:
            with self.store.transaction():
                self.store.record_posted(self.posted, set_dir=str(self.set_dir), posted_at=1)
                self.store.set_poll("$q", "$poll")

    def open(self) -> None:
        self.store = Store(self.store_path)
        self.pipeline = Pipeline(store=self.store, transport=Transport(), answerers=None,
                                 own_users=lambda u: u == BOT)
        asyncio.run(self.pipeline.load_members(ROOM))

    def crash(self) -> None:
        """The bridge killed and started again: only the store survives."""
        self.store.close()
        self.open()

    def deliver(self, events: list[dict[str, Any]]) -> None:
        self.pipeline.process([dict(e) for e in events])

    def hold(self, event: dict[str, Any]) -> None:
        """The event arrived encrypted and could not be decrypted yet."""
        sealed = {"type": "m.room.encrypted", "event_id": event["event_id"], "room_id": ROOM,
                  "sender": event["sender"], "origin_server_ts": event["origin_server_ts"], "content": {}}
        with self.store.transaction():
            self.store.keep_undecrypted(sealed, 0)

    def release(self, events: list[dict[str, Any]]) -> None:
        """Held events decrypted at last (marked with the device that sent
        them, as the encryption layer marks them): judged unless dropped meanwhile."""
        held = {event["event_id"] for event, _first in self.store.undecrypted()}
        with self.store.transaction():
            self.store.drop_undecrypted(held)
        self.deliver([{**e, DEVICE: {"device_id": "PHONE", "cross_signed": True}}
                      for e in events if e["event_id"] in held])

    def record(self) -> dict[str, Any] | None:
        if not (self.set_dir / "answers.json").exists():
            return None
        return AnswersFile(self.set_dir).load()["answers"].get(QID)

    def verify(self) -> list[str]:
        """What ``askwright-bridge verify`` finds wrong with this room's
        answers.json against the store's log, under a fresh checkpoint."""
        key = Ed25519PrivateKey.generate()
        leaves = [leaf.encode() for _i, leaf in self.store.audit.leaves(0, self.store.audit.size())]
        origin = self.store.audit_origin() or "example.org/askwright-bridge/bridge"
        point = cp.Checkpoint(origin, len(leaves), merkle.root([merkle.leaf_hash(x) for x in leaves]))
        doc = AnswersFile(self.set_dir).load() if (self.set_dir / "answers.json").exists() \
            else {"set": "kinds", "answers": {}}  # (as the bridge writes an empty one)
        asked = self.set_dir / "questions.json"
        questions = json.loads(asked.read_text()) if asked.exists() else None
        return audit_verify.verify_set(doc, leaves, [cp.sign_checkpoint(point, key)], origin,
                                       cp.raw_public(key.public_key()), questions).problems


def _base(event_id: str, sender: str, ts: int) -> dict[str, Any]:
    return {"event_id": event_id, "room_id": ROOM, "sender": sender, "origin_server_ts": ts}


def _answer_content(option: str) -> dict[str, Any]:
    return {"msgtype": "m.text", "body": option, "suite_event_type": ANSWER_TYPE, "schema_version": 1,
            "elicitation_id": ELC, "option_id": option,
            "m.relates_to": {"rel_type": "m.reference", "event_id": "$q"}}


def answer(event_id: str, sender: str, ts: int, option: str) -> dict[str, Any]:
    return {**_base(event_id, sender, ts), "type": "m.room.message", "content": _answer_content(option)}


def edit(event_id: str, sender: str, ts: int, target: str, option: str) -> dict[str, Any]:
    new = _answer_content(option)
    del new["m.relates_to"]
    return {**_base(event_id, sender, ts), "type": "m.room.message",
            "content": {"msgtype": "m.text", "body": f"* {option}", "m.new_content": new,
                        "m.relates_to": {"rel_type": "m.replace", "event_id": target}}}


def note(event_id: str, sender: str, ts: int, text: str) -> dict[str, Any]:
    return {**_base(event_id, sender, ts), "type": "m.room.message",
            "content": {"msgtype": "m.text", "body": text,
                        "m.relates_to": {"rel_type": "m.thread", "event_id": "$q", "is_falling_back": True,
                                         "m.in_reply_to": {"event_id": "$q"}}}}


def picture(event_id: str, sender: str, ts: int) -> dict[str, Any]:
    return {**_base(event_id, sender, ts), "type": "m.room.message",
            "content": {"msgtype": "m.image", "body": "shot.png", "filename": "shot.png", "url": "mxc://hs/shot",
                        "m.relates_to": {"rel_type": "m.thread", "event_id": "$q", "is_falling_back": True,
                                         "m.in_reply_to": {"event_id": "$q"}}}}


def vote(event_id: str, sender: str, ts: int, options: list[str]) -> dict[str, Any]:
    """A vote in the question's poll, as Element sends it (empty: the vote taken back)."""
    return {**_base(event_id, sender, ts), "type": "org.matrix.msc3381.poll.response",
            "content": {"m.relates_to": {"rel_type": "m.reference", "event_id": "$poll"},
                        "org.matrix.msc3381.poll.response": {"answers": options}}}


KEYCAPS = ("1\ufe0f\u20e3", "2\ufe0f\u20e3", "3\ufe0f\u20e3", "4\ufe0f\u20e3")


def reaction(event_id: str, sender: str, ts: int, number: int) -> dict[str, Any]:
    """A keycap reaction on the question: its option number ``number`` (from 1)."""
    return {**_base(event_id, sender, ts), "type": "m.reaction",
            "content": {"m.relates_to": {"rel_type": "m.annotation", "event_id": "$q", "key": KEYCAPS[number - 1]}}}


def redact(event_id: str, sender: str, ts: int, target: str) -> dict[str, Any]:
    return {**_base(event_id, sender, ts), "type": "m.room.redaction", "redacts": target,
            "content": {"redacts": target}}


def saved_file(room: Room, event_id: str) -> str:
    """What the attachment prefetch does before a batch: the file saved in the set folder."""
    relative = f"attachments/{QID}-{event_id.strip('$')}.png"
    (room.set_dir / "attachments").mkdir(exist_ok=True)
    (room.set_dir / relative).write_bytes(b"\x89PNG secret")
    with room.store.transaction():
        room.store.record_attachment(event_id, str(room.set_dir), QID, relative, None)
    return relative


def dumps(record: dict[str, Any] | None) -> str:
    return json.dumps(record, sort_keys=True)
