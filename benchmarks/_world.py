"""A throwaway world for benchmarks: a local Synapse, a room, a person, a
bare observer client and the bridge as its own process."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

import yaml
from nio import AsyncClient, RoomSendResponse, SyncResponse

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bridge.devserver import SERVER_NAME, Synapse, _http_json, free_port  # noqa: E402

from _receiver import BareReceiver  # noqa: E402


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[index]


def question_set(set_id: str, count: int = 1) -> dict[str, Any]:
    return {
        "askwright": 1, "id": set_id, "title": f"Benchmark {set_id}",
        "questions": [{
            "id": f"q{n}", "kind": "choice", "title": f"Question {n}",
            "question": f"Which way should item {n} go?", "why": "The benchmark needs an answer.",
            "options": [{"id": "a", "label": "The first way"}, {"id": "b", "label": "The second way"}],
            "guess": {"option": "a", "why": "It is the default.", "confidence": "high"},
        } for n in range(count)],
    }


AS_LOCALPART = "askwright_bot"


def write_registration(base: Path, hs_port: int) -> tuple[Path, dict[str, Any]]:
    """An appservice config and its registration, written by the real command."""
    as_port = free_port()
    config = base / "as-config.yaml"
    config.write_text(yaml.safe_dump({
        "homeserver": {"url": f"http://127.0.0.1:{hs_port}"},
        "bot": {"user_id": f"@{AS_LOCALPART}:{SERVER_NAME}"},
        "sets": {"root": "sets"}, "rooms": {"default": "!placeholder"}, "store": {"path": "as.sqlite"},
        "appservice": {"enabled": True, "id": "askwright", "url": f"http://127.0.0.1:{as_port}",
                       "listen": f"127.0.0.1:{as_port}", "sender_localpart": AS_LOCALPART},
    }))
    registration = base / "registration.yaml"
    subprocess.run([sys.executable, "-m", "bridge", "generate-registration", "-c", str(config), "-o",
                    str(registration)], check=True, capture_output=True, cwd=ROOT)
    return registration, yaml.safe_load(config.read_text())["appservice"]


class World:
    def __init__(self, base: Path, synapse: Synapse, appservice: dict[str, Any] | None = None):
        self.base = base
        self.synapse = synapse
        self.appservice = appservice
        self.bot = synapse.register("askbot")
        self.person = synapse.register("person")
        self.observer = synapse.register("observer")
        invite = [self.person["user_id"], self.observer["user_id"]]
        if appservice:
            invite.append(f"@{AS_LOCALPART}:{SERVER_NAME}")
        self.room_id = synapse.create_room(self.bot["access_token"], invite=invite)
        synapse.join(self.person["access_token"], self.room_id)
        synapse.join(self.observer["access_token"], self.room_id)
        self.sets_root = base / "sets"
        self.sets_root.mkdir(exist_ok=True)
        self.bridge: subprocess.Popen | None = None
        # With appservice mode: a bare appservice, the reference for what the homeserver pushes.
        self.receiver: BareReceiver | None = None
        self._devices: dict[str, str] = {}

    def client(self, account: dict[str, str]) -> AsyncClient:
        client = AsyncClient(self.synapse.url, account["user_id"])
        client.access_token = account["access_token"]
        return client

    def add_set(self, data: dict[str, Any]) -> Path:
        folder = self.sets_root / data["id"]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "questions.json").write_text(json.dumps(data))
        return folder

    def device_token(self, store: str) -> str:
        """An access token of its own device for each bot-mode store: a device's
        keys live beside its store, so two stores must never share a device."""
        if store not in self._devices:
            reply = _http_json("POST", f"{self.synapse.url}/_matrix/client/v3/login", {
                "type": "m.login.password", "identifier": {"type": "m.id.user", "user": self.bot["user_id"]},
                "password": self.bot["password"], "initial_device_display_name": f"bench {Path(store).name}"})
            self._devices[store] = reply["access_token"]
        return self._devices[store]

    def config(self, *, appservice: bool = False, **extra: Any) -> Path:
        store = str(self.base / ("as.sqlite" if appservice else "bridge.sqlite"))
        store = extra.pop("store", {}).get("path", store)
        bot = ({"user_id": f"@{AS_LOCALPART}:{SERVER_NAME}"} if appservice
               else {"user_id": self.bot["user_id"], "access_token": self.device_token(store)})
        if appservice:
            extra["appservice"] = self.appservice
        config = {
            "homeserver": {"url": self.synapse.url},
            "bot": bot,
            "sets": {"root": str(self.sets_root)},
            "rooms": {"default": self.room_id},
            "store": {"path": store},
            "logging": {"level": "WARNING"},
            **extra,
        }
        path = self.base / "config.yaml"
        path.write_text(yaml.safe_dump(config))
        os.chmod(path, 0o600)
        return path

    def start_bridge(self, config: Path, site: Path | None = None, trace: Path | None = None) -> None:
        """The bridge as its own process: from the source tree, or with
        ``site`` from a wheel installed there (run from elsewhere, so only the
        wheel's copy can be imported); with ``trace``, through ``_traced.py``,
        which notes there when each sync response reaches it."""
        log = open(self.base / "bridge.log", "ab")
        env, cwd = dict(os.environ), ROOT
        if site is not None:
            env["PYTHONPATH"], cwd = str(site), self.base
        command = [sys.executable, "-m", "bridge"]
        if trace is not None:
            env["ASKWRIGHT_BENCH_TRACE"] = str(trace)
            if site is None:
                env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
            command = [sys.executable, str(Path(__file__).resolve().parent / "_traced.py")]
        self.bridge = subprocess.Popen([*command, "run", "-c", str(config)],
                                       stdout=log, stderr=subprocess.STDOUT, cwd=cwd, env=env)

    def wheel_site(self, ref: str | None = None) -> Path:
        """The bridge built as a plain wheel and installed into a folder of its
        own (once per world), as an operator would run it.  ``ref``: the
        bridge of that git commit instead of the source tree (``latency.py
        --against``)."""
        name = "" if ref is None else "-" + "".join(c if c.isalnum() else "-" for c in ref)
        site = self.base / f"wheel-site{name}"
        if not site.exists():
            dist = self.base / f"dist{name}"
            source = ROOT
            if ref is not None:
                source = self.base / f"source{name}"
                source.mkdir()
                archive = subprocess.run(["git", "archive", ref], cwd=ROOT, check=True, capture_output=True).stdout
                subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
            subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(dist), str(source)], check=True)
            wheel = next(dist.glob("askwright_bridge-*.whl"))
            subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site),
                            str(wheel)], check=True)
        return site

    def add_example(self, name: str, set_id: str) -> Path:
        """A copy of a bundled example set (its media too) under a new id."""
        folder = self.sets_root / set_id
        shutil.copytree(ROOT / "examples" / name, folder)
        data = json.loads((folder / "questions.json").read_text())
        data["id"] = set_id
        (folder / "questions.json").write_text(json.dumps(data))
        return folder

    def stop_bridge(self, grace: float = 30) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds: a bridge stopped with
        thousands of acknowledgements still to send finishes sending them
        first, which a benchmark need not wait for."""
        if self.bridge and self.bridge.poll() is None:
            self.bridge.send_signal(signal.SIGTERM)
            try:
                self.bridge.wait(grace)
            except subprocess.TimeoutExpired:
                self.bridge.kill()
                self.bridge.wait(10)
        self.bridge = None

    def add_member(self, localpart: str, room_id: str | None = None) -> dict[str, str]:
        """Another person in the room (registered, invited by the bot, joined)."""
        account = self.synapse.register(localpart)
        room_id = room_id or self.room_id
        self.synapse.invite(self.bot["access_token"], room_id, account["user_id"])
        self.synapse.join(account["access_token"], room_id)
        return account

    def rooms_with_people(self, name: str, rooms: int, people: int) -> tuple[list[dict[str, str]], list[str]]:
        """``people`` people (the world's person first) and ``rooms`` rooms (the
        world's room first) that they, the observer and the bot all share."""
        persons = [self.person] + [self.add_member(f"{name}-person{n}") for n in range(1, people)]
        invite = [p["user_id"] for p in persons] + [self.observer["user_id"]]
        room_ids = [self.room_id] + [self.synapse.create_room(self.bot["access_token"], invite=invite)
                                     for _ in range(rooms - 1)]
        for room_id in room_ids[1:]:
            for account in persons + [self.observer]:
                self.synapse.join(account["access_token"], room_id)
        return persons, room_ids

    async def question_events(self, client: AsyncClient, count: int, timeout: float = 600,
                              prefix: str = "") -> dict[str, dict]:
        """"set/qid" -> question event, once ``count`` whose key starts with ``prefix`` are posted."""
        deadline = time.monotonic() + timeout
        found: dict[str, dict] = {}
        since = None
        while time.monotonic() < deadline:
            response = await client.sync(timeout=1000, since=since)
            if isinstance(response, SyncResponse):
                since = response.next_batch
                for room in response.rooms.join.values():
                    for event in room.timeline.events:
                        content = event.source.get("content", {})
                        if content.get("suite_event_type") == "dev.superpipeline.question.v2":
                            found[f"{content['set']['id']}/{content['question']['id']}"] = event.source
            if sum(key.startswith(prefix) for key in found) >= count:
                return found
        raise TimeoutError(f"only {len(found)} of {count} questions were posted")


def answer(question_event: dict[str, Any], option_id: str) -> dict[str, Any]:
    content = question_event["content"]
    return {"msgtype": "m.text", "body": option_id, "schema_version": 1,
            "suite_event_type": "dev.superpipeline.question.answer.v2",
            "elicitation_id": content["elicitation_id"], "option_id": option_id,
            "m.relates_to": {"rel_type": "m.reference", "event_id": question_event["event_id"]}}


async def send(client: AsyncClient, room_id: str, content: dict[str, Any]) -> str:
    response = await client.room_send(room_id, "m.room.message", content)
    assert isinstance(response, RoomSendResponse), response
    return response.event_id


@asynccontextmanager
async def world(*, appservice: bool = False, **synapse_options: Any) -> AsyncIterator[World]:
    """One Synapse for the whole run; with ``appservice`` it also loads a
    registration so both modes are measured against the same homeserver."""
    with tempfile.TemporaryDirectory(prefix="askwright-bench-") as tmp:
        base = Path(tmp)
        port = free_port()
        settings = None
        files: list[str] = []
        receiver = None
        if appservice:
            registration, settings = write_registration(base, port)
            receiver = BareReceiver(free_port())
            files = [str(registration), str(receiver.write_registration(base, registration))]
            await receiver.start()
        synapse = Synapse(base / "synapse", port=port, appservice_files=files, **synapse_options)
        synapse.start()
        w = World(base, synapse, settings)
        w.receiver = receiver
        try:
            yield w
        finally:
            w.stop_bridge()
            synapse.stop()
            if receiver is not None:
                await receiver.stop()
