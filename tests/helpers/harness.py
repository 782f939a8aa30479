"""Real parts for integration tests: a Synapse, people as matrix-nio clients,
and the bridge as its own process (so it can be killed for real)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from nio import AsyncClient, RoomMessagesResponse, RoomRedactResponse, RoomSendResponse

from bridge.devserver import Synapse

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


class Person:
    """A person in the room, on a real client session."""

    def __init__(self, synapse: Synapse, account: dict[str, str]):
        self.user_id = account["user_id"]
        self.client = AsyncClient(synapse.url, self.user_id)
        self.client.access_token = account["access_token"]
        self.client.device_id = account.get("device_id", "")
        self.token = account["access_token"]

    async def send(self, room_id: str, content: dict[str, Any], event_type: str = "m.room.message") -> str:
        response = await self.client.room_send(room_id, event_type, content)
        assert isinstance(response, RoomSendResponse), response
        return response.event_id

    async def redact(self, room_id: str, event_id: str) -> str:
        """The redaction's event id."""
        response = await self.client.room_redact(room_id, event_id)
        assert isinstance(response, RoomRedactResponse), response
        return response.event_id

    async def messages(self, room_id: str, limit: int = 500) -> list[dict[str, Any]]:
        """The room's events, oldest first."""
        response = await self.client.room_messages(room_id, start="", limit=limit)
        assert isinstance(response, RoomMessagesResponse), response
        return [event.source for event in reversed(response.chunk)]

    async def questions(self, room_id: str) -> dict[tuple[str, int], dict[str, Any]]:
        """(qid, rev) -> the question event, as posted by the bridge."""
        found = {}
        for event in await self.messages(room_id):
            content = event.get("content", {})
            if content.get("suite_event_type") == "dev.superpipeline.question.v2":
                found[(content["question"]["id"], content["question"]["rev"])] = event
        return found

    async def notices_for(self, room_id: str, answer_event_id: str) -> list[dict[str, Any]]:
        return [e for e in await self.messages(room_id)
                if e.get("content", {}).get("dev.superpipeline.question.outcome", {}).get("answer_event_id")
                == answer_event_id]

    async def wait_notice(self, room_id: str, answer_event_id: str, timeout: float = 20) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = await self.notices_for(room_id, answer_event_id)
            if found:
                return found[0]
            await asyncio.sleep(0.2)
        raise AssertionError(f"no notice for {answer_event_id} within {timeout} s")

    async def close(self) -> None:
        await self.client.close()


