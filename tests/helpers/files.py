"""Files of real sizes sent by people into questions' threads, and what the
bridge must have made of them (tests/integration/test_downloads.py)."""

from __future__ import annotations

import hashlib
import io
import os
from dataclasses import dataclass
from typing import Any

from nio import UploadResponse

from helpers.harness import Bridge, Person

MIB = 1024 * 1024
# The limit the tests configure (attachments.max_bytes): above the 10 MB
# file, below Synapse's default upload limit (50 MiB).
LIMIT = 12 * MIB
# 1 byte, a small screenshot, a phone photo, a short clip, exactly the limit, one byte more.
SIZES = (1, 70_000, 1_400_000, 10_000_000, LIMIT, LIMIT + 1)
OUTCOME = "dev.superpipeline.question.outcome"


@dataclass
class SentFile:
    qid: str
    name: str
    data: bytes
    event_id: str = ""

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


def files_set(set_id: str = "files") -> dict[str, Any]:
    """One free-text question per size: each file goes into its own question's thread."""
    return {
        "askwright": 1, "id": set_id, "title": "Screenshots",
        "questions": [{"id": f"q{n}", "kind": "text", "title": f"Screenshot {n}",
                       "question": f"Could you send, in this thread, the screen that shows problem {n}?",
                       "why": "The fix starts from what people saw.",
                       "guess": {"text": "the login screen", "why": "It is the usual one.", "confidence": "low"}}
                      for n in range(len(SIZES))],
    }


def random_files(sizes: tuple[int, ...] = SIZES) -> list[SentFile]:
    """Random bytes (nothing a transfer could compress away), one file per size."""
    return [SentFile(f"q{n}", f"screen-{size}.bin", os.urandom(size)) for n, size in enumerate(sizes)]


def in_thread(question_event_id: str, content: dict[str, Any]) -> dict[str, Any]:
    return {**content, "m.relates_to": {"rel_type": "m.thread", "event_id": question_event_id,
                                        "is_falling_back": True, "m.in_reply_to": {"event_id": question_event_id}}}


async def upload_file(person: Person, file: SentFile, encrypted: bool) -> dict[str, Any]:
    """``file`` in the content repository; the event content that names it
    (``url``, or ``file`` with its key in an encrypted room, as clients send)."""
    from nio.crypto.attachments import encrypt_attachment

    data, keys = (encrypt_attachment(file.data) if encrypted else (file.data, None))
    upload, _ = await person.client.upload(io.BytesIO(data), content_type="application/octet-stream",
                                           filename=None if encrypted else file.name, filesize=len(data))
    assert isinstance(upload, UploadResponse), upload
    content: dict[str, Any] = {"msgtype": "m.file", "body": file.name, "filename": file.name}
    if keys is not None:
        content["file"] = {**keys, "url": upload.content_uri}
    else:
        content["url"] = upload.content_uri
    # The size over the limit is left for the bridge to find out while reading.
    if len(file.data) <= LIMIT:
        content["info"] = {"mimetype": "application/octet-stream", "size": len(file.data)}
    return content


async def send_files(person: Person, room: str, questions: dict, files: list[SentFile], encrypted: bool) -> None:
    """Every file uploaded, then all sent in one go, each in its question's thread."""
    contents = [await upload_file(person, file, encrypted) for file in files]
    for file, content in zip(files, contents):
        file.event_id = await person.send(room, in_thread(questions[(file.qid, 1)]["event_id"], content))


async def check_files(bridge: Bridge, person: Person, files: list[SentFile], set_id: str = "files") -> None:
    """What the person sees and what the set folder holds: each file up to
    the limit kept byte for byte and acknowledged; the one past it refused,
    naming the file and the limit; nothing half-written in attachments/."""
    for file in files:
        notice = await person.wait_notice(bridge.room_id, file.event_id, timeout=120)
        outcome, body = notice["content"][OUTCOME], notice["content"]["body"]
        if len(file.data) > LIMIT:
            assert (outcome["outcome"], outcome["reason"]) == ("refused", "attachment_too_large"), body
            assert f"“{file.name}”" in body and "12 MB" in body, body
            assert file.qid not in bridge.answers(set_id)["answers"]
            continue
        assert outcome["outcome"] == "recorded", body
        record = await bridge.wait_answer(set_id, file.qid)
        assert record["attachments"] == [f"attachments/{file.qid}-1.bin"], record
        saved = bridge.sets_root / set_id / record["attachments"][0]
        assert saved.stat().st_size == len(file.data), f"{file.name}: {saved.stat().st_size} bytes kept"
        assert hashlib.sha256(saved.read_bytes()).hexdigest() == file.sha256, f"{file.name}: not what was sent"
    folder = bridge.sets_root / set_id / "attachments"
    assert sorted(p.name for p in folder.iterdir()) == \
        sorted(f"{file.qid}-1.bin" for file in files if len(file.data) <= LIMIT)


