"""A person on matrix-js-sdk with its Rust crypto (tests/js/person.mjs), cross-signed
and excluding insecure devices, as current Element is."""

from __future__ import annotations

import asyncio
import fcntl
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from bridge.devserver import Synapse
from helpers.harness import Person, answer_content

JS = Path(__file__).resolve().parent.parent / "js"


def install_js() -> None:
    """The Node project's packages, installed as the lock file pins them when
    missing; by one test process at a time (the suite runs in several)."""
    with open(JS / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (JS / "node_modules" / "matrix-js-sdk" / "package.json").exists():
            return
        npm = shutil.which("npm")
        assert npm, "npm (Node 20) is needed for the matrix-js-sdk tests"
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=JS, check=True, timeout=600)


class JsPerson(Person):
    """``messages`` gives the events as her client shows them: decrypted when it
    could, else with ``decryption_failure`` set (e.g. UNSIGNED_SENDER_DEVICE)."""

    def __init__(self, synapse: Synapse, account: dict[str, str], log_path: Path):
        super().__init__(synapse, account)
        self.synapse = synapse
        self.account = account
        self.log_path = log_path
        self.process: asyncio.subprocess.Process | None = None
        self.device_id = account.get("device_id", "")

    async def start(self) -> dict[str, Any]:
        node = shutil.which("node")
        assert node, "node is needed for the matrix-js-sdk tests"
        self._log = open(self.log_path, "ab")
        self.process = await asyncio.create_subprocess_exec(
            node, str(JS / "person.mjs"), cwd=JS, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=self._log, limit=64 * 1024 * 1024)
        return await self.call("start", base_url=self.synapse.url, user_id=self.user_id,
                               access_token=self.token, device_id=self.device_id,
                               password=self.account.get("password"), timeout=90)

    async def call(self, cmd: str, timeout: float = 60, **args: Any) -> dict[str, Any]:
        assert self.process and self.process.stdin and self.process.stdout
        self.process.stdin.write((json.dumps({"cmd": cmd, **args}) + "\n").encode())
        await self.process.stdin.drain()
        line = await asyncio.wait_for(self.process.stdout.readline(), timeout)
        assert line, f"the js client exited\n{self.log_path.read_text(errors='replace')[-3000:]}"
        answer = json.loads(line)
        assert answer.pop("ok"), f"{cmd}: {answer.get('error')}"
        return answer

    async def messages(self, room_id: str, limit: int = 500) -> list[dict[str, Any]]:
        return (await self.call("messages", room_id=room_id))["events"]

    async def send(self, room_id: str, content: dict[str, Any], event_type: str = "m.room.message") -> str:
        return (await self.call("send", room_id=room_id, type=event_type, content=content))["event_id"]

    async def device_status(self, user_id: str, device_id: str) -> dict[str, Any] | None:
        return (await self.call("device_status", user_id=user_id, device_id=device_id))["status"]

    async def close(self) -> None:
        if self.process is not None and self.process.returncode is None:
            try:
                await self.call("stop", timeout=10)
                await asyncio.wait_for(self.process.wait(), 10)
            except (AssertionError, asyncio.TimeoutError, BrokenPipeError, ConnectionResetError):
                self.process.kill()
                await self.process.wait()
        if getattr(self, "_log", None):
            self._log.close()
        await super().close()


def from_bridge(events: list[dict], bridge: Any) -> list[dict]:
    return [e for e in events if e["sender"] == bridge.bot["user_id"] and e.get("state_key") is None]


async def wait_signed_by_owner(person: JsPerson, user_id: str, device_id: str, timeout: float = 30) -> dict:
    """Her client's view of a device, once it has the device's keys (its key
    queries run in the background of its sync)."""
    deadline = time.monotonic() + timeout
    while True:
        status = await person.device_status(user_id, device_id)
        if status and status["signed_by_owner"]:
            return status
        assert time.monotonic() < deadline, f"{device_id} of {user_id} not signed by its owner: {status}"
        await asyncio.sleep(0.5)


async def answers_read_back(person: JsPerson, bridge: Any, room: str, questions: dict) -> None:
    """She answers as Element does (a reply naming an option) and with an
    answer event, in the all-kinds set; the bridge records both, and she
    reads both acknowledgements, encrypted and decrypted."""
    takes = questions[("takes", 1)]["event_id"]
    reply = await person.send(room, {"msgtype": "m.text", "body": "2",
                                     "m.relates_to": {"m.in_reply_to": {"event_id": takes}}})
    named = await person.send(room, answer_content(questions[("name", 1)], text="Borealis"))
    assert (await bridge.wait_answer("kinds", "takes", timeout=40))["source"]["event_id"] == reply
    assert (await bridge.wait_answer("kinds", "name", timeout=40))["text"] == "Borealis"
    for answer in (reply, named):
        notice = await person.wait_notice(room, answer, timeout=30)
        assert notice["wire_type"] == "m.room.encrypted" and notice["decryption_failure"] is None
        assert notice["content"]["dev.superpipeline.question.outcome"]["outcome"] == "recorded"


def wait_log(bridge: Any, text: str, count: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while bridge.log_text().count(text) < count:
        bridge.check_alive()
        assert time.monotonic() < deadline, f"{text!r} not logged {count} times\n{bridge.log_text()[-3000:]}"
        time.sleep(0.2)