def answer_content(question_event: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """A question.answer.v2 content answering ``question_event`` (fields override)."""
    content = question_event["content"]
    answer = {
        "msgtype": "m.text",
        "body": str(fields.get("option_id") or fields.get("text") or "answer"),
        "schema_version": 1,
        "suite_event_type": "dev.superpipeline.question.answer.v2",
        "elicitation_id": content["elicitation_id"],
        "m.relates_to": {"rel_type": "m.reference", "event_id": question_event["event_id"]},
    }
    if "subject" in content:
        answer["subject"] = dict(content["subject"])
    answer.update(fields)
    return {k: v for k, v in answer.items() if v is not None}


@dataclass
class Bridge:
    """One bridge process and everything it is configured with."""

    synapse: Synapse
    workdir: Path
    room_id: str
    bot: dict[str, str]
    extra_config: dict[str, Any] = field(default_factory=dict)
    process: subprocess.Popen | None = None
    starts: int = 0
    sets_folder: str = "sets"  # below workdir: where sets.root is (the operator may move it)
    env: dict[str, str] = field(default_factory=dict)  # more of the process's environment, for the next start

    @property
    def sets_root(self) -> Path:
        return self.workdir / self.sets_folder

    @property
    def config_path(self) -> Path:
        return self.workdir / "config.yaml"

    @property
    def store_path(self) -> Path:
        return self.workdir / "bridge.sqlite"

    @property
    def log_path(self) -> Path:
        return self.workdir / "bridge.log"

    def write_config(self) -> None:
        config = {
            "homeserver": {"url": self.synapse.url},
            "bot": {"user_id": self.bot["user_id"], "access_token": self.bot["access_token"]},
            "sets": {"root": str(self.sets_root)},
            "rooms": {"default": self.room_id},
            "store": {"path": str(self.store_path)},
            "logging": {"level": "DEBUG"},
        }
        for key, value in self.extra_config.items():
            if isinstance(value, dict) and isinstance(config.get(key), dict):
                config[key] = {**config[key], **value}
            else:
                config[key] = value
        self.config_path.write_text(yaml.safe_dump(config))
        os.chmod(self.config_path, 0o600)

    def add_set(self, source: Path | dict[str, Any], name: str | None = None) -> Path:
        if isinstance(source, dict):
            target = self.sets_root / (name or source["id"])
            target.mkdir(parents=True, exist_ok=True)
            (target / "questions.json").write_text(json.dumps(source, indent=2))
        else:
            target = self.sets_root / (name or source.name)
            shutil.copytree(source, target)
        return target

    def start(self) -> None:
        self.write_config()
        self.starts += 1
        log = open(self.log_path, "ab")
        log.write(f"\n--- start {self.starts} ---\n".encode())
        self.process = subprocess.Popen([sys.executable, "-m", "bridge", "run", "-c", str(self.config_path)],
                                        stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir,
                                        env={**os.environ, **self.env} if self.env else None)

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self, timeout: float = 30) -> int:
        if not self.process or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError("the bridge did not stop within its grace period")

    def check_alive(self) -> None:
        if self.process and self.process.poll() is not None:
            raise AssertionError(f"the bridge exited ({self.process.returncode}):\n{self.log_text()[-3000:]}")

    async def wait_questions(self, person: "Person", count: int, timeout: float = 30) -> dict[tuple[str, int], dict]:
        deadline = time.monotonic() + timeout
        while True:
            self.check_alive()
            found = await person.questions(self.room_id)
            if len(found) >= count:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(found)} of {count} questions posted\n{self.log_text()[-3000:]}")
            await asyncio.sleep(0.2)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def answers(self, set_name: str) -> dict[str, Any]:
        path = self.sets_root / set_name / "answers.json"
        return json.loads(path.read_text()) if path.exists() else {"answers": {}}

    async def wait_answer(self, set_name: str, qid: str, rev: int = 1, timeout: float = 20) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            record = self.answers(set_name)["answers"].get(qid)
            if record and record["rev"] >= rev:
                return record
            self.check_alive()
            await asyncio.sleep(0.05)
        raise AssertionError(f"no answer rev {rev} for {set_name}/{qid} within {timeout} s\n{self.log_text()[-3000:]}")


def hooked(folder: Path, code: str) -> dict[str, str]:
    """The environment that has the bridge's interpreter run ``code`` first
    (as ``sitecustomize``): a fault put where a real one could land, or a
    window a race needs held open, for ``Bridge.env``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(code)
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))}


def store_rows(store_path: Path, sql: str, *params: Any) -> list[tuple]:
    """Rows from the bridge's store, read-only (safe while the bridge runs)."""
    db = sqlite3.connect(f"file:{store_path}?mode=ro", uri=True, timeout=10)
    try:
        return db.execute(sql, params).fetchall()
    finally:
        db.close()


def question_posts(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every question.v2 message among ``events``, duplicates included."""
    return [e for e in events
            if e.get("content", {}).get("suite_event_type") == "dev.superpipeline.question.v2"]


def read_set(set_dir: Path, *extra: str) -> dict[str, Any]:
    result = subprocess.run([sys.executable, "-m", "bridge", "read", str(set_dir), *extra],
                            capture_output=True, text=True, check=True)
    return json.loads(result.stdout)
